"""Identity, roles, separation of duties and the approval lifecycle, on a real SQLite MLflow store.

Every refusal is checked three ways: its reason is named, nothing moved, and the attempt is in the audit trail.
People: the OS account running the tests (`ME`) registers the evidence and requests, ada signs off, grace and
linus approve, olga is on call, mallory holds no role. The roles list each person's public key and the test's keys
folder holds each one's key pair (`tests.support.governance`): a listed key is a person, and a name typed without
that person's key is no one. Staging and production count only signed acts whatever a roles file says; names that
one OS account types count once (the rule the last stage without keys still needs).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import yaml

from checklists import load_checklist
from gates.decision import decide
from gates.promotion import Approval, Decline, Duties, ReasonKind
from gates.roles import RolesError, load_roles, parse_roles
from gates.signatures import SIGNED
from registry import (
    ApprovalRefused,
    PromotionRefused,
    approve,
    decline,
    keys,
    promote,
    register_evidence,
    rollback,
    sign_off,
    stage_holder,
)
from registry.approvals import approvals_of, open_request, signed
from tests.support.gate_fixtures import OK, evidence, fast_llada
from tests.support.governance import (
    ME,
    at_poc,
    governed_registry,
    refusals,
    roles_data,
    roles_with_me,
    signed_signoffs,
    signers_of,
    with_keys,
)

ONE_ACCOUNT = "without an authenticated server one OS account is one person"


@pytest.fixture
def reg(tmp_path, monkeypatch):
    return governed_registry(tmp_path, monkeypatch)


def test_registration_records_who_registered_the_evidence_and_from_where(reg):
    tags = reg.version_tags("tiny-llada", "1")
    assert tags["unmask.evaluated_by"] == ME != "eve" and tags["unmask.evaluated_from"]
    assert tags["unmask.evaluated_account"] == ME


def test_the_registrant_cannot_approve_staging_nothing_moves_and_the_attempt_is_audited(reg, tmp_path):
    roles_with_me(tmp_path)
    at_poc(reg)
    with pytest.raises(ApprovalRefused, match=f"{ME} registered the evidence of this version and cannot approve"):
        approve(reg, "tiny-llada", "1", "staging", ME, OK)
    assert stage_holder(reg, "staging") is None
    assert [a.by for a in approvals_of(reg, "tiny-llada", "1", "staging")] == []
    refused = refusals(reg, "approval_refused")
    assert list(refused["who"]) == [ME] and "registered the evidence" in refused["comment"][0]


def test_the_requester_cannot_approve_their_own_request(reg):
    at_poc(reg)
    with pytest.raises(PromotionRefused, match="no approval recorded for staging"):
        promote("tiny-llada", "staging", registry=reg, actor="bob")  # bob asks: the request stays open
    assert open_request(reg, "tiny-llada", "1", "staging").by == "bob"
    with pytest.raises(ApprovalRefused, match=r"bob requested this promotion and cannot approve it"):
        approve(reg, "tiny-llada", "1", "staging", "bob", OK)
    with pytest.raises(PromotionRefused, match="bob requested this promotion and cannot approve it"):
        promote("tiny-llada", "staging", approver="bob", comment=OK, registry=reg, actor="bob")  # nor in one call
    assert stage_holder(reg, "staging") is None
    assert list(refusals(reg, "approval_refused")["who"]) == ["bob", "bob"]


def test_a_name_typed_without_that_persons_key_is_no_one(reg):
    """grace is only a name typed by the account that registered and requested, which does not hold grace's key:
    refused at every stage in one line, nothing moves, both attempts audited."""
    at_poc(reg)
    (keys.keys_home() / "grace" / keys.PRIVATE).unlink()  # this process no longer holds grace's private key
    with pytest.raises(PromotionRefused, match="no approval recorded for staging"):
        promote("tiny-llada", "staging", registry=reg)
    for stage in ("staging", "production"):
        with pytest.raises(ApprovalRefused) as refused:
            approve(reg, "tiny-llada", "1", stage, "grace", OK)
        assert len(refused.value.reasons) == 1 and refused.value.reasons[0].startswith("the approval by grace at "), (
            refused.value.reasons
        )
        assert "is not signed: only an act signed by a key the roles file lists for grace counts" in str(refused.value)
    assert stage_holder(reg, "staging") is None and approvals_of(reg, "tiny-llada", "1", "staging") == []
    assert refusals(reg, "approval_refused")["who"].tolist() == ["grace", "grace"]


def test_two_approvals_from_one_os_account_count_once_where_a_stage_counts_unsigned_ones():
    """The pure rule, at a poc that asks two approvals under roles listing no keys: names typed by one OS account
    are one person; a name a server authenticated is its own. Staging and production count no unsigned approval."""
    from gates.promotion import approval_problems

    roles = parse_roles(roles_data(poc={"approvals": {"count": 2, "distinct": True}}))
    at = "2026-11-30T11:00:00Z"
    typed = [
        Approval("poc", name, at, OK, f"a{n}", "r1", identity="named-by-caller", account="ops")
        for n, name in enumerate(("grace", "linus"))
    ]
    reasons, counted = approval_problems(typed, "poc", 0, roles=roles, duties=Duties(request_id="r1"), counted=True)
    assert [a.by for a in counted] == [] and [r.text for r in reasons] == [
        f"poc needs distinct people, and linus is OS account 'ops', which already approved it as grace: "
        f"{ONE_ACCOUNT}, so four eyes need `mlflow server --app-name basic-auth` (docs/governance.md)",
        "poc needs 2 approvals from 2 different people; approved so far by grace",
    ]
    authenticated = [
        Approval("poc", name, at, OK, f"a{n}", "r1", identity="mlflow-basic-auth", account="ops")
        for n, name in enumerate(("grace", "linus"))
    ]
    assert approval_problems(authenticated, "poc", 0, roles=roles, duties=Duties(request_id="r1")) == []
    at_production = [replace(a, stage="production") for a in authenticated]
    reasons, counted = approval_problems(
        at_production, "production", 0, roles=roles, duties=Duties(request_id="r1"), counted=True
    )
    unsigned = [r.text for r in reasons if "counts for nothing: production counts only acts signed" in r.text]
    assert counted == [] and len(unsigned) == 2, reasons


def test_of_two_names_on_one_account_the_approval_typed_into_the_promotion_is_the_one_that_counts():
    """At poc one approval is needed and one account is one person: whichever of its two names approved first,
    a promotion that typed (or prefers) one of them uses that one (two racing promotions each cited the other's)."""
    from gates.promotion import approval_problems

    roles = load_roles()
    typed = [
        Approval("poc", name, at, OK, f"a{n}", "r1", identity="named-by-caller", account="ops")
        for n, (name, at) in enumerate((("grace", "2026-11-30T11:00:00Z"), ("linus", "2026-11-30T11:00:01Z")))
    ]
    for prefer, expected in (("", "grace"), ("a0", "grace"), ("a1", "linus")):
        reasons, counted = approval_problems(
            typed, "poc", 0, roles=roles, duties=Duties(request_id="r1"), counted=True, prefer=prefer
        )
        assert [a.by for a in counted] == [expected] and reasons == [], prefer


def test_environment_variables_do_not_change_the_identity_on_the_embedded_store(reg, monkeypatch, tmp_path):
    import os
    import pwd

    from registry import current_actor

    for name in ("LOGNAME", "USER", "USERNAME", "LNAME", "UNMASK_USER", "MLFLOW_TRACKING_USERNAME"):
        monkeypatch.setenv(name, "grace")
    actor = current_actor(reg.tracking_uri)
    assert (actor.name, actor.account, actor.source) == (pwd.getpwuid(os.getuid()).pw_name, ME, "os-user")
    roles_with_me(tmp_path)
    approval = approve(reg, "tiny-llada", "1", "poc", None, OK)  # signed with ME's listed key: the key says who
    assert (approval.by, approval.account, approval.identity) == (ME, ME, SIGNED)


def test_the_tooling_maturity_signer_cannot_approve_staging(reg, monkeypatch, tmp_path):
    at_poc(reg)
    data = roles_data()
    data["groups"]["architects"] = ["ada", "linus"]
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(with_keys(data)))
    sign_off(reg, "tiny-llada", "1", "staging", "tooling-maturity", "linus", "ONNX export and serving reviewed")
    with pytest.raises(ApprovalRefused, match="linus signed off tooling-maturity for staging and cannot also approve"):
        approve(reg, "tiny-llada", "1", "staging", "linus", OK)
    assert stage_holder(reg, "staging") is None and "linus" in refusals(reg, "approval_refused")["who"].tolist()


def test_a_user_without_the_role_is_refused_for_approval_sign_off_and_rollback(reg):
    at_poc(reg)
    with pytest.raises(
        ApprovalRefused,
        match=r"mallory may not approve staging: the approve role is held by "
        r"approvers \(bob, eve, grace, linus\)",
    ):
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
    approve(reg, "tiny-llada", "1", "staging", "linus", OK)  # nothing stands in the way now
    assert promote("tiny-llada", "staging", registry=reg).to_holder == ("tiny-llada", "1")


def test_an_approval_expires_after_the_stage_ttl(reg, tmp_path):
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(with_keys(roles_data(poc={"approval_ttl_hours": 0.0002}))))
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
    roles = parse_roles(with_keys(roles_data()))
    people = signers_of(["ada", "eve", "grace", "mallory"])
    base = {"fallback": evidence("tiny-ar"), "production": None}
    signed_off = signed_signoffs("staging", people["ada"])
    by_eve = signed(Approval("staging", "eve", "2026-11-30T11:30:00Z", OK, id="a1", request="r1"), people["eve"])
    by_mallory = signed(
        Approval("staging", "mallory", "2026-11-30T11:31:00Z", OK, id="a2", request="r1"), people["mallory"]
    )
    duties = Duties(requester="bob", registered_by="eve", request_id="r1", now="2026-11-30T12:00:00Z")
    decision = decide(
        fast_llada(),
        load_roles_free_policy(),
        "staging",
        base,
        signed_off,
        [by_eve, by_mallory],
        {"poc"},
        evaluated_at="2026-11-30T10:30:00Z",
        roles=roles,
        duties=duties,
    )
    settled = {r.kind: r.text for r in decision.reasons if not r.blocking}  # another approver settles these
    assert settled == {
        ReasonKind.DUTY: "eve registered the evidence of this version and cannot approve its staging promotion",
        ReasonKind.ROLE: "mallory may not approve staging: the approve role is held by approvers "
        "(bob, eve, grace, linus)",
    }, decision.reasons
    declined = Decline("staging", "grace", "2026-11-30T11:00:00Z", "no", model="tiny-llada")
    declined = replace(declined, **dict(zip(("key", "signature"), people["grace"].sign(declined.payload()))))
    decision = decide(
        fast_llada(),
        load_roles_free_policy(),
        "staging",
        base,
        signed_off,
        [],
        {"poc"},
        evaluated_at="2026-11-30T10:30:00Z",
        roles=roles,
        duties=Duties(declined=declined),
    )
    assert [r.kind for r in decision.reasons if r.blocking] == [ReasonKind.DECLINED]


def load_roles_free_policy():
    from gates import load_policy

    return load_policy()


def test_the_bundled_roles_keep_the_one_user_flow_to_poc_and_need_others_beyond():
    roles = load_roles()
    assert roles.stage("poc").self_approval and not roles.stage("staging").self_approval
    assert roles.stage("production").approvals_count == 2
    assert all(
        roles.may("anyone", s, d)
        for s in ("poc", "staging", "production")
        for d in ("approve", "emergency_rollback", "sign_off")
    )


@pytest.mark.parametrize(
    "edit, where",
    [
        (lambda d: d.update(admins=["ada"]), "admins: unknown key"),
        (lambda d: d["stages"]["poc"].update(aprove=["approvers"]), "stages.poc: aprove: unknown key"),
        (lambda d: d["stages"].update(canary=d["stages"]["poc"]), "stages.canary: unknown stage"),
        (
            lambda d: d["stages"]["staging"].update(approve=["approverz"]),
            "stages.staging.approve: 'approverz' is not a known user or a group",
        ),
        (lambda d: d["groups"].update(reviewers=["zed"]), "groups.reviewers: 'zed' is not a known user"),
        (
            lambda d: d["stages"]["poc"]["sign_off"].update({"fallback-plann": ["ada"]}),
            "stages.poc.sign_off.fallback-plann: not a manual item of the poc checklist",
        ),
        (
            lambda d: d["stages"]["production"].update(approvals={"count": 1, "distinct": True}),
            "stages.production.approvals.count: production needs at least 2 distinct approvers",
        ),
        (
            lambda d: d["stages"]["production"].update(approvals={"count": 2, "distinct": False}),
            "stages.production.approvals.distinct: expected true",
        ),
        (lambda d: d["stages"]["poc"].update(approval_ttl_hours=float("nan")), "stages.poc.approval_ttl_hours"),
        (lambda d: d["stages"]["poc"].pop("emergency_rollback"), "stages.poc: emergency_rollback: missing"),
    ],
)
def test_a_malformed_roles_file_is_refused_naming_the_key(tmp_path, edit, where):
    data = roles_data()
    edit(data)
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(RolesError) as e:
        load_roles(path)
    assert str(path) in str(e.value) and where in str(e.value), str(e.value)


def test_promote_with_your_own_earlier_approval_uses_it_instead_of_a_second(reg):
    approve(reg, "tiny-llada", "1", "poc", "bob", OK)  # poc allows the requester's own approval
    move = promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)
    assert [(a.by, a.status) for a in approvals_of(reg, "tiny-llada", "1", "poc")] == [("bob", "consumed")]
    assert [a["by"] for a in move.evidence["approvals"]] == ["bob"]
