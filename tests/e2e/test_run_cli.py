"""`unmask run`: the scorecard and where to look next; a second run reuses every measured point."""

from __future__ import annotations

import re
from collections import Counter

from typer.testing import CliRunner

import registry.judging
from tests.support.flow_fixtures import CANDIDATE, FALLBACK, cli_app, seed_registry, tiny_models, write_sweep


def test_unmask_run_prints_the_scorecard_and_the_second_run_reuses_the_cache(prefect_harness, tmp_path, monkeypatch):
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]])
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    app = cli_app("run")
    judged = Counter()
    decide = registry.judging.decide

    def counting(evidence, policy, stage, *args, **kwargs):
        judged[(evidence.candidate, stage)] += 1
        return decide(evidence, policy, stage, *args, **kwargs)

    monkeypatch.setattr(registry.judging, "decide", counting)
    first = CliRunner().invoke(app, ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    # each model judged once per stage: the flow's decision is what the table and the next steps render
    assert set(judged.values()) == {1} and len(judged) == 2 * 3, judged
    table = first.output.split("decision", 1)[1].split("scorecard", 1)[0]
    rows = re.findall(rf"│ {CANDIDATE} v1 .*│ (adopt|blocked|inconclusive) .*\n│ (poc|staging|production) ", table)
    assert [stage for _, stage in rows] == ["poc", "staging", "production"], table  # the decision per stage
    assert "scorecard" in first.output and CANDIDATE in first.output and FALLBACK in first.output
    assert "0 of 3 sweep points reused from cache" in first.output
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'home'}" in first.output.replace("\n", "")
    assert "unmask dashboard" in first.output
    assert re.search(r"tooling_maturity: checklist item 'tooling-maturity'", first.output)

    second = CliRunner().invoke(app, ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    assert second.exit_code == 0, second.output
    assert "3 of 3 sweep points reused from cache" in second.output


def test_the_scorecard_shows_what_the_evidence_cannot_judge_yet_and_how_many_items_would():
    """The default sweep's 16 items a task: staging and production are inconclusive on data validity, not failed."""
    from rich.console import Console

    from flows.commands.run import scorecard_table
    from flows.review import scorecard_row
    from gates import STAGES, load_policy
    from gates.decision import decide
    from gates.stages import qualified_stage
    from tests.support.gate_fixtures import evidence, record

    thin = evidence(records=[record(n_items=16), record(task="infill", n_items=16)])
    base = {"fallback": evidence("tiny-ar"), "production": None}
    verdicts = {stage: decide(thin, load_policy(), stage, base, {}, None, set()) for stage in STAGES}
    outcome = {
        "candidate": "tiny-llada",
        "role": "candidate",
        "version": "1",
        "qualified": qualified_stage(verdicts),
        "verdicts": {stage: v.to_dict() for stage, v in verdicts.items()},
        "failures": [],
        "cached": 0,
        "points": 2,
        "mlflow_run": "",
    }
    row = scorecard_row(outcome, {})
    assert row["judged_at"] == "poc" and row["failed"] == 1 and row["open"] == 0  # only tooling_maturity fails at poc
    assert row["inconclusive"] == [
        "staging data_validity: needs 34 more items on arith (50 per task)",
        "production data_validity: needs 84 more items on arith (100 per task)",
    ]
    console = Console(width=200, record=True)
    console.print(scorecard_table([row], "poc"))
    text = console.export_text()
    assert "inconclusive staging data_validity: needs 34 more items on arith (50 per task)" in text
    assert "10/11 at poc" in text


def test_run_items_must_be_positive_and_raise_every_task_of_the_sweep(tmp_path, monkeypatch):
    from evals.sweep import load_sweep, with_items

    result = CliRunner().invoke(cli_app("run"), ["run", "--items", "0"])
    assert result.exit_code == 2 and "--items" in result.output
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    sweep = write_sweep(tmp_path / "tiny.yaml", ["tiny-llada", "tiny-ar"], n=3)  # models a sweep may name
    raised = with_items(sweep, lambda task: 50)
    assert [t.n for t in load_sweep(raised).tasks] == [50] and raised.startswith(str(tmp_path / "home" / "sweeps"))
    assert with_items(raised, lambda task: 20) == raised  # enough already: the file as it is


def test_a_bad_sweep_is_a_clear_error_before_anything_runs(tmp_path):
    (tmp_path / "bad.yaml").write_text("models: [x]\ntasks: [{task: arith}]\ngrid: {stepz: [2]}\n")
    result = CliRunner().invoke(cli_app("run"), ["run", "--sweep", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 2 and "grid.stepz" in result.output


def test_unmask_run_resolves_the_bundled_models_by_id(prefect_harness, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    sweep = write_sweep(tmp_path / "bundled.yaml", ["tiny-llada", "tiny-ar"], steps=(8,), n=4)  # the ids, not folders
    result = CliRunner().invoke(cli_app("run"), ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "tiny-llada" in result.output and "tiny-ar" in result.output and "scorecard" in result.output


def test_unmask_approve_with_no_promotion_waiting_records_the_approval_in_the_registry(
    prefect_harness, tmp_path, monkeypatch
):
    from registry.approvals import approval_of
    from tests.support.gate_fixtures import act_as, fresh_registry, register_pair

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    registry = fresh_registry(tmp_path)  # the state folder's own embedded store
    _, version = register_pair(registry)
    act_as("grace")  # grace's own keys folder: who she is on the embedded store
    as_grace = {"COLUMNS": "200"}
    result = CliRunner().invoke(
        cli_app("approve"),
        ["approve", "tiny-llada", "poc", "--by", "grace", "--comment", "PoC evidence reviewed"],
        env=as_grace,
    )
    assert result.exit_code == 0, result.output
    assert "no promotion of tiny-llada to poc is waiting" in result.output
    assert approval_of(registry, "tiny-llada", version, "poc").by == "grace"
    declined = CliRunner().invoke(
        cli_app("approve"), ["approve", "tiny-llada", "poc", "--reject", "-c", "not yet"], env=as_grace
    )
    assert declined.exit_code == 0 and "declined by grace" in declined.output  # recorded, waiting flow or not
    assert approval_of(registry, "tiny-llada", version, "poc").status == "void"


def test_request_promotion_is_blocked_before_any_wait_while_gates_or_checklist_fail(
    prefect_harness, tmp_path, monkeypatch
):
    from registry import stage_holder
    from tests.support.gate_fixtures import fresh_registry, register_pair

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    registry = fresh_registry(tmp_path)
    register_pair(registry)
    result = CliRunner().invoke(
        cli_app("approve"), ["request-promotion", "tiny-llada", "poc", "--timeout", "5"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1 and "not promoted" in result.output and "is blocked" in result.output
    assert "tooling-maturity" in result.output  # the unsigned checklist item, named
    assert stage_holder(registry, "poc") is None
