"""Command-line values checked where they are parsed: one callback per kind of value, shared by every command.

A bad value is a click usage error (exit 2) whose one line names the option and the value
(`--limit: must be a positive integer, got 0`), before any model is loaded or any store is opened.
The thread rule lives here too, so eval, run, bench, serve and train choose `--threads` the same way.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any
from urllib.parse import urlparse

import typer

THREADS_ENV = "UNMASK_THREADS"


def max_threads() -> int:
    """The most torch threads a command may ask for: the cores this process may run on (more only oversubscribes
    them, and `bench --threads 10000` once crashed torch's thread pool)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _bad_value(message: str, ctx: typer.Context, param: typer.CallbackParam) -> typer.BadParameter:
    """The usage error for a callback's value (typer types BadParameter's `param` as its private _TyperParameter,
    which is what it passes a callback; the callback itself must declare typer.CallbackParam to be given it)."""
    return typer.BadParameter(message, ctx=ctx, param=param)  # type: ignore[arg-type]  # typer: see above


def threads(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """--threads: 1 up to this machine's cores (`max_threads`)."""
    positive(ctx, param, value)
    if value is not None and value > max_threads():
        raise _bad_value(
            f"must be at most {max_threads()} (the cores this machine gives unmask), got {value!r}",
            ctx=ctx,
            param=param,
        )
    return value


def _name(param: Any) -> str:
    opts: list[str] = getattr(param, "opts", None) or [f"--{getattr(param, 'name', 'value')}"]
    return max(opts, key=len)


def positive(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An optional count that must be at least 1 when given (--limit, --steps, --threads, --gen-length ...)."""
    for one in value if isinstance(value, (list, tuple)) else [value]:
        if one is not None and one < 1:
            raise _bad_value(f"must be a positive integer, got {one!r}", ctx=ctx, param=param)
    return value


def executor(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """--executor: one of flows.runners.EXECUTORS (local, dask, ray)."""
    if value in (None, "local"):  # the default: no need to import Prefect to know it
        return value
    from flows.runners import EXECUTORS

    if value not in EXECUTORS:
        raise _bad_value(f"expected one of {', '.join(EXECUTORS)}, got {value!r}", ctx=ctx, param=param)
    return value


def non_negative(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A count that may be 0 (--warmup, --seed)."""
    if value is not None and value < 0:
        raise _bad_value(f"must be 0 or more, got {value!r}", ctx=ctx, param=param)
    return value


def port(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A TCP port to listen on: 1 to 65535."""
    if value is not None and not 1 <= value <= 65535:
        raise _bad_value(f"must be a TCP port from 1 to 65535, got {value!r}", ctx=ctx, param=param)
    return value


def device(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A torch device name: cpu, cuda, cuda:N or mps (whether it exists here is the loader's question)."""
    from models.loading import DEVICE_PATTERN

    if value is not None and not DEVICE_PATTERN.match(str(value)):
        raise _bad_value(f"must be cpu, cuda, cuda:N or mps, got {value!r}", ctx=ctx, param=param)
    return value


def positive_ints(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A comma-separated list of positive integers (--gen-lengths 64,128); at least one."""
    if value is None:
        return value
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise _bad_value(f"must be comma-separated positive integers, got {value!r}", ctx=ctx, param=param) from None
    if not numbers or any(n < 1 for n in numbers):
        raise _bad_value(f"must be comma-separated positive integers, got {value!r}", ctx=ctx, param=param)
    return value


def threads_rule(given: int | None, configured: int | None = None) -> tuple[int, str]:
    """(torch CPU threads, where the number came from): --threads, else the sweep's `threads`, else
    $UNMASK_THREADS, else 1.

    One, because torch's own default (every core) made `unmask eval` 60x slower than one thread on a
    loaded two-core host: intra-op threads spin-wait for cores busy with other work. `unmask bench`
    and the test suite already ran on one; a number that does not depend on the load also keeps the
    measurement cache (keyed by threads) stable between runs.
    """
    if given is not None:
        return given, "--threads"
    if configured is not None:
        return configured, "the sweep's threads"
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        threads = env_threads(env)
        if threads is None:
            raise typer.BadParameter(
                f"${THREADS_ENV} must be an integer from 1 to {max_threads()} (this machine's cores), got {env!r}"
            )
        return threads, f"${THREADS_ENV}"
    return 1, f"default; --threads or ${THREADS_ENV} to change"


def env_threads(value: str) -> int | None:
    """$UNMASK_THREADS as a thread count, or None where it is not an integer from 1 to this machine's cores (ASCII
    digits only: `'²'.isdigit()` is true, and int() then fails)."""
    value = value.strip()
    if not re.fullmatch(r"[0-9]+", value) or not 1 <= int(value) <= max_threads():
        return None
    return int(value)


def apply_threads(given: int | None, configured: int | None = None) -> tuple[int, str]:
    """Set torch's intra-op threads by `threads_rule` and return (threads, why) for the command to print."""
    import torch

    threads, why = threads_rule(given, configured)
    torch.set_num_threads(threads)
    return threads, why


def port_free(host: str, port: int, option: str = "--port") -> None:
    """Refuse (usage error, one line) a port another process listens on, before a server loads anything."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise typer.BadParameter(f"--host {host!r}: cannot be resolved ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            raise typer.BadParameter(
                f"{host}:{port} cannot be bound ({e.strerror}); another server may hold it, pick another with {option}",
                param_hint=option,
            ) from None


def token(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An id (a rollout's, a run's): letters, digits, '.', '_', '-'; never a path such as ../x."""
    from models.state import check_token

    if value is not None:
        try:
            check_token(value, "id")
        except ValueError:
            raise _bad_value(
                f"expected an id (letters, digits, '.', '_', '-'), not a path; got {value!r}", ctx=ctx, param=param
            ) from None
    return value


def output_path(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An output file (--json): not a folder, and its folder can be created and written; checked before the work."""
    from pathlib import Path

    from models.state import unusable_folder

    if value is not None:
        path = Path(value).expanduser()
        why = f"{path} is a folder, not a file" if path.is_dir() else unusable_folder(path.parent)
        if why:
            raise _bad_value(f"{value}: cannot be written ({why})", ctx=ctx, param=param)
    return value


def output_folder(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An output folder (--out): a folder, or one that can be created, and writable; checked before the work."""
    from pathlib import Path

    from models.state import unusable_folder

    if value is not None:
        why = unusable_folder(Path(value).expanduser())
        if why:
            raise _bad_value(f"{value}: cannot be written ({why})", ctx=ctx, param=param)
    return value


# Environment variables unmask reads, and what each must name; checked before any command runs.
FILE_VARIABLES = ("UNMASK_CATALOG", "UNMASK_ROLES", "UNMASK_POLICY", "UNMASK_CHROMIUM")
FOLDER_VARIABLES = ("UNMASK_CHECKLISTS",)
# what MLflow's clients accept as a tracking URI scheme (a bare path has none); "postgresql+psycopg2" reads as
# postgresql
TRACKING_SCHEMES = (
    "file",
    "sqlite",
    "postgresql",
    "mysql",
    "mssql",
    "http",
    "https",
    "databricks",
    "databricks-uc",
    "uc",
)
WRITABLE_VARIABLES = ("UNMASK_HOME", "UNMASK_MODEL_STORE")


# commands that only read the store: an auditor's read-only copy of a state folder is enough for them
READING_COMMANDS = ("audit", "history")


def check_environment(environ: Any = None, command: str | None = None) -> None:
    """typer.BadParameter (one line, naming the variable and its value) for the first unusable variable; a command
    in READING_COMMANDS needs the state folder to exist, not to be writable."""
    from pathlib import Path

    from models.state import unusable_folder

    environ = os.environ if environ is None else environ

    def bad(name: str, why: str) -> typer.BadParameter:
        return typer.BadParameter(f"${name}={environ[name]!r}: {why}", param_hint=f"${name}")

    for name in FILE_VARIABLES:
        if environ.get(name) and not Path(environ[name]).expanduser().is_file():
            raise bad(name, "a folder, not a file" if Path(environ[name]).expanduser().is_dir() else "no such file")
    for name in FOLDER_VARIABLES:
        if environ.get(name) and not Path(environ[name]).expanduser().is_dir():
            raise bad(name, "no such folder")
    for name in WRITABLE_VARIABLES:
        if command in READING_COMMANDS and environ.get(name) and Path(environ[name]).expanduser().is_dir():
            continue
        if environ.get(name):
            why = unusable_folder(Path(environ[name]).expanduser())
            if why:
                raise bad(name, f"{why}; point it at a writable folder")
    if environ.get("UNMASK_ROLES"):  # who may act: refused as a whole now, not as "nobody holds poc" later
        from gates.roles import RolesError, load_roles

        try:
            load_roles(environ["UNMASK_ROLES"])
        except RolesError as e:
            raise typer.BadParameter(str(e), param_hint="$UNMASK_ROLES") from None
    if environ.get(THREADS_ENV, "").strip() and env_threads(environ[THREADS_ENV]) is None:
        raise bad(THREADS_ENV, f"expected an integer from 1 to {max_threads()} (this machine's cores)")
    uri = environ.get("MLFLOW_TRACKING_URI", "").strip()
    scheme = urlparse(uri).scheme.split("+")[0]
    if uri and scheme in ("", "file") and environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise bad(
            "MLFLOW_TRACKING_URI",
            "a file store (a path or file: URI), which MLflow no longer opens; name a database, e.g. "
            "sqlite:///PATH/mlflow.db, or the http(s):// URL of an mlflow server",
        )
    if scheme and scheme not in TRACKING_SCHEMES:
        raise bad(
            "MLFLOW_TRACKING_URI",
            f"unknown scheme {scheme!r}; expected sqlite:///PATH, postgresql://... or the http(s):// URL "
            "of an mlflow server",
        )


def alias_name(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A stage or registry alias (candidate, poc, staging, production, fallback)."""
    from registry.store import ALIASES

    if value is not None and value not in ALIASES:
        raise _bad_value(f"expected one of {', '.join(ALIASES)}, got {value!r}", ctx=ctx, param=param)
    return value
