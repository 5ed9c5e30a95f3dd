"""Executors a sweep's cells fan out on, as Prefect task runners: threads on one machine (one cell at a time,
so latencies do not interfere), a Dask cluster (prefect-dask), or a Ray cluster (prefect-ray).

A cell is a sweep point, content-addressed by what determines its record (flows.tasks.point_cache_key:
weights sha256, effective config hash, task data hash, unmask version, how it is measured), so any executor
may run it and any later run reuses it; a cell re-run after a lost worker lands on the same key.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

RunnerKind = Literal["threads", "dask", "ray"]
# `--executor` -> runner
EXECUTORS: dict[str, RunnerKind] = {"local": "threads", "threads": "threads", "dask": "dask", "ray": "ray"}


def make_task_runner(
    kind: RunnerKind = "threads", dask_address: str | None = None, workers: int = 2, max_threads: int = 1
) -> TaskRunner[Any]:
    """The task runner a sweep fans out on.

    threads: `max_threads` points at a time in this process (1 keeps latency measurements honest).
    dask: the cluster at `dask_address` (a scheduler, e.g. tcp://host:8786, one worker per GPU host),
    else a local cluster of `workers` single-threaded workers.
    ray: the cluster at `dask_address` (e.g. ray://head:10001, or "auto"), else a local Ray.
    """
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=max_threads)
    if kind == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError as e:  # optional, like dask
            raise ValueError("executor 'ray' needs prefect-ray: pip install prefect-ray") from e
        ray_runner: TaskRunner[Any] = RayTaskRunner(address=dask_address) if dask_address else RayTaskRunner()
        return ray_runner  # prefect-ray ships no type information
    if kind != "dask":
        raise ValueError(f"task runner {kind!r}; expected 'threads', 'dask' or 'ray'")
    try:
        from prefect_dask.task_runners import DaskTaskRunner
    except ImportError as e:  # the [dask] extra is optional
        raise ValueError("task runner 'dask' needs prefect-dask: pip install 'unmask[dask]'") from e
    if dask_address:
        return DaskTaskRunner(address=dask_address)
    # processes=False: workers are threads of this process, so the model cache and the local result
    # storage are shared; a real cluster is given by address.
    return DaskTaskRunner(
        cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": False, "dashboard_address": None}
    )


def cell_resources(kind: str, gpus_per_cell: float) -> contextlib.AbstractContextManager[Any]:
    """A context to submit cells in that asks the executor for `gpus_per_cell` GPUs each, in its own syntax:
    Dask worker resources (`dask worker --resources GPU=N`; a cell waits for a worker that has one free),
    Ray's `num_gpus`. Threads run on this machine: nothing to ask for."""
    if not gpus_per_cell or kind == "threads":
        return contextlib.nullcontext()
    if kind == "dask":
        from dask.base import annotate

        return annotate(resources={"GPU": gpus_per_cell})
    if kind == "ray":
        from prefect_ray.context import remote_options

        ray_options: contextlib.AbstractContextManager[Any] = remote_options(num_gpus=gpus_per_cell)
        return ray_options  # prefect-ray ships no type information
    raise ValueError(f"task runner {kind!r}; expected 'threads', 'dask' or 'ray'")


def runner_kind(task_runner: TaskRunner[Any]) -> str:
    """The kind of a Prefect task runner: threads, dask or ray (else its class name)."""
    name = type(task_runner).__name__
    return {"ThreadPoolTaskRunner": "threads", "DaskTaskRunner": "dask", "RayTaskRunner": "ray"}.get(name, name)


def gpus_offered(kind: str, runner: Any) -> dict[str, float]:
    """GPUs each worker (Dask) or node (Ray) of the started `runner`'s cluster offers, by its address."""
    if kind == "dask":
        workers = runner.client.scheduler_info(n_workers=-1)["workers"]
        return {address: float(info.get("resources", {}).get("GPU", 0)) for address, info in workers.items()}
    if kind == "ray":
        import ray

        nodes = ray.nodes()  # type: ignore[no-untyped-call, unused-ignore]  # ray.nodes is unannotated
        return {node["NodeManagerAddress"]: float(node["Resources"].get("GPU", 0)) for node in nodes if node["Alive"]}
    return {}


def check_cell_resources(kind: str, gpus_per_cell: float, runner: Any) -> None:
    """Refuse, before any cell is submitted, a GPU request no worker of the cluster can meet: Dask and Ray would
    hold such a cell forever, waiting for a worker that has the resource."""
    if not gpus_per_cell or kind == "threads":
        return
    offered = gpus_offered(kind, runner)
    if max(offered.values(), default=0) >= gpus_per_cell:
        return
    where = ", ".join(f"{address}: {gpus:g}" for address, gpus in sorted(offered.items())) or "no workers"
    how = (
        "start its workers with `dask worker ADDRESS --resources GPU=N`"
        if kind == "dask"
        else "start its nodes with `ray start --num-gpus N`"
    )
    raise ValueError(
        f"--gpus-per-cell {gpus_per_cell:g}: no {kind} worker offers that many GPUs (GPUs per worker: "
        f"{where}); {how}, or ask for fewer"
    )
