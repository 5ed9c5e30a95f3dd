"""Promotion rules: may this version's alias move to this stage? A pure decision with every reason.

A promotion needs (DESIGN.md): every gate of the target stage passed on validated records of the
version, the stage's checklist complete, and an approval recorded; and, per policy, the version
must have reached the stage before (`requires_stage`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from checklists import STAGES, Checklist, ChecklistStatus, checklist_status, load_checklist
from evals.records import CandidateEvidence
from gates.evaluate import GateResult, evaluate_gates
from gates.policy import Policy

PROMOTABLE = STAGES  # aliases a promotion may move; `candidate` and `fallback` are set on registration


@dataclass(frozen=True)
class Approval:
    """Who approved a promotion to a stage, when, and why."""

    stage: str
    by: str
    at: str
    comment: str

    def to_dict(self) -> dict[str, str]:
        return {"stage": self.stage, "by": self.by, "at": self.at, "comment": self.comment}


@dataclass(frozen=True)
class PromotionDecision:
    stage: str
    allowed: bool
    reasons: tuple[str, ...]  # why not (empty when allowed)
    gate_results: tuple[GateResult, ...] = ()
    checklist: ChecklistStatus | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def check_checklist_against_policy(checklist: Checklist, policy: Policy) -> list[str]:
    """Gates a checklist names that the stage's policy does not have (a checklist/policy mismatch)."""
    names = {g.name for g in policy.stage(checklist.stage).gates}
    return [f"{checklist.source}: gate {g!r} is not a gate of stage {checklist.stage!r}"
            for g in sorted(checklist.gates_named() - names)]


def decide_promotion(evidence: CandidateEvidence, policy: Policy, stage: str,
                     baseline: Mapping[str, CandidateEvidence | None], signoffs: Mapping[str, Mapping[str, Any]],
                     approval: Approval | None, reached: set[str], checklist: Checklist | None = None) -> PromotionDecision:
    """Judge a promotion of one version to `stage`; `reached` holds the stages the version held before."""
    if stage not in PROMOTABLE:
        return PromotionDecision(stage, False, (f"unknown stage {stage!r}; promotions go to {', '.join(PROMOTABLE)}",))
    stage_policy = policy.stage(stage)
    results = evaluate_gates(evidence, policy, stage, baseline, signoffs)
    checklist = checklist or load_checklist(stage)
    status = checklist_status(checklist, results, evidence.records, signoffs)
    reasons = [f"gate {r.gate} failed: {r.reason}" for r in results if not r.passed]
    reasons += status.missing()
    if stage_policy.requires_stage and stage_policy.requires_stage not in reached:
        reasons.append(f"stage {stage} requires the version to have reached {stage_policy.requires_stage} first")
    reasons += approval_problems(approval, stage, stage_policy.approval_min_comment_chars)
    cited = {"gates": {r.gate: r.evidence.get("record_id") for r in results},
             "run_ids": sorted({r.run_id for r in evidence.records if r.run_id})}
    return PromotionDecision(stage, not reasons, tuple(reasons), tuple(results), status, cited)


def approval_problems(approval: Approval | None, stage: str, min_comment_chars: int) -> list[str]:
    if approval is None or not approval.by.strip():
        return [f"no approval recorded for {stage}: an approver must sign off the promotion"]
    if approval.stage != stage:
        return [f"the approval by {approval.by} is for {approval.stage}, not {stage}"]
    if len(approval.comment.strip()) < min_comment_chars:
        return [f"approval comment by {approval.by} is shorter than {min_comment_chars} characters"]
    return []
