"""`sort`: sort a string of lowercase letters (duplicates allowed).

Each output letter depends on the others (how many of each letter came before), so committing
many positions in one step produces duplicates and omissions. Difficulty: 2-24 letters for 60%
of items, 25-60 for 25% and 61-120 for 15%, so answers of 100+ tokens exercise long generation
lengths while most items stay within what the two-core budget can learn (scores are also reported
per length band).
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
    # (shortest, longest, share of items) per length band
    bands: tuple[tuple[int, int, float], ...] = ((2, 24, 0.60), (25, 60, 0.25), (61, 120, 0.15))
    metrics: tuple[str, ...] = ("exact-match", "char-accuracy")

    def sample(self, rng: random.Random) -> TaskItem:
        low, high, _ = rng.choices(self.bands, weights=[share for *_, share in self.bands])[0]
        n = rng.randint(low, high)
        letters = "".join(rng.choice(LETTERS) for _ in range(n))
        answer = "".join(sorted(letters))
        return TaskItem(task=self.name, prompt=f"Sort: {letters}", answer=answer, target=answer, key=f"sort:{letters}")

    def alphabet(self) -> set[str]:
        return set(LETTERS) | set("Sort: ")
