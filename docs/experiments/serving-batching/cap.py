"""The batching cap of the bundled tiny models: one forward over 1, 4 and 16 rows at bench.py's operating points.

    PYTHONPATH=. .venv/bin/python docs/experiments/serving-batching/cap.py

For tiny-llada (masked diffusion) the timed forward is the whole canvas (arith prompt + 32 masks); for
tiny-ar one cached decoding step (a token over the prompt's KV cache). The cap at n rows, n * t(1) / t(n),
is the most a static batch of n can gain over one row at the model (`evals.batching_cap`): the ceiling
the server's batching gain in bench.py and `unmask loadtest` is read against.
"""

from __future__ import annotations

import argparse

from bench import OPERATING


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed forwards per row count (the median is kept)")
    args = parser.parse_args()
    from rich.console import Console
    from rich.table import Table

    import models
    from evals.batching_cap import ROWS, measure_cap
    from evals.evaluate import load_task
    from models.loading import resolve_model_path
    from sampler.config import SamplerConfig

    prompts = [item.prompt for item in load_task("arith", "test", max(ROWS)).items]
    table = Table(title="one forward at the operating point, by rows in the batch (median of "
                        f"{args.repeats} after a warm-up)")
    rows = [f"{n} row{'s' if n > 1 else ''} (ms)" for n in ROWS]
    for column in ("model", "forward", *rows, *(f"cap at {n}" for n in ROWS[1:])):
        table.add_column(column, justify="left" if column in ("model", "forward") else "right")
    for name, operating in OPERATING.items():
        handle = models.load(str(resolve_model_path(name)))
        config = SamplerConfig(**operating).with_(**handle.sampler_ids())
        cap = measure_cap(handle, config, [handle.encode(p) for p in prompts], ROWS, args.repeats)
        table.add_row(name, cap.forward, *(f"{cap.forward_s[n] * 1e3:.2f}" for n in ROWS),
                      *(f"{cap.cap(n):.2f}x" for n in ROWS[1:]))
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
