"""The task suite: procedurally generated problems with disjoint splits, a GSM8K loader, scoring."""

from __future__ import annotations

from evals.tasks.arith import ArithTask
from evals.tasks.base import SPLITS, Task, TaskItem, check_disjoint, make_split, sample_split, split_of
from evals.tasks.gsm8k import GSM8KTask, load_gsm8k
from evals.tasks.infill import InfillTask
from evals.tasks.scoring import flexible_extract, mean_score, score, strict_match
from evals.tasks.sort import SortTask

TASKS: dict[str, Task] = {
    "arith": ArithTask("en"),
    "arith-ko": ArithTask("ko"),
    "sort": SortTask(),
    "infill": InfillTask(),
}


def get_task(name: str) -> Task:
    """A generated task by name; ValueError lists the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}") from None


def alphabet() -> str:
    """Every character the generated tasks use, sorted: the tiny models' vocabulary."""
    chars: set[str] = set()
    for task in TASKS.values():
        chars |= task.alphabet()
    return "".join(sorted(chars))


__all__ = [
    "SPLITS",
    "TASKS",
    "ArithTask",
    "GSM8KTask",
    "InfillTask",
    "SortTask",
    "Task",
    "TaskItem",
    "alphabet",
    "check_disjoint",
    "flexible_extract",
    "get_task",
    "load_gsm8k",
    "make_split",
    "sample_split",
    "mean_score",
    "score",
    "split_of",
    "strict_match",
]
