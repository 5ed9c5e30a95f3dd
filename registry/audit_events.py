"""Audit records the flows write: what the nightly re-evaluation found about production (a regression, before any
rollback it leads to, or a night that could not judge it), and a rollout's start and its end without a promotion.
The flows decide when; these write the entry (`registry.audit`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gates.regression import ProductionVerdict
from registry.audit import AuditEvent, append
from registry.identity import Actor
from registry.store import Registry, now_iso

NIGHTLY = "nightly"  # who writes them


def regression_words(verdict: ProductionVerdict) -> str:
    """The failed gates and why, as the finding and the rollback it leads to say them."""
    return "; ".join(f"{r.gate}: {r.reason}" for r in verdict.failed)


def record_regression(registry: Registry, verdict: ProductionVerdict) -> AuditEvent:
    """The finding that production fails gates it passed, on evidence as strong (`gate_evaluation`, kind regression)."""
    return append(
        registry,
        AuditEvent(
            "gate_evaluation",
            NIGHTLY,
            now_iso(),
            "production",
            verdict.model,
            verdict.version,
            comment=f"regression: production fails its gates: {regression_words(verdict)}",
            evidence={
                "kind": "regression",
                "failed": verdict.to_dict()["failed"],
                "policy": verdict.decision.evidence.get("policy"),
            },
        ),
    )


def inconclusive_words(verdict: ProductionVerdict) -> str:
    return "; ".join(list(verdict.thinner) + [f"{r.gate}: {r.settle}" for r in verdict.inconclusive])


def record_inconclusive(registry: Registry, verdict: ProductionVerdict) -> AuditEvent:
    """That tonight could not judge production, and why (`gate_evaluation`, kind inconclusive); nothing rolled back."""
    return append(
        registry,
        AuditEvent(
            "gate_evaluation",
            NIGHTLY,
            now_iso(),
            "production",
            verdict.model,
            verdict.version,
            comment=f"inconclusive: tonight's evidence cannot judge production, nothing rolled back: "
            f"{inconclusive_words(verdict)}",
            evidence={
                "kind": "inconclusive",
                **{k: v for k, v in verdict.to_dict().items() if k not in ("model", "version")},
                "policy": verdict.decision.evidence.get("policy"),
            },
        ),
    )


def record_rollout_start(
    registry: Registry,
    actor: Actor,
    stage: str,
    model: str,
    version: str,
    rollout_id: str,
    route: str,
    candidate: str,
    baseline: str,
    steps: Any,
    policy: dict[str, Any],
    run_id: str,
) -> AuditEvent:
    """That a rollout of `model` `version` to `stage` started on `route` (`rollout_start`); `steps` as the
    rollout policy holds them (worded as they are)."""
    return append(
        registry,
        AuditEvent(
            "rollout_start",
            actor.name,
            now_iso(),
            stage,
            model,
            version,
            comment=(
                f"rollout {rollout_id} of {model} v{version} to {stage} on route {route}: {candidate} against "
                f"{baseline}, "
                f"steps {steps}"
            ),
            evidence={"rollout": rollout_id, "run_id": run_id, "policy": policy, "actor": actor.to_dict()},
        ),
    )


def record_rollout_end(
    registry: Registry,
    event: str,
    actor: Actor,
    stage: str,
    model: str,
    version: str,
    rollout_id: str,
    route: str,
    reason: str,
    holder: tuple[str, str] | None,
    run_id: str,
    step: int,
    weight: int,
    analysis: dict[str, Any],
) -> AuditEvent:
    """That a rollout ended without a promotion (`rollout_rollback` or `rollout_abort`), and who holds the stage."""
    held = "@".join(holder) if holder else ""
    return append(
        registry,
        AuditEvent(
            event,
            actor.name,
            now_iso(),
            stage,
            model,
            version,
            to_ref=held,
            comment=f"rollout {rollout_id} of {model} v{version} on route {route}: {reason}",
            evidence={
                "rollout": rollout_id,
                "run_id": run_id,
                "step": step,
                "weight": weight,
                "analysis": analysis,
                "actor": actor.to_dict(),
                "stage_holder": held,
            },
        ),
    )


def record_rollout_step(
    registry: Registry, actor: Actor, rollout: Mapping[str, str], step: int, weight: int, analysis: Mapping[str, Any]
) -> AuditEvent:
    """That a rollout's step was judged by its canary analysis (`rollout_step`): the verdict, at which weight, and
    the analysis run. `rollout`: its id, stage, model, version and route."""
    verdict = str(analysis.get("verdict", ""))
    return append(
        registry,
        AuditEvent(
            "rollout_step",
            actor.name,
            now_iso(),
            rollout["stage"],
            rollout["model"],
            rollout["version"],
            comment=f"rollout {rollout['id']} on route {rollout['route']}, step {step + 1} at {weight}%: {verdict}: "
            f"{analysis.get('reason', '')}"[:500],
            evidence={
                "rollout": rollout["id"],
                "step": step,
                "weight": weight,
                "verdict": verdict,
                "look": analysis.get("look"),
                "analysis_run": analysis.get("run_id", ""),
                "actor": actor.to_dict(),
            },
        ),
    )


def record_decision_change(
    registry: Registry, who: str, at: str, before: str, decision: Mapping[str, Any], report_sha256: str, run_id: str
) -> AuditEvent:
    """That a stage's verdict moved (`decision_changed`): from `before` ("" when never judged) to the stored
    decision's outcome, with its blockers, the gate report's sha256 and the evidence run it judged."""
    blockers = list(decision.get("blockers") or [])
    return append(
        registry,
        AuditEvent(
            "decision_changed",
            who,
            at,
            str(decision["stage"]),
            str(decision["model"]),
            str(decision["version"]),
            comment=f"{before or 'not judged'} -> {decision['outcome']}"
            + (f": {'; '.join(blockers[:3])}" if blockers else ""),
            evidence={
                "verdict": decision["outcome"],
                "before": before,
                "blockers": blockers,
                "report_sha256": report_sha256,
                "evidence_run": run_id,
            },
        ),
    )
