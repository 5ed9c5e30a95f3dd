"""What a failed command says: one line naming what happened and what to do, never a traceback.

`unmask` catches whatever a command lets escape (flows/cli.py); this module turns it into that line
and an exit code (2: the input is wrong, 1: something the tool depends on failed), and keeps the
traceback in `<state>/logs/errors.log` (or on the terminal with `unmask --debug`).
"""

from __future__ import annotations

import datetime as _dt
import errno
import os
import shutil
import sqlite3
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from models.state import state_dir
from registry.connection import not_authenticated

if TYPE_CHECKING:
    import logging

    from rich.console import Console

DEBUG_ENV = "UNMASK_DEBUG"
LOG_NAME = "errors.log"


def _chain(exc: BaseException) -> list[BaseException]:
    seen, out = set(), []
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        out.append(link)
        link = link.__cause__ or link.__context__
    return out


def _store() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri

    return str(state_dir(create=False) / "mlflow" / "mlflow.db")


def infrastructure(text: str) -> str | None:
    """The one line for a store failure named in an error's text (a RegistryError keeps only the words), else None."""
    code, line = _classify(text.lower(), set(), None)
    return line if code == 1 and "MLflow store" in line else None


def describe(exc: BaseException) -> tuple[int, str]:
    """(exit code, one line) for an exception no command handled."""
    chain = _chain(exc)
    return _classify(" ".join(str(e) for e in chain).lower(), {type(e).__name__ for e in chain}, exc)


def _classify(text: str, names: set[str], exc: BaseException | None) -> tuple[int, str]:
    chain = _chain(exc) if exc is not None else []
    refused = next((n for e in chain if (n := not_authenticated(_store(), e)) is not None), None)
    if refused is not None:
        return 2, str(refused)
    if "database is locked" in text or "database table is locked" in text:
        return 1, (
            f"the MLflow store {_store()} is locked by another process (another unmask run or an open "
            f"sqlite3 session); wait for it to finish or stop it, then run the command again"
        )
    if "readonly database" in text or "read-only" in text and "database" in text:
        return 1, (
            f"the MLflow store {_store()} is read-only; make the file and its folder writable, or set "
            f"UNMASK_HOME to a writable folder"
        )
    if "database or disk is full" in text or "no space left on device" in text or _full_disk(chain) is not None:
        where = _full_path(chain) or _store().removeprefix("sqlite:///")
        return 1, (
            f"cannot write {where}: {_full_reason(chain)}{free_space(where)}; the disk is full: free some space "
            f"(or set UNMASK_HOME to a folder on another disk) and run again: what was recorded before is kept"
        )
    if "read-only file system" in text or any(isinstance(e, OSError) and e.errno == errno.EROFS for e in chain):
        return 1, (
            f"{_full_path(chain) or _store()} is on a read-only file system; remount it writable or set "
            f"UNMASK_HOME to a writable folder: the store was left as it was"
        )
    if "disk i/o error" in text:  # SQLite's word for a write the file system refused (immutable, full disk)
        return 1, (
            f"the MLflow store {_store()} cannot be written (read-only, or the disk is full); make the file "
            f"and its folder writable, free some space, or set UNMASK_HOME to a writable folder"
        )
    if "unable to open database file" in text:
        return 1, (
            f"the MLflow store {_store()} cannot be opened (missing folder or no permission); check the path "
            f"or set UNMASK_HOME to a writable folder"
        )
    if (
        any(isinstance(e, sqlite3.DatabaseError) for e in chain)
        or "sqlite3.databaseerror" in text
        or "file is not a database" in text
    ):
        return 1, f"the MLflow store {_store()} is not a usable SQLite database; move it aside and run again"
    if (
        names & {"ConnectionError", "ConnectionRefusedError", "NewConnectionError", "MaxRetryError"}
        or "connection refused" in text
        or "max retries exceeded" in text
    ):
        tracking = os.environ.get("MLFLOW_TRACKING_URI", "")
        if not tracking or tracking.startswith(("sqlite:", "file:", "/")):  # no server to MLflow: Prefect's it was
            return 1, (
                f"the Prefect server {os.environ.get('PREFECT_API_URL') or 'this command started'} cannot be "
                f"reached (stopped while the command ran?); run the command again: what was measured is kept"
            )
        return 1, (
            f"the tracking server {tracking} cannot be reached; start it, "
            f"or unset MLFLOW_TRACKING_URI to use the embedded store"
        )
    if "PromotionBlocked" in names:
        return 1, (
            f"{_joined(exc)}; `unmask gates MODEL --stage STAGE` says what is missing and the commands that clear it"
        )
    if "ApprovalTimeout" in names or "never resumed" in text:  # Prefect may fail the paused run in its own words
        said = _joined(exc) if "ApprovalTimeout" in names else "no approval arrived before the timeout; nothing moved"
        return 1, (
            f"{said}; run `unmask request-promotion` again and answer it with "
            f"`unmask approve MODEL STAGE --comment ...` while it waits"
        )
    if exc is None:
        return 2, text
    if isinstance(exc, PermissionError):
        return 1, f"permission denied: {exc.filename or _first_line(exc)}; check who owns it, or set UNMASK_HOME"
    if isinstance(exc, ValueError):  # unmask's input errors (PolicyError, ChecklistError, ...) name file and key
        return 2, _first_line(exc)
    if isinstance(exc, MemoryError):
        return 1, "out of memory; use a smaller input, model or batch"
    return 1, f"unexpected {type(exc).__name__}: {_first_line(exc)}"


def _full_path(chain: list[BaseException]) -> str:
    """The file an OSError in the chain names, if any."""
    return next((str(e.filename) for e in chain if isinstance(e, OSError) and e.filename), "")


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # no space left, or none left to this user


def _full_disk(chain: list[BaseException]) -> OSError | None:
    return next((e for e in chain if isinstance(e, OSError) and e.errno in FULL_DISK), None)


def _full_reason(chain: list[BaseException]) -> str:
    """The system's words for the refused write ("No space left on device"), or SQLite's."""
    full = _full_disk(chain)
    return (full.strerror if full is not None else None) or "database or disk is full"


def free_space(path: str) -> str:
    """` (0 B free on /mnt/data)`: the free space of the file system that holds `path` (its nearest existing
    folder), and where it is mounted; nothing for what is not a local path (a server's URL)."""
    if not os.path.isabs(path):
        return ""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    mount = folder
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        free = float(shutil.disk_usage(folder).free)
    except OSError:
        return f" (free space unknown on {mount})"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while free >= 1024 and power < len(units) - 1:
        free /= 1024
        power += 1
    shown = f"{free:.0f} B" if power == 0 else f"{free:.1f} {units[power]}"
    return f" ({shown} free on {mount})"


def refused_write(error: object) -> TypeGuard[BaseException]:
    """Whether `error` is a write the machine refused (a full disk or quota, a read-only file system or store):
    that is no candidate's failure, and a flow that collects failures re-raises it, ending the run with its line."""
    if not isinstance(error, BaseException):
        return False
    chain = _chain(error)
    text = " ".join(str(e) for e in chain).lower()
    return (
        any(isinstance(e, OSError) and e.errno in (*FULL_DISK, errno.EROFS) for e in chain)
        or "database or disk is full" in text
        or "readonly database" in text
    )


def _joined(exc: BaseException | None) -> str:
    """A message with a list under it ("...is blocked:\n  - a\n  - b") as one line: "...is blocked: a; b"."""
    head, *items = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return head + " " + "; ".join(item.lstrip("- ") for item in items) if items else head


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def log_traceback(exc: BaseException, command: str) -> Path | None:
    """Append the traceback to <state>/logs/errors.log; None when even that cannot be written."""
    try:
        folder = state_dir(create=False) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOG_NAME
        stamp = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        with path.open("a", encoding="utf-8") as f:
            f.write(f"--- {stamp} unmask {command}\n")
            f.write("".join(traceback.format_exception(exc)))
        return path
    except OSError:
        return None


def print_error(console: Console, message: object) -> None:
    """`error: MESSAGE` on one line however wide the terminal: the message's brackets are text, not markup
    (a rich tag would eat "got ['free']"), and it is never wrapped, so a path and its key stay together."""
    from rich.markup import escape

    text = str(message)
    text = infrastructure(text) or " ".join(text.split())  # a locked store says so, not its SQL
    console.print("[red]error:[/red] " + escape(text), highlight=False, soft_wrap=True)


def _no_logged_traceback(record: logging.LogRecord) -> bool:
    return record.levelno < 40 or not record.exc_info and "Traceback" not in str(record.msg)


# Loggers that log an error with its traceback and then raise it: the raised error becomes unmask's one
# line, so the logged copy is dropped (kept with --debug). MLflow's SQL store logs every database error
# with its SQL; Prefect logs a failed flow or task run ("Encountered exception during execution").
TRACEBACK_LOGGERS = ("mlflow.store.db.utils", "prefect.flow_runs", "prefect.task_runs")


def quiet_store_tracebacks() -> None:
    """Drop the logged copies of errors that unmask reports itself (see TRACEBACK_LOGGERS)."""
    import logging

    for name in TRACEBACK_LOGGERS:
        log = logging.getLogger(name)
        if _no_logged_traceback not in log.filters:
            log.addFilter(_no_logged_traceback)
