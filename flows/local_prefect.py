"""Prefect's local mode, booted at the start of a command instead of at its first flow.

Without PREFECT_API_URL, Prefect starts a temporary API server (a uvicorn child over its SQLite database in
PREFECT_HOME) inside the first flow call, and waits for it: on two cores some 3 s of a fully cached
`unmask run`, plus the 2 s of importing `prefect.server` that only this start needs in this process.
`LocalPrefect.boot()` starts the same server (`prefect.server.api.server:create_app`, as Prefect's own local
mode does) before the command imports torch and MLflow, so it boots on the other core meanwhile; `api()`
then points Prefect at it for the command's flows. One server per process, stopped at exit. With
PREFECT_API_URL set (a real server, or the test harness), nothing is started and `api()` changes nothing.

The child serves Prefect's app behind `RetryLocked` (`create_app` here): over SQLite, a request whose write
meets the server's own event consumers' write answers 503 at once ("database is locked", a deferred
transaction that cannot wait), and Prefect's client retries it after 2 s of backoff, a fifth of a fully cached
`unmask run`. The child retries such a request itself within milliseconds, as the client would have.

The child never outlives the command. It runs in a session of its own, so the terminal's Ctrl-C (sent to the
command's process group) does not stop it mid-run: the flows then record how they ended on a live server instead of
retrying a dead one for minutes, and the command stops the child as it exits. Should the command die without exiting
(kill -9, the OOM killer), the child's `ParentWatch` sees its parent gone within PARENT_POLL_S and stops itself.
A watch, rather than Linux's PR_SET_PDEATHSIG: that signal fires when the *thread* that started the child ends (a
command may boot from a worker thread), needs a preexec_fn (unsafe once threads run), and is Linux only; the watch
is told the parent's pid, so a parent that died before the child even started is caught too.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # Prefect's own setting, reused
STOP_GRACE_S = 5.0
PARENT_ENV = "UNMASK_PREFECT_PARENT_PID"  # the command that started the child, for its ParentWatch
PARENT_POLL_S = 0.5
LOCKED_RETRY_DELAYS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)  # then the 503 goes to the client, which backs off


class LocalPrefect:
    """A temporary Prefect API server on 127.0.0.1 that this process started and stops."""

    _running: LocalPrefect | None = None

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = _free_port()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--factory",
                    "flows.local_prefect:create_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "error",
                    "--lifespan",
                    "on",
                ],
                env=os.environ
                | {
                    "PREFECT_UI_ENABLED": "0",
                    "PREFECT__SERVER_EPHEMERAL": "1",
                    "PREFECT__SERVER_FINAL": "1",
                    PARENT_ENV: str(os.getpid()),
                },
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # out of reach of the terminal's Ctrl-C: the command stops it (see above)
            )
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self._ready = False
        self._watcher = threading.Thread(target=self._watch, name="local-prefect-watch", daemon=True)
        self._watcher.start()
        atexit.register(self.stop)

    @classmethod
    def boot(cls) -> LocalPrefect | None:
        """The process's server, started now if none runs; None when Prefect already has an API to talk to."""
        if _configured_api():
            return None
        if cls._running is None or cls._running.child.poll() is not None:
            home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
            cls._running = cls(home / "local-server.log")
        return cls._running

    def wait_ready(self) -> bool:
        """Whether the server answered /health before Prefect's startup timeout (it exits early: False)."""
        self._watcher.join()
        return self._ready

    def _watch(self) -> None:
        """Poll /health, then make the server's first API call (0.4 s of one-time setup on its side) while this
        process is still importing; `wait_ready` joins this thread."""
        deadline = time.monotonic() + float(os.environ.get(STARTUP_TIMEOUT_ENV) or 90)
        while time.monotonic() < deadline and self.child.poll() is None and not self._ready:
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as answer:
                    self._ready = answer.status == 200
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        if self._ready:
            try:
                urllib.request.urlopen(f"{self.api_url}/admin/version", timeout=10).close()
            except (urllib.error.URLError, OSError):
                pass  # only a warm-up: the flows' own first call says what is wrong

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.terminate()
            try:
                self.child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        if LocalPrefect._running is self:
            LocalPrefect._running = None

    def why_not(self) -> str:
        """The end of the server's log, for a line saying why it did not start."""
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        code = self.child.poll()
        state = f"exited with code {code}" if code is not None else "did not answer"
        return f"{state}{': ' + lines[-1] if lines else ''} (log: {self.log})"


def api(local: LocalPrefect | None, warn: Callable[[str], object] = print) -> AbstractContextManager[object]:
    """Prefect's settings for the command's flows: its API at `local` once that answers, and no flow-run
    heartbeats (they let a long-lived server find crashed runs; this server ends with the process, and joining
    the heartbeat thread cost up to 1 s a flow). If `local` never answers, Prefect's own local mode is left to
    start its server, and `warn` says why."""
    if local is None:
        return nullcontext()
    if not local.wait_ready():
        warn(f"note: the local Prefect server {local.why_not()}; Prefect starts its own")
        local.stop()
        return nullcontext()
    return _settings(local.api_url)


@contextmanager
def booted(warn: Callable[[str], object] = print) -> Iterator[None]:
    """`boot()` then `api()`, for a command whose flows follow its imports: the server boots while it imports."""
    with api(LocalPrefect.boot(), warn=warn):
        yield


@contextmanager
def stopped_if_refused(local: LocalPrefect | None) -> Iterator[None]:
    """Around a command's checks after `boot()`: refused (any exception, `typer.Exit` included), it stops the server it
    booted. A CLI that exits would stop it at exit anyway; a process that goes on (the CLI run in process, by a test
    or a notebook) kept it serving nothing, and its services polling, for the rest of its life."""
    try:
        yield
    except BaseException:
        if local is not None:
            local.stop()
        raise


@contextmanager
def _settings(api_url: str) -> Iterator[None]:
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def create_app() -> RetryLocked:
    """The child's app (`uvicorn --factory flows.local_prefect:create_app`): Prefect's, behind `RetryLocked`,
    watching the command that started it."""
    from prefect.server.api.server import create_app as prefect_app

    if os.environ.get(PARENT_ENV):
        ParentWatch(int(os.environ[PARENT_ENV])).start()
    return RetryLocked(prefect_app())


class ParentWatch(threading.Thread):
    """In the child: once its parent is no longer `parent` (it died, and the child was handed to init or a
    subreaper), stop this server as a SIGTERM does (uvicorn's graceful shutdown), and at once after STOP_GRACE_S."""

    def __init__(self, parent: int, poll_s: float = PARENT_POLL_S) -> None:
        super().__init__(name="parent-watch", daemon=True)
        self.parent = parent
        self.poll_s = poll_s

    def run(self) -> None:
        while os.getppid() == self.parent:
            time.sleep(self.poll_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os._exit(1)


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class RetryLocked:
    """ASGI middleware: an HTTP request answered 503 is run again after a short pause, at most
    len(`delays`) times, before its 503 goes out. Prefect's server answers 503 only for errors a client may
    retry (a locked SQLite database, a dropped connection), and its client retries every 503 after
    2**attempt seconds; retrying here is the same request, sooner. The request body is read once and replayed;
    a response other than 503 streams through untouched. The error that Starlette raises again after its
    handler answered 503 is dropped with that answer; on the last try both go out as Prefect made them.
    WebSockets and lifespan pass straight through."""

    def __init__(self, app: Callable[..., Awaitable[None]], delays: tuple[float, ...] = LOCKED_RETRY_DELAYS_S):
        self.app = app
        self.delays = delays

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = await _whole_body(receive)
        for delay in self.delays:
            answer = _Attempt(send)
            try:
                await self.app(_fresh(scope), _replay(body, receive), answer.send)
            except Exception:
                if not answer.refused:  # Starlette re-raises after its error handler answered: ours to drop
                    raise
            if not answer.refused:
                return
            await asyncio.sleep(delay)
        await self.app(_fresh(scope), _replay(body, receive), send)


class _Attempt:
    """One try's `send`: a 503 and its body are held back (refused); anything else goes out as it comes."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.refused = False

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.refused = message["status"] == 503
        if not self.refused:
            await self._send(message)


def _fresh(scope: dict[str, Any]) -> dict[str, Any]:
    """The request's scope as it came: routing writes into the one it is given (a mount's root_path)."""
    return scope | ({"state": dict(scope["state"])} if "state" in scope else {})


async def _whole_body(receive: Receive) -> list[dict[str, Any]]:
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body"):
            return messages


def _replay(body: list[dict[str, Any]], receive: Receive) -> Receive:
    """The body's messages again, then the real channel (a disconnect, once the client goes)."""
    pending = list(body)

    async def replayed() -> dict[str, Any]:
        return pending.pop(0) if pending else await receive()

    return replayed


def _configured_api() -> bool:
    """PREFECT_API_URL in the environment, or in Prefect's settings once it is imported (the test harness
    and `temporary_settings` set it there)."""
    if os.environ.get("PREFECT_API_URL"):
        return True
    if "prefect.settings" in sys.modules:
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value())
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
