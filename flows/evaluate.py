"""`evaluate_candidate`: one candidate through the sweep, its evidence into the registry, its gates judged.

The flow only orchestrates `flows.tasks` (which call models/, evals/, registry/) and publishes
artifacts under stable keys (`gates-<candidate>`, `evaluation-<candidate>`), so each key's history
in the Prefect UI is the candidate's history.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from prefect import Flow, flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.futures import as_completed
from pydantic import BaseModel, Field

from evals.pipeline import PAIRED_ROUNDS, SweepPlan, SweepPoint
from evals.sweep import default_sweep_path
from flows import tasks
from flows.failures import refused_write
from flows.interrupt import shielded
from flows.outbox import outbox_dir
from flows.outcome import CandidateOutcome
from flows.progress import report
from flows.runners import RunnerKind, cell_resources, check_cell_resources, make_task_runner, runner_kind
from gates.decision import Decision
from gates.evaluate import gate_report_markdown
from gates.stages import qualified_stage
from registry.connection import resolve_tracking_uri
from registry.links import mlflow_ui_command, run_link


class EvaluationOptions(BaseModel):
    """How an evaluation runs; the Prefect UI renders this as a form."""

    reproducibility: bool = Field(default=True, description="Run the reproducibility probe per candidate.")
    fresh_process_probe: bool = Field(default=True, description="The probe also decodes in a fresh Python process.")
    policy: str | None = Field(default=None, description="Stage policy YAML (default: gates/policy.yaml).")
    task_runner: RunnerKind = Field(default="threads", description="threads (this machine), dask or ray.")
    dask_address: str | None = Field(
        default=None, description="Dask scheduler (or Ray) address; none starts a local cluster."
    )
    gpus_per_cell: float = Field(
        default=0, description="GPUs each sweep cell asks its executor for (Dask resources, Ray num_gpus)."
    )
    dask_workers: int = Field(default=2, description="Workers of the local Dask cluster.")
    remeasure: bool = Field(default=False, description="Measure every point again instead of reusing cached records.")
    mlflow_retries: int = Field(default=2, description="Retries of MLflow logging before the flow gives up.")
    mlflow_retry_delay_s: float = Field(default=2.0, description="Seconds between MLflow retries.")
    threads: int | None = Field(default=None, description="torch CPU threads while measuring (None: the sweep's).")
    speed_rounds: int = Field(
        default=PAIRED_ROUNDS, ge=2, description="Rounds of the paired speed measurement against the fallback."
    )


class RegistryUnreachable(RuntimeError):
    """MLflow could not be reached after retries; the evidence is kept in the local outbox."""


def slug(name: str) -> str:
    """An artifact key part: lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "model"


def measured_cells(
    plan: SweepPlan, remeasure: bool, runner: str = "threads", gpus_per_cell: float = 0
) -> Iterator[tuple[SweepPoint, State, Any]]:
    """Submit every point (cell) of `plan` to the flow's task runner; yield (point, final state, value) as each
    settles. A GPU request the cluster cannot meet is refused before anything is submitted."""
    context = FlowRunContext.get()
    if context is None:
        raise RuntimeError("measured_cells submits to the task runner of a flow: call it inside one")
    task_runner = context.task_runner
    if runner_kind(task_runner) != runner:  # else the options say a cluster while the cells run here
        raise ValueError(
            f"cells asked to run on {runner!r}, but this flow runs on {runner_kind(task_runner)!r}: "
            "start it through flows.evaluate.evaluate_on(options)"
        )
    check_cell_resources(runner, gpus_per_cell, task_runner)
    storage = tasks.result_storage()
    # prefect: Task takes refresh_cache=None (the setting decides); with_options' annotation leaves None out
    measure = tasks.measure_point.with_options(result_storage=storage, refresh_cache=remeasure or None)  # type: ignore[arg-type]
    with cell_resources(runner, gpus_per_cell):
        futures = {measure.submit(p, plan): p for p in plan.points}
    for future in as_completed(list(futures)):
        value = future.result(raise_on_failure=False)  # settles the future's final state
        yield futures[future], future.state, value


def measure_all(
    plan: SweepPlan, remeasure: bool, runner: str = "threads", gpus_per_cell: float = 0
) -> tuple[list[dict[str, Any]], list[str], int]:
    """Submit every point to the flow's task runner; (measured points, failures, points served from cache)."""
    measured, failures, cached = [], [], 0
    for point, state, value in measured_cells(plan, remeasure, runner, gpus_per_cell):
        if state.is_completed():
            measured.append(value)
            cached += state.name == "Cached"
            report("point", candidate=point.candidate, label=point.label, cached=state.name == "Cached")
        elif refused_write(value):  # the machine's failure, not the point's: the run ends with it
            raise value
        else:
            failures.append(f"{point.label}: {type(value).__name__}: {value}")
            report("failure", candidate=point.candidate, message=failures[-1])
    order = {p.config_hash + p.dataset_hash: i for i, p in enumerate(plan.points)}
    measured.sort(key=lambda m: order.get(m["record"]["config_hash"] + m["record"]["dataset_hash"], 0))
    return measured, failures, cached


@flow(name="evaluate-candidate", task_runner=make_task_runner("threads"), flow_run_name="evaluate {model_id}")
def evaluate_candidate(
    model_id: str, sweep: str = str(default_sweep_path()), options: EvaluationOptions = EvaluationOptions()
) -> dict[str, Any]:
    """Pull and verify, load, measure every sweep point (cached), probe, check the license, log and judge."""
    tracking_uri = resolve_tracking_uri()
    prepared = tasks.prepare_candidate(model_id)
    report("stage", candidate=prepared.candidate, step="planning the sweep")
    plan = tasks.plan_points(prepared, sweep)
    if options.threads:  # `unmask run --threads` (flows.commands.options.threads_rule) outranks the sweep's
        plan = plan.model_copy(update={"threads": options.threads})
    report("plan", candidate=prepared.candidate, total=len(plan.points))
    measured, failures, cached = measure_all(plan, options.remeasure, options.task_runner, options.gpus_per_cell)
    records = [m["record"] for m in measured]
    if not records:
        raise RuntimeError(f"{prepared.candidate}: no sweep point could be measured: " + "; ".join(failures[:3]))
    reproducibility = None
    if options.reproducibility and prepared.kind != "api":  # an API model has no token ids to probe
        report("stage", candidate=prepared.candidate, step="reproducibility probe")
        probe = tasks.probe_reproducibility.with_options(result_storage=tasks.result_storage())
        state = probe(plan.points[0], plan, options.fresh_process_probe, return_state=True)
        if state.is_completed():
            reproducibility = state.result()
        else:  # a decode failure of the probe is evidence too: the error-rate gate reads it
            error = state.result(raise_on_failure=False)
            if refused_write(error):
                raise error
            failures.append(f"reproducibility probe: {type(error).__name__}: {error}")
    speed: list[dict[str, Any]] = []
    if prepared.role == "candidate" and prepared.kind != "api":
        timed = tasks.measure_speed(
            prepared,
            plan,
            records,
            tracking_uri,
            options.policy,
            options.remeasure,
            options.speed_rounds,
            return_state=True,
        )
        if timed.is_completed():
            speed = timed.result()
        else:  # the speed gates then say no paired measurement was made, and why is among the failures
            problem = timed.result(raise_on_failure=False)
            if refused_write(problem):
                raise problem
            failures.append(f"paired speed measurement: {type(problem).__name__}: {problem}")
    license_result = tasks.check_license(prepared)
    files = tasks.write_files(prepared, sweep, plan, measured, license_result, reproducibility, failures)
    evidence = tasks.assemble_evidence(prepared, records, reproducibility, license_result, failures, speed)
    report("stage", candidate=prepared.candidate, step="logging to MLflow")
    with shielded():  # a version, its evidence run and their audit entries land together
        logged = log_or_keep(evidence, tracking_uri, options)
        verdicts = tasks.judge_stages(prepared.candidate, logged["version"], tracking_uri, options.policy)
    outcome = CandidateOutcome(
        candidate=prepared.candidate,
        ref=model_id,
        role=prepared.role,
        kind=prepared.kind,
        version=logged["version"],
        weights_sha256=prepared.weights_sha256,
        points=len(plan.points),
        cached=cached,
        failures=failures,
        verdicts={stage: decision.to_dict() for stage, decision in verdicts.items()},
        qualified=qualified_stage(verdicts),
        mlflow_run=run_link(tracking_uri, logged["experiment_id"], logged["evidence_run_id"]),
        evidence_run_id=logged["evidence_run_id"],
        evidence_reused=logged["reused"],
        tracking_uri=tracking_uri,
        files=files,
    )
    publish_candidate(outcome, verdicts)
    return outcome.to_dict()  # plain data across the flow boundary


def evaluate_on(options: EvaluationOptions) -> Flow[[str, str, EvaluationOptions], dict[str, Any]]:
    """`evaluate_candidate` on the task runner `options` names (threads, or a Dask or Ray cluster): the one way a
    caller picks where the cells run (the flow's own runner is threads)."""
    runner = make_task_runner(options.task_runner, options.dask_address, options.dask_workers)
    return evaluate_candidate.with_options(task_runner=runner)


def log_or_keep(evidence: dict[str, Any], tracking_uri: str, options: EvaluationOptions) -> dict[str, Any]:
    """Log to MLflow with retries; when that fails, say so clearly, keeping the evidence in the outbox (a full or
    read-only disk is said as such: retrying against it later would not help)."""
    log = tasks.log_evidence.with_options(
        retries=options.mlflow_retries, retry_delay_seconds=options.mlflow_retry_delay_s
    )
    state = log(evidence, tracking_uri, return_state=True)
    if state.is_completed():
        return state.result()
    error = state.result(raise_on_failure=False)
    if refused_write(error):
        raise error
    raise RegistryUnreachable(
        f"could not log {evidence['candidate']} to MLflow at {tracking_uri} after {options.mlflow_retries + 1} "
        f"attempt(s): {error}. Its {len(evidence['records'])} finished record(s) are kept in {outbox_dir()} and "
        "will be logged by the next run that reaches the registry."
    )


def gate_rows(verdicts: Mapping[str, Decision]) -> list[dict[str, Any]]:
    """The rows of the gate table artifact: one per (stage, gate), values as text."""
    return [
        {
            "stage": stage,
            "gate": g.gate,
            "passed": g.passed,
            "value": str(g.value),
            "threshold": str(g.threshold),
            "reason": g.reason,
            "record_id": g.evidence.get("record_id") or "",
        }
        for stage, verdict in verdicts.items()
        for g in verdict.gate_results
    ]


def summary_markdown(outcome: CandidateOutcome | Mapping[str, Any], verdicts: Mapping[str, Decision]) -> str:
    outcome = CandidateOutcome.of(outcome)
    lines = [
        f"# {outcome.candidate} v{outcome.version}",
        "",
        f"- qualifies for: **{outcome.qualified or 'no stage yet'}**",
        f"- MLflow evidence run: [{outcome.evidence_run_id}]({outcome.mlflow_run}) "
        f"(`{mlflow_ui_command(outcome.tracking_uri)}`)",
        f"- weights sha256: `{outcome.weights_sha256[:16]}`",
        f"- sweep points: {outcome.points} ({outcome.cached} from cache)"
        + ("; evidence unchanged, so the registered run is kept" if outcome.evidence_reused else ""),
    ]
    lines += [f"- failed point: {f}" for f in outcome.failures]
    for stage, verdict in verdicts.items():
        lines += ["", gate_report_markdown(list(verdict.gate_results), f"{stage} gates").replace("# ", "## ", 1)]
    return "\n".join(lines) + "\n"


def publish_candidate(outcome: CandidateOutcome, verdicts: Mapping[str, Decision]) -> None:
    key = slug(outcome.candidate)
    create_table_artifact(
        gate_rows(verdicts), key=f"gates-{key}", description=f"Gate results of {outcome.candidate} v{outcome.version}"
    )
    create_markdown_artifact(
        summary_markdown(outcome, verdicts), key=f"evaluation-{key}", description=f"Evaluation of {outcome.candidate}"
    )
