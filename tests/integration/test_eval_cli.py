"""`unmask eval`: a sweep or a GSM8K-format task file in, a table and files out; bad input is exit 2."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from evals.store import load_records
from flows import cli
from tests.support.eval_fixtures import write_model


@pytest.fixture(scope="module")
def app():
    cli._register_all()
    return cli.app


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return str(write_model(root / "diff")), str(write_model(root / "ar", causal=True))


def run(app, *args):
    result = CliRunner().invoke(app, ["eval", *args], env={"COLUMNS": "200"})
    return result, result.output


# slow: first GX + matplotlib import and a plot: over 10 s on two busy cores
def test_sweep_prints_a_table_and_writes_files(app, model_dirs, tmp_path):
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "cli",
                "models": [*model_dirs, "tiny-dream"],  # Dream: the native adapter of issue 52
                "tasks": [{"task": "arith", "n": 2}],
                "base": {"gen_length": 8, "block_length": 4},
                "grid": {"steps": [4]},
                "measure": {"warmup": 0, "batch_size": 2},
            }
        )
    )
    out = tmp_path / "out"
    result, text = run(app, "--sweep", str(sweep), "--out", str(out), "--no-repro")
    assert result.exit_code == 0, text
    assert "eval records" in text and "diff" in text and "AR greedy" in text
    assert "license diff: permitted" in text
    records = load_records(out / "records.parquet")
    assert len(records) == 3 and all(r.valid for r in records)
    assert {r.candidate: r.kind for r in records}["tiny-dream"] == "masked-diffusion"
    assert (out / "records.csv").is_file() and (out / "quality-latency-arith.png").is_file()
    assert json.loads((out / "license.json").read_text())[0]["tier"] == "permitted"


def test_gsm8k_task_file_in_the_state_folder(app, model_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    tasks = tmp_path / "gsm.jsonl"
    tasks.write_text("\n".join(json.dumps({"question": f"{i}+1?", "answer": f"#### {i + 1}"}) for i in range(3)) + "\n")
    result, text = run(
        app,
        "--model",
        model_dirs[0],
        "--tasks",
        str(tasks),
        "--gen-length",
        "8",
        "--steps",
        "4",
        "--no-repro",
        "--no-plot",
    )
    assert result.exit_code == 0, text
    (folder,) = (tmp_path / "home" / "evals").iterdir()
    (record,) = load_records(folder)
    assert record.task == "gsm8k" and record.n_items == 3 and record.gen_length == 8


def test_bad_sweep_is_exit_2_naming_the_key(app, tmp_path):
    sweep = tmp_path / "bad.yaml"
    sweep.write_text("models: [x]\ntasks: [{task: arith}]\ngrid: {stepz: [4]}\n")
    result, text = run(app, "--sweep", str(sweep))
    assert result.exit_code == 2 and "grid.stepz" in text


def test_bad_task_file_is_exit_2_naming_the_line(app, model_dirs, tmp_path):
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "four"}\n')
    result, text = run(app, "--model", model_dirs[0], "--tasks", str(tasks), "--no-repro")
    assert result.exit_code == 2 and "bad.jsonl:2" in text and "answer" in text
    missing, text = run(app, "--model", model_dirs[0], "--tasks", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 2 and "not found" in text
