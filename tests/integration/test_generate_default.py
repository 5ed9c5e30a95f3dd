"""`unmask generate` decodes at the model's operating point by default (the gate-chosen config recorded with its
latest registered version, else the catalog's decoding defaults) and says which; `--exact` is the reference decode,
one position per step. Real bundled tiny-llada, real SQLite registry."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import evidence, fresh_registry, record, register_pair

PROMPT = "What is 3+4?"


def shown(output: str, row: str) -> str:
    found = re.search(rf"^\s*{row}\s+(.*)$", output, re.M)
    assert found, output
    return found.group(1).strip()


def test_generate_uses_the_recorded_operating_point_and_exact_is_one_position_per_step(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = CliRunner().invoke
    app = cli_app("generate")
    plain = run(app, ["generate", PROMPT], env={"COLUMNS": "200"})
    assert plain.exit_code == 0, plain.output
    assert shown(plain.output, "decoded with").startswith("the catalog's decoding defaults"), plain.output
    assert not (tmp_path / "empty" / "mlflow" / "mlflow.db").exists()  # generate never creates a store

    reg = fresh_registry(tmp_path)
    point = {"steps": 8, "gen_length": 32, "block_length": 16}
    register_pair(
        reg,
        evidence(
            "tiny-llada", [record("tiny-llada", "arith", config=point), record("tiny-llada", "sort", config=point)]
        ),
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    fast = run(app, ["generate", PROMPT], env={"COLUMNS": "200"})
    assert fast.exit_code == 0, fast.output
    assert shown(fast.output, "decoded with").startswith("operating point of tiny-llada v1"), fast.output
    assert shown(fast.output, "NFE") == "8", fast.output
    exact = run(app, ["generate", PROMPT, "--exact"], env={"COLUMNS": "200"})
    assert exact.exit_code == 0 and shown(exact.output, "decoded with").startswith("exact"), exact.output
    assert shown(exact.output, "NFE") == "64", exact.output  # gen_length 64, one committed position per step
    longer = run(app, ["generate", PROMPT, "--gen-length", "64"], env={"COLUMNS": "200"})
    assert shown(longer.output, "NFE") == "16", longer.output  # the operating point's pace: 8 steps per 32
