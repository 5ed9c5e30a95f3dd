"""Pilot: continue a tiny-llada resumable state on one sort bucket only, with a fresh cosine segment.

    python docs/experiments/sort-diffusion/pilot_train.py STATE WORK STEPS BUCKET=WEIGHT[,...] [--rainbow]

`PILOT_THREADS` sets the torch threads (default 2).
STATE is a `last/` folder of `unmask train` (e.g. .unmask/train/tiny-llada/last), WORK an empty
folder for this run, BUCKET a name from evals/tasks/mixture.py SORT_BANDS or `sort-short128`
(2-24 letters padded to 128 positions, batch 38: the same tokens per step as sort-short's 96 x 32)
or `sort-mid128` (25-60 letters padded to 128, batch 30).
`--rainbow` ends each answer with one EOS and fills the rest of the canvas with a cycle of seven
pad tokens (Rainbow Padding, Kim et al. 2025); seven ASCII characters no task uses stand in for
the pad tokens, so the vocabulary and the checkpoint shapes stay as they are.
"""

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

import models.training as training
from evals.tasks import TASKS, alphabet
from evals.tasks.mixture import SORT_BANDS, SORT_FOCUS_BATCH_SIZES, TrainingMixture
from evals.tasks.sort import SortTask
from models.tokenizer_build import build_char_tokenizer

RAINBOW = "~`{}|^@"
BUCKETS = TASKS | SORT_BANDS | {"sort-short128": SortTask(bands=((2, 24, 1.0),), gen_length=128),
                                 "sort-mid128": SortTask(bands=((25, 60, 1.0),), gen_length=128)}
BATCH_SIZES = SORT_FOCUS_BATCH_SIZES | {"sort-short128": 38, "sort-mid128": 30}


def rainbow(encode):
    def encode_rainbow(tokenizer, batch, canvas, ids):
        tokens, attention, response = encode(tokenizer, batch, canvas, ids)
        pads = [tokenizer.token_to_id(c) for c in RAINBOW]
        P = tokens.shape[1] - canvas
        for row, (_, answer) in enumerate(batch.pairs):
            n = len(tokenizer.encode(answer, add_special_tokens=False).ids)
            for k, pos in enumerate(range(P + n + 1, P + canvas)):
                tokens[row, pos] = pads[k % len(pads)]
        return tokens, attention, response
    return encode_rainbow


def main() -> None:
    torch.set_num_threads(int(os.environ.get("PILOT_THREADS", "2")))
    state, work, more = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    weights = {k: float(v) for k, v in (kv.split("=") for kv in sys.argv[4].split(","))}
    if "--rainbow" in sys.argv[5:]:
        training.encode_diffusion = rainbow(training.encode_diffusion)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(state, work / "state" / "last")
    start = json.loads((state / "trainer_state.json").read_text())["state"]["step"]
    source = TrainingMixture(BUCKETS, weights, BATCH_SIZES, seed=1)
    cfg = replace(training.RECIPES["tiny-llada"], steps=start + more, restarts=(start,), restart_lr=1e-3,
                  mixture="pilot", checkpoint_every=500)
    training.train(cfg, source, build_char_tokenizer(alphabet()), work / "out", work / "state", resume=True, console=Console())


if __name__ == "__main__":
    main()
