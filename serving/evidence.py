"""The canary evidence a server writes and an analysis reads, chosen once by its location: a folder or PostgreSQL.

`open_evidence(location)` is the one selection point. A folder (a machine's `<state>/serving/requests`, or a volume
every pod mounts) gives `FolderEvidence`: today's files, the request log's Parquet partitions and journals
(serving/request_log.py), the probe log's hour files (evals/canary_probes.py) and the look records
(serving/looks.py). A `postgresql://` URL gives `PostgresEvidence` (evals/evidence_store.py): the same three in the
team PostgreSQL, for replicas on several machines with no shared volume. `unmask serve`, `unmask analysis serve` and
the rollout flow read the URL from `UNMASK_EVIDENCE_URL` (`evidence_location`); unset, the folder as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from evals.canary_probes import ProbeFolder, probe_folder
from evals.evidence_store import (
    EVIDENCE_URL,
    RETENTION_H,
    EvidenceError,
    EvidenceStore,
    Identity,
    PostgresEvidence,
    is_postgres,
    masked,
)
from serving.looks import LookBook
from serving.request_log import ParquetRows


class FolderEvidence:
    """The evidence in one folder: request rows, probe results under `probes/`, look records under `looks/`."""

    def __init__(self, folder: Path, retention_h: float = RETENTION_H):
        self.folder = self.location = Path(folder)
        self.where = str(self.folder)
        self.settle_s = 0.0  # a reader reads the journals not yet compacted: a row is there once it is answered
        self.requests = ParquetRows(self.folder, retention_h)
        self.probes = ProbeFolder(probe_folder(self.folder), retention_h)
        self.looks = LookBook(self.folder / "looks")

    def append_requests(self, rows: list[dict[str, Any]], segment: str, host: str) -> None:
        self.requests.append_requests(rows, segment, host)

    def read_requests(self, since: datetime | None = None, until: datetime | None = None) -> list[dict[str, Any]]:
        return self.requests.read_requests(since, until)

    def append_probes(self, route: str, rows: list[dict[str, Any]]) -> None:
        self.probes.append_probes(route, rows)

    def read_probes(
        self, route: str, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        return self.probes.read_probes(route, since, until)

    def look_number(self, identity: Identity, window_end: datetime) -> int:
        return self.looks.look_number(identity, window_end)

    def prune(self, now: datetime) -> None:
        self.requests.prune(now)  # the probe log removes its old hours as it appends

    def close(self) -> None:
        pass


def open_evidence(location: str | Path) -> EvidenceStore:
    """The store at `location`: a `postgresql://` URL or a folder. EvidenceError for another kind of URL."""
    if is_postgres(location):
        return PostgresEvidence(str(location))
    if isinstance(location, str) and "://" in location:
        raise EvidenceError(
            f"{masked(location)!r}: canary evidence goes to a folder or a postgresql:// URL "
            "(postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE)"
        )
    return FolderEvidence(Path(location))


def evidence_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """`UNMASK_EVIDENCE_URL` when set (checked for its form, not yet reached); EvidenceError naming it otherwise."""
    url = environ.get(EVIDENCE_URL, "").strip()
    if not url:
        return None
    if not is_postgres(url):
        raise EvidenceError(
            f"{EVIDENCE_URL}={masked(url)!r}: expected postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE "
            "(unset it to keep the evidence in the request log's folder)"
        )
    try:
        PostgresEvidence(url)  # its form: a host, a database, a port that is a number
    except EvidenceError as e:
        raise EvidenceError(f"{EVIDENCE_URL}: {e}") from None
    return url


def evidence_location(folder: Path, environ: Mapping[str, str] = os.environ) -> str | Path:
    """Where the evidence is: `UNMASK_EVIDENCE_URL` when set, else `folder`."""
    return evidence_url(environ) or folder


def checked_evidence_url(environ: Mapping[str, str] = os.environ) -> str | None:
    """`UNMASK_EVIDENCE_URL`, reached and its tables made, for a command to start on (None when unset); an
    EvidenceError with one line naming host, port and database (never the password) when it cannot be."""
    url = evidence_url(environ)
    if url is None:
        return None
    store = PostgresEvidence(url)
    try:
        store.check()
    except EvidenceError as e:
        raise EvidenceError(f"{EVIDENCE_URL}: {e}") from None
    finally:
        store.close()
    return url
