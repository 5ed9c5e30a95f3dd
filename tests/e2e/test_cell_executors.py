"""`--executor` and `--gpus-per-cell`: what each executor is asked for per cell (a Dask worker resource, Ray's
`num_gpus`), a request no worker can meet refused at once by name instead of waiting forever, and `unmask eval`
on a Dask cluster giving the records a local eval gives."""

from __future__ import annotations

import pytest
import yaml
from prefect import flow, task
from prefect.context import FlowRunContext
from prefect_dask import DaskTaskRunner
from typer.testing import CliRunner

from flows.runners import cell_resources, check_cell_resources
from tests.support.eval_fixtures import write_model
from tests.support.flow_fixtures import CLOCKS, cli_app


def test_gpus_per_cell_is_a_ray_num_gpus_request_and_nothing_for_threads():
    from prefect_ray.context import RemoteOptionsContext

    with cell_resources("ray", 0.5):  # what prefect-ray hands to ray.remote(**options) for each cell
        assert RemoteOptionsContext.get().current_remote_options == {"num_gpus": 0.5}
    assert RemoteOptionsContext.get().current_remote_options == {}
    check_cell_resources("threads", 4, None)  # this machine: nothing to ask a cluster for


@task
def restrictions_seen_by_the_worker() -> dict:
    """The resources the Dask worker running this task was told it needs (imports here: the task travels by value)."""
    from distributed import get_worker
    from distributed.worker import thread_state

    return dict(get_worker().state.tasks[thread_state.key].resource_restrictions or {})


@flow(
    task_runner=DaskTaskRunner(
        cluster_kwargs={
            "n_workers": 1,
            "threads_per_worker": 1,
            "processes": False,
            "resources": {"GPU": 1},
            "dashboard_address": None,
        }
    )
)
def submitted_with(gpus_per_cell: float) -> dict:
    check_cell_resources("dask", gpus_per_cell, FlowRunContext.get().task_runner)
    with cell_resources("dask", gpus_per_cell):
        future = restrictions_seen_by_the_worker.submit()
    return future.result()


def test_a_dask_cell_reaches_its_worker_with_the_gpu_request_and_an_unmeetable_one_is_refused(prefect_harness):
    assert submitted_with(1) == {"GPU": 1}
    with pytest.raises(
        ValueError,
        match=r"--gpus-per-cell 2: no dask worker offers that many GPUs "
        r"\(GPUs per worker: \S+: 1\); start its workers with `dask worker",
    ):
        submitted_with(2)


@pytest.fixture
def tiny_sweep(tmp_path):
    model = write_model(tmp_path / "models" / "diff")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "cells",
                "models": [str(model)],
                "tasks": [{"task": "arith", "n": 3}],
                "base": {"gen_length": 8, "block_length": 4},
                "grid": {"steps": [4, 8]},
                "measure": {"warmup": 0, "batch_size": 2},
            }
        )
    )
    return str(sweep)


def eval_records(folder) -> list[dict]:
    from evals.store import load_records

    return [{k: v for k, v in r.to_dict().items() if k not in CLOCKS} for r in load_records(folder)]


def run_eval(*args: str):
    result = CliRunner().invoke(cli_app("eval"), ["eval", *args, "--no-repro", "--no-plot"], env={"COLUMNS": "200"})
    return result.exit_code, result.output


# slow: two evals of two cells, one through a Prefect flow on a local Dask cluster
def test_eval_on_a_dask_executor_gives_a_local_evals_records(prefect_harness, tiny_sweep, tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    code, text = run_eval("--sweep", tiny_sweep, "--out", str(tmp_path / "local"))
    assert code == 0, text
    code, text = run_eval("--sweep", tiny_sweep, "--out", str(tmp_path / "dask"), "--executor", "dask")
    assert code == 0, text
    assert "cells run on: dask (a local cluster)" in text
    dask, local = eval_records(tmp_path / "dask"), eval_records(tmp_path / "local")
    assert len(dask) == 2
    differing = [
        (i, key, mine.get(key), theirs.get(key))
        for i, (mine, theirs) in enumerate(zip(dask, local))
        for key in sorted(mine.keys() | theirs.keys())
        if mine.get(key) != theirs.get(key)
    ]
    assert dask == local, differing  # in plan order, clocks aside; the message names each field that differs
    assert len(list((tmp_path / "home" / "results").glob("point-*"))) == 2  # each cell kept for a later run

    code, text = run_eval(
        "--sweep", tiny_sweep, "--out", str(tmp_path / "gpu"), "--executor", "dask", "--gpus-per-cell", "1"
    )
    assert code == 2, text  # the local cluster's workers offer no GPU: refused, not left waiting
    assert "--gpus-per-cell 1: no dask worker offers that many GPUs" in text


def test_an_unknown_executor_is_a_one_line_usage_error():
    code, text = run_eval("--executor", "spark")
    assert code == 2
    assert "Invalid value for '--executor': expected one of local, threads, dask, ray, got 'spark'" in text
