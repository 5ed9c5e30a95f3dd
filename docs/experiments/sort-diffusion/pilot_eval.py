"""Exact match on validation `sort` items of 2-24 letters at canvases 32 and 128 (vanilla decoding).

    python docs/experiments/sort-diffusion/pilot_eval.py MODEL [N] [--eos-last] [--mid] [--remasking=NAME]

`--mid` takes items of 25-60 letters instead, at canvas 128 only.
`--eos-last` decodes with LLaDA's `confidence_eos_eot_inf` (EOS committed last) instead; the
length ratio is the mean of len(response) / len(answer).
`--remasking=margin` (or `entropy`, `random`) changes the order in which positions are committed;
the default is LLaDA's `low_confidence`.
"""

import sys
from pathlib import Path

import torch

from evals.quality import evaluate_items
from evals.tasks import make_split
from evals.tasks.mixture import SORT_BANDS
from models import load
from sampler import SamplerConfig


def main() -> None:
    torch.set_num_threads(2)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    loaded, n = load(Path(args[0])), int(args[1]) if len(args) > 1 else 60
    mid = "--mid" in sys.argv
    remasking = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--remasking=")), "low_confidence")
    items = make_split(SORT_BANDS["sort-mid" if mid else "sort-short"], "validation", n)
    for canvas in (128,) if mid else (32, 128):
        config = SamplerConfig(steps=canvas, gen_length=canvas, block_length=32, confidence_eos_eot_inf="--eos-last" in sys.argv,
                               remasking=remasking)
        result = evaluate_items(loaded, items, config, batch_size=32)
        ratio = sum(len(p["response"]) / len(i.answer) for p, i in zip(result["predictions"], items)) / len(items)
        accuracy = {k: round(v, 3) for k, v in result["accuracy"].items()}
        print(f"sort {'25-60' if mid else '2-24'} letters, canvas {canvas}, {remasking}: {accuracy}, length ratio {ratio:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
