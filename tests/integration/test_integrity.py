"""Integrity holes (issue 23): forged evidence is detected and named and moves nothing; an alias moved
outside unmask is reported and not acted on until reconciled; every verdict and move names its policy."""

from __future__ import annotations

import hashlib
import logging
import shutil

import pytest
from typer.testing import CliRunner

import registry.read as read
import registry.views as views
from gates.policy import POLICY_PATH, load_policy
from registry import (
    EvidenceTampered,
    PromotionRefused,
    alias_drift,
    evidence_integrity,
    judge,
    load_evidence,
    promote,
    rollback,
    stage_holder,
)
from registry.approvals import approval_of
from registry.integrity import DIGEST_PREFIX
from tests.support.forgery import artifact_file, findings, forge_records
from tests.support.gate_fixtures import OK, act_as, fresh_registry, paired_registry, register_pair, sign_all


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


def cli():
    """`unmask gates`, `promote` and `rollback` as the CLI registers them."""
    import typer

    from flows.commands import gates as gates_cmd
    from flows.commands import promote as promote_cmd

    app = typer.Typer()
    gates_cmd.register(app)
    promote_cmd.register(app)
    return app


# forged evidence ---------------------------------------------------------------------------------------
def test_registration_records_a_sha256_per_evidence_artifact_and_reads_verify_it(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    tags = reg.client.get_run(run_id).data.tags
    for path in ("evidence/evidence.json", "evidence/records.json", "evidence/model_card.md"):
        assert (
            tags[DIGEST_PREFIX + path]
            == hashlib.sha256(artifact_file(reg, "tiny-llada", v, path).read_bytes()).hexdigest()
        )
    assert evidence_integrity(reg, "tiny-llada", v)["status"] == "verified"


def test_an_edited_records_json_is_named_recorded_once_and_moves_nothing(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    sign_all(reg, "tiny-llada", v, "poc")
    expected, found = forge_records(reg)
    with pytest.raises(EvidenceTampered) as e:
        load_evidence(reg, "tiny-llada", v)
    message = str(e.value)
    assert "tiny-llada version 1" in message and "evidence/records.json" in message
    assert expected in message and found in message
    with pytest.raises(EvidenceTampered):
        judge(reg, "tiny-llada", v, "staging")
    with pytest.raises(EvidenceTampered):
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert stage_holder(reg, "poc") is None and "poc" not in reg.aliases_of("tiny-llada")
    assert approval_of(reg, "tiny-llada", v, "poc") is None  # no approval is recorded on forged evidence
    assert "unmask.gates.staging" not in reg.version_tags("tiny-llada", v)  # no verdict on it either
    recorded = findings(reg, "tampered")
    assert len(recorded) == 1  # judged twice, one finding
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    assert recorded.evidence.iloc[0] == {
        "kind": "tampered",
        "artifact": "evidence/records.json",
        "run_id": run_id,
        "expected": expected,
        "found": found,
    }
    assert (recorded.model.iloc[0], recorded.version.iloc[0]) == ("tiny-llada", v)


def test_a_forged_baseline_is_refused_too(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    forge_records(reg, "tiny-ar", "1")  # a forged baseline moves the speedup and relative-quality gates
    with pytest.raises(EvidenceTampered, match="tiny-ar version 1: evidence artifact evidence/records.json"):
        judge(reg, "tiny-llada", v, "production")


def test_cli_gates_and_promote_refuse_forged_evidence_with_one_line(reg, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("COLUMNS", "200")
    act_as("grace")  # who approves (--approver may only repeat who this keys folder acts as)
    register_pair(reg)
    forge_records(reg)
    app = cli()
    shown = CliRunner().invoke(app, ["gates", "tiny-llada", "--stage", "staging"])
    assert shown.exit_code == 2 and "Traceback" not in shown.output
    assert shown.output.startswith("error: tiny-llada version 1: evidence artifact evidence/records.json")
    assert "passed" not in shown.output
    moved = CliRunner().invoke(app, ["promote", "tiny-llada", "--to", "poc", "--approver", "grace", "--comment", OK])
    assert moved.exit_code == 2 and "evidence/records.json" in moved.output and "poc now points" not in moved.output


def test_evidence_registered_before_hashes_were_recorded_reads_as_unverified(tmp_path, monkeypatch):
    reg, v = paired_registry(tmp_path), "1"
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    digests = [k for k in reg.client.get_run(run_id).data.tags if k.startswith(DIGEST_PREFIX)]
    reg.client.delete_tag(run_id, digests[0])  # one hash stripped: that is tampering, not an old version
    assert evidence_integrity(reg, "tiny-llada", v)["status"] == "tampered"
    for key in digests[1:]:
        reg.client.delete_tag(run_id, key)  # no hash at all: registered before this check existed
    assert evidence_integrity(reg, "tiny-llada", v)["status"] == "unverified"
    assert load_evidence(reg, "tiny-llada", v).candidate == "tiny-llada"
    decision = judge(reg, "tiny-llada", v, "poc")
    assert decision.evidence["evidence_status"] == "unverified"
    # nothing passes on it (issue 48: records edited, hash tags deleted, read as "unverified", then promoted)
    assert decision.blockers[0].text.startswith(f"the evidence of tiny-llada v{v} is unverified: its run carries no")
    assert decision.outcome == "blocked" and decision.blocker_labels()[0] == "unverified evidence"
    assert decision.steps[0].command == "unmask run --model tiny-llada"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("COLUMNS", "200")
    shown = CliRunner().invoke(cli(), ["gates", "tiny-llada", "--stage", "poc"])
    assert shown.exit_code == 1 and "evidence unverified: registered before evidence hashes" in shown.output  # blocked
    assert "is unverified: its run carries no sha256" in shown.output
    sign_all(reg, "tiny-llada", v, "poc")
    with pytest.raises(PromotionRefused, match="is unverified: its run carries no sha256"):
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert reg.aliases_of("tiny-llada").get("poc") is None


def test_re_evaluating_replaces_forged_or_unverified_evidence_with_hashed_evidence(reg):
    from registry import register_or_reuse
    from tests.support.gate_fixtures import evidence

    _, v = register_pair(reg)
    forge_records(reg)
    assert register_or_reuse(reg, evidence()) == (v, False)  # not reused: registered afresh
    assert evidence_integrity(reg, "tiny-llada", v)["status"] == "verified"
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    for key in [k for k in reg.client.get_run(run_id).data.tags if k.startswith(DIGEST_PREFIX)]:
        reg.client.delete_tag(run_id, key)
    assert register_or_reuse(reg, evidence()) == (v, False)
    assert evidence_integrity(reg, "tiny-llada", v)["status"] == "verified"
    assert register_or_reuse(reg, evidence()) == (v, True)  # hashed and unchanged: reused as before


def test_the_nightly_records_forged_evidence_as_a_finding_and_re_evaluates_the_model(reg):
    from flows.nightly import watch_list

    register_pair(reg)
    forge_records(reg)
    watched = watch_list.fn(reg.tracking_uri)
    assert watched["sources"]["tiny-llada"] == "tiny-llada" and watched["last"]["tiny-llada"] == []
    assert watched["last"]["tiny-ar"]  # the untouched model is compared as before
    recorded = findings(reg, "tampered")
    assert list(recorded.who) == ["nightly"] and list(recorded.model) == ["tiny-llada"]


def test_the_dashboard_reads_show_a_forged_version_as_tampered_and_do_not_rank_or_plot_it(tmp_path):
    reg = paired_registry(tmp_path)
    forge_records(reg)
    board = views.integrity_board(reg).set_index("model")
    assert (
        board.loc["tiny-llada", "status"] == "tampered" and "evidence/records.json" in board.loc["tiny-llada", "detail"]
    )
    assert board.loc["tiny-ar", "status"] == "verified"
    assert set(views.quality_latency(reg).model) == {"tiny-ar"}
    assert "tiny-llada" not in set(read.scores("poc", registry=reg)["ranking"].get("candidate", []))
    assert "integrity_finding" not in set(read.audit_events(registry=reg).event)  # reading writes no finding


# an alias moved outside unmask ---------------------------------------------------------------------------------
def _poc_held_by_llada(reg):
    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    return v


def test_a_drifted_alias_is_reported_and_neither_rolled_back_nor_promoted_until_reconciled(reg, caplog):
    v = _poc_held_by_llada(reg)
    reg.client.set_registered_model_alias("tiny-ar", "poc", "1")  # behind unmask's back
    reg.client.delete_registered_model_alias("tiny-llada", "poc")
    drift = alias_drift(reg, "poc")
    assert str(drift).startswith(
        "alias poc drifted: the audit trail's last settled move left it on tiny-llada@1, "
        "the registry has it on tiny-ar@1"
    )
    with caplog.at_level(logging.WARNING, logger="unmask.registry"):
        assert stage_holder(reg, "poc") == ("tiny-ar", "1")  # readers show what is there, and say it drifted
    assert "alias poc drifted" in caplog.text
    assert views.drifted_aliases(reg) == {"poc": str(drift)}
    with pytest.raises(PromotionRefused, match="alias poc drifted"):
        rollback("poc", who="oncall", registry=reg)
    sign_all(reg, "tiny-ar", "1", "poc")
    with pytest.raises(PromotionRefused, match="alias poc drifted"):
        promote("tiny-llada", "poc", approver="grace", comment=OK, version=v, registry=reg)
    assert reg.holders("poc") == [("tiny-ar", "1")]  # nothing acted on the drifted alias
    assert len(findings(reg, "drift")) == 1
    assert list(read.audit_events(stage="poc", event="alias_move", registry=reg)["to"]) == ["tiny-llada@1"]

    back = rollback("poc", who="oncall", comment="poc was moved by hand", reconcile=True, registry=reg)
    assert (back.from_holder, back.to_holder) == (("tiny-ar", "1"), ("tiny-llada", "1"))
    assert reg.holders("poc") == [("tiny-llada", "1")] and alias_drift(reg, "poc") is None
    last = read.audit_events(stage="poc", event="alias_move", registry=reg).iloc[-1]
    assert (last["who"], last["evidence"]["kind"], last["status"]) == ("oncall", "reconcile", "FINISHED")
    assert rollback("poc", who="oncall", registry=reg).to_holder == ("tiny-ar", "1")  # reconciled: acts again


def test_an_alias_set_where_nobody_was_is_taken_off_by_reconcile(tmp_path):
    reg = paired_registry(tmp_path)
    reg.client.set_registered_model_alias("tiny-llada", "staging", "1")
    assert str(alias_drift(reg, "staging")).startswith(
        "alias staging drifted: the audit trail's last settled move "
        "left it on nobody, the registry has it on tiny-llada@1"
    )
    with pytest.raises(PromotionRefused, match="drifted"):
        rollback("staging", who="oncall", registry=reg)
    rollback("staging", who="oncall", reconcile=True, registry=reg)
    assert reg.holders("staging") == [] and alias_drift(reg, "staging") is None
    with pytest.raises(PromotionRefused, match="nothing to reconcile"):
        rollback("staging", who="oncall", reconcile=True, registry=reg)


def test_the_nightly_reports_drift_and_its_rollback_refuses_it(reg):
    from flows.nightly import watch_list

    _poc_held_by_llada(reg)
    reg.client.set_registered_model_alias("tiny-llada", "production", "1")
    watched = watch_list.fn(reg.tracking_uri)
    assert watched["drift"]["production"].startswith(
        "alias production drifted: the audit trail's last settled "
        "move left it on nobody, the registry has it on tiny-llada@1"
    )
    assert set(watched["drift"]) == {"production"} and len(findings(reg, "drift")) == 1
    with pytest.raises(PromotionRefused, match="alias production drifted"):
        rollback("production", who="nightly", registry=reg)
    assert reg.holders("production") == [("tiny-llada", "1")]


def test_cli_reports_drift_and_reconciles(reg, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("COLUMNS", "200")
    act_as("oncall")  # who reconciles (--by may only repeat it)
    _poc_held_by_llada(reg)
    reg.client.set_registered_model_alias("tiny-ar", "poc", "1")
    reg.client.delete_registered_model_alias("tiny-llada", "poc")
    app = cli()
    shown = CliRunner().invoke(app, ["gates", "tiny-llada", "--stage", "poc"])
    assert shown.exit_code == 1 and "warning: alias poc drifted" in shown.output  # blocked: no poc approval
    refused = CliRunner().invoke(app, ["rollback", "--stage", "poc"])
    assert refused.exit_code == 1 and "alias poc drifted" in refused.output
    fixed = CliRunner().invoke(app, ["rollback", "--stage", "poc", "--reconcile", "--by", "oncall"])
    assert fixed.exit_code == 0 and "poc reconciled: back on tiny-llada@1 (found on tiny-ar@1)" in fixed.output


# the policy behind a verdict ------------------------------------------------------------------------------------
def test_a_promotion_and_its_verdict_record_the_policy_path_sha256_and_thresholds(reg, tmp_path):
    relaxed = tmp_path / "relaxed.yaml"
    shutil.copy(POLICY_PATH, relaxed)
    with relaxed.open("a") as f:
        f.write("# relaxed for this test\n")
    sha = hashlib.sha256(relaxed.read_bytes()).hexdigest()
    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg, policy=load_policy(relaxed))
    move = read.audit_events(stage="poc", event="alias_move", registry=reg).iloc[-1]
    assert move["evidence"]["policy"] == {"path": str(relaxed.resolve()), "sha256": sha}
    report = read.gate_results("tiny-llada", v, "poc", registry=reg)
    assert move["evidence"]["thresholds"] == dict(zip(report.gate, report.threshold)) and len(report) == 11
    records = artifact_file(reg, "tiny-llada", v, "evidence/records.json").read_bytes()
    assert move["evidence"]["evidence_sha256"]["evidence/records.json"] == hashlib.sha256(records).hexdigest()
    tags = reg.version_tags("tiny-llada", v)
    assert (tags["unmask.gates.poc.policy"], tags["unmask.gates.poc.policy_sha256"]) == (str(relaxed.resolve()), sha)


def test_cli_promote_takes_policy_and_refusals_record_it_too(reg, monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("COLUMNS", "200")
    relaxed = tmp_path / "relaxed.yaml"
    shutil.copy(POLICY_PATH, relaxed)
    register_pair(reg)
    app = cli()
    refused = CliRunner().invoke(app, ["promote", "tiny-llada", "--to", "poc", "--policy", str(relaxed)])
    assert refused.exit_code == 1
    event = read.audit_events(event="promotion_refused", registry=reg).iloc[-1]
    assert event["evidence"]["policy"] == {
        "path": str(relaxed.resolve()),
        "sha256": hashlib.sha256(relaxed.read_bytes()).hexdigest(),
    }
    missing = CliRunner().invoke(app, ["promote", "tiny-llada", "--to", "poc", "--policy", str(tmp_path / "no.yaml")])
    assert missing.exit_code == 2 and "no.yaml: policy file not found" in missing.output


def test_the_dashboard_pages_show_the_forged_version_as_tampered_instead_of_crashing(reg, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    _poc_held_by_llada(reg)
    forge_records(reg)
    reg.client.set_registered_model_alias("tiny-ar", "staging", "1")  # and an alias moved by hand
    from tests.support.dashboard_pages import app_test

    at = app_test()
    at.run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert any("tiny-llada v1: evidence tampered." in e and "evidence/records.json" in e for e in errors), errors
    assert any(e.startswith("**staging drifted.** alias staging drifted") for e in errors), errors
    for path in ("views/candidate.py", "views/scores.py", "views/quality_latency.py", "views/promotions.py"):
        at.switch_page(path).run()
        assert not at.exception, (path, at.exception)
    at.switch_page("views/candidate.py").run()
    assert any("Evidence tampered." in e.value for e in at.error)


def test_the_same_drift_after_a_reconcile_is_a_new_finding(tmp_path):
    reg = paired_registry(tmp_path)
    for _ in range(2):
        reg.client.set_registered_model_alias("tiny-llada", "staging", "1")
        with pytest.raises(PromotionRefused):
            rollback("staging", who="oncall", registry=reg)
        rollback("staging", who="oncall", reconcile=True, registry=reg)
    assert len(findings(reg, "drift")) == 2


def test_the_nightly_regression_and_its_rollback_record_the_policy_behind_them(reg, tmp_path):
    from flows.nightly import ProductionVerdict, record_regression
    from registry.promotion import _move

    strict = tmp_path / "strict.yaml"
    shutil.copy(POLICY_PATH, strict)
    cited = {"path": str(strict.resolve()), "sha256": hashlib.sha256(strict.read_bytes()).hexdigest()}
    _, v = register_pair(reg)
    _move(reg, "production", None, ("tiny-llada", v), "test", "production held", {"kind": "promotion"})
    decision = judge(reg, "tiny-llada", v, "production", load_policy(strict))  # too slow: speedup fails
    outcome = record_regression.fn(ProductionVerdict("tiny-llada", v, decision), reg.tracking_uri, True, str(strict))
    assert outcome["rolled_back"] and outcome["move"]["evidence"]["policy"] == cited
    regression = read.audit_events(event="gate_evaluation", registry=reg).iloc[-1]
    assert regression["evidence"]["policy"] == cited
