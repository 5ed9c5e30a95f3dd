"""The registry on the embedded SQLite store: runs per record, versions per revision, aliases, read API."""

from __future__ import annotations

import json
import socket

import pytest

import registry.read as read
from registry import Registry, RegistryUnavailable, load_evidence, log_record, register_evidence
from registry.approvals import sign_off
from registry.connection import default_tracking_uri
from registry.judging import judge
from tests.support.gate_fixtures import evidence, fresh_registry, paired_registry, record, register_pair


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


def test_default_store_is_sqlite_under_the_state_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    assert default_tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    from registry import resolve_tracking_uri

    assert resolve_tracking_uri() == "http://127.0.0.1:5999"


def test_one_run_per_record_with_config_params_metrics_identity_tags_and_artifacts(reg, tmp_path):
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"steps": [16, 32, 64], "accuracy": [0.6, 0.7, 0.72]}))
    gx = tmp_path / "gx"
    gx.mkdir()
    (gx / "result.json").write_text(json.dumps({"success": True}))
    logged = log_record(reg, record(), {"curves": curve, "gx": gx})
    run = reg.client.get_run(logged.run_id)
    assert run.data.params["steps"] == "32" and run.data.params["remasking"] == "low_confidence"
    assert run.data.metrics["accuracy"] == 0.72 and run.data.metrics["latency_p95_s"] == 0.18
    tags = run.data.tags
    assert tags["unmask.model"] == "tiny-llada" and tags["unmask.revision"] == "local"
    assert tags["unmask.weights_sha256"] == record().weights_sha256 and tags["unmask.record_id"] == record().record_id
    names = {a.path for a in reg.client.list_artifacts(logged.run_id)}
    assert names == {"record.json", "curves", "gx"}
    assert reg.load_json_artifact(logged.run_id, "record.json")["run_id"] == logged.run_id


def test_a_version_per_evaluated_revision_with_candidate_and_fallback_aliases(reg):
    v_ar, v1 = register_pair(reg)
    assert (v_ar, v1) == ("1", "1")
    assert reg.aliases_of("tiny-llada") == {"candidate": "1"} and reg.aliases_of("tiny-ar") == {"fallback": "1"}
    mv = reg.client.get_model_version("tiny-llada", "1")
    assert mv.run_id == mv.tags["unmask.evidence_run"] and mv.source.endswith("/evidence")
    assert mv.current_stage == "None"  # deprecated stages stay unused
    first_run = mv.tags["unmask.evidence_run"]
    # the same weights re-evaluated: same version, evidence re-pointed
    again, _ = register_evidence(reg, evidence())
    assert again == "1" and reg.version_tags("tiny-llada", "1")["unmask.evidence_run"] != first_run
    # new weights: a new version, and `candidate` follows it
    newer = evidence(
        records=[record(weights_sha256="f" * 64), record(task="sort", weights_sha256="f" * 64)],
        weights_sha256="f" * 64,
        model_revision="abc123",
    )
    v2, _ = register_evidence(reg, newer)
    assert v2 == "2" and reg.aliases_of("tiny-llada")["candidate"] == "2"


def test_evidence_round_trips_through_mlflow(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    back = load_evidence(reg, "tiny-llada", v)
    original = evidence()
    assert [r.record_id for r in back.records] == [r.record_id for r in original.records]
    assert all(r.run_id for r in back.records)
    assert back.license == original.license and back.reproducibility == original.reproducibility
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    paths = {a.path for a in reg.client.list_artifacts(run_id, "evidence")}
    assert paths == {"evidence/evidence.json", "evidence/records.json", "evidence/model_card.md"}
    children = reg.client.search_runs(
        [reg.experiment_id("unmask-evaluations")], f"tags.`mlflow.parentRunId` = '{run_id}'"
    )
    kinds = sorted(r.data.tags["unmask.kind"] for r in children)
    assert kinds == ["record", "record", "serving"]  # one run per record, and the evidence's serving record
    assert [(r.version, r.concurrency, r.latency_p95_s) for r in back.serving] == [(v, 16, 0.9)]


def test_judging_stores_a_gate_report_as_markdown_json_and_version_tags(tmp_path):
    reg, v = paired_registry(tmp_path), "1"
    decision = judge(reg, "tiny-llada", v, "poc")
    assert not decision.allowed
    tags = reg.version_tags("tiny-llada", v)
    assert tags["unmask.gates.poc"] == "failed" and tags["unmask.gates.poc.failed"] == "tooling_maturity"
    run_id = tags["unmask.evidence_run"]
    assert {a.path for a in reg.client.list_artifacts(run_id, "gates")} == {"gates/poc.json", "gates/poc.md"}
    table = read.gate_results("tiny-llada", registry=reg)
    assert len(table) == 11 and set(table["stage"]) == {"poc"}
    assert table.set_index("gate").loc["speedup", "value"] == 0.5
    assert table["record_id"].notna().all() and table["run_id"].notna().all()
    items = read.checklist("tiny-llada", v, "poc", registry=reg)
    assert set(items[~items.done]["item"]) == {"fallback-plan", "tooling-maturity"}


def test_read_api_returns_plain_frames_and_dicts(reg):
    empty = read.list_candidates(reg)
    assert empty.empty and list(empty.columns)[:2] == ["model", "role"]
    assert read.audit_events(registry=reg).empty and read.aliases(reg)["production"] is None
    _, v = register_pair(reg)
    sign_off(reg, "tiny-llada", v, "poc", "tooling-maturity", "ada", "ONNX export and CPU serving reviewed")
    cands = read.list_candidates(reg).set_index("model")
    assert cands.loc["tiny-ar", "role"] == "fallback" and cands.loc["tiny-llada", "aliases"] == {"candidate": "1"}
    versions = read.list_versions(registry=reg)
    assert list(versions["model"]) == ["tiny-ar", "tiny-llada"]
    aliases = read.aliases(reg)
    assert aliases["fallback"] == {"model": "tiny-ar", "version": "1"} and aliases["poc"] is None
    recs = read.records("tiny-llada", registry=reg)
    assert len(recs) == 2 and set(recs["task"]) == {"arith", "sort"} and recs["run_id"].notna().all()
    events = read.audit_events(registry=reg)
    assert events[["event", "model"]].values.tolist() == [
        ["evidence_registered", "tiny-ar"],
        ["evidence_registered", "tiny-llada"],
        ["signoff", "tiny-llada"],
    ]
    registered, signed = events.iloc[1], events.iloc[2]
    assert registered["evidence"]["evidence_run"] == reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    assert registered["version"] == v and registered["stage"] == "candidate"
    assert signed["who"] == "ada" and signed["evidence"]["item"] == "tooling-maturity"
    assert signed["evidence"]["actor"]["by"] == "ada"
    scored = read.scores("poc", registry=reg)
    # both rank on their measured evidence; tiny-ar lacks its tooling sign-off, so it is not yet promotable
    ranking = scored["ranking"].set_index("candidate")
    assert set(ranking.index) == {"tiny-llada", "tiny-ar"}
    assert ranking.loc["tiny-llada", "open_signoffs"] == "" and ranking.loc["tiny-ar", "open_signoffs"] != ""
    assert len(scored["sensitivity"]) == 8
    assert read.version_status("tiny-llada", v, registry=reg)["signoffs"]["poc"]["tooling-maturity"]["by"] == "ada"


def test_exactly_equal_evidence_is_reused_and_any_judged_difference_registers_again(reg):
    from registry import approve, register_or_reuse

    assert register_or_reuse(reg, evidence()) == ("1", False)
    first = reg.version_tags("tiny-llada", "1")
    approve(reg, "tiny-llada", "1", "poc", "grace", "evidence reviewed")
    newer = evidence(
        records=[record(weights_sha256="f" * 64), record(task="sort", weights_sha256="f" * 64)],
        weights_sha256="f" * 64,
        model_revision="abc123",
    )
    assert register_or_reuse(reg, newer) == ("2", False) and reg.aliases_of("tiny-llada")["candidate"] == "2"
    # the old weights measured again with the same results: nothing is logged, `candidate` comes back
    assert register_or_reuse(reg, evidence()) == ("1", True) and reg.aliases_of("tiny-llada")["candidate"] == "1"
    kept = reg.version_tags("tiny-llada", "1")
    assert (kept["unmask.evidence_run"], kept["unmask.evaluated_at"]) == (
        first["unmask.evidence_run"],
        first["unmask.evaluated_at"],
    )
    assert not read.version_status("tiny-llada", "1", registry=reg)["approvals"]["poc"]["stale"]
    # one output that differs is other evidence: registered afresh on the same version, the approval is stale
    changed = evidence(records=[record(output_hash="0" * 64), record(task="sort")])
    assert register_or_reuse(reg, changed) == ("1", False)
    assert reg.version_tags("tiny-llada", "1")["unmask.evidence_run"] != first["unmask.evidence_run"]
    assert read.version_status("tiny-llada", "1", registry=reg)["approvals"]["poc"]["stale"]


def test_sign_off_accepts_only_manual_items_with_who_and_comment(reg):
    from registry import RegistryError

    _, v = register_pair(reg)
    with pytest.raises(RegistryError, match="no manual item 'license-tier'"):
        sign_off(reg, "tiny-llada", v, "poc", "license-tier", "ada", "looks fine")
    with pytest.raises(RegistryError, match="needs who and a comment"):
        sign_off(reg, "tiny-llada", v, "poc", "fallback-plan", "ada", " ")


def test_an_unreachable_server_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RegistryUnavailable, match=rf"MLflow server at http://127.0.0.1:{port} is unreachable"):
        Registry(f"http://127.0.0.1:{port}")
