"""Read real GSM8K JSONL files (`question`, `answer` ending in `#### N`) as task items."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from evals.tasks.base import TaskItem
from evals.tasks.scoring import normalise_number, strict_match
from models.unique_keys import DuplicateJSONKeyError, load_json

MAX_LINE_BYTES = 256 * 1024  # a GSM8K line is about 1 KiB; a 5 MB line grew a run to 24 GB before this cap


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
    with path.open("rb") as f:
        for lineno, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:  # refused before it is parsed, let alone tokenised
                raise ValueError(
                    f"{path}:{lineno}: line is over {MAX_LINE_BYTES // 1024} KiB; a task item is a "
                    f"question and an answer, not a document"
                )
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            if not line.strip():
                continue
            try:
                row = load_json(line)
            except DuplicateJSONKeyError as e:
                raise ValueError(f"{path}:{lineno}: {e}; each field once") from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object with question and answer, got {type(row).__name__}"
                )
            for field in ("question", "answer"):
                if not isinstance(row.get(field), str):
                    raise ValueError(f"{path}:{lineno}: field '{field}' must be a string, got {row.get(field)!r:.60}")
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
