"""Capacity pilot: train a tiny-llada-shaped model from step 0 on `sort` only, at a chosen depth and width.

    python docs/experiments/sort-diffusion/scratch_train.py WORK STEPS LAYERS [D_MODEL] [--threads N] [--resume]
        [--device cuda --batch-scale K]

Sort bands padded to the 128-position scoring canvas (2-24 letters 0.5, 25-60 0.3, 61-120 0.2, same
tokens per step, ~5.3k, times --batch-scale); LLaDA's masked-diffusion objective with EOS padding, as the shipped recipe.
No arithmetic competes for the weights: the run measures whether the architecture at that size
learns sort at all, and how the depth changes that per step and per second.
"""

import argparse
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console

import models.training as training
from evals.tasks import alphabet
from evals.tasks.mixture import SORT_BANDS, SORT_CURRICULUM_BATCH_SIZES, TrainingMixture
from models.tokenizer_build import build_char_tokenizer

WEIGHTS = {"sort-short128": 0.5, "sort-mid128": 0.3, "sort-long128": 0.2}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("layers", type=int)
    parser.add_argument("d_model", type=int, nargs="?", default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-scale", type=int, default=1, help="items per step times K (a GPU takes larger batches)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch_sizes = {name: size * args.batch_scale for name, size in SORT_CURRICULUM_BATCH_SIZES.items()}
    source = TrainingMixture(SORT_BANDS, WEIGHTS, batch_sizes, seed=2)
    cfg = replace(training.RECIPES["tiny-llada"], model_id=f"sort-L{args.layers}-d{args.d_model}", steps=args.steps,
                  n_layers=args.layers, d_model=args.d_model, n_heads=args.d_model // 32, mlp_hidden=3 * args.d_model,
                  mixture="pilot", checkpoint_every=500)
    training.train(cfg, source, build_char_tokenizer(alphabet()), args.work / "out", args.work / "state",
                   resume=args.resume, console=Console(force_terminal=False), device=args.device)


if __name__ == "__main__":
    main()
