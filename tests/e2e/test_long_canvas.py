"""Accuracy floors of the bundled tiny-llada at long canvases, on held-out test items (issue 22).

The model was fine-tuned on canvases of 32 to 512 positions (models/training.py RECIPES["tiny-llada"]), so
its answers hold where the base model's EOS run crept into them (12.5% of arith at 256). The card has the
full table on 100 items per task and length (models/weights/tiny-llada/MODEL_CARD.md); these are floors a
few points under what 32 items score, so a regressed checkpoint or sampler fails them. Decoding is greedy:
the same weights give the same answers.
"""

from __future__ import annotations

import pytest

from evals.model_report import mode_config
from evals.quality import evaluate_items
from evals.tasks import TASKS, make_split
from models import load


@pytest.fixture(scope="module")
def model():
    return load("tiny-llada")


def accuracy(model, task: str, mode: str, gen_length: int, n: int = 32) -> float:
    items = make_split(TASKS[task], "test", n, seed=0)
    return evaluate_items(model, items, mode_config(mode, gen_length), batch_size=n)["accuracy"]["strict-match"]


@pytest.mark.parametrize("gen_length", [256, 512])
@pytest.mark.parametrize("task", ["arith", "arith-ko"])
def test_the_windowed_fast_config_holds_accuracy_at_long_canvases(model, task, gen_length):
    # dual cache, threshold 0.9, early exit, a 16-position future window: 3-4 model calls per batch
    assert accuracy(model, task, "threshold+dual+exit+W16", gen_length) >= 0.9


@pytest.mark.parametrize("gen_length", [256, 512])
@pytest.mark.parametrize("task", ["arith", "arith-ko"])
def test_vanilla_decoding_holds_accuracy_at_long_canvases(model, task, gen_length):
    # vanilla's text exactly (early exit stops only once the answer is final), one token per step; 16 items keep
    # it to seconds (the card has 100 per task and length: 88% at 512)
    assert accuracy(model, task, "vanilla+exit", gen_length, n=16) >= 0.8
