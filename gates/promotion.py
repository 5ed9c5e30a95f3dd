"""Promotion rules: may this version's alias move to this stage? A pure decision with every reason.

A promotion needs (DESIGN.md): every gate of the target stage passed on validated records of the
version, the stage's checklist complete, and an approval recorded; and, per policy, the version
must have reached the stage before (`requires_stage`). An approval or sign-off vouches for the
evidence its author saw, so one given before the latest evaluation no longer counts.

Each reason says what kind of problem it is (`ReasonKind`), so callers decide by kind, never by
wording: an approver can settle `approval`, `separation of duties` and `role` reasons (a different
approver can), nothing else.

Separation of duties (roles in `gates/roles.yaml`): an approval counts only when its author holds the
stage's approve role, is not the one who requested the promotion (unless the stage allows
self-approval), and, for staging and production, neither registered the version's evidence nor signed
off its tooling-maturity item; a stage needing N approvals needs N different people. A person is the
authenticated MLflow user where a server checked the password behind the name, else the OS account that
acted (`person`): names typed by one OS account are one person, so they never satisfy four eyes. An approval is
for one promotion request, is used up by the move it allows, and expires after the stage's TTL. A
decline is terminal for the version and stage until new evidence is registered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal, overload

from checklists import STAGES, Checklist, ChecklistError, load_checklist
from evals.records import EvalRecord
from gates.policy import Policy
from gates.roles import FOUR_EYES_STAGES, Roles, StageRoles, load_roles
from gates.rollout_findings import failed_rollout, finding_text
from gates.signatures import SIGNED

PROMOTABLE = STAGES  # aliases a promotion may move; `candidate` and `fallback` are set on registration


class ReasonKind(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() of its members
    """What stands in the way of a promotion."""

    REQUEST = "request"  # the open request is not signed by its requester where the stage counts only signed acts
    KEYS = "keys"  # the stage counts only signed acts (gates.roles.SIGNED_STAGES) and the roles file lists no keys
    EVIDENCE = (
        "evidence"  # nothing vouches for the evidence: no sha256 or signature tags (registered before, or stripped)
    )
    GATE = "gate"  # a gate of the stage failed
    INCONCLUSIVE = "inconclusive"  # a gate lacks the evidence to judge (GateResult.settle says what would settle it)
    CHECKLIST = "checklist"  # an item of the stage's checklist is not done
    STAGE = "stage"  # an unknown stage, or one the version may not reach yet (requires_stage)
    APPROVAL = "approval"  # no approval, one too short, or one given before the latest evaluation
    SIGN_OFF = "sign-off"  # a sign-off given before the latest evaluation
    DUTY = "separation of duties"  # the approver requested, registered the evidence, signed tooling, or approved twice
    ROLE = "role"  # the approver does not hold the stage's approve role
    DECLINED = "declined"  # the version was declined for the stage; terminal until new evidence is registered
    ROLLOUT = "rollout"  # its last rollout to the stage was rolled back or aborted (gates/rollout_findings.py)


SETTLED_BY_AN_APPROVER = (ReasonKind.APPROVAL, ReasonKind.DUTY, ReasonKind.ROLE)
AUTHENTICATED = "mlflow-basic-auth"  # the identity source of a name a tracking server authenticated (registry.identity)
TOOLING_ITEM = "tooling-maturity"
EVIDENCE_ARTIFACTS = ("evidence/evidence.json", "evidence/records.json", "evidence/model_card.md")  # hashed, signed


def person(name: str, identity: str = "", account: str = "") -> str:
    """Who someone is for the four-eyes rules: the name a listed key signed for or a server authenticated, else the
    OS account that acted
    (`os:<account>`: whatever names it types, one account is one person); the name in data recorded without one."""
    return name if identity in (AUTHENTICATED, SIGNED) or not account else f"os:{account}"


def signed_payload(act: str, **fields: str) -> dict[str, str]:
    """The payload a person signs for `act` (approval, sign-off, request): the act's name and its fields."""
    return {"act": act} | {k: str(v) for k, v in fields.items()}


def move_payload(stage: str, from_ref: str, to_ref: str, by: str, at: str, comment: str) -> dict[str, str]:
    """What the mover of a stage alias signs: which stage, from which holder to which ("model@version"; "" for
    nobody), who, when and why."""
    return signed_payload("move", stage=stage, previous=from_ref, to=to_ref, by=by, at=at, comment=comment)


def registration_payload(model: str, run_id: str, digests: Mapping[str, str], by: str, at: str) -> dict[str, str]:
    """What the registrant of a version's evidence signs: the model, the evidence run, the sha256 of each evidence
    artifact (`EVIDENCE_ARTIFACTS`), who and when (the version's `evaluated_at`)."""
    kept = {path: str(digests.get(path, "")) for path in EVIDENCE_ARTIFACTS}
    return signed_payload("evidence", model=model, run=run_id, sha256=json.dumps(kept, sort_keys=True), by=by, at=at)


def gate_report_payload(
    model: str, version: str, stage: str, sha256: str, outcome: str, by: str, at: str
) -> dict[str, str]:
    """What whoever judged a stage signs as its report is stored: the version and stage, the report's sha256 (the
    gates, the checklist and the decision are in it), the decision's outcome, who and when."""
    return signed_payload(
        "gate_report", model=model, version=version, stage=stage, sha256=sha256, outcome=outcome, by=by, at=at
    )


def one_account(stage: str, by: str, account: str, already: str) -> str:
    """The refusal of a second role taken by one OS account where `stage` needs distinct people."""
    return (
        f"{stage} needs distinct people, and {by} is OS account {account!r}, which already {already}: without "
        "an authenticated server one OS account is one person, so four eyes need `mlflow server --app-name "
        "basic-auth` (docs/governance.md)"
    )


@dataclass(frozen=True)
class PromotionReason:
    """One reason a promotion may not happen: its kind, and the sentence users read."""

    kind: ReasonKind
    text: str
    gate: str = ""  # the gate it is about (gate and inconclusive reasons), so callers never match the text

    def __str__(self) -> str:
        return self.text

    @property
    def blocking(self) -> bool:
        """Whether it stands whatever an approver does (every kind but the approval, duty and role kinds)."""
        return self.kind not in SETTLED_BY_AN_APPROVER


@dataclass(frozen=True)
class Approval:
    """Who approved a promotion to a stage, when, and why; for which request, and whether it is still open."""

    stage: str
    by: str
    at: str
    comment: str
    id: str = ""
    request: str = ""  # the promotion request it answers ("" in data from before requests)
    host: str = ""
    identity: str = ""  # how the name was known (registry.identity: os-user, mlflow-basic-auth, ...)
    status: str = "open"  # open | consumed (by a move) | expired | void (typed into a refused promote)
    closed_by: str = ""  # the audit run that closed it (the move that consumed it)
    account: str = ""  # the OS account that gave it ("" in data from before it was recorded)
    closed_why: str = ""  # why it was closed ("rollout default-1 was rolled_back: ..."; "" while open, or older data)
    model: str = ""  # where it is stored (registry.state fills both in from the version it reads, never from the tag)
    version: str = ""
    key: str = ""  # the fingerprint of the key that signed it ("" unsigned)
    signature: str = ""  # base64 Ed25519 signature over `payload()`
    head: str = ""  # the audit chain head it followed ("seq:sha256")

    @property
    def person(self) -> str:
        return person(self.by, self.identity, self.account)

    def payload(self) -> dict[str, str]:
        """What its signature covers (gates.signatures.canonical): what was approved, by whom, when, why."""
        return signed_payload(
            "approval",
            model=self.model,
            version=self.version,
            stage=self.stage,
            request=self.request,
            id=self.id,
            by=self.by,
            at=self.at,
            comment=self.comment,
            head=self.head,
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "stage": self.stage,
            "by": self.by,
            "at": self.at,
            "comment": self.comment,
            "id": self.id,
            "request": self.request,
            "host": self.host,
            "identity": self.identity,
            "status": self.status,
            "closed_by": self.closed_by,
            "account": self.account,
            "closed_why": self.closed_why,
            "key": self.key,
            "signature": self.signature,
            "head": self.head,
        }


@dataclass(frozen=True)
class PromotionRequest:
    """A request to move one version to one stage: who asked, when, on which evidence."""

    id: str
    stage: str
    by: str  # the requester ("" until someone runs the promotion an approval was given for)
    at: str
    evaluated_at: str  # the evidence it was asked on
    host: str = ""
    status: str = "open"  # open | done (moved) | declined
    account: str = ""  # the OS account of the requester
    identity: str = ""  # how the requester's name was known
    key: str = ""  # the fingerprint of the requester's key that signed `payload()` ("" unsigned)
    signature: str = ""
    closed_by: str = ""  # done: the audit run of the move that did it
    consumed: str = ""  # done: the ids of the approvals that move used, comma-separated (each reads as consumed)

    @property
    def person(self) -> str:
        return person(self.by, self.identity, self.account) if self.by else ""

    def payload(self, model: str, version: str) -> dict[str, str]:
        """What the requester signs: which version to which stage, the request, who, when, on which evidence."""
        fields = {"id": self.id, "by": self.by, "at": self.at, "evaluated_at": self.evaluated_at}
        return signed_payload("request", model=model, version=version, stage=self.stage, **fields)

    def to_dict(self) -> dict[str, str]:
        return {
            "id": self.id,
            "stage": self.stage,
            "by": self.by,
            "at": self.at,
            "evaluated_at": self.evaluated_at,
            "host": self.host,
            "status": self.status,
            "account": self.account,
            "identity": self.identity,
            "key": self.key,
            "signature": self.signature,
        } | ({"closed_by": self.closed_by, "consumed": self.consumed} if self.closed_by else {})


def request_problem(request: PromotionRequest | None, model: str, version: str, roles: Roles | None) -> str | None:
    """Why a promotion request is not its requester's (None when it is, when nobody has claimed it yet, where its
    stage counts unsigned acts, or where the roles list no keys, which the decision says once). Where only signed
    acts count, a request whose requester is a typed or rewritten name would let that requester approve their own
    promotion."""
    if request is None or not request.by or roles is None or not roles.signed:  # no keys: `ReasonKind.KEYS` says it
        return None
    what = f"the request {request.id} of {request.stage} by {request.by} at {request.at}"
    problem = roles.signature_problem(
        what, request.by, request.payload(model, version), request.key, request.signature, request.at, request.stage
    )
    return f"{problem}; the next `unmask promote` opens a new request" if problem else None


@dataclass(frozen=True)
class Decline:
    """A decision not to promote a version to a stage (`unmask reject`), signed by its decider where the roles list
    keys (`key`: the fingerprint; `signature` over `payload()`)."""

    stage: str
    by: str
    at: str
    comment: str
    host: str = ""
    key: str = ""
    signature: str = ""
    # what it declines, filled from where it is stored (registry.state), never from the stored value
    model: str = ""
    version: str = ""

    def payload(self) -> dict[str, str]:
        """What its signature covers: which version for which stage, by whom, when, why."""
        return signed_payload(
            "decline",
            model=self.model,
            version=self.version,
            stage=self.stage,
            by=self.by,
            at=self.at,
            comment=self.comment,
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "stage": self.stage,
            "by": self.by,
            "at": self.at,
            "comment": self.comment,
            "host": self.host,
            "key": self.key,
            "signature": self.signature,
        }


@dataclass(frozen=True)
class Duties:
    """Who did what for the version, as the four-eyes rules read it."""

    requester: str = ""  # of the promotion request
    mover: str = ""  # who runs the promotion now (also a requester)
    registered_by: str = ""  # who registered the version's current evidence
    # the same three as persons (`person`: the authenticated user, else the OS account); "" where unknown
    requester_person: str = ""
    mover_person: str = ""
    registered_person: str = ""
    request_id: str = ""  # the request approvals must answer ("" = any)
    request: PromotionRequest | None = None  # that request, whose signature says it is its requester's
    declined: Decline | None = None
    now: str = ""  # ISO time the decision is made at (expiry); "" skips expiry


def check_checklist_against_policy(checklist: Checklist, policy: Policy) -> list[str]:
    """What a checklist names that cannot exist: a gate the stage's policy does not have, a record field an
    eval record does not have (either item could never be done)."""
    names = {g.name for g in policy.stage(checklist.stage).gates}
    fields = {f.name for f in dataclass_fields(EvalRecord)}
    problems = []
    for item in checklist.items:
        where = f"{checklist.source}: item {item.id!r}.evidence"
        problems += [
            f"{where}.gate: {g!r} is not a gate of stage {checklist.stage!r} in {policy.source}; gates: "
            f"{', '.join(sorted(names))}"
            for g in item.evidence.gates
            if g not in names
        ]
        if item.evidence.record_field and item.evidence.record_field not in fields:
            problems.append(f"{where}.record_field: {item.evidence.record_field!r} is not an eval record field")
    return problems


def require_checklists_match(policy: Policy, stages: Sequence[str] = STAGES) -> None:
    """Refuse (ChecklistError, the first problem) a stage checklist naming a gate or field that does not exist."""
    for stage in stages:
        problems = check_checklist_against_policy(load_checklist(stage), policy)
        if problems:
            raise ChecklistError(problems[0])


def decline_problem(declined: Decline, roles: Roles | None) -> str | None:
    """Why a recorded decline is no decision (None when it is one): where `roles` list keys, one not signed by a
    key listed for its decider (a forged decline tag would otherwise block any version)."""
    if roles is None:
        return None
    what = f"the decline of {declined.stage} by {declined.by} at {declined.at}"
    return roles.signature_problem(
        what, declined.by, declined.payload(), declined.key, declined.signature, declined.at, declined.stage
    )


def declined_problems(
    declined: Decline | None, stage: str, evaluated_at: str, roles: Roles | None = None
) -> list[PromotionReason]:
    """A decline given on the current evidence stands; one older than the latest evaluation no longer does, nor
    one whose signature does not verify where `roles` list keys (`decline_problem`)."""
    if declined is None or declined.stage != stage or predates(declined.at, evaluated_at):
        return []
    if decline_problem(declined, roles) is not None:
        return []
    return [
        PromotionReason(
            ReasonKind.DECLINED,
            (
                f"{declined.by} declined {stage} at {declined.at} ({declined.comment}); a decline is final until new "
                "evidence is registered"
            ),
        )
    ]


def rollout_problems(canary: Sequence[Mapping[str, Any]], stage: str, evaluated_at: str) -> list[PromotionReason]:
    """A rolled-back or aborted last rollout to `stage` stands, unless evidence was registered after it ended."""
    failed = failed_rollout(canary, stage)
    if failed is None or (evaluated_at and predates(failed.get("updated"), evaluated_at)):
        return []
    return [PromotionReason(ReasonKind.ROLLOUT, finding_text(failed, stage))]


def predates(at: str | None, evaluated_at: str) -> bool:
    """Whether an approval or sign-off made at `at` came before the latest evaluation (so no longer counts)."""
    return str(at or "") < evaluated_at


def signoff_payload(model: str, version: str, stage: str, item: str, signoff: Mapping[str, Any]) -> dict[str, str]:
    """What a sign-off's signature covers: the item of which version at which stage, who, when, what was said."""
    fields = {k: str(signoff.get(k, "")) for k in ("by", "at", "comment", "head")}
    return signed_payload("signoff", model=model, version=version, stage=stage, item=item, **fields)


def signoff_problem(
    item: str,
    signoff: Mapping[str, Any],
    evaluated_at: str,
    roles: Roles | None = None,
    subject: tuple[str, str, str] = ("", "", ""),
) -> str | None:
    """Why a sign-off of `item` does not count (None when it does): older than the latest evaluation, or (where
    `roles` list keys) not signed by a key listed for its signer. `subject`: (model, version, stage)."""
    by, at = str(signoff.get("by", "?")), str(signoff.get("at", "?"))
    if predates(signoff.get("at"), evaluated_at):
        return (
            f"the sign-off of {item!r} by {by} at {at} predates the latest evaluation ({evaluated_at}); "
            "sign it off again"
        )
    if roles is None:
        return None
    return roles.signature_problem(
        f"the sign-off of {item!r} by {by} at {at}",
        by,
        signoff_payload(*subject, item, signoff),
        str(signoff.get("key", "")),
        str(signoff.get("signature", "")),
        at,
        subject[2],
    )


def current_signoffs(
    signoffs: Mapping[str, Mapping[str, Any]],
    evaluated_at: str,
    roles: Roles | None = None,
    subject: tuple[str, str, str] = ("", "", ""),
) -> tuple[dict[str, Mapping[str, Any]], list[PromotionReason]]:
    """The sign-offs that count (`signoff_problem`), and why each other one does not."""
    current, stale = {}, []
    for item, signoff in signoffs.items():
        problem = signoff_problem(item, signoff, evaluated_at, roles, subject)
        if problem is None:
            current[item] = signoff
        else:
            stale.append(PromotionReason(ReasonKind.SIGN_OFF, problem))
    return current, stale


@overload
def approval_problems(
    approval: Approval | Sequence[Approval] | None,
    stage: str,
    min_comment_chars: int,
    evaluated_at: str = "",
    stage_roles: StageRoles | None = None,
    duties: Duties | None = None,
    tooling_signer: str = "",
    roles: Roles | None = None,
    counted: Literal[False] = False,
    prefer: str = "",
) -> list[PromotionReason]: ...


@overload
def approval_problems(
    approval: Approval | Sequence[Approval] | None,
    stage: str,
    min_comment_chars: int,
    evaluated_at: str = "",
    stage_roles: StageRoles | None = None,
    duties: Duties | None = None,
    tooling_signer: str = "",
    roles: Roles | None = None,
    *,
    counted: Literal[True],
    prefer: str = "",
) -> tuple[list[PromotionReason], list[Approval]]: ...


def approval_problems(
    approval: Approval | Sequence[Approval] | None,
    stage: str,
    min_comment_chars: int,
    evaluated_at: str = "",
    stage_roles: StageRoles | None = None,
    duties: Duties | None = None,
    tooling_signer: str = "",
    roles: Roles | None = None,
    counted: bool = False,
    prefer: str = "",
) -> list[PromotionReason] | tuple[list[PromotionReason], list[Approval]]:
    """Why the recorded approvals do not allow the promotion (empty when they do).

    With `counted`, returns (reasons, the approvals that count: the oldest, approval `prefer` first) instead.
    """
    roles = roles or load_roles()
    stage_roles = stage_roles or roles.stage(stage)
    duties = duties or Duties()
    approvals = [approval] if isinstance(approval, Approval) else list(approval or ())
    # the preferred approval first (stable otherwise): of two names on one account only one counts, and the one
    # typed into this promotion is the one it uses, whoever of the two approved first
    approvals = sorted((a for a in approvals if a.by.strip()), key=lambda a: bool(prefer) and a.id != prefer)
    judged = judge_approvals(
        approvals, stage, min_comment_chars, evaluated_at, stage_roles, duties, tooling_signer, roles
    )
    reasons, chosen = tally_approvals(judged, stage, stage_roles.approvals_count, prefer)
    return (reasons, chosen) if counted else reasons


def tally_approvals(
    judged: Sequence[tuple[Approval, PromotionReason | None]], stage: str, need: int, prefer: str = ""
) -> tuple[list[PromotionReason], list[Approval]]:
    """From each approval and its problem (`judge_approvals`): why they do not allow the move (empty when they
    do), and the `need` approvals that count (the oldest, approval `prefer` first; none when too few count)."""
    reasons = [problem for _, problem in judged if problem is not None]
    valid = [a for a, problem in judged if problem is None]
    if len(valid) >= need:
        return [], sorted(valid, key=lambda a: (a.id != prefer, a.at))[:need]
    if not judged:
        reasons = [
            PromotionReason(
                ReasonKind.APPROVAL, f"no approval recorded for {stage}: an approver must sign off the promotion"
            )
        ]
    elif valid or need > 1:
        have = f"approved so far by {', '.join(a.by for a in valid)}" if valid else "no approval counts yet"
        reasons.append(
            PromotionReason(
                ReasonKind.APPROVAL, (f"{stage} needs {need} approvals from {need} different people; {have}")
            )
        )
    return reasons, []


def judge_approvals(
    approvals: Sequence[Approval],
    stage: str,
    min_comment_chars: int,
    evaluated_at: str,
    stage_roles: StageRoles,
    duties: Duties,
    tooling_signer: str,
    roles: Roles,
) -> list[tuple[Approval, PromotionReason | None]]:
    """Each approval in the order given, with why it does not count (None: it counts, unless it is one more
    than the stage needs)."""
    judged: list[tuple[Approval, PromotionReason | None]] = []
    for a in approvals:
        problem = approval_problem(
            a, stage, min_comment_chars, evaluated_at, stage_roles, duties, tooling_signer, roles
        )
        judged.append((a, problem or twin_problem(a, [b for b, p in judged if p is None], stage)))
    return judged


def twin_problem(a: Approval, counted: Sequence[Approval], stage: str) -> PromotionReason | None:
    """Why `a` adds no approval to those `counted`: one name twice, or two names of one person (one OS account:
    `Approval.person`). The one rule for a promotion's approvals and for an approval about to be recorded."""
    twin = next((c for c in counted if c.by == a.by or c.person == a.person), None)
    if twin is None:
        return None
    if twin.by == a.by:
        request = f" ({a.request})" if a.request else ""
        return PromotionReason(
            ReasonKind.DUTY,
            f"{a.by} already approved this request{request}; a second approval must come from someone else",
        )
    return PromotionReason(ReasonKind.DUTY, one_account(stage, a.by, a.account, f"approved it as {twin.by}"))


def approval_problem(
    a: Approval,
    stage: str,
    min_comment_chars: int,
    evaluated_at: str,
    stage_roles: StageRoles,
    duties: Duties,
    tooling_signer: str,
    roles: Roles,
) -> PromotionReason | None:
    """Why one approval does not count, or None when it does."""

    def problem(text: str, kind: ReasonKind = ReasonKind.APPROVAL) -> PromotionReason:
        return PromotionReason(kind, text)

    if a.stage != stage:
        return problem(f"the approval by {a.by} is for {a.stage}, not {stage}")
    if a.status != "open":
        why = {
            "consumed": f"was used up by the move {a.closed_by}",
            "expired": "has expired",
            "void": "is void (typed into a refused promotion, or the promotion was declined)",
        }
        said = why.get(a.status, "is " + a.status)
        if a.closed_why and a.status == "void":  # why it was voided, as the closing act recorded it
            said = f"is void ({a.closed_why})"
        elif a.closed_why and a.status == "expired":
            said += f" ({a.closed_why})"
        return problem(f"the approval by {a.by} at {a.at} {said}; approve again")
    if duties.request_id and a.request and a.request != duties.request_id:
        return problem(
            f"the approval by {a.by} at {a.at} answers request {a.request}, not this one "
            f"({duties.request_id}); approve again"
        )
    if predates(a.at, evaluated_at):
        return problem(
            f"the approval by {a.by} at {a.at} predates the latest evaluation ({evaluated_at}); approve again"
        )
    if duties.now and expired(a.at, stage_roles.approval_ttl_hours, duties.now):
        return problem(
            f"the approval by {a.by} at {a.at} expired after {stage_roles.approval_ttl_hours:g} h; approve again"
        )
    if len(a.comment.strip()) < min_comment_chars:
        return problem(f"approval comment by {a.by} is shorter than {min_comment_chars} characters")
    if not roles.may(a.by, stage, "approve"):
        return problem(
            f"{a.by} may not approve {stage}: the approve role is held by {roles.describe(stage, 'approve')}",
            ReasonKind.ROLE,
        )
    unsigned = roles.signature_problem(
        f"the approval by {a.by} at {a.at}", a.by, a.payload(), a.key, a.signature, a.at, stage
    )
    if unsigned is not None:
        return problem(unsigned)
    if stage in FOUR_EYES_STAGES and duties.registered_by and a.by == duties.registered_by:
        return problem(
            f"{a.by} registered the evidence of this version and cannot approve its {stage} promotion", ReasonKind.DUTY
        )
    if stage in FOUR_EYES_STAGES and tooling_signer and a.by == tooling_signer:
        return problem(
            f"{a.by} signed off {TOOLING_ITEM} for {stage} and cannot also approve the promotion", ReasonKind.DUTY
        )
    requesters = {duties.requester, duties.mover} - {""}
    if not stage_roles.self_approval and a.by in requesters:
        return problem(
            f"{a.by} requested this promotion and cannot approve it (requester != approver)", ReasonKind.DUTY
        )
    me = a.person
    if stage in FOUR_EYES_STAGES and duties.registered_person == me:
        return problem(one_account(stage, a.by, a.account, "registered the evidence of this version"), ReasonKind.DUTY)
    if not stage_roles.self_approval and me in {duties.requester_person, duties.mover_person}:
        return problem(one_account(stage, a.by, a.account, "requested this promotion"), ReasonKind.DUTY)
    return None


def expired(at: str, ttl_hours: float, now: str) -> bool:
    """Whether something given at `at` is older than `ttl_hours` at `now` (ISO times; unreadable = expired)."""
    try:
        given, current = (
            datetime.fromisoformat(at.replace("Z", "+00:00")),
            datetime.fromisoformat(now.replace("Z", "+00:00")),
        )
    except ValueError:
        return True
    return current - given > timedelta(hours=ttl_hours)
