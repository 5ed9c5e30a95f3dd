"""What the dashboard shows, computed from the registry: the gate board, quality-latency points, a
candidate's evidence, MLflow links and the nightly regression findings. Read-only, like `registry.read`
(which it builds on).

A regression finding is what the nightly flow writes to the audit trail when a version fails gates it
passed before: a `gate_evaluation` event whose evidence is `{"kind": "regression", "failed": [{gate,
reason}, ...]}`; the rollback it may trigger is the next rollback move of that stage by the same actor.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

import registry.read as read
from evals.benchmark import BenchmarkRecord, benchmark_records, latest_benchmarks
from evals.parallelism import aup
from evals.plots import point_label, quality_latency_front
from evals.records import CandidateEvidence
from gates.decision import ratio_text
from gates.policy import Policy, load_policy
from gates.promotion import predates
from gates.readable import NONE, milliseconds, percent, signed_points, significant, with_interval
from gates.results import operating_records
from gates.rollout_findings import FAILED_ROLLOUT, failed_rollout, finding_text
from registry import audit
from registry.connection import EVALUATIONS_EXPERIMENT
from registry.history import duration_text, stage_history
from registry.integrity import EvidenceTampered, GateReportTampered, alias_drift
from registry.links import run_url
from registry.rollouts import ROLLOUTS_EXPERIMENT, analyses, canary_evidence, rollouts
from registry.state import evaluated_at
from registry.store import STAGE_ALIASES, Registry, latest_registration, model_tag
from registry.tracking import evidence_integrity, load_evidence, load_gate_report

POLICY_ENV = "UNMASK_POLICY"


def dashboard_policy(path: str | Path | None = None) -> Policy:
    """The stage policy the dashboard ranks and marks operating points by: `path`, else $UNMASK_POLICY, else the
    bundled one."""
    return load_policy(path or os.environ.get(POLICY_ENV) or None)


def shown_versions(registry: Registry) -> pd.DataFrame:
    """The versions worth a row: each model's latest, and any that holds an alias or was judged (list_versions
    columns)."""
    versions = read.list_versions(registry=registry)
    if versions.empty:
        return versions
    judged = versions[[f"gates_{s}" for s in STAGE_ALIASES]].notna().any(axis=1)
    held = versions["aliases"].map(bool)
    latest = (
        versions.groupby("model")["version"].transform(lambda v: v.map(int).max()).astype(str) == versions["version"]
    )
    return versions[judged | held | latest].reset_index(drop=True)


def current_version(registry: Registry, model: str) -> str | None:
    """The version a model is evaluated as now: its `candidate` (or `fallback`) alias, else its latest."""
    held = registry.aliases_of(model)
    versions = registry.versions(model)
    return latest_registration(held) or (versions[-1] if versions else None)


def gate_board(registry: Registry) -> pd.DataFrame:
    """One row per (shown version, stage): model, version, aliases, stage, verdict (passed / failed / not judged),
    passed (gates passed), total, failed_gates, evaluated_at."""
    rows = []
    results = read.gate_results(registry=registry)
    for v in shown_versions(registry).itertuples():
        for stage in STAGE_ALIASES:
            mine = results[(results.model == v.model) & (results.version == v.version) & (results.stage == stage)]
            verdict = getattr(v, f"gates_{stage}") or "not judged"
            rows.append(
                {
                    "model": v.model,
                    "version": v.version,
                    "aliases": list(v.aliases),
                    "stage": stage,
                    "verdict": verdict,
                    "passed": int(mine.passed.sum()),
                    "total": len(mine),
                    "failed_gates": list(mine.gate[~mine.passed.astype(bool)]),
                    "evaluated_at": mine.evaluated_at.iloc[0] if len(mine) else "",
                }
            )
    return pd.DataFrame(
        rows,
        columns=["model", "version", "aliases", "stage", "verdict", "passed", "total", "failed_gates", "evaluated_at"],
    )


def current_evidence(registry: Registry) -> Iterator[tuple[str, str, CandidateEvidence]]:
    """(model, version, evidence) of each model's current version; a version whose evidence was tampered with is
    left out (the gate board shows it as tampered; nothing of it is plotted)."""
    for model in registry.model_names():
        version = current_version(registry, model)
        if version is None:
            continue
        try:
            yield model, version, load_evidence(registry, model, version)
        except EvidenceTampered:
            continue


def quality_latency(registry: Registry, policy: Policy | None = None) -> pd.DataFrame:
    """Every record of each model's current version, with its settings label, sampling steps, Pareto membership
    per x axis of QUALITY_AXES (per model, task and generation length, validated records only) and the stages
    whose operating point it is."""
    policy = policy or dashboard_policy()
    frames = []
    for model, version, evidence in current_evidence(registry):
        chosen = {
            stage: {r.config_hash for r in operating_records(evidence, policy.stage(stage))} for stage in policy.stages
        }
        rows = [
            r.to_dict()
            | {
                "model": model,
                "version": version,
                "label": point_label(r),
                "operating_for": [s for s, hashes in chosen.items() if r.config_hash in hashes],
            }
            for r in evidence.records
        ]
        frames.append(pd.DataFrame(rows))
    if not frames:
        return pd.DataFrame()
    points = pd.concat(frames, ignore_index=True)
    # an AR model commits one token per step: its steps are its model calls
    points["steps"] = [float(c.get("steps") or n) for c, n in zip(points.config, points.nfe)]
    for axis, better in QUALITY_AXES.items():
        column = "pareto" if axis == "latency_p95_s" else f"pareto_{axis}"
        points[column] = False
        validated = points[points.valid == True]  # noqa: E712 - None is not valid
        for _, group in validated.groupby(["model", "task", "gen_length"]):
            front = quality_latency_front(list(zip(group[axis] * (1 if better == "lower" else -1), group.accuracy)))
            points.loc[group.index[front], column] = True
    return points


def parallelism_curves(points: pd.DataFrame) -> pd.DataFrame:
    """AUP per model version, task and generation length, from `quality_latency`'s points (validated records with a
    tokens per forward, evals.parallelism): columns model, version, role, task, gen_length, aup, y_max, and `curve`,
    one dict per record {tokens_per_forward, accuracy, label, on_curve} (off the curve: over 5 points below the
    least parallel record's accuracy)."""
    columns = ["model", "version", "role", "task", "gen_length", "aup", "y_max", "curve"]
    if points.empty:
        return pd.DataFrame(columns=columns)
    usable = points[(points.valid == True) & (points.tokens_per_forward.fillna(0) > 0)]  # noqa: E712
    rows = []
    for (model, version, task, gen_length), group in usable.groupby(
        ["model", "version", "task", "gen_length"], sort=False
    ):
        pairs = list(zip(group.tokens_per_forward.astype(float), group.accuracy.astype(float)))
        result = aup(pairs)
        kept = set(result.points)
        curve = [
            {"tokens_per_forward": t, "accuracy": a, "label": label or "vanilla", "on_curve": (t, a) in kept}
            for (t, a), label in zip(pairs, group.label)
        ]
        rows.append(
            {
                "model": model,
                "version": version,
                "role": group.role.iloc[0],
                "task": task,
                "gen_length": int(gen_length),
                "aup": result.aup,
                "y_max": result.y_max,
                "curve": sorted(curve, key=lambda c: (c["tokens_per_forward"], -c["accuracy"])),
            }
        )
    return pd.DataFrame(rows, columns=columns)


LOAD_CURVE_COLUMNS = [
    "model",
    "version",
    "role",
    "served_as",
    "concurrency",
    "tokens_per_s",
    "latency_p95_s",
    "requests",
    "error_rate",
    "when",
    "run_id",
]


def load_curves(registry: Registry) -> pd.DataFrame:
    """The serving records (`unmask loadtest`) of each model's current version, one row per concurrency
    (LOAD_CURVE_COLUMNS): the points of its throughput-vs-p95 curve under load."""
    rows = []
    for model, version, evidence in current_evidence(registry):
        rows += [
            {"model": model, "version": version, "role": evidence.role}
            | {c: getattr(r, c) for c in LOAD_CURVE_COLUMNS[3:]}
            for r in evidence.serving
        ]
    return pd.DataFrame(rows, columns=LOAD_CURVE_COLUMNS)


# the x axes quality can be plotted against, and which way is better: the front of each is in `quality_latency`
# as `pareto` (p95 latency) or `pareto_<axis>`
QUALITY_AXES = {"latency_p95_s": "lower", "latency_p50_s": "lower", "steps": "lower", "tokens_per_forward": "higher"}


BENCHMARK_COLUMNS = [
    "host",
    "in flight",
    "model",
    "role",
    "accuracy",
    "vs fallback (pts)",
    "tokens/s",
    "tokens/s vs fallback",
    "tokens per forward",
    "TTFT p50 (ms)",
    "p50 (ms)",
    "p99 (ms)",
    "errors",
    "task",
    "when",
    "paired run",
]
# the figures a chart draws, each with its interval: accuracy (a share) and tokens/s
BENCHMARK_PLOTTED = ["accuracy_value", "accuracy_low", "accuracy_high", "tokens_value", "tokens_low", "tokens_high"]


def benchmark_frame(benchmarks: list[BenchmarkRecord]) -> pd.DataFrame:
    """One row per side of each benchmark record, the candidates then the fallback (BENCHMARK_COLUMNS worded,
    each figure with its 95% interval; BENCHMARK_PLOTTED as numbers): what `unmask bench --concurrency` prints
    and the Quality vs latency page shows."""
    rows = []
    for b in benchmarks:
        for side in b.sides:
            gap, ratio = b.accuracy_vs_fallback(side), b.tokens_per_s_vs_fallback(side)
            accuracy, rate = side.intervals.get("accuracy"), side.intervals.get("tokens_per_s")
            served = f"{side.model}/{side.version}" if side.version else side.model
            rows.append(
                {
                    "host": b.host,
                    "in flight": b.concurrency,
                    "model": served if side.served_as in ("", side.model) else f"{side.served_as} ({served})",
                    "role": "fallback" if side is b.fallback else "candidate",
                    "accuracy": with_interval(percent, accuracy) if accuracy else percent(side.accuracy),
                    "vs fallback (pts)": with_interval(partial(signed_points, unit=""), gap.to_dict() if gap else None),
                    "tokens/s": with_interval(significant, rate) if rate else significant(side.tokens_per_s),
                    "tokens/s vs fallback": "reference"
                    if side is b.fallback
                    else ratio_text(ratio.estimate, False, (ratio.low, ratio.high))
                    if ratio
                    else NONE,
                    "tokens per forward": significant(side.tokens_per_forward),
                    "TTFT p50 (ms)": with_interval(milliseconds, side.intervals.get("ttfb_p50_s"))
                    + ("" if side.streamed else " (no stream)"),
                    "p50 (ms)": with_interval(milliseconds, side.intervals.get("latency_p50_s")),
                    "p99 (ms)": with_interval(milliseconds, side.intervals.get("latency_p99_s")),
                    "errors": f"{round(side.error_rate * side.requests)} of {side.requests}",
                    "task": f"{b.task} ({b.metric})" if b.metric else b.task,
                    "when": b.when,
                    "paired run": b.paired_run,
                    "accuracy_value": side.accuracy,
                    "accuracy_low": (accuracy or {}).get("low"),
                    "accuracy_high": (accuracy or {}).get("high"),
                    "tokens_value": side.tokens_per_s,
                    "tokens_low": (rate or {}).get("low"),
                    "tokens_high": (rate or {}).get("high"),
                }
            )
    return pd.DataFrame(rows, columns=BENCHMARK_COLUMNS + BENCHMARK_PLOTTED)


def latest_benchmark_records(registry: Registry) -> list[BenchmarkRecord]:
    """The newest paired benchmark of each (host, concurrency) among the serving records of each model's current
    version, the fallback's role naming the fallback side."""
    records, fallbacks = [], set()
    for _, _, evidence in current_evidence(registry):
        records += evidence.serving
        if evidence.role == "fallback":
            fallbacks |= {id(r) for r in evidence.serving}
    return latest_benchmarks(benchmark_records(records, lambda r: id(r) in fallbacks))


TIMELINE_COLUMNS = ["stage", "holder", "since", "until", "held", "how", "moved_by", "approvals", "previous", "why"]


def stage_timeline(registry: Registry) -> tuple[pd.DataFrame, str]:
    """Which version held each stage when (`registry.history`, what `unmask history` prints): one row per tenure
    (TIMELINE_COLUMNS; `until` is now's time while it holds), and why the timeline is not evidence ("" when the
    audit chain verifies)."""
    found = stage_history(registry)
    now = datetime.now(UTC)
    rows = [
        {
            "stage": t.stage,
            "holder": t.holder,
            "since": t.since,
            "until": t.until or now.isoformat(),
            "held": duration_text(t.held_s(now)) + ("" if t.until else " (holds it)"),
            "how": t.how,
            "moved_by": t.moved_by,
            "approvals": ", ".join(t.approvals),
            "previous": t.previous or "nobody",
            "why": t.why,
        }
        for t in found.tenures
    ]
    return pd.DataFrame(rows, columns=TIMELINE_COLUMNS), found.problem


INTEGRITY_COLUMNS = ["model", "version", "status", "detail", "artifact"]


def integrity_board(registry: Registry) -> pd.DataFrame:
    """Whether each shown version's evidence, and each of its stored gate reports, still hashes as registered
    (INTEGRITY_COLUMNS; status verified, unverified or tampered; `artifact` names the tampered file), so a forged
    version or verdict is shown as such rather than judged, plotted or read."""
    versions = shown_versions(registry)
    rows = []
    for v in versions.itertuples() if not versions.empty else []:
        row = {"model": v.model, "version": v.version} | evidence_integrity(registry, v.model, v.version)
        row["artifact"] = next(iter(row["sha256"]), "") if row["status"] == "tampered" else ""
        if row["status"] != "tampered":
            for stage in STAGE_ALIASES:
                try:
                    load_gate_report(registry, v.model, v.version, stage)
                except GateReportTampered as e:
                    row |= {"status": "tampered", "detail": str(e), "artifact": e.artifact}
                    break
        rows.append(row)
    return pd.DataFrame(rows, columns=INTEGRITY_COLUMNS + ["sha256"])[INTEGRITY_COLUMNS]


def drifted_aliases(registry: Registry) -> dict[str, str]:
    """{stage: what is wrong} for each stage alias that is not where the audit trail's last settled move left it."""
    return {stage: str(drift) for stage in STAGE_ALIASES if (drift := alias_drift(registry, stage))}


def candidate_view(registry: Registry, model: str, version: str) -> dict[str, Any]:
    """A version's model card, license, reproducibility, environment fingerprint and MLflow runs."""
    evidence = load_evidence(registry, model, version)
    tags = registry.version_tags(model, version)
    evidence_run = tags.get(model_tag("evidence_run"), "")
    fingerprint = evidence.records[0].fingerprint if evidence.records else {}
    if evidence.reproducibility and evidence.reproducibility.fingerprint:
        fingerprint = evidence.reproducibility.fingerprint
    runs: list[dict[str, str | None]] = [{"what": "evidence", "task": "", "settings": "", "run_id": evidence_run}]
    runs += [
        {
            "what": "record",
            "task": r.task,
            "settings": f"gen {r.gen_length} {point_label(r)}".strip(),
            "run_id": r.run_id,
        }
        for r in evidence.records
    ]
    experiment = registry.client.get_experiment_by_name(EVALUATIONS_EXPERIMENT)
    for run in runs:
        run["url"] = run_url(registry.tracking_uri, experiment.experiment_id if experiment else "", run["run_id"])
    return {
        "model": model,
        "version": version,
        "role": evidence.role,
        "kind": evidence.kind,
        "revision": evidence.model_revision,
        "weights_sha256": evidence.weights_sha256,
        "card": evidence.card,
        "license": evidence.license.to_dict() if evidence.license else None,
        "reproducibility": evidence.reproducibility.to_dict() if evidence.reproducibility else None,
        "fingerprint": fingerprint,
        "failures": evidence.failures,
        "runs": pd.DataFrame(runs),
        "status": read.version_status(model, version, registry),
    }


FINDING_COLUMNS = ["when", "model", "version", "stage", "finding", "failed_gates", "action", "audit_run_id"]


def regression_findings(registry: Registry) -> pd.DataFrame:
    """The nightly flow's regression findings and the rollouts rolled back by their canary analysis, newest first
    (FINDING_COLUMNS), with the rollback each led to."""
    events = audit.events(registry, event="gate_evaluation")
    moves = [e for e in audit.events(registry, event=audit.MOVE) if e.evidence.get("kind") == "rollback"]
    rows = []
    for e in events:
        if e.evidence.get("kind") != "regression":
            continue
        failed = [f.get("gate", "") if isinstance(f, dict) else str(f) for f in e.evidence.get("failed") or []]
        rollback = next((m for m in moves if m.stage == e.stage and m.when >= e.when and m.who == e.who), None)
        action = f"rolled back {rollback.from_ref} -> {rollback.to_ref}" if rollback else "no rollback"
        rows.append(
            {
                "when": e.when,
                "model": e.model,
                "version": e.version,
                "stage": e.stage,
                "finding": e.comment,
                "failed_gates": failed,
                "action": action,
                "audit_run_id": e.run_id,
            }
        )
    for e in audit.events(registry, event="rollout_rollback"):  # a canary that failed its analysis live
        failed = (
            [
                m.get("metric", "")
                for m in (e.evidence.get("analysis") or {}).get("metrics", [])
                if m.get("verdict") == "fail"
            ]
            if isinstance(e.evidence.get("analysis"), dict)
            else []
        )
        rows.append(
            {
                "when": e.when,
                "model": e.model,
                "version": e.version,
                "stage": e.stage,
                "finding": e.comment,
                "failed_gates": failed,
                "action": f"rollout {e.evidence.get('rollout', '')} rolled back; "
                f"{e.stage} stays with {e.to_ref or 'nobody'}",
                "audit_run_id": e.run_id,
            }
        )
    frame = pd.DataFrame(rows, columns=FINDING_COLUMNS)
    return frame.sort_values("when", ascending=False).reset_index(drop=True)


# who did what ----------------------------------------------------------------------------------------------
DECISION_COLUMNS = [
    "when",
    "decision",
    "who",
    "host",
    "identity",
    "stage",
    "model",
    "version",
    "what",
    "status",
    "comment",
    "audit_run_id",
]
DECISION_EVENTS = {
    "signoff": "sign-off",
    "approval": "approval",
    "decline": "decline",
    "approval_consumed": "consumed",
    "approval_expired": "expired",
    "approval_void": "void",
    "emergency_rollback": "emergency rollback",
    "chain_repair": "chain repair",
}
MOVE_DECISIONS = {"promotion": "promotion", "rollback": "rollback", "reconcile": "reconcile"}


def decisions(registry: Registry) -> pd.DataFrame:
    """Every decision in the audit trail, newest first as entered (DECISION_COLUMNS): sign-offs, approvals,
    declines, how each approval ended (consumed, expired, void), promotions, rollbacks, reconciles and emergency
    rollbacks, with the actor's name, host and identity source ("" for an event written before identities were
    recorded)."""
    rows = []
    trail = audit.events(registry)
    entered = {str(e.evidence.get("approval", "")) for e in trail if e.event == "approval_consumed"}
    for e in trail:
        kind = MOVE_DECISIONS.get(e.evidence.get("kind", "")) if e.event == audit.MOVE else DECISION_EVENTS.get(e.event)
        if kind is None:
            continue
        actor = e.evidence.get("actor")
        actor = actor if isinstance(actor, dict) else {}
        if e.event == audit.MOVE or e.event == "emergency_rollback":
            what = f"{e.from_ref or 'nobody'} → {e.to_ref or 'nobody'}"
        elif e.event == "signoff":
            what = str(e.evidence.get("item", ""))
        else:
            what = f"approval {e.evidence['approval']}" if e.evidence.get("approval") else ""
            if e.evidence.get("approved_by"):
                what += f" by {e.evidence['approved_by']}"
        rows.append(
            {
                "when": e.when,
                "decision": kind,
                "who": e.who,
                "host": actor.get("host", ""),
                "identity": actor.get("identity", ""),
                "stage": e.stage,
                "model": e.model,
                "version": e.version,
                "what": what,
                "status": e.status,
                "comment": e.comment,
                "audit_run_id": e.run_id,
            }
        )
        if e.event == audit.MOVE and e.status == "FINISHED":  # the approvals it consumed (an entry of their own before)
            rows += [_consumed_row(e, a) for a in _move_approvals(e) if str(a.get("id", "")) not in entered]
    return pd.DataFrame(rows[::-1], columns=DECISION_COLUMNS)  # the trail's order: a move is entered at its intent


def _move_approvals(e: audit.AuditEvent) -> list[dict[str, Any]]:
    found = e.evidence.get("approvals") or []
    return [a for a in found if isinstance(a, dict)]


def _consumed_row(move: audit.AuditEvent, approval: dict[str, Any]) -> dict[str, Any]:
    """An approval a move consumed, as the decisions table lists it (the move's entry is its record)."""
    actor = move.evidence.get("actor")
    actor = actor if isinstance(actor, dict) else {}
    return {
        "when": move.when,
        "decision": DECISION_EVENTS["approval_consumed"],
        "who": move.who,
        "host": actor.get("host", ""),
        "identity": actor.get("identity", ""),
        "stage": move.stage,
        "model": move.model,
        "version": move.version,
        "what": f"approval {approval.get('id', '')} by {approval.get('by', '')}",
        "status": move.status,
        "comment": f"consumed by the move {move.run_id}",
        "audit_run_id": move.run_id,
    }


# rollouts ---------------------------------------------------------------------------------------------------
ROLLOUT_COLUMNS = [
    "id",
    "model",
    "version",
    "route",
    "stage",
    "status",
    "candidate",
    "baseline",
    "weight",
    "steps",
    "analyses",
    "started",
    "updated",
    "reason",
    "run_id",
    "url",
]
ANALYSIS_COLUMNS = [
    "rollout",
    "step",
    "weight",
    "verdict",
    "reason",
    "at",
    "arm",
    "role",
    "requests",
    "p95_s",
    "error_rate",
    "decode_failure_rate",
    "agreement",
    "probe_accuracy",
    "probes",
    "confidence",
    "run_id",
    "url",
]
ROLLOUT_EVENT_COLUMNS = [
    "when",
    "rollout",
    "event",
    "who",
    "stage",
    "model",
    "version",
    "comment",
    "audit_run_id",
    "seq",
]


def rollout_board(registry: Registry) -> dict[str, pd.DataFrame]:
    """What the Rollout page shows: every rollout newest first (ROLLOUT_COLUMNS; `weight` is the candidate's live
    weight as the controller last set it, 0 once rolled back), each analysis per arm (ANALYSIS_COLUMNS, oldest
    first) and the rollouts' audit entries (ROLLOUT_EVENT_COLUMNS: start, rollback, abort, completion)."""
    found = rollouts(registry)
    experiment = registry.experiment_id(ROLLOUTS_EXPERIMENT) if found else ""
    rollout_rows, analysis_rows = [], []
    for r in found:
        steps = analyses(registry, r.id)
        for a in steps:
            for arm, numbers in a.arms.items():
                role = "candidate" if arm == r.candidate else "baseline" if arm == r.baseline else ""
                analysis_rows.append(
                    {
                        "rollout": r.id,
                        "step": a.step,
                        "weight": a.weight,
                        "verdict": a.verdict,
                        "reason": a.reason,
                        "at": a.at,
                        "arm": arm,
                        "role": role,
                        **{k: numbers.get(k) for k in ANALYSIS_COLUMNS[8:15]},
                        "confidence": a.analysis.get("confidence"),
                        "run_id": a.run_id,
                        "url": run_url(registry.tracking_uri, experiment, a.run_id),
                    }
                )
        live = r.weight if r.weight is not None else (steps[-1].weight if steps else 0)
        weight = 0 if r.status in ("rolled_back", "aborted") else live
        policy = _policy_of(registry, r.run_id)
        rollout_rows.append(
            {
                **r.to_dict(),
                "weight": weight,
                "steps": policy.get("steps", []),
                "analyses": len(steps),
                "url": run_url(registry.tracking_uri, experiment, r.run_id),
            }
        )
    events = []
    for e in audit.events(registry):
        if not e.event.startswith("rollout_"):
            continue
        events.append(
            {
                "when": e.when,
                "rollout": e.evidence.get("rollout", ""),
                "event": e.event,
                "who": e.who,
                "stage": e.stage,
                "model": e.model,
                "version": e.version,
                "comment": e.comment,
                "audit_run_id": e.run_id,
                "seq": e.seq,
            }
        )
    board = pd.DataFrame(rollout_rows, columns=ROLLOUT_COLUMNS)
    return {
        "rollouts": board.iloc[::-1].reset_index(drop=True),
        "analyses": pd.DataFrame(analysis_rows, columns=ANALYSIS_COLUMNS),
        "events": pd.DataFrame(events, columns=ROLLOUT_EVENT_COLUMNS),
    }


FAILED_ROLLOUT_COLUMNS = [
    "when",
    "model",
    "version",
    "stage",
    "rollout",
    "status",
    "route",
    "reason",
    "voided_approvals",
    "stands",
    "advice",
    "audit_run_id",
]


def failed_rollouts(registry: Registry) -> pd.DataFrame:
    """Every rolled-back or aborted rollout, newest first (FAILED_ROLLOUT_COLUMNS): a finding on its version.
    `stands` is whether it still blocks the stage (the version's last rollout there, no evidence registered since:
    gates/rollout_findings.py); `voided_approvals` the approvals it voided (audited `approval_void`)."""
    voids = audit.events(registry, event="approval_void")
    ends = {
        e.evidence.get("rollout"): e for e in audit.events(registry) if e.event in ("rollout_rollback", "rollout_abort")
    }
    rows, standing = [], {}
    for r in rollouts(registry):
        if r.status not in FAILED_ROLLOUT:
            continue
        key = (r.model, r.version, r.stage)
        if key not in standing:
            last = failed_rollout(canary_evidence(registry, r.model, r.version), r.stage)
            standing[key] = (
                (last or {}).get("id")
                if last and not predates(last.get("updated"), evaluated_at(registry, r.model, r.version))
                else None
            )
        entry = ends.get(r.id)
        rows.append(
            {
                "when": r.updated or r.started,
                "model": r.model,
                "version": r.version,
                "stage": r.stage,
                "rollout": r.id,
                "status": r.status,
                "route": r.route,
                "reason": r.reason,
                "voided_approvals": [e.evidence.get("approval") for e in voids if r.id in e.comment],
                "stands": standing[key] == r.id,
                "advice": finding_text({"id": r.id, "status": r.status, "reason": ""}, r.stage),
                "audit_run_id": entry.run_id if entry else "",
            }
        )
    frame = pd.DataFrame(rows, columns=FAILED_ROLLOUT_COLUMNS)
    return frame.sort_values("when", ascending=False).reset_index(drop=True)


def _policy_of(registry: Registry, run_id: str) -> dict[str, Any]:
    """The rollout policy recorded on its run (steps, interval ...); {} when unreadable."""
    import json

    text = registry.client.get_run(run_id).data.tags.get(model_tag("rollout.policy"), "")
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return {}
