"""The decision: one typed value per (model version, stage), computed once, that every surface renders (pure; no I/O).

`decide` judges a version against a stage from what one read of the registry gave it (the version's evidence,
sign-offs, approvals, reached stages and rollouts; the baselines' evidence) and returns a `Decision`:
- every gate verdict (with its interval and what would settle it) and the checklist state;
- each approval and sign-off with its standing (`Standing`: counts, or void and why);
- the version's rollouts to the stage and whether a failed one stands;
- the resulting `Outcome` (`adopt`, `blocked`, `inconclusive`), the blocking reasons in order, and the next
  actions that clear them (`gates.next_steps`);
- the figures an architect reads first (`Figures`: accuracy with its interval, p95 and tokens/s against the AR
  fallback at the same concurrency, with their intervals).

The CLI (`unmask run`, `unmask gates` and its exit code, `next:` lines, `unmask promote`'s refusal), the
dashboard's pages and the dossier render a `Decision` and derive nothing of their own. `to_dict`/`from_dict`
store and read it (`DECISION_SCHEMA` versions the layout).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from checklists import Checklist, ChecklistStatus, ItemStatus, checklist_status, load_checklist
from evals.intervals import wilson_interval
from evals.records import CandidateEvidence, EvalRecord
from gates.checks import serving_at
from gates.evaluate import SIGNED_KINDS, evaluate_gates
from gates.next_steps import NextStep, next_steps
from gates.policy import Policy, StagePolicy
from gates.promotion import (
    PROMOTABLE,
    SETTLED_BY_AN_APPROVER,
    TOOLING_ITEM,
    Approval,
    Duties,
    PromotionReason,
    ReasonKind,
    current_signoffs,
    declined_problems,
    judge_approvals,
    registration_payload,
    request_problem,
    rollout_problems,
    signoff_problem,
    tally_approvals,
)
from gates.readable import significant
from gates.results import GateResult, operating_records
from gates.roles import Roles, load_roles
from gates.rollout_findings import FAILED_ROLLOUT

DECISION_SCHEMA = 1  # the layout of Decision.to_dict(); a stored decision of another schema is not read as this one

# the order blocking reasons are listed in: what no approver or measurement can settle first
BLOCKING_ORDER = (
    ReasonKind.KEYS,
    ReasonKind.EVIDENCE,
    ReasonKind.REQUEST,
    ReasonKind.DECLINED,
    ReasonKind.ROLLOUT,
    ReasonKind.GATE,
    ReasonKind.INCONCLUSIVE,
    ReasonKind.STAGE,
    ReasonKind.CHECKLIST,
    ReasonKind.SIGN_OFF,
    ReasonKind.APPROVAL,
    ReasonKind.DUTY,
    ReasonKind.ROLE,
)


SHORT = {  # a blocking reason's kind in a word or two (`Decision.blocker_labels`)
    ReasonKind.KEYS: "no people's keys",
    ReasonKind.REQUEST: "unsigned request",
    ReasonKind.EVIDENCE: "unverified evidence",
    ReasonKind.DECLINED: "declined",
    ReasonKind.STAGE: "earlier stage first",
    ReasonKind.SIGN_OFF: "stale sign-off",
    ReasonKind.APPROVAL: "approval",
    ReasonKind.DUTY: "four eyes",
    ReasonKind.ROLE: "approver's role",
}


class Outcome(StrEnum):
    """What the decision says about the version at the stage."""

    ADOPT = "adopt"  # it may hold the stage: it holds it and still passes, or everything to move it is in place
    BLOCKED = "blocked"  # something stands: a failed gate or rollout, a decline, or what people must still do
    INCONCLUSIVE = "inconclusive"  # nothing failed, but a gate lacks the evidence to judge (more evidence settles it)


@dataclass(frozen=True)
class Standing:
    """One approval or sign-off recorded for the stage, and whether it counts (and why not)."""

    act: str  # "approval" | "sign-off"
    by: str
    at: str
    what: str  # the approval's id, or the checklist item signed off
    comment: str = ""
    counts: bool = False
    why: str = ""  # why it does not count ("" when it counts)
    run: str = ""  # the audit run of the move that used the approval ("" while it is open)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RolloutOutcome:
    """One rollout of the version to the stage, and whether it stands against the version (a failed last one)."""

    id: str
    status: str  # running | paused | completed | rolled_back | aborted
    route: str = ""
    updated: str = ""
    reason: str = ""
    stands: bool = False

    @property
    def failed(self) -> bool:
        return self.status in FAILED_ROLLOUT

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Figures:
    """What an architect reads first about the version at the stage, against the AR fallback."""

    accuracy: float | None = None
    accuracy_interval: tuple[float, float] | None = None
    n_items: int = 0
    task: str = ""
    fallback: str = ""  # "tiny-ar v1"; "" when no fallback is registered (or the version is the fallback)
    concurrency: int = 1  # requests in flight the ratios compare at (1: solo, timed paired with the fallback)
    p95_ratio: float | None = None  # candidate p95 / fallback p95 (below 1: faster)
    tokens_per_s_ratio: float | None = None  # candidate text tokens/s / fallback's (above 1: faster)
    fallback_accuracy: float | None = None
    p95_interval: tuple[float, float] | None = None  # 95% interval of p95_ratio (paired measurement)
    tokens_per_s_interval: tuple[float, float] | None = None
    paired: bool = False  # the ratios come from a paired, interleaved measurement (evals.paired)
    steady: bool = True  # the paired measurement's rounds agree (evals.paired.is_steady)

    def p95_text(self) -> str:
        """The p95 ratio as every surface shows it: `4.0x faster (3.5-4.6x)`, `at 16 in flight, unpaired`."""
        return ratio_text(self.p95_ratio, True, self.p95_interval) + self._where()

    def tokens_per_s_text(self) -> str:
        return ratio_text(self.tokens_per_s_ratio, False, self.tokens_per_s_interval) + self._where()

    def _where(self) -> str:
        if self.p95_ratio is None and self.tokens_per_s_ratio is None:
            return ""
        if self.concurrency > 1:
            return f" at {self.concurrency} in flight" + ("" if self.paired else ", unpaired")
        if not self.paired:
            return " (unpaired)"
        return "" if self.steady else " (host unsteady)"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Figures:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        for name in ("accuracy_interval", "p95_interval", "tokens_per_s_interval"):
            if known.get(name) is not None:
                known[name] = tuple(known[name])
        return cls(**known)


@dataclass(frozen=True)
class Decision:
    """One version at one stage: what was judged, what stands in the way, and what to do about it."""

    model: str
    version: str
    stage: str
    reasons: tuple[PromotionReason, ...]  # what blocks a move to the stage, in BLOCKING_ORDER (empty: nothing)
    gate_results: tuple[GateResult, ...] = ()
    checklist: ChecklistStatus | None = None
    evidence: dict[str, Any] = field(default_factory=dict)  # what it was judged on (records, policy, approvals)
    approvals: tuple[Standing, ...] = ()
    signoffs: tuple[Standing, ...] = ()
    rollouts: tuple[RolloutOutcome, ...] = ()
    steps: tuple[NextStep, ...] = ()  # the commands that clear `blockers`, first to do first
    figures: Figures = field(default_factory=Figures)
    holds: bool = False  # the version holds the stage alias now
    open_signoffs: tuple[str, ...] = ()  # sign-off gates not passing (they block promotion, never the ranking)
    schema: int = DECISION_SCHEMA

    @property
    def allowed(self) -> bool:
        """Whether the alias may move to this version now: nothing blocks it."""
        return not self.reasons

    @property
    def blockers(self) -> tuple[PromotionReason, ...]:
        """What stands between the version and the stage: every reason, but a holder needs no new approval."""
        if self.holds:
            return tuple(r for r in self.reasons if r.kind not in SETTLED_BY_AN_APPROVER)
        return self.reasons

    @property
    def outcome(self) -> Outcome:
        kinds = {r.kind for r in self.blockers}
        if not kinds:
            return Outcome.ADOPT
        if kinds & {ReasonKind.GATE, ReasonKind.ROLLOUT, ReasonKind.DECLINED}:
            return Outcome.BLOCKED
        return Outcome.INCONCLUSIVE if ReasonKind.INCONCLUSIVE in kinds else Outcome.BLOCKED

    @property
    def gates_passed(self) -> bool:
        """Whether the stage judged at least one gate and every one passed (checklist and approval aside)."""
        return bool(self.gate_results) and all(r.passed for r in self.gate_results)

    @property
    def measured_pass(self) -> bool:
        """Every gate that judges a measurement passes (only sign-offs may be open): ranked on evidence."""
        return bool(self.gate_results) and sum(not r.passed for r in self.gate_results) == len(self.open_signoffs)

    @property
    def ranked_only(self) -> bool:
        """Ranked on evidence (its measured gates pass) while something else keeps it from the stage."""
        return self.measured_pass and self.outcome != Outcome.ADOPT

    @property
    def counted_approvals(self) -> tuple[Standing, ...]:
        return tuple(a for a in self.approvals if a.counts)

    def blocker_texts(self) -> tuple[str, ...]:
        return tuple(r.text for r in self.blockers)

    def blocker_labels(self) -> tuple[str, ...]:
        """The blockers in a few words each, in order, for a table a terminal must fit (`unmask gates` has them in
        full): `rollout default-1 rolled back`, `speedup failed`, `data_validity inconclusive`, `3 checklist items`,
        `approval`."""
        labels: list[str] = []
        for kind in BLOCKING_ORDER:
            mine = [r for r in self.blockers if r.kind == kind]
            if not mine:
                continue
            if kind in (ReasonKind.GATE, ReasonKind.INCONCLUSIVE):
                word = "failed" if kind == ReasonKind.GATE else "inconclusive"
                labels += [f"{r.gate} {word}" for r in mine]
            elif kind == ReasonKind.ROLLOUT:
                labels += [f"rollout {r.id} {r.status.replace('_', ' ')}" for r in self.rollouts if r.stands] or [
                    "failed rollout"
                ]
            elif kind == ReasonKind.CHECKLIST:
                labels.append(f"{len(mine)} checklist item{'' if len(mine) == 1 else 's'}")
            else:
                labels.append(SHORT[kind])
        return tuple(dict.fromkeys(labels))

    def headline(self) -> str:
        """The decision in one line: `tiny-llada v1 -> staging: blocked (2 reasons)`."""
        n = len(self.blockers)
        why = f" ({n} reason{'' if n == 1 else 's'})" if n else (" (holds it)" if self.holds else "")
        return f"{self.model} v{self.version} -> {self.stage}: {self.outcome.value}{why}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "model": self.model,
            "version": self.version,
            "stage": self.stage,
            "outcome": self.outcome.value,
            "holds": self.holds,
            "reasons": [{"kind": r.kind.value, "text": r.text, "gate": r.gate} for r in self.reasons],
            "blockers": list(self.blocker_texts()),
            "gates": [r.to_dict() for r in self.gate_results],
            "checklist": self.checklist.to_dicts() if self.checklist else None,
            "approvals": [a.to_dict() for a in self.approvals],
            "signoffs": [s.to_dict() for s in self.signoffs],
            "rollouts": [r.to_dict() for r in self.rollouts],
            "steps": [{"why": s.why, "command": s.command} for s in self.steps],
            "figures": self.figures.to_dict(),
            "open_signoffs": list(self.open_signoffs),
            "evidence": self.evidence,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        """A stored decision; one of another schema is refused (ValueError), never misread."""
        if data.get("schema") != DECISION_SCHEMA:
            raise ValueError(f"a decision of schema {data.get('schema')!r}; this unmask reads {DECISION_SCHEMA}")
        checklist = data.get("checklist")
        return cls(
            str(data["model"]),
            str(data["version"]),
            str(data["stage"]),
            tuple(PromotionReason(ReasonKind(r["kind"]), r["text"], r.get("gate", "")) for r in data["reasons"]),
            tuple(GateResult.from_dict(r) for r in data.get("gates", [])),
            _checklist_from_dicts(str(data["stage"]), checklist) if checklist is not None else None,
            dict(data.get("evidence") or {}),
            tuple(Standing(**a) for a in data.get("approvals", [])),
            tuple(Standing(**s) for s in data.get("signoffs", [])),
            tuple(RolloutOutcome(**r) for r in data.get("rollouts", [])),
            tuple(NextStep(s["why"], s["command"]) for s in data.get("steps", [])),
            Figures.from_dict(data.get("figures") or {}),
            bool(data.get("holds")),
            tuple(data.get("open_signoffs", [])),
        )


def _checklist_from_dicts(stage: str, items: Sequence[Mapping[str, Any]]) -> ChecklistStatus:
    return ChecklistStatus(
        stage,
        tuple(
            ItemStatus(i["item"], i["text"], i["kind"], bool(i["done"]), i["reason"], dict(i.get("evidence") or {}))
            for i in items
        ),
    )


UNVERIFIED = "unverified"  # the evidence status of a version whose evidence carries no hash (registry.integrity)


def unverified_text(model: str, version: str) -> str:
    return (
        f"the evidence of {model} v{version} is unverified: its run carries no sha256 or signature tags (registered "
        "before they were recorded, or stripped of them), so nothing vouches for what the gates read; nothing moves "
        "on it until it is measured again"
    )


def _evidence_reasons(model: str, version: str, stage: str, context: Context, roles: Roles) -> list[PromotionReason]:
    """Why nothing vouches for the evidence: no hashes at all, or (where only signed acts count: `Roles.signs`) no
    signature by its registrant's listed key over what was registered."""
    found = [unverified_text(model, version)] if context.evidence_status == UNVERIFIED else []
    if roles.signs(stage) and not roles.signed:  # one reason says it for the evidence and every act (`_keys_reasons`)
        return [PromotionReason(ReasonKind.EVIDENCE, text) for text in found]
    found.append(_registration_problem(model, version, stage, roles, context.registration))
    return [PromotionReason(ReasonKind.EVIDENCE, text) for text in found if text]


def _keys_reasons(stage: str, roles: Roles) -> list[PromotionReason]:
    """The one reason a stage that counts only signed acts blocks while the roles file lists no keys: nothing
    anyone records there counts (their sign-offs and approvals also say so, each in a line of its own)."""
    if not roles.signs(stage) or roles.signed:
        return []
    text = (
        f"{stage} counts only acts signed by a person's key the roles file lists, and {roles.path or roles.source} "
        "lists none: no evidence, sign-off or approval counts there until it does (each person runs `unmask keys "
        "init --name NAME` and their public line goes under `keys:` in the roles file; docs/governance.md)"
    )
    return [PromotionReason(ReasonKind.KEYS, text)]


def _registration_problem(
    model: str, version: str, stage: str, roles: Roles, registration: Mapping[str, Any] | None
) -> str:
    """Why the evidence's registration does not count as signed by its registrant ("" when it does, or when `stage`
    counts unsigned acts, or nothing was said about it)."""
    if registration is None or not roles.signs(stage):
        return ""
    by, at = str(registration.get("by", "")), str(registration.get("at", ""))
    payload = registration_payload(model, str(registration.get("run", "")), registration.get("sha256") or {}, by, at)
    what = f"the evidence of {model} v{version}, registered by {by or '?'} at {at or '?'},"
    problem = roles.signature_problem(
        what, by, payload, str(registration.get("key", "")), str(registration.get("signature", "")), at, stage
    )
    vouch = f"unmask migrate {model} --version {version}"
    return (
        f"{problem}; measure it again as someone the roles file lists a key for, or vouch for it ({vouch})"
        if problem
        else ""
    )


@dataclass(frozen=True)
class Context:
    """Who the version is, besides its evidence: what one read of the registry says about it."""

    model: str = ""
    version: str = ""
    holds: bool = False  # it holds the stage alias now
    name_version: bool = False  # commands must say --version (it is not the version they default to)
    policy_path: str | None = None  # the policy file commands must name to judge alike (None: the bundled one)
    fallback_version: str = ""  # the version holding `fallback` ("" when none does)
    evidence_status: str = ""  # registry.integrity: verified, or unverified (no hashes: nothing is passed on it)
    registration: Mapping[str, Any] | None = None  # who registered the evidence, signed how: {by, at, key, signature,
    # run, sha256 {artifact: hex}} (registry.judging); where the roles list keys, a listed key must have signed it


def decide(
    evidence: CandidateEvidence,
    policy: Policy,
    stage: str,
    baseline: Mapping[str, CandidateEvidence | None],
    signoffs: Mapping[str, Mapping[str, Any]],
    approval: Approval | Sequence[Approval] | None,
    reached: set[str],
    checklist: Checklist | None = None,
    evaluated_at: str = "",
    roles: Roles | None = None,
    duties: Duties | None = None,
    context: Context | None = None,
) -> Decision:
    """The one judgement of a version at `stage`; `reached` holds the stages the version held before.

    `signoffs` and `approval` (one, or every approval recorded for the stage) are all that were recorded;
    those older than `evaluated_at` (when the version's evidence was last registered) do not count, and
    each says so. `roles` and `duties` apply the separation-of-duties rules (default roles: the bundled file).
    """
    context = context or Context(model=evidence.candidate)
    model, version = context.model or evidence.candidate, context.version
    if stage not in PROMOTABLE:
        why = f"unknown stage {stage!r}; promotions go to {', '.join(PROMOTABLE)}"
        return Decision(model, version, stage, (PromotionReason(ReasonKind.STAGE, why),))
    stage_policy = policy.stage(stage)
    roles = roles or load_roles()
    current, stale_signoffs = current_signoffs(signoffs, evaluated_at, roles, (model, version, stage))
    results = evaluate_gates(evidence, policy, stage, baseline, current)
    status = checklist_status(checklist or load_checklist(stage), results, evidence.records, current)
    reasons = _measured_reasons(results, status, stage_policy, reached)
    reasons += _keys_reasons(stage, roles) + _evidence_reasons(model, version, stage, context, roles)
    duties = duties or Duties()
    reasons += declined_problems(duties.declined, stage, evaluated_at, roles)
    unsigned = request_problem(duties.request, model, version, roles)
    reasons += [PromotionReason(ReasonKind.REQUEST, unsigned)] if unsigned else []
    reasons += rollout_problems(evidence.canary, stage, evaluated_at)
    approvals, approval_reasons, counted = _approvals(
        approval, stage, stage_policy, evaluated_at, roles, duties, current, context.holds
    )
    reasons += approval_reasons + stale_signoffs
    reasons.sort(key=lambda r: BLOCKING_ORDER.index(r.kind))
    kinds = {g.name: g.kind for g in stage_policy.gates}
    cited = {
        "gates": {r.gate: r.evidence.get("record_id") for r in results},
        "run_ids": sorted({r.run_id for r in evidence.records if r.run_id}),
        "policy": policy.cited(),
        "roles": roles.cited(),
        "thresholds": {r.gate: r.threshold for r in results},
        "approvals": [a.to_dict() for a in counted],
    }
    decision = Decision(
        model,
        version,
        stage,
        tuple(reasons),
        tuple(results),
        status,
        cited,
        approvals,
        _signoff_standings(signoffs, evaluated_at, roles, (model, version, stage)),
        _rollouts(evidence.canary, stage, evaluated_at),
        figures=figures(evidence, stage_policy, results, _fallback(baseline, model), context.fallback_version),
        holds=context.holds,
        open_signoffs=tuple(r.gate for r in results if not r.passed and kinds.get(r.gate) in SIGNED_KINDS),
    )
    if decision.outcome == Outcome.ADOPT and decision.holds:
        return decision
    steps = next_steps(
        model,
        version,
        stage,
        decision.blockers,
        results,
        status,
        stage_policy,
        name_version=context.name_version,
        policy_path=context.policy_path,
    )
    return Decision(**{**decision.__dict__, "steps": tuple(steps)})


def _measured_reasons(
    results: Sequence[GateResult], status: ChecklistStatus, stage_policy: StagePolicy, reached: set[str]
) -> list[PromotionReason]:
    """What the evidence and the stage order stand in the way with: failed and inconclusive gates, open checklist
    items, an earlier stage not reached yet."""
    reasons = [
        PromotionReason(ReasonKind.GATE, f"gate {r.gate} failed: {r.reason}", r.gate)
        for r in results
        if not r.passed and not r.inconclusive
    ]
    reasons += [
        PromotionReason(ReasonKind.INCONCLUSIVE, f"gate {r.gate} is inconclusive: {r.reason}", r.gate)
        for r in results
        if r.inconclusive
    ]
    reasons += [PromotionReason(ReasonKind.CHECKLIST, text) for text in status.missing()]
    required = stage_policy.requires_stage
    if required and required not in reached:
        why = f"stage {stage_policy.stage} requires the version to have reached {required} first"
        reasons.append(PromotionReason(ReasonKind.STAGE, why))
    return reasons


def _approvals(
    approval: Approval | Sequence[Approval] | None,
    stage: str,
    stage_policy: StagePolicy,
    evaluated_at: str,
    roles: Roles,
    duties: Duties,
    signoffs: Mapping[str, Mapping[str, Any]],
    holds: bool = False,
) -> tuple[tuple[Standing, ...], list[PromotionReason], list[Approval]]:
    """Each approval's standing, why the approvals do not allow the move, and the ones that count. For a version
    holding the stage, the approvals the move that put it there used up count (those of its newest request)."""
    recorded = [approval] if isinstance(approval, Approval) else list(approval or ())
    tooling = str(signoffs.get(TOOLING_ITEM, {}).get("by", ""))
    rules = roles.stage(stage)
    args = (stage, stage_policy.approval_min_comment_chars, evaluated_at, rules, duties, tooling, roles)
    each = judge_approvals([a for a in recorded if a.by.strip()], *args)
    problems, counted = tally_approvals(each, stage, rules.approvals_count)
    judged = {a.id or a.at: problem for a, problem in each}
    used = {a.id or a.at for a in counted}
    if holds:  # what counts is what moved it there; an approval given since moves nothing
        moved = [a for a in recorded if a.status == "consumed"]
        last = max((a.at, a.request) for a in moved)[1] if moved else None
        used = {a.id or a.at for a in moved if a.request == last}
    standings = []
    for a in recorded:
        key = a.id or a.at
        problem = judged.get(key)
        if key in used:
            why = ""
        elif holds and a.status == "open":
            why = f"the version already holds {stage}: this approval moves nothing"
        elif problem:
            why = problem.text
        else:
            why = f"not needed: {len(counted)} approvals count"
        standings.append(Standing("approval", a.by, a.at, a.id, a.comment, key in used, why, a.closed_by))
    return tuple(standings), problems, counted


def _signoff_standings(
    signoffs: Mapping[str, Mapping[str, Any]], evaluated_at: str, roles: Roles, subject: tuple[str, str, str]
) -> tuple[Standing, ...]:
    out = []
    for item, s in sorted(signoffs.items()):
        why = signoff_problem(item, s, evaluated_at, roles, subject) or ""
        out.append(
            Standing(
                "sign-off", str(s.get("by", "")), str(s.get("at", "")), item, str(s.get("comment", "")), not why, why
            )
        )
    return tuple(out)


def _rollouts(canary: Sequence[Mapping[str, Any]], stage: str, evaluated_at: str) -> tuple[RolloutOutcome, ...]:
    mine = [r for r in canary if r.get("stage", stage) == stage]
    standing = bool(rollout_problems(canary, stage, evaluated_at))
    return tuple(
        RolloutOutcome(
            str(r.get("id", "")),
            str(r.get("status", "")),
            str(r.get("route", "")),
            str(r.get("updated", "")),
            str(r.get("reason", "")),
            standing and i == len(mine) - 1,
        )
        for i, r in enumerate(mine)
    )


def _fallback(baseline: Mapping[str, CandidateEvidence | None], model: str) -> CandidateEvidence | None:
    fallback = baseline.get("fallback")
    return fallback if fallback is not None and fallback.candidate != model else None


def _primary(evidence: CandidateEvidence | None, stage: StagePolicy) -> EvalRecord | None:
    return next((r for r in operating_records(evidence, stage) if r.task == stage.operating_point.task), None)


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def figures(
    evidence: CandidateEvidence,
    stage: StagePolicy,
    results: Sequence[GateResult],
    fallback: CandidateEvidence | None = None,
    fallback_version: str = "",
) -> Figures:
    """Accuracy with its 95% Wilson interval at the stage's operating point; p95 latency and text tokens/s as ratios
    to the AR fallback at the same concurrency (the serving gate's, where both have a load test there, else the
    paired solo measurement), with their intervals."""
    primary, theirs = _primary(evidence, stage), _primary(fallback, stage)
    interval = wilson_interval(primary.accuracy, primary.n_items) if primary else None
    concurrency, p95, tps, p95_ci, tps_ci, paired, steady = 1, None, None, None, None, False, True
    op = stage.operating_point
    speed = evidence.speed_against(fallback, op.task, op.gen_length, primary.config_hash) if primary else None
    if speed is not None and theirs is not None and speed.baseline_config_hash == theirs.config_hash:
        p95_est, tps_est = speed.ratio("p95"), speed.ratio("tokens_per_s")
        p95, p95_ci = (p95_est.estimate, (p95_est.low, p95_est.high)) if p95_est else (None, None)
        tps, tps_ci = (tps_est.estimate, (tps_est.low, tps_est.high)) if tps_est else (None, None)
        paired, steady = True, speed.steady
    load = next((g.params["concurrency"] for g in stage.gates if g.kind == "serving"), None)
    served = serving_at(evidence, load) if load else None
    served_theirs = serving_at(fallback, load, served.paired_run) if load and served else None
    if load and served and served_theirs:  # one paired load test of both (tokens/s with its interval), or two
        concurrency, p95_ci, steady = load, None, True
        p95 = _ratio(served.latency_p95_s, served_theirs.latency_p95_s)
        paired_p95 = served.latency_against(served_theirs, 95)
        if paired_p95 is not None:  # records that keep their requests: the same p95, with its interval over rounds
            p95, p95_ci = paired_p95.estimate, (paired_p95.low, paired_p95.high)
        paired_tps = served.tokens_per_s_against(served_theirs)
        paired = paired_tps is not None
        tps_ci = (paired_tps.low, paired_tps.high) if paired_tps else None
        tps = paired_tps.estimate if paired_tps else _ratio(served.tokens_per_s, served_theirs.tokens_per_s)
    return Figures(
        primary.accuracy if primary else None,
        interval,
        primary.n_items if primary else 0,
        op.task,
        f"{fallback.candidate} v{fallback_version}" if fallback else "",
        concurrency,
        p95,
        tps,
        theirs.accuracy if theirs else None,
        p95_ci,
        tps_ci,
        paired,
        steady,
    )


def ratio_text(ratio: float | None, faster_below_one: bool, interval: tuple[float, float] | None = None) -> str:
    """A ratio to the fallback as read, with its 95% interval when it has one: a latency ratio (below 1:
    faster) as `4.02x faster (3.51-4.60x)`, any other as `2.10x (1.80-2.40x)`, three significant digits (an
    edge near a bound of 1 stays legible); "—" when one side was not measured."""
    if ratio is None:
        return "—"
    if ratio <= 0 or not faster_below_one:
        return f"{significant(ratio)}x" + (
            f" ({significant(interval[0])}–{significant(interval[1])}x)" if interval else ""
        )
    faster = ratio <= 1
    shown = 1 / ratio if faster else ratio
    text = f"{significant(shown)}x {'faster' if faster else 'slower'}"
    if interval:
        low, high = (1 / interval[1], 1 / interval[0]) if faster else interval
        text += f" ({significant(low)}–{significant(high)}x)"
    return text
