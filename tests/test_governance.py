"""Identity, roles, separation of duties and the approval lifecycle, on a real SQLite MLflow store.

Every refusal is checked three ways: its reason is named, nothing moved, and the attempt is in the audit trail.
People: eve registers the evidence, ada signs off, bob requests, grace and linus approve, olga is on call,
mallory holds no role.
"""

from __future__ import annotations

import time

import pytest
import yaml

import registry.read as read
from checklists import load_checklist
from gates.promotion import Approval, Decline, Duties, ReasonKind, decide_promotion
from gates.roles import RolesError, load_roles, parse_roles
from registry import (ApprovalRefused, PromotionRefused, approve, decline, promote, register_evidence, rollback,
                      sign_off, stage_holder)
from registry.approvals import approvals_of, open_request
from tests.gate_fixtures import evidence, fast_llada, fresh_registry, register_pair, signoffs

OK = "evidence reviewed, gates and checklist are green"
PEOPLE = ["ada", "bob", "eve", "grace", "linus", "mallory", "olga"]


def roles_data(**stage_overrides):
    stage = {"sign_off": {"*": ["architects"]}, "approve": ["approvers"], "emergency_rollback": ["oncall"]}
    data = {"users": PEOPLE, "groups": {"architects": ["ada"], "approvers": ["bob", "eve", "grace", "linus"],
                                        "oncall": ["olga"]},
            "stages": {"poc": stage | {"self_approval": True},
                       "staging": stage | {"approvals": {"count": 1, "distinct": True}},
                       "production": stage | {"approvals": {"count": 2, "distinct": True}}}}
    for stage_name, overrides in stage_overrides.items():
        data["stages"][stage_name] = data["stages"][stage_name] | overrides
    return data


@pytest.fixture
def reg(tmp_path, monkeypatch):
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump(roles_data()))
    monkeypatch.setenv("UNMASK_ROLES", str(path))
    monkeypatch.setenv("LOGNAME", "eve")  # eve runs the evaluation: the registrant is the OS user
    registry = fresh_registry(tmp_path)
    register_pair(registry, fast_llada())
    monkeypatch.setenv("LOGNAME", "bob")  # from here on the process is bob's (requests and moves)
    for stage in ("poc", "staging", "production"):
        for item in load_checklist(stage).manual_items():
            sign_off(registry, "tiny-llada", "1", stage, item, "ada", f"{item} checked for {stage}")
    return registry


def at_poc(reg):
    promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)  # poc: bob may approve his own request


def refusals(reg, event):
    return read.audit_events(event=event, registry=reg)


def test_registration_records_who_registered_the_evidence_and_from_where(reg):
    tags = reg.version_tags("tiny-llada", "1")
    assert tags["unmask.evaluated_by"] == "eve" and tags["unmask.evaluated_from"]


def test_the_registrant_cannot_approve_staging_nothing_moves_and_the_attempt_is_audited(reg):
    at_poc(reg)
    with pytest.raises(ApprovalRefused, match="eve registered the evidence of this version and cannot approve"):
        approve(reg, "tiny-llada", "1", "staging", "eve", OK)
    assert stage_holder(reg, "staging") is None
    assert [a.by for a in approvals_of(reg, "tiny-llada", "1", "staging")] == []
    refused = refusals(reg, "approval_refused")
    assert list(refused["who"]) == ["eve"] and "registered the evidence" in refused["comment"][0]


def test_the_requester_cannot_approve_their_own_request(reg):
    at_poc(reg)
    with pytest.raises(PromotionRefused, match="no approval recorded for staging"):
        promote("tiny-llada", "staging", registry=reg)  # bob asks: the request stays open for an approver
    assert open_request(reg, "tiny-llada", "1", "staging").by == "bob"
    with pytest.raises(ApprovalRefused, match=r"bob requested this promotion and cannot approve it"):
        approve(reg, "tiny-llada", "1", "staging", "bob", OK)
    with pytest.raises(PromotionRefused, match="bob requested this promotion and cannot approve it"):
        promote("tiny-llada", "staging", approver="bob", comment=OK, registry=reg)  # nor in the same call
    assert stage_holder(reg, "staging") is None
    assert list(refusals(reg, "approval_refused")["who"]) == ["bob", "bob"]
    approve(reg, "tiny-llada", "1", "staging", "grace", OK)
    move = promote("tiny-llada", "staging", registry=reg)
    assert move.to_holder == ("tiny-llada", "1") and [a["by"] for a in move.evidence["approvals"]] == ["grace"]
    assert move.evidence["request"]["by"] == "bob" and move.evidence["actor"]["by"] == "bob"


def test_an_approver_who_promotes_an_approval_they_gave_becomes_its_requester_and_is_refused(reg, monkeypatch):
    at_poc(reg)
    approve(reg, "tiny-llada", "1", "staging", "grace", OK)  # nobody asked yet: the approval opens the request
    monkeypatch.setenv("LOGNAME", "grace")
    with pytest.raises(PromotionRefused, match="grace requested this promotion and cannot approve it"):
        promote("tiny-llada", "staging", registry=reg)
    assert stage_holder(reg, "staging") is None


def test_the_tooling_maturity_signer_cannot_approve_staging(reg, monkeypatch, tmp_path):
    at_poc(reg)
    data = roles_data()
    data["groups"]["architects"] = ["ada", "linus"]
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(data))
    sign_off(reg, "tiny-llada", "1", "staging", "tooling-maturity", "linus", "ONNX export and serving reviewed")
    with pytest.raises(ApprovalRefused, match="linus signed off tooling-maturity for staging and cannot also approve"):
        approve(reg, "tiny-llada", "1", "staging", "linus", OK)
    assert stage_holder(reg, "staging") is None and "linus" in refusals(reg, "approval_refused")["who"].tolist()


def test_production_needs_two_different_approvers_and_the_same_person_twice_is_refused(reg):
    at_poc(reg)
    approve(reg, "tiny-llada", "1", "staging", "grace", OK)
    promote("tiny-llada", "staging", registry=reg)
    approve(reg, "tiny-llada", "1", "production", "grace", OK)
    with pytest.raises(ApprovalRefused, match="grace already approved this request"):
        approve(reg, "tiny-llada", "1", "production", "grace", OK + ", again")
    with pytest.raises(PromotionRefused, match="production needs 2 approvals from 2 different people; approved so "
                                               "far by grace"):
        promote("tiny-llada", "production", registry=reg)
    assert stage_holder(reg, "production") is None
    assert "already approved this request" in refusals(reg, "approval_refused")["comment"].iloc[-1]
    approve(reg, "tiny-llada", "1", "production", "linus", OK)
    move = promote("tiny-llada", "production", registry=reg)
    assert sorted(a["by"] for a in move.evidence["approvals"]) == ["grace", "linus"]
    assert {a.by: a.status for a in approvals_of(reg, "tiny-llada", "1", "production")} == {
        "grace": "consumed", "linus": "consumed"}
    consumed = refusals(reg, "approval_consumed")
    assert sorted(consumed["evidence"].map(lambda e: e["approved_by"])[-2:]) == ["grace", "linus"]
    # used up by the move: after a rollback, the same approvals cannot bring the version back
    rollback("production", who="olga", comment="p95 regression", registry=reg)
    with pytest.raises(PromotionRefused, match="was used up by the move"):
        promote("tiny-llada", "production", registry=reg)


def test_a_user_without_the_role_is_refused_for_approval_sign_off_and_rollback(reg):
    at_poc(reg)
    with pytest.raises(ApprovalRefused, match=r"mallory may not approve staging: the approve role is held by "
                                              r"approvers \(bob, eve, grace, linus\)"):
        approve(reg, "tiny-llada", "1", "staging", "mallory", OK)
    with pytest.raises(ApprovalRefused, match="mallory may not sign off staging/fallback-plan"):
        sign_off(reg, "tiny-llada", "1", "staging", "fallback-plan", "mallory", "looked at it")
    with pytest.raises(PromotionRefused, match="mallory may not roll back poc: the emergency_rollback role"):
        rollback("poc", who="mallory", registry=reg)
    assert stage_holder(reg, "poc") == ("tiny-llada", "1") and stage_holder(reg, "staging") is None
    assert refusals(reg, "approval_refused")["who"].tolist() == ["mallory"]
    assert refusals(reg, "signoff_refused")["who"].tolist() == ["mallory"]
    assert refusals(reg, "rollback_refused")["who"].tolist() == ["mallory"]


def test_on_call_rolls_back_without_an_approval_and_it_opens_a_finding(reg):
    register_evidence(reg, evidence("tiny-ar"))
    at_poc(reg)
    move = rollback("poc", who="olga", comment="PoC answers time out", registry=reg)
    assert move.to_holder == ("tiny-ar", "1") and move.who == "olga"
    finding = refusals(reg, "emergency_rollback")
    assert finding["who"].tolist() == ["olga"] and finding["evidence"][0]["move"] == move.audit_run_id
    assert "without an approval: review it" in finding["comment"][0]


def test_a_declined_version_is_refused_until_new_evidence_is_registered(reg):
    at_poc(reg)
    decline(reg, "tiny-llada", "1", "staging", "grace", "the sort task regressed in review")
    with pytest.raises(ApprovalRefused, match="grace declined staging at .*; a decline is final until new evidence"):
        approve(reg, "tiny-llada", "1", "staging", "linus", OK)
    with pytest.raises(PromotionRefused) as e:
        promote("tiny-llada", "staging", registry=reg)
    assert any("a decline is final until new evidence is registered" in r for r in e.value.reasons)
    assert stage_holder(reg, "staging") is None
    assert refusals(reg, "decline")["who"].tolist() == ["grace"]
    assert "linus" in refusals(reg, "approval_refused")["who"].tolist()
    register_evidence(reg, fast_llada())  # new evidence: the decline (and every sign-off) no longer stands
    for item in load_checklist("staging").manual_items():
        sign_off(reg, "tiny-llada", "1", "staging", item, "ada", f"{item} checked again")
    approve(reg, "tiny-llada", "1", "staging", "linus", OK)
    assert promote("tiny-llada", "staging", registry=reg).to_holder == ("tiny-llada", "1")


def test_an_approval_expires_after_the_stage_ttl(reg, tmp_path):
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(roles_data(poc={"approval_ttl_hours": 0.0002})))  # 0.72 s
    approve(reg, "tiny-llada", "1", "poc", "grace", OK)
    time.sleep(1.0)
    with pytest.raises(PromotionRefused, match="no approval recorded for poc|has expired"):
        promote("tiny-llada", "poc", registry=reg)
    assert [a.status for a in approvals_of(reg, "tiny-llada", "1", "poc")] == ["expired"]
    assert refusals(reg, "approval_expired")["evidence"][0]["approved_by"] == "grace"
    assert stage_holder(reg, "poc") is None


@pytest.mark.parametrize("comment", ["", "   ", "\n\t"])
def test_an_approval_with_an_empty_comment_is_refused_and_audited(reg, comment):
    with pytest.raises(ApprovalRefused, match="an approval needs a comment"):
        approve(reg, "tiny-llada", "1", "poc", "grace", comment)
    assert approvals_of(reg, "tiny-llada", "1", "poc") == []
    assert refusals(reg, "approval_refused")["who"].tolist() == ["grace"]


def test_the_rules_state_each_duty_as_a_typed_reason_an_approver_can_settle():
    roles = parse_roles(roles_data())
    base = {"fallback": evidence("tiny-ar"), "production": None}
    signed = signoffs("fallback-plan", "tooling-maturity", "security-review", "monitoring-plan", "model-card")
    by_eve = Approval("staging", "eve", "2026-11-30T11:30:00Z", OK, id="a1", request="r1")
    by_mallory = Approval("staging", "mallory", "2026-11-30T11:31:00Z", OK, id="a2", request="r1")
    duties = Duties(requester="bob", registered_by="eve", request_id="r1", now="2026-11-30T12:00:00Z")
    decision = decide_promotion(fast_llada(), load_roles_free_policy(), "staging", base, signed, [by_eve, by_mallory],
                                {"poc"}, evaluated_at="2026-11-30T10:30:00Z", roles=roles, duties=duties)
    settled = {r.kind: r.text for r in decision.reasons if not r.blocking}  # another approver settles these
    assert settled == {ReasonKind.DUTY: "eve registered the evidence of this version and cannot approve its staging "
                                        "promotion",
                       ReasonKind.ROLE: "mallory may not approve staging: the approve role is held by approvers "
                                        "(bob, eve, grace, linus)"}, decision.reasons
    declined = Decline("staging", "grace", "2026-11-30T11:00:00Z", "no")
    decision = decide_promotion(fast_llada(), load_roles_free_policy(), "staging", base, signed, [], {"poc"},
                                evaluated_at="2026-11-30T10:30:00Z", roles=roles,
                                duties=Duties(declined=declined))
    assert [r.kind for r in decision.reasons if r.blocking] == [ReasonKind.DECLINED]


def load_roles_free_policy():
    from gates import load_policy

    return load_policy()


def test_the_bundled_roles_keep_the_one_user_flow_to_poc_and_need_others_beyond():
    roles = load_roles()
    assert roles.stage("poc").self_approval and not roles.stage("staging").self_approval
    assert roles.stage("production").approvals_count == 2
    assert all(roles.may("anyone", s, d) for s in ("poc", "staging", "production")
               for d in ("approve", "emergency_rollback", "sign_off"))


@pytest.mark.parametrize("edit, where", [
    (lambda d: d.update(admins=["ada"]), "admins: unknown key"),
    (lambda d: d["stages"]["poc"].update(aprove=["approvers"]), "stages.poc: aprove: unknown key"),
    (lambda d: d["stages"].update(canary=d["stages"]["poc"]), "stages.canary: unknown stage"),
    (lambda d: d["stages"]["staging"].update(approve=["approverz"]),
     "stages.staging.approve: 'approverz' is not a known user or a group"),
    (lambda d: d["groups"].update(reviewers=["zed"]), "groups.reviewers: 'zed' is not a known user"),
    (lambda d: d["stages"]["poc"]["sign_off"].update({"fallback-plann": ["ada"]}),
     "stages.poc.sign_off.fallback-plann: not a manual item of the poc checklist"),
    (lambda d: d["stages"]["production"].update(approvals={"count": 1, "distinct": True}),
     "stages.production.approvals.count: production needs at least 2 distinct approvers"),
    (lambda d: d["stages"]["production"].update(approvals={"count": 2, "distinct": False}),
     "stages.production.approvals.distinct: expected true"),
    (lambda d: d["stages"]["poc"].update(approval_ttl_hours=float("nan")), "stages.poc.approval_ttl_hours"),
    (lambda d: d["stages"]["poc"].pop("emergency_rollback"), "stages.poc: emergency_rollback: missing"),
])
def test_a_malformed_roles_file_is_refused_naming_the_key(tmp_path, edit, where):
    data = roles_data()
    edit(data)
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RolesError) as e:
        load_roles(path)
    assert str(path) in str(e.value) and where in str(e.value), str(e.value)


def test_cli_approve_refuses_with_its_reason_and_reject_is_final(reg, monkeypatch, prefect_harness):
    from typer.testing import CliRunner

    from flow_fixtures import cli_app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    at_poc(reg)
    run = CliRunner().invoke
    as_eve = run(cli_app("approve"), ["approve", "tiny-llada", "staging", "--comment", OK],
                 env={"COLUMNS": "200", "LOGNAME": "eve"})
    assert as_eve.exit_code == 1 and "eve registered the evidence of this version" in as_eve.output, as_eve.output
    claimed = run(cli_app("approve"), ["approve", "tiny-llada", "staging", "--by", "linus", "--comment", OK],
                  env={"COLUMNS": "200", "LOGNAME": "grace"})
    assert claimed.exit_code == 2 and "--by 'linus' is not you: you are 'grace'" in claimed.output
    declined = run(cli_app("approve"), ["reject", "tiny-llada", "staging", "--comment", "the sort task regressed"],
                   env={"COLUMNS": "200", "LOGNAME": "grace"})
    assert declined.exit_code == 0 and "declined by grace" in declined.output, declined.output
    again = run(cli_app("approve"), ["approve", "tiny-llada", "staging", "--comment", OK],
                env={"COLUMNS": "200", "LOGNAME": "linus"})
    assert again.exit_code == 1 and "a decline is final until new evidence is registered" in again.output
    assert stage_holder(reg, "staging") is None
    assert refusals(reg, "approval_refused")["who"].tolist() == ["eve", "linus"]
    assert refusals(reg, "identity_refused")["who"].tolist() == ["grace"]
    assert refusals(reg, "decline")["who"].tolist() == ["grace"]


def test_a_name_typed_into_the_prefect_form_moves_nothing_an_identified_approval_does(reg, monkeypatch,
                                                                                     prefect_harness):
    import threading

    from typer.testing import CliRunner

    from flow_fixtures import cli_app
    from flows.promote import PromotionApproval, promote_flow, resume_with_approval, waiting_promotions

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)

    def paused_flow():
        outcome = {}
        thread = threading.Thread(target=lambda: outcome.update(
            state=promote_flow("tiny-llada", "poc", timeout_s=120, poll_interval_s=1, return_state=True)))
        thread.start()
        deadline = time.monotonic() + 90
        while not waiting_promotions("tiny-llada", "poc") and time.monotonic() < deadline:
            time.sleep(0.5)
        return thread, outcome

    thread, outcome = paused_flow()
    resume_with_approval(waiting_promotions("tiny-llada", "poc")[0].id,
                         PromotionApproval(approver="grace", comment=OK))  # what the UI form sends: a typed name
    thread.join(120)
    assert outcome["state"].is_failed() and "carries no identity" in outcome["state"].message
    assert stage_holder(reg, "poc") is None and approvals_of(reg, "tiny-llada", "1", "poc") == []

    thread, outcome = paused_flow()
    approved = CliRunner().invoke(cli_app("approve"), ["approve", "tiny-llada", "poc", "--comment", OK],
                                  env={"LOGNAME": "grace"})
    assert approved.exit_code == 0 and "approved by grace" in approved.output, approved.output
    thread.join(120)
    assert outcome["state"].is_completed(), outcome["state"].message
    assert stage_holder(reg, "poc") == ("tiny-llada", "1")
    assert [(a.by, a.status) for a in approvals_of(reg, "tiny-llada", "1", "poc")] == [("grace", "consumed")]


def test_promote_with_your_own_earlier_approval_uses_it_instead_of_a_second(reg):
    approve(reg, "tiny-llada", "1", "poc", "bob", OK)  # poc allows the requester's own approval
    move = promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    assert [(a.by, a.status) for a in approvals_of(reg, "tiny-llada", "1", "poc")] == [("bob", "consumed")]
    assert [a["by"] for a in move.evidence["approvals"]] == ["bob"]
