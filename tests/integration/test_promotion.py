"""Promotion and rollback: refusals with every reason, approved moves, audit, the race, and a crash half-way."""

from __future__ import annotations

import socket
import threading

import pytest

import registry.approvals as approvals
import registry.promotion as promotion
import registry.read as read
from registry import PromotionRefused, approve, promote, recover, register_evidence, rollback, stage_holder
from registry.identity import os_account
from registry.state import version_state
from tests.support.gate_fixtures import (
    OK,
    act_as,
    approve_as,
    evidence,
    fast_llada,
    fresh_registry,
    record,
    register_pair,
    sign_all,
)

# past poc only acts signed by listed keys count: the bundled roles with the people's keys listed
pytestmark = pytest.mark.usefixtures("team_keys")


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


def test_unapproved_promotion_is_refused_with_every_reason(reg):
    _, v = register_pair(reg)
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "poc", registry=reg)
    reasons = "\n".join(e.value.reasons)
    assert "gate tooling_maturity failed" in reasons
    assert "checklist poc/fallback-plan: needs a sign-off" in reasons
    assert "no approval recorded for poc" in reasons
    assert stage_holder(reg, "poc") is None and "poc" not in reg.aliases_of("tiny-llada")
    refused = read.audit_events(event="promotion_refused", registry=reg)
    assert len(refused) == 1 and "no approval recorded" in refused["comment"][0]


def test_failing_gates_refuse_even_with_approval_and_complete_checklist(reg):
    _, v = register_pair(reg, evidence(tier="restricted"))
    sign_all(reg, "tiny-llada", v, "poc")
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert e.value.reasons[0].startswith("gate license failed: license LicenseRef-custom is tier 'restricted'")
    assert "checklist poc/license-tier: gate license failed" in e.value.reasons[1]
    assert stage_holder(reg, "poc") is None


def test_unvalidated_records_refuse_promotion(reg):
    _, v = register_pair(reg, evidence(records=[record(valid=None), record(task="sort", valid=None)]))
    sign_all(reg, "tiny-llada", v, "poc")
    with pytest.raises(PromotionRefused, match="gates use validated records only"):
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)


def test_approved_promotion_moves_the_alias_and_is_audited(reg):
    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    move = promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert move.to_holder == ("tiny-llada", v) and move.from_holder is None
    assert reg.aliases_of("tiny-llada") == {"candidate": v, "poc": v}
    tags = reg.version_tags("tiny-llada", v)
    approval = approvals.approval_of(reg, "tiny-llada", v, "poc")
    assert (approval.by, approval.comment, approval.status) == ("grace", OK, "consumed") and approval.at
    assert approval.host and approval.closed_by == move.audit_run_id
    assert "unmask.reached.poc" in tags and tags["unmask.gates.poc"] == "passed"
    events = read.audit_events(stage="poc", registry=reg)
    assert list(events["event"]) == [
        "signoff",
        "signoff",
        "signoff",  # fallback-plan, tooling-maturity and license-review (Apache-2.0 needs none; sign_all signs it)
        "approval",
        "decision_changed",  # judged for the first time, under the promotion's lock: adopt
        "alias_move",  # with the request it opened and the approval it consumed: one entry
    ]
    assert (events.iloc[-2]["evidence"]["before"], events.iloc[-2]["evidence"]["verdict"]) == ("", "adopt")
    last = events.iloc[-1]
    mover = os_account()  # the identity requests and moves; grace approved in the same call
    assert (last["who"], last["from"], last["to"], last["status"]) == (mover, "", "tiny-llada@1", "FINISHED")
    assert [a["by"] for a in last["evidence"]["approvals"]] == ["grace"]
    assert last["evidence"]["request"]["by"] == mover and last["evidence"]["request"]["id"] == approval.request
    request = version_state(reg, "tiny-llada", v).requests("poc")[-1]
    assert (request.status, request.closed_by, request.consumed) == ("done", move.audit_run_id, approval.id)
    assert last["evidence"]["actor"]["host"] == socket.gethostname()
    assert last["evidence"]["gates"]["quality"] == evidence().records[0].record_id
    assert len(last["evidence"]["run_ids"]) == 2
    with pytest.raises(PromotionRefused, match="already holds poc"):
        promote("tiny-llada", "poc", registry=reg)


def test_stages_go_in_order_and_production_needs_the_fast_config(reg):
    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc", "staging", "production")
    with pytest.raises(PromotionRefused, match="requires the version to have reached poc first"):
        promote("tiny-llada", "staging", registry=reg)
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    approve_as(reg, "tiny-llada", v, "staging", OK, "grace")  # signed with her listed key
    promote("tiny-llada", "staging", registry=reg)
    approve_as(reg, "tiny-llada", v, "production", OK, "grace")
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "production", registry=reg)
    assert [r for r in e.value.reasons if r.startswith("gate")] == [
        "gate speedup failed: speedup over fallback 0.500x on p95 "
        "(95% CI 0.500-0.500x, paired: 3 rounds x 8 items) < 1x"
    ]
    # re-evaluated with parallel decoding (same weights, so the same version): production passes
    assert register_evidence(reg, fast_llada())[0] == v
    sign_all(reg, "tiny-llada", v, "production")  # the sign-offs vouched for the slow evidence
    approve_as(reg, "tiny-llada", v, "production", OK, "grace", "linus")  # two approvers, two listed keys
    move = promote("tiny-llada", "production", registry=reg)
    assert move.to_holder == ("tiny-llada", v)
    assert read.aliases(reg)["production"] == {"model": "tiny-llada", "version": v}


def _to_production(reg, candidate=None):
    """Put tiny-llada (or `candidate`) through poc, staging and production."""
    v = register_evidence(reg, candidate or fast_llada())[0]
    sign_all(reg, "tiny-llada", v, "poc", "staging", "production")
    for stage in ("poc", "staging", "production"):  # four eyes: approvers with listed keys of their own
        approve_as(reg, "tiny-llada", v, stage, OK, *(("grace", "linus") if stage == "production" else ("grace",)))
        promote("tiny-llada", stage, version=v, registry=reg)
    return v


def test_rollback_returns_to_the_previous_version_then_to_the_fallback(reg):
    register_evidence(reg, evidence("tiny-ar"))
    v1 = _to_production(reg)
    weights = "e" * 64
    newer = fast_llada()
    newer = type(newer)(
        **{
            **newer.__dict__,
            "weights_sha256": weights,
            "model_revision": "v2",
            "records": [type(r)(**{**r.__dict__, "weights_sha256": weights}) for r in newer.records],
            "serving": [type(r)(**{**r.__dict__, "weights_sha256": weights}) for r in newer.serving],
        }
    )
    v2 = _to_production(reg, newer)
    assert stage_holder(reg, "production") == ("tiny-llada", v2)
    back = rollback("production", who="oncall", comment="p95 regression in prod", registry=reg)
    assert (back.from_holder, back.to_holder) == (("tiny-llada", v2), ("tiny-llada", v1))
    again = rollback("production", who="oncall", registry=reg)
    assert again.to_holder == ("tiny-ar", "1") and again.evidence == {
        "kind": "rollback",
        "target": "fallback",
        "actor": {"by": "oncall", "host": socket.gethostname(), "identity": "named-by-caller", "account": os_account()},
    }
    assert "production" not in reg.aliases_of("tiny-llada")
    assert reg.aliases_of("tiny-ar") == {"fallback": "1", "production": "1"}
    moves = read.audit_events(stage="production", event="alias_move", registry=reg)
    assert list(moves["to"])[-2:] == [f"tiny-llada@{v1}", "tiny-ar@1"]
    assert list(moves["who"])[-2:] == ["oncall", "oncall"]
    with pytest.raises(PromotionRefused, match="no previous holder and no `fallback` version other than tiny-ar@1"):
        rollback("production", who="oncall", registry=reg)


def test_rollback_of_an_empty_stage_is_refused(reg):
    with pytest.raises(PromotionRefused, match="nobody holds staging"):
        rollback("staging", who="oncall", registry=reg)


def test_two_promotions_racing_for_one_alias_exactly_one_wins(reg, monkeypatch):
    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    both_judged = threading.Barrier(2, timeout=60)
    real_judge = promotion.judge

    def judge_then_wait(*args, **kwargs):  # make the two promotions overlap: both judge before either moves
        decision = real_judge(*args, **kwargs)
        both_judged.wait()
        return decision

    monkeypatch.setattr(promotion, "judge", judge_then_wait)
    outcomes: dict[str, object] = {}

    def attempt(name):
        try:
            outcomes[name] = promote(
                "tiny-llada", "poc", approver=name, comment=OK, registry=type(reg)(reg.tracking_uri)
            )
        except PromotionRefused as e:
            outcomes[name] = e

    threads = [threading.Thread(target=attempt, args=(n,)) for n in ("grace", "linus")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wins = [n for n, o in outcomes.items() if isinstance(o, promotion.Move)]
    losses = [o for o in outcomes.values() if isinstance(o, PromotionRefused)]
    assert len(wins) == 1 and len(losses) == 1, outcomes
    assert "poc moved from nobody to tiny-llada@1 while this promotion was being judged" in losses[0].reasons[0]
    moves = read.audit_events(stage="poc", event="alias_move", registry=reg)
    assert len(moves) == 1 and [a["by"] for a in moves["evidence"][0]["approvals"]] == wins[0:1]  # the one it used
    status = {a.by: a.status for a in approvals.approvals_of(reg, "tiny-llada", v, "poc")}
    assert status == {wins[0]: "consumed", ({"grace", "linus"} - set(wins)).pop(): "void"}  # the loser's is not left


class Crash(BaseException):
    """Stands for the process dying (kill -9, power loss) at one point of a move."""


def _ready_for_poc(reg):
    register_pair(reg)
    register_evidence(reg, evidence("tiny-ar"))
    sign_all(reg, "tiny-llada", "1", "poc")
    sign_all(reg, "tiny-ar", "1", "poc")
    promote("tiny-ar", "poc", approver="grace", comment=OK, registry=reg)  # the AR model holds poc first


def test_a_crash_before_the_commit_point_leaves_the_registry_as_before(reg, monkeypatch):
    _ready_for_poc(reg)

    def crash(*args, **kwargs):
        raise Crash()

    with monkeypatch.context() as patched, pytest.raises(Crash):  # only the crash undone: the state folder stays
        patched.setattr(reg.client, "set_registered_model_alias", crash)
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert stage_holder(reg, "poc") == ("tiny-ar", "1")
    assert read.aliases(reg)["poc"] == {"model": "tiny-ar", "version": "1"}
    settled = recover(reg, "poc")
    assert [s["status"] for s in settled] == ["FAILED"]
    assert reg.holders("poc") == [("tiny-ar", "1")]
    assert read.audit_events(stage="poc", event="alias_move", registry=reg)["status"].tolist() == ["FINISHED", "FAILED"]


def test_a_crash_after_the_commit_point_leaves_the_registry_as_after(reg, monkeypatch):
    _ready_for_poc(reg)

    def crash(*args, **kwargs):
        raise Crash()

    with monkeypatch.context() as patched, pytest.raises(Crash):  # only the crash undone: the state folder stays
        patched.setattr(promotion, "_remove_alias", crash)  # dies before taking poc off tiny-ar
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert sorted(reg.holders("poc")) == [("tiny-ar", "1"), ("tiny-llada", "1")]  # raw state, mid-move
    assert stage_holder(reg, "poc") == ("tiny-llada", "1")  # what every reader sees: after
    # the next alias operation settles it first (here a rollback, which then moves poc back)
    move = rollback("poc", who="oncall", registry=reg)
    assert move.from_holder == ("tiny-llada", "1") and move.to_holder == ("tiny-ar", "1")
    assert reg.holders("poc") == [("tiny-ar", "1")]
    statuses = read.audit_events(stage="poc", event="alias_move", registry=reg)["status"].tolist()
    assert statuses == ["FINISHED", "FINISHED", "FINISHED"]


def registered_cli(reg, monkeypatch):
    """The gates and promote commands over `reg` holding the registered pair, at a wide terminal."""
    import typer

    from flows.commands import gates as gates_cmd
    from flows.commands import promote as promote_cmd

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("COLUMNS", "200")
    register_pair(reg)
    app = typer.Typer()
    gates_cmd.register(app)
    promote_cmd.register(app)
    return app


def test_cli_gates_promote_sign_off_rollback_and_audit(reg, monkeypatch):
    from typer.testing import CliRunner

    app = registered_cli(reg, monkeypatch)
    run = CliRunner().invoke

    shown = run(app, ["gates", "tiny-llada", "--stage", "poc"])
    assert shown.exit_code == 1, shown.output  # the exit code is the decision: blocked
    assert "tiny-llada v1 -> poc: blocked (10/11 gates passed)" in shown.output
    assert "decision: tiny-llada v1 -> poc: blocked (" in shown.output
    # under the table: what else stands in the way; the failed gate is a row already, not a line again
    assert "- no approval recorded for poc" in shown.output and "gate tooling_maturity failed" not in shown.output
    act_as("grace")  # her keys folder says who she is on the embedded store
    refused = run(app, ["promote", "tiny-llada", "--to", "poc", "--approver", "grace", "--comment", OK])
    assert refused.exit_code == 1 and "checklist poc/fallback-plan: needs a sign-off" in refused.output
    impostor = run(
        app, ["sign-off", "tiny-llada", "--stage", "poc", "--item", "fallback-plan", "--by", "ada", "--comment", "ok"]
    )  # grace typing another name
    assert impostor.exit_code == 2 and "--by 'ada' is not you: you are 'grace'" in impostor.output
    act_as("ada")
    for item in ("fallback-plan", "tooling-maturity"):
        signed = run(app, ["sign-off", "tiny-llada", "--stage", "poc", "--item", item, "--comment", "ok"])
        assert signed.exit_code == 0 and "signed off for tiny-llada v1 by ada" in signed.output, signed.output
    act_as("grace")
    moved = run(app, ["promote", "tiny-llada", "--to", "poc", "--approver", "grace", "--comment", OK])
    assert moved.exit_code == 0 and "poc now points at tiny-llada v1 (was nobody)" in moved.output
    assert "requested by grace, approved by grace" in moved.output  # poc allows self-approval (gates/roles.yaml)
    act_as("oncall")
    back = run(app, ["rollback", "--stage", "poc", "--by", "oncall"])
    assert back.exit_code == 0 and "rolled back from tiny-llada@1 to tiny-ar@1 (fallback)" in back.output
    refused_claims = read.audit_events(event="identity_refused", registry=reg)
    assert list(refused_claims["who"]) == ["grace"] and "'ada'" in refused_claims["comment"][0]
    assert list(read.audit_events(event="emergency_rollback", registry=reg)["who"]) == ["oncall"]
    trail = run(app, ["audit", "--stage", "poc"])
    assert trail.exit_code == 0 and "alias_move" in trail.output and "oncall" in trail.output
    bad = run(app, ["gates", "tiny-llada", "--stage", "canary"])
    assert bad.exit_code == 2 and "--stage must be one of" in bad.output


def test_approvals_and_sign_offs_older_than_the_latest_evaluation_are_stale(reg):
    from checklists import load_checklist

    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    approve(reg, "tiny-llada", v, "poc", "grace", OK)
    assert read.scores("poc", registry=reg)["ranking"]["candidate"].tolist().count("tiny-llada") == 1
    register_evidence(reg, evidence())  # re-evaluated after the approval and the sign-offs
    manual = load_checklist("poc").manual_items()
    with pytest.raises(PromotionRefused, match="predates the latest evaluation") as e:
        promote("tiny-llada", "poc", registry=reg)
    reasons = e.value.reasons
    assert not any("no approval recorded" in r for r in reasons)
    assert any(r.startswith("the approval by grace") and r.endswith("approve again") for r in reasons)
    for item in manual:  # each stale sign-off is named, and its gate or checklist item is open again
        assert any(
            r.startswith(f"the sign-off of {item!r} by ada") and r.endswith("sign it off again") for r in reasons
        )
    assert (
        "gate tooling_maturity failed: checklist item 'tooling-maturity' (tooling maturity) has no sign-off" in reasons
    )
    status = read.version_status("tiny-llada", v, registry=reg)
    assert status["approvals"]["poc"]["stale"] and all(s["stale"] for s in status["signoffs"]["poc"].values())
    ranking = read.scores("poc", registry=reg)["ranking"].set_index("candidate")
    # ranked on its evidence still, but not promotable: its stale tooling sign-off is open again
    assert ranking.loc["tiny-llada", "open_signoffs"] == "tooling_maturity"

    approve(reg, "tiny-llada", v, "poc", "grace", OK)  # a new approval alone is not enough
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "poc", registry=reg)
    assert all(r.startswith("the sign-off of") or "sign-off" in r for r in e.value.reasons)
    assert not any("approval" in r for r in e.value.reasons)
    sign_all(reg, "tiny-llada", v, "poc")
    status = read.version_status("tiny-llada", v, registry=reg)
    assert not status["approvals"]["poc"]["stale"] and not any(s["stale"] for s in status["signoffs"]["poc"].values())
    move = promote("tiny-llada", "poc", registry=reg)
    assert [a["by"] for a in move.evidence["approvals"]] == ["grace"]


def test_each_reason_has_a_kind_and_an_approver_settles_only_the_approval_kind():
    from gates import load_policy
    from gates.decision import decide as judge
    from gates.promotion import Approval, PromotionReason, ReasonKind
    from gates.roles import ROLES_PATH, load_roles
    from tests.support.gate_fixtures import signoffs

    base = {"fallback": evidence("tiny-ar"), "production": None}
    signed = signoffs("fallback-plan", "tooling-maturity")  # at 2026-11-30T11:00:00Z
    approval = Approval("poc", "grace", "2026-11-30T11:30:00Z", OK)
    bundled = load_roles(ROLES_PATH)  # no keys listed: poc counts unsigned acts

    def decide(evaluated_at):
        return judge(
            evidence(), load_policy(), "poc", base, signed, approval, set(), evaluated_at=evaluated_at, roles=bundled
        )

    assert decide("2026-11-30T10:30:00Z").allowed
    later = decide("2026-11-30T12:00:00Z")  # re-evaluated after the sign-offs and the approval
    by_kind = {kind: [r.text for r in later.reasons if r.kind is kind] for kind in ReasonKind}
    assert by_kind[ReasonKind.APPROVAL] == [
        "the approval by grace at 2026-11-30T11:30:00Z predates the latest "
        "evaluation (2026-11-30T12:00:00Z); approve again"
    ]
    assert len(by_kind[ReasonKind.SIGN_OFF]) == 2 and by_kind[ReasonKind.GATE] == [
        "gate tooling_maturity failed: checklist item 'tooling-maturity' (tooling maturity) has no sign-off"
    ]
    assert by_kind[ReasonKind.CHECKLIST] and not by_kind[ReasonKind.STAGE]
    assert [r.kind for r in later.reasons if not r.blocking] == [ReasonKind.APPROVAL]
    # the kind decides, whatever the words say
    assert PromotionReason(ReasonKind.CHECKLIST, "no approval recorded for poc").blocking
    assert not PromotionReason(ReasonKind.APPROVAL, "gate quality failed").blocking


def test_the_promote_flow_waits_for_a_new_approval_when_the_recorded_one_predates_the_evidence(reg):
    from flows.promote import check_promotion

    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    approve(reg, "tiny-llada", v, "poc", "grace", OK)
    check = check_promotion.fn("tiny-llada", "poc", v, reg.tracking_uri)
    assert (check["version"], check["blocking"], check["approved_by"]) == (v, [], "grace")
    register_evidence(reg, evidence())  # re-evaluated: the approval and the sign-offs no longer count
    sign_all(reg, "tiny-llada", v, "poc")
    check = check_promotion.fn("tiny-llada", "poc", v, reg.tracking_uri)
    assert check["blocking"] == [] and check["approved_by"] is None  # an approver can settle it: wait for one


def test_a_promotion_that_cannot_get_the_stage_lock_is_refused(reg):
    from filelock import FileLock

    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    with FileLock(str(reg.lock_path("poc"))):  # another process's promotion of poc, in flight
        with pytest.raises(PromotionRefused, match="another promotion or rollback of poc holds"):
            promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg, lock_timeout_s=0.2)
    assert stage_holder(reg, "poc") is None
    assert approvals.approval_of(reg, "tiny-llada", v, "poc").status == "void"  # typed into a refused promote
    with pytest.raises(PromotionRefused, match="is void"):
        promote("tiny-llada", "poc", registry=reg)
    assert promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg).to_holder == ("tiny-llada", v)


def test_the_registry_lock_excludes_other_hosts_and_a_stale_one_is_broken(reg):
    from registry.store import RegistryLock

    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    other_host = RegistryLock(reg, "poc", owner="build-02:4242:x")
    assert other_host.acquire(timeout_s=1)
    with pytest.raises(PromotionRefused, match=r"registry lock unmask-lock.poc \(build-02:4242:x\)"):
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg, lock_timeout_s=0.3)
    assert "unmask-lock.poc" not in reg.model_names()  # never listed as a candidate
    reg.client.set_registered_model_tag("unmask-lock.poc", "unmask.lock.at", "0")  # its holder died long ago
    assert promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg).to_holder == ("tiny-llada", v)
    assert RegistryLock(reg, "poc", owner="me").holder() is None  # released after the move


@pytest.mark.parametrize(
    "args, why",
    [
        (["audit", "--model", "x' or '1'='1"], "cannot be searched for in the registry"),
        (["audit", "--stage", 'poc" or "1"="1'], "expected one of candidate, poc"),  # refused before any query
        (["gates", "x' or '1'='1"], "no registered model"),
    ],
)
def test_a_name_that_would_rewrite_a_registry_query_is_refused_by_name(reg, monkeypatch, args, why):
    from typer.testing import CliRunner

    result = CliRunner().invoke(registered_cli(reg, monkeypatch), args)
    assert result.exit_code == 2, result.output
    assert why in result.output and args[-1] in result.output  # one line naming the value
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
