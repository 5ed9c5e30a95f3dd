"""docs/walkthrough.md read as steps: each bash block's commands and expected exits, the excerpt it shows, the
screenshots after it. tests/e2e/test_walkthrough.py runs them; bench/walkthrough_timed.py times them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tests.support import REPO

DOC = REPO / "docs" / "walkthrough.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
IMAGE = re.compile(r"^!\[([^\]]*)\]\((walkthrough/[^)]+\.png)\)", re.M)
EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")
EXPORT = re.compile(r"^export\s+(\w+)=(\S+)")
ASSIGNMENT = re.compile(r"^(\w+)=(.*)$")
VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")
SHELL_SYNTAX = re.compile(r"[|&;<>`(){}*?'\\]|\$\(")  # beyond assignments, words and $NAME: bash runs the line


@dataclass
class Step:
    commands: list[tuple[str, int]] = field(default_factory=list)  # (command line, expected exit)
    exports: dict[str, str] = field(default_factory=dict)
    excerpt: list[str] = field(default_factory=list)
    screenshots: list[str] = field(default_factory=list)  # docs-relative png paths, taken after this step


def parse(text: str) -> list[Step]:
    """The page's steps in order: each bash block, the text excerpt right after it, the images after that."""
    marks = sorted(
        [(m.start(), "fence", m) for m in FENCE.finditer(text)]
        + [(m.start(), "image", m) for m in IMAGE.finditer(text)],
        key=lambda x: x[0],
    )
    steps: list[Step] = []
    for _, kind, m in marks:
        if kind == "image":
            assert steps, f"{DOC}: screenshot {m.group(2)} before any command"
            steps[-1].screenshots.append(m.group(2))
        elif m.group(1) == "bash":
            step = Step()
            for line in m.group(2).splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                if export := EXPORT.match(line):
                    step.exports[export.group(1)] = export.group(2)
                    continue
                expected = EXIT.search(line)
                command = line.split("#", 1)[0].strip() if "#" in line else line
                step.commands.append((command, int(expected.group(1)) if expected else 0))
            steps.append(step)
        elif m.group(1) == "text" and steps:
            steps[-1].excerpt += [line.strip() for line in m.group(2).splitlines() if line.strip()]
    return steps
