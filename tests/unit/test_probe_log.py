"""The probe log (evals/canary_probes.py): a file per route and hour inside the request log's folder, a read that
opens only the hours of its window, and hours past the retention removed by the writer (issue 49, item 3)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from evals.canary_probes import HOUR, ProbeResult, append_probe_results, probe_folder, read_probe_results
from serving.request_log import read_rows


def result(when: datetime, arm: str = "staging", correct: bool = True) -> ProbeResult:
    return ProbeResult(when.isoformat(), "default", arm, f"k{when.minute}", correct, True, 0.01, 200)


def test_each_result_goes_to_its_hours_file_and_a_window_reads_back_what_it_holds(tmp_path):
    folder = probe_folder(tmp_path / "requests")
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    earlier, later = now - timedelta(hours=1), now + timedelta(minutes=10)
    append_probe_results(folder, "default", [result(earlier), result(now), result(later, "fallback", False)])
    assert sorted(p.name for p in (folder / "default").iterdir()) == [
        f"{earlier.strftime(HOUR)}.jsonl",
        f"{now.strftime(HOUR)}.jsonl",
    ]
    window = read_probe_results(folder, "default", now - timedelta(minutes=5), now + timedelta(minutes=20))
    assert [(r["arm"], r["correct"]) for r in window] == [("staging", True), ("fallback", False)]
    assert len(read_probe_results(folder, "default")) == 3 and read_probe_results(folder, "other") == []
    # the request log's reader, over the same folder, reads no probe as a request
    assert read_rows(tmp_path / "requests") == []


def test_a_read_opens_only_the_hours_its_window_covers(tmp_path):
    """A line filed under an hour outside the window is never read, even when its own time is inside it: the file's
    name alone decides, so thousands of old hours cost a window nothing."""
    folder = probe_folder(tmp_path)
    # mid-hour, so the window of +-1 minute covers this hour alone (with the clock's own minute, a run in an hour's
    # first minute rightly read the line filed under the hour before, which that window covers: a full run here did)
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    append_probe_results(folder, "default", [result(now)])
    (folder / "default").mkdir(exist_ok=True)
    for h in range(1, 3001):  # three thousand old hours, each holding a line timed now
        old = (now - timedelta(hours=h)).strftime(HOUR)
        (folder / "default" / f"{old}.jsonl").write_text(json.dumps(result(now, "misfiled").to_dict()) + "\n")
    window = read_probe_results(folder, "default", now - timedelta(minutes=1), now + timedelta(minutes=1))
    assert [r["arm"] for r in window] == ["staging"]


def test_a_torn_last_line_is_skipped_and_the_hours_past_the_retention_are_removed(tmp_path):
    folder = probe_folder(tmp_path)
    now = datetime.now(UTC)
    stale = (now - timedelta(hours=30)).strftime(HOUR)
    (folder / "default").mkdir(parents=True)
    (folder / "default" / f"{stale}.jsonl").write_text("{}\n")
    (folder / "default" / "notes.jsonl").write_text("not an hour\n")  # a file of another name is left alone
    append_probe_results(folder, "default", [result(now)], retention_h=24)
    with (folder / "default" / f"{now.strftime(HOUR)}.jsonl").open("a") as f:
        f.write('{"time": "')  # a write cut short
    assert not (folder / "default" / f"{stale}.jsonl").exists() and (folder / "default" / "notes.jsonl").exists()
    assert [r["arm"] for r in read_probe_results(folder, "default", now - timedelta(minutes=1))] == ["staging"]
