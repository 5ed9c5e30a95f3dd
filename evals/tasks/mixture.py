"""The training stream of the bundled tiny models: one task per step, train split only."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from evals.tasks import TASKS
from evals.tasks.base import Task, sample_split
from evals.tasks.sort import SortTask
from models.training import Batch


@dataclass
class TrainingMixture:
    """Batch `step` depends only on (`seed`, `step`): training is reproducible and resumable.

    Each step draws one task with probability `weights[name]` and `batch_sizes[name]` train items
    of it, so a batch holds sequences of similar length (little padding).
    """

    tasks: Mapping[str, Task]
    weights: dict[str, float]
    batch_sizes: dict[str, int]
    seed: int = 0
    # (first step, weights) of later phases; before the first of them, `weights` holds
    phases: tuple[tuple[int, dict[str, float]], ...] = ()

    def __post_init__(self) -> None:
        for weights in [self.weights, *(w for _, w in self.phases)]:
            for name in weights:
                if name not in self.tasks or name not in self.batch_sizes:
                    raise ValueError(f"TrainingMixture: task '{name}' needs an entry in tasks and batch_sizes")
        self.phases = tuple(sorted(self.phases, key=lambda phase: phase[0]))

    def weights_at(self, step: int) -> dict[str, float]:
        current = self.weights
        for start, weights in self.phases:
            if step >= start:
                current = weights
        return current

    def batch(self, step: int) -> Batch:
        rng = random.Random(f"mixture:{self.seed}:{step}")
        weights = self.weights_at(step)
        names = sorted(weights)
        name = rng.choices(names, weights=[weights[n] for n in names])[0]
        task = self.tasks[name]
        items = [sample_split(task, "train", rng) for _ in range(self.batch_sizes[name])]
        return Batch(group=name, gen_length=task.gen_length, pairs=[(i.prompt, i.answer) for i in items])


DEFAULT_WEIGHTS = {"arith": 0.2, "arith-ko": 0.2, "sort": 0.45, "infill": 0.15}
DEFAULT_BATCH_SIZES = {"arith": 48, "arith-ko": 48, "sort": 32, "infill": 48}

# Sort by length band, each padded to a canvas that fits the band (the full `sort` task pads every
# item to 128): a 2-24 letter item costs ~60 positions instead of ~150, and its letters are not
# outweighed by 100 EOS targets. Same generator and keys, so the train/test split is unchanged.
SORT_BANDS = {
    "sort-short": SortTask(bands=((2, 24, 1.0),), gen_length=32),
    "sort-mid": SortTask(bands=((25, 60, 1.0),), gen_length=64),
    "sort-long": SortTask(bands=((61, 120, 1.0),), gen_length=128),
}
# the same bands on the 128-position canvas `sort` is scored on (canvas length does not transfer:
# a model trained on 32 positions sorts at 32 and not at 128, docs/experiments/sort-diffusion)
SORT_BANDS |= {f"{name}128": replace(task, gen_length=128) for name, task in SORT_BANDS.items()}
SORT_FOCUS_START = 16000
SORT_FOCUS_WEIGHTS = {
    "arith": 0.08,
    "arith-ko": 0.08,
    "infill": 0.04,
    "sort": 0.2,
    "sort-short": 0.25,
    "sort-mid": 0.2,
    "sort-long": 0.15,
}
SORT_FOCUS_BATCH_SIZES = DEFAULT_BATCH_SIZES | {"sort-short": 96, "sort-mid": 48, "sort-long": 24}

# A sort curriculum on the scoring canvas after the default mixture: short items first, then the
# 25-60 and 61-120 letter bands, with arith, arith-ko and infill kept in every phase. Batch sizes
# give each bucket about the same tokens per step (~5.3k).
SORT_CURRICULUM_START = 16000
SORT_CURRICULUM_PHASES = (
    (
        SORT_CURRICULUM_START,
        {
            "arith": 0.1,
            "arith-ko": 0.1,
            "infill": 0.05,
            "sort": 0.1,
            "sort-short128": 0.45,
            "sort-mid128": 0.15,
            "sort-long128": 0.05,
        },
    ),
    (
        21000,
        {
            "arith": 0.08,
            "arith-ko": 0.08,
            "infill": 0.04,
            "sort": 0.1,
            "sort-short128": 0.25,
            "sort-mid128": 0.3,
            "sort-long128": 0.15,
        },
    ),
    (
        27000,
        {
            "arith": 0.07,
            "arith-ko": 0.07,
            "infill": 0.03,
            "sort": 0.13,
            "sort-short128": 0.2,
            "sort-mid128": 0.3,
            "sort-long128": 0.2,
        },
    ),
)
SORT_CURRICULUM_BATCH_SIZES = DEFAULT_BATCH_SIZES | {"sort-short128": 38, "sort-mid128": 30, "sort-long128": 24}


# The long-canvas fine-tune (RECIPES["tiny-llada"]): arithmetic and infill on canvases of 32 to 512
# positions, sort kept at a small share (the finding that it is not learned at this budget stands).
LONG_CANVAS_WEIGHTS = {"arith": 0.3, "arith-ko": 0.3, "infill": 0.25, "sort": 0.15}

# The block-diffusion recipe (RECIPES["tiny-dgemma"]): arithmetic first, sort (four canvases of 32 for one
# answer) at a small share, so the two-core budget goes to the tasks the accuracy targets name.
BLOCK_DIFFUSION_WEIGHTS = {"arith": 0.35, "arith-ko": 0.35, "infill": 0.2, "sort": 0.1}

MIXTURES = {  # the data schedules a recipe can name (`TrainConfig.mixture`), by seed
    "default": lambda seed: TrainingMixture(TASKS, DEFAULT_WEIGHTS, DEFAULT_BATCH_SIZES, seed=seed),
    "sort-focus": lambda seed: TrainingMixture(
        TASKS | SORT_BANDS,
        DEFAULT_WEIGHTS,
        SORT_FOCUS_BATCH_SIZES,
        seed=seed,
        phases=((SORT_FOCUS_START, SORT_FOCUS_WEIGHTS),),
    ),
    "long-canvas": lambda seed: TrainingMixture(TASKS, LONG_CANVAS_WEIGHTS, DEFAULT_BATCH_SIZES, seed=seed),
    "block-diffusion": lambda seed: TrainingMixture(TASKS, BLOCK_DIFFUSION_WEIGHTS, DEFAULT_BATCH_SIZES, seed=seed),
    "sort-curriculum": lambda seed: TrainingMixture(
        TASKS | SORT_BANDS, DEFAULT_WEIGHTS, SORT_CURRICULUM_BATCH_SIZES, seed=seed, phases=SORT_CURRICULUM_PHASES
    ),
}


def build_mixture(name: str, seed: int = 0) -> TrainingMixture:
    """The data schedule a recipe names (`TrainConfig.mixture`)."""
    if name not in MIXTURES:
        raise ValueError(f"unknown training mixture {name!r}; known: {', '.join(MIXTURES)}")
    return MIXTURES[name](seed)


def describe_mixture(name: str) -> str:
    """The data schedule in words, for a model card."""
    mixture = build_mixture(name)
    names = sorted(set(mixture.weights).union(*(weights for _, weights in mixture.phases)))
    text = f"one task per step (weights {json.dumps(mixture.weights)}"
    for start, weights in mixture.phases:
        text += f"; from step {start}: weights {json.dumps(weights)}"
    text += f"; batch sizes {json.dumps({n: mixture.batch_sizes[n] for n in names})})"
    bands = [n for n in names if n in SORT_BANDS]
    if bands:
        text += ". " + ", ".join(
            f"`{n}` is `sort` restricted to {SORT_BANDS[n].bands[0][0]}-{SORT_BANDS[n].bands[0][1]} "
            f"letters on a {SORT_BANDS[n].gen_length}-position canvas"
            for n in bands
        )
    return text
