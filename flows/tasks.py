"""Evaluation tasks: small typed steps over library code (models, evals, registry), each a Prefect task.

A sweep point's record is cached by what determines it: the candidate's weights hash, the
SamplerConfig hash, the dataset hash, the unmask version and the measurement settings; never the
run. Results are persisted as JSON under `<state>/results/`, so a re-run, an interrupted run
resumed, or a scheduled run skips every point already measured.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.filesystems import LocalFileSystem
from pydantic import BaseModel

from evals.fingerprint import package_version
from models.state import state_dir

UNMASK_VERSION = package_version("unmask") or "0+unknown"
PROBE_PROMPTS = 4


class PreparedCandidate(BaseModel):
    """A candidate pulled, verified and loadable: who it is and what its weights are."""

    ref: str  # what the user named: catalog id, bundled id or folder
    candidate: str  # the id records and the registry use
    path: str  # the folder its files are in
    role: str
    kind: str
    revision: str
    weights_sha256: str
    ids: dict[str, int | None]  # mask_id, eos_id, eot_id for SamplerConfig
    card: dict[str, Any] = {}


class SweepPoint(BaseModel):
    """One (candidate, task split, SamplerConfig) to measure, with the hashes that key its cache."""

    candidate: str
    path: str
    role: str
    kind: str
    revision: str
    weights_sha256: str
    task: dict[str, Any]  # evals.sweep.TaskSpec fields
    settings: dict[str, Any]  # sweep settings of the point (before model ids)
    ids: dict[str, int | None]
    config_hash: str
    dataset_hash: str
    backend: str
    label: str  # for task run names and progress


class SweepPlan(BaseModel):
    name: str
    device: str
    dtype: str
    measure: dict[str, int]
    threads: int | None = None  # torch CPU threads while measuring (the sweep's `threads`)
    points: list[SweepPoint]
    skipped: list[str] = []


def result_storage() -> LocalFileSystem:
    """Where task results live: `<state>/results/<cache key>` (JSON, never pickle)."""
    folder = state_dir() / "results"
    folder.mkdir(parents=True, exist_ok=True)
    storage = LocalFileSystem(basepath=str(folder))
    # Prefect wants result storage saved as a block; one block per state folder.
    storage.save(f"unmask-results-{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}", overwrite=True)
    return storage


# Loading is the slow part of a point on a real model; each worker process keeps its last models.
_load_lock = threading.Lock()


@functools.lru_cache(maxsize=2)
def _loaded(path: str, device: str, dtype: str, weights_sha256: str):
    from models import load_model

    return load_model(path, device=device, dtype=dtype)


def loaded_model(path: str, device: str, dtype: str, weights_sha256: str = ""):
    with _load_lock:
        return _loaded(path, device, dtype, weights_sha256)


@functools.lru_cache(maxsize=8)
def _task_data(task_json: str):
    from evals.evaluate import load_task

    return load_task(**json.loads(task_json))


def task_data(task_fields: dict[str, Any]):
    return _task_data(json.dumps(task_fields, sort_keys=True))


def cache_key(kind: str, **parts: Any) -> str:
    text = json.dumps(parts | {"unmask": UNMASK_VERSION}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def point_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """weights hash + SamplerConfig hash + dataset hash + unmask version (+ how it was measured)."""
    p: SweepPoint = parameters["point"]
    return cache_key("point", candidate=p.candidate, weights=p.weights_sha256, config=p.config_hash,
                     dataset=p.dataset_hash, backend=p.backend, device=parameters["device"],
                     dtype=parameters["dtype"], measure=parameters["measure"], threads=parameters.get("threads"))


def probe_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    p: SweepPoint = parameters["point"]
    return cache_key("probe", candidate=p.candidate, weights=p.weights_sha256, config=p.config_hash,
                     dataset=p.dataset_hash, device=parameters["device"], dtype=parameters["dtype"],
                     fresh_process=parameters["fresh_process"])


def model_folder(model_id: str) -> Path:
    """The model's folder; a catalog entry from the Hub that is not pulled yet is pulled and verified."""
    from models.catalog import load_catalog
    from models.loading import resolve_model_path
    from models.pull import pull, pulled_path

    if not Path(model_id).expanduser().is_dir():
        catalog = load_catalog()
        if model_id in catalog:
            entry = catalog.get(model_id)
            if entry.source.scheme == "hf" and pulled_path(entry.id) is None:
                return pull(entry).path
    return resolve_model_path(model_id)


@task(name="prepare-candidate", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=1,
      task_run_name="prepare {model_id}")
def prepare_candidate(model_id: str, device: str = "cpu", dtype: str = "float32") -> PreparedCandidate:
    """Pull and verify (when needed), load, and identify a candidate; raises if it cannot be loaded."""
    from evals.evaluate import candidate_from
    from evals.fingerprint import weights_sha256
    from sampler.decode import sampler_ids

    path = model_folder(model_id)
    loaded = loaded_model(str(path), device, dtype, weights_sha256(path))
    cand = candidate_from(model_id, loaded)
    return PreparedCandidate(
        ref=model_id, candidate=cand.id, path=str(path), role=cand.role, kind=cand.kind, revision=cand.revision,
        weights_sha256=cand.weights_sha256,
        ids=sampler_ids(loaded),
        card={k: v for k, v in loaded.card.items() if k != "text"} | {"source": model_id})


@task(name="plan-sweep", cache_policy=NO_CACHE, persist_result=False, task_run_name="plan {prepared.candidate}")
def plan_points(prepared: PreparedCandidate, sweep_path: str) -> SweepPlan:
    """The sweep's valid points for this candidate, each with its config and dataset hashes."""
    from evals.sweep import build_config, diffusion_points, load_sweep, point_problems

    spec = load_sweep(sweep_path)
    points, skipped = [], []
    for t in spec.tasks:
        fields = {k: v for k, v in vars(t).items()}
        data = task_data(fields)
        for settings in diffusion_points(spec, t, prepared.kind):
            config, backend = build_config(settings, prepared.ids)
            label = " ".join(f"{k}={v}" for k, v in settings.items() if k not in ("gen_length",))
            points.append(SweepPoint(
                candidate=prepared.candidate, path=prepared.path, role=prepared.role, kind=prepared.kind,
                revision=prepared.revision, weights_sha256=prepared.weights_sha256, task=fields, settings=settings,
                ids=prepared.ids, config_hash=config.hash(), dataset_hash=data.hash, backend=backend,
                label=f"{prepared.candidate} {data.name} {label}"))
        skipped += [f"{prepared.candidate} {t.label} {p}" for p in point_problems(spec, t, prepared.kind)]
    return SweepPlan(name=spec.name, device=spec.device, dtype=spec.dtype, measure=dict(spec.measure),
                     threads=getattr(spec, "threads", None), points=points, skipped=skipped)


@task(name="measure-point", retries=1, retry_delay_seconds=1, cache_key_fn=point_cache_key, persist_result=True,
      result_serializer="json", task_run_name="{point.label}")
def measure_point(point: SweepPoint, measure: dict[str, int], device: str, dtype: str, sweep: str,
                  threads: int | None = None) -> dict[str, Any]:
    """Measure, score and validate one point (evals.evaluate + evals.validation); the record as a dict."""
    from evals.evaluate import Candidate, evaluate_point
    from evals.sweep import build_config
    from evals.validation import validate_record

    if threads:  # on a shared CPU, more threads than free cores makes every forward much slower
        import torch

        torch.set_num_threads(threads)

    loaded = loaded_model(point.path, device, dtype, point.weights_sha256)
    candidate = Candidate(id=point.candidate, loaded=loaded, role=point.role, kind=point.kind,
                          revision=point.revision, weights_sha256=point.weights_sha256)
    config, backend = build_config(point.settings, point.ids)
    record = evaluate_point(candidate, task_data(point.task), config, backend=backend, device=device, dtype=dtype,
                            warmup=measure.get("warmup", 1), batch_size=measure.get("batch_size", 1),
                            throughput_items=measure.get("throughput_items"), sweep=sweep)
    validate_record(record, html=False)
    return record.to_dict()


@task(name="reproducibility-probe", retries=1, cache_key_fn=probe_cache_key, persist_result=True,
      result_serializer="json", task_run_name="reproducibility {point.candidate}")
def probe_reproducibility(point: SweepPoint, device: str, dtype: str, fresh_process: bool = True) -> dict[str, Any]:
    """Same-process, fresh-process and batch-invariance probe of the candidate's first point."""
    from evals.reproducibility import probe_model

    prompts = [item.prompt for item in task_data(point.task).items[:PROBE_PROMPTS]]
    result = probe_model(point.path, point.settings, prompts, device=device, dtype=dtype, fresh_process=fresh_process)
    result.candidate = point.candidate
    return result.to_dict()


@task(name="license-check", cache_policy=NO_CACHE, persist_result=False, task_run_name="license {prepared.candidate}")
def check_license(prepared: PreparedCandidate) -> dict[str, Any]:
    """The catalog license checked against the model card (evals.license)."""
    from evals.license import license_for_model

    card = {k: v for k, v in prepared.card.items() if k != "source"}
    result = license_for_model(prepared.ref, card or None)
    result.candidate = prepared.candidate
    return result.to_dict()


@task(name="assemble-evidence", cache_policy=NO_CACHE, persist_result=False,
      task_run_name="evidence {prepared.candidate}")
def assemble_evidence(prepared: PreparedCandidate, records: list[dict[str, Any]], reproducibility: dict | None,
                      license: dict[str, Any], failures: list[str]) -> dict[str, Any]:
    """The candidate's CandidateEvidence, kept in the local outbox until the registry has it."""
    from evals.records import CandidateEvidence, EvalRecord, LicenseResult, ReproducibilityResult
    from flows.outbox import evidence_to_dict, hold

    evidence = CandidateEvidence(
        candidate=prepared.candidate, role=prepared.role, kind=prepared.kind,
        records=[EvalRecord.from_dict(r) for r in records],
        reproducibility=ReproducibilityResult(**reproducibility) if reproducibility else None,
        license=LicenseResult(**license), model_revision=prepared.revision, weights_sha256=prepared.weights_sha256,
        card=prepared.card, failures=failures)
    hold(evidence)
    return evidence_to_dict(evidence)


@task(name="log-to-mlflow", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=2,
      task_run_name="log {evidence[candidate]}")
def log_evidence(evidence: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """Register the evidence unless the registry already holds exactly it (registry.register_or_reuse); on
    success it leaves the outbox."""
    from flows.outbox import evidence_from_dict, release
    from registry import Registry, register_or_reuse
    from registry.connection import EVALUATIONS_EXPERIMENT
    from registry.tracking import evidence_run_id

    registry = Registry(tracking_uri)
    ev = evidence_from_dict(evidence)
    version, reused = register_or_reuse(registry, ev)
    release(ev)
    return {"version": version, "evidence_run_id": evidence_run_id(registry, ev.candidate, version),
            "experiment_id": registry.experiment_id(EVALUATIONS_EXPERIMENT), "reused": reused}


@task(name="flush-outbox", cache_policy=NO_CACHE, persist_result=False, retries=0)
def flush_outbox(tracking_uri: str) -> list[str]:
    """Log evidence an earlier run kept locally because the registry was unreachable."""
    from flows.outbox import pending
    from registry import Registry, register_or_reuse

    done = []
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


@task(name="judge-gates", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=2,
      task_run_name="gates {model}")
def judge_stages(model: str, version: str, tracking_uri: str, policy_path: str | None = None) -> dict[str, Any]:
    """Every stage's verdict on the registered evidence, {stage: gates.promotion.PromotionDecision}
    (registry.judge records each report)."""
    from gates import STAGES, load_policy
    from registry import Registry, judge

    registry = Registry(tracking_uri)
    policy = load_policy(policy_path)
    return {stage: judge(registry, model, version, stage, policy, record=True) for stage in STAGES}
