"""The request log loses no answered request when `unmask serve` is killed (issue 49, item 7).

A real server under load from four clients, killed with SIGKILL while requests are in flight: every request a
client got an answer for is in the log (each row is journaled before its answer is sent), and the next log opened
on the folder compacts the dead server's journal into Parquet without counting a row twice. Before the journal,
rows waited up to two seconds in memory: a kill -9 under load lost 11 of 223 answered requests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving.request_log import RequestLog, log_files, read_rows
from tests.support.servers import free_port, stop_group, wait_healthy
from tests.support.serving_fixtures import PROMPTS, serving_registry

pytestmark = pytest.mark.timeout(300)


def test_a_killed_server_s_log_holds_every_answered_request_and_is_compacted_once(tmp_path):
    registry = serving_registry(tmp_path / "registry")
    home, port = tmp_path / "state", free_port()
    home.mkdir()
    env = dict(os.environ, UNMASK_HOME=str(home), MLFLOW_TRACKING_URI=registry.tracking_uri, UNMASK_THREADS="1")
    server_log = tmp_path / "serve.log"
    with server_log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-c", "from flows.cli import main; main()", "serve", "--alias", "fallback"]
            + ["--port", str(port)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    answered: list[str] = []
    stop = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as http:
            for n in range(10_000):  # bounded: the kill (or the deadline below) ends it long before
                if stop.is_set():
                    return
                rid = f"crash-{worker}-{n}"
                body = {"model": "fallback", "prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": 4}
                try:
                    answer = http.post("/v1/completions", json=body, headers={"X-Request-Id": rid})
                except httpx.HTTPError:
                    return  # the server is gone
                if answer.status_code == 200:
                    answered.append(rid)

    try:
        wait_healthy(base + "/health", server, server_log, timeout_s=180)
        workers = [threading.Thread(target=client, args=(w,), daemon=True) for w in range(4)]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 120
        while len(answered) < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)  # mid-load: requests in flight, rows not yet compacted
        server.wait(30)
        stop.set()
        for worker in workers:
            worker.join(60)
    finally:
        stop.set()
        stop_group(server)
    folder = home / "serving" / "requests"
    assert len(answered) >= 150, f"only {len(answered)} answers before the deadline"
    logged = [r["request_id"] for r in read_rows(folder)]
    lost = sorted(set(answered) - set(logged))
    assert not lost, f"{len(lost)} of {len(answered)} answered requests are not in the log: {lost[:5]}"
    assert list(folder.glob("journal-*.jsonl")), "the kill left rows in the journal (or this proved nothing)"

    RequestLog(folder).close()  # the next server on the folder: the dead one's journal becomes Parquet, once
    assert not list(folder.glob("journal-*.jsonl")) and log_files(folder)
    again = [r["request_id"] for r in read_rows(folder)]
    assert sorted(again) == sorted(logged) and len(again) == len(set(again))


def test_a_window_opens_only_the_files_that_can_hold_its_rows(tmp_path):
    """A window's read costs its rows, not the log's history: 3,000 files of old rows are named, not opened."""
    from datetime import UTC, datetime, timedelta

    import pyarrow as pa
    import pyarrow.parquet as pq

    from serving.request_log import HOUR, SCHEMA, STAMP, row

    old = datetime.now(UTC) - timedelta(days=2)
    for n in range(3000):  # written as the log writes them (names carry their rows' first and last time)
        when = old + timedelta(seconds=n)
        part = tmp_path / when.strftime(HOUR)
        part.mkdir(exist_ok=True)
        stamp = when.strftime(STAMP)
        table = pa.Table.from_pylist([row(endpoint="completions", status=200) | {"time": when.isoformat()}], SCHEMA)
        pq.write_table(table, part / f"requests-{stamp}-{stamp}-old-{n:05d}.parquet")
    log = RequestLog(tmp_path, flush_s=60)
    log.append(row(endpoint="chat", status=200, request_id="now"))
    opened: list[Path] = []
    real = pq.read_table
    pq.read_table = lambda path, *a, **k: opened.append(Path(path)) or real(path, *a, **k)
    try:
        recent = read_rows(tmp_path, since=datetime.now(UTC) - timedelta(minutes=1))
    finally:
        pq.read_table = real
        log.close()
    assert [r["request_id"] for r in recent] == ["now"] and opened == []  # from the journal; no old file opened
    assert len(read_rows(tmp_path)) == 3001  # every row is still there for a reader that asks for all
