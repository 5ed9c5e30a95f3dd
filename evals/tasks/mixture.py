"""The training stream of the bundled tiny models: one task per step, train split only."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from evals.tasks.base import Task, sample_split
from models.training import Batch


@dataclass
class TrainingMixture:
    """Batch `step` depends only on (`seed`, `step`): training is reproducible and resumable.

    Each step draws one task with probability `weights[name]` and `batch_sizes[name]` train items
    of it, so a batch holds sequences of similar length (little padding).
    """

    tasks: dict[str, Task]
    weights: dict[str, float]
    batch_sizes: dict[str, int]
    seed: int = 0
    names: list[str] = field(init=False)

    def __post_init__(self) -> None:
        for name in self.weights:
            if name not in self.tasks or name not in self.batch_sizes:
                raise ValueError(f"TrainingMixture: task '{name}' needs an entry in tasks and batch_sizes")
        self.names = sorted(self.weights)

    def batch(self, step: int):

        rng = random.Random(f"mixture:{self.seed}:{step}")
        name = rng.choices(self.names, weights=[self.weights[n] for n in self.names])[0]
        task = self.tasks[name]
        items = [sample_split(task, "train", rng) for _ in range(self.batch_sizes[name])]
        return Batch(group=name, gen_length=task.gen_length, pairs=[(i.prompt, i.answer) for i in items])


DEFAULT_WEIGHTS = {"arith": 0.2, "arith-ko": 0.2, "sort": 0.45, "infill": 0.15}
DEFAULT_BATCH_SIZES = {"arith": 48, "arith-ko": 48, "sort": 32, "infill": 48}
