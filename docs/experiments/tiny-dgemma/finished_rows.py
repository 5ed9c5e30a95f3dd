"""Block diffusion with and without computing only the rows still denoising, side by side in one process.

    python docs/experiments/tiny-dgemma/finished_rows.py CHECKPOINT [GEN_LENGTH] [BATCH] [REPS]

The same held-out prompts (arith then sort, as `unmask bench` draws them) go through the block sampler twice
per setting: once through the adapter as it is (a denoising call computes only the rows whose logits are read,
`sampler.block_diffusion.RowsToDenoise`), once through a view of the same adapter without `cache_rows` (every
call computes the whole batch, the sampler's fallback). Repetitions alternate between the two. Each line gives
both medians, their ratio, the rows the decoder computed, and whether the sequences are identical.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from evals.bench import BLOCK_VARIANTS, BenchSetup, held_out_prompts
from models import load
from sampler.decode import decode_prompts


class WholeBatch:
    """The adapter without `cache_rows`: every denoising call computes the whole batch. Counts the rows computed."""

    def __init__(self, adapter):
        self.adapter, self.rows = adapter, 0

    def __getattr__(self, name):
        if name == "cache_rows":
            raise AttributeError(name)
        return getattr(self.adapter, name)

    def denoise(self, canvas, *args):
        self.rows += canvas.shape[0]
        return self.adapter.denoise(canvas, *args)


class Counted(WholeBatch):
    """The adapter as it is, counting the rows each denoising call computes."""

    def __getattr__(self, name):
        return getattr(self.adapter, name)


def measure(handle, ids, config, row_seeded: bool, reps: int):
    seeds = [config.seed] * len(ids) if row_seeded else None
    results = {}
    for view in (Counted(handle), WholeBatch(handle)):
        decode_prompts(view, ids, config, row_seeds=seeds)  # warm-up
        view.rows = 0
        results[type(view).__name__] = (view, [])
    for _ in range(reps):
        for name, (view, times) in results.items():
            start = time.perf_counter()
            out = decode_prompts(view, ids, config, row_seeds=seeds)
            times.append(time.perf_counter() - start)
            results[name] = (view, times)
            view.last = out.sequences
    return results


def main(path: str, gen_length: int = 64, batch: int = 8, reps: int = 5) -> None:
    torch.set_num_threads(1)
    handle = load(path)
    setup = BenchSetup(gen_lengths=(gen_length,), block_length=handle.canvas_length, prompts=batch // 2)
    ids = [i for p in held_out_prompts(handle, setup) for i in p.ids][:batch]
    print(f"{path}, gen {gen_length}, batch {len(ids)}, median of {reps}, torch threads 1")
    for variant in BLOCK_VARIANTS:
        if variant.kind == "ar" or not variant.default:
            continue
        config = variant.config(handle, gen_length, setup)
        for row_seeded in (True, False):
            r = measure(handle, ids, config, row_seeded, reps)
            (subset, t_subset), (whole, t_whole) = r["Counted"], r["WholeBatch"]
            same = torch.equal(subset.last, whole.last)
            a, b = statistics.median(t_subset), statistics.median(t_whole)
            print(f"{variant.name:22s} {'row draws  ' if row_seeded else 'batch draws'}  rows only {a:.3f} s, "
                  f"whole batch {b:.3f} s, {b / a:.2f}x; rows computed {subset.rows // reps} vs "
                  f"{whole.rows // reps} a decode; identical: {same}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
