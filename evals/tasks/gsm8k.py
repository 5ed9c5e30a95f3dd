"""Read real GSM8K JSONL files (`question`, `answer` ending in `#### N`) as task items."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evals.tasks.base import TaskItem
from evals.tasks.scoring import normalise_number, strict_match


@dataclass(frozen=True)
class GSM8KTask:
    """The real benchmark; items come from a file, not a generator."""

    name: str = "gsm8k"
    gen_length: int = 256
    metrics: tuple[str, ...] = ("strict-match", "flexible-extract")


def load_gsm8k(path: str | Path, split: str = "test", limit: int | None = None) -> list[TaskItem]:
    """Items of a GSM8K JSONL file; a malformed line raises ValueError naming file, line and field."""
    path = Path(path)
    items: list[TaskItem] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
            for field in ("question", "answer"):
                if not isinstance(row.get(field), str):
                    raise ValueError(f"{path}:{lineno}: field '{field}' must be a string")
            target = strict_match(row["answer"])
            if target == "[invalid]":
                raise ValueError(f"{path}:{lineno}: field 'answer' has no '#### N' final answer")
            items.append(
                TaskItem(
                    task="gsm8k",
                    prompt=row["question"],
                    answer=row["answer"],
                    target=normalise_number(target),
                    key=f"gsm8k:{path.name}:{lineno}",
                    split=split,
                )
            )
            if limit is not None and len(items) >= limit:
                break
    return items
