"""What a table printed at 80 columns must be: every line within 80, nothing cut, each header whole or named."""

from __future__ import annotations

import re

NARROW = {"COLUMNS": "80"}


def dropped(text: str) -> str:
    """The columns a table at 80 columns names in its footer as not shown ("" when all fit)."""
    found = re.search(r"not shown at 80 columns: (.*?) \(a wider", text.replace("\n", " "), re.S)
    return found.group(1) if found else ""


def header_block(text: str) -> str:
    """The header rows of the (first) table: between its top border and the line under the headers."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.lstrip().startswith("┏"))
    under = next(i for i, line in enumerate(lines) if line.lstrip().startswith("┡"))
    return "\n".join(lines[top + 1 : under])


def fits_80(text: str, headers: list[str], names: list[str]) -> None:
    """Every table line fits 80 characters, nothing is cut into `…`, each header is shown with its words
    whole (wrapped at spaces at most) or named as not shown, and each model name appears whole.
    (A `next:` command may run longer: it is printed unbroken, to be copied.)"""
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in text.splitlines() if set(line) & set("┏┃┡│└")), text
    block = header_block(text)
    words = set(re.split(r"[\s┃]+", block))
    for header in headers:
        shown = all(word in words for word in header.split())
        assert shown or header in dropped(text), f"header {header!r} is neither whole nor named as dropped:\n{text}"
        assert not (shown and header in dropped(text).split(", ")), header
    cells = set(re.split(r"[\s│┃]+", text))
    for name in names:
        assert name in cells, f"model name {name!r} is not whole:\n{text}"
