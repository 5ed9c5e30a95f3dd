"""An `api` catalog entry measured by `unmask eval` at the text level, against a second `unmask serve` on
loopback standing in for the remote engine (a real uvicorn server, the real `openai` client, real GX validation)."""

from __future__ import annotations

import json

import openai
import pytest
import yaml

from tests.support.serving_fixtures import running_server, settings_for, shared_serving_registry

pytestmark = pytest.mark.timeout(300)
KEY_ENV = "UNMASK_TEST_ENGINE_KEY"


@pytest.fixture(scope="module")
def engine():
    with running_server(settings_for(shared_serving_registry().tracking_uri, names=("production",))) as running:
        yield running


def write_catalog(folder, base_url: str, key_env: str = KEY_ENV):
    entry = {
        "id": "loopback-engine",
        "family": "llada",
        "kind": "api",
        "role": "candidate",
        "source": base_url,
        "api_model": "production",
        "api_key_env": key_env,
        "license": "other",
        "license_name": "test engine terms",
        "license_link": "https://example.com/terms",
        "adapter": "api",
    }
    path = folder / "catalog.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry]}))
    return path


def write_sweep(folder, n: int = 4, gen_length: int = 16):
    path = folder / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "api",
                "models": ["loopback-engine"],
                "tasks": [{"task": "arith", "split": "test", "n": n, "seed": 0}],
                "base": {"gen_length": gen_length, "block_length": gen_length, "temperature": 0.0},
                "grid": {"steps": [8, 16]},
                "measure": {"warmup": 0, "batch_size": 1},
            }
        )
    )
    return path


def _eval(*args):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    return CliRunner().invoke(cli_app("eval"), ["eval", *args])


def test_an_api_entry_is_measured_at_the_text_level_with_token_metrics_not_applicable(engine, tmp_path, monkeypatch):
    from evals.evaluate import accuracy_fields, load_task
    from evals.records import EvalRecord

    monkeypatch.setenv("UNMASK_CATALOG", str(write_catalog(tmp_path, engine.base_url + "/v1")))
    monkeypatch.setenv(KEY_ENV, "sk-test")
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "out"
    result = _eval("--sweep", str(write_sweep(tmp_path)), "--out", str(out), "--no-plot")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 1  # an API reads length and temperature only: the steps grid collapses to one point
    record = EvalRecord.from_dict(rows[0])
    assert record.kind == "api" and record.candidate == "loopback-engine" and record.n_items == 4
    assert record.valid is True, record.validation
    assert record.nfe is None and record.tokens_per_forward is None and record.peak_mem_mb is None
    assert record.errors == 0 and 0 < record.latency_p50_s <= record.latency_p95_s <= record.latency_p99_s
    assert record.tokens_per_s > 0 and record.fingerprint["model_path"] == engine.base_url + "/v1"
    # the quality is the task's score of what the engine answers to those prompts, asked here directly
    task = load_task("arith", "test", 4)
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key="sk-test", max_retries=0, timeout=60)
    answers = [
        client.chat.completions.create(
            model="production", max_tokens=16, temperature=0.0, messages=[{"role": "user", "content": item.prompt}]
        )
        .choices[0]
        .message.content
        for item in task.items
    ]
    assert record.accuracy == accuracy_fields(task.metrics, answers, [i.target for i in task.items])["accuracy"]
    assert "no reproducibility probe for an API model" in result.output


def test_a_missing_key_variable_is_named(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_CATALOG", str(write_catalog(tmp_path, engine.base_url + "/v1")))
    monkeypatch.delenv(KEY_ENV, raising=False)
    result = _eval("--sweep", str(write_sweep(tmp_path)), "--out", str(tmp_path / "out"), "--no-plot")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"${KEY_ENV}" in result.output and "loopback-engine" in result.output


def test_an_api_source_over_plain_http_is_refused_off_this_machine(tmp_path):
    from models.catalog import CatalogError, load_catalog

    with pytest.raises(CatalogError, match="an api entry needs https://"):
        load_catalog(write_catalog(tmp_path, "http://api.example.com/v1"))
    assert (
        str(load_catalog(write_catalog(tmp_path, "http://127.0.0.1:8000/v1/")).get("loopback-engine").source)
        == "http://127.0.0.1:8000/v1"
    )


def _loadtest(*args):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    return CliRunner().invoke(cli_app("loadtest"), ["loadtest", *args])


def test_unmask_loadtest_loads_an_api_entry_with_the_key_its_entry_names(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_CATALOG", str(write_catalog(tmp_path, engine.base_url + "/v1")))
    monkeypatch.setenv(KEY_ENV, "sk-test")
    monkeypatch.setenv("COLUMNS", "220")
    out = tmp_path / "load.json"
    result = _loadtest(
        "--entry",
        "loopback-engine",
        "--concurrency",
        "2",
        "--requests",
        "2",
        "--max-tokens",
        "8",
        "--no-log",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["records"]
    assert [(r["served_as"], r["concurrency"], r["error_rate"]) for r in records] == [
        ("production", 1, 0.0),
        ("production", 2, 0.0),
    ]
    assert records[0]["model"] == "tiny-llada" and records[1]["same_answer_share"] == 1.0
    monkeypatch.delenv(KEY_ENV)
    missing = _loadtest("--entry", "loopback-engine", "--requests", "2")
    lines = [line for line in missing.output.splitlines() if line.strip()]
    assert (
        missing.exit_code == 2
        and len(lines) == 1
        and f"${KEY_ENV}" in lines[0]
        and "--entry loopback-engine" in lines[0]
    )
    unknown = _loadtest("--entry", "no-such-entry", "--requests", "2")
    assert (
        unknown.exit_code == 2 and "--entry no-such-entry: " in unknown.output and "no entry with id" in unknown.output
    )


def test_the_review_flow_registers_and_judges_an_api_entry(prefect_harness, engine, tmp_path, monkeypatch):
    """`unmask run`'s flow over an api entry: measured through the endpoint, registered, judged; no probe."""
    from flows.evaluate import EvaluationOptions, evaluate_candidate
    from registry import Registry, load_evidence
    from tests.support.flow_fixtures import seed_registry

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    monkeypatch.setenv("UNMASK_CATALOG", str(write_catalog(tmp_path, engine.base_url + "/v1")))
    monkeypatch.setenv(KEY_ENV, "sk-test")
    sweep = write_sweep(tmp_path, gen_length=32)  # the bundled policy judges at 32 tokens
    outcome = evaluate_candidate("loopback-engine", str(sweep), EvaluationOptions())
    assert (outcome["candidate"], outcome["kind"], outcome["version"], outcome["failures"]) == (
        "loopback-engine",
        "api",
        "1",
        [],
    )
    poc = {g["gate"]: g for g in outcome["verdicts"]["poc"]["gates"]}
    assert "an API model's memory is its provider's" in poc["memory"]["reason"]
    assert poc["reproducibility"]["reason"].startswith("no reproducibility probe result")
    assert poc["reproducibility"]["verdict"] == poc["memory"]["verdict"] == "inconclusive"
    assert poc["error_rate"]["passed"]  # no probe failure counted against it
    evidence = load_evidence(Registry(outcome["tracking_uri"]), "loopback-engine", "1")
    assert [(r.kind, r.nfe, r.valid) for r in evidence.records] == [("api", None, True)]
