"""The audit chain's lock (registry/chain_lock.py), one contract for each kind: one holder at a time, a second
writer is refused after its timeout with the lock named, and gets it once the first lets go."""

from __future__ import annotations

import pytest

from registry import Registry
from registry.chain_lock import AdvisoryChainLock, FileChainLock, ServerChainLock, chain_lock_for, lock_kind
from registry.connection import RegistryError
from tests.support.gate_fixtures import fresh_registry
from tests.support.postgres_fixtures import database_name

KINDS = [
    pytest.param(FileChainLock, id="file"),
    pytest.param(ServerChainLock, id="registry-cas"),
    pytest.param(AdvisoryChainLock, id="postgres-advisory"),
]


@pytest.fixture(params=KINDS)
def lock_of(request, tmp_path):
    """(make a lock of this kind on the store, what its refusal names); the registry lock's compare-and-set is
    the MLflow store's, so a SQLite store shows it as a server does."""
    kind = request.param
    if kind is AdvisoryChainLock:
        registry = Registry(request.getfixturevalue("postgres").create_database(database_name("chainlock")))
    else:
        registry = fresh_registry(tmp_path)
    named = {
        FileChainLock: "audit-chain.lock",
        ServerChainLock: "registry lock unmask-lock.audit-chain",
        AdvisoryChainLock: "PostgreSQL advisory lock",
    }[kind]
    return (lambda: kind(Registry(registry.tracking_uri))), named


def test_one_writer_at_a_time_and_the_next_gets_it_after_release(lock_of):
    make, named = lock_of
    first, second = make(), make()
    first.acquire(2.0)
    with pytest.raises(RegistryError, match=f"locked by another writer \\(.*{named}.*more than 0.3 s"):
        second.acquire(0.3)
    first.release()
    second.acquire(2.0)
    with pytest.raises(RegistryError, match="locked by another writer"):
        first.acquire(0.2)
    second.release()
    first.acquire(2.0)
    first.release()


def test_each_store_gets_the_lock_its_writers_share(tmp_path):
    assert lock_kind("sqlite:////tmp/x/mlflow.db") is FileChainLock
    assert lock_kind("postgresql://u@db:5432/mlflow") is lock_kind("postgresql+psycopg://u@db/m") is AdvisoryChainLock
    assert lock_kind("http://mlflow.team:5000") is lock_kind("https://mlflow.team") is ServerChainLock
    assert lock_kind("mysql://u@db/mlflow") is ServerChainLock  # no advisory lock of ours: the registry's CAS
    assert isinstance(chain_lock_for(fresh_registry(tmp_path)), FileChainLock)
