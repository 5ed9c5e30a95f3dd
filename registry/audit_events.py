"""Audit records of what the nightly re-evaluation found about production: a regression (before any rollback it
leads to) or a night that could not judge it. The flows decide when; these write the entry (`registry.audit`)."""

from __future__ import annotations

from gates.regression import ProductionVerdict
from registry.audit import AuditEvent, append
from registry.store import Registry, now_iso

NIGHTLY = "nightly"  # who writes them


def regression_words(verdict: ProductionVerdict) -> str:
    """The failed gates and why, as the finding and the rollback it leads to say them."""
    return "; ".join(f"{r.gate}: {r.reason}" for r in verdict.failed)


def record_regression(registry: Registry, verdict: ProductionVerdict) -> AuditEvent:
    """The finding that production fails gates it passed, on evidence as strong (`gate_evaluation`, kind regression)."""
    return append(registry, AuditEvent(
        "gate_evaluation", NIGHTLY, now_iso(), "production", verdict.model, verdict.version,
        comment=f"regression: production fails its gates: {regression_words(verdict)}",
        evidence={"kind": "regression", "failed": verdict.to_dict()["failed"],
                  "policy": verdict.decision.evidence.get("policy")}))


def inconclusive_words(verdict: ProductionVerdict) -> str:
    return "; ".join(list(verdict.thinner) + [f"{r.gate}: {r.settle}" for r in verdict.inconclusive])


def record_inconclusive(registry: Registry, verdict: ProductionVerdict) -> AuditEvent:
    """That tonight could not judge production, and why (`gate_evaluation`, kind inconclusive); nothing rolled back."""
    return append(registry, AuditEvent(
        "gate_evaluation", NIGHTLY, now_iso(), "production", verdict.model, verdict.version,
        comment=f"inconclusive: tonight's evidence cannot judge production, nothing rolled back: "
                f"{inconclusive_words(verdict)}",
        evidence={"kind": "inconclusive", **{k: v for k, v in verdict.to_dict().items() if k not in ("model", "version")},
                  "policy": verdict.decision.evidence.get("policy")}))
