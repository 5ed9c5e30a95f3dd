"""Read-only views of the registry for the dashboard and the CLI: plain dicts and pandas DataFrames.

Nothing here writes to MLflow. Each function takes an optional `Registry` (default: the embedded
store or $MLFLOW_TRACKING_URI).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd

from evals.intervals import wilson_interval
from gates.decision import Decision
from gates.evaluate import evaluate_gates
from gates.policy import CRITERIA, Policy, StagePolicy, load_policy
from gates.promotion import Approval, current_signoffs, predates
from gates.results import GateResult
from gates.roles import load_roles
from gates.scoring import alternative, rank, score_survivors
from registry import audit
from registry.decision import decisions_of
from registry.integrity import EvidenceTampered, GateReportTampered
from registry.signing import Anchor
from registry.state import approvals_from_tags, fallback_holder, stage_holder, version_state
from registry.store import ALIASES, STAGE_ALIASES, Registry, filter_literal, latest_registration, model_tag
from registry.tracking import load_evidence, load_gate_report


def _reg(registry: Registry | None) -> Registry:
    return registry or Registry()


def list_candidates(registry: Registry | None = None) -> pd.DataFrame:
    """One row per registered model: model, role, kind, versions, latest_version, aliases {alias: version}."""
    reg = _reg(registry)
    rows = []
    for m in reg.registered_models():
        versions = reg.versions(m.name)
        rows.append(
            {
                "model": m.name,
                "role": m.tags.get(model_tag("role"), ""),
                "kind": m.tags.get(model_tag("kind"), ""),
                "versions": len(versions),
                "latest_version": versions[-1] if versions else None,
                "aliases": {k: str(v) for k, v in (m.aliases or {}).items()},
            }
        )
    return pd.DataFrame(rows, columns=["model", "role", "kind", "versions", "latest_version", "aliases"])


def list_versions(model: str | None = None, registry: Registry | None = None) -> pd.DataFrame:
    """One row per version: model, version, revision, weights_sha256, evidence_run_id, evaluated_at, aliases,
    gates_<stage> ('passed'/'failed'/None), reached (stages held at some time), approvals {stage: {by, at, comment}}."""
    reg = _reg(registry)
    names = [model] if model else reg.model_names()
    rows = []
    for name in names:
        aliases = reg.aliases_of(name)
        for v in reg.client.search_model_versions(f"name = {filter_literal(name, 'model')}", max_results=10000):
            version, tags = str(v.version), dict(v.tags)
            row: dict[str, Any] = {
                "model": name,
                "version": version,
                "revision": tags.get(model_tag("revision"), ""),
                "weights_sha256": tags.get(model_tag("weights_sha256"), ""),
                "evidence_run_id": tags.get(model_tag("evidence_run"), ""),
                "evaluated_at": tags.get(model_tag("evaluated_at"), ""),
                "aliases": sorted(a for a, ver in aliases.items() if ver == version),
                "reached": sorted(s for s in STAGE_ALIASES if model_tag(f"reached.{s}") in tags),
                "approvals": {
                    s: a.to_dict() for s in STAGE_ALIASES if (a := _newest_approval(tags, s, name, version)) is not None
                },
            }
            row |= {f"gates_{s}": tags.get(model_tag(f"gates.{s}")) for s in STAGE_ALIASES}
            rows.append(row)
    frame = pd.DataFrame(rows)
    if not rows:
        return frame
    gates = [f"gates_{s}" for s in STAGE_ALIASES]  # pandas turns None beside a verdict into NaN; keep None
    frame[gates] = frame[gates].astype(object).where(frame[gates].notna(), None)
    return frame.sort_values(["model", "version"], key=lambda c: c.map(_num)).reset_index(drop=True)


def _num(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.isdigit() else value


def _newest_approval(tags: dict[str, str], stage: str, model: str, version: str) -> Approval | None:
    found = approvals_from_tags(tags, stage, model, version)
    return found[-1] if found else None


def aliases(registry: Registry | None = None) -> dict[str, dict[str, str] | None]:
    """{alias: {"model", "version"} or None} for candidate (per model: the latest), the stages, and fallback.

    Stage holders are read through any move in flight, so a half-done move never shows.
    """
    reg = _reg(registry)
    out: dict[str, Any] = {}
    everything = reg.all_aliases()
    for alias in ALIASES:
        if alias in STAGE_ALIASES:
            holder = stage_holder(reg, alias)
            out[alias] = {"model": holder[0], "version": holder[1]} if holder else None
        else:
            found = [{"model": m, "version": a[alias]} for m, a in everything.items() if alias in a]
            out[alias] = found[0] if len(found) == 1 else (found or None)
    return out


def gate_results(
    model: str | None = None, version: str | None = None, stage: str | None = None, registry: Registry | None = None
) -> pd.DataFrame:
    """The last stored gate results: model, version, stage, gate, passed, value, threshold, reason, record_id,
    run_id, evaluated_at, evidence (dict), verdict (pass, fail or inconclusive; from `passed` for reports
    written before verdicts had three values), settle (what would settle an inconclusive one), policy_path and
    policy_sha256 (the policy that judged them), report_integrity (verified, or unverified for a report written
    before gate reports were hashed). A gate report edited since it was written gives no rows (see
    `views.integrity_board`)."""
    reg = _reg(registry)
    rows = []
    for name in [model] if model else reg.model_names():
        for ver in [version] if version else reg.versions(name):
            for st in [stage] if stage else STAGE_ALIASES:
                try:
                    report = load_gate_report(reg, name, ver, st)
                except GateReportTampered:  # never read; the integrity board names the file
                    continue
                if report is None:  # never evaluated at this stage
                    continue
                cited = report.get("policy") or {}
                for r in report.get("results", []):
                    rows.append(
                        {
                            "model": name,
                            "version": ver,
                            "stage": st,
                            "gate": r["gate"],
                            "passed": r["passed"],
                            "value": r["value"],
                            "threshold": r["threshold"],
                            "reason": r["reason"],
                            "record_id": r["evidence"].get("record_id"),
                            "run_id": r["evidence"].get("run_id"),
                            "evaluated_at": report["evaluated_at"],
                            "evidence": r["evidence"],
                            "verdict": GateResult.from_dict(r).verdict,
                            "settle": r.get("settle", ""),
                            "policy_path": cited.get("path", ""),
                            "policy_sha256": cited.get("sha256", ""),
                            "report_integrity": report["integrity"],
                        }
                    )
    columns = [
        "model",
        "version",
        "stage",
        "gate",
        "passed",
        "value",
        "threshold",
        "reason",
        "record_id",
        "run_id",
        "evaluated_at",
        "evidence",
        "verdict",
        "settle",
        "policy_path",
        "policy_sha256",
        "report_integrity",
    ]
    return pd.DataFrame(rows, columns=columns)


def checklist(model: str, version: str, stage: str, registry: Registry | None = None) -> pd.DataFrame:
    """The stage's checklist items for a version as last judged: stage, item, text, kind, done, reason, evidence."""
    try:
        report = load_gate_report(_reg(registry), model, version, stage) or {}
    except GateReportTampered:  # never read; the integrity board names the file
        report = {}
    return pd.DataFrame(
        report.get("checklist", []), columns=["stage", "item", "text", "kind", "done", "reason", "evidence"]
    )


def records(model: str | None = None, version: str | None = None, registry: Registry | None = None) -> pd.DataFrame:
    """Every EvalRecord field (plus record_id, model, version) of the evidence each version was last judged on."""
    reg = _reg(registry)
    rows = []
    for name in [model] if model else reg.model_names():
        for ver in [version] if version else reg.versions(name):
            for r in load_evidence(reg, name, ver).records:
                rows.append(r.to_dict() | {"model": name, "version": ver})
    return pd.DataFrame(rows)


def audit_chain(registry: Registry | None = None, anchor: Anchor | None = None) -> dict[str, Any]:
    """Whether the audit trail's hash chain verifies (`registry.audit.verify`), as plain data: status (intact,
    broken, empty, unchained), ok, summary (one line), entries, chained, legacy, head_seq, head_sha256,
    starts_at, first_break ({kind, position, run_id, seq, event, when, detail, text} or None), anchor (the signed
    head). `anchor`: a signed head kept outside the store, checked too."""
    return audit.verify(_reg(registry), anchor).to_dict()


def audit_events(
    model: str | None = None, stage: str | None = None, event: str | None = None, registry: Registry | None = None
) -> pd.DataFrame:
    """The audit trail, oldest first: when, event, who, stage, model, version, from, to, comment, status,
    evidence (dict), audit_run_id, seq and sha256 (its place and hash in the chain; 0 and "" before it)."""
    found = audit.events(_reg(registry), model=model, stage=stage, event=event)
    columns = [
        "when",
        "event",
        "who",
        "stage",
        "model",
        "version",
        "from",
        "to",
        "comment",
        "status",
        "evidence",
        "audit_run_id",
        "seq",
        "sha256",
    ]
    return pd.DataFrame([e.to_dict() for e in found], columns=columns)


def scores(
    stage: str, weights: dict[str, float] | None = None, registry: Registry | None = None, policy: Policy | None = None
) -> dict[str, pd.DataFrame]:
    """Rank the latest version of every model (candidates and the fallback) at a stage.

    Hard gates filter (evaluated afresh on the stored evidence, so the fallback is judged too), then
    MCDM ranks the survivors. Returns {"ranking", "sensitivity", "filtered"} DataFrames (see
    `gates.scoring.score_survivors`) and "intervals" (`score_intervals`); `weights` overrides the
    policy's (the dashboard's sliders).
    """
    reg = _reg(registry)
    policy = policy or load_policy()
    stage_policy = policy.stage(stage)
    if weights:
        total = sum(weights.values()) or 1.0
        stage_policy = replace(stage_policy, weights={c: weights.get(c, 0.0) / total for c in CRITERIA})
    fallback = fallback_holder(reg)
    production = stage_holder(reg, "production")
    baseline = {
        "fallback": load_evidence(reg, *fallback) if fallback else None,
        "production": load_evidence(reg, *production) if production else None,
    }
    candidates, results = [], {}
    roles = load_roles()
    for name, held in reg.all_aliases().items():
        version = latest_registration(held)
        if not version:
            continue
        try:
            evidence = load_evidence(reg, name, version)
        except EvidenceTampered:  # never ranked; the gate board shows it as tampered
            continue
        candidates.append(evidence)
        state = version_state(reg, name, version)
        signoffs, _ = current_signoffs(state.signoffs(stage), state.evaluated_at, roles, (name, version, stage))
        results[name] = evaluate_gates(evidence, policy, stage, baseline, signoffs)
    ranking, sensitivity, filtered = score_survivors(candidates, results, stage_policy)
    return {
        "ranking": ranking,
        "sensitivity": sensitivity,
        "filtered": filtered,
        "intervals": score_intervals(candidates, list(ranking.candidate), stage_policy),
    }


INTERVAL_COLUMNS = [
    "candidate",
    "n_items",
    "quality_low",
    "quality_high",
    "topsis_low",
    "topsis_high",
    "weighted_sum_low",
    "weighted_sum_high",
]


def score_intervals(candidates: list[Any], ranked: list[str], stage: StagePolicy) -> pd.DataFrame:
    """How far each ranked candidate's scores can move on sampling noise (INTERVAL_COLUMNS): its quality's 95%
    Wilson interval on the items measured, and the range of its TOPSIS and weighted-sum scores while its
    quality runs across that interval, the others held where they were measured."""
    alternatives = [a for e in candidates if (a := alternative(e, stage)) is not None and a.candidate in ranked]
    n_items = {
        e.candidate: r.n_items
        for e in candidates
        for r in e.records
        if any(a.candidate == e.candidate and a.record_id == r.record_id for a in alternatives)
    }
    nominal = rank(alternatives, stage.weights).set_index("candidate") if alternatives else None
    rows = []
    for alt in alternatives:
        low, high = wilson_interval(alt.quality, n_items.get(alt.candidate, 0))
        assert nominal is not None  # ranked above: there are alternatives
        seen = {
            "topsis": [nominal.loc[alt.candidate, "topsis"]],
            "weighted_sum": [nominal.loc[alt.candidate, "weighted_sum"]],
        }
        for quality in (low, high):
            moved = [replace(a, quality=quality) if a is alt else a for a in alternatives]
            scored = rank(moved, stage.weights).set_index("candidate")
            for method, values in seen.items():
                values.append(scored.loc[alt.candidate, method])
        rows.append(
            {
                "candidate": alt.candidate,
                "n_items": n_items.get(alt.candidate, 0),
                "quality_low": low,
                "quality_high": high,
                "topsis_low": float(min(seen["topsis"])),
                "topsis_high": float(max(seen["topsis"])),
                "weighted_sum_low": float(min(seen["weighted_sum"])),
                "weighted_sum_high": float(max(seen["weighted_sum"])),
            }
        )
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def promotion_decision(
    model: str, version: str, stage: str, registry: Registry | None = None, policy: Policy | None = None
) -> Decision | None:
    """A version's decision at a stage as `unmask gates` would make it now, recorded nowhere; None when its
    evidence (or a baseline's) is tampered, which the integrity board shows instead."""
    judged = decisions_of(_reg(registry), model, version, (stage,), policy or load_policy())
    return judged[stage] if judged else None


JUDGED_COLUMNS = ["model", "version", "stage", "verdict", "evaluated_at", "policy_path", "policy_sha256"]


def judged_policies(registry: Registry | None = None) -> pd.DataFrame:
    """Which policy file judged each stored stage verdict (JUDGED_COLUMNS), from the version's tags; empty
    path and sha256 for a verdict recorded before policies were cited."""
    reg = _reg(registry)
    rows = []
    for name in reg.model_names():
        for ver in reg.versions(name):
            tags = reg.version_tags(name, ver)
            rows += [
                {
                    "model": name,
                    "version": ver,
                    "stage": s,
                    "verdict": tags[model_tag(f"gates.{s}")],
                    "evaluated_at": tags.get(model_tag(f"gates.{s}.at"), ""),
                    "policy_path": tags.get(model_tag(f"gates.{s}.policy"), ""),
                    "policy_sha256": tags.get(model_tag(f"gates.{s}.policy_sha256"), ""),
                }
                for s in STAGE_ALIASES
                if model_tag(f"gates.{s}") in tags
            ]
    return pd.DataFrame(rows, columns=JUDGED_COLUMNS)


def version_status(model: str, version: str, registry: Registry | None = None) -> dict[str, Any]:
    """One version at a glance: reached stages, approvals and sign-offs per stage; each approval and
    sign-off says whether it still counts (`stale`: given before the latest evaluation)."""
    state = version_state(_reg(registry), model, version)
    latest = state.evaluated_at
    return {
        "model": model,
        "version": version,
        "reached": sorted(state.reached),
        "approvals": {
            s: a.to_dict() | {"stale": predates(a.at, latest)} for s in STAGE_ALIASES if (a := state.approval(s))
        },
        "signoffs": {
            s: {
                item: signoff | {"stale": predates(signoff.get("at"), latest)}
                for item, signoff in state.signoffs(s).items()
            }
            for s in STAGE_ALIASES
        },
    }
