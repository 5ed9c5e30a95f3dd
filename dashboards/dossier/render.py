"""The dossier as one self-contained HTML file (Jinja2, plots inlined as PNG data), stamped with the code
commit, the unmask version and a sha256 of its own content.

The stated sha256 is of the HTML with the hash itself written as 64 zeros (`PLACEHOLDER`), so anyone can
check it: put the zeros back, hash, compare (`content_sha256`, `verify_html`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from evals.plots import plot_quality_latency
from gates.readable import significant

TEMPLATE = "dossier.html.j2"
PLACEHOLDER = "0" * 64
STATED = re.compile(r'<meta name="unmask-dossier-sha256" content="([0-9a-f]{64})">')
REPO = Path(__file__).resolve().parents[2]


def code_commit() -> str:
    """`git rev-parse HEAD` of the code that builds the dossier, '+dirty' when it has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown (not a git checkout)"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (git not available)"


def unmask_version() -> str:
    try:
        return metadata.version("unmask")
    except metadata.PackageNotFoundError:
        return "unknown"


def plots(content: dict[str, Any]) -> list[dict[str, str]]:
    """Quality-vs-latency per task with the Pareto front and the AR fallback on the same axes, as data URIs."""
    evaluation = content["evaluation"]
    records = list(evaluation["records_objects"])
    if evaluation["fallback"]:
        records += evaluation["fallback"]["records_objects"]
    if not records:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        paths = plot_quality_latency(records, tmp, latency="latency_p95_s")
        return [
            {
                "task": p.stem.removeprefix("quality-latency-"),
                "src": "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode(),
            }
            for p in paths
        ]


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(Path(__file__).parent),
        autoescape=select_autoescape(["j2", "html"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["json"] = lambda v: json.dumps(v, sort_keys=True, default=str)
    env.filters["pct"] = lambda v: "-" if v is None else f"{100 * v:.1f}%"
    env.filters["num"] = _num
    env.filters["ms"] = lambda v: "-" if v is None else _num(v * 1000)
    env.filters["short"] = lambda v, n=8: (v or "")[:n]
    return env


def _num(value: Any, digits: int = 3) -> str:
    return significant(value, digits) if isinstance(value, (int, float)) else ("-" if value is None else str(value))


def render_html(content: dict[str, Any], generated_at: str | None = None) -> str:
    """The dossier HTML, its sha256 stated inside it."""
    stamp = {
        "commit": code_commit(),
        "unmask_version": unmask_version(),
        "generated_at": generated_at or datetime.now(UTC).isoformat(timespec="seconds"),
        "sha256": PLACEHOLDER,
    }
    html = _environment().get_template(TEMPLATE).render(c=content, stamp=stamp, plots=plots(content))
    digest = hashlib.sha256(html.encode()).hexdigest()
    return html.replace(PLACEHOLDER, digest)


def content_sha256(html: str) -> str:
    """The sha256 a dossier's HTML should state: of the HTML with its stated hash written as zeros."""
    stated = stated_sha256(html)
    return hashlib.sha256(html.replace(stated, PLACEHOLDER).encode()).hexdigest()


def stated_sha256(html: str) -> str:
    found = STATED.search(html)
    if not found:
        raise ValueError('not an unmask dossier: no <meta name="unmask-dossier-sha256"> in the HTML')
    return found.group(1)


def verify_html(html: str) -> bool:
    """Whether a dossier's HTML is what it says it is (its stated sha256 matches its content)."""
    return stated_sha256(html) == content_sha256(html)
