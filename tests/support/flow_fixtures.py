"""Tiny models, a tiny sweep and loosened policies for the flow tests (real flows, real MLflow SQLite)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from flows.evaluate import EvaluationOptions, evaluate_candidate
from gates.policy import POLICY_PATH
from tests.support.eval_fixtures import write_model

CANDIDATE, FALLBACK = "dllm", "arlm"  # folder names, hence candidate ids and registered model names
# what a clock or the host decides in a record: left out when a cluster's records are compared with a local run's
CLOCKS = {
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "tokens_per_s",
    "tokens_per_s_with_padding",
    "peak_mem_mb",
    "created_at",
    "fingerprint",
    "record_id",
    "run_id",
    "measured_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "time_to_first_block_s",
    "throughput_items_per_s",
}


def tiny_models(root: Path) -> dict[str, str]:
    """A random-weight masked-diffusion candidate and its causal twin (the fallback), as folders."""
    return {CANDIDATE: str(write_model(root / CANDIDATE)), FALLBACK: str(write_model(root / FALLBACK, causal=True))}


def broken_model(root: Path, like: str) -> str:
    """A model folder whose safetensors file is cut short: it fails to load."""
    folder = root / "broken"
    shutil.copytree(like, folder)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    return str(folder)


def undecodable_model(root: Path, like: str) -> str:
    """A model folder that loads, but whose weights are NaN: every decode meets NaN logits and fails.

    (A [MASK] id outside the vocabulary no longer loads at all: the checkpoint check refuses it by name.)"""
    from safetensors.torch import load_file, save_file

    folder = root / "undecodable"
    shutil.copytree(like, folder)
    weights = next(folder.glob("*.safetensors"))
    tensors = {
        name: tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor
        for name, tensor in load_file(weights).items()
    }
    save_file(tensors, weights)
    return str(folder)


def write_sweep(path: Path, models: list[str], steps: tuple[int, ...] = (2, 8), n: int = 3) -> str:
    """arith, `n` items, gen_length 8: one point per step count (the fallback has one point)."""
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tiny",
                "models": models,
                "tasks": [{"task": "arith", "n": n}],
                "base": {"gen_length": 8, "block_length": 4},
                "grid": {"steps": list(steps)},
                "measure": {"warmup": 0, "batch_size": 2},
            }
        )
    )
    return str(path)


def write_policy(path: Path, quality: float = 0.0) -> str:
    """gates/policy.yaml judged at the tiny sweep's operating point, every threshold loose but `quality`."""
    data = yaml.safe_load(POLICY_PATH.read_text())
    for stage in data["stages"].values():
        stage["operating_point"] = {"task": "arith", "gen_length": 8}
        gates = stage["gates"]
        gates["quality"]["threshold"] = quality
        gates["quality_vs_fallback"]["min_absolute_change"] = -1.0
        if "quality_vs_production" in gates:
            gates["quality_vs_production"]["min_relative_change"] = -1.0
        gates["latency"]["max_p95_s"] = 1e6
        gates["speedup"]["min_speedup"] = 0.0
        gates["memory"]["max_peak_mem_mb"] = 1e9
        gates["reproducibility"]["require"] = ["same_process"]
        gates["data_validity"]["min_items"] = 1
        gates["error_rate"]["max_error_rate"] = 1.0
        gates.pop("serving", None)  # needs a load test through a server, which these flows do not run
    path.write_text(yaml.safe_dump(data))
    return str(path)


def seed_registry(home: Path) -> None:
    """Give a state folder a migrated, empty MLflow database (copied: migrating one costs seconds)."""
    from tests.support.gate_fixtures import _template_db

    (home / "mlflow").mkdir(parents=True, exist_ok=True)
    shutil.copy(_template_db(), home / "mlflow" / "mlflow.db")


def cli_app(*commands: str):
    """A Typer app with only the named `flows.commands` modules registered, as `unmask` has them."""
    import importlib

    import typer

    from flows.cli import UnmaskGroup

    app = typer.Typer(cls=UnmaskGroup)  # failures read as `unmask` prints them: one line, no traceback

    @app.callback()
    def root() -> None:
        """unmask (test)"""

    for name in commands:
        importlib.import_module(f"flows.commands.{name}").register(app)
    return app


def records_without_clocks(outcome_files: str) -> list[dict]:
    """The records an evaluation folder holds (records.jsonl), each without what a clock or the host decides."""
    from evals.store import load_records

    return sorted(
        ({k: v for k, v in r.to_dict().items() if k not in CLOCKS} for r in load_records(outcome_files)),
        key=lambda r: r["config_hash"],
    )


@dataclass
class ClusterSweep:
    """A 4-cell sweep of the candidate measured locally (the reference), and the fresh home a cluster run uses."""

    model: str
    sweep: str
    local: dict  # the local run's outcome
    home: Path  # UNMASK_HOME of the cluster run, seeded, set in the environment


def local_reference_then_cluster_home(tmp_path: Path, monkeypatch, steps: tuple[int, ...]) -> ClusterSweep:
    """Measure the sweep locally under one home, then point UNMASK_HOME at a fresh seeded home for the cluster."""
    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "four.yaml", [models[CANDIDATE]], steps=steps, n=6)
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "local"))
    seed_registry(tmp_path / "local")
    local = evaluate_candidate(models[CANDIDATE], sweep, EvaluationOptions(reproducibility=False))
    home = tmp_path / "cluster"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    return ClusterSweep(models[CANDIDATE], sweep, local, home)
