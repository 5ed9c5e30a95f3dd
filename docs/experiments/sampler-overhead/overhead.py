"""How much of a decode is the model's forward, and how much is the sampler around it (issue 35, item 3).

    PYTHONPATH=$PWD .venv/bin/python docs/experiments/sampler-overhead/overhead.py --batches 1 16 --reps 3

The bundled tiny-llada decodes held-out arith prompts under each config, with its network wrapped in a
timer: every call of the denoiser is timed on the host clock (the CPU runs torch synchronously, so a
call's time is its compute). Host overhead is the rest of the decode's wall time: the commit rules,
the canvas bookkeeping, the cache gathers and every host sync. Per (config, batch) it prints the decode
time, the forward time, the overhead's share, and, with `--top N`, torch.profiler's N most costly
operators outside the forward. Medians of `--reps` passes after a warm-up pass, one torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import models
from evals.tasks import get_task, make_split
from sampler import SamplerConfig
from sampler.decode import left_pad, padding_id
from sampler.generate import generate

# the default sweep's operating points (evals/sweeps/default.yaml) and the long-canvas windowed one
CONFIGS: dict[str, dict] = {
    "s32/b16/threshold0.9/dual": {"gen_length": 32, "block_length": 16, "steps": 32, "parallel": "threshold",
                                  "parallel_threshold": 0.9, "cache": "dual"},
    "s32/b16/threshold0.9": {"gen_length": 32, "block_length": 16, "steps": 32, "parallel": "threshold",
                             "parallel_threshold": 0.9},
    "s16/b16 (top-k)": {"gen_length": 32, "block_length": 16, "steps": 16},
    "g256/dual+threshold+exit+W16": {"gen_length": 256, "block_length": 32, "steps": 256, "cache": "dual",
                                     "parallel": "threshold", "parallel_threshold": 0.9,
                                     "early_exit": "eos_decided", "future_window": 16},
}
CONFIGS["s32/b16/threshold0.9/dual/span"] = CONFIGS["s32/b16/threshold0.9/dual"] | {"refresh_span": "from_cached_block"}


class TimedDenoiser(torch.nn.Module):
    """The network, with the seconds spent in its calls added up."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model, self.seconds, self.calls = model, 0.0, 0

    def forward(self, *args, **kwargs):
        started = time.perf_counter()
        out = self.model(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return out


def batches(handle, prompts: list[str], batch: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    return [left_pad([handle.encode(p) for p in prompts[i : i + batch]], padding_id(handle))
            for i in range(0, len(prompts), batch)]


def one_pass(timed: TimedDenoiser, work, config: SamplerConfig) -> tuple[float, float, int]:
    """(wall seconds, forward seconds, forward calls) of decoding every batch in `work`."""
    timed.seconds, timed.calls = 0.0, 0
    started = time.perf_counter()
    for ids, mask in work:
        generate(timed, ids, config, attention_mask=mask)
    return time.perf_counter() - started, timed.seconds, timed.calls


def top_host_ops(timed: TimedDenoiser, work, config: SamplerConfig, n: int) -> list[tuple[str, float]]:
    """torch.profiler's `n` costliest operators by self CPU time, outside the network's calls."""
    from torch.profiler import ProfilerActivity, profile, record_function

    inner = timed.model
    original = inner.forward

    def labelled(*args, **kwargs):
        with record_function("FORWARD"):
            return original(*args, **kwargs)

    inner.forward = labelled
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            one_pass(timed, work, config)
    finally:
        del inner.forward
    forward_ops = {e.id for e in prof.events() if _inside(e, "FORWARD")}
    totals: dict[str, float] = {}
    for e in prof.events():
        if e.id not in forward_ops and e.name != "FORWARD":
            totals[e.name] = totals.get(e.name, 0.0) + e.self_cpu_time_total / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])[:n]


def _inside(event, name: str) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == name:
            return True
        parent = parent.cpu_parent
    return False


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--top", type=int, default=0, help="print the N costliest host operators per cell")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    handle = models.load("tiny-llada")
    timed = TimedDenoiser(handle.model)
    prompts = [item.prompt for item in make_split(get_task("arith"), "test", args.prompts, seed=0)]
    print(f"{'config':<30} {'batch':>5} {'decode s':>9} {'forward s':>9} {'calls':>6} {'host share':>10}")
    with torch.inference_mode():
        for name in args.configs:
            config = SamplerConfig(**CONFIGS[name], **handle.sampler_ids())
            for batch in args.batches:
                work = batches(handle, prompts, batch)
                one_pass(timed, work[:1], config)  # warm-up
                runs = [one_pass(timed, work, config) for _ in range(args.reps)]
                wall = statistics.median(r[0] for r in runs)
                forward = statistics.median(r[1] for r in runs)
                share = statistics.median(1 - r[1] / r[0] for r in runs)
                print(f"{name:<30} {batch:>5} {wall:>9.3f} {forward:>9.3f} {runs[0][2]:>6} {100 * share:>9.1f}%")
                for op, seconds in top_host_ops(timed, work, config, args.top) if args.top else ():
                    print(f"{'':<30} {'':>5}   {seconds:>8.3f}s  {op}")


if __name__ == "__main__":
    main()
