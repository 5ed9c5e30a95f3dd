"""A sweep on a real Dask cluster: `dask scheduler` and two `dask worker` processes started here on 127.0.0.1
and addressed by URL, as a user addresses their cluster. Its records equal a local run's (clocks aside); a
worker killed mid-sweep loses nothing and records nothing twice; `--gpus-per-cell` becomes a Dask worker
resource request."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distributed import get_task_stream

from flows.evaluate import EvaluationOptions, evaluate_on
from tests.support.flow_fixtures import local_reference_then_cluster_home, records_without_clocks
from tests.support.servers import free_port, stop_group

STEPS = (2, 4, 6, 8)  # gen_length 8 in two blocks: an even step count per block


def dask_cli() -> str:
    return str(Path(sys.executable).with_name("dask"))


@pytest.fixture
def cluster(tmp_path):
    """A scheduler and two single-threaded workers without nannies (a killed worker stays dead); each worker
    advertises one abstract GPU, so cells asking for one can run on either."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False")
    logs = tmp_path / "dask-logs"
    logs.mkdir()

    def start(name, *argv):
        return subprocess.Popen(
            [dask_cli(), *argv],
            env=env,
            stdout=open(logs / f"{name}.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    scheduler = start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")
    workers = {
        name: start(
            name,
            "worker",
            address,
            "--name",
            name,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            "--host",
            "127.0.0.1",
            "--resources",
            "GPU=1",
        )
        for name in ("w1", "w2")
    }
    from distributed import Client

    client = Client(address, timeout=120)
    try:
        client.wait_for_workers(2, timeout=180)
        yield address, client, workers
    finally:
        client.close()
        for proc in [*workers.values(), scheduler]:
            stop_group(proc)


def test_a_sweep_on_two_dask_workers_equals_a_local_run_and_survives_a_killed_worker(
    prefect_harness, cluster, tmp_path, monkeypatch
):
    address, client, workers = cluster
    made = local_reference_then_cluster_home(tmp_path, monkeypatch, STEPS)
    model, sweep, local, home = made.model, made.sweep, made.local, made.home
    base = EvaluationOptions(reproducibility=False)
    killed: dict = {}

    def kill_a_worker_mid_sweep():
        """As soon as the first cell is stored, SIGKILL worker w1 (no goodbye to the scheduler); the scheduler
        hands whatever it held to w2. (Which cells w1 held at that instant is not observed here.)"""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            done = list((home / "results").glob("point-*")) if (home / "results").exists() else []
            if done:
                killed.update(name="w1", done_before=len(done))
                os.kill(workers["w1"].pid, signal.SIGKILL)
            time.sleep(0.02)

    import threading

    killer = threading.Thread(target=kill_a_worker_mid_sweep, daemon=True)
    killer.start()
    on_cluster_options = base.model_copy(update={"task_runner": "dask", "dask_address": address, "gpus_per_cell": 1})
    names = {address: info["name"] for address, info in client.scheduler_info(n_workers=-1)["workers"].items()}
    with get_task_stream(client) as stream:
        on_cluster = evaluate_on(on_cluster_options)(model, sweep, on_cluster_options)
    killer.join(5)

    assert killed, "no cell was stored: the kill never happened"
    assert workers[killed["name"]].wait(10) == -signal.SIGKILL
    assert killed["done_before"] < len(STEPS)  # it died mid-sweep
    assert (on_cluster["points"], on_cluster["failures"]) == (len(STEPS), [])
    # a cell the killed worker stored but died before reporting is run again elsewhere and found stored: reused,
    # not measured twice (seen once on a loaded machine); only such cells may be reused in this fresh home
    assert on_cluster["cached"] <= killed["done_before"]
    assert "w2" in {names.get(task["worker"]) for task in stream.data}  # the cluster's survivor measured cells
    cluster_records = records_without_clocks(on_cluster["files"])
    assert len({r["config_hash"] for r in cluster_records}) == len(cluster_records) == len(STEPS)  # none twice
    assert cluster_records == records_without_clocks(local["files"])  # the same measurements, clocks aside
    assert len(list((home / "results").glob("point-*"))) == len(STEPS)  # one stored result per cell


def test_gpus_per_cell_is_a_dask_worker_resource_and_a_ray_gpu_request():
    import dask

    from flows.runners import cell_resources

    with cell_resources("dask", 1):
        assert dask.get_annotations() == {"resources": {"GPU": 1}}
    with cell_resources("threads", 2):
        assert dask.get_annotations() == {}
    with pytest.raises(ValueError, match="task runner 'spark'"):
        cell_resources("spark", 1)
