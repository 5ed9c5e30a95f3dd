"""The same registry against a real `mlflow server` on 127.0.0.1, started and stopped by this test."""

from __future__ import annotations

from pathlib import Path

import pytest

import registry.read as read
from registry import (
    Registry,
    RegistryError,
    RegistryUnavailable,
    load_evidence,
    promote,
    rollback,
    sign_off,
    stage_holder,
)
from tests.support.gate_fixtures import register_pair
from tests.support.postgres_fixtures import backend_store
from tests.support.servers import launch_mlflow_server, stop_group


@pytest.fixture(scope="module", autouse=True)
def _team_key(team_signing_key):
    """The module's servers and stores sign with the team's key (tests/support/servers.py) from their first entry."""


SERVED_FROM: dict[str, tuple[Path, str]] = {}  # a server's url -> (its folder, its backend store)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request, tmp_path_factory):
    folder: Path = tmp_path_factory.mktemp("mlflow_server")
    store = backend_store(request, folder, "mlflow")
    url, proc = launch_mlflow_server(folder, store)
    SERVED_FROM[url] = folder, store
    try:
        yield url, proc
    finally:
        stop_group(proc)


def test_register_promote_rollback_and_audit_through_a_server(server, monkeypatch):
    url, proc = server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    reg = Registry()
    assert reg.tracking_uri == url
    _, v = register_pair(reg)
    assert reg.client.get_model_version("tiny-llada", v).source.startswith("mlflow-artifacts:")
    assert len(load_evidence(reg, "tiny-llada", v).records) == 2
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", v, "poc", item, "ada", f"{item} checked")
    promote("tiny-llada", "poc", approver="grace", comment="PoC evidence reviewed", registry=reg)
    assert stage_holder(reg, "poc") == ("tiny-llada", v)
    rollback("poc", who="oncall", registry=reg)
    assert read.aliases(reg)["poc"] == {"model": "tiny-ar", "version": "1"}
    moves = read.audit_events(event="alias_move", registry=reg)
    assert list(moves["to"]) == ["tiny-llada@1", "tiny-ar@1"] and set(moves["status"]) == {"FINISHED"}
    assert len(read.gate_results("tiny-llada", registry=reg)) == 11


def test_two_hosts_racing_through_the_server_exactly_one_wins(server, monkeypatch, tmp_path):
    """Two promoters with separate state folders (so no shared lock file): the registry lock decides."""
    import threading

    import registry.promotion as promotion
    from registry import PromotionRefused

    url, _ = server
    reg = Registry(url)
    if "tiny-llada" not in reg.model_names():
        register_pair(reg)
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", "1", "poc", item, "ada", f"{item} checked")
    before = stage_holder(reg, "poc")
    if before == ("tiny-llada", "1"):
        rollback("poc", who="oncall", registry=reg)
        before = stage_holder(reg, "poc")
    both_judged = threading.Barrier(2, timeout=120)
    real_judge = promotion.judge

    def judge_then_wait(*args, **kwargs):
        decision = real_judge(*args, **kwargs)
        both_judged.wait()
        return decision

    monkeypatch.setattr(promotion, "judge", judge_then_wait)
    homes = {name: tmp_path / name for name in ("host-a", "host-b")}
    real_lock_path = Registry.lock_path
    monkeypatch.setattr(
        Registry,
        "lock_path",
        lambda self, alias: homes[threading.current_thread().name] / real_lock_path(self, alias).name,
    )
    outcomes = {}

    def attempt(name):
        homes[name].mkdir()
        try:
            outcomes[name] = promote(
                "tiny-llada", "poc", approver=name, comment="PoC evidence reviewed", registry=Registry(url)
            )
        except PromotionRefused as e:
            outcomes[name] = e

    threads = [threading.Thread(target=attempt, args=(n,), name=n) for n in homes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    refused = [o for o in outcomes.values() if isinstance(o, PromotionRefused)]
    assert len(outcomes) == 2 and len(refused) == 1, outcomes
    was = "@".join(before) if before else "nobody"
    assert f"poc moved from {was} to tiny-llada@1 while this promotion was being judged" in refused[0].reasons[0]
    assert stage_holder(reg, "poc") == ("tiny-llada", "1")


def test_two_hosts_appending_through_the_server_keep_one_audit_chain(server, monkeypatch, tmp_path):
    """Separate state folders (no shared lock file): the registry lock alone serialises the appends."""
    import threading

    from registry import audit
    from registry.audit import AuditEvent

    url, _ = server
    homes = {name: tmp_path / name for name in ("host-a", "host-b")}
    real_lock_path = Registry.lock_path
    monkeypatch.setattr(
        Registry,
        "lock_path",
        lambda self, alias: homes[threading.current_thread().name] / real_lock_path(self, alias).name,
    )

    def writer(name):
        homes[name].mkdir()
        own = Registry(url)
        for i in range(5):
            audit.append(own, AuditEvent("approval", name, "", "poc", "m", "1", comment=f"{name} {i}"))

    before = audit.verify(Registry(url)).head_seq
    threads = [threading.Thread(target=writer, args=(n,), name=n) for n in homes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    report = audit.verify(Registry(url))
    assert report.status == "intact" and report.head_seq == before + 10, report.summary()
    assert report.chained == report.entries  # every event this server ever recorded is in the chain
    locks = [m.name for m in Registry(url).client.search_registered_models() if m.name.startswith("unmask-lock.")]
    assert "unmask-lock.audit-chain" not in locks  # released


def test_a_server_without_authentication_yields_no_mlflow_identity(server, monkeypatch):
    """MLFLOW_TRACKING_USERNAME against a server that checks nothing is a typed name: the identity stays the OS
    account, and an approval or a move records `os-user` / `named-by-caller`, never `mlflow-basic-auth`."""
    from registry import approve, current_actor
    from registry.identity import OS_USER, os_account, server_authenticated

    url, _ = server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "grace")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "anything")
    assert not server_authenticated(url, "grace", "anything")  # no users/current there: nobody was authenticated
    actor = current_actor(url)
    assert (actor.name, actor.source, actor.account) == (os_account(), OS_USER, os_account())
    reg = Registry(url)
    if "tiny-llada" not in reg.model_names():
        register_pair(reg)
    approval = approve(reg, "tiny-llada", "1", "poc", None, "PoC evidence reviewed on a server without auth")
    assert (approval.by, approval.identity) == (os_account(), OS_USER)
    recorded = read.audit_events(event="approval", registry=reg).iloc[-1]["evidence"]["actor"]
    assert recorded["identity"] == OS_USER and recorded["by"] == os_account()


def test_a_stopped_server_is_unreachable(server):  # it stops the module's server
    url, proc = server
    stop_group(proc)
    with pytest.raises(RegistryUnavailable, match="unreachable"):
        Registry(url)


def test_the_store_file_reads_the_evidence_the_server_served_once_it_has_stopped(server):
    """Item 51.15: read from the store file (as the walk-through's dashboard reads it), a run the server logged
    keeps `mlflow-artifacts:/...`, which MLflow resolves only through a server: every page that read an artifact
    said "The registry cannot be read as it stands". Its files are read from the artifacts folder beside the store."""
    url, _ = server
    folder, store = SERVED_FROM[url]
    reg = Registry(store)
    if not store.startswith("sqlite"):  # a database has no folder beside it: only the server knows where they are
        with pytest.raises(RegistryError, match="mlflow-artifacts URI was supplied"):
            load_evidence(reg, "tiny-llada", "1")
        return
    assert reg.client.get_model_version("tiny-llada", "1").source.startswith("mlflow-artifacts:")
    assert len(load_evidence(reg, "tiny-llada", "1").records) == 2
    moved = folder / "artifacts-elsewhere"
    (folder / "artifacts").rename(moved)  # a server that kept them elsewhere: named, with the way to read them
    try:
        with pytest.raises(RegistryError, match=r"keeps its artifacts on an mlflow server .*--artifacts-destination"):
            load_evidence(Registry(store), "tiny-llada", "1")
    finally:
        moved.rename(folder / "artifacts")
