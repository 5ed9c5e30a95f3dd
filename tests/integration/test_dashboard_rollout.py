"""The Rollout page under Streamlit's AppTest, on a real SQLite registry holding rollouts the way the controller
records them (registry/rollouts.py, the audit trail): arms and weights, a Plotly series per arm whose points are
the analyses' numbers, each step's verdict, a paused rollout waiting for a human, a rollback with its audit entry."""

from __future__ import annotations

import json

import pytest

from gates.canary import Observation, analyse
from registry import audit
from registry.rollouts import log_analysis, set_rollout_status, set_rollout_weight, start_rollout_run
from registry.store import now_iso
from tests.support.dashboard_pages import POLICY_ROLLOUT as POLICY
from tests.support.dashboard_pages import app_test, interval, rolled_back_registry


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(tmp_path_factory.mktemp("rollout-board"))
    register_pair(reg)
    # route "latency": passes 5%, fails 25% (slow, erroring), rolled back and audited
    failed = start_rollout_run(
        reg, "latency-1", "tiny-llada", "2", "latency", "production", "staging", "production", POLICY.to_dict()
    )
    passed = analyse(interval(0.1, 0, n=100), "staging", "production", POLICY).to_dict()  # enough to pass
    breach = analyse(interval(0.9, 3), "staging", "production", POLICY).to_dict()
    log_analysis(reg, failed, "latency-1", 0, 5, passed)
    log_analysis(reg, failed, "latency-1", 1, 25, breach)
    entry = audit.append(
        reg,
        audit.AuditEvent(
            "rollout_rollback",
            "ada",
            now_iso(),
            "production",
            "tiny-llada",
            "2",
            comment="rollout latency-1: p95 over its bound",
            evidence={"rollout": "latency-1", "run_id": failed},
        ),
    )
    set_rollout_status(reg, failed, "rolled_back", breach["reason"])
    # route "default": too little traffic at 5%, paused
    paused = start_rollout_run(
        reg, "default-1", "tiny-llada", "2", "default", "production", "staging", "production", POLICY.to_dict()
    )
    quiet = analyse(interval(0.1, 0, n=2), "staging", "production", POLICY).to_dict()
    log_analysis(reg, paused, "default-1", 0, 5, quiet)
    set_rollout_status(reg, paused, "paused", quiet["reason"])
    # route "chat": running, passed 25%, the controller has just moved it to 50%
    running = start_rollout_run(
        reg, "chat-1", "tiny-llada", "2", "chat", "production", "staging", "production", POLICY.to_dict()
    )
    probes = [Observation("staging", shadow=True, correct=i < 40) for i in range(50)] + [
        Observation("production", shadow=True, correct=i < 45) for i in range(50)
    ]
    probed = analyse(interval(0.1, 0, n=100) + probes, "staging", "production", POLICY).to_dict()
    log_analysis(reg, running, "chat-1", 1, 25, probed)
    set_rollout_weight(reg, running, 50)
    return reg, {"passed": passed, "breach": breach, "quiet": quiet, "entry": entry, "probed": probed}


@pytest.fixture
def at(filled, monkeypatch):
    reg, _ = filled
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = app_test()
    app.run()
    app.switch_page("views/rollout.py").run()
    assert not app.exception, app.exception
    return app


def test_the_page_shows_each_arm_per_analysis_as_the_registry_holds_it(at, filled):
    _, made = filled
    assert made["passed"]["verdict"] == "pass" and made["breach"]["verdict"] == "fail"
    at.selectbox(key="rollout_route").set_value("latency").run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"status": "rolled_back", "candidate · staging": "0%", "baseline · production": "100%"}
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(figures) == 2
    p95 = {t["name"]: t["y"] for t in figures[0]["data"]}
    assert p95 == {
        "staging (candidate)": [made["passed"]["arms"]["staging"]["p95_s"], made["breach"]["arms"]["staging"]["p95_s"]],
        "production (baseline)": [
            made["passed"]["arms"]["production"]["p95_s"],
            made["breach"]["arms"]["production"]["p95_s"],
        ],
    }
    errors = {t["name"]: t["y"] for t in figures[1]["data"]}
    assert errors["staging (candidate)"] == [0.0, 0.3]
    # the marker colours are the steps' verdicts
    assert figures[0]["data"][0]["marker"]["color"] == ["#1a7f37", "#cf222e"]
    [table, events] = at.dataframe
    assert list(table.value.verdict) == ["pass", "fail"] and list(table.value.weight) == [5, 25]
    assert table.value.reason.iloc[1] == made["breach"]["reason"]
    assert list(events.value.event) == ["rollout_rollback"]


def test_a_rollback_is_red_with_its_audit_entry_and_a_paused_rollout_names_resume_and_abort(at, filled):
    _, made = filled
    [error] = [e.value for e in at.error]
    assert "latency-1" in error and f"audit entry {made['entry'].seq}" in error and made["entry"].run_id in error
    # the advice fits an emergency rollback: nothing moved, so nothing to put back; investigate, new evidence
    assert "Nothing to undo" in error and "Investigate the failed analysis" in error and "new evidence" in error
    assert "new approvals" in error and "unmask rollback" not in error
    [warning] = [w.value for w in at.warning]
    assert "default-1" in warning and "paused at 5%" in warning and made["quiet"]["reason"] in warning
    assert "unmask rollout resume default-1" in warning and "unmask rollout abort default-1" in warning


def test_without_rollouts_the_page_says_how_to_start_one(tmp_path, monkeypatch):
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    register_pair(reg)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = app_test()
    app.run()
    app.switch_page("views/rollout.py").run()
    assert not app.exception
    assert any("unmask rollout start" in i.value for i in app.info)


def test_a_running_rollout_shows_the_weight_the_controller_set_last(at, filled):
    at.selectbox(key="rollout_route").set_value("chat").run()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics == {"status": "running", "candidate · staging": "50%", "baseline · production": "50%"}
    # the probe accuracy per arm, charted and in the table, and each step's confidence
    _, made = filled
    figures = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    accuracy = {t["name"]: t["y"] for t in figures[-1]["data"]}
    assert len(figures) == 3 and accuracy == {"staging (candidate)": [0.8], "production (baseline)": [0.9]}
    table = at.dataframe[0]  # no audit entries for a running rollout here: one table
    assert set(table.value["probe accuracy"].iloc[0].split(", ")) == {"staging 0.800 (50)", "production 0.900 (50)"}
    assert table.value.confidence.iloc[0] == pytest.approx(made["probed"]["confidence"])
    assert 0.96 < made["probed"]["confidence"] < 0.97  # the first look's share of a 95% rollout


def test_the_verdict_page_shows_a_failed_rollout_standing_against_the_version(tmp_path, monkeypatch, team_keys):
    reg = rolled_back_registry(tmp_path)
    from registry.views import failed_rollouts

    [finding] = failed_rollouts(reg).itertuples()
    assert finding.rollout == "default-9" and finding.stands and finding.status == "rolled_back"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = app_test()
    app.run()
    app.switch_page("views/verdict.py").run()
    assert not app.exception, app.exception
    shown = [e.value for e in app.error if "default-9" in e.value]
    assert shown and "may not be promoted" in shown[0] and "new approvals" in shown[0], [e.value for e in app.error]
    # under the red banner, the decision table says the same: blocked, the rollout first (never "pass")
    table = app.dataframe[0].value
    row = table[(table.candidate == "tiny-llada v1") & (table.stage == "production")].iloc[0]
    assert row.decision.startswith("blocked") and row["what blocks it"].startswith("rollout default-9"), row
    app.switch_page("views/rollout.py").run()
    assert not app.exception, app.exception
    said = next(m.value for m in app.markdown if m.value.startswith("**Decision on "))
    assert said.startswith("**Decision on tiny-llada v1 at production: blocked** (rollout default-9"), said
