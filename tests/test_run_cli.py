"""`unmask run`: the scorecard and where to look next; a second run reuses every measured point."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from flow_fixtures import CANDIDATE, FALLBACK, cli_app, seed_registry, tiny_models, write_sweep


def test_unmask_run_prints_the_scorecard_and_the_second_run_reuses_the_cache(prefect_harness, tmp_path, monkeypatch):
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]])
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    app = cli_app("run")
    first = CliRunner().invoke(app, ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    assert first.exit_code == 0, first.output
    assert "scorecard" in first.output and CANDIDATE in first.output and FALLBACK in first.output
    assert "0 of 3 sweep points reused from cache" in first.output
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path / 'home'}" in first.output.replace("\n", "")
    assert "unmask dashboard" in first.output
    assert re.search(r"tooling_maturity: checklist item 'tooling-maturity'", first.output)

    second = CliRunner().invoke(app, ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    assert second.exit_code == 0, second.output
    assert "3 of 3 sweep points reused from cache" in second.output


def test_a_bad_sweep_is_a_clear_error_before_anything_runs(tmp_path):
    (tmp_path / "bad.yaml").write_text("models: [x]\ntasks: [{task: arith}]\ngrid: {stepz: [2]}\n")
    result = CliRunner().invoke(cli_app("run"), ["run", "--sweep", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 2 and "grid.stepz" in result.output


@pytest.mark.slow
def test_unmask_run_resolves_the_bundled_models_by_id(prefect_harness, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    sweep = write_sweep(tmp_path / "bundled.yaml", ["tiny-llada", "tiny-ar"], steps=(8,), n=4)  # the ids, not folders
    result = CliRunner().invoke(cli_app("run"), ["run", "--sweep", sweep, "--no-repro"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "tiny-llada" in result.output and "tiny-ar" in result.output and "scorecard" in result.output


def test_unmask_approve_with_no_promotion_waiting_records_the_approval_in_the_registry(prefect_harness, tmp_path,
                                                                                      monkeypatch):
    from registry.promotion import approval_of
    from tests.gate_fixtures import fresh_registry, register_pair

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    registry = fresh_registry(tmp_path)  # the state folder's own embedded store
    _, version = register_pair(registry)
    as_grace = {"COLUMNS": "200", "LOGNAME": "grace"}  # the OS user is the identity on the embedded store
    result = CliRunner().invoke(cli_app("approve"), ["approve", "tiny-llada", "poc", "--by", "grace",
                                                     "--comment", "PoC evidence reviewed"], env=as_grace)
    assert result.exit_code == 0, result.output
    assert "no promotion of tiny-llada to poc is waiting" in result.output
    assert approval_of(registry, "tiny-llada", version, "poc").by == "grace"
    declined = CliRunner().invoke(cli_app("approve"), ["approve", "tiny-llada", "poc", "--reject", "-c", "not yet"],
                                  env=as_grace)
    assert declined.exit_code == 0 and "declined by grace" in declined.output  # recorded, waiting flow or not
    assert approval_of(registry, "tiny-llada", version, "poc").status == "void"


def test_request_promotion_is_blocked_before_any_wait_while_gates_or_checklist_fail(prefect_harness, tmp_path,
                                                                                   monkeypatch):
    from registry import stage_holder
    from tests.gate_fixtures import fresh_registry, register_pair

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    registry = fresh_registry(tmp_path)
    register_pair(registry)
    result = CliRunner().invoke(cli_app("approve"), ["request-promotion", "tiny-llada", "poc", "--timeout", "5"],
                                env={"COLUMNS": "200"})
    assert result.exit_code == 1 and "not promoted" in result.output and "is blocked" in result.output
    assert "tooling-maturity" in result.output  # the unsigned checklist item, named
    assert stage_holder(registry, "poc") is None
