"""Servers the tests start on 127.0.0.1 (mlflow, streamlit, uvicorn, the rollout's children): a free port, a wait
until healthy that names why not, and a stop."""

from __future__ import annotations

import base64
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    url: str,
    server: subprocess.Popen | None = None,
    log: Path | None = None,
    timeout_s: float = 120.0,
    gone: Callable[[], str | None] | None = None,
) -> None:
    """Poll `url` until it answers 200; fail with the server's log if it exits (a process `server`, or
    `gone()` saying why for a server in a thread) or takes longer than `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server is not None and server.poll() is not None:
            raise AssertionError(
                f"{server.args[:4]} exited with {server.returncode}:\n{log.read_text() if log else ''}"
            )
        if gone is not None and (why := gone()):
            raise AssertionError(why)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {timeout_s:g} s:\n{log.read_text() if log else ''}")


def stop(server: subprocess.Popen) -> None:
    """Stop a server started by a test, by its pid."""
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


# a real `mlflow server` ---------------------------------------------------------------------------------------
TEAM_KEY = "team:ed25519:" + base64.b64encode(secrets.token_bytes(32)).decode()  # an Ed25519 ring's key


@pytest.fixture(scope="module")
def team_signing_key():
    """The hosts of a team share the store's signing key (docs/integrity.md); their processes inherit it. A module
    that needs it asks for it from a module-scoped autouse fixture, so it is set before the module's servers and
    stores write their first signed entry."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("UNMASK_SIGNING_KEY", TEAM_KEY)
        yield


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the server by its pid; it leads its own process group, so its workers go with it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def launch_mlflow_server(
    folder: Path, backend_store_uri: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 180
) -> tuple[str, subprocess.Popen]:
    """`mlflow server` on 127.0.0.1 over `backend_store_uri` with proxied artifacts under `folder`: (url, process).
    A PostgreSQL store is migrated first with `mlflow db upgrade`, as docs/team-setup.md does."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true") | (env or {})
    env.pop("MLFLOW_TRACKING_URI", None)
    mlflow_cli = str(Path(sys.executable).with_name("mlflow"))
    if backend_store_uri.startswith("postgresql"):
        subprocess.run(
            [mlflow_cli, "db", "upgrade", backend_store_uri], env=env, check=True, capture_output=True, timeout=300
        )
    log = open(folder / "server.log", "wb")
    proc = subprocess.Popen(
        [
            mlflow_cli,
            "server",
            *args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            backend_store_uri,
            "--serve-artifacts",
            "--artifacts-destination",
            str(folder / "artifacts"),
        ],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        wait_healthy(url + "/health", proc, log=folder / "server.log", timeout_s=timeout_s)
    except BaseException:
        stop_group(proc)
        raise
    return url, proc
