"""Why `unmask serve` runs every torch call on one thread: a decode timed alone, and after another thread decoded.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/threads.py

For tiny-llada (its default-sweep point s32/b16/threshold0.9/dual) and tiny-ar (greedy, 32 tokens), at 1 and
16 rows and 1 and 2 torch threads, each case in a fresh process: the median of 6 decodes (after 2 untimed)
in a worker thread, either alone ("one thread") or after the main thread decoded 3 times ("two threads").
With 2 torch threads, every thread that ran a parallel op keeps its own OpenMP team; the second team
slows the first thread's decodes even while it idles.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time


def case(name: str, rows: int, threads: int, main_first: bool) -> float:
    """Milliseconds of one decode in a worker thread (median), in this process."""
    import torch

    import models
    from evals.evaluate import load_task
    from sampler.config import SamplerConfig
    from serving.batching import decode_rows

    torch.set_num_threads(threads)
    handle = models.load(name)
    point = ({"block_length": 16, "parallel": "threshold", "parallel_threshold": 0.9, "cache": "dual"}
             if name == "tiny-llada" else {"block_length": 32})
    config = SamplerConfig(gen_length=32, steps=32, **point, **handle.sampler_ids())
    prompts = [handle.encode(item.prompt) for item in load_task("arith", "test", rows).items]

    def timed(n: int) -> list[float]:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            decode_rows(handle, config, prompts)
            times.append(time.perf_counter() - started)
        return times

    if main_first:
        timed(3)
    out: list[float] = []
    worker = threading.Thread(target=lambda: (torch.set_num_threads(threads), out.extend(timed(8))))
    worker.start()
    worker.join()
    return 1e3 * statistics.median(out[2:])


def main() -> None:
    if len(sys.argv) == 5:  # one case, in its own process
        name, rows, threads, first = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
        print(f"{case(name, rows, threads, first):.1f}")
        return
    print(f"{'model':<11} {'rows':>4} {'threads':>7} {'one thread ms':>13} {'two threads ms':>14} {'slower':>7}")
    for name in ("tiny-llada", "tiny-ar"):
        for rows in (1, 16):
            for threads in (1, 2):
                ms = [float(subprocess.run([sys.executable, __file__, name, str(rows), str(threads), first],
                                           capture_output=True, text=True, check=True).stdout.split()[-1])
                      for first in ("0", "1")]
                print(f"{name:<11} {rows:>4} {threads:>7} {ms[0]:>13.1f} {ms[1]:>14.1f} {ms[1] / ms[0]:>6.2f}x")


if __name__ == "__main__":
    main()
