"""What a batch of answers costs each model: positions computed per answer, the cost of a position, the ceiling.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/work.py --threads 2 \
        --points b16/s2 b16/s32/threshold0.9/dual b16/s32/threshold0.9/dual/span

Issue 35 asks tiny-llada to serve 3x tiny-ar's tokens/s at 16 in flight. Once a server is busy, what a batch
costs decides its throughput, so this decodes the same 16 held-out arith prompts at each model's operating
point in one batch of 16 (and one by one), in process, and counts, through a hook on the network, every call
and every query position it computed (rows x width, cached positions not counted), next to the answer tokens
(before the first stop). For each model, point and batch size it prints the calls per decode, the positions
computed and answer tokens per row, the wall time of all 16 answers and of the forwards within it, and the
microseconds one computed position cost. The last column is the ceiling
the batch sets: tiny-ar's batch time over tiny-llada's, the most tiny-llada's tokens/s at 16 can be over
tiny-ar's once both servers are busy with batches of 16 (the same answers, so the same tokens; the HTTP path
costs each request alike), and the batch-1 ratio beside it. Median of `--repeats` interleaved rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench import OPERATING, POINTS


class Counted:
    """The network behind a hook: calls, query positions computed and seconds inside, since the last reset."""

    def __init__(self, model):
        self.calls, self.positions, self.seconds = 0, 0, 0.0
        model.register_forward_pre_hook(self._before)
        model.register_forward_hook(self._after)

    def _before(self, module, args):
        ids = args[0]
        self.calls += 1
        self.positions += ids.shape[0] * ids.shape[1]
        self._started = time.perf_counter()

    def _after(self, module, args, output):
        self.seconds += time.perf_counter() - self._started

    def reset(self):
        self.calls, self.positions, self.seconds = 0, 0, 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", nargs="+", default=["b16/s32/threshold0.9/dual/span"],
                        help=f"tiny-llada's; known: {', '.join(POINTS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    import torch

    import models
    from evals.evaluate import load_task
    from sampler.config import SamplerConfig
    from sampler.decode import decode_prompts

    torch.set_num_threads(args.threads)
    items = load_task("arith", "test", args.rows).items
    runs = [("tiny-ar", "operating", OPERATING["tiny-ar"])] + [("tiny-llada", p, POINTS[p]) for p in args.points]
    print(f"# {args.rows} arith test prompts, one by one (batch 1) and as one batch, torch threads {args.threads}, "
          f"median of {args.repeats} rounds")
    print(f"{'model':11} {'point':31} {'batch':>5} {'calls/decode':>12} {'positions/row':>13} {'tokens/row':>10} "
          f"{'ms, all rows':>12} {'in forwards':>11} {'us/position':>11} {'ar / this':>9}")
    ar_ms = {}
    for name, point, settings in runs:
        handle = models.load(name)
        counted = Counted(handle.model)
        config = SamplerConfig(**settings).with_(**handle.sampler_ids())
        prompts = [handle.encode(item.prompt) for item in items]
        groups = {1: [[p] for p in prompts], len(prompts): [prompts]}
        with torch.inference_mode():
            for batches in groups.values():
                decode_prompts(handle, batches[0], config)  # warm-up
            rounds = {n: [] for n in groups}
            for _ in range(args.repeats):
                for n, batches in groups.items():
                    counted.reset()
                    started, tokens = time.perf_counter(), 0
                    for batch in batches:
                        out = decode_prompts(handle, batch, config)
                        answers = out.sequences[:, out.prompt_length:].tolist()
                        tokens += sum(handle.useful_length(row) for row in answers)
                    rounds[n].append((time.perf_counter() - started, counted.seconds, counted.calls / len(batches),
                                      counted.positions, tokens))
        for n, seen in rounds.items():
            wall, inside, calls, positions, tokens = (statistics.median(r[i] for r in seen) for i in range(5))
            if name == "tiny-ar":
                ar_ms[n] = wall
            ceiling = "" if name == "tiny-ar" else f"{ar_ms[n] / wall:.2f}x"
            rows = len(prompts)
            print(f"{name:11} {point:31} {n:5d} {calls:12.1f} {positions / rows:13.0f} {tokens / rows:10.1f} "
                  f"{wall * 1e3:12.1f} {inside * 1e3:11.1f} {inside / positions * 1e6:11.2f} {ceiling:>9}")


if __name__ == "__main__":
    main()
