"""`unmask eval --executor dask|ray`: the sweep's cells fanned out by a Prefect flow on a cluster's task runner.

`unmask eval` plans and stores its records itself (evals.sweep.run_sweep); on a cluster only the measuring moves:
`fan_out` hands run_sweep a function that measures the planned cells through the same content-addressed
`flows.tasks.measure_point` that `unmask run` submits (evals measure afresh, as a local eval does, and each
finished cell is kept in the result storage, so a later run reuses it and a lost worker's cell is run again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prefect import flow

from evals.pipeline import MeasuredPoint, SweepPlan, SweepPoint
from flows.evaluate import measured_cells
from flows.runners import EXECUTORS, make_task_runner


@flow(name="measure-cells", flow_run_name="measure {name}")
def measure_cells(
    name: str, plans: list[SweepPlan], runner: str = "threads", gpus_per_cell: float = 0, remeasure: bool = True
) -> list[dict[str, Any]]:
    """Every plan's cells on the flow's task runner; per cell {candidate, config_hash, dataset_hash} with its
    `measured` point or its `error`, in words."""
    settled = []
    for plan in plans:
        for point, state, value in measured_cells(plan, remeasure, runner, gpus_per_cell):
            key = {"candidate": point.candidate, "config_hash": point.config_hash, "dataset_hash": point.dataset_hash}
            settled.append(
                key | ({"measured": value} if state.is_completed() else {"error": f"{type(value).__name__}: {value}"})
            )
    return settled


def fan_out(
    executor: str, address: str | None = None, gpus_per_cell: float = 0
) -> Callable[[list[SweepPlan]], Iterator[tuple[SweepPoint, MeasuredPoint | str]]]:
    """The cell measurer run_sweep calls for `--executor dask|ray`: (point, measured point or error) per cell."""
    runner = EXECUTORS[executor]
    task_runner = make_task_runner(runner, address)  # a missing extra is refused now, before any model loads

    def measure(plans: list[SweepPlan]) -> Iterator[tuple[SweepPoint, MeasuredPoint | str]]:
        settled = measure_cells.with_options(task_runner=task_runner)(
            plans[0].name if plans else "sweep", plans, runner, gpus_per_cell
        )
        by_cell = {(c["candidate"], c["config_hash"], c["dataset_hash"]): c for c in settled}
        for point in (p for plan in plans for p in plan.points):  # in plan order, as a local eval stores them
            cell = by_cell[(point.candidate, point.config_hash, point.dataset_hash)]
            yield point, MeasuredPoint(**cell["measured"]) if "measured" in cell else cell["error"]

    return measure
