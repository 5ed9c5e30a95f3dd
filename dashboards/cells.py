"""How registry values appear in the dashboard's tables: one text per cell, so mixed columns render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gates.readable import significant

CHART_PADDING = {"left": 12, "top": 8, "right": 16, "bottom": 8}  # px: axis titles and end labels stay inside
VERDICT_MARK = {"passed": "passed", "failed": "failed", "not judged": "not judged"}


def value_text(value: Any) -> str:
    """A value as text: numbers to 3 significant digits, mappings as `k=v`, lists joined."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return significant(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={value_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value)
    # ">= 0.5" at the start of a cell would render as a Markdown quote
    return str(value).replace(">=", "≥").replace("<=", "≤")


def verdict_text(verdict: str, passed: int, total: int) -> str:
    mark = VERDICT_MARK.get(verdict, verdict)
    return f"{mark} {passed}/{total}" if total else mark


def version_label(model: str, version: str, aliases: list[str] | None = None) -> str:
    held = f" [{', '.join(aliases)}]" if aliases else ""
    return f"{model} v{version}{held}"


def holder_text(holder: Any) -> str:
    """An alias holder from `registry.read.aliases`: one {model, version}, several, or None."""
    if not holder:
        return "—"
    if isinstance(holder, list):
        return ", ".join(f"{h['model']} v{h['version']}" for h in holder)
    return f"{holder['model']} v{holder['version']}"


def policy_label(path: str, sha256: str) -> str:
    """A policy as the pages name it: its file and the sha256 of its bytes (what a verdict applied)."""
    if not path and not sha256:
        return "an unrecorded policy (judged before verdicts cited theirs)"
    return f"`{path or 'a policy given as data'}` (sha256 `{sha256}`)"


def policy_short(path: str, sha256: str) -> str:
    """A policy in a table cell: file name and the first 12 hex digits of its sha256."""
    return f"{Path(path).name} {sha256[:12]}" if path or sha256 else "unrecorded"
