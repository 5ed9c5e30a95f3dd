"""`--task-runner dask`: the same flows fan their sweep points out on a Dask cluster (local, 2 workers)."""

from __future__ import annotations

from flows.evaluate import EvaluationOptions
from flows.review import gate_review
from flows.runners import make_task_runner
from tests.support.flow_fixtures import CANDIDATE, seed_registry, tiny_models, write_sweep


def test_the_sweep_runs_on_a_local_dask_cluster_and_shares_the_cache_with_threads(
    prefect_harness, tmp_path, monkeypatch
):
    models = tiny_models(tmp_path / "models")
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    seed_registry(tmp_path / "home")
    sweep = write_sweep(tmp_path / "four.yaml", [models[CANDIDATE]], steps=(2, 4, 6, 8))
    on_dask = EvaluationOptions(reproducibility=False, task_runner="dask", dask_workers=2)
    assert type(make_task_runner("dask", workers=2)).__name__ == "DaskTaskRunner"

    review = gate_review(None, sweep, on_dask)
    outcome = review["outcomes"][0]
    assert (outcome["points"], outcome["cached"], outcome["failures"]) == (4, 0, [])
    assert outcome["version"] == "1"

    on_threads = gate_review(None, sweep, on_dask.model_copy(update={"task_runner": "threads"}))
    assert on_threads["outcomes"][0]["cached"] == 4  # the cache key does not depend on where a point ran
