"""Where canary evidence is kept when replicas run on several machines: the team PostgreSQL.

A rollout is judged on three kinds of evidence, and every replica and every analysis process must see the same:
request rows (serving/request_log.py), probe results (evals/canary_probes.py) and the look numbers of each rollout
identity (serving/looks.py). On one machine, or on a volume every pod mounts, they are files in the request log's
folder (`serving.evidence.FolderEvidence`). Across machines with no shared volume they go to PostgreSQL, named by a
`postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE` URL (`UNMASK_EVIDENCE_URL`, from a Secret in a pod):
`PostgresEvidence`, the second class behind the same protocol (`EvidenceStore`); `serving.evidence.open_evidence`
picks one by the location, and no caller branches on which.

Tables, made on first use (`CREATE ... IF NOT EXISTS` under a transaction-scoped advisory lock, so replicas starting
together never race on the catalog):

    unmask_requests          (time timestamptz, route, host, entry jsonb)   one row a request, indexed on time
    unmask_request_segments  (segment primary key, flushed)                  which journals were written, once each
    unmask_probes            (time timestamptz, route, entry jsonb)          one graded probe answer, on (route, time)
    unmask_looks             (identity, window_end, number), key (identity, window_end)

"Partitioned by time" is the B-tree on `time`: a window's read is one range scan over that index, so its cost is
the window's rows (a minute of a day's log reads a minute's pages), never the table's history; the retention is a
`DELETE ... WHERE time < now - retention` on the same index, at most once a minute per writer. Declarative daily
partitions would add a job that creates tomorrow's partition before midnight, for no read a window makes faster.

A journal is written in one transaction together with its segment's name, so a writer that crashes between the
commit and removing its journal, or two adopters of one orphan journal, insert its rows once (the second finds the
segment and writes nothing). A look is numbered under `pg_advisory_xact_lock` on the identity: two analysis
replicas asking for the same window get one number, the next distinct window the next (serving/looks.py has the
rules). Messages name the server as `host:port/database (user U)`, never the password.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, urlsplit, urlunsplit

if TYPE_CHECKING:
    import psycopg

EVIDENCE_URL = "UNMASK_EVIDENCE_URL"  # the team PostgreSQL's URL; unset: the request log's folder holds the evidence
RETENTION_H = 24 * 7  # a week of request rows and probe results, then the writers remove them
PRUNE_EVERY = timedelta(minutes=1)  # a writer deletes what is past the retention at most this often
# How long after a moment every replica's rows of it are in PostgreSQL: each server's request log writes its journal
# every 2 s (serving/request_log.py), the rest is the write's own time, with room to spare. A window is judged only
# once this has passed since its end, so two analyses of it, whenever asked, read the same rows.
SETTLE_S = 5.0
SCHEMES = ("postgresql", "postgres")
EXPECTED = "expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
Identity = tuple[str, str, str, str, float]  # (route, candidate, baseline, revision, window_s): serving/looks.py


class EvidenceError(RuntimeError):
    """Evidence that cannot be written or read: the store named (a PostgreSQL server without its password)."""


class EvidenceUnavailable(EvidenceError):
    """The store cannot be reached now (connection refused, dropped, timed out): a writer keeps its rows and retries."""


class RequestStore(Protocol):
    """Where a request log's rows go and are read back by window (`where` names it in messages)."""

    where: str

    def append_requests(self, rows: list[dict[str, Any]], segment: str, host: str) -> None:
        """A journal's rows (`segment` names it, unique per writer) written whole or not at all, once."""
        ...

    def read_requests(self, since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
        """The rows with their time in [since, until) (ordered by time on PostgreSQL, by file in a folder)."""
        ...

    def prune(self, now: datetime) -> None:
        """Remove what is older than the retention (its writers call it once a minute at most)."""
        ...

    def close(self) -> None: ...


class ProbeLog(Protocol):
    """Where graded probe answers go (`ProbeResult.to_dict()` rows) and are read back per route and window."""

    def append_probes(self, route: str, rows: list[dict[str, Any]]) -> None: ...

    def read_probes(
        self, route: str, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]: ...


class EvidenceStore(RequestStore, ProbeLog, Protocol):
    """All of a rollout's canary evidence in one place: request rows, probe results, look numbers."""

    @property
    def location(self) -> str | Path:
        """What opened it: the folder, or the URL (with its password: never print it, print `where`)."""
        ...

    def look_number(self, identity: Identity, window_end: datetime) -> int:
        """The look of `identity` that judges the window ending at `window_end`: numbered on first sight."""
        ...

    @property
    def settle_s(self) -> float:
        """Seconds after a moment until every writer's rows of it can be read (0: readers read the journals too)."""
        ...


def is_postgres(location: str | Path) -> bool:
    return isinstance(location, str) and urlsplit(location).scheme in SCHEMES


def masked(url: str) -> str:
    """The URL with its password (in the authority or a `password=` parameter) replaced by ***."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            netloc = f"{parts.username or ''}:***@{netloc.rpartition('@')[2]}"
        query = "&".join(
            f"{k}=***" if k == "password" else f"{k}={v}"
            for k, _, v in (p.partition("=") for p in parts.query.split("&"))
        )
        return urlunsplit(parts._replace(netloc=netloc, query=query if parts.query else ""))
    except ValueError:
        return "postgresql://***"  # too broken to say which part is the password


def _password(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        return parts.password or next(iter(parse_qs(parts.query).get("password", [])), None)
    except ValueError:
        return None


def _one_line(error: BaseException, url: str) -> str:
    """An error's text on one line, the URL's password never in it."""
    text = " ".join(str(error).split())
    secret = _password(url)
    return text.replace(secret, "***") if secret else text


def server_of(url: str) -> str:
    """`host:port/database (user U)` of a PostgreSQL URL; EvidenceError naming the masked URL when it is malformed."""
    try:
        parts = urlsplit(url)
        port = parts.port or 5432
        query = parse_qs(parts.query)
    except ValueError as e:
        raise EvidenceError(f"{masked(url)!r} is malformed ({_one_line(e, url)}): {EXPECTED}") from None
    if parts.scheme not in SCHEMES:
        raise EvidenceError(f"{masked(url)!r} is not a PostgreSQL URL: {EXPECTED}")
    host = parts.hostname or (query.get("host") or [""])[0]
    database = parts.path.lstrip("/") or (query.get("dbname") or [""])[0]
    if not host or not database:
        raise EvidenceError(f"{masked(url)!r} names no {'host' if not host else 'database'}: {EXPECTED}")
    user = parts.username or (query.get("user") or [""])[0]
    return f"{host}:{port}/{database}" + (f" (user {user})" if user else "")


def _lock_key(text: str) -> int:
    """A stable signed 64-bit key for pg_advisory_xact_lock (the same on every host and Python)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


TABLES_LOCK = _lock_key("unmask.evidence.tables")
TABLES = (
    """CREATE TABLE IF NOT EXISTS unmask_requests (
        time timestamptz NOT NULL, route text NOT NULL DEFAULT '', host text NOT NULL DEFAULT '',
        entry jsonb NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS unmask_requests_time ON unmask_requests (time)",
    """CREATE TABLE IF NOT EXISTS unmask_request_segments (
        segment text PRIMARY KEY, flushed timestamptz NOT NULL DEFAULT now())""",
    "CREATE TABLE IF NOT EXISTS unmask_probes (time timestamptz NOT NULL, route text NOT NULL, entry jsonb NOT NULL)",
    "CREATE INDEX IF NOT EXISTS unmask_probes_route_time ON unmask_probes (route, time)",
    """CREATE TABLE IF NOT EXISTS unmask_looks (
        identity text NOT NULL, window_end timestamptz NOT NULL, number integer NOT NULL,
        judged timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (identity, window_end))""",
)


def time_of(text: Any) -> datetime:
    """A row's `time` (ISO text; naive reads as UTC; missing: the earliest time)."""
    when = datetime.fromisoformat(text) if isinstance(text, str) and text else datetime.min.replace(tzinfo=UTC)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _json_safe(value: Any) -> Any:
    """What jsonb accepts: no NaN or infinity (null instead), no NUL character in text."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {str(k).replace("\x00", ""): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(_json_safe(value), default=str, ensure_ascii=False)


def _window(since: datetime | None, until: datetime | None) -> tuple[str, list[datetime]]:
    """The SQL condition on `time` for [since, until) and its parameters (a missing bound is left out)."""
    clauses, params = [], []
    for op, bound in ((">=", since), ("<", until)):
        if bound is not None:
            clauses.append(f"time {op} %s")
            params.append(bound if bound.tzinfo else bound.replace(tzinfo=UTC))
    return " AND ".join(clauses) or "TRUE", params


def _driver() -> Any:
    """psycopg, an optional dependency (the `postgres` extra): EvidenceError saying how to install it."""
    try:
        import psycopg
    except ImportError:
        raise EvidenceError(
            f"{EVIDENCE_URL} names PostgreSQL, and psycopg is not installed: pip install 'unmask[postgres]'"
        ) from None
    return psycopg


class PostgresEvidence:
    """Canary evidence in the team PostgreSQL: one connection, used by one call at a time, opened again after an
    outage. EvidenceUnavailable when the server cannot be reached, EvidenceError for anything else it refuses."""

    def __init__(self, url: str, retention_h: float = RETENTION_H, connect_timeout_s: float = 5.0):
        self.location, self.where = url, server_of(url)  # a malformed URL is refused here, before any connection
        self.settle_s = SETTLE_S
        self.retention, self.connect_timeout_s = timedelta(hours=retention_h), connect_timeout_s
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[Any] | None = None
        self._tables = False  # made (or found) once per store
        self._pruned = datetime.min.replace(tzinfo=UTC)

    def check(self) -> None:
        """Connect and make the tables: EvidenceError naming the server when it cannot."""
        with self._transaction():
            pass

    def close(self) -> None:
        with self._lock:
            self._drop()

    def append_requests(self, rows: list[dict[str, Any]], segment: str, host: str) -> None:
        """The rows in one transaction with their segment's name; a segment written before adds nothing."""
        with self._transaction() as cursor:
            cursor.execute(
                "INSERT INTO unmask_request_segments (segment) VALUES (%s) ON CONFLICT DO NOTHING", (segment,)
            )
            if cursor.rowcount == 0:
                return  # written before: a crash between its commit and the journal's removal, or another adopter
            with cursor.copy("COPY unmask_requests (time, route, host, entry) FROM STDIN") as copy:
                for entry in rows:
                    copy.write_row((time_of(entry.get("time")), entry.get("route") or "", host, _dumps(entry)))

    def read_requests(self, since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
        condition, params = _window(since, until)
        with self._transaction() as cursor:
            cursor.execute(f"SELECT entry FROM unmask_requests WHERE {condition} ORDER BY time", params)
            return [entry for (entry,) in cursor.fetchall()]

    def append_probes(self, route: str, rows: list[dict[str, Any]]) -> None:
        with self._transaction() as cursor:
            cursor.executemany(
                "INSERT INTO unmask_probes (time, route, entry) VALUES (%s, %s, %s::jsonb)",
                [(time_of(r.get("time")), route, _dumps(r)) for r in rows],
            )
        now = datetime.now(UTC)
        if now - self._pruned >= PRUNE_EVERY:  # the probe sender is a writer too: it removes the expired, at times
            self.prune(now)

    def read_probes(
        self, route: str, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        condition, params = _window(since, until)
        with self._transaction() as cursor:
            cursor.execute(
                f"SELECT entry FROM unmask_probes WHERE route = %s AND {condition} ORDER BY time", [route, *params]
            )
            return [entry for (entry,) in cursor.fetchall()]

    def look_number(self, identity: Identity, window_end: datetime) -> int:
        """The window's number for `identity`, assigned under the identity's advisory lock: the first window any
        replica judged is 1, the next distinct one 2; a window keeps its number."""
        key = json.dumps(list(identity))
        with self._transaction() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(f"unmask.looks:{key}"),))
            cursor.execute("SELECT number FROM unmask_looks WHERE identity = %s AND window_end = %s", (key, window_end))
            found = cursor.fetchone()
            if found is None:
                cursor.execute(
                    "INSERT INTO unmask_looks (identity, window_end, number) "
                    "SELECT %s, %s, COALESCE(MAX(number), 0) + 1 FROM unmask_looks WHERE identity = %s "
                    "RETURNING number",
                    (key, window_end, key),
                )
                found = cursor.fetchone()
            assert found is not None  # INSERT ... RETURNING gives its row
            return int(found[0])

    def prune(self, now: datetime) -> None:
        """Delete the rows, probe results and segment names older than the retention (a writer calls it at most
        once a minute: the request log's thread, the probe sender's appends)."""
        cutoff = now - self.retention
        with self._transaction() as cursor:
            for table, column in (
                ("unmask_requests", "time"),
                ("unmask_probes", "time"),
                ("unmask_request_segments", "flushed"),
            ):
                cursor.execute(f"DELETE FROM {table} WHERE {column} < %s", (cutoff,))
        self._pruned = now

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor inside one transaction on the store's connection (opened, and the tables made, when needed)."""
        driver = _driver()
        with self._lock:
            try:
                connection = self._connect()
                with connection.transaction(), connection.cursor() as cursor:
                    yield cursor
            except (driver.OperationalError, driver.InterfaceError) as e:
                self._drop()
                raise EvidenceUnavailable(
                    f"PostgreSQL at {self.where} cannot be reached: {_one_line(e, self.location)}"
                ) from None
            except driver.Error as e:
                if self._connection is not None and self._connection.broken:
                    self._drop()
                raise EvidenceError(f"PostgreSQL at {self.where}: {_one_line(e, self.location)}") from None

    def _connect(self) -> psycopg.Connection[Any]:
        driver = _driver()
        if self._connection is not None and not (self._connection.closed or self._connection.broken):
            return self._connection
        self._drop()
        connection: psycopg.Connection[Any] = driver.connect(
            self.location,
            autocommit=True,  # each call is one explicit transaction
            connect_timeout=max(1, round(self.connect_timeout_s)),
            application_name="unmask-evidence",
        )
        self._connection = connection  # dropped (closed) by the caller should the tables fail
        if not self._tables:
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (TABLES_LOCK,))
                for statement in TABLES:
                    connection.execute(statement)
            self._tables = True
        return connection

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:  # a broken connection may fail to close; it is gone either way
                pass
            self._connection = None
