"""The state folder: where unmask keeps what it writes at run time ($UNMASK_HOME, else ./.unmask).

The embedded MLflow store, promotion locks, Prefect's home, cached results, the outbox and the model
store all live under it, so one variable moves them together. The rule sits in `models/` because the
model store is the lowest layer that reads it; everything above imports it from here.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_ENV = "UNMASK_HOME"


def state_dir(create: bool = True) -> Path:
    """The runtime state folder: $UNMASK_HOME, else .unmask/ in the current directory.

    `create=False` only names it: looking something up (is a model pulled?) leaves no folder behind.
    """
    home = os.environ.get(STATE_ENV)
    path = Path(home).expanduser() if home else Path.cwd() / ".unmask"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
