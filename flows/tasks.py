"""Evaluation tasks: each a one-line Prefect wrapper over a step of the pipeline (evals.pipeline),
adding retries, caching and serialisation; and the registry tasks (registry/).

A sweep point's record is cached by what determines it: the candidate's weights hash, the
effective config hash, the dataset hash, the unmask version and the measurement settings; never the
run. Results are persisted as JSON under `<state>/results/`, so a re-run, an interrupted run
resumed, or a scheduled run skips every point already measured.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.filesystems import LocalFileSystem
from prefect.settings import PREFECT_API_URL

from evals import pipeline
from evals.pipeline import UNMASK_VERSION, PreparedCandidate, SweepPlan, SweepPoint
from evals.records import CandidateEvidence, EvalRecord, LicenseResult, ReproducibilityResult, SpeedComparison
from evals.store import naming
from evals.sweep import load_sweep, timestamped_folder
from flows.interrupt import stop_if_interrupted
from flows.outbox import evidence_from_dict, evidence_to_dict, hold, pending, release
from flows.progress import report
from gates import STAGES, Decision, load_policy
from gates.results import speed_points
from models.state import state_dir
from registry import Registry, register_or_reuse
from registry.connection import EVALUATIONS_EXPERIMENT
from registry.judging import fallback_evidence, judge_each
from registry.tracking import evidence_run_id, registered_speed


def result_storage() -> LocalFileSystem:
    """Where task results live: `<state>/results/<cache key>` (JSON, never pickle)."""
    folder = state_dir() / "results"
    folder.mkdir(parents=True, exist_ok=True)
    return _saved_storage(str(folder), str(PREFECT_API_URL.value()))


@functools.lru_cache(maxsize=8)
def _saved_storage(folder: str, api_url: str) -> LocalFileSystem:
    """The storage block of a state folder, saved once per Prefect API a process talks to (each save is a
    server round trip: four a run)."""
    storage = LocalFileSystem(basepath=folder)
    # Prefect wants result storage saved as a block; one block per state folder.
    storage.save(f"unmask-results-{hashlib.sha256(folder.encode()).hexdigest()[:12]}", overwrite=True)
    return storage


def cache_key(kind: str, **parts: Any) -> str:
    text = json.dumps(parts | {"unmask": UNMASK_VERSION}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def point_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """weights hash + effective config hash + dataset hash + unmask version (+ how it was measured)."""
    p: SweepPoint = parameters["point"]
    plan: SweepPlan = parameters["plan"]
    return cache_key(
        "point",
        candidate=p.candidate,
        weights=p.weights_sha256,
        config=p.config_hash,
        dataset=p.dataset_hash,
        backend=p.backend,
        device=plan.device,
        dtype=plan.dtype,
        measure=plan.measure,
        threads=plan.threads,
    )


def probe_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    p: SweepPoint = parameters["point"]
    plan: SweepPlan = parameters["plan"]
    return cache_key(
        "probe",
        candidate=p.candidate,
        weights=p.weights_sha256,
        config=p.config_hash,
        dataset=p.dataset_hash,
        device=plan.device,
        dtype=plan.dtype,
        fresh_process=parameters["fresh_process"],
    )


@task(
    name="prepare-candidate",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=1,
    retry_delay_seconds=1,
    task_run_name="prepare {model_id}",
)
def prepare_candidate(model_id: str, device: str = "cpu", dtype: str = "float32") -> PreparedCandidate:
    """Pull and verify (when needed), load, and identify a candidate (evals.pipeline.prepare_candidate)."""
    return pipeline.prepare_candidate(model_id, device, dtype)


@task(name="plan-sweep", cache_policy=NO_CACHE, persist_result=False, task_run_name="plan {prepared.candidate}")
def plan_points(prepared: PreparedCandidate, sweep_path: str) -> SweepPlan:
    """The sweep's valid points for this candidate (evals.pipeline.plan_points)."""
    return pipeline.plan_points(prepared, load_sweep(sweep_path))


@task(
    name="measure-point",
    retries=1,
    retry_delay_seconds=1,
    cache_key_fn=point_cache_key,
    persist_result=True,
    result_serializer="json",
    task_run_name="{point.label}",
)
def measure_point(point: SweepPoint, plan: SweepPlan) -> dict[str, Any]:
    """Measure, score and validate one point (evals.pipeline.measure_point), as JSON for the cache.
    Each item measured is reported ("item": done of total) to the process's progress reporter, if any; after
    Ctrl-C the point stops at its next item, unrecorded (flows.interrupt)."""

    def on_item(done: int, total: int) -> None:
        stop_if_interrupted()
        report("item", candidate=point.candidate, label=point.label, done=done, total=total)

    return pipeline.measure_point(point, plan, on_item=on_item).model_dump()


@task(
    name="reproducibility-probe",
    retries=1,
    cache_key_fn=probe_cache_key,
    persist_result=True,
    result_serializer="json",
    task_run_name="reproducibility {point.candidate}",
)
def probe_reproducibility(point: SweepPoint, plan: SweepPlan, fresh_process: bool = True) -> dict[str, Any]:
    """Same-process, fresh-process and batch-invariance probe of the candidate's first point."""
    return pipeline.probe_point(point, plan, fresh_process).to_dict()


@task(
    name="paired-speed", cache_policy=NO_CACHE, persist_result=False, task_run_name="paired speed {prepared.candidate}"
)
def measure_speed(
    prepared: PreparedCandidate,
    plan: SweepPlan,
    records: list[dict[str, Any]],
    tracking_uri: str,
    policy_path: str | None = None,
    remeasure: bool = False,
    rounds: int = pipeline.PAIRED_ROUNDS,
) -> list[dict[str, Any]]:
    """The candidate and the registered fallback timed interleaved (evals.pipeline.measure_speed) at each
    operating point the stages judge; [] when no other model holds the fallback alias. What the registered
    version of these weights already holds for the same configs and fallback is kept, not measured again
    (unless `remeasure`, or it has fewer than `rounds` rounds): a re-run that registers nothing new measures
    nothing new."""
    registry = Registry(tracking_uri)
    baseline = fallback_evidence(registry)
    if baseline is None or baseline.candidate == prepared.candidate or baseline.kind == "api":
        return []
    mine = CandidateEvidence(
        prepared.candidate, prepared.role, prepared.kind, [EvalRecord.from_dict(r) for r in records], card=prepared.card
    )
    pairs = speed_points(mine, baseline, load_policy(policy_path).stages.values())
    wanted = {
        (m.task, m.gen_length, m.config_hash, baseline.candidate, baseline.weights_sha256, b.config_hash)
        for m, b in pairs
    }
    known = [] if remeasure else registered_speed(registry, prepared.candidate, prepared.weights_sha256)
    kept = [s for s in known if s.key() in wanted and s.rounds >= rounds]
    if wanted and wanted <= {s.key() for s in kept}:
        return [s.to_dict() for s in kept]
    found = pipeline.measure_speeds(
        pairs,
        plan,
        baseline.card.get("source") or baseline.candidate,
        lambda ours: report(
            "stage", candidate=prepared.candidate, step=f"paired speed vs {baseline.candidate} on {ours.task}"
        ),
        rounds,
    )
    return [s.to_dict() for s in found]


@task(name="license-check", cache_policy=NO_CACHE, persist_result=False, task_run_name="license {prepared.candidate}")
def check_license(prepared: PreparedCandidate) -> dict[str, Any]:
    """The catalog license checked against the model card (evals.pipeline.check_license)."""
    return pipeline.check_license(prepared).to_dict()


@task(
    name="assemble-evidence", cache_policy=NO_CACHE, persist_result=False, task_run_name="evidence {prepared.candidate}"
)
def assemble_evidence(
    prepared: PreparedCandidate,
    records: list[dict[str, Any]],
    reproducibility: dict[str, Any] | None,
    license: dict[str, Any],
    failures: list[str],
    speed: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The candidate's CandidateEvidence (evals.pipeline), kept in the local outbox until the registry has it."""
    evidence = pipeline.assemble_evidence(
        prepared,
        [EvalRecord.from_dict(r) for r in records],
        ReproducibilityResult(**reproducibility) if reproducibility else None,
        LicenseResult(**license),
        failures,
        [SpeedComparison.from_dict(s) for s in speed or []],
    )
    hold(evidence)
    return evidence_to_dict(evidence)


@task(
    name="write-evaluation-files",
    cache_policy=NO_CACHE,
    persist_result=False,
    task_run_name="files {prepared.candidate}",
)
def write_files(
    prepared: PreparedCandidate,
    sweep_path: str,
    plan: SweepPlan,
    measured: list[dict[str, Any]],
    license: dict[str, Any],
    reproducibility: dict[str, Any] | None,
    failures: list[str],
) -> str:
    """The candidate's evaluation folder under `<state>/evals/`, the same files `unmask eval` writes."""
    folder = timestamped_folder(state_dir() / "evals", f"{plan.name}-{prepared.candidate}")
    with naming(folder):  # a refused write says where (evals.store names each file it writes)
        written = pipeline.write_candidate_files(
            folder,
            load_sweep(sweep_path),
            plan,
            [pipeline.MeasuredPoint(**m) for m in measured],
            LicenseResult(**license),
            ReproducibilityResult(**reproducibility) if reproducibility else None,
            failures,
        )
    return str(written)


@task(
    name="log-to-mlflow",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=2,
    retry_delay_seconds=2,
    task_run_name="log {evidence[candidate]}",
)
def log_evidence(evidence: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """Register the evidence unless the registry already holds exactly it (registry.register_or_reuse); on
    success it leaves the outbox."""
    registry = Registry(tracking_uri)
    ev = evidence_from_dict(evidence)
    version, reused = register_or_reuse(registry, ev)
    release(ev)
    return {
        "version": version,
        "evidence_run_id": evidence_run_id(registry, ev.candidate, version),
        "experiment_id": registry.experiment_id(EVALUATIONS_EXPERIMENT),
        "reused": reused,
    }


@task(name="flush-outbox", cache_policy=NO_CACHE, persist_result=False, retries=0)
def flush_outbox(tracking_uri: str) -> list[str]:
    """Log evidence an earlier run kept locally because the registry was unreachable."""
    done: list[str] = []
    found = pending()
    if not found:
        return done
    registry = Registry(tracking_uri)
    for path, evidence in found:
        # a run that logged it but stopped before releasing it must not register it twice (and make its
        # approvals stale)
        register_or_reuse(registry, evidence)
        path.unlink(missing_ok=True)
        done.append(f"{evidence.candidate} ({len(evidence.records)} records)")
    return done


@task(
    name="judge-gates",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=2,
    retry_delay_seconds=2,
    task_run_name="gates {model}",
)
def judge_stages(model: str, version: str, tracking_uri: str, policy_path: str | None = None) -> dict[str, Decision]:
    """Every stage's decision on the registered evidence, {stage: gates.decision.Decision}: the one judgement of
    the run, which the decision table and the next steps render (registry.judge_each records each report)."""
    registry = Registry(tracking_uri)
    policy = load_policy(policy_path)
    return judge_each(registry, model, version, STAGES, policy, record=True)
