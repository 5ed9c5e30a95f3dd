"""Rollout evidence in MLflow: a run per rollout, a child run per canary analysis, and the readers of both.

Each rollout is a run in the `unmask-rollouts` experiment, tagged with its id, model, version, route, stage,
arms and status (kept current: running, paused, rolled_back, completed, aborted). Each analysis of a step is
a child run tagged with its step, weight, verdict and reason; its metrics are per arm (`<arm>.requests`,
`<arm>.p95_s`, `<arm>.error_rate`, `<arm>.decode_failure_rate`, `<arm>.agreement`) and `analysis.json`
holds the whole analysis, its sha256 a run tag checked on every read (registry/integrity.py), as serving
records are (registry/loadtests.py).

Readers: `rollouts(registry, model=None, version=None) -> list[RolloutRecord]` (oldest first) and
`analyses(registry, rollout_id) -> list[AnalysisRecord]` (in the order they were made).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Metric

from registry.connection import EXPERIMENT_PREFIX, RegistryError
from registry.integrity import seal_run, verify_artifact
from registry.store import Registry, filter_literal, model_tag, now_iso, retry_busy

ROLLOUTS_EXPERIMENT = f"{EXPERIMENT_PREFIX}rollouts"
ARTIFACT = "analysis.json"
ARM_METRICS = ("requests", "p95_s", "error_rate", "decode_failure_rate", "agreement", "probe_accuracy", "probes")
STATUSES = ("running", "paused", "rolled_back", "completed", "aborted")
TERMINAL = {"rolled_back": "FAILED", "aborted": "KILLED", "completed": "FINISHED"}


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout as MLflow holds it (the state file under <state>/rollouts/ holds the controller's side)."""

    id: str
    model: str
    version: str
    route: str
    stage: str
    status: str
    candidate: str  # the candidate arm (the alias of the stage before `stage`)
    baseline: str  # the baseline arm (`stage`'s alias, or `fallback`)
    run_id: str
    started: str
    updated: str = ""
    reason: str = ""  # why it ended or paused, in words
    weight: int | None = None  # the candidate's live weight as the controller last set it (None: not recorded)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class AnalysisRecord:
    """One step's canary analysis: step index, candidate weight, verdict, reason, per-arm numbers, the artifact."""

    rollout_id: str
    run_id: str
    step: int
    weight: int
    verdict: str
    reason: str
    at: str
    arms: dict[str, dict[str, float]] = field(default_factory=dict)  # arm -> {requests, p95_s, ...}
    analysis: dict[str, Any] = field(default_factory=dict)  # analysis.json (gates.canary.CanaryAnalysis.to_dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _tag(key: str) -> str:
    return model_tag(f"rollout.{key}")


def start_rollout_run(
    registry: Registry,
    rollout_id: str,
    model: str,
    version: str,
    route: str,
    stage: str,
    candidate: str,
    baseline: str,
    policy: dict[str, Any],
) -> str:
    """Open the rollout's run (status running); returns its run id."""
    run = retry_busy(
        registry.client.create_run,
        registry.experiment_id(ROLLOUTS_EXPERIMENT),
        run_name=f"rollout {rollout_id} {model}/{version} {route}",
        tags={
            model_tag("kind"): "rollout",
            _tag("id"): rollout_id,
            model_tag("model"): model,
            model_tag("version"): version,
            _tag("route"): route,
            model_tag("stage"): stage,
            _tag("candidate"): candidate,
            _tag("baseline"): baseline,
            _tag("status"): "running",
            _tag("started"): now_iso(),
            _tag("updated"): now_iso(),
            _tag("policy"): json.dumps(policy, sort_keys=True)[:5000],
        },
    )
    run_id: str = run.info.run_id  # mlflow's RunInfo.run_id (a property subclass) reads as Any
    return run_id


def set_rollout_status(registry: Registry, run_id: str, status: str, reason: str = "") -> None:
    """Record the rollout's status (and why); a terminal one ends its run."""
    if status not in STATUSES:
        raise ValueError(f"rollout status {status!r}: expected one of {', '.join(STATUSES)}")
    client = registry.client
    retry_busy(client.set_tag, run_id, _tag("status"), status)
    retry_busy(client.set_tag, run_id, _tag("updated"), now_iso())
    retry_busy(client.set_tag, run_id, _tag("reason"), reason[:5000])
    if status in TERMINAL:
        retry_busy(client.set_terminated, run_id, TERMINAL[status])


def set_rollout_weight(registry: Registry, run_id: str, weight: int) -> None:
    """Record the candidate's weight the controller just gave the server (what the Rollout page shows live)."""
    retry_busy(registry.client.set_tag, run_id, _tag("weight"), str(int(weight)))
    retry_busy(registry.client.set_tag, run_id, _tag("updated"), now_iso())


def log_analysis(
    registry: Registry, rollout_run_id: str, rollout_id: str, step: int, weight: int, analysis: dict[str, Any]
) -> str:
    """Log one step's analysis (`CanaryAnalysis.to_dict()`) as a child run of the rollout's; returns its run id."""
    client = registry.client
    parent = client.get_run(rollout_run_id)
    tags = parent.data.tags
    run = retry_busy(
        client.create_run,
        registry.experiment_id(ROLLOUTS_EXPERIMENT),
        run_name=f"analysis {rollout_id} step {step} at {weight}%",
        tags={
            "mlflow.parentRunId": rollout_run_id,
            model_tag("kind"): "rollout_analysis",
            _tag("id"): rollout_id,
            model_tag("model"): tags.get(model_tag("model"), ""),
            model_tag("version"): tags.get(model_tag("version"), ""),
            _tag("step"): str(step),
            _tag("weight"): str(weight),
            _tag("verdict"): analysis["verdict"],
            _tag("reason"): str(analysis.get("reason", ""))[:5000],
            _tag("at"): now_iso(),
        },
    )
    data = json.dumps(analysis, indent=2, sort_keys=True, default=str).encode()
    ms = int(time.time() * 1000)
    metrics = [
        Metric(f"{arm}.{name}", float(value), ms, step)
        for arm, summary in (analysis.get("arms") or {}).items()
        for name, value in summary.items()
        if name in ARM_METRICS and value is not None
    ]
    run_id: str = run.info.run_id  # mlflow's RunInfo.run_id (a property subclass) reads as Any
    seal_run(client, run_id, metrics, ARTIFACT, data)
    return run_id


def _record(run: Any) -> RolloutRecord:
    t = run.data.tags
    return RolloutRecord(
        id=t.get(_tag("id"), ""),
        model=t.get(model_tag("model"), ""),
        version=t.get(model_tag("version"), ""),
        route=t.get(_tag("route"), ""),
        stage=t.get(model_tag("stage"), ""),
        status=t.get(_tag("status"), ""),
        candidate=t.get(_tag("candidate"), ""),
        baseline=t.get(_tag("baseline"), ""),
        run_id=run.info.run_id,
        started=t.get(_tag("started"), ""),
        updated=t.get(_tag("updated"), ""),
        reason=t.get(_tag("reason"), ""),
        weight=int(t[_tag("weight")]) if t.get(_tag("weight"), "").isdigit() else None,
    )


def _experiment_exists(registry: Registry) -> bool:
    """Whether any rollout was ever recorded (readers do not create the experiment as a side effect)."""
    if ROLLOUTS_EXPERIMENT in registry._experiments:
        return True
    return registry.experiment_named(ROLLOUTS_EXPERIMENT) is not None


def rollouts(registry: Registry, model: str | None = None, version: str | None = None) -> list[RolloutRecord]:
    """Every rollout (of `model`, of its `version`), oldest first."""
    if not _experiment_exists(registry):
        return []
    filters = [f"tags.`{model_tag('kind')}` = 'rollout'"]
    if model:
        filters.append(f"tags.`{model_tag('model')}` = {filter_literal(model, 'model')}")
    if version:
        filters.append(f"tags.`{model_tag('version')}` = {filter_literal(version, 'version')}")
    return [_record(r) for r in registry.search_runs(ROLLOUTS_EXPERIMENT, " and ".join(filters))]


def rollout(registry: Registry, rollout_id: str) -> RolloutRecord | None:
    if not _experiment_exists(registry):
        return None
    found = list(
        registry.search_runs(
            ROLLOUTS_EXPERIMENT,
            f"tags.`{model_tag('kind')}` = 'rollout' and tags.`{_tag('id')}` = {filter_literal(rollout_id, 'id')}",
        )
    )
    return _record(found[-1]) if found else None


def analyses(registry: Registry, rollout_id: str) -> list[AnalysisRecord]:
    """The analyses of one rollout in the order they were made; an `analysis.json` that no longer matches its
    sha256 raises EvidenceTampered."""
    if not _experiment_exists(registry):
        return []
    filters = (
        f"tags.`{model_tag('kind')}` = 'rollout_analysis' and tags.`{_tag('id')}` = {filter_literal(rollout_id, 'id')}"
    )
    found = []
    for run in registry.search_runs(ROLLOUTS_EXPERIMENT, filters):
        if run.info.status != "FINISHED":
            continue
        t = dict(run.data.tags)
        data = registry.load_artifact_bytes(run.info.run_id, ARTIFACT)
        verify_artifact(
            t, t.get(model_tag("model"), ""), t.get(model_tag("version"), ""), run.info.run_id, ARTIFACT, data
        )
        try:
            analysis = json.loads(data)
        except ValueError as e:
            raise RegistryError(
                f"rollout {rollout_id}: analysis of run {run.info.run_id} is unreadable ({e})"
            ) from None
        found.append(
            AnalysisRecord(
                rollout_id=rollout_id,
                run_id=run.info.run_id,
                step=int(t.get(_tag("step"), 0)),
                weight=int(t.get(_tag("weight"), 0)),
                verdict=t.get(_tag("verdict"), ""),
                reason=t.get(_tag("reason"), ""),
                at=t.get(_tag("at"), ""),
                arms=dict(analysis.get("arms") or {}),
                analysis=analysis,
            )
        )
    return sorted(found, key=lambda a: (a.at, a.run_id))


def canary_evidence(registry: Registry, model: str, version: str) -> list[dict[str, Any]]:
    """What the `canary` gate reads of a version: per rollout, its id, status and its analyses' (weight, verdict)."""
    return [
        {
            "id": r.id,
            "status": r.status,
            "route": r.route,
            "stage": r.stage,
            "updated": r.updated,
            "reason": r.reason,
            "analyses": [
                {"weight": a.weight, "verdict": a.verdict, "run_id": a.run_id} for a in analyses(registry, r.id)
            ],
        }
        for r in rollouts(registry, model, version)
    ]
