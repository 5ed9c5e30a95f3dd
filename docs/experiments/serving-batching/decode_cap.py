"""The batching cap of whole decodes: 16 prompts decoded one by one against one batch of 16, in process.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/decode_cap.py --threads 2 \
        --points b16/s2 b16/s32/threshold0.9/dual b16/s32/threshold0.9/dual/span

`cap.py` (and the cap `unmask loadtest` prints) times one canvas forward; a decode is several forwards of
different shapes (a refresh over the canvas, windows over a block) and the sampler's step around each.
This times what a static batch really replaces (`evals.batching_cap.measure_decode_cap`, which `unmask loadtest`
also prints): `sampler.decode` of 16 held-out arith prompts alone, one after another, against the same 16 as
one left-padded batch, at each of bench.py's tiny-llada points and for tiny-ar at its operating point, median
of `--repeats` interleaved rounds after a warm-up. The ratio is the most static batching of 16 can gain at the
decode, HTTP left out.
"""

from __future__ import annotations

import argparse

from bench import OPERATING, POINTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=list(POINTS), help=f"tiny-llada's; known: {', '.join(POINTS)}")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the server's compute thread's: 2)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import torch

    import models
    from evals.batching_cap import measure_decode_cap
    from evals.evaluate import load_task
    from sampler.config import SamplerConfig

    torch.set_num_threads(args.threads)
    items = load_task("arith", "test", args.rows).items
    runs = [("tiny-llada", point, POINTS[point]) for point in args.points]
    runs.append(("tiny-ar", "operating", OPERATING["tiny-ar"]))
    print(f"# {args.rows} arith test prompts, torch threads {args.threads}, median of {args.repeats}")
    print(f"{'model':<11} {'point':<36} {'one alone (ms)':>14} {'batch (ms)':>10} {'decode cap':>10}")
    for name, point, settings in runs:
        handle = models.load(name)
        config = SamplerConfig(**settings).with_(**handle.sampler_ids())
        cap = measure_decode_cap(handle, config, [handle.encode(item.prompt) for item in items], (1, args.rows),
                                 args.repeats)
        alone, batch = cap.forward_s[1], cap.forward_s[args.rows]
        print(f"{name:<11} {point:<36} {1000 * alone:>14.2f} {1000 * batch:>10.1f} {cap.cap(args.rows):>9.2f}x")


if __name__ == "__main__":
    main()
