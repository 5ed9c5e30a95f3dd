"""One evaluation pipeline: `unmask eval` and the flows measure the same records and write the same files;
records state the effective config that decoded, and a catalog decoding default is part of its hash."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from evals.store import load_records
from flows.evaluate import EvaluationOptions, evaluate_candidate
from tests.support.flow_fixtures import CANDIDATE, FALLBACK, cli_app, seed_registry, tiny_models, write_sweep

# What a second measurement of the same point may change: clocks, memory, when, where it was logged.
MEASURED_AGAIN = {
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "time_to_first_block_s",
    "throughput_items_per_s",
    "tokens_per_s",
    "tokens_per_s_with_padding",
    "peak_mem_mb",
    "created_at",
    "run_id",
    "validation",
}


def comparable(record) -> dict:
    return {k: v for k, v in record.to_dict().items() if k not in MEASURED_AGAIN}


def files_of(folder) -> set[str]:
    """The evaluation folder's files, with record ids in names kept (they name what was measured)."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")}


# slow: the CLI sweep and two flow runs over the tiny models, GX validation: about 40 s on two cores
def test_unmask_eval_and_the_flow_give_the_same_records_and_files(prefect_harness, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]])

    out = tmp_path / "cli"
    result = CliRunner().invoke(cli_app("eval"), ["eval", "--sweep", sweep, "--out", str(out)])
    assert result.exit_code == 0, result.output
    by_cli = {r.record_id: r for r in load_records(out)}

    by_flow, folders = {}, []
    for ref in (models[CANDIDATE], models[FALLBACK]):
        outcome = evaluate_candidate(ref, sweep, EvaluationOptions())
        folders.append(outcome["files"])
        by_flow |= {r.record_id: r for r in load_records(outcome["files"])}

    assert len(by_cli) == 3 and set(by_flow) == set(by_cli)  # two diffusion points, one AR point
    for record_id, record in by_cli.items():
        assert comparable(by_flow[record_id]) == comparable(record), record_id
        assert by_flow[record_id].valid is True and record.valid is True

    flow_files = set().union(*(files_of(Path(f)) for f in folders))
    assert files_of(out) - {"failures.json"} <= flow_files | {"records.parquet", "records.csv", "records.jsonl"}
    for name in (
        "records.jsonl",
        "license.json",
        "reproducibility.json",
        "sweep.json",
        "task-validation-arith-test.json",
    ):
        assert name in files_of(out) and name in flow_files, name
    assert {f for f in files_of(out) if f.startswith("validation/")} == {
        f for f in flow_files if f.startswith("validation/")
    }
    repro_cli = json.loads((out / "reproducibility.json").read_text())
    assert {r["candidate"] for r in repro_cli} == {CANDIDATE, FALLBACK} and all(r["reproducible"] for r in repro_cli)


# slow: transformers' DiffusionGemma measured twice through the flow: about 25 s on two cores
def test_a_catalog_decoding_default_is_in_the_record_and_its_hash(prefect_harness, tmp_path, monkeypatch):
    from tests.support.eval_fixtures import write_diffusion_gemma

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    folder = write_diffusion_gemma(tmp_path / "dg")
    catalog = tmp_path / "catalog.yaml"

    def write_catalog(entropy_bound: float) -> None:
        catalog.write_text(
            yaml.safe_dump(
                {
                    "entries": [
                        {
                            "id": "dg-local",
                            "family": "diffusion-gemma",
                            "kind": "block-diffusion",
                            "role": "candidate",
                            "source": str(folder),
                            "license": "Apache-2.0",
                            "adapter": "diffusion-gemma",
                            "decoding": {"entropy_bound": entropy_bound, "t_min": 0.4, "t_max": 0.8},
                        }
                    ]
                }
            )
        )

    monkeypatch.setenv("UNMASK_CATALOG", str(catalog))
    sweep = write_sweep(tmp_path / "dg.yaml", ["dg-local"], steps=(8,))
    write_catalog(0.1)
    first = evaluate_candidate("dg-local", sweep, EvaluationOptions(reproducibility=False))
    (before,) = load_records(first["files"])
    assert first["cached"] == 0 and before.config["entropy_bound"] == 0.1  # what decoded, not SamplerConfig's 1.0
    again = evaluate_candidate("dg-local", sweep, EvaluationOptions(reproducibility=False))
    assert again["cached"] == 1  # nothing changed: the point is served from the cache

    write_catalog(0.5)
    edited = evaluate_candidate("dg-local", sweep, EvaluationOptions(reproducibility=False))
    (after,) = load_records(edited["files"])
    assert after.config["entropy_bound"] == 0.5 and after.config_hash != before.config_hash
    assert edited["cached"] == 0  # a new hash: the point was measured again, not served stale
    assert after.record_id != before.record_id


def test_measure_point_tells_each_item_of_the_point_done_of_total(tmp_path):
    """The per-item progress goes through the one pipeline: the callback hears 1..n for an n-item point."""
    from evals.pipeline import measure_point, plan_points, prepare_candidate
    from evals.sweep import load_sweep

    models = tiny_models(tmp_path / "models")
    spec = load_sweep(write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE]], steps=(2,), n=5))
    prepared = prepare_candidate(models[CANDIDATE])
    plan = plan_points(prepared, spec)
    seen, requests = [], []
    measured = measure_point(
        plan.points[0],
        plan,
        html=False,
        on_request=requests.append,
        on_item=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert len(requests) == 5 and measured.record["n_items"] == 5  # on_request still hears every request


# slow: one flow run over the tiny models: about 15 s on two cores
def test_the_flow_reports_items_inside_each_measured_point(prefect_harness, tmp_path, monkeypatch):
    from flows.progress import set_reporter

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE]], steps=(2, 8), n=4)
    events = []
    set_reporter(lambda kind, info: events.append((kind, info)))
    try:
        evaluate_candidate(models[CANDIDATE], sweep, EvaluationOptions(reproducibility=False))
    finally:
        set_reporter(None)
    items = [(i["label"], i["done"], i["total"]) for kind, i in events if kind == "item"]
    labels = [i["label"] for kind, i in events if kind == "point"]
    assert len(labels) == 2
    for label in labels:  # every point counts its own items 1..4, before it settles
        assert [(done, total) for name, done, total in items if name == label] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    kinds = [kind for kind, _ in events]
    assert kinds.index("item") < kinds.index("point")
