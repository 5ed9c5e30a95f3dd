"""The request log: one row per request, journaled as it is appended and compacted to Parquet by a thread.

Every replica that shares the folder (one machine's state folder, or a volume the pods mount) writes its own
files; a reader reads them all, so an analysis judges the union of the replicas' requests.

    journal-<host>-<pid>-<n>.jsonl                                   rows appended since the last flush
    <YYYYMMDDTHH>/requests-<first>-<last>-<host>-<pid>-<n>.parquet   one flush: partitioned by its last row's hour

`append` writes the row's JSON line to the journal before it returns (one `write`, to the OS's page cache, no
fsync): a request's row is in the log before its answer is sent, so a kill -9 of the server loses none of them
(a power loss can lose what the OS had not written back, a few seconds). The writer thread rotates the journal
every `flush_rows` rows or `flush_s` seconds, writes its rows to Parquet under a temporary name, renames it into
place, then removes the journal; a reader skips a journal whose Parquet file exists, so a crash between the two
counts no row twice. A journal left by a process that died is compacted by the next log opened on that host, and
by any log on the folder once it has not been touched for `orphan_after_s` (a pod that died: its replacement has
another host name): a live writer touches its journal on every flush cycle, however idle, and a journal is
compacted under an exclusive lock on it, so two replicas adopting the same one write it once.

A read for a window (`since`) opens only the files whose name says they hold rows in it: its cost follows the
window, not the log's history. Partitions older than `retention_h` hours are removed by the writer.
A write the disk refuses drops the row and counts it (`unmask_request_log_dropped`) rather than failing the answer.

A rotated journal goes to the log's `store` (evals/evidence_store.py): `ParquetRows` (the files above) by default,
`PostgresEvidence` for replicas on several machines (`UNMASK_EVIDENCE_URL`: one transaction per journal, with its
name, so retried or adopted it is written once); the journal itself stays in the local folder, written before the
answer. A store that refuses keeps the journal: warned once per outage, retried every cycle, answers go on. Loss
bound on PostgreSQL: a kill -9 loses nothing (the next log on the folder writes the journals); a pod whose disk goes
with it (an emptyDir) loses its unflushed journals: the last `flush_s` seconds of rows, or every row since an outage
of the store began.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import re
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from evals.evidence_store import RETENTION_H, EvidenceError, RequestStore, time_of

log = logging.getLogger("unmask.serve")

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


STAMP = "%Y%m%dT%H%M%S%f"  # a row time in a file name, to the microsecond
HOUR = "%Y%m%dT%H"  # a partition's name
PARQUET = re.compile(r"^requests-(\d{8}T\d{12})-(\d{8}T\d{12})-(.+)\.parquet$")
JOURNAL = re.compile(r"^journal-(.+)\.jsonl$")
_OPENED = itertools.count(1)  # the logs this process opened


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime(STAMP)


def _partitions(folder: Path) -> Iterator[tuple[Path, datetime]]:
    """(folder, its hour) of every partition: each holds files whose last row is of that hour."""
    for part in folder.iterdir() if folder.is_dir() else ():
        try:
            hour = datetime.strptime(part.name, HOUR).replace(tzinfo=UTC)
        except ValueError:
            continue
        if part.is_dir():
            yield part, hour


def _parquet_files(folder: Path, since: datetime | None = None) -> Iterator[tuple[Path, datetime, datetime, str]]:
    """(path, first row time, last row time, segment) of every finished Parquet file, partitioned or (written
    before partitions) at the top; a top-level file's times are unknown (min and max). With `since`, the
    partitions of an hour before it are not even listed: a day's files cost a window nothing."""
    recent = [p for p, hour in _partitions(folder) if since is None or hour + timedelta(hours=1) > since]
    for path in [*folder.glob("requests-*.parquet"), *(f for p in recent for f in p.glob("requests-*.parquet"))]:
        named = PARQUET.match(path.name)
        if named:
            first, last = (datetime.strptime(t, STAMP).replace(tzinfo=UTC) for t in named.group(1, 2))
            yield path, first, last, named.group(3)
        else:
            yield path, datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC), path.stem


def log_files(folder: str | Path) -> list[Path]:
    """Every finished Parquet file of the log, oldest rows first."""
    return [path for path, *_ in sorted(_parquet_files(Path(folder)), key=lambda f: (f[1], f[2], f[0].name))]


def _journal_rows(path: Path) -> list[dict[str, Any]]:
    """A journal's rows; a line torn by a crash mid-write is skipped."""
    rows = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:  # compacted meanwhile: its Parquet file is read instead
        return []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            rows.append(entry)
    return rows


def read_rows(folder: str | Path, since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
    """Every row under `folder` with its time in [since, until) (either bound optional), oldest file first.

    Only renamed-into-place Parquet files and the journals not yet compacted are read, and of those only the
    ones whose name says they can hold rows in the window; a file gone by the time it is opened (compacted,
    rotated, removed) is skipped. Rows of older files lack the newer columns: they read as None.
    """
    folder = Path(folder)
    since = since.replace(tzinfo=UTC) if since is not None and since.tzinfo is None else since
    until = until.replace(tzinfo=UTC) if until is not None and until.tzinfo is None else until
    found = sorted(_parquet_files(folder, since), key=lambda f: (f[1], f[2], f[0].name))
    compacted = {segment for *_, segment in found}  # an older partition's journal holds only rows before `since`
    rows: list[dict[str, Any]] = []
    for path, first, last, _ in found:
        if (since is not None and last < since) or (until is not None and first >= until):
            continue
        try:
            rows += pq.read_table(path).to_pylist()
        except (FileNotFoundError, OSError):
            continue
    for journal in sorted(folder.glob("journal-*.jsonl")):
        named = JOURNAL.match(journal.name)
        if named and named.group(1) not in compacted:
            rows += _journal_rows(journal)
    out = []
    for entry in rows:
        entry = {name: None for name in SCHEMA.names} | entry
        when = time_of(entry["time"])
        if (since is None or when >= since) and (until is None or when < until):
            out.append(entry)
    return out


def _host(name: str | None = None) -> str:
    """This machine's name (or `name`) as a journal name holds it: no `-`, which separates the name's fields."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", name or socket.gethostname())[:63] or "host"


ORPHAN_AFTER_S = 600.0  # a journal untouched this long has no writer (each touches its own every flush_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ParquetRows:
    """The request rows of a folder: the hour partitions of Parquet files above, read with the journals not yet
    compacted (`read_rows`); the folder's `RequestStore` (the default of a `RequestLog`)."""

    def __init__(self, folder: Path, retention_h: float = RETENTION_H):
        self.folder, self.retention = Path(folder), timedelta(hours=retention_h)
        self.where = str(self.folder)

    def append_requests(self, rows: list[dict[str, Any]], segment: str, host: str) -> None:
        """The rows as one Parquet file in their last row's hour, renamed into place whole."""
        times = [time_of(r.get("time")) for r in rows]
        part = self.folder / max(times).strftime(HOUR)
        path = part / f"requests-{_stamp(min(times))}-{_stamp(max(times))}-{segment}.parquet"
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # two adopters never share one
        try:
            part.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), partial)
            partial.rename(path)
        except (OSError, pa.ArrowException) as e:
            partial.unlink(missing_ok=True)
            raise EvidenceError(f"{path}: {e}") from None

    def read_requests(self, since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
        return read_rows(self.folder, since, until)

    def prune(self, now: datetime) -> None:
        """Remove the partitions whose hour is past the retention."""
        for part, hour in _partitions(self.folder):
            if hour + timedelta(hours=1) < now - self.retention:
                shutil.rmtree(part, ignore_errors=True)

    def close(self) -> None:
        pass


class RequestLog:
    """Append rows from any thread or task (each is journaled before `append` returns); a writer thread moves each
    rotated journal into `store` (default: Parquet files in `folder`); `close()` writes the rest."""

    def __init__(
        self,
        folder: Path,
        flush_rows: int = 256,
        flush_s: float = 2.0,
        retention_h: float = RETENTION_H,
        on_drop: Callable[[], None] | None = None,
        orphan_after_s: float = ORPHAN_AFTER_S,
        store: RequestStore | None = None,
        host: str | None = None,
    ):
        self.folder = Path(folder)  # the journals' (and, without a store, the Parquet files')
        self.folder.mkdir(parents=True, exist_ok=True)
        self.store: RequestStore = store or ParquetRows(self.folder, retention_h)
        self.flush_rows, self.flush_s = flush_rows, flush_s
        self.orphan_after_s = max(orphan_after_s, 10 * flush_s)  # never shorter than a live writer's touches
        self._on_drop = on_drop or (lambda: None)
        # host, process, and which of the process's logs: two logs on one folder never share a journal name
        self.host = _host(host)
        self._prefix = f"{self.host}-{os.getpid()}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.{next(_OPENED)}"
        self._segments, self._pending, self._fd, self._journal = 0, 0, -1, self.folder
        self._kept: list[Path] = []  # this log's rotated journals the store refused: retried every cycle
        self._refusing = False  # the store refused the last write (warned once until it takes one again)
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._stop = threading.Event()
        self._pruned = datetime.min.replace(tzinfo=UTC)
        self._open_segment()
        self._recover()
        self._thread = threading.Thread(target=self._run, name="unmask-request-log", daemon=True)
        self._thread.start()

    def append(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, default=str, ensure_ascii=False) + "\n").encode()
        with self._lock:
            try:
                os.write(self._fd, line)
            except OSError as e:
                log.warning("request log: row dropped, %s cannot be written: %s", self._journal, e)
                self._on_drop()
                return
            self._pending += 1
            if self._pending >= self.flush_rows:
                self._due.set()

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._due.set()
        self._thread.join(timeout_s)
        self.store.close()

    def files(self) -> list[Path]:
        return log_files(self.folder)

    def _open_segment(self) -> None:
        self._segments += 1
        self._journal = self.folder / f"journal-{self._prefix}-{self._segments:05d}.jsonl"
        self._fd = os.open(self._journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _rotate(self) -> Path | None:
        """Start a new journal; the one closed (None when it held no row)."""
        with self._lock:
            if not self._pending:
                return None
            closed, fd = self._journal, self._fd
            self._pending = 0
            self._open_segment()
        os.close(fd)
        return closed

    def _run(self) -> None:
        while True:
            self._due.wait(self.flush_s)
            self._due.clear()
            stopping = self._stop.is_set()
            closed = self._rotate()
            if closed is not None:
                self._kept.append(closed)
            while self._kept and self._compact(self._kept[0]):  # oldest first; a refusal waits for the next cycle
                self._kept.pop(0)
            self._touch()
            self._prune()
            if stopping:
                with self._lock:  # a row appended after this is refused (and counted), not written and lost
                    os.close(self._fd)
                    self._fd, last, pending = -1, self._journal, self._pending
                if pending:
                    self._compact(last)  # refused: the journal stays, for the next log on this folder
                else:
                    last.unlink(missing_ok=True)
                return

    def _touch(self) -> None:
        """Say this journal has a writer (its time), idle or not: only an untouched one is adopted by another log."""
        with self._lock:
            if self._fd >= 0:
                try:
                    os.utime(self._journal)
                except OSError:
                    pass

    def _adopt(self) -> None:
        """Compact the journals no writer has touched for `orphan_after_s`, whatever host left them."""
        stale = datetime.now(UTC).timestamp() - self.orphan_after_s
        for journal in self.folder.glob("journal-*.jsonl"):
            try:
                untouched = journal.stat().st_mtime < stale
            except FileNotFoundError:  # compacted meanwhile
                continue
            if untouched and not journal.name.startswith(f"journal-{self._prefix}-"):
                if not self._compact(journal, claimed=False):
                    return  # the store refuses: the next minute tries again

    def _compact(self, journal: Path, claimed: bool = True) -> bool:
        """The journal's rows written to the store, then the journal removed; False when the store refused (the
        journal stays). Not `claimed` (another writer's, adopted): only under an exclusive lock on it, which no other
        adopter then gets."""
        if claimed:
            return self._write(journal)
        try:
            fd = os.open(journal, os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if journal.exists():  # not compacted by the adopter that held the lock before
                return self._write(journal)
        except BlockingIOError:  # another log adopts it now
            pass
        finally:
            os.close(fd)
        return True

    def _write(self, journal: Path) -> bool:
        rows = _journal_rows(journal)
        segment = journal.name.removeprefix("journal-").removesuffix(".jsonl")
        try:
            if rows:
                self.store.append_requests(rows, segment, segment.split("-", 1)[0])
        except EvidenceError as e:  # kept as a journal: still on disk, retried, read by a folder's readers
            if not self._refusing:
                log.warning(
                    "request log: %s kept on this machine, not written to %s (%s); retried every %g s",
                    journal,
                    self.store.where,
                    e,
                    self.flush_s,
                )
            self._refusing = True
            return False
        if self._refusing:
            log.warning("request log: %s takes rows again; kept journals follow", self.store.where)
            self._refusing = False
        journal.unlink(missing_ok=True)
        return True

    def _recover(self) -> None:
        """Compact the journals this host's dead processes left (a kill -9 of an earlier server)."""
        for journal in self.folder.glob(f"journal-{self.host}-*.jsonl"):
            pid = journal.name.removeprefix(f"journal-{self.host}-").split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)) and not self._compact(journal):
                return  # the store refuses: adopted later, once untouched for `orphan_after_s`

    def _prune(self) -> None:
        """Remove what is past the retention, and adopt orphaned journals (once a minute at most)."""
        now = datetime.now(UTC)
        if now - self._pruned < timedelta(minutes=1):
            return
        self._pruned = now
        self._adopt()
        try:
            self.store.prune(now)
        except EvidenceError as e:  # the next minute tries again
            log.warning("request log: rows past the retention not removed from %s: %s", self.store.where, e)
