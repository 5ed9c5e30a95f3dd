"""`sort`: sort a string of lowercase letters (duplicates allowed).

Each output letter depends on the others (how many of each letter came before), so committing
many positions in one step produces duplicates and omissions. Difficulty: lengths 2-40 for 60%
of items and 41-120 for the rest, so answers of 100+ tokens exercise long generation lengths.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from evals.tasks.base import TaskItem

LETTERS = string.ascii_lowercase


@dataclass(frozen=True)
class SortTask:
    name: str = "sort"
    gen_length: int = 128
    min_length: int = 2
    short_max: int = 40
    max_length: int = 120
    long_share: float = 0.4  # share of items longer than short_max
    metrics: tuple[str, ...] = ("exact-match", "char-accuracy")

    def sample(self, rng: random.Random) -> TaskItem:
        if rng.random() < self.long_share:
            n = rng.randint(self.short_max + 1, self.max_length)
        else:
            n = rng.randint(self.min_length, self.short_max)
        letters = "".join(rng.choice(LETTERS) for _ in range(n))
        answer = "".join(sorted(letters))
        return TaskItem(task=self.name, prompt=f"Sort: {letters}", answer=answer, target=answer, key=f"sort:{letters}")

    def alphabet(self) -> set[str]:
        return set(LETTERS) | set("Sort: ")
