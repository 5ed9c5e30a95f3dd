"""Faults: a run killed mid-sweep resumes without losing or recomputing a point; MLflow down, then back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from flows.evaluate import EvaluationOptions, evaluate_candidate
from tests.support.flow_fixtures import CANDIDATE, FALLBACK, seed_registry, tiny_models, write_sweep

NO_PROBE = EvaluationOptions(reproducibility=False)
RUN_ONE = (
    "import sys; from flows.evaluate import EvaluationOptions, evaluate_candidate; "
    "evaluate_candidate(sys.argv[1], sys.argv[2], EvaluationOptions(reproducibility=False))"
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("fault_models"))


def finished_points(home):
    return {p.name: p.stat().st_mtime_ns for p in (home / "results").glob("point-*")}


def test_a_run_killed_mid_sweep_resumes_and_recomputes_no_finished_point(
    prefect_harness, models, tmp_path, monkeypatch
):
    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    seed_registry(home)
    sweep = write_sweep(tmp_path / "four.yaml", [models[CANDIDATE]], steps=(2, 4, 6, 8))
    env = dict(os.environ, UNMASK_HOME=str(home), PREFECT_API_URL=prefect_harness)
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_ONE, models[CANDIDATE], sweep],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while not finished_points(home) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        proc.kill()  # SIGKILL: no clean-up of any kind, as when a machine goes away
        proc.wait(30)
    before = finished_points(home)
    assert 1 <= len(before) < 4, "the run must be killed after its first point and before its last"

    resumed = evaluate_candidate(models[CANDIDATE], sweep, NO_PROBE)
    assert resumed["points"] == 4 and resumed["cached"] == len(before) and not resumed["failures"]
    after = finished_points(home)
    assert len(after) == 4 and all(after[name] == mtime for name, mtime in before.items())  # none recomputed


def test_mlflow_down_retries_then_keeps_the_records_and_logs_them_when_it_is_back(
    prefect_harness, models, tmp_path, monkeypatch
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.review import gate_review
    from registry import Registry
    from tests.support.servers import free_port, stop_group, wait_healthy

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[FALLBACK]])
    options = NO_PROBE.model_copy(update={"mlflow_retries": 2, "mlflow_retry_delay_s": 0.2})

    down = evaluate_candidate(models[FALLBACK], sweep, options, return_state=True)
    assert down.is_failed()
    message = str(down.result(raise_on_failure=False))
    assert f"could not log {FALLBACK} to MLflow at {url} after 3 attempt(s)" in message
    assert "unreachable" in message and f"kept in {home / 'outbox'}" in message
    assert len(list((home / "outbox").glob("*.json"))) == 1
    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[down.state_details.flow_run_id]))
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:  # task run states reach the API as events, a moment after the flow has ended
            log_run = next(
                (r for r in client.read_task_runs(flow_run_filter=flow_run) if r.name == f"log {FALLBACK}"), None
            )
            if (log_run and log_run.state and log_run.state.is_failed()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert log_run.run_count == 3  # the first attempt and two retries

    folder = tmp_path / "server"
    folder.mkdir()
    server = subprocess.Popen(
        [
            os.path.join(os.path.dirname(sys.executable), "mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{folder / 'mlflow.db'}",
            "--artifacts-destination",
            str(folder / "artifacts"),
        ],
        cwd=folder,
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_healthy(url + "/health", server, timeout_s=120)
        review = gate_review([models[FALLBACK]], sweep, options)
        assert review["flushed"] == [f"{FALLBACK} (1 records)"]
        assert not list((home / "outbox").glob("*.json"))
        assert Registry(url).model_names() == [FALLBACK]
        assert review["outcomes"][0]["cached"] == 1  # the kept point was not measured again
    finally:
        stop_group(server)
