"""`unmask run` (the Prefect flow) at 80 columns: the scorecard's tables fit and `next` names the sign-off."""

from __future__ import annotations

from typer.testing import CliRunner

from tests.support.flow_fixtures import (
    CANDIDATE,
    FALLBACK,
    cli_app,
    seed_registry,
    tiny_models,
    write_policy,
    write_sweep,
)
from tests.support.tables import NARROW, fits_80


def test_run_at_80_columns_then_next_names_the_sign_off(prefect_harness, tmp_path, monkeypatch):
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]], steps=(8,))
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    policy = write_policy(tmp_path / "policy.yaml")  # judged at the tiny sweep's gen_length: gates pass
    result = CliRunner().invoke(cli_app("run"), ["run", "--sweep", sweep, "--policy", policy], env=NARROW)
    assert result.exit_code == 0, result.output
    text = result.output[result.output.index("scorecard") :]
    fits_80(
        text.split("done in")[0],
        ["candidate", "qualifies for", "gates passed", "failed gates: reasons", "score (poc)"],
        [CANDIDATE, FALLBACK],
    )
    lines = [line.strip() for line in text.splitlines()]
    at = lines.index(f"next for {CANDIDATE} v1 -> poc:")
    assert lines[at + 1] == (
        f'unmask sign-off {CANDIDATE} --stage poc --item fallback-plan --comment "what was checked"'
    ), text
    assert "unmask approve MODEL STAGE" not in text  # the old hint, whatever the blocker
    assert f"next for {FALLBACK}" not in text  # the fallback is not promoted through the stages
