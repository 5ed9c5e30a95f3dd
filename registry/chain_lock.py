"""The audit chain's lock: "read the last entry, write the next" by one writer of a store at a time.

Which lock is right depends on who can write the store, so it is chosen by the tracking URI:

- `sqlite:///file`: a lock file beside the database. Why it holds: every writer opens that file, so shares
  its folder.
- `postgresql://` (a client with database credentials): a PostgreSQL session advisory lock. Why it holds: the
  database grants it to one session; it is released when that session ends, even on kill -9.
- `http(s)://` (an `mlflow server`): a registry lock: a registered model created by exactly one client
  (compare-and-set by name). Why it holds: the server's database enforces the unique name; clients on any
  host meet there.

A file lock would not do for a server: writers on two hosts have two lock files. Writers of one store must
reach it the same way (all through the server, as docs/team-setup.md sets up, or all with database credentials).
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

import sqlalchemy
from filelock import FileLock, Timeout

from registry.clock import SYSTEM_CLOCK, Clock
from registry.connection import RegistryError
from registry.store import Registry, RegistryLock

LOCK_TIMEOUT_S = 60.0
NAME = "audit-chain"


class ChainLock(Protocol):
    """Held while one entry is appended; `acquire` raises RegistryError naming the lock after `timeout_s`."""

    def acquire(self, timeout_s: float) -> None: ...

    def release(self) -> None: ...


class FileChainLock:
    """A lock file beside a SQLite store."""

    def __init__(self, registry: Registry):
        self.file = FileLock(str(registry.lock_path(NAME)))

    def acquire(self, timeout_s: float) -> None:
        try:
            self.file.acquire(timeout=timeout_s)
        except Timeout:
            raise RegistryError(
                f"the audit trail is locked by another writer ({self.file.lock_file}) for more than {timeout_s:g} s"
            ) from None

    def release(self) -> None:
        self.file.release()


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for pg_advisory_lock (the same on every host and Python)."""
    return int.from_bytes(hashlib.sha256(f"unmask:{name}".encode()).digest()[:8], "big", signed=True)


class AdvisoryChainLock:
    """A PostgreSQL session advisory lock on the store's own database, on a connection of its own."""

    def __init__(self, registry: Registry, clock: Clock = SYSTEM_CLOCK):
        self.uri, self.key = registry.tracking_uri, advisory_key(NAME)
        self.clock = clock
        self.connection: sqlalchemy.Connection | None = None

    def acquire(self, timeout_s: float) -> None:
        engine = sqlalchemy.create_engine(self.uri, poolclass=sqlalchemy.pool.NullPool)
        connection = engine.connect()
        deadline = self.clock.monotonic() + timeout_s
        while not connection.execute(sqlalchemy.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar():
            if self.clock.monotonic() >= deadline:
                connection.close()
                raise RegistryError(
                    f"the audit trail is locked by another writer (PostgreSQL advisory lock "
                    f"{self.key}) for more than {timeout_s:g} s"
                )
            self.clock.sleep(0.05)
        connection.commit()  # the lock is the session's, not the transaction's
        self.connection = connection

    def release(self) -> None:
        if self.connection is None:
            return
        try:
            self.connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            self.connection.commit()
        finally:
            self.connection.close()  # closing the session releases it anyway
            self.connection = None


class ServerChainLock:
    """A registry lock through the tracking server (registry.store.RegistryLock): a compare-and-set on a name.
    A holder that died is broken after `stale_after_s`, far longer than an append takes."""

    def __init__(self, registry: Registry, stale_after_s: float = 30.0):
        self.lock = RegistryLock(
            registry,
            NAME,
            owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}",
            stale_after_s=stale_after_s,
        )

    def acquire(self, timeout_s: float) -> None:
        if not self.lock.acquire(timeout_s):
            raise RegistryError(
                f"the audit trail is locked by another writer (registry lock {self.lock.name}) "
                f"for more than {timeout_s:g} s"
            )

    def release(self) -> None:
        self.lock.release()


LOCKS: dict[str, Callable[[Registry], ChainLock]] = {
    "sqlite": FileChainLock,
    "postgresql": AdvisoryChainLock,
    "http": ServerChainLock,
    "https": ServerChainLock,
}


def lock_kind(tracking_uri: str) -> Callable[[Registry], ChainLock]:
    """The lock class for a store (see the table above); other SQL stores use the registry lock."""
    return LOCKS.get(tracking_uri.split(":", 1)[0].split("+", 1)[0], ServerChainLock)


def chain_lock_for(registry: Registry) -> ChainLock:
    """The lock every writer of this store shares."""
    return lock_kind(registry.tracking_uri)(registry)


@contextmanager
def chain_locked(registry: Registry, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[ChainLock]:
    """`with chain_locked(registry):` the chain's lock, held for one append."""
    lock = chain_lock_for(registry)
    lock.acquire(timeout_s)
    try:
        yield lock
    finally:
        lock.release()
