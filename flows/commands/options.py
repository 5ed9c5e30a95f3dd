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

import typer

THREADS_ENV = "UNMASK_THREADS"


def _name(param: Any) -> str:
    opts = getattr(param, "opts", None) or [f"--{getattr(param, 'name', 'value')}"]
    return max(opts, key=len)


def positive(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An optional count that must be at least 1 when given (--limit, --steps, --threads, --gen-length ...)."""
    for one in value if isinstance(value, (list, tuple)) else [value]:
        if one is not None and one < 1:
            raise typer.BadParameter(f"must be a positive integer, got {one!r}", ctx=ctx, param=param)
    return value


def non_negative(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A count that may be 0 (--warmup, --seed)."""
    if value is not None and value < 0:
        raise typer.BadParameter(f"must be 0 or more, got {value!r}", ctx=ctx, param=param)
    return value


def port(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A TCP port to listen on: 1 to 65535."""
    if value is not None and not 1 <= value <= 65535:
        raise typer.BadParameter(f"must be a TCP port from 1 to 65535, got {value!r}", ctx=ctx, param=param)
    return value


def device(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A torch device name: cpu, cuda, cuda:N or mps (whether it exists here is the loader's question)."""
    from models.loading import DEVICE_PATTERN

    if value is not None and not DEVICE_PATTERN.match(str(value)):
        raise typer.BadParameter(f"must be cpu, cuda, cuda:N or mps, got {value!r}", ctx=ctx, param=param)
    return value


def positive_ints(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """A comma-separated list of positive integers (--gen-lengths 64,128); at least one."""
    if value is None:
        return value
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise typer.BadParameter(f"must be comma-separated positive integers, got {value!r}", ctx=ctx,
                                 param=param) from None
    if not numbers or any(n < 1 for n in numbers):
        raise typer.BadParameter(f"must be comma-separated positive integers, got {value!r}", ctx=ctx, param=param)
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
        if not env.isdigit() or int(env) < 1:
            raise typer.BadParameter(f"${THREADS_ENV} must be a positive integer, got {env!r}")
        return int(env), f"${THREADS_ENV}"
    return 1, f"default; --threads or ${THREADS_ENV} to change"


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
            raise typer.BadParameter(f"{host}:{port} cannot be bound ({e.strerror}); another server may hold it, "
                                     f"pick another with {option}", param_hint=option) from None


def token(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
    """An id (a rollout's, a run's): letters, digits, '.', '_', '-'; never a path such as ../x."""
    from models.state import check_token

    if value is not None:
        try:
            check_token(value, "id")
        except ValueError:
            raise typer.BadParameter(f"expected an id (letters, digits, '.', '_', '-'), not a path; got {value!r}",
                                     ctx=ctx, param=param) from None
    return value
