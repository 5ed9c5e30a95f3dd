"""The state folder: where unmask keeps what it writes at run time ($UNMASK_HOME, else ./.unmask).

The embedded MLflow store, promotion locks, Prefect's home, cached results, the outbox and the model
store all live under it, so one variable moves them together. The rule sits in `models/` because the
model store is the lowest layer that reads it; everything above imports it from here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

STATE_ENV = "UNMASK_HOME"
# An id that names a file under the state folder (a rollout) or a run: letters and digits, then also `.`, `_`, `-`;
# never a path (`../x`, `/etc/x`), never empty, at most 128 characters.
TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_token(value: str, what: str) -> str:
    """`value` when it is an id of TOKEN's shape; ValueError naming `what` and the value otherwise."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise ValueError(f"{what} {value!r}: expected an id (letters, digits, '.', '_', '-'), not a path")
    return value


class StateFolderError(ValueError):
    """$UNMASK_HOME (or another folder unmask must write) cannot be a folder; the message names it and why."""


def unusable_folder(path: Path) -> str | None:
    """Why `path` cannot be used (or created) as a folder to write into, or None: a file where a folder must be,
    or the nearest existing folder not writable."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                return f"{part} is a file, not a folder"
            if not os.access(part, os.W_OK | os.X_OK):
                return f"{part} is not writable"
            return None
    return None


def state_dir(create: bool = True) -> Path:
    """The runtime state folder: $UNMASK_HOME, else .unmask/ in the current directory.

    `create=False` only names it: looking something up (is a model pulled?) leaves no folder behind. A command that
    writes into a read-only state folder is refused before it runs (`check_environment`), or fails naming the path.
    """
    home = os.environ.get(STATE_ENV)
    path = Path(home).expanduser() if home else Path.cwd() / ".unmask"
    if create and not path.is_dir():  # an existing folder is returned as it is: reading needs no write access
        why = unusable_folder(path)
        if why:
            raise StateFolderError(
                f"{'$' + STATE_ENV + '=' + home if home else 'the state folder ' + str(path)}: "
                f"{why}; point {STATE_ENV} at a writable folder"
            )
        path.mkdir(parents=True, exist_ok=True)
    return path.resolve()
