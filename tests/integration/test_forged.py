"""Nothing acts on forged evidence (issue 23): approve, reject and sign-off refuse a version whose evidence was
edited in the artifact store, recording only the finding; stored gate reports are hashed when written and
checked by every reader (`unmask gates --stored`, the dashboard reads, the dossier)."""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

import registry.read as read
import registry.views as views
from registry import EvidenceTampered, approve, decline, judge, sign_off
from registry.approvals import approvals_of, declined_of, signoffs_of
from registry.integrity import GateReportTampered
from registry.store import model_tag
from registry.tracking import load_gate_report
from tests.support.flow_fixtures import cli_app
from tests.support.forgery import artifact_file, findings, flip_gate_report, forge_records
from tests.support.gate_fixtures import OK, act_as, fresh_registry, paired_registry, register_pair


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


def forge_evidence_json(reg, model="tiny-llada", version="1") -> None:
    """Edit a version's evidence.json: its recorded failures wiped, as if the evaluation had run clean."""
    file = artifact_file(reg, model, version, "evidence/evidence.json")
    data = json.loads(file.read_text())
    data["failures"] = []
    data["card"] = dict(data.get("card") or {}, forged="yes")
    file.write_text(json.dumps(data))


def decisions(reg) -> list[str]:
    """Every audit event but the integrity findings and the registrations the test made."""
    events = read.audit_events(registry=reg)
    ignored = ("integrity_finding", "evidence_registered")
    return [e for e in events.event if e not in ignored] if not events.empty else []


# approve, reject and sign-off on forged evidence ---------------------------------------------------------------
@pytest.mark.parametrize("forge", ["records", "evidence"])
def test_approve_decline_and_sign_off_refuse_forged_evidence_and_record_only_the_finding(reg, forge):
    _, v = register_pair(reg)
    if forge == "records":
        forge_records(reg)
    else:
        forge_evidence_json(reg)
    artifact = f"evidence/{forge}.json"
    before = dict(reg.version_tags("tiny-llada", v))
    with pytest.raises(EvidenceTampered, match=f"tiny-llada version {v}: evidence artifact {artifact}"):
        approve(reg, "tiny-llada", v, "poc", "grace", OK)
    with pytest.raises(EvidenceTampered, match=artifact):
        decline(reg, "tiny-llada", v, "poc", "grace", "not on this evidence")
    with pytest.raises(EvidenceTampered, match=artifact):
        sign_off(reg, "tiny-llada", v, "poc", "fallback-plan", "ada", "fallback plan reviewed")
    assert approvals_of(reg, "tiny-llada", v, "poc") == []
    assert declined_of(reg, "tiny-llada", v, "poc") is None
    assert signoffs_of(reg, "tiny-llada", v, "poc") == {}
    assert dict(reg.version_tags("tiny-llada", v)) == before  # no request, approval, decline or sign-off tag
    assert decisions(reg) == []  # nor any approval, refusal, decline or sign-off event
    recorded = findings(reg, "tampered")
    assert len(recorded) == 1 and recorded.evidence.iloc[0]["artifact"] == artifact  # the same forgery, once
    assert recorded.who.iloc[0] == "grace" and (recorded.model.iloc[0], recorded.version.iloc[0]) == ("tiny-llada", v)


def test_a_sign_off_check_names_its_own_forgery_after_another_was_recorded(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    forge_records(reg)
    with pytest.raises(EvidenceTampered):
        sign_off(reg, "tiny-llada", v, "poc", "fallback-plan", "ada", "fallback plan reviewed")
    forge_evidence_json(reg)  # a second file edited: evidence.json is read first, so it is the one named now
    with pytest.raises(EvidenceTampered, match="evidence/evidence.json"):
        approve(reg, "tiny-llada", v, "poc", "grace", OK)
    assert sorted(findings(reg, "tampered").evidence.map(lambda e: e["artifact"])) == [
        "evidence/evidence.json",
        "evidence/records.json",
    ]
    assert list(findings(reg, "tampered").who) == ["ada", "grace"]


def test_untouched_evidence_is_approved_signed_and_declined_as_before(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    sign_off(reg, "tiny-llada", v, "poc", "fallback-plan", "ada", "fallback plan reviewed")
    approval = approve(reg, "tiny-llada", v, "poc", "grace", OK)
    assert [a.id for a in approvals_of(reg, "tiny-llada", v, "poc")] == [approval.id]
    decline(reg, "tiny-llada", v, "poc", "grace", "second thoughts")
    assert declined_of(reg, "tiny-llada", v, "poc").by == "grace"
    assert read.audit_events(event="integrity_finding", registry=reg).empty


def _cli(reg, monkeypatch, user: str, args: list[str]):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    act_as(user)  # `user`'s own keys folder (no environment variable names an identity)
    return CliRunner().invoke(cli_app("approve", "promote", "gates"), args, env={"COLUMNS": "400"})


@pytest.mark.parametrize(
    "user,args",
    [
        ("grace", ["approve", "tiny-llada", "poc", "--comment", OK]),
        ("grace", ["reject", "tiny-llada", "poc", "--comment", "not on this evidence"]),
        ("grace", ["approve", "tiny-llada", "poc", "--reject", "--comment", "not on this evidence"]),
        ("ada", ["sign-off", "tiny-llada", "--stage", "poc", "--item", "fallback-plan", "--comment", "reviewed"]),
    ],
)
def test_cli_approve_reject_and_sign_off_refuse_forged_evidence_with_one_line(reg, monkeypatch, user, args):
    _, v = register_pair(reg)
    forge_records(reg)
    before = dict(reg.version_tags("tiny-llada", v))
    done = _cli(reg, monkeypatch, user, args)
    assert done.exit_code == 2 and "Traceback" not in done.output, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: tiny-llada version {v}: evidence artifact evidence/records.json"
    ), done.output
    assert dict(reg.version_tags("tiny-llada", v)) == before and decisions(reg) == []
    assert list(findings(reg, "tampered").who) == [user]


# gate reports hashed ---------------------------------------------------------------------------------------------
def test_a_gate_report_is_hashed_when_written_and_verified_when_read(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    judge(reg, "tiny-llada", v, "staging")
    tags = reg.version_tags("tiny-llada", v)
    file = artifact_file(reg, "tiny-llada", v, "gates/staging.json")
    assert tags[model_tag("gates.staging.sha256")] == hashlib.sha256(file.read_bytes()).hexdigest()
    markdown = artifact_file(reg, "tiny-llada", v, "gates/staging.md")
    assert tags[model_tag("gates.staging.md_sha256")] == hashlib.sha256(markdown.read_bytes()).hexdigest()
    report = load_gate_report(reg, "tiny-llada", v, "staging")
    assert report["integrity"] == "verified" and report["passed"] is False
    assert set(read.gate_results(stage="staging", registry=reg).report_integrity) == {"verified"}


def test_a_flipped_gate_report_is_refused_by_every_reader_and_named(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    judge(reg, "tiny-llada", v, "staging")
    judge(reg, "tiny-llada", v, "poc")
    assert len(read.gate_results(model="tiny-llada", stage="staging", registry=reg))
    flip_gate_report(reg)
    with pytest.raises(GateReportTampered, match=f"tiny-llada version {v}: gate report gates/staging.json") as e:
        load_gate_report(reg, "tiny-llada", v, "staging")
    assert e.value.finding()["artifact"] == "gates/staging.json" and e.value.expected in str(e.value)
    results = read.gate_results(model="tiny-llada", registry=reg)
    assert set(results.stage) == {"poc"}  # the forged staging report gives no rows; poc's is untouched
    assert read.checklist("tiny-llada", v, "staging", registry=reg).empty
    board = views.integrity_board(reg).set_index("model")
    assert (
        board.loc["tiny-llada", "status"] == "tampered"
        and board.loc["tiny-llada", "artifact"] == "gates/staging.json"
        and "gate report gates/staging.json" in board.loc["tiny-llada", "detail"]
    )
    assert board.loc["tiny-ar", "status"] == "verified"
    from dashboards.dossier.content import dossier_content

    with pytest.raises(GateReportTampered, match="gates/staging.json"):
        dossier_content(reg, "tiny-llada", v)
    assert "integrity_finding" not in set(read.audit_events(registry=reg).event)  # reading writes no finding


def test_cli_gates_stored_shows_reports_without_re_judging_and_refuses_a_flipped_one(tmp_path, monkeypatch):
    reg, v = paired_registry(tmp_path), "1"
    judge(reg, "tiny-llada", v, "staging")
    at = reg.version_tags("tiny-llada", v)[model_tag("gates.staging.at")]
    shown = _cli(reg, monkeypatch, "grace", ["gates", "tiny-llada", "--stage", "staging", "--stored"])
    assert shown.exit_code == 0, shown.output
    assert f"stored {at}" in shown.output and "did not pass" in shown.output
    assert reg.version_tags("tiny-llada", v)[model_tag("gates.staging.at")] == at  # not judged again
    flip_gate_report(reg)
    shown = _cli(reg, monkeypatch, "grace", ["gates", "tiny-llada", "--stage", "staging", "--stored"])
    assert shown.exit_code == 2 and "Traceback" not in shown.output
    lines = shown.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: tiny-llada version {v}: gate report gates/staging.json")
    assert "passed" not in shown.output.replace("did not pass", "")
    recorded = findings(reg, "tampered")
    assert list(recorded.evidence.map(lambda e: e["artifact"])) == ["gates/staging.json"]
    # re-judging writes a fresh, hashed report; the forgery stays on the record (once)
    judge(reg, "tiny-llada", v, "staging")
    assert load_gate_report(reg, "tiny-llada", v, "staging")["integrity"] == "verified"
    assert len(findings(reg, "tampered")) == 1


def test_re_judging_over_a_flipped_report_records_the_forgery_first(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    judge(reg, "tiny-llada", v, "staging")
    flip_gate_report(reg)
    decision = judge(reg, "tiny-llada", v, "staging")
    assert not decision.allowed and load_gate_report(reg, "tiny-llada", v, "staging")["passed"] is False
    assert list(findings(reg, "tampered").evidence.map(lambda e: e["artifact"])) == ["gates/staging.json"]


def test_a_gate_report_written_before_reports_were_hashed_reads_as_unverified(tmp_path, monkeypatch):
    reg, v = paired_registry(tmp_path), "1"
    judge(reg, "tiny-llada", v, "staging")
    for key in ("gates.staging.sha256", "gates.staging.md_sha256"):
        reg.client.delete_model_version_tag("tiny-llada", v, model_tag(key))
    report = load_gate_report(reg, "tiny-llada", v, "staging")
    assert report["integrity"] == "unverified" and report["stage"] == "staging"
    assert set(read.gate_results(model="tiny-llada", stage="staging", registry=reg).report_integrity) == {"unverified"}
    assert views.integrity_board(reg).set_index("model").loc["tiny-llada", "status"] == "verified"
    shown = _cli(reg, monkeypatch, "grace", ["gates", "tiny-llada", "--stage", "staging", "--stored"])
    assert shown.exit_code == 0 and "gate report unverified: written before gate reports were hashed" in shown.output


# the dashboard: who did what, and whether the audit chain holds ------------------------------------------------
def decided_registry(tmp_path):
    """A registry with every kind of decision: sign-offs, an approval consumed by a promotion, an emergency
    rollback, an approval voided by a decline."""
    from registry import promote, rollback

    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg)
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", v, "poc", item, "ada", f"{item} reviewed for the PoC")
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    rollback("poc", who="oncall", comment="the PoC misbehaves", registry=reg)
    approve(reg, "tiny-llada", v, "poc", "grace", "once more, on the same evidence")
    decline(reg, "tiny-llada", v, "poc", "grace", "not again until it is re-evaluated")
    return reg, v


def dashboard(reg, monkeypatch, path: str | None = None):
    import streamlit as st

    from tests.support.dashboard_pages import page

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.delenv("UNMASK_POLICY", raising=False)
    st.cache_data.clear()  # the page reads the registry as it is now
    return page(path)


def decisions_table(at):
    return next(d.value for d in at.dataframe if "decision" in d.value.columns)


def test_every_decision_is_read_with_its_actor_host_and_identity_source(tmp_path):
    reg, v = decided_registry(tmp_path)
    found = views.decisions(reg)
    assert list(found.decision)[::-1] == [
        "sign-off",
        "sign-off",
        "approval",
        "promotion",
        "consumed",
        "rollback",
        "emergency rollback",
        "approval",
        "void",
        "decline",
    ]
    from registry.identity import current_actor

    mover = current_actor(reg.tracking_uri)  # who ran `promote` (grace only approved it)
    assert list(found.who)[::-1] == [
        "ada",
        "ada",
        "grace",
        mover.name,
        mover.name,
        "oncall",
        "oncall",
        "grace",
        "grace",
        "grace",
    ]
    assert found[found.decision == "promotion"].identity.iloc[0] == mover.source
    assert (found.host != "").all() and (found.identity != "").all()  # every decision says where it was made
    events = read.audit_events(registry=reg)
    for row in found.itertuples():  # host and identity are the ones the audit entry records
        actor = events.set_index("audit_run_id").loc[row.audit_run_id, "evidence"]["actor"]
        assert (row.host, row.identity) == (actor["host"], actor["identity"])
    promotion = found[found.decision == "promotion"].iloc[0]
    assert promotion.what == f"nobody → tiny-llada@{v}" and promotion.stage == "poc"
    assert found[found.decision == "void"].what.iloc[0].endswith(" by grace")


def test_the_promotions_page_shows_who_did_what_and_the_intact_chain_in_green(tmp_path, monkeypatch):
    reg, _ = decided_registry(tmp_path)
    at = dashboard(reg, monkeypatch, "views/promotions.py")
    shown = decisions_table(at)
    read_back = views.decisions(reg)
    assert list(shown.decision) == list(read_back.decision) and list(shown.who) == list(read_back.who)
    assert list(shown.host) == list(read_back.host) and list(shown.identity) == list(read_back.identity)
    assert list(shown["audit run"]) == list(read_back.audit_run_id)
    chain = read.audit_chain(registry=reg)
    assert chain["status"] == "intact" and [s.value for s in at.success] == [chain["summary"]]
    assert not [e for e in texts(at, "error") if "audit trail" in e]
    landing = dashboard(reg, monkeypatch)
    assert not [e for e in texts(landing, "error") if "audit trail" in e]


def texts(at, kind: str) -> list[str]:
    return [e.value for e in at.get(kind)]


def test_a_broken_chain_is_red_on_the_promotions_page_and_the_landing_verdict_naming_the_entry(tmp_path, monkeypatch):
    reg, _ = decided_registry(tmp_path)
    events = read.audit_events(registry=reg)
    edited = events[events.event == "approval"].iloc[0]
    reg.client.set_tag(
        edited.audit_run_id, model_tag("who"), "mallory"
    )  # as tests/integration/test_audit_chain.py edits one
    chain = read.audit_chain(registry=reg)
    assert chain["status"] == "broken" and chain["first_break"]["run_id"] == edited.audit_run_id
    for path in ("views/promotions.py", None):
        at = dashboard(reg, monkeypatch, path)
        red = [e for e in texts(at, "error") if e.startswith("**The audit trail was changed outside unmask.**")]
        assert len(red) == 1 and chain["first_break"]["text"] in red[0] and edited.audit_run_id in red[0], path
        assert not at.success
    assert read.audit_chain(registry=reg)["summary"] == chain["summary"]  # the pages wrote nothing


def test_an_empty_audit_trail_shows_grey_with_its_summary(tmp_path, monkeypatch):
    """A store an unmask wrote before registrations were audit entries (evidence_registered): models, no trail."""
    from registry import audit

    reg = fresh_registry(tmp_path)
    with monkeypatch.context() as older:
        older.setattr(audit, "append", lambda registry, event, open_intent=False: event)
        register_pair(reg)
    chain = read.audit_chain(registry=reg)
    assert chain["status"] == "empty"
    at = dashboard(reg, monkeypatch, "views/promotions.py")
    assert f":gray[{chain['summary']}]" in texts(at, "caption")
    assert not at.success and not [e for e in texts(at, "error") if "audit trail" in e]
    assert not [d for d in at.dataframe if "decision" in d.value.columns]
    assert any("No decisions yet" in m for m in texts(at, "markdown"))


def test_the_dossier_says_a_gate_report_is_unverified_and_unmask_report_refuses_a_flipped_one(
    reg, monkeypatch, tmp_path
):
    from dashboards.dossier.content import dossier_content

    _, v = register_pair(reg)
    judge(reg, "tiny-llada", v, "staging")
    judge(reg, "tiny-llada", v, "poc")
    reg.client.delete_model_version_tag("tiny-llada", v, model_tag("gates.poc.sha256"))
    content = dossier_content(reg, "tiny-llada", v)
    assert (content["gates"]["poc"]["integrity"], content["gates"]["staging"]["integrity"]) == (
        "unverified",
        "verified",
    )
    assert [x["text"] for x in content["limitations"] if x["kind"] == "gate report integrity"] == [
        "the poc gate report is unverified: written before gate reports were hashed (re-judge to hash it)"
    ]
    flip_gate_report(reg)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    done = CliRunner().invoke(
        cli_app("report"), ["report", "tiny-llada", "--out", str(tmp_path / "out"), "--no-pdf"], env={"COLUMNS": "400"}
    )
    assert done.exit_code == 2 and "Traceback" not in done.output, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: tiny-llada version {v}: gate report gates/staging.json")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
