"""Teacher-forced probes of a masked-diffusion model: which conditionals has it learned?

    python -m evals.probes models/weights/tiny-llada --task sort --split validation --n 20

Each probe shows the model the prompt and part of the reference answer (EOS-padded to the
canvas) and asks for one masked position; it needs no decoding, so it separates what the model
knows from what the decoding order makes of it:

- `next`: the answer's first i tokens given, the rest masked; predict token i (what left-to-right
  decoding needs; an AR model is trained on exactly this).
- `hole`: every other canvas position given; predict token i (local consistency).
- `end`: the whole answer given, the padding masked; predict the EOS right after it (knowing where
  the answer stops).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from evals.tasks import TASKS, TaskItem, make_split
from evals.tasks.mixture import SORT_BANDS
from models.checkpoint import LoadedModel, load_checkpoint

PROBES = ("next", "hole", "end")


@torch.no_grad()
def probe_items(loaded: LoadedModel, items: list[TaskItem], canvas: int) -> dict[str, dict[str, float]]:
    """Accuracy of each probe over `items`: `{probe: {"right": k, "asked": n, "accuracy": k / n}}`."""
    if loaded.causal:
        raise ValueError(f"{loaded.path}: the probes mask answer positions, which a causal model cannot read")
    counts = {name: [0, 0] for name in PROBES}
    for item in items:
        prompt = loaded.encode(item.prompt)
        answer = loaded.encode(item.answer)
        if len(answer) >= canvas:
            raise ValueError(f"{item.key}: answer of {len(answer)} tokens does not fit canvas {canvas} with an EOS")
        n, P = len(answer), len(prompt)
        full = answer + [loaded.eos_id] * (canvas - n)
        rows = {
            "next": [prompt + full[:i] + [loaded.mask_id] * (canvas - i) for i in range(n)],
            "hole": [prompt + full[:i] + [loaded.mask_id] + full[i + 1 :] for i in range(n)],
            "end": [prompt + answer + [loaded.mask_id] * (canvas - n)],
        }
        for name, batch in rows.items():
            asked = [n] if name == "end" else list(range(n))
            logits = loaded.model(torch.tensor(batch, device=next(loaded.model.parameters()).device)).logits
            predicted = logits[torch.arange(len(batch)), torch.tensor([P + i for i in asked])].argmax(dim=-1).tolist()
            counts[name][0] += sum(p == full[i] for p, i in zip(predicted, asked))
            counts[name][1] += len(asked)
    return {name: {"right": k, "asked": m, "accuracy": k / m if m else 0.0} for name, (k, m) in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument(
        "--task", default="sort", choices=sorted(TASKS | SORT_BANDS), help="a task, or a sort length band"
    )
    parser.add_argument("--split", default="validation")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--canvas", type=int, default=None, help="canvas length (default: the task's gen_length)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = (TASKS | SORT_BANDS)[args.task]
    loaded = load_checkpoint(args.model)
    result = probe_items(loaded, make_split(task, args.split, args.n), args.canvas or task.gen_length)
    print(json.dumps({"model": str(args.model), "task": args.task, "split": args.split, "n": args.n, **result}))


if __name__ == "__main__":
    main()
