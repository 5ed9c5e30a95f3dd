"""`unmask nightly serve` against a real `prefect server start`, as docs/flows.md tells users to run it.

The embedded local mode runs flows but cannot hold a schedule, so this is the one place the
schedule, the deployment and the serving process meet a real Prefect API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.nightly import NIGHTLY_DEPLOYMENT
from tests.support.servers import free_port, stop, wait_healthy

BIN = Path(sys.executable).parent
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def wait_for(what: str, probe, timeout: float, *logs: Path):
    """Poll `probe` until it returns something truthy; fail naming `what` (with the processes' logs) on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = probe()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(1)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    pytest.fail(f"{what}: not within {timeout:.0f} s\n{tails}")


# slow: a Prefect server, a serving process and one flow run: about a minute on two cores
def test_nightly_serve_registers_its_schedule_and_runs_what_the_server_asks(tmp_path):
    port = str(free_port())
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "DO_NOT_TRACK": "true",
        "UNMASK_HOME": str(tmp_path / "unmask"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    with open(server_log, "w") as log:
        server = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", port],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"{api}/health", server, server_log, timeout_s=180)
        with open(serve_log, "w") as log:
            serving = subprocess.Popen(
                [str(BIN / "unmask"), "nightly", "serve", "--cron", "0 3 * * *"],
                env=env | {"PREFECT_API_URL": api},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            def deployment():
                found = httpx.post(
                    f"{api}/deployments/filter", json={"deployments": {"name": {"any_": [NIGHTLY_DEPLOYMENT]}}}
                ).json()
                return found[0] if found else None

            served = wait_for("the nightly deployment on the server", deployment, 120, serve_log)
            (schedule,) = served["schedules"]
            assert schedule["active"] and schedule["schedule"]["cron"] == "0 3 * * *"
            assert schedule["schedule"]["timezone"] == "UTC"
            assert served["parameters"]["rollback_on_regression"] is True
            assert served["parameters"]["sweep"].endswith("evals/sweeps/default.yaml")

            run = created(f"{api}/deployments/{served['id']}/create_flow_run")

            def finished():
                state = httpx.get(f"{api}/flow_runs/{run['id']}").json()["state"]
                return state if state and state["type"] in TERMINAL else None

            state = wait_for("the triggered nightly run", finished, 240, serve_log)
            assert state["type"] == "COMPLETED", state  # run by the serving process, on an empty registry
            # the engine renamed it with the flow's own run name: our flow ran, not just a state change
            assert httpx.get(f"{api}/flow_runs/{run['id']}").json()["name"] == "nightly re-evaluation"
        finally:
            stop(serving)
    finally:
        stop(server)


def created(url: str, tries: int = 20) -> dict:
    """POST to a Prefect server on SQLite; a write that met a lock is answered 503 at once (Prefect's own client
    retries those; a bare request must too). Seen once with the suite in two shards at a time."""
    for _ in range(tries):
        answer = httpx.post(url, json={})
        if answer.status_code != 503:
            break
        time.sleep(0.5)
    assert answer.status_code in (200, 201), f"{url}: {answer.status_code} {answer.text[:500]}"
    return answer.json()
