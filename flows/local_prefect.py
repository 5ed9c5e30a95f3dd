"""Prefect's local mode, booted at the start of a command instead of at its first flow.

Without PREFECT_API_URL, Prefect starts a temporary API server (a uvicorn child over its SQLite database in
PREFECT_HOME) inside the first flow call, and waits for it: on two cores some 3 s of a fully cached
`unmask run`, plus the 2 s of importing `prefect.server` that only this start needs in this process.
`LocalPrefect.boot()` starts the same server (`prefect.server.api.server:create_app`, as Prefect's own local
mode does) before the command imports torch and MLflow, so it boots on the other core meanwhile; `api()`
then points Prefect at it for the command's flows. One server per process, stopped at exit. With
PREFECT_API_URL set (a real server, or the test harness), nothing is started and `api()` changes nothing.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ContextManager, Iterator

STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"  # Prefect's own setting, reused
STOP_GRACE_S = 5.0


class LocalPrefect:
    """A temporary Prefect API server on 127.0.0.1 that this process started and stops."""

    _running: LocalPrefect | None = None

    def __init__(self, log: Path) -> None:
        self.log = log
        self.port = _free_port()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.child = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory", "prefect.server.api.server:create_app",
                 "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
                env=os.environ | {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                                  "PREFECT__SERVER_FINAL": "1"},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self._ready = False
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
        """Whether the server answers /health before Prefect's startup timeout (it exits early: False)."""
        if self._ready:
            return True
        deadline = time.monotonic() + float(os.environ.get(STARTUP_TIMEOUT_ENV) or 90)
        while time.monotonic() < deadline and self.child.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as answer:
                    self._ready = answer.status == 200
                    if self._ready:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        return False

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


def api(local: LocalPrefect | None, warn=print) -> ContextManager[object]:
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
def _settings(api_url: str) -> Iterator[None]:
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


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
        return sock.getsockname()[1]
