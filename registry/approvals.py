"""The approval lifecycle: promotion requests, approvals, declines, and how each one ends.

A promotion request (who asked to move one version to one stage, on which evidence) is opened by
`unmask promote` or by the first approval given while none is open; the first promoter of a request
opened by an approval becomes its requester. An approval answers one request; the move it allows
consumes it, a refused promote voids the approval typed into it, and the stage's TTL expires it. A
decline (`unmask reject`) closes the request, voids its approvals and stands until new evidence is
registered. Every decision is an audit event. Each decision first checks the version's evidence against
the sha256 recorded at registration: on forged evidence nothing is recorded but the integrity finding.

Stored as version tags (JSON), one tag per request and per approval (`unmask.requests.<stage>.<id>`,
`unmask.approvals.<stage>.<id>`), so two people approving at once never overwrite each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from checklists import load_checklist
from gates.decision import UNVERIFIED, unverified_text
from gates.promotion import (
    TOOLING_ITEM,
    Approval,
    Decline,
    Duties,
    PromotionRequest,
    approval_problem,
    current_signoffs,
    decline_problem,
    declined_problems,
    expired,
    person,
    registration_payload,
    request_problem,
    signoff_payload,
    twin_problem,
)
from gates.roles import Roles, load_roles
from gates.signatures import signature_problem
from registry import audit
from registry.audit import AuditEvent
from registry.connection import RegistryError
from registry.identity import Actor, actor_for, signing_actor
from registry.integrity import trusted_chain
from registry.judging import judge_again
from registry.keys import Signer
from registry.state import signoffs_from_tags, version_state
from registry.store import STAGE_ALIASES, Registry, model_tag, now_iso, reads_once
from registry.tracking import checked_evidence, registrant_tags

MAX_COMMENT_CHARS = 2000  # a version tag holds 5000 characters; the rest of the JSON needs room


class ApprovalRefused(RegistryError):
    """An approval, decline or sign-off that was not recorded; `reasons` say why (each one audited)."""

    def __init__(self, action: str, reasons: list[str]):
        self.reasons = reasons
        super().__init__(f"{action} refused:\n" + "\n".join(f"  - {r}" for r in reasons))


# reading (registry.state parses the tags; these read one version for one question) -----------------------
def approvals_of(registry: Registry, model: str, version: str, stage: str) -> list[Approval]:
    return version_state(registry, model, version).approvals(stage)


def approval_of(registry: Registry, model: str, version: str, stage: str) -> Approval | None:
    """The newest approval recorded for a stage (whatever its status), or None."""
    return version_state(registry, model, version).approval(stage)


def requests_of(registry: Registry, model: str, version: str, stage: str) -> list[PromotionRequest]:
    return version_state(registry, model, version).requests(stage)


def open_request(registry: Registry, model: str, version: str, stage: str) -> PromotionRequest | None:
    """The newest open request asked on the version's current evidence, or None."""
    return version_state(registry, model, version).open_request(stage)


def declined_of(registry: Registry, model: str, version: str, stage: str) -> Decline | None:
    return version_state(registry, model, version).declined(stage)


def duties_for(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    request: PromotionRequest | None,
    mover: Actor | None = None,
) -> Duties:
    """Who did what for the version: what the four-eyes rules of `gates.promotion` read (`mover`: who runs the
    promotion now)."""
    if mover is None:
        return version_state(registry, model, version).duties(stage, request)
    return version_state(registry, model, version).duties(
        stage, request, mover.name, person(mover.name, mover.source, mover.account)
    )


# writing ---------------------------------------------------------------------------------------------
def signed(approval: Approval, key: Signer | None) -> Approval:
    """`approval` signed by `key` over its payload (as it is, when no key signs)."""
    if key is None:
        return approval
    fingerprint, signature = key.sign(approval.payload())
    return replace(approval, key=fingerprint, signature=signature)


def _write(registry: Registry, model: str, version: str, key: str, value: Mapping[str, Any]) -> None:
    registry.set_version_tags(model, version, {model_tag(key): dict(value)})


def _event(
    registry: Registry,
    event: str,
    actor: Actor | str,
    stage: str,
    model: str,
    version: str,
    comment: str,
    evidence: dict[str, Any] | None = None,
) -> AuditEvent:
    who = actor.name if isinstance(actor, Actor) else actor
    extra = {"actor": actor.to_dict()} if isinstance(actor, Actor) else {}
    return audit.append(
        registry,
        AuditEvent(event, who, now_iso(), stage, model, version, comment=comment, evidence=extra | (evidence or {})),
    )


def _refuse(
    registry: Registry,
    event: str,
    actor: Actor,
    stage: str,
    model: str,
    version: str,
    action: str,
    reasons: list[str],
    evidence: dict[str, Any] | None = None,
) -> None:
    _event(registry, event, actor, stage, model, version, "; ".join(reasons)[:4000], evidence)
    raise ApprovalRefused(action, reasons)


def request_promotion(
    registry: Registry, model: str, version: str, stage: str, actor: Actor, roles: Roles | None = None
) -> tuple[PromotionRequest, bool]:
    """The open request for this promotion (claimed by `actor` if an approval opened it), or a new one, signed by
    its requester's key; and whether it was opened or claimed now. An open request that is not its requester's
    (`request_problem`: a rewritten or unsigned tag where only signed acts count) is voided, audited, and a new one
    opened: approvals given to it lapse.

    A request opened or claimed now is recorded by the promotion that uses it: a new one is written at once (the
    approval typed into the same promote cites it), a claim only when the move writes the request done
    (`consume`); its audit entry is the move's own (which holds the request), or, for a promotion that does not
    move, `record_request`'s."""
    roles = roles or load_roles()
    request = open_request(registry, model, version, stage)
    forged = request_problem(request, model, version, roles)
    if request is not None and forged is not None:
        _write(registry, model, version, f"requests.{stage}.{request.id}", replace(request, status="void").to_dict())
        _event(registry, "approval_void", actor, stage, model, version, forged, {"request": request.id})
        request = None
    if request is not None and request.by:
        return request, False
    actor, key = signing_actor(actor, roles)
    opened = request is None
    if request is not None:  # opened by an approval: whoever promotes it is its requester
        request = replace(request, by=actor.name, host=actor.host)
    else:
        request = _new_request(registry, model, version, stage, actor.name, actor.host)
    request = replace(request, account=actor.account, identity=actor.source)  # the person behind the name (four eyes)
    if key is not None:
        request = replace(request, **dict(zip(("key", "signature"), key.sign(request.payload(model, str(version))))))
    if opened:
        _write(registry, model, version, f"requests.{stage}.{request.id}", request.to_dict())
    return request, True


def record_request(registry: Registry, model: str, version: str, request: PromotionRequest, actor: Actor) -> None:
    """Record a request a promotion opened or claimed and did not move on: the request as claimed, and its audit
    entry (a promotion that moves records both with the move: `consume` and the move's entry)."""
    _write(registry, model, version, f"requests.{request.stage}.{request.id}", request.to_dict())
    _event(
        registry,
        "promotion_request",
        actor,
        request.stage,
        model,
        version,
        f"request {request.id}",
        {"request": request.to_dict()},
    )


def _new_request(registry: Registry, model: str, version: str, stage: str, by: str, host: str) -> PromotionRequest:
    evaluated = registry.version_tags(model, version).get(model_tag("evaluated_at"), "")
    return PromotionRequest(uuid.uuid4().hex[:12], stage, by, now_iso(), evaluated, host)


@reads_once
def approve(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    approver: str | Actor | None,
    comment: str,
    roles: Roles | None = None,
    request: PromotionRequest | None = None,
) -> Approval:
    """Record an approval of the open request to promote `model` `version` to `stage`, or refuse (audited).

    Refused: an empty comment, a decline that still stands, an approver without the stage's approve role,
    the requester (unless the stage allows self-approval), for staging and production who registered the
    evidence or signed off tooling-maturity, and a second approval by the same person.
    """
    if stage not in STAGE_ALIASES:
        raise RegistryError(f"unknown stage {stage!r}; expected one of {', '.join(STAGE_ALIASES)}")
    actor = actor_for(registry.tracking_uri, approver)
    checked_evidence(registry, model, version, actor.name)  # nobody approves forged evidence (a finding)
    chain = trusted_chain(registry, f"approval of {model} v{version} for {stage}", actor.name)  # nor on a forged trail
    roles = roles or load_roles()
    actor, key = signing_actor(actor, roles)
    action = f"approval of {model} v{version} for {stage} by {actor.name}"
    comment = (comment or "").strip()
    state = version_state(registry, model, version)
    tags, evaluated = state.tags, state.evaluated_at
    request = request or state.open_request(stage)
    duties = state.duties(stage, request)
    reasons = [] if comment else ["an approval needs a comment saying why (empty or whitespace is not one)"]
    reasons += [r.text for r in declined_problems(duties.declined, stage, evaluated, roles)]
    forged = request_problem(request, model, str(version), roles)  # approving it would approve a rewritten name's
    reasons += [forged] if forged else []
    # the rules a promotion applies, applied before anything is recorded (gates.promotion)
    tooling = current_signoffs(signoffs_from_tags(tags, stage), evaluated, roles, (model, version, stage))[0]
    tooling_by = tooling.get(TOOLING_ITEM, {}).get("by", "")
    opened = request or _new_request(registry, model, version, stage, "", "")  # written once the approval is
    candidate = signed(
        Approval(
            stage,
            actor.name,
            now_iso(),
            comment[:MAX_COMMENT_CHARS] or "-",
            uuid.uuid4().hex[:12],
            opened.id,
            actor.host,
            actor.source,
            account=actor.account,
            model=model,
            version=str(version),
            head=f"{chain.head_seq}:{chain.head_sha256}",
        ),
        key,
    )
    problem = approval_problem(candidate, stage, 0, evaluated, roles.stage(stage), duties, tooling_by, roles)
    if problem is not None:
        reasons.append(problem.text)
    given = [
        a for a in state.approvals(stage) if request is not None and a.status == "open" and a.request == request.id
    ]
    twin = twin_problem(candidate, given, stage)
    # one name twice is refused at every stage; a second name of one account only where two people are needed
    if twin is not None and (roles.stage(stage).approvals_count > 1 or any(a.by == actor.name for a in given)):
        reasons.append(twin.text)
    if reasons:
        _refuse(
            registry,
            "approval_refused",
            actor,
            stage,
            model,
            version,
            action,
            reasons,
            {"request": request.id if request else ""},
        )
    if request is None:  # nobody asked yet: this approval opens the request, its first promoter requests it
        _write(registry, model, version, f"requests.{stage}.{opened.id}", opened.to_dict())
    approval = candidate
    _write(registry, model, version, f"approvals.{stage}.{approval.id}", approval.to_dict())
    _event(
        registry,
        "approval",
        actor,
        stage,
        model,
        version,
        approval.comment,
        {"approval": approval.id, "request": opened.id, "key": approval.key},
    )
    judge_again(registry, model, str(version), stage, roles)  # the decision it changed, stored as it now stands
    return approval


def close(
    registry: Registry,
    model: str,
    version: str,
    approval: Approval,
    status: str,
    actor: Actor | str,
    why: str,
    closed_by: str = "",
) -> Approval:
    """End an open approval (expired or void; one a move used is consumed by it: `consume`), audited as
    `approval_<status>`; one already ended (a racing move consumed it) is left as it is."""
    stored = next((a for a in approvals_of(registry, model, version, approval.stage) if a.id == approval.id), None)
    if stored is not None and stored.status != "open":
        return stored
    closed = replace(approval, status=status, closed_by=closed_by, closed_why=why[:500])
    _write(registry, model, version, f"approvals.{approval.stage}.{approval.id}", closed.to_dict())
    _event(
        registry,
        f"approval_{status}",
        actor,
        approval.stage,
        model,
        version,
        why,
        {"approval": approval.id, "request": approval.request, "approved_by": approval.by, "closed_by": closed_by},
    )
    return closed


def expire_old(registry: Registry, model: str, version: str, stage: str, actor: Actor, roles: Roles) -> None:
    """Mark the open approvals of a stage older than its TTL as expired (each audited)."""
    ttl = roles.stage(stage).approval_ttl_hours
    now = now_iso()
    for a in approvals_of(registry, model, version, stage):
        if a.status == "open" and expired(a.at, ttl, now):
            close(
                registry, model, version, a, "expired", actor, f"approval by {a.by} at {a.at} is older than {ttl:g} h"
            )


def consume(
    registry: Registry,
    model: str,
    version: str,
    approvals: list[Approval],
    request: PromotionRequest,
    move_run_id: str,
) -> None:
    """The move `move_run_id` used these approvals: their request is done by it, naming them, so each reads as
    consumed (`registry.state.approvals_from_tags`); the move's entry cites them all. One write, however many."""
    done = replace(request, status="done", closed_by=move_run_id, consumed=",".join(a.id for a in approvals))
    _write(registry, model, version, f"requests.{request.stage}.{request.id}", done.to_dict())


@reads_once
def decline(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    who: str | Actor | None,
    comment: str,
    roles: Roles | None = None,
) -> Decline:
    """Decline promoting `model` `version` to `stage`: final until new evidence is registered (audited)."""
    actor = actor_for(registry.tracking_uri, who)
    checked_evidence(registry, model, version, actor.name)  # a decision on forged evidence is no decision
    trusted_chain(registry, f"decline of {model} v{version} for {stage}", actor.name)  # nor on a forged audit trail
    roles = roles or load_roles()
    actor, key = signing_actor(actor, roles)
    action = f"decline of {model} v{version} for {stage} by {actor.name}"
    comment = (comment or "").strip()
    reasons = []
    if not comment:
        reasons.append("a decline needs a comment saying why (empty or whitespace is not one)")
    if not roles.may(actor.name, stage, "approve"):
        reasons.append(
            f"{actor.name} may not decide on {stage}: the approve role is held by {roles.describe(stage, 'approve')}"
        )
    declined = Decline(
        stage, actor.name, now_iso(), comment[:MAX_COMMENT_CHARS], actor.host, model=model, version=str(version)
    )
    if key is not None:
        fingerprint, signature = key.sign(declined.payload())
        declined = replace(declined, key=fingerprint, signature=signature)
    unsigned = decline_problem(declined, roles) if not reasons else None
    if unsigned is not None:
        reasons.append(unsigned)
    if reasons:
        _refuse(registry, "approval_refused", actor, stage, model, version, action, reasons)
    _write(registry, model, version, f"decline.{stage}", declined.to_dict())
    for r in requests_of(registry, model, version, stage):
        if r.status == "open":
            _write(registry, model, version, f"requests.{stage}.{r.id}", replace(r, status="declined").to_dict())
    for a in approvals_of(registry, model, version, stage):
        if a.status == "open":
            close(registry, model, version, a, "void", actor, f"declined by {actor.name}: {declined.comment}")
    _event(registry, "decline", actor, stage, model, version, declined.comment)
    return declined


# sign-offs ------------------------------------------------------------------------------------------
@reads_once
def sign_off(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    item: str,
    who: str | Actor | None,
    comment: str,
    roles: Roles | None = None,
) -> dict[str, str]:
    """Sign off a manual checklist item of a stage for one version (who, host, when, comment), if `who` may."""
    manual = load_checklist(stage).manual_items()
    if item not in manual:
        raise RegistryError(f"checklist {stage} has no manual item {item!r}; manual items: {', '.join(manual)}")
    actor = actor_for(registry.tracking_uri, who)
    checked_evidence(registry, model, version, actor.name)  # nobody signs off forged evidence (a finding)
    chain = trusted_chain(registry, f"sign-off of {item!r} of {model} v{version} for {stage}", actor.name)  # nor on
    # a forged audit trail
    if not (comment or "").strip():
        raise RegistryError(f"a sign-off of {item!r} needs who and a comment")
    roles = roles or load_roles()
    actor, key = signing_actor(actor, roles)
    signoff = {
        "by": actor.name,
        "at": now_iso(),
        "comment": comment.strip(),
        "host": actor.host,
        "identity": actor.source,
        "account": actor.account,
        "head": f"{chain.head_seq}:{chain.head_sha256}",
    }
    payload = signoff_payload(model, str(version), stage, item, signoff)
    if key is not None:
        signoff["key"], signoff["signature"] = key.sign(payload)
    if not roles.may(actor.name, stage, "sign_off", item):
        reason: str | None = (
            f"{actor.name} may not sign off {stage}/{item}: that is for "
            f"{roles.describe(stage, 'sign_off', item)} ({roles.source})"
        )
    else:
        who = f"the sign-off of {item!r} by {actor.name}"
        reason = roles.signature_problem(
            who, actor.name, payload, signoff.get("key", ""), signoff.get("signature", ""), signoff["at"], stage
        )
    if reason is not None:
        audit.append(
            registry,
            AuditEvent(
                "signoff_refused",
                actor.name,
                now_iso(),
                stage,
                model,
                version,
                comment=reason,
                evidence={"item": item, "actor": actor.to_dict()},
            ),
        )
        raise ApprovalRefused(f"sign-off of {stage}/{item} for {model} v{version}", [reason])
    registry.set_version_tags(model, version, {model_tag(f"signoff.{stage}.{item}"): signoff})
    audit.append(
        registry,
        AuditEvent(
            "signoff",
            signoff["by"],
            signoff["at"],
            stage,
            model,
            version,
            comment=signoff["comment"],
            evidence={"item": item, "actor": actor.to_dict()},
        ),
    )
    return signoff


def signoffs_of(registry: Registry, model: str, version: str, stage: str) -> dict[str, dict[str, str]]:
    """Every sign-off recorded for a stage, current or not (see `gates.promotion.current_signoffs`)."""
    return version_state(registry, model, version).signoffs(stage)


@reads_once
def vouch(registry: Registry, model: str, version: str, comment: str, voucher: str | Actor | None = None) -> str:
    """`unmask migrate`: the voucher signs, with their own listed key, the registration of evidence whose hashes
    still verify but whose registration no listed key signed (registered before keys, or by a process without one).
    The voucher becomes its registrant for the four-eyes rules (they may not approve it past poc); `evaluated_at`
    stays, so sign-offs and approvals given since still stand. Refused (audited) where nothing would vouch: no
    comment, no key of theirs listed in the roles file, evidence with no hashes (measure it again) or changed since
    (an integrity finding), a registration that is already signed by a listed key. Returns the new key fingerprint."""
    actor = actor_for(registry.tracking_uri, voucher)
    _, vouched = checked_evidence(registry, model, version, actor.name)  # changed evidence raises (a finding)
    trusted_chain(registry, f"vouching for {model} v{version}", actor.name)
    roles = load_roles()
    actor, key = signing_actor(actor, roles)
    tags = version_state(registry, model, version).tags
    at, before = tags.get(model_tag("evaluated_at"), ""), tags.get(model_tag("evaluated_by"), "")
    payload = registration_payload(model, vouched["run_id"], vouched["sha256"] or {}, actor.name, at)
    signed = key.sign(payload) if key is not None else ("", "")
    old = registration_payload(model, vouched["run_id"], vouched["sha256"] or {}, before, at)
    reasons = [] if comment.strip() else ["vouching needs a comment saying what you checked"]
    if vouched["status"] == UNVERIFIED:
        reasons.append(f"{unverified_text(model, version)}: there is nothing to vouch for")
    elif not roles.signed:
        reasons.append(
            f"{roles.path or roles.source} lists no keys: nothing signed would count (`unmask keys init`, "
            "docs/governance.md)"
        )
    else:
        registered = tags.get(model_tag("evaluated_key"), ""), tags.get(model_tag("evaluated_signature"), "")
        if signature_problem(roles.keys, "", before, old, *registered, at) is None:
            reasons.append(f"the evidence of {model} v{version} is signed by {before}'s listed key already")
        problem = signature_problem(roles.keys, f"vouching by {actor.name}", actor.name, payload, *signed, at)
        if problem is not None:
            reasons.append(problem)
    if reasons:
        _refuse(registry, "vouch_refused", actor, "", model, version, f"vouching for {model} v{version}", reasons)
    registry.set_version_tags(model, version, registrant_tags(actor, *signed))
    evidence = {
        "previous_registrant": before,
        "key": signed[0],
        "signature": signed[1],
        "evidence_run": vouched["run_id"],
    }
    _event(registry, "evidence_vouched", actor, "", model, version, comment.strip()[:MAX_COMMENT_CHARS], evidence)
    return signed[0]
