"""Dynamic batching on vs off, side by side in one run: throughput, latency and whether the answers agree.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/bench.py --requests 32 --concurrency 16

For each served alias it starts `unmask loadtest`'s local server (`unmask serve`'s app on loopback,
uvicorn in a thread) twice: once with batching off (`max_batch=1`) and once on (`max_batch=16`), loads
it with `evals.loadtest` (the `openai` async client; solo first, then the given concurrency) and prints
requests/s, answer tokens/s (`usage.completion_tokens`: tokens before the first stop, so EOS padding
does not count), p50/p95 latency, the mean batch size, the share of answers equal between the two
runs, and the on/off throughput gain beside the batching cap at `--max-batch` rows (the most a batch of
that many can gain at the model, `evals.batching_cap`, timed on the served model once its server stopped)
and the share of the cap reached. Without `--tracking-uri` it registers the bundled tiny models
(real `registry.register_evidence`) in a scratch SQLite store with tiny-llada holding `production`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

OPERATING = {"tiny-llada": {"gen_length": 32, "block_length": 32, "steps": 16},
             "tiny-ar": {"gen_length": 32, "block_length": 32, "steps": 32}}


def scratch_registry(folder: Path) -> str:
    """tiny-ar (fallback) and tiny-llada (production) registered at OPERATING, with their real weights digests."""
    from evals.records import CandidateEvidence, EvalRecord
    from models.digest import weights_sha256
    from models.loading import resolve_model_path
    from registry import Registry, register_evidence
    from sampler.config import SamplerConfig

    reg = Registry(f"sqlite:///{folder / 'mlflow.db'}")
    versions = {}
    for name, kind, role in (("tiny-ar", "autoregressive", "fallback"), ("tiny-llada", "masked-diffusion", "candidate")):
        sha = weights_sha256(resolve_model_path(name))
        config = SamplerConfig(**OPERATING[name])
        record = EvalRecord(candidate=name, role=role, kind=kind, task="arith", split="test", config=config.to_dict(),
                            config_hash=config.hash(), gen_length=config.gen_length, n_items=1, accuracy=1.0,
                            valid=True, weights_sha256=sha)
        versions[name], _ = register_evidence(reg, CandidateEvidence(name, role, kind, [record], weights_sha256=sha))
    # a settled, audited move (what a promotion ends in): the server follows only aliases the audit trail moved
    from registry.promotion import _move

    _move(reg, "production", None, ("tiny-llada", versions["tiny-llada"]), "serving-bench", "serving bench",
          {"kind": "promotion"})
    return reg.tracking_uri


def run(uri: str, alias: str, prompts: list[str], concurrency: int, max_batch: int):
    """`unmask loadtest`'s local server and load (solo, then `concurrency` in flight); the loaded cell, the solo one,
    and the batching cap of the served model, timed once the server stopped (None: a kind it does not measure)."""
    from evals.loadtest import LoadSpec, run_load
    from flows.commands.loadtest import local_server, served_caps

    with local_server([alias], uri, max_batch=max_batch, batch_window_s=0.02) as server:
        result = run_load(LoadSpec(base_url=server.url, models=(alias,), concurrency=(concurrency,),
                                   requests=len(prompts), timeout_s=600, stream=False), prompts)
    cap = served_caps(server.pool, [alias], prompts, (1, max_batch))[alias]
    return result.cell(alias, concurrency), result.cell(alias, 1), cap


def mean_batch(cell) -> float:
    return statistics.mean((a.served.get("unmask") or {}).get("batch_size", 1) for a in cell.ok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alias", action="append", help="served name; repeat (default: production, fallback)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--tracking-uri", help="a registry to serve from (default: a scratch one, see above)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    from evals.evaluate import load_task

    prompts = [item.prompt for item in load_task("arith", "test", args.requests).items]
    uri = args.tracking_uri or scratch_registry(Path(tempfile.mkdtemp(prefix="unmask-serving-bench-")))
    table = Table(title=f"{args.requests} arith prompts at concurrency {args.concurrency}")
    for column in ("alias", "model", "batching", "req/s", "tokens/s", "p50 s", "p95 s", "mean batch",
                   "same answers", "throughput on/off", f"cap at {args.max_batch} rows", "share of cap"):
        table.add_column(column, justify="left" if column in ("alias", "model", "batching") else "right")
    for alias in args.alias or ["production", "fallback"]:
        runs = {mode: run(uri, alias, prompts, args.concurrency, max_batch)
                for mode, max_batch in (("off", 1), ("on", args.max_batch))}
        off = {a.prompt: a.text for a in runs["off"][0].ok}
        same = sum(off.get(a.prompt) == a.text for a in runs["on"][0].ok) / len(prompts)
        ratio = runs["off"][0].wall_s / runs["on"][0].wall_s
        cap = runs["on"][2].cap(args.max_batch) if runs["on"][2] else None
        for mode, (cell, _, _) in runs.items():
            on = mode == "on"
            table.add_row(alias, cell.served()["model"], f"{mode} (max {1 if mode == 'off' else args.max_batch})",
                          f"{cell.requests_per_s:.2f}", f"{cell.tokens_per_s:.1f}", f"{cell.latency(50):.3f}",
                          f"{cell.latency(95):.3f}", f"{mean_batch(cell):.1f}", f"{same:.0%}",
                          f"{ratio:.2f}x" if on else "", f"{cap:.2f}x" if on and cap else "",
                          f"{ratio / cap:.0%}" if on and cap else "")
    Console(width=160).print(table)  # piped output keeps its columns


if __name__ == "__main__":
    main()
