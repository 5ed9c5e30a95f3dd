"""What to run next: the commands that clear what blocks a promotion, in the order they need doing.

Read from the typed reasons of a decision (`ReasonKind`) and its checklist status, never from their wording: a
failed rollout or a decline needs new evidence registered, a failed measurement needs new evidence, a missing or
stale sign-off needs `unmask sign-off` (the tooling-maturity gate is one too), an inconclusive gate needs more
evidence (`unmask run --items N` when items would settle it, or the command its result names: `unmask loadtest`,
`unmask rollout start`), a stage not yet reached needs that promotion first, a missing approval needs
`unmask approve`; with nothing left, `unmask promote`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from checklists import ChecklistStatus
from gates.evaluate import SIGNED_KINDS
from gates.policy import StagePolicy
from gates.promotion import PromotionReason, ReasonKind
from gates.results import GateResult
from gates.verdict import Verdict


@dataclass(frozen=True)
class NextStep:
    why: str
    command: str


def names_version(held: dict[str, str], version: str) -> bool:
    """Whether a command must say --version: sign-off, approve and promote default to the `candidate`
    version (sign-off to `fallback` when there is none)."""
    return version != (held.get("candidate") or held.get("fallback"))


def next_steps(
    model: str,
    version: str,
    stage: str,
    reasons: Sequence[PromotionReason],
    gate_results: Sequence[GateResult],
    checklist: ChecklistStatus | None,
    stage_policy: StagePolicy,
    name_version: bool = False,
    policy_path: str | None = None,
) -> list[NextStep]:
    """The commands that clear `reasons` (a decision's blockers), first to do first; `name_version` adds --version
    (when `version` is not the one the commands default to, its `candidate`); a `policy_path` the
    decision was judged under goes to the commands that judge again (run, promote)."""
    flag = f" --version {version}" if name_version else ""
    judged = f" --policy {shlex.quote(str(policy_path))}" if policy_path else ""  # the same policy judges again
    kinds = {r.kind for r in reasons}
    if not reasons:
        return [NextStep(f"everything {stage} needs is in place", f"unmask promote {model} --to {stage}{flag}{judged}")]
    specs = {g.name: g for g in stage_policy.gates}
    failed = [specs[r.gate] for r in gate_results if r.verdict == Verdict.FAIL and r.gate in specs]
    undecided = [r for r in gate_results if r.inconclusive]
    measured = [g.name for g in failed if g.kind not in SIGNED_KINDS]
    undone = [i for i in (checklist.items if checklist else ()) if not i.done]
    to_sign = [i.id for i in undone if i.kind == "manual"]
    to_sign += [
        g.params["checklist_item"]
        for g in failed
        if g.kind in SIGNED_KINDS and g.params["checklist_item"] not in to_sign
    ]
    # an automatic checklist item reads the gates and records: only new evidence clears it
    unmet = measured or [f"checklist item {i.id}" for i in undone if i.kind != "manual"]
    steps = []
    if ReasonKind.KEYS in kinds:  # nothing below counts until people's keys are listed
        steps.append(
            NextStep(
                f"{stage} counts only acts signed by keys the roles file lists: each person makes one, and their "
                "public line goes under `keys:` in the roles file",
                "unmask keys init --name NAME",
            )
        )
    standing = [r.text for r in reasons if r.kind in (ReasonKind.ROLLOUT, ReasonKind.DECLINED)]
    if any(r.kind == ReasonKind.EVIDENCE for r in reasons):
        steps.append(
            NextStep(
                "measure it again: fresh evidence is registered hashed and signed",
                f"unmask run --model {model}{judged}",
            )
        )
    if standing and not unmet:  # only evidence registered after them lifts a failed rollout or a decline
        steps.append(
            NextStep(
                f"{'; '.join(standing)}: it stands until new evidence is registered (change the model or "
                "its sweep; evidence unchanged is reused and does not lift it)",
                f"unmask run --model {model}{judged}",
            )
        )
    if unmet:
        steps.append(
            NextStep(
                f"{', '.join(unmet)} fail on the measurements (unmask gates {model} --stage {stage}); "
                "change the model or the sweep, then measure again",
                f"unmask run --model {model}{judged}",
            )
        )
    # a gate whose evidence another command produces (load test, rollout) names it
    by_command: dict[str, list[GateResult]] = {}
    for r in undecided:
        by_command.setdefault(r.evidence.get("settle_command") or "", []).append(r)
    measured_again = by_command.pop("", [])
    if measured_again:  # more evidence settles these: as many items as the most demanding one asks, if items do
        items = max((int(r.evidence.get("items_per_task") or 0) for r in measured_again), default=0)
        more = f" --items {items}" if items else ""
        steps.append(
            NextStep(
                f"{', '.join(r.gate for r in measured_again)} inconclusive: "
                + "; ".join(f"{r.gate} {r.settle}" for r in measured_again),
                f"unmask run --model {model}{more}{judged}",
            )
        )
    for command, results in by_command.items():
        steps.append(
            NextStep(
                f"{', '.join(r.gate for r in results)} inconclusive: "
                + "; ".join(f"{r.gate} {r.settle}" for r in results),
                command,
            )
        )
    for item in to_sign:
        steps.append(
            NextStep(
                f"checklist item {item} needs a sign-off",
                f'unmask sign-off {model} --stage {stage} --item {item} --comment "what was checked"{flag}',
            )
        )
    if ReasonKind.STAGE in kinds and stage_policy.requires_stage:
        steps.append(
            NextStep(
                f"{stage} needs {stage_policy.requires_stage} first",
                f"unmask promote {model} --to {stage_policy.requires_stage}{flag}{judged}",
            )
        )
    if kinds & {ReasonKind.APPROVAL, ReasonKind.DUTY, ReasonKind.ROLE}:
        steps.append(
            NextStep(
                f"an approver (not the requester, for staging and production) signs off the promotion "
                f"(a comment of {stage_policy.approval_min_comment_chars}+ characters)",
                f'unmask approve {model} {stage} --comment "why it may go to {stage}"{flag}',
            )
        )
    steps.append(NextStep("then move the alias", f"unmask promote {model} --to {stage}{flag}{judged}"))
    return steps
