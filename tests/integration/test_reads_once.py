"""One read of the store per question (issue #46, item 3): a promotion reads its context once, and once more under
the stage lock, counted on the MLflow client; the snapshot (`Registry.reading`, `registry.snapshot.ReadOnce`)
answers a repeated read without a call, reads back the action's own writes, forgets what a write can change, and
is one thread's alone; the audit trail filtered from a snapshot says what the store's own filters say."""

from __future__ import annotations

import threading

import pytest
from mlflow.exceptions import MlflowException

from gates.policy import POLICY_PATH, load_policy
from registry import PromotionRefused, approve, audit, chain_lock, promote
from registry.audit import MOVE
from registry.clock import SimulatedClock
from registry.connection import AUDIT_EXPERIMENT, EVALUATIONS_EXPERIMENT
from registry.judging import judge
from registry.store import RegistryLock, model_tag
from tests.support.gate_fixtures import (
    OK,
    act_as,
    fresh_registry,
    moved_twice_and_rolled_back,
    register_pair,
    sign_all,
)
from tests.support.mlflow_calls import counting


@pytest.fixture
def judged(tmp_path, monkeypatch):
    """tiny-llada registered beside the fallback, signed off, its poc gates judged and stored (as `unmask run`
    leaves it), approved by grace."""
    reg = fresh_registry(tmp_path)
    _, version = register_pair(reg)
    sign_all(reg, "tiny-llada", version, "poc")
    act_as("grace")
    judge(reg, "tiny-llada", version, "poc")
    approve(reg, "tiny-llada", version, "poc", "grace", OK)
    return reg, version


def test_a_promotion_reads_its_context_once_and_once_more_under_the_lock(judged):
    reg, version = judged
    # the approval changed poc's decision (blocked before it, adopt with it): it was judged again and stored then
    [changed] = [
        e for e in audit.events(reg, event="decision_changed") if e.stage == "poc" and e.model == "tiny-llada"
    ][-1:]
    assert changed.evidence["before"] == "blocked" and changed.evidence["verdict"] == "adopt"
    with counting() as calls, calls.during():
        move = promote("tiny-llada", "poc", registry=reg, actor="grace")
    # the promoted version: judged on one read, read again under the lock (its own writes read back after)
    assert calls.of("get_model_version", "tiny-llada", version) == 2, calls.made
    assert calls.of("get_model_version", "tiny-ar", "1") == 1  # the fallback, the baseline judged against
    assert calls.by_method["search_registered_models"] == 2  # every alias: to judge, and under the lock
    assert calls.by_method["get_run"] == 2  # the evidence runs: the candidate's and the fallback's
    assert calls.by_method["search_experiments"] == 1  # the chain's head and whether any rollout was recorded
    assert calls.by_method["search_runs"] == 3  # the trail, the serving records; the trail under the lock
    # judged again to the decision the approval stored: nothing of the gate report is written again
    assert not [a for name, a in calls.made if name == "set_model_version_tag" and ".gates.poc" in str(a[2])]
    assert not calls.by_method["log_text"]
    # one audit entry (the move, holding the request it claimed and the approval it consumed), the alias, the
    # reached tag, the request done (which consumes the approval), the stage lock taken and given back
    assert calls.by_method["create_run"] == 1 and calls.of("delete_registered_model") == 1
    # 71 before the snapshot (bench/promotion_calls.py --judged); 44 with it; 20 with one entry per move (issue 46)
    assert len(calls.made) <= 20, calls.by_method
    assert [e.event for e in audit.events(reg)][-1] == "alias_move"
    assert audit.events(reg, event="alias_move")[-1].run_id == move.audit_run_id


def test_a_read_in_a_snapshot_is_asked_once_and_the_actions_own_write_reads_back(judged):
    reg, version = judged
    with counting() as calls, calls.during():
        with reg.reading():
            first = reg.version_tags("tiny-llada", version)
            reg.set_version_tags("tiny-llada", version, {model_tag("note"): "reviewed"})
            again = reg.version_tags("tiny-llada", version)
        outside = reg.version_tags("tiny-llada", version)
    assert calls.of("get_model_version", "tiny-llada", version) == 2  # once in the snapshot, once after it
    assert model_tag("note") not in first and again[model_tag("note")] == "reviewed" == outside[model_tag("note")]


def test_a_tag_that_already_holds_the_value_is_not_written_again_in_a_snapshot(judged):
    reg, version = judged
    held = reg.version_tags("tiny-llada", version)[model_tag("gates.poc")]
    with counting() as calls, calls.during():
        with reg.reading():
            reg.set_version_tags("tiny-llada", version, {model_tag("gates.poc"): held, model_tag("x"): "1"})
        reg.set_version_tags("tiny-llada", version, {model_tag("gates.poc"): held})  # outside: always written
    assert [a[2] for name, a in calls.made if name == "set_model_version_tag"] == [
        model_tag("x"),
        model_tag("gates.poc"),
    ]


def test_a_new_run_forgets_its_experiments_searches_and_no_other(judged):
    reg, _ = judged
    with counting() as calls, reg.reading():
        with calls.during():
            audit_before = list(reg.search_runs(AUDIT_EXPERIMENT))
            list(reg.search_runs(EVALUATIONS_EXPERIMENT))
            audit.append(reg, audit.AuditEvent("promotion_request", "grace", "", "poc", "tiny-llada", "1"))
            audit_after = list(reg.search_runs(AUDIT_EXPERIMENT))
            list(reg.search_runs(EVALUATIONS_EXPERIMENT))
    assert len(audit_after) == len(audit_before) + 1  # the action reads its own entry
    searched = [a[0] for name, a in calls.made if name == "search_runs" and len(a[0]) == 1]
    evidence_id = reg.experiment_id(EVALUATIONS_EXPERIMENT)
    assert searched.count([evidence_id]) == 1  # the evidence searched once: the audit entry did not touch it


def test_a_write_that_fails_forgets_everything(judged):
    reg, version = judged
    with counting() as calls, reg.reading():
        reg.version_tags("tiny-llada", version)
        with pytest.raises(MlflowException):
            reg.client.set_registered_model_alias("no-such-model", "poc", "1")
        with calls.during():
            reg.version_tags("tiny-llada", version)
    assert calls.of("get_model_version", "tiny-llada", version) == 1


def test_a_snapshot_is_one_threads_and_nested_blocks_share_it(judged):
    reg, version = judged
    seen: dict[str, bool] = {}
    with reg.reading():
        assert reg.snapshot
        with reg.reading():
            inner = reg.client
        assert reg.client is inner  # the outer snapshot, shared
        other = threading.Thread(target=lambda: seen.update(snapshot=reg.snapshot, direct=reg.client is reg.direct))
        other.start()
        other.join()
    assert seen == {"snapshot": False, "direct": True} and not reg.snapshot and reg.client is reg.direct


def test_the_trail_filtered_from_a_snapshot_is_what_the_stores_filters_give(tmp_path):
    reg = fresh_registry(tmp_path)
    moved_twice_and_rolled_back(reg)
    asks = [
        {},
        {"model": "tiny-llada"},
        {"model": "tiny-ar", "stage": "poc"},
        {"stage": "poc", "event": MOVE},
        {"event": MOVE, "status": "FINISHED"},
        {"model": "tiny-ar", "event": MOVE, "status": "FINISHED"},
        {"stage": "staging"},
        {"event": "approval"},
    ]
    stored = [audit.events(reg, **ask) for ask in asks]
    settled = audit.last_settled_move(reg, "poc")
    with reg.reading():
        assert [audit.events(reg, **ask) for ask in asks] == stored
        assert audit.last_settled_move(reg, "poc") == settled and settled is not None
        assert audit.last_settled_move(reg, "staging") is None
    assert any(stored) and stored[1] != stored[0]  # the filters select: not all alike, not all empty


def test_the_appends_of_one_action_read_the_tail_once_and_no_other_writer_comes_between(judged, monkeypatch):
    reg, _ = judged
    entry = audit.AuditEvent("promotion_request", "grace", "", "poc", "tiny-llada", "1")
    other = threading.Thread(
        target=audit.append, args=(reg, audit.AuditEvent("approval", "linus", "", "poc", "x", "1"))
    )
    asking = threading.Event()  # set when the other writer asks for the chain's lock (the lock itself unchanged)
    acquire = chain_lock.FileChainLock.acquire

    def observed(lock, timeout_s):
        if threading.current_thread() is other:
            asking.set()
        return acquire(lock, timeout_s)

    monkeypatch.setattr(chain_lock.FileChainLock, "acquire", observed)
    with counting() as calls, calls.during():
        with audit.appending(reg):
            mine = [audit.append(reg, entry)]
            other.start()  # another writer: it asks for the lock this action holds, and waits
            asking.wait(60)
            assert asking.is_set() and other.is_alive()
            mine += [audit.append(reg, entry), audit.append(reg, entry)]
        other.join()
    tail_reads = [a for name, a in calls.made if name == "search_runs" and "LIKE" in str(a[1:2])]
    assert len(tail_reads) == 2  # the action's first append read it, its next two built on what it wrote; linus read it
    assert [e.seq for e in mine] == [mine[0].seq, mine[0].seq + 1, mine[0].seq + 2]
    last = max(audit.events(reg), key=lambda e: e.seq)
    assert last.who == "linus" and last.seq == mine[-1].seq + 1  # after the action's entries, not between them
    assert audit.verify(reg).ok


def test_a_judgement_that_reaches_the_stored_report_again_writes_nothing(judged):
    reg, version = judged
    stored = reg.version_tags("tiny-llada", version)
    with counting() as calls, calls.during():
        judge(reg, "tiny-llada", version, "poc")
    assert not [name for name, _ in calls.made if name in ("log_text", "set_model_version_tag", "create_run")]
    assert reg.version_tags("tiny-llada", version)[model_tag("gates.poc.at")] == stored[model_tag("gates.poc.at")]


def test_an_approval_stores_the_decision_it_changed_under_the_stored_reports_policy_only(tmp_path, team_keys):
    reg = fresh_registry(tmp_path)
    _, version = register_pair(reg)
    sign_all(reg, "tiny-llada", version, "poc", "staging")
    kept, edited = tmp_path / "team-policy.yaml", tmp_path / "staging-policy.yaml"
    for path in (kept, edited):
        path.write_text(POLICY_PATH.read_text())
    act_as("grace")
    judge(reg, "tiny-llada", version, "poc", load_policy(kept))  # blocked: no approval yet
    judge(reg, "tiny-llada", version, "staging", load_policy(edited))
    edited.write_text(POLICY_PATH.read_text() + "\n# edited since\n")  # the staging report's policy changed
    approve(reg, "tiny-llada", version, "poc", "grace", OK)
    changed = [e for e in audit.events(reg, event="decision_changed") if e.model == "tiny-llada"]
    assert [(e.stage, e.evidence["verdict"]) for e in changed][-1] == ("poc", "adopt")  # under the same policy
    before = reg.version_tags("tiny-llada", version)[model_tag("gates.staging.sha256")]
    act_as("linus")
    approve(reg, "tiny-llada", version, "staging", "linus", OK)
    assert reg.version_tags("tiny-llada", version)[model_tag("gates.staging.sha256")] == before  # not re-judged
    assert [e.stage for e in audit.events(reg, event="decision_changed") if e.model == "tiny-llada"][-1] == "poc"


def test_a_refused_promotion_records_the_request_it_opened_and_a_moving_one_holds_it_in_its_entry(judged):
    reg, version = judged
    act_as("grace")
    with pytest.raises(PromotionRefused):
        promote("tiny-llada", "staging", registry=reg, actor="grace")  # poc not reached yet
    [asked] = [e for e in audit.events(reg, event="promotion_request") if e.stage == "staging"]
    assert asked.who == "grace" and asked.evidence["request"]["by"] == "grace"
    move = promote("tiny-llada", "poc", registry=reg, actor="grace")
    assert not [e for e in audit.events(reg, event="promotion_request") if e.stage == "poc"]
    [entry] = [e for e in audit.events(reg, event="alias_move") if e.run_id == move.audit_run_id]
    assert entry.evidence["request"]["by"] == "grace" and [a["by"] for a in entry.evidence["approvals"]] == ["grace"]


def test_the_stage_lock_is_given_back_without_a_read_unless_held_long_enough_for_another_to_break_it(judged):
    reg, _ = judged
    clock = SimulatedClock()
    brief = RegistryLock(reg, "poc", owner="me:1", clock=clock)
    assert brief.acquire(timeout_s=1)
    with counting() as calls, calls.during():
        brief.release()
    assert [name for name, _ in calls.made] == ["delete_registered_model"] and brief.holder() is None
    long = RegistryLock(reg, "poc", owner="me:2", stale_after_s=10, clock=clock)
    assert long.acquire(timeout_s=1)
    clock.advance(60)  # past the stale age: someone broke it and holds it now
    reg.client.delete_registered_model(long.name)
    assert RegistryLock(reg, "poc", owner="other:3").acquire(timeout_s=1)
    long.release()
    assert long.holder()["unmask.lock.owner"] == "other:3"  # theirs, left alone


def test_a_registry_write_is_one_call_with_no_read_of_the_whole_model_before_it(judged):
    """MLflow's client reads the whole registered model before each tag or alias write (its prompt check);
    `registry.store.Client` writes without it: the promotion's writes are the only calls they make."""
    reg, version = judged
    with counting(nested=True) as calls, calls.during():
        reg.set_version_tags("tiny-llada", version, {"unmask.test.written": "yes"})
        reg.client.set_registered_model_tag("tiny-llada", "unmask.test.written", "yes")
        reg.client.set_registered_model_alias("tiny-llada", "written", version)
        reg.client.delete_registered_model_alias("tiny-llada", "written")
    assert calls.by_method == {
        "set_model_version_tag": 1,
        "set_registered_model_tag": 1,
        "set_registered_model_alias": 1,
        "delete_registered_model_alias": 1,
    }, calls.made
    assert reg.version_tags("tiny-llada", version)["unmask.test.written"] == "yes"
    assert reg.client.get_registered_model("tiny-llada").tags["unmask.test.written"] == "yes"


def test_a_servers_poll_of_who_holds_its_names_reads_the_store_once(tmp_path):
    """`unmask serve` asks every `poll_interval_s` who holds each name it serves: the chain verified, each stage's
    settled move, each registration alias's registrations. One read each: the trail once, the aliases once."""
    from registry import Registry
    from registry.serving import holders
    from tests.support.serving_fixtures import serving_registry

    served = serving_registry(tmp_path / "served")
    reg = Registry(served.tracking_uri)
    holders(reg, ["production", "fallback", "tiny-ar"])  # the first poll also looks up the experiments' ids
    with counting() as calls, calls.during():
        held = holders(reg, ["production", "fallback", "tiny-ar"])
    assert held == {
        "production": ("tiny-llada", served.versions["tiny-llada"]),
        "fallback": ("tiny-ar", served.versions["tiny-ar"]),
        "tiny-ar": ("tiny-ar", served.versions["tiny-ar"]),
    }
    assert dict(calls.by_method) == {
        "search_experiments": 1,  # the chain's head and store identity
        "search_runs": 1,  # the trail: verified, the settled moves, the registrations
        "search_registered_models": 1,  # every alias
        "search_model_versions": 1,  # tiny-ar's versions: served by its name
    }, calls.made
