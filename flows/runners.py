"""Task runners: threads on one machine (one point at a time, so latencies do not interfere), or Dask."""

from __future__ import annotations

from typing import Literal

from prefect.task_runners import ThreadPoolTaskRunner

RunnerKind = Literal["threads", "dask"]


def make_task_runner(kind: RunnerKind = "threads", dask_address: str | None = None, workers: int = 2,
                     max_threads: int = 1):
    """The task runner a sweep fans out on.

    threads: `max_threads` points at a time in this process (1 keeps latency measurements honest).
    dask: the cluster at `dask_address` (a scheduler, e.g. tcp://host:8786, one worker per GPU host),
    else a local cluster of `workers` single-threaded workers.
    """
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=max_threads)
    if kind != "dask":
        raise ValueError(f"task runner {kind!r}; expected 'threads' or 'dask'")
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as e:  # the [dask] extra is optional
        raise ValueError("task runner 'dask' needs prefect-dask: pip install 'unmask[dask]'") from e
    if dask_address:
        return DaskTaskRunner(address=dask_address)
    # processes=False: workers are threads of this process, so the model cache and the local result
    # storage are shared; a real cluster is given by address.
    return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": False,
                                          "dashboard_address": None})
