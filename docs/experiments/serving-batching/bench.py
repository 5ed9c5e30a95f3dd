"""Batching off, static and continuous, side by side in one run: throughput, latency, the cap, the answers.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/bench.py --requests 48 --concurrency 16 --reps 3

For each served alias it starts `unmask loadtest`'s local server (`unmask serve`'s app on loopback,
uvicorn in a thread) once per mode: batching off (`max_batch=1`), static batches (`max_batch=16`,
`continuous=False`: a batch runs start to finish) and continuous (`max_batch=16`: a request joins the
running batch at its next block), `--reps` times each, the modes interleaved. It loads each with
`evals.loadtest` from a child process (`evals.load_process`: the `openai` async client off the server's
interpreter lock; solo first, then the given concurrency) and prints the
median of the reps: requests/s, answer tokens/s (`usage.completion_tokens`: tokens before the first stop,
so EOS padding does not count), p50/p95 latency, the mean batch size, the share of answers equal to the
answers with batching off, the gain over off beside the batching cap at `--max-batch` rows (the most a
batch of that many can gain at the model, `evals.batching_cap`, timed on the served model's compute
thread after the load) and the share of the cap reached. Without `--tracking-uri` it registers the bundled tiny
models (real `registry.register_evidence`) in a scratch SQLite store with tiny-llada holding `production`
at the operating point `--point` names (POINTS).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

# tiny-llada's operating points: the one the serving tests use, and two the default sweep
# (evals/sweeps/default.yaml) can pick, one with four blocks so that rows join mid-answer
POINTS = {"b32/s16": {"gen_length": 32, "block_length": 32, "steps": 16},
          "b16/s32/threshold0.9/dual": {"gen_length": 32, "block_length": 16, "steps": 32, "parallel": "threshold",
                                        "parallel_threshold": 0.9, "cache": "dual"},
          "b8/s32/threshold0.9/dual/exit": {"gen_length": 32, "block_length": 8, "steps": 32, "parallel": "threshold",
                                            "parallel_threshold": 0.9, "cache": "dual", "early_exit": "eos_decided"}}
POINTS["b16/s2"] = {"gen_length": 32, "block_length": 16, "steps": 2}  # the sweep's fewest steps: one a block
# the same with each refresh recomputing only from the cached block's start (sampler/cache.py SinceCachedBlock)
POINTS |= {f"{name}/span": POINTS[name] | {"refresh_span": "from_cached_block"}
           for name in ("b16/s32/threshold0.9/dual", "b8/s32/threshold0.9/dual/exit")}
POINTS |= {"b16/s32/threshold0.7/dual/span": POINTS["b16/s32/threshold0.9/dual/span"] | {"parallel_threshold": 0.7}}
OPERATING = {"tiny-llada": POINTS["b32/s16"], "tiny-ar": {"gen_length": 32, "block_length": 32, "steps": 32}}
MODES = {"off": (1, True), "static": (None, False), "continuous": (None, True)}  # (max batch, continuous)


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


def run(uri: str, alias: str, prompts: list[str], concurrency: int, max_batch: int, continuous: bool = True):
    """`unmask loadtest`'s local server and load (solo, then `concurrency` in flight); the loaded cell, the solo one,
    and the batching cap of the served model, timed on its compute thread after the load (None: a kind it does not
    measure)."""
    from evals.load_process import run_load_apart
    from evals.loadtest import LoadSpec
    from flows.commands.loadtest import local_server, served_caps

    with local_server([alias], uri, max_batch=max_batch, batch_window_s=0.02, continuous=continuous) as server:
        result = run_load_apart(LoadSpec(base_url=server.url, models=(alias,), concurrency=(concurrency,),
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
    parser.add_argument("--reps", type=int, default=1, help="runs per mode, interleaved; the median is shown")
    parser.add_argument("--point", choices=list(POINTS), default="b32/s16", help="tiny-llada's operating point")
    parser.add_argument("--tracking-uri", help="a registry to serve from (default: a scratch one, see above)")
    args = parser.parse_args()
    from rich.console import Console

    from evals.evaluate import load_task

    OPERATING["tiny-llada"] = POINTS[args.point]
    prompts = [item.prompt for item in load_task("arith", "test", args.requests).items]
    uri = args.tracking_uri or scratch_registry(Path(tempfile.mkdtemp(prefix="unmask-serving-bench-")))
    title = f"{args.requests} arith prompts at concurrency {args.concurrency}, tiny-llada at {args.point}"
    table = bench_table(title, args.max_batch)
    for alias in args.alias or ["production", "fallback"]:
        runs: dict[str, list] = {mode: [] for mode in MODES}
        for _ in range(args.reps):
            for mode, (max_batch, continuous) in MODES.items():
                runs[mode].append(run(uri, alias, prompts, args.concurrency, max_batch or args.max_batch, continuous))
        add_rows(table, alias, runs, args.max_batch, len(prompts))
    Console(width=200).print(table)  # piped output keeps its columns


def bench_table(title: str, max_batch: int):
    from rich.table import Table

    table = Table(title=title)
    for column in ("alias", "model", "batching", "req/s", "tokens/s", "p50 s", "p95 s", "mean batch",
                   "same answers", "tokens/s vs off", f"cap at {max_batch} rows", "share of cap"):
        table.add_column(column, justify="left" if column in ("alias", "model", "batching") else "right")
    return table


def add_rows(table, alias: str, runs: dict[str, list], max_batch: int, n: int) -> None:
    """One row per mode: medians over its runs, the gain over batching off, and that gain against the cap."""
    median = statistics.median
    off = {a.prompt: a.text for a in runs["off"][0][0].ok}
    off_tokens = median(cell.tokens_per_s for cell, _, _ in runs["off"])
    caps = [cap.cap(max_batch) for _, _, cap in runs["continuous"] + runs["static"] if cap]
    cap = median(caps) if caps else None
    for mode, cells in runs.items():
        cell = cells[0][0]
        tokens = median(c.tokens_per_s for c, _, _ in cells)
        gain = tokens / off_tokens
        same = median(sum(off.get(a.prompt) == a.text for a in c.ok) / n for c, _, _ in cells)
        batched = mode != "off"
        table.add_row(alias, cell.served()["model"], f"{mode} (max {max_batch if batched else 1})",
                      f"{median(c.requests_per_s for c, _, _ in cells):.2f}", f"{tokens:.1f}",
                      f"{median(c.latency(50) for c, _, _ in cells):.3f}",
                      f"{median(c.latency(95) for c, _, _ in cells):.3f}",
                      f"{median(mean_batch(c) for c, _, _ in cells):.1f}", f"{same:.0%}",
                      f"{gain:.2f}x" if batched else "", f"{cap:.2f}x" if batched and cap else "",
                      f"{gain / cap:.0%}" if batched and cap else "")


if __name__ == "__main__":
    main()
