"""Progress from flow bodies to whoever watches (the CLI's progress bar); a no-op when nobody does.

Flow bodies run in the calling process even when tasks run on Dask, so a process-wide reporter
is enough: flows report as each future settles. The one task that reports, `measure-point`, tells
"item" (done of total within the point) as it goes; on the threads runner (and a local Dask cluster's
in-process workers) that reaches the caller's bar, on a remote worker it reaches nobody (a no-op).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reporter = Callable[[str, dict[str, Any]], None]

_reporter: Reporter | None = None


def set_reporter(reporter: Reporter | None) -> None:
    """Install (or with None, remove) the process-wide progress reporter."""
    global _reporter
    _reporter = reporter


def report(kind: str, **info: Any) -> None:
    """Tell the reporter: "plan" (points), "item" (done/total inside a point), "point" (one settled), "stage"
    (a step of a candidate), "failure"."""
    if _reporter is not None:
        _reporter(kind, info)
