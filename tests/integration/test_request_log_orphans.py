"""A journal a dead pod left on a shared request-log folder is compacted by any replica, whatever host wrote it
(issue 49: a restarted pod gets another host name, so "the next log on that host" never came): untouched for
`orphan_after_s`, adopted under an exclusive lock, written once however many replicas adopt it, never one a live
writer still holds (each touches its own every flush cycle, idle or not)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from serving.request_log import RequestLog, read_rows, row


def left_by_a_dead_pod(folder: Path, name: str, rows: int, age_s: float) -> Path:
    journal = folder / f"journal-{name}-1-20261206T000000.1-00001.jsonl"
    lines = [row(time=f"2026-12-06T10:00:{i:02d}+00:00", endpoint="/v1/completions", status=200) for i in range(rows)]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    then = time.time() - age_s
    os.utime(journal, (then, then))
    return journal


def parquet_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*/requests-*.parquet"))


def test_a_journal_a_dead_pod_left_is_compacted_once_by_a_replica_on_another_host(tmp_path):
    orphan = left_by_a_dead_pod(tmp_path, "unmask-router-7f9c-x2k", 5, age_s=3600)
    recent = left_by_a_dead_pod(tmp_path, "unmask-router-7f9c-q8w", 3, age_s=0)  # touched now: a live writer's
    assert len(read_rows(tmp_path)) == 8  # readers read both journals already
    replica = RequestLog(tmp_path, flush_s=0.05, orphan_after_s=60)
    try:
        deadline = time.monotonic() + 10
        while orphan.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not orphan.exists() and recent.exists()
        [written] = parquet_files(tmp_path)
        assert "unmask-router-7f9c-x2k" in written.name
        assert len(read_rows(tmp_path)) == 8  # each row once: the Parquet file, and the journal still written
    finally:
        replica.close()


def test_two_replicas_adopting_the_same_journal_write_it_once(tmp_path):
    left_by_a_dead_pod(tmp_path, "unmask-router-dead", 40, age_s=3600)
    first = RequestLog(tmp_path, flush_s=5, orphan_after_s=60)
    second = RequestLog(tmp_path, flush_s=5, orphan_after_s=60)
    try:
        both = [threading.Thread(target=log._adopt) for log in (first, second)]
        for thread in both:
            thread.start()
        for thread in both:
            thread.join(30)
        assert len(parquet_files(tmp_path)) == 1 and len(read_rows(tmp_path)) == 40
        assert not list(tmp_path.glob("*/*.partial"))
    finally:
        first.close()
        second.close()


def test_an_idle_live_writers_journal_is_touched_and_never_adopted(tmp_path):
    idle = RequestLog(tmp_path, flush_s=0.05)
    adopter = RequestLog(tmp_path, flush_s=0.05, orphan_after_s=0.5)  # adopts what is untouched for 0.5 s
    try:
        [journal] = [p for p in tmp_path.glob("journal-*.jsonl") if idle._prefix in p.name]
        before = journal.stat().st_mtime
        time.sleep(1.5)
        adopter._adopt()
        assert journal.exists() and journal.stat().st_mtime > before  # touched while idle: still its writer's
        idle.append(row(time="2026-12-06T10:00:00+00:00", endpoint="/v1/completions", status=200))
        assert len(read_rows(tmp_path)) == 1
    finally:
        idle.close()
        adopter.close()
    assert len(read_rows(tmp_path)) == 1 and not list(tmp_path.glob("journal-*.jsonl"))
