"""Long-canvas decoding speed, side by side with the AR twin (issue 22, part 2).

    PYTHONPATH=$PWD python docs/experiments/long-canvas/speed.py --gen-lengths 256 --batches 1 16 --prompts 16

Every config decodes the same held-out arith prompts in one process with one torch thread; the
AR twin (tiny-ar, KV-cached) decodes them too. Per (gen_length, batch) it prints accuracy
(strict-match), sequential model calls per decode call, text tokens/s (tokens before the first
EOS/EoT, per second of wall clock), the ratio to tiny-ar's text tokens/s and the share of
responses equal to vanilla's (or to early-exit's, which are vanilla's by construction, when vanilla
is not run: at 256 it costs minutes). Timings are the median of `--reps` passes after one warm-up pass
on two prompts.

`--context N` raises the loaded models' max_sequence_length (to decode 512 + prompt on a
checkpoint trained at 512: positions past the trained length extrapolate RoPE).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

import models
from evals.tasks import get_task, make_split, mean_score
from sampler import SamplerConfig
from sampler.decode import decode, left_pad, padding_id

# name -> settings on top of vanilla (one token per step, steps = gen_length, block `--block`).
DUAL_PARALLEL_EXIT = {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.9, "early_exit": "eos_decided"}
CONFIGS: dict[str, dict] = {
    "vanilla": {},
    "early-exit": {"early_exit": "eos_decided"},
    "dual+parallel+exit": DUAL_PARALLEL_EXIT,
    "dual+parallel+exit+W8": DUAL_PARALLEL_EXIT | {"future_window": 8},
    "dual+parallel+exit+W16": DUAL_PARALLEL_EXIT | {"future_window": 16},
    "dual+parallel+exit+W32": DUAL_PARALLEL_EXIT | {"future_window": 32},
    "dual+parallel+exit+W64": DUAL_PARALLEL_EXIT | {"future_window": 64},
    "dual+parallel+exit+W96": DUAL_PARALLEL_EXIT | {"future_window": 96},
    "dual+parallel0.95+exit+W16": DUAL_PARALLEL_EXIT | {"parallel_threshold": 0.95, "future_window": 16},
    "dual+parallel0.99+exit+W16": DUAL_PARALLEL_EXIT | {"parallel_threshold": 0.99, "future_window": 16},
    "dual+parallel0.8+exit+W16": DUAL_PARALLEL_EXIT | {"parallel_threshold": 0.8, "future_window": 16},
    "dual+parallel0.8+exit+W8": DUAL_PARALLEL_EXIT | {"parallel_threshold": 0.8, "future_window": 8},
    "dual+parallel0.8+exit+W8+compile": DUAL_PARALLEL_EXIT | {"parallel_threshold": 0.8, "future_window": 8,
                                                              "compile": True},
    "dual+parallel0.7+exit+W16": DUAL_PARALLEL_EXIT | {"parallel_threshold": 0.7, "future_window": 16},
    "dual+factor1+exit+W16": DUAL_PARALLEL_EXIT | {"parallel": "factor", "parallel_factor": 1.0, "future_window": 16},
    "dual+factor2+exit+W16": DUAL_PARALLEL_EXIT | {"parallel": "factor", "parallel_factor": 2.0, "future_window": 16},
    "parallel+exit+W16": {"parallel": "threshold", "parallel_threshold": 0.9, "early_exit": "eos_decided",
                          "future_window": 16},
    "dual+exit+W16": {"cache": "dual", "early_exit": "eos_decided", "future_window": 16},
    "exit+eot+W16": {"early_exit": "eos_decided", "eot_predict": "eos_run", "future_window": 16},
    "dual+exit+eot+W16": {"cache": "dual", "early_exit": "eos_decided", "eot_predict": "eos_run", "future_window": 16},
    "dual+spec+exit+eot+W16": {"cache": "dual", "early_exit": "eos_decided", "eot_predict": "eos_run",
                               "future_window": 16, "speculative_draft": 4},
    "dual+spec-rows+exit+eot+W16": {"cache": "dual", "early_exit": "eos_decided", "eot_predict": "eos_run",
                                    "future_window": 16, "speculative_draft": 4, "speculative_rows": True},
    "dual+parallel+spec-rows+exit+W16": DUAL_PARALLEL_EXIT | {"future_window": 16, "speculative_draft": 4,
                                                              "speculative_rows": True},
    "dual+parallel+exit+eot+W16": DUAL_PARALLEL_EXIT | {"eot_predict": "eos_run", "future_window": 16},
    "dual+parallel+exit+W16+compile": DUAL_PARALLEL_EXIT | {"future_window": 16, "compile": True},
    "dual+exit+W32": {"cache": "dual", "early_exit": "eos_decided", "future_window": 32},
    "exit+W32": {"early_exit": "eos_decided", "future_window": 32},
    "dual+spec+exit (lossless-ish)": {"cache": "dual", "speculative_draft": 4, "early_exit": "eos_decided"},
    "dual+parallel": {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.9},
    "dual+parallel0.7": {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.7},
}
# "+span": the same, with each refresh recomputing from the cached block's start (sampler/cache.py, lossy)
SPAN = {"refresh_span": "from_cached_block"}
CONFIGS |= {f"{name}+span": settings | SPAN for name, settings in list(CONFIGS.items()) if "dual" in name}


def load(ref: str, context: int | None):
    handle = models.load(ref)
    if context:
        handle.model.config = dataclasses.replace(handle.model.config, max_sequence_length=context)
    return handle


def encode_batches(handle, items, batch: int):
    pad = padding_id(handle)
    out = []
    for i in range(0, len(items), batch):
        rows = [handle.encode(item.prompt) for item in items[i : i + batch]]
        out.append(left_pad(rows, pad))
    return out


def run(handle, batches, config: SamplerConfig):
    """Decode every batch; (seconds, responses, text tokens, mean sequential calls per decode call)."""
    start = time.perf_counter()
    outs = [decode(handle, ids, config, attention_mask=mask) for ids, mask in batches]
    seconds = time.perf_counter() - start
    rows = [r for out in outs for r in out.generated.tolist()]
    return (seconds, [handle.response_text(r) for r in rows], sum(handle.useful_length(r) for r in rows),
            statistics.fmean(out.sequential_calls for out in outs))


def measure(handle, items, batch: int, config: SamplerConfig):
    """A warm-up pass on two prompts, then one timed pass over `items`: the first of `reps` timings."""
    run(handle, encode_batches(handle, items[:2], batch), config)
    batches = encode_batches(handle, items, batch)
    seconds, texts, text_tokens, calls = run(handle, batches, config)
    return {"times": [seconds], "texts": texts, "calls": calls, "text_tokens": text_tokens, "batches": batches,
            "accuracy": mean_score("strict-match", texts, [i.target for i in items])}


def retime(handle, row: dict, config: SamplerConfig) -> None:
    row["times"].append(run(handle, row["batches"], config)[0])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny-llada")
    p.add_argument("--ar", default="tiny-ar")
    p.add_argument("--gen-lengths", type=int, nargs="+", default=[256])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--context", type=int, default=None)
    p.add_argument("--block", type=int, default=32, help="block_length of every config (the AR twin's too)")
    p.add_argument("--compile", action="store_true",
                   help="compile=True on every row, the AR twin's too (torch.compile; the warm-up pass pays it)")
    p.add_argument("--configs", nargs="+", default=None, help=f"known: {', '.join(CONFIGS)}")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.configs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {unknown[0]!r}; known: {', '.join(CONFIGS)}")
    llada, ar = load(args.model, args.context), load(args.ar, args.context)
    items = make_split(get_task("arith"), "test", args.prompts, seed=0)
    print(f"# {args.model} vs {args.ar}, {args.prompts} arith test prompts, threads {args.threads}, "
          f"median of {args.reps}, block {args.block}{', compiled' if args.compile else ''}")
    print(f"{'gen':>4} {'batch':>5} {'config':<34} {'acc':>6} {'calls':>7} {'text tok/s':>10} {'vs AR':>6} "
          f"{'=vanilla':>8} {'s':>7}")
    for n in args.gen_lengths:
        for batch in args.batches:
            # (label, handle, config): the AR twin and every config, timed in interleaved repetitions so a
            # change in machine load falls on every row alike.
            common = {"steps": n, "gen_length": n, "block_length": args.block, "compile": args.compile}
            runs = [("tiny-ar", ar, SamplerConfig(**common, **ar.sampler_ids()))]
            runs += [(name, llada, SamplerConfig(**(common | llada.sampler_ids() | CONFIGS[name]))) for name in names]
            rows = {label: measure(handle, items, batch, cfg) for label, handle, cfg in runs}
            for _ in range(args.reps - 1):
                for label, handle, cfg in runs:
                    retime(handle, rows[label], cfg)
            for r in rows.values():
                r["text_tps"] = r["text_tokens"] / statistics.median(r["times"])
            # early-exit gives vanilla's text by construction (tests/unit/test_sampler_modes.py), at a fraction of its cost
            vanilla, ar_tps = rows.get("vanilla") or rows.get("early-exit"), rows["tiny-ar"]["text_tps"]
            for label, _, _ in runs[1:] + runs[:1]:
                r = rows[label]
                same = "" if vanilla is None else f"{sum(a == b for a, b in zip(r['texts'], vanilla['texts'])) / len(items):.2f}"
                print(f"{n:>4} {batch:>5} {label:<34} {100 * r['accuracy']:>6.1f} {r['calls']:>7.1f} "
                      f"{r['text_tps']:>10.1f} {r['text_tps'] / ar_tps:>6.2f} {same:>8} {statistics.median(r['times']):>7.2f}",
                      flush=True)

if __name__ == "__main__":
    main()
