"""Promotion rules: may this version's alias move to this stage? A pure decision with every reason.

A promotion needs (DESIGN.md): every gate of the target stage passed on validated records of the
version, the stage's checklist complete, and an approval recorded; and, per policy, the version
must have reached the stage before (`requires_stage`). An approval or sign-off vouches for the
evidence its author saw, so one given before the latest evaluation no longer counts.

Each reason says what kind of problem it is (`ReasonKind`), so callers decide by kind, never by
wording: an approver can settle `approval` reasons, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from checklists import STAGES, Checklist, ChecklistStatus, checklist_status, load_checklist
from evals.records import CandidateEvidence
from gates.evaluate import GateResult, evaluate_gates
from gates.policy import Policy

PROMOTABLE = STAGES  # aliases a promotion may move; `candidate` and `fallback` are set on registration


class ReasonKind(str, Enum):
    """What stands in the way of a promotion."""

    GATE = "gate"  # a gate of the stage failed
    INCONCLUSIVE = "inconclusive"  # a gate lacks the evidence to judge (GateResult.settle says what would settle it)
    CHECKLIST = "checklist"  # an item of the stage's checklist is not done
    STAGE = "stage"  # an unknown stage, or one the version may not reach yet (requires_stage)
    APPROVAL = "approval"  # no approval, one too short, or one given before the latest evaluation
    SIGN_OFF = "sign-off"  # a sign-off given before the latest evaluation


@dataclass(frozen=True)
class PromotionReason:
    """One reason a promotion may not happen: its kind, and the sentence users read."""

    kind: ReasonKind
    text: str

    def __str__(self) -> str:
        return self.text

    @property
    def blocking(self) -> bool:
        """Whether it stands whatever an approver does (every kind but an approval's)."""
        return self.kind is not ReasonKind.APPROVAL


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
    reasons: tuple[PromotionReason, ...]  # why not (empty when allowed)
    gate_results: tuple[GateResult, ...] = ()
    checklist: ChecklistStatus | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def gates_passed(self) -> bool:
        """Whether the stage judged at least one gate and every one passed (checklist and approval aside)."""
        return bool(self.gate_results) and all(r.passed for r in self.gate_results)

    def verdict_dict(self) -> dict[str, Any]:
        """The stage verdict as plain data (a flow's outcome, JSON): gate result dicts and reason texts."""
        return {"gates": [r.to_dict() for r in self.gate_results], "reasons": [r.text for r in self.reasons]}


def check_checklist_against_policy(checklist: Checklist, policy: Policy) -> list[str]:
    """Gates a checklist names that the stage's policy does not have (a checklist/policy mismatch)."""
    names = {g.name for g in policy.stage(checklist.stage).gates}
    return [f"{checklist.source}: gate {g!r} is not a gate of stage {checklist.stage!r}"
            for g in sorted(checklist.gates_named() - names)]


def decide_promotion(evidence: CandidateEvidence, policy: Policy, stage: str,
                     baseline: Mapping[str, CandidateEvidence | None], signoffs: Mapping[str, Mapping[str, Any]],
                     approval: Approval | None, reached: set[str], checklist: Checklist | None = None,
                     evaluated_at: str = "") -> PromotionDecision:
    """Judge a promotion of one version to `stage`; `reached` holds the stages the version held before.

    `signoffs` and `approval` are all that were recorded; those older than `evaluated_at` (when the
    version's evidence was last registered) do not count, and each says so.
    """
    if stage not in PROMOTABLE:
        return PromotionDecision(stage, False, (PromotionReason(
            ReasonKind.STAGE, f"unknown stage {stage!r}; promotions go to {', '.join(PROMOTABLE)}"),))
    stage_policy = policy.stage(stage)
    signoffs, stale_signoffs = current_signoffs(signoffs, evaluated_at)
    results = evaluate_gates(evidence, policy, stage, baseline, signoffs)
    checklist = checklist or load_checklist(stage)
    status = checklist_status(checklist, results, evidence.records, signoffs)
    reasons = [PromotionReason(ReasonKind.GATE, f"gate {r.gate} failed: {r.reason}") for r in results
               if not r.passed and not r.inconclusive]
    reasons += [PromotionReason(ReasonKind.INCONCLUSIVE, f"gate {r.gate} is inconclusive: {r.reason}")
                for r in results if r.inconclusive]
    reasons += [PromotionReason(ReasonKind.CHECKLIST, text) for text in status.missing()]
    if stage_policy.requires_stage and stage_policy.requires_stage not in reached:
        reasons.append(PromotionReason(ReasonKind.STAGE, f"stage {stage} requires the version to have reached "
                                                         f"{stage_policy.requires_stage} first"))
    reasons += approval_problems(approval, stage, stage_policy.approval_min_comment_chars, evaluated_at)
    reasons += stale_signoffs
    cited = {"gates": {r.gate: r.evidence.get("record_id") for r in results},
             "run_ids": sorted({r.run_id for r in evidence.records if r.run_id}),
             "policy": policy.cited(), "thresholds": {r.gate: r.threshold for r in results}}
    return PromotionDecision(stage, not reasons, tuple(reasons), tuple(results), status, cited)


def predates(at: str | None, evaluated_at: str) -> bool:
    """Whether an approval or sign-off made at `at` came before the latest evaluation (so no longer counts)."""
    return str(at or "") < evaluated_at


def current_signoffs(signoffs: Mapping[str, Mapping[str, Any]],
                     evaluated_at: str) -> tuple[dict[str, Mapping[str, Any]], list[PromotionReason]]:
    """The sign-offs given since the latest evaluation, and why each older one no longer counts."""
    current, stale = {}, []
    for item, signoff in signoffs.items():
        if predates(signoff.get("at"), evaluated_at):
            stale.append(PromotionReason(ReasonKind.SIGN_OFF, (
                f"the sign-off of {item!r} by {signoff.get('by', '?')} at {signoff.get('at', '?')} predates the latest "
                f"evaluation ({evaluated_at}); sign it off again")))
        else:
            current[item] = signoff
    return current, stale


def approval_problems(approval: Approval | None, stage: str, min_comment_chars: int,
                      evaluated_at: str = "") -> list[PromotionReason]:
    """Why the recorded approval does not allow the promotion (empty when it does)."""
    def problem(text: str) -> list[PromotionReason]:
        return [PromotionReason(ReasonKind.APPROVAL, text)]

    if approval is None or not approval.by.strip():
        return problem(f"no approval recorded for {stage}: an approver must sign off the promotion")
    if approval.stage != stage:
        return problem(f"the approval by {approval.by} is for {approval.stage}, not {stage}")
    if predates(approval.at, evaluated_at):
        return problem(f"the approval by {approval.by} at {approval.at} predates the latest evaluation "
                       f"({evaluated_at}); approve again")
    if len(approval.comment.strip()) < min_comment_chars:
        return problem(f"approval comment by {approval.by} is shorter than {min_comment_chars} characters")
    return []
