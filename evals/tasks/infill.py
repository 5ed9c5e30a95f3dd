"""`infill`: fill the missing middle terms of an arithmetic progression given prefix and suffix.

Difficulty: seven terms below 100, step 1-9, one to three consecutive inner terms replaced by `?`.
The item keeps prefix and suffix apart (`TaskItem.key`) so a diffusion-native variant can place
mask tokens in the gap instead of `?`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evals.tasks.base import TaskItem

TERMS = 7


@dataclass(frozen=True)
class InfillTask:
    name: str = "infill"
    gen_length: int = 32
    metrics: tuple[str, ...] = ("exact-match", "char-accuracy")

    def sample(self, rng: random.Random) -> TaskItem:
        step = rng.randint(1, 9)
        start = rng.randint(0, 99 - step * (TERMS - 1))
        terms = [str(start + i * step) for i in range(TERMS)]
        span = rng.randint(1, 3)
        first = rng.randint(1, TERMS - 1 - span)
        middle = " ".join(terms[first : first + span])
        shown = terms[:first] + ["?"] * span + terms[first + span :]
        return TaskItem(
            task=self.name,
            prompt="Fill: " + " ".join(shown),
            answer=middle,
            target=middle,
            key=f"infill:{start}:{step}:{first}:{span}",
        )

    def alphabet(self) -> set[str]:
        return set("0123456789 ?Fil:")
