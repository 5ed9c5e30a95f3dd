"""The batching cap of whole decodes: 16 prompts decoded one by one against one batch of 16, in process.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/decode_cap.py --threads 2 \
        --points b16/s2 b16/s32/threshold0.9/dual b16/s32/threshold0.9/dual/span

`cap.py` (and the cap `unmask loadtest` prints) times one canvas forward; a decode is several forwards of
different shapes (a refresh over the canvas, windows over a block) and the sampler's step around each.
This times what a static batch really replaces: `sampler.decode` of 16 held-out arith prompts alone, one
after another, against the same 16 as one left-padded batch, at each of bench.py's tiny-llada points and
for tiny-ar at its operating point, under `torch.inference_mode()`, median of `--repeats` interleaved rounds
after a warm-up. The ratio is the most static batching of 16 can gain at the decode, HTTP left out.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench import OPERATING, POINTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=list(POINTS), help=f"tiny-llada points; known: {', '.join(POINTS)}")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the server's compute thread: the default)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import torch

    import models
    from evals.evaluate import load_task
    from sampler.config import SamplerConfig
    from sampler.decode import decode, left_pad, padding_id

    torch.set_num_threads(args.threads)
    items = load_task("arith", "test", args.rows).items
    runs = [("tiny-llada", point, POINTS[point]) for point in args.points] + [("tiny-ar", "operating", OPERATING["tiny-ar"])]
    print(f"# {args.rows} arith test prompts, torch threads {args.threads}, median of {args.repeats}")
    print(f"{'model':<11} {'point':<36} {'alone (ms)':>10} {'batch (ms)':>10} {'decode cap':>10}")
    for name, point, settings in runs:
        handle = models.load(name)
        config = SamplerConfig(**settings).with_(**handle.sampler_ids())
        prompts, pad = [handle.encode(item.prompt) for item in items], padding_id(handle)
        alone = [left_pad([p], pad) for p in prompts]
        batch = left_pad(prompts, pad)

        def one_by_one():
            for ids, mask in alone:
                decode(handle, ids, config, attention_mask=mask)

        def together():
            decode(handle, batch[0], config, attention_mask=batch[1])

        times: dict[str, list[float]] = {"alone": [], "batch": []}
        with torch.inference_mode():
            one_by_one(), together()  # warm-up
            for _ in range(args.repeats):
                for label, fn in (("alone", one_by_one), ("batch", together)):
                    start = time.perf_counter()
                    fn()
                    times[label].append(time.perf_counter() - start)
        a, b = statistics.median(times["alone"]), statistics.median(times["batch"])
        print(f"{name:<11} {point:<36} {1000 * a:>10.1f} {1000 * b:>10.1f} {a / b:>9.2f}x")


if __name__ == "__main__":
    main()
