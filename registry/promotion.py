"""Approvals, sign-offs, promotion, rollback and crash recovery: the only code that moves an alias.

A stage alias (`poc`, `staging`, `production`) is held by at most one registered model version at
a time; moving it to another model takes the alias off the previous holder. A move runs under two
locks per stage, a lock file (promotions sharing a state folder queue there) and a registry lock
(a registered model that exists while held: atomic on SQLite and on a server, so promotions from
other hosts exclude each other too), and compare-and-sets the holder: the promotion remembers who
held the stage when it started judging, and refuses if that changed before it got the locks. Each move writes
its audit intent first, then sets the alias on the new holder (the commit point), then removes it
from the old one; `recover` settles an interrupted move forward or back, and `stage_holder` reads
through an unsettled one, so the registry is seen as before or after a move, never in between.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from filelock import FileLock, Timeout

from gates.policy import Policy, load_policy
from gates.promotion import (
    TOOLING_ITEM,
    Approval,
    Duties,
    PromotionReason,
    PromotionRequest,
    approval_problems,
    current_signoffs,
    move_payload,
)
from gates.roles import Roles, load_roles
from registry import audit
from registry.approvals import (
    ApprovalRefused,
    approvals_of,
    approve,
    close,
    consume,
    duties_for,
    expire_old,
    record_request,
    request_promotion,
)
from registry.audit import MOVE, AuditEvent, parse_ref, ref
from registry.connection import RegistryError
from registry.demo import demo_refusal
from registry.identity import Actor, actor_for, signing_actor
from registry.integrity import ChainBroken, alias_drift, record_finding, trusted_chain
from registry.judging import judge  # looked up when promote runs: tests pause a promotion inside it
from registry.keys import Signer
from registry.state import Holder, evaluated_at, fallback_holder, stage_holder, version_state
from registry.store import STAGE_ALIASES, Registry, RegistryLock, latest_registration, model_tag, now_iso, retry_busy
from registry.tracking import checked_evidence


class PromotionRefused(RegistryError):
    """A promotion or rollback that was not done; `reasons` lists every reason, as users read it."""

    def __init__(self, action: str, reasons: Iterable[PromotionReason | str]):
        self.reasons = [str(r) for r in reasons]
        super().__init__(f"{action} refused:\n" + "\n".join(f"  - {r}" for r in self.reasons))


@dataclass(frozen=True)
class Move:
    stage: str
    from_holder: Holder
    to_holder: Holder
    who: str
    audit_run_id: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "from": ref(*(self.from_holder or (None, None))),
            "to": ref(*(self.to_holder or (None, None))),
            "who": self.who,
            "audit_run_id": self.audit_run_id,
            "evidence": self.evidence,
        }


# moving aliases ------------------------------------------------------------------------------------
def _apply(registry: Registry, stage: str, previous: Holder, target: tuple[str, str]) -> None:
    client = registry.client
    retry_busy(client.set_registered_model_alias, target[0], stage, target[1])  # the commit point
    if previous and previous[0] != target[0]:
        _remove_alias(registry, previous[0], stage)
    registry.set_version_tags(target[0], target[1], {model_tag(f"reached.{stage}"): now_iso()})


def _remove_alias(registry: Registry, model: str, stage: str) -> None:
    if stage in registry.aliases_of(model):
        retry_busy(registry.client.delete_registered_model_alias, model, stage)


def _move(
    registry: Registry,
    stage: str,
    previous: Holder,
    target: tuple[str, str],
    who: str,
    comment: str,
    evidence: dict[str, Any],
    signer: Signer | None = None,
) -> Move:
    """The audited move (intent, alias, settle); `signer`: the mover's personal key, which signs what moved
    (`gates.promotion.move_payload`) into the entry's evidence as `signed` {key, signature}."""
    at, before, after = now_iso(), ref(*(previous or (None, None))), ref(*target)
    if signer is not None:
        key, signature = signer.sign(move_payload(stage, before, after, who, at, comment))
        evidence = evidence | {"signed": {"key": key, "signature": signature}}
    intent = audit.append(
        registry,
        AuditEvent(MOVE, who, at, stage, target[0], target[1], before, after, comment, evidence),
        open_intent=True,
    )
    _apply(registry, stage, previous, target)
    audit.settle(registry, intent, happened=True)
    return Move(stage, previous, target, who, intent.run_id, evidence)


def recover(registry: Registry, stage: str | None = None) -> list[dict[str, Any]]:
    """Settle moves a crash left unsettled: finish those whose alias moved, mark the others FAILED.

    Call it only while holding the stage's lock (promote and rollback do), or when no promotion runs. Only
    intents whose chain entries verify are settled: on a broken chain (a forged intent, say) it refuses.
    """
    settled = []
    pending = audit.pending_moves(registry, stage)
    if pending:
        trusted_chain(registry, f"recovery of {stage or 'every stage'}")
    for event in pending:
        target, previous = parse_ref(event.to_ref), parse_ref(event.from_ref)
        moved = target is not None and registry.aliases_of(target[0]).get(event.stage) == target[1]
        if moved:
            assert target is not None  # moved: the alias sits on the target
            _apply(registry, event.stage, previous, target)
        audit.settle(registry, event, happened=moved)
        settled.append(event.to_dict() | {"status": "FINISHED" if moved else "FAILED"})
    return settled


class _StageLock:
    """Both locks of a stage: the lock file (promotions sharing this state folder queue on it) and the
    registry lock (promotions from other hosts through the same MLflow server)."""

    def __init__(self, registry: Registry, stage: str, timeout_s: float, action: str):
        self.file = FileLock(str(registry.lock_path(stage)), timeout=timeout_s)
        self.shared = RegistryLock(registry, stage, owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}")
        self.timeout_s, self.action, self.stage = timeout_s, action, stage

    def __enter__(self) -> _StageLock:
        start = time.monotonic()
        try:
            self.file.acquire()
        except Timeout:
            raise PromotionRefused(
                self.action,
                [
                    f"another promotion or rollback of {self.stage} holds "
                    f"{self.file.lock_file} for more than {self.timeout_s:g} s"
                ],
            ) from None
        left = max(0.0, self.timeout_s - (time.monotonic() - start))
        if not self.shared.acquire(left):
            self.file.release()
            holder = (self.shared.holder() or {}).get(model_tag("lock.owner"), "?")
            raise PromotionRefused(
                self.action,
                [
                    f"another promotion or rollback of {self.stage} holds the registry "
                    f"lock {self.shared.name} ({holder}) for more than {self.timeout_s:g} s"
                ],
            )
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.shared.release()
        finally:
            self.file.release()


# promotion -------------------------------------------------------------------------------------------
def _verified(registry: Registry, model: str, version: str, who: str = "unmask") -> tuple[Any, dict[str, Any]]:
    """The version's evidence and what vouches for it; forged evidence is recorded as a finding, then raised."""
    return checked_evidence(registry, model, version, who)


def promote(
    model: str,
    stage: str,
    approver: str | Actor | None = None,
    comment: str = "",
    version: str | None = None,
    registry: Registry | None = None,
    policy: Policy | None = None,
    lock_timeout_s: float = 60.0,
    actor: str | Actor | None = None,
    roles: Roles | None = None,
) -> Move:
    """Move `stage` to `model` (its `candidate`, else `fallback`, version unless `version` is given), or raise
    PromotionRefused.

    `actor` requests and performs the move (default: the identity, `registry.identity`). The move needs the
    stage's approvals on the open promotion request (`unmask approve`); `approver` adds one in the same call
    (the CLI passes only the identity's own, so at poc one person may request and approve; staging and
    production refuse a requester's approval). An approval typed into a refused promote is voided; the
    approvals a move used are consumed, and the move cites them.
    """
    registry = registry or Registry()
    roles = roles or load_roles()
    mover = actor_for(registry.tracking_uri, actor)
    typed: Approval | None = None
    claimed: PromotionRequest | None = None  # a request this promotion opened or claimed, recorded with its move
    try:
        with registry.reading():  # judged on one read of the store (and its own writes) ...
            version = _version_to_promote(registry, model, stage, version)
            action = f"promotion of {model} v{version} to {stage}"
            who = mover.name
            chain = trusted_chain(registry, action, who)  # nothing acts on a trail that does not verify
            expected = stage_holder(registry, stage)
            judged_evaluation = evaluated_at(registry, model, version)
            _check_before_request(registry, model, version, stage, action, who, policy, roles)
            expire_old(registry, model, version, stage, mover, roles)
            request, fresh = request_promotion(registry, model, version, stage, mover, roles)
            claimed = request if fresh else None
            typed, prefer = _typed_approval(registry, model, version, stage, approver, comment, roles, request, action)
            duties = duties_for(registry, model, version, stage, request, mover)
            decision = judge(registry, model, version, stage, policy, roles=roles, duties=duties)
            reasons: list[PromotionReason | str] = list(decision.reasons)
            if expected == (model, version):
                reasons.append(f"{model} v{version} already holds {stage}")
            if reasons:
                cited = decision.evidence | {"request": request.id}
                _refuse(registry, "promotion_refused", who, stage, model, version, action, reasons, cited)
        # ... and once more under it, the chain's lock taken first: that read of the trail is its tail
        with _StageLock(registry, stage, lock_timeout_s, action), audit.appending(registry), registry.reading():
            recover(registry, stage)
            current = _holder_unchanged(
                registry, model, version, stage, action, who, expected, judged_evaluation, decision.evidence
            )
            used = _approvals_to_consume(
                registry, model, version, stage, policy, roles, duties, action, who, decision.evidence, prefer
            )
            evidence = decision.evidence | {
                "kind": "promotion",
                "request": request.to_dict(),
                "approvals": [a.to_dict() for a in used],
                "actor": mover.to_dict(),
                "chain_head": chain.anchor,
            }  # the signed head it was judged on
            if used:
                evidence["approval"] = used[0].to_dict()  # the first, as before requests
            move = _move(
                registry, stage, current, (model, version), who, comment, evidence, signing_actor(mover, roles)[1]
            )
            consume(registry, model, version, used, request, move.audit_run_id)
            return move
    except PromotionRefused:
        if claimed is not None:
            record_request(registry, model, str(version), claimed, mover)
        if typed is not None:
            close(registry, model, str(version), typed, "void", mover, f"typed into a refused {action}")
        raise


def _version_to_promote(registry: Registry, model: str, stage: str, version: str | None) -> str:
    """The version a promotion moves: the one given, else the model's `candidate` (then `fallback`) version."""
    action = f"promotion of {model} to {stage}"
    if stage not in STAGE_ALIASES:
        raise PromotionRefused(action, [f"unknown stage {stage!r}; promotions go to {', '.join(STAGE_ALIASES)}"])
    held = registry.aliases_of(model)
    version = version or latest_registration(held)
    if not version:
        raise PromotionRefused(
            action, [f"{model} has no `candidate` or `fallback` version; register its evidence first"]
        )
    return version


def _check_before_request(
    registry: Registry, model: str, version: str, stage: str, action: str, who: str, policy: Policy | None, roles: Roles
) -> None:
    """Refuse before any request or approval is recorded: forged evidence, a drifted alias, a demo policy."""
    _verified(registry, model, version, who)  # before an approval is recorded on forged evidence
    _refuse_drift(registry, "promotion_refused", who, stage, model, version, action, {})
    demo = demo_refusal(registry, stage, [f.path or f.source for f in (policy or load_policy(), roles) if f.demo])
    if demo:
        _refuse(registry, "promotion_refused", who, stage, model, version, action, [demo], {})


def _typed_approval(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    approver: str | Actor | None,
    comment: str,
    roles: Roles,
    request: PromotionRequest,
    action: str,
) -> tuple[Approval | None, str]:
    """The approval typed into this promote (recorded now, or None) and the id of the one the move prefers."""
    if approver is None:
        return None, ""
    name = actor_for(registry.tracking_uri, approver).name
    given = next(
        (
            a
            for a in approvals_of(registry, model, version, stage)
            if a.by == name and a.status == "open" and a.request == request.id
        ),
        None,
    )
    if given is not None:  # approved already (`unmask approve`): that one is used, not a second
        return None, given.id
    try:
        typed = approve(registry, model, version, stage, approver, comment, roles=roles, request=request)
    except ApprovalRefused as e:
        raise PromotionRefused(action, e.reasons) from None
    return typed, typed.id


def _holder_unchanged(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    action: str,
    who: str,
    expected: Holder,
    judged_evaluation: str,
    evidence: dict[str, Any],
) -> Holder:
    """Under the stage lock: the stage's holder, refused unless it and the version's evaluation are as judged
    and the alias is where the audit trail left it."""
    current = stage_holder(registry, stage)
    if current != expected:
        _refuse(
            registry,
            "promotion_refused",
            who,
            stage,
            model,
            version,
            action,
            [
                f"{stage} moved from {ref(*(expected or (None, None))) or 'nobody'} to "
                f"{ref(*(current or (None, None))) or 'nobody'} while this promotion was being judged; "
                "judge again against the new holder"
            ],
            evidence,
        )
    if evaluated_at(registry, model, version) != judged_evaluation:
        _refuse(
            registry,
            "promotion_refused",
            who,
            stage,
            model,
            version,
            action,
            [f"{model} v{version} was re-evaluated while this promotion was being judged; judge again"],
            evidence,
        )
    _refuse_drift(registry, "promotion_refused", who, stage, model, version, action, evidence)
    return current


def _approvals_to_consume(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    policy: Policy | None,
    roles: Roles,
    duties: Duties,
    action: str,
    who: str,
    evidence: dict[str, Any],
    prefer: str,
) -> list[Approval]:
    """Under the stage lock: the approvals this move uses, read again (one consumed or voided meanwhile no
    longer counts), so a move cites exactly the approvals it consumed."""
    policy = policy or load_policy()
    state = version_state(registry, model, version)
    signoffs, _ = current_signoffs(state.signoffs(stage), state.evaluated_at, roles, (model, version, stage))
    problems, used = approval_problems(
        state.approvals(stage),
        stage,
        policy.stage(stage).approval_min_comment_chars,
        state.evaluated_at,
        roles.stage(stage),
        duties,
        tooling_signer=signoffs.get(TOOLING_ITEM, {}).get("by", ""),
        roles=roles,
        counted=True,
        prefer=prefer,
    )
    if problems:
        _refuse(registry, "promotion_refused", who, stage, model, version, action, problems, evidence)
    return used


def _refuse_drift(
    registry: Registry,
    event: str,
    who: str,
    stage: str,
    model: str,
    version: str,
    action: str,
    evidence: dict[str, Any],
) -> None:
    """Refuse (and record the finding) when the stage alias is not where the audit trail left it."""
    drift = alias_drift(registry, stage)
    if drift is not None:
        record_finding(registry, drift, who)
        _refuse(
            registry, event, who, stage, model, version, action, [str(drift)], evidence | {"drift": drift.finding()}
        )


def _refuse(
    registry: Registry,
    event: str,
    who: str,
    stage: str,
    model: str,
    version: str,
    action: str,
    reasons: Sequence[PromotionReason | str],
    evidence: dict[str, Any],
) -> NoReturn:
    refused = PromotionRefused(action, reasons)
    audit.append(
        registry,
        AuditEvent(
            event, who, now_iso(), stage, model, version, comment="; ".join(refused.reasons)[:4000], evidence=evidence
        ),
    )
    raise refused


def rollback(
    stage: str,
    who: str | Actor | None = None,
    comment: str = "",
    registry: Registry | None = None,
    lock_timeout_s: float = 60.0,
    reconcile: bool = False,
    policy: Policy | None = None,
    roles: Roles | None = None,
    to_fallback: bool = False,
) -> Move:
    """Re-point `stage` to the version that held it before the current one was promoted, else to `fallback`;
    with `to_fallback`, to `fallback` directly: the one target that needs nothing from the audit trail, so it
    works on a broken chain too (the break is recorded as a finding, and the move names it).

    An emergency action: no approval, but only for the stage's `emergency_rollback` role (refused and
    audited otherwise), and every rollback opens an `emergency_rollback` finding for review.
    A stage alias moved outside unmask (drift) is refused; `reconcile=True` instead puts it back on the holder
    the audit trail's last settled move left, as an audited move. `policy`: the one whose verdict led here
    (the nightly's), recorded with the move.
    """
    registry = registry or Registry()
    roles = roles or load_roles()
    actor = actor_for(registry.tracking_uri, who)
    who = actor.name
    action = f"{'reconciliation' if reconcile else 'rollback'} of {stage}"
    if stage not in STAGE_ALIASES:
        raise PromotionRefused(action, [f"unknown stage {stage!r}; expected one of {', '.join(STAGE_ALIASES)}"])
    broken = None
    try:
        trusted_chain(registry, action, who)  # a rollback target read from a forged trail never held the stage
    except ChainBroken as e:
        if not to_fallback or reconcile:
            raise
        broken = e  # the fallback alias is read from the registry, not from the trail
    if not roles.may(who, stage, "emergency_rollback"):
        _refuse(
            registry,
            "rollback_refused",
            who,
            stage,
            "",
            "",
            action,
            [
                f"{who} may not roll back {stage}: the emergency_rollback role is held by "
                f"{roles.describe(stage, 'emergency_rollback')} ({roles.source})"
            ],
            {"actor": actor.to_dict()},
        )
    # signed by the mover's key where they hold one; a rollback without one still moves (to a holder the trail vetted,
    # or to the fallback: it waits for nothing) and reads as not signed (`unmask history`)
    signer = signing_actor(actor, roles)[1]
    with _StageLock(registry, stage, lock_timeout_s, action):
        if broken is None:  # a move intent read from a broken trail is not followed
            recover(registry, stage)
        if reconcile:
            move = _restore(registry, stage, who, comment, action, signer)
        else:
            move = _rollback(registry, stage, actor, comment, action, policy, to_fallback, broken, signer)
    target = move.to_holder or ("", "")
    audit.append(
        registry,
        AuditEvent(
            "emergency_rollback",
            who,
            now_iso(),
            stage,
            target[0],
            target[1],
            ref(*(move.from_holder or (None, None))),
            ref(*(move.to_holder or (None, None))),
            f"{action} by {who} without an approval: review it ({comment})",
            {"move": move.audit_run_id, "actor": actor.to_dict(), "roles": roles.cited()},
        ),
    )
    return move


def _rollback(
    registry: Registry,
    stage: str,
    actor: Actor,
    comment: str,
    action: str,
    policy: Policy | None,
    to_fallback: bool = False,
    broken: ChainBroken | None = None,
    signer: Signer | None = None,
) -> Move:
    who = actor.name
    if broken is None:  # where the trail cannot be read, the alias as the registry holds it is what is rolled back
        _refuse_drift(registry, "rollback_refused", who, stage, "", "", action, {})
    current = stage_holder(registry, stage)
    if current is None:
        _refuse(registry, "rollback_refused", who, stage, "", "", action, [f"nobody holds {stage}"], {})
    target = None if to_fallback else _previous_holder(registry, stage, current)
    reason = "previous holder"
    if target is None or target == current:
        target, reason = fallback_holder(registry), "fallback"
    if target is None or target == current:
        _refuse(
            registry,
            "rollback_refused",
            who,
            stage,
            current[0],
            current[1],
            action,
            [f"{stage} has no previous holder and no `fallback` version other than {ref(*current)}"],
            {},
        )
    evidence = {"kind": "rollback", "target": reason, "actor": actor.to_dict()}
    if broken is not None:
        evidence["broken_chain"] = str(broken)[:1000]
    if policy is not None:
        evidence["policy"] = policy.cited()
    said = comment or f"rollback of {stage} to {reason}"
    return _move(registry, stage, current, target, who, said, evidence, signer)


def _restore(registry: Registry, stage: str, who: str, comment: str, action: str, signer: Signer | None = None) -> Move:
    """Put a drifted stage alias back where the audit trail's last settled move left it (or off, if nobody), signed
    by its mover's key where they have one (`gates.promotion.move_payload`, as every move)."""
    drift = alias_drift(registry, stage)
    if drift is None:
        _refuse(
            registry,
            "rollback_refused",
            who,
            stage,
            "",
            "",
            action,
            [f"{stage} is where the audit trail's last settled move left it; nothing to reconcile"],
            {},
        )
    record_finding(registry, drift, who)
    found, target = drift.found, drift.expected
    previous = found[0] if len(found) == 1 else None
    model, version = target or previous or ("", "")
    evidence: dict[str, Any] = {"kind": "reconcile", "drift": drift.finding()}
    at, before, after = now_iso(), ref(*(previous or (None, None))), ref(*(target or (None, None)))
    said = comment or f"reconcile {stage}: back to {after or 'nobody'}"
    if signer is not None:
        key, signature = signer.sign(move_payload(stage, before, after, who, at, said))
        evidence["signed"] = {"key": key, "signature": signature}
    intent = audit.append(
        registry, AuditEvent(MOVE, who, at, stage, model, version, before, after, said, evidence), open_intent=True
    )
    if target:
        retry_busy(registry.client.set_registered_model_alias, target[0], stage, target[1])
    for holder_model, _ in found:
        if not target or holder_model != target[0]:
            _remove_alias(registry, holder_model, stage)
    audit.settle(registry, intent, happened=True)
    return Move(stage, previous, target, who, intent.run_id, evidence)


def _previous_holder(registry: Registry, stage: str, current: tuple[str, str]) -> Holder:
    """Who held `stage` before the promotion that brought the current holder in (rollbacks are skipped)."""
    moves = [
        e
        for e in audit.events(registry, stage=stage, event=MOVE)
        if e.status == "FINISHED" and e.evidence.get("kind") == "promotion" and e.to_ref == ref(*current)
    ]
    return parse_ref(moves[-1].from_ref) if moves else None
