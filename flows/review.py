"""`gate_review`: evaluate the fallback and every candidate, score them, publish the comparison.

The fallback goes first, so the candidates' gates (quality vs fallback, speedup) judge against the
fallback just measured. A candidate that cannot be loaded or decoded is reported as failed; the
review of the others goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from evals.sweep import default_sweep_path, load_sweep, model_is_causal
from flows import tasks
from flows.evaluate import EvaluationOptions, evaluate_on
from flows.failures import refused_write
from flows.interrupt import shielded
from flows.outcome import CandidateOutcome
from flows.progress import report
from gates import load_policy
from gates.evaluate import SIGNED_KINDS
from gates.scoring import alternative, rank
from gates.stages import next_stage
from models.catalog import load_catalog
from registry import Registry, load_evidence
from registry.connection import resolve_tracking_uri
from registry.links import mlflow_ui_command


@task(name="order-models", cache_policy=NO_CACHE, persist_result=False)
def fallback_first(models: list[str]) -> list[str]:
    """The models with the fallback role (catalog role, else a causal checkpoint) first, order kept."""
    catalog = load_catalog()

    def is_fallback(ref: str) -> bool:
        if ref in catalog:
            return catalog.get(ref).role == "fallback"
        try:
            return model_is_causal(ref)
        except Exception:  # unloadable: its own evaluation reports why
            return False

    return sorted(models, key=lambda m: not is_fallback(m))


@task(name="score-candidates", cache_policy=NO_CACHE, persist_result=False)
def score_candidates(
    versions: dict[str, str], tracking_uri: str, stage: str, policy_path: str | None = None
) -> dict[str, dict[str, Any]]:
    """Multi-criteria scores (gates.scoring: TOPSIS, weighted sum, Pareto) of every reviewed model at `stage`."""
    registry = Registry(tracking_uri)
    stage_policy = load_policy(policy_path).stage(stage)
    alternatives = [
        a
        for model, version in versions.items()
        if (a := alternative(load_evidence(registry, model, version), stage_policy)) is not None
    ]
    frame = rank(alternatives, stage_policy.weights)
    return {
        row["candidate"]: {
            "topsis": float(row["topsis"]),
            "weighted_sum": float(row["weighted_sum"]),
            "rank": int(row["rank_topsis"]),
            "pareto": bool(row["pareto"]),
        }
        for row in frame.to_dict(orient="records")
    }


def scorecard_row(outcome: CandidateOutcome | Mapping[str, Any], scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One line of the scorecard: where the candidate stands and what stops it going further."""
    outcome = CandidateOutcome.of(outcome)
    if outcome.error:
        return {
            "candidate": outcome.candidate,
            "role": outcome.role,
            "version": "",
            "qualifies": "failed",
            "judged_at": "",
            "passed": 0,
            "failed": 0,
            "open": 0,
            "reasons": [outcome.error],
            "inconclusive": [],
            "score": None,
            "rank": None,
            "cached": "",
            "mlflow_run": "",
        }
    target = next_stage(outcome.qualified) or outcome.qualified
    assert target is not None  # next_stage(None) is the first stage
    gates = outcome.gates(target)
    failed = [f"{g['gate']}: {g['reason']}" for g in gates if verdict_of(g) == "fail"]
    # what the evidence cannot judge yet, at this stage and the ones after it, with what would settle it
    later = list(outcome.verdicts)[list(outcome.verdicts).index(target) :] if target in outcome.verdicts else []
    undecided = [
        f"{stage} {g['gate']}: {g.get('settle') or g['reason']}"
        for stage in later
        for g in outcome.gates(stage)
        if verdict_of(g) == "inconclusive"
    ]
    score = scores.get(outcome.candidate, {})
    return {
        "candidate": outcome.candidate,
        "role": outcome.role,
        "version": outcome.version,
        "qualifies": outcome.qualified or "none",
        "judged_at": target,
        "passed": sum(g["passed"] for g in gates),
        "failed": len(failed),
        "open": sum(verdict_of(g) == "inconclusive" for g in gates),
        "reasons": failed + outcome.failures,
        "inconclusive": undecided,
        "score": score.get("topsis"),
        "rank": score.get("rank"),
        "cached": f"{outcome.cached}/{outcome.points}",
        "mlflow_run": outcome.mlflow_run,
    }


def verdict_of(gate: dict[str, Any]) -> str:
    """A gate result dict's verdict (a result recorded before verdicts has only `passed`)."""
    return gate.get("verdict") or ("pass" if gate["passed"] else "fail")


def passed_stage(
    outcome: CandidateOutcome | Mapping[str, Any], stage: str, ignore: set[str] | frozenset[str] = frozenset()
) -> bool:
    """Whether every gate of `stage` (but those named in `ignore`) passed in this outcome (a failed evaluation
    passes nothing)."""
    return CandidateOutcome.of(outcome).passed(stage, ignore)


def failed_outcome(model_id: str, state: Any) -> CandidateOutcome:
    """The outcome of a candidate whose evaluation failed; a write the machine refused (a full disk) is raised
    instead: no candidate failed, and the next one would meet the same disk."""
    error = state.result(raise_on_failure=False)
    if refused_write(error):
        raise error
    message = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(state.message)
    return CandidateOutcome.failed(model_id, message)


@flow(name="gate-review", flow_run_name="gate review")
def gate_review(
    models: list[str] | None = None,
    sweep: str = str(default_sweep_path()),
    options: EvaluationOptions = EvaluationOptions(),
    score_stage: str = "poc",
) -> dict[str, Any]:
    """Evaluate the fallback and the candidates (default: the sweep's models), score and compare them."""
    tracking_uri = resolve_tracking_uri()
    flushed = flush_kept_evidence(tracking_uri)
    models = list(models or load_sweep(sweep).models)
    evaluate = evaluate_on(options)
    outcomes = []
    for model_id in fallback_first(models):
        report("candidate", candidate=model_id)
        state = evaluate(model_id, sweep, options, return_state=True)
        outcome = CandidateOutcome.of(state.result()) if state.is_completed() else failed_outcome(model_id, state)
        if outcome.error:
            report("failure", candidate=model_id, message=outcome.error)
        outcomes.append(outcome)
    # Hard gates filter first; scores rank the models that passed every measured gate of the stage (open
    # sign-offs keep a model from promotion, not from the ranking: "ranked on evidence").

    signed = {g.name for g in load_policy(options.policy).stage(score_stage).gates if g.kind in SIGNED_KINDS}
    versions = {o.candidate: o.version for o in outcomes if o.passed(score_stage, signed)}
    scores = score_candidates(versions, tracking_uri, score_stage, options.policy) if versions else {}
    rows = [scorecard_row(o, scores) for o in outcomes]
    publish_review(rows, tracking_uri, score_stage)
    return {
        "scorecard": rows,
        "outcomes": [o.to_dict() for o in outcomes],
        "tracking_uri": tracking_uri,
        "score_stage": score_stage,
        "flushed": flushed,
    }


def flush_kept_evidence(tracking_uri: str) -> list[str]:
    """Log evidence kept back by an earlier run; if the registry is still down, that run's logging says so."""
    with shielded():  # each kept evidence is registered and leaves the outbox, or neither
        state = tasks.flush_outbox(tracking_uri, return_state=True)
    if not state.is_completed() and refused_write(error := state.result(raise_on_failure=False)):
        raise error
    return state.result() if state.is_completed() else []


def review_markdown(rows: list[dict[str, Any]], tracking_uri: str, score_stage: str) -> str:
    lines = [
        "# Gate review",
        "",
        f"Scores: TOPSIS at {score_stage} weights (1 is best), for the models that pass every {score_stage} gate.",
        "",
        "| candidate | role | qualifies for | judged at | gates passed | score | MLflow | why not further |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        score = "-" if r["score"] is None else f"{r['score']:.3f}"
        link = f"[run]({r['mlflow_run']})" if r["mlflow_run"] else ""
        why = (
            "; ".join(r["reasons"] + [f"inconclusive: {x}" for x in r.get("inconclusive", [])]).replace("|", "\\|")
            or "-"
        )
        lines.append(
            f"| {r['candidate']} | {r['role']} | {r['qualifies']} | {r['judged_at']} | "
            f"{r['passed']}/{r['passed'] + r['failed'] + r.get('open', 0)} | {score} | {link} | {why} |"
        )
    lines += ["", f"Browse runs: `{mlflow_ui_command(tracking_uri)}`; the dashboard: `unmask dashboard`."]
    return "\n".join(lines) + "\n"


def publish_review(rows: list[dict[str, Any]], tracking_uri: str, score_stage: str) -> None:
    table = [{k: ("; ".join(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows]
    create_table_artifact(table, key="gate-review", description="Scorecard of the last gate review")
    create_markdown_artifact(
        review_markdown(rows, tracking_uri, score_stage),
        key="gate-review-summary",
        description="Gate review: candidates, stages, gates and scores",
    )
