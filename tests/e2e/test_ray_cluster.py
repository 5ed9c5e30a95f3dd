"""A sweep on a real Ray cluster: `ray start --head` in its own process group on 127.0.0.1 with two CPUs, no GPU
and a 100 MB object store, addressed by its address as a user addresses their cluster (`unmask run --executor ray
--executor-address HOST:PORT`); its cells run in Ray's worker processes. Its records equal a local run's (clocks
aside), a worker process killed mid-cell loses nothing and records nothing twice, and the test stops the cluster
itself.

Why one node and not a head plus a `ray start --address` worker node: Ray keeps its ports on loopback only when
told it is a one-machine cluster (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, ray._private.ray_constants), and then
`ray start --address` refuses to add a node ("Multi-node Ray clusters are not supported on Windows and OSX");
with multi-node allowed, 127.0.0.1 is rewritten to the host's routable address, and any other loopback address
(127.0.0.2) makes the GCS and raylets listen on every interface (seen: `*:6392`). docs/team-setup.md says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before anything imports ray: loopback only
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from flows.evaluate import EvaluationOptions, evaluate_on
from tests.support.flow_fixtures import local_reference_then_cluster_home, records_without_clocks
from tests.support.servers import free_port

STEPS = (2, 4, 6, 8)  # gen_length 8 in two blocks: an even step count per block
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's floor is 75 MB; the cells pass small JSON


def ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def stop_ray_node(proc: subprocess.Popen) -> None:
    """`ray start --block` drains and stops its node's processes on SIGTERM (up to ~30 s); whatever of its
    process group is left after that is killed. By pid and group only: never `ray stop`, which stops every
    Ray on the machine."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


@pytest.fixture
def ray_cluster(monkeypatch, tmp_path):
    """A one-node Ray cluster (a `ray start --head --block` process group) with two CPUs, so two cells run at a
    time, each in its own Ray worker process; yields (address, head process). Every port it opens is chosen here
    (two Rays on one machine must not share its fixed defaults); its session folder is short (its unix sockets
    live there, and their paths are bounded)."""
    import ray
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # this process's driver, on loopback too
    port, client_port, agent_port = free_port(), free_port(), free_port()
    worker_ports = ",".join(str(free_port()) for _ in range(6))
    address = f"127.0.0.1:{port}"
    session = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    log = tmp_path / "ray-head.log"
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.Popen(
        [
            ray_cli(),
            "start",
            "--head",
            "--block",
            "--node-ip-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--num-cpus",
            "2",
            "--num-gpus",
            "0",
            "--object-store-memory",
            str(OBJECT_STORE_BYTES),
            "--include-dashboard",
            "false",
            "--ray-client-server-port",
            str(client_port),
            "--dashboard-agent-listen-port",
            str(agent_port),
            "--worker-port-list",
            worker_ports,
            "--temp-dir",
            session,
            "--disable-usage-stats",
        ],
        env=env,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 240
        while b"Ray runtime started" not in log.read_bytes():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        ray.init(address=address, logging_level="WARNING")  # only to see it up; the flow connects anew
        try:
            assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}
            assert ray.cluster_resources().get("CPU") == 2 and "GPU" not in ray.cluster_resources()
        finally:
            ray.shutdown()
        yield address, head
    finally:
        stop_ray_node(head)
        shutil.rmtree(session, ignore_errors=True)


def ray_processes(head: subprocess.Popen) -> dict[int, str]:
    """pid -> title of every process under the head (Ray titles a worker `ray::IDLE`, or `ray::<task>` while busy)."""
    titles = {}
    try:
        children = psutil.Process(head.pid).children(recursive=True)
    except psutil.Error:  # the head is gone
        return titles
    for process in children:
        try:
            titles[process.pid] = " ".join(process.cmdline())
        except psutil.Error:  # it ended while being looked at
            pass
    return titles


def test_a_sweep_on_a_ray_cluster_equals_a_local_run_and_survives_a_killed_worker(
    prefect_harness, ray_cluster, tmp_path, monkeypatch
):
    address, head = ray_cluster
    made = local_reference_then_cluster_home(tmp_path, monkeypatch, STEPS)
    model, sweep, local, home = made.model, made.sweep, made.local, made.home
    base = EvaluationOptions(reproducibility=False)
    killed: dict = {}
    seen: set[str] = set()

    def kill_a_worker_mid_cell():
        """As soon as the first cell is stored, SIGKILL a Ray worker process that is measuring another one; Ray
        runs that cell again in a fresh worker."""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed and head.poll() is None:
            done = list((home / "results").glob("point-*")) if (home / "results").exists() else []
            titles = ray_processes(head)
            seen.update(t.split(" ")[0] for t in titles.values() if t.startswith("ray::"))
            busy = [pid for pid, title in titles.items() if title.startswith("ray::measure")]
            if done and busy:
                killed.update(pid=busy[0], done_before=len(done))
                os.kill(busy[0], signal.SIGKILL)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_a_worker_mid_cell, daemon=True)
    killer.start()
    on_cluster_options = base.model_copy(update={"task_runner": "ray", "dask_address": address})
    on_cluster = evaluate_on(on_cluster_options)(model, sweep, on_cluster_options)
    killer.join(5)

    assert killed, f"no cell was stored while another was measured: the kill never happened (seen: {seen})"
    assert not psutil.pid_exists(killed["pid"]) or psutil.Process(killed["pid"]).status() == psutil.STATUS_ZOMBIE
    assert killed["done_before"] < len(STEPS)  # it died mid-sweep
    assert "ray::measure-point" in seen and head.poll() is None  # Ray's workers measured the cells; still up
    assert (on_cluster["points"], on_cluster["failures"]) == (len(STEPS), [])
    # a cell the killed worker stored but died before reporting is run again elsewhere and found stored: reused,
    # not measured twice (seen once on a loaded machine); only such cells may be reused in this fresh home
    assert on_cluster["cached"] <= killed["done_before"]
    cluster_records = records_without_clocks(on_cluster["files"])
    assert len({r["config_hash"] for r in cluster_records}) == len(cluster_records) == len(STEPS)  # none twice
    assert cluster_records == records_without_clocks(local["files"])  # the same measurements, clocks aside
    assert len(list((home / "results").glob("point-*"))) == len(STEPS)  # one stored result per cell

    gpu = on_cluster_options.model_copy(update={"gpus_per_cell": 1})
    with pytest.raises(
        ValueError,
        match=r"--gpus-per-cell 1: no ray worker offers that many GPUs \(GPUs per "
        r"worker: 127\.0\.0\.1: 0\); start its nodes with `ray start --num-gpus N`",
    ):
        evaluate_on(gpu)(model, sweep, gpu)  # this cluster has no GPU: refused, not left waiting
