"""The request log: one row per request, written to Parquet by a thread of its own.

A request only puts its row on a bounded in-memory queue (never waits on disk); the writer flushes
every `flush_rows` rows or `flush_s` seconds, each flush a new file `requests-<start>-<pid>-<n>.parquet`
written under a temporary name and renamed, so a reader never sees half a file. When the writer
falls behind, rows are dropped and counted (`unmask_request_log_dropped`) rather than slowing answers.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema(
    [
        ("time", pa.string()),
        ("endpoint", pa.string()),
        ("alias", pa.string()),
        ("model", pa.string()),
        ("version", pa.string()),
        ("weights_sha256", pa.string()),
        ("config_hash", pa.string()),
        ("status", pa.int32()),
        ("error", pa.string()),
        ("latency_s", pa.float64()),
        ("queue_s", pa.float64()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("nfe", pa.int32()),
        ("batch_size", pa.int32()),
        # streaming and time to first byte / first final block (non-streamed: ttfb_s is the latency)
        ("stream", pa.bool_()),
        ("ttfb_s", pa.float64()),
        ("first_block_s", pa.float64()),
        # routing (`--routes`): the route that matched and the arm (alias) that served; empty when not routed
        ("route", pa.string()),
        ("arm", pa.string()),
        # arms: a failed attempt answered by the fallback (`retried`; the answer's row names the arm in `retry_of`),
        # shadow copies (`shadow`, `agrees`: its text equals the primary's), NaN/decode failures, the upstream's URL
        ("retried", pa.bool_()),
        ("retry_of", pa.string()),
        ("shadow", pa.bool_()),
        ("agrees", pa.bool_()),
        ("decode_failure", pa.bool_()),
        ("upstream", pa.string()),
        # the client's X-Request-Id (or the one the server made), as echoed on the response
        ("request_id", pa.string()),
    ]
)


def row(**fields: Any) -> dict[str, Any]:
    """A log row with every column (missing ones empty) and the time of now."""
    base = {name: None for name in SCHEMA.names}
    return base | {"time": datetime.now(UTC).isoformat(timespec="milliseconds")} | fields


def read_rows(folder: str | Path, since: datetime | None = None) -> list[dict[str, Any]]:
    """Every finished row under `folder` (oldest file first), those at or after `since` when given.

    Only renamed-into-place files are read; one that is gone by the time it is opened (a log rotated
    or moved meanwhile) is skipped. Rows of older files lack the newer columns: they read as None.
    """
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)  # the log's times are UTC
    rows: list[dict[str, Any]] = []
    for path in sorted(Path(folder).glob("requests-*.parquet")):
        try:
            table = pq.read_table(path)
        except (FileNotFoundError, OSError):
            continue
        for entry in table.to_pylist():
            entry = {name: None for name in SCHEMA.names} | entry
            if since is not None and _time_of(entry["time"]) < since:
                continue
            rows.append(entry)
    return rows


def _time_of(text: str | None) -> datetime:
    when = datetime.fromisoformat(text) if text else datetime.min.replace(tzinfo=UTC)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class RequestLog:
    """Append rows from any thread or task; `close()` flushes what is left."""

    def __init__(
        self,
        folder: Path,
        flush_rows: int = 256,
        flush_s: float = 2.0,
        capacity: int = 100_000,
        on_drop: Callable[[], None] | None = None,
    ):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.flush_rows, self.flush_s = flush_rows, flush_s
        self._rows: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=capacity)
        self._on_drop = on_drop or (lambda: None)
        self._stamp = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"  # two servers, one folder
        self._files = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unmask-request-log", daemon=True)
        self._thread.start()

    def append(self, entry: dict[str, Any]) -> None:
        try:
            self._rows.put_nowait(entry)
        except queue.Full:
            self._on_drop()

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("requests-*.parquet"))

    def _run(self) -> None:
        batch: list[dict[str, Any]] = []
        last = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            try:
                batch.append(self._rows.get(timeout=0.1))
            except queue.Empty:
                pass
            due = time.monotonic() - last >= self.flush_s
            if batch and (len(batch) >= self.flush_rows or due or stopping):
                if stopping:  # take everything still queued
                    while True:
                        try:
                            batch.append(self._rows.get_nowait())
                        except queue.Empty:
                            break
                self._write(batch)
                batch, last = [], time.monotonic()
            elif due:
                last = time.monotonic()
            if stopping and not batch and self._rows.empty():
                return

    def _write(self, batch: list[dict[str, Any]]) -> None:
        self._files += 1
        path = self.folder / f"requests-{self._stamp}-{self._files:05d}.parquet"
        partial = path.with_suffix(".parquet.partial")
        pq.write_table(pa.Table.from_pylist(batch, schema=SCHEMA), partial)
        partial.rename(path)
