"""The dashboard as a server: `unmask dashboard` serves the state folder's registry headless until stopped by pid, and
through a real `mlflow server` the gate board is the same and runs link to the server's UI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from registry import signing
from tests.support.dashboard_pages import page
from tests.support.servers import free_port, stop, wait_healthy


def test_unmask_dashboard_serves_the_state_folders_registry_headless_until_stopped_by_pid(env, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the state folder's store, as after `unmask run`
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", "dashboard", "--port", str(port)],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/_stcore/health", server)
    finally:
        stop(server)  # `unmask dashboard` became the server: its pid is the server's
    output = server.stdout.read().replace("\n", "")
    assert f"registry: {env.tracking_uri}" in output and f"http://127.0.0.1:{port}" in output


def test_through_an_mlflow_server_the_board_is_the_same_and_runs_link_to_its_ui(env, monkeypatch, tmp_path):
    embedded = page("views/gate_board.py")
    port = free_port()
    log = tmp_path / "mlflow.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
                "--backend-store-uri",
                env.tracking_uri,
            ],
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", server, log)
        # the evidence was signed with the key ring beside the SQLite file; a client of the server verifies with
        # that same ring (docs/integrity.md: every host that reads a shared store holds its key ring)
        monkeypatch.setenv(signing.KEY_FILE_ENV, str(signing.ring_path(env.tracking_uri)))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        served = page("views/gate_board.py")
        assert served.table[1].value.equals(embedded.table[1].value)
        assert served.table[0].value.equals(embedded.table[0].value)
        candidate = page("views/candidate.py")
        runs = candidate.dataframe[-1].value
        assert all(
            url.startswith(f"http://127.0.0.1:{port}/#/experiments/") and url.endswith(run)
            for url, run in zip(runs.url, runs.run_id)
        )
    finally:
        stop(server)
