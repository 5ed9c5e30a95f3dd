"""The DEMO banner: the first line of every verdict `unmask` prints (run, gates, promote) while the policy, the
roles or the registry is a demonstration (`demo: true`, `unmask run --demo`), so a demo never reads as a decision."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

BANNER = "DEMO — not a decision"


def print_demo_banner(out: Any, policy: Any = None, registry: Any = None) -> list[str]:
    """Print the banner when anything judging this verdict is a demo; `policy` a loaded Policy or a path (None: the
    bundled one), `registry` an open Registry (None: the configured one). Returns the marks (empty: no banner).
    A part that cannot be read says nothing here: the command reports its own errors."""
    from gates import PolicyError, load_policy
    from gates.roles import RolesError, load_roles
    from registry import Registry, RegistryError
    from registry.demo import demo_marks

    def read(load: Callable[[], T]) -> T | None:
        try:
            return load()
        except (PolicyError, RolesError, RegistryError, OSError):
            return None

    loaded = policy if hasattr(policy, "demo") else read(lambda: load_policy(policy))
    marks = demo_marks(None, loaded, read(load_roles))
    marks += read(lambda: demo_marks(registry or Registry(), None, None)) or []
    if marks:
        out.print(
            f"[bold white on red] {BANNER} [/bold white on red] {'; '.join(marks)}: thresholds relaxed, people "
            "made up; production cannot move on a real registry under it",
            highlight=False,
        )
    return marks
