"""Progress from flow bodies to whoever watches (the CLI's progress bar); a no-op when nobody does.

Flow bodies run in the calling process even when tasks run on Dask, so a process-wide reporter
is enough: tasks never call it, flows do as each future settles.
"""

from __future__ import annotations

from typing import Any, Callable

Reporter = Callable[[str, dict[str, Any]], None]

_reporter: Reporter | None = None


def set_reporter(reporter: Reporter | None) -> None:
    """Install (or with None, remove) the process-wide progress reporter."""
    global _reporter
    _reporter = reporter


def report(kind: str, **info: Any) -> None:
    """Tell the reporter: "plan" (points), "point" (one settled), "stage" (a step of a candidate), "failure"."""
    if _reporter is not None:
        _reporter(kind, info)
