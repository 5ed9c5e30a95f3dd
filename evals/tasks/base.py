"""Task items, the task protocol and seeded, disjoint train / validation / test splits.

A split is decided by a hash of the item's *problem key* (for arith: operation and operands), so
a held-out problem never reaches training in any phrasing or language, whatever the seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass
from typing import Protocol

SPLITS = ("train", "validation", "test")
# Share of problem keys in each held-out split; the rest is train.
HELDOUT_SHARE = {"validation": 0.05, "test": 0.05}


@dataclass(frozen=True)
class TaskItem:
    """One problem: `prompt` is what the model sees, `answer` the full reference response,
    `target` what scoring compares (the final number, the sorted string, the missing span)."""

    task: str
    prompt: str
    answer: str
    target: str
    key: str  # the problem identity that decides the split
    split: str = "train"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


class Task(Protocol):
    # read-only members: the tasks are frozen dataclasses (arith's name is a property)
    @property
    def name(self) -> str: ...

    @property
    def gen_length(self) -> int: ...  # canvas positions the task is trained and evaluated with

    @property
    def metrics(self) -> tuple[str, ...]: ...  # metric names `score` returns

    def sample(self, rng: random.Random) -> TaskItem:
        """One item of any split; `make_split` filters by key."""
        ...

    def alphabet(self) -> set[str]:
        """Every character its items use (the tiny models' vocabulary is built from them)."""
        ...


def split_of(key: str) -> str:
    """The split a problem key belongs to, from a stable hash (Python's `hash` is salted)."""
    u = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    if u < HELDOUT_SHARE["test"]:
        return "test"
    if u < HELDOUT_SHARE["test"] + HELDOUT_SHARE["validation"]:
        return "validation"
    return "train"


def sample_split(task: Task, split: str, rng: random.Random, max_tries: int = 100_000) -> TaskItem:
    """Draw items from `task` until one falls in `split`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    for _ in range(max_tries):
        item = task.sample(rng)
        if split_of(item.key) == split:
            return TaskItem(**(item.to_dict() | {"split": split}))
    raise RuntimeError(f"task {task.name}: no {split} item in {max_tries} draws")


def make_split(task: Task, split: str, n: int, seed: int = 0, unique: bool = True) -> list[TaskItem]:
    """`n` items of `split`, reproducible from `seed`; held-out items are distinct problems."""
    rng = random.Random(f"{task.name}:{split}:{seed}")
    items: list[TaskItem] = []
    seen: set[str] = set()
    tries = 0
    while len(items) < n:
        item = sample_split(task, split, rng)
        tries += 1
        if unique and item.key in seen:
            if tries > 50 * n + 1000:
                raise ValueError(f"task {task.name}: only {len(items)} distinct {split} problems exist, asked for {n}")
            continue
        seen.add(item.key)
        items.append(item)
    return items


def check_disjoint(train: list[TaskItem], heldout: list[TaskItem]) -> None:
    """Raise ValueError when a held-out problem key or prompt also appears in `train`."""
    train_keys = {i.key for i in train}
    train_prompts = {i.prompt for i in train}
    for item in heldout:
        if item.key in train_keys or item.prompt in train_prompts:
            raise ValueError(f"{item.task} {item.split} item {item.key!r} also appears in train")
