"""Repairing a broken audit chain: the on-call person's signed, audited way back to a trail that verifies
(`unmask audit --repair`, issue 48 item 6).

A broken chain stops every action that reads the trail (promote, rollback, approve, a server following a stage),
on purpose. The repair starts it again without trusting what broke it:

- every entry that does not verify on its own is set aside: its content no longer matches its hash, the key ring
  did not sign it, it is an unchained run among chained ones, it names another store, or its outcome tags were
  changed. Its MLflow run is deleted, so no reader counts it; MLflow keeps a deleted run until `mlflow gc`, and
  restoring one breaks the repair's seal;
- a run status changed after the entry was written is put back to the outcome hashed onto it;
- a removed or changed store identity tag is put back to the identity the chain's entries name;
- signed heads (this machine's anchor, a witness given) that name entries no longer there are acknowledged as lost;
- one `chain_repair` entry, numbered past every number the chain ever used, seals every entry left before it and
  is signed by the repairer's personal key. `audit.verify` checks that signature, the repairer's role (the
  on-call person: emergency_rollback at every stage) and the seal on every read.

What stays is what verifies; what a set-aside entry said is lost, and the repair lists it. A set-aside alias move
can leave an alias where the trail no longer puts it: that is alias drift, settled by `unmask rollback --stage S
--reconcile`. A key ring that cannot check the entries at all (a store restored without its keys folder) is
refused: restore the ring, not the chain.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Run

from gates.roles import Roles, load_roles
from registry import audit, signing
from registry.audit import (
    CHAIN_STORE,
    HEAD,
    MOVE,
    REPAIR,
    SETTLED,
    SETTLED_SHA,
    SHA,
    SIG,
    STORE,
    AuditEvent,
    seq_of,
    store_order,
)
from registry.connection import AUDIT_EXPERIMENT, RegistryError
from registry.identity import Actor, actor_for, signing_actor
from registry.signing import Anchor
from registry.store import Registry, model_tag, now_iso, retry_busy

LISTED = 10  # set-aside entries and restored statuses named one by one in the repair's entry (all are counted)
MAX_COMMENT = 4000  # within the audit entry's comment tag, which the repairer's signature covers as stored


class RepairRefused(RegistryError):
    """A repair that was not done; `reasons` lists why, as users read it."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("chain repair refused:\n" + "\n".join(f"  - {r}" for r in reasons))


@dataclass(frozen=True)
class Plan:
    """What a repair will do, read before anything is written."""

    found: str  # the break `verify` named
    set_aside: list[tuple[Run, str]] = field(default_factory=list)  # (run, why)
    restored: list[tuple[Run, str]] = field(default_factory=list)  # (run, the status it is put back to)
    identity: str = ""  # the store identity to put back on the audit experiment ("" when it is in place)
    acknowledged: list[Anchor] = field(default_factory=list)  # signed heads whose entries are gone
    next_seq: int = 1
    start_floor: int = 0  # ms: the repair's entry starts after every entry it seals
    chained: int = 0  # chained entries the store holds, before the repair
    store: str = ""  # the store's identity, as the chain's entries name it


@dataclass(frozen=True)
class Repair:
    """A repair done: its chain entry and what it recorded."""

    entry: AuditEvent
    found: str
    set_aside: list[dict[str, Any]]
    restored: list[dict[str, Any]]
    acknowledged: list[dict[str, Any]]
    identity: str

    @property
    def moves_set_aside(self) -> list[dict[str, Any]]:
        """The alias moves among the entries set aside (their stages may now drift)."""
        return [e for e in self.set_aside if e["event"] == MOVE]


def repair_chain(
    registry: Registry,
    actor: str | Actor | None,
    comment: str,
    witness: Anchor | None = None,
    roles: Roles | None = None,
) -> Repair:
    """Repair a broken chain as `actor`, the on-call person, signed by their key; refused (and audited) for anyone
    else, without a comment or a listed key; an intact chain is left alone."""
    roles = roles or load_roles()
    person, key = signing_actor(actor_for(registry.tracking_uri, actor), roles)
    comment = (comment or "").strip()[:MAX_COMMENT]
    with audit.appending(registry):  # no other entry comes between what the repair read and what it writes
        report = audit.verify(registry, witness)
        if report.ok:
            raise RegistryError(f"nothing to repair: {report.summary()}")
        ring = signing.key_ring(registry.tracking_uri)
        plan = _plan(registry, str(report.first_break), witness, ring)
        reasons = _refusals(roles, person, key, comment, plan)
        if reasons:
            audit.append(
                registry,
                AuditEvent("chain_repair_refused", person.name, now_iso(), comment="; ".join(reasons)[:4000]),
            )
            raise RepairRefused(reasons)
        assert key is not None  # refused above without one
        _apply(registry, plan)
        when = now_iso()
        left = store_order(registry.search_runs(AUDIT_EXPERIMENT, fresh=True))
        acknowledged = [{"seq": a.seq, "sha256": a.sha256, "where": a.where} for a in plan.acknowledged]
        record = {
            "store": plan.store,
            "sealed": audit.seal(left),
            "seq": plan.next_seq,
            "break": plan.found[:600],
            "set_aside": {
                "count": len(plan.set_aside),
                "sha256": _digest(run for run, _ in plan.set_aside),
                "entries": [_summary(run, why) for run, why in plan.set_aside[:LISTED]],
            },
            "restored": [_summary(run, f"status put back to {status}") for run, status in plan.restored[:LISTED]],
            "acknowledged": acknowledged,
            "identity": plan.identity,
        }
        payload = audit.repair_payload(record, person.name, comment)
        fingerprint, signature = key.sign(payload)
        evidence = {"repair": record, "signed": {"key": fingerprint, "signature": signature}, "actor": person.to_dict()}
        entry = audit.append(
            registry,
            AuditEvent(REPAIR, person.name, when, comment=comment, evidence=evidence),
            seq_floor=plan.next_seq,
            start_floor=plan.start_floor,
        )
    after = audit.verify(registry, witness)
    if not after.ok:
        raise RegistryError(
            f"the repair was recorded as #{entry.seq}, but the chain still does not verify: {after.summary()}"
        )
    return Repair(
        entry,
        plan.found,
        [_summary(run, why) for run, why in plan.set_aside],
        [_summary(run, f"status put back to {status}") for run, status in plan.restored],
        acknowledged,
        plan.identity,
    )


def _refusals(roles: Roles, person: Actor, key: Any, comment: str, plan: Plan) -> list[str]:
    """Why this repair may not be done by `person` (empty when it may)."""
    reasons = [] if comment else ["a repair needs a comment saying what was checked (empty or whitespace is not one)"]
    problem = audit.on_call_problem(roles, person.name)
    reasons += [problem] if problem else []
    if key is None:
        reasons.append(
            f"{person.name} has no personal key in this keys folder (`unmask keys init --name {person.name}`): a "
            "repair counts only signed"
        )
    else:  # the key must be one the roles file lists for them now
        probe = audit.repair_payload({"probe": True}, person.name, comment)
        fingerprint, signature = key.sign(probe)
        signed = roles.signature_problem(
            "the chain repair", person.name, probe, fingerprint, signature, now_iso(), "production"
        )
        reasons += [signed] if signed else []
    if plan.chained and len(plan.set_aside) >= plan.chained:
        reasons.append(
            f"it would set aside every one of the {plan.chained} chained entries: the key ring here "
            "cannot be the one that signed them (restore the store's keys folder, docs/team-setup.md)"
        )
    return reasons


def _experiment(registry: Registry) -> str:
    return registry.experiment_id(AUDIT_EXPERIMENT)


def _plan(registry: Registry, found: str, witness: Anchor | None, ring: signing.KeyRing) -> Plan:
    """Which entries to set aside and which statuses to put back, read from the store as it is now."""
    tags_now = registry.direct.get_experiment(_experiment(registry)).tags
    store = tags_now.get(STORE, "")
    runs = store_order(registry.search_runs(AUDIT_EXPERIMENT, fresh=True))
    first = next((i for i, r in enumerate(runs) if SHA in r.data.tags), len(runs))
    named = next((r.data.tags[CHAIN_STORE] for r in runs[first:] if r.data.tags.get(CHAIN_STORE)), "")
    identity = named or store
    kept_anchors = [a for a in (signing.local_anchor(registry.tracking_uri, identity), witness) if a is not None]
    anchors = list({(a.seq, a.sha256): a for a in reversed(kept_anchors)}.values())  # one head, once (the witness)
    signed = [s for r in runs[first:] if r.data.tags.get(SIG) and (s := seq_of(r)) is not None]
    since = signing.signed_since(registry.tracking_uri, identity)
    signed_from = min([a.seq for a in anchors] + signed + ([since] if since is not None else []), default=None)
    set_aside: list[tuple[Run, str]] = []
    restored: list[tuple[Run, str]] = []
    for run in runs[first:]:
        why, status = _verdict(run, identity, ring, signed_from)
        if why:
            set_aside.append((run, why))
        elif status:
            restored.append((run, status))
    aside = {run.info.run_id for run, _ in set_aside}
    kept = [r for r in runs if r.info.run_id not in aside]
    kept_heads = {(seq_of(r), r.data.tags.get(SHA)) for r in kept}
    head = tags_now.get(HEAD, "").split(":", 1)[0]
    numbers = [s for r in runs if (s := seq_of(r)) is not None] + [a.seq for a in anchors]
    numbers += [int(head)] if head.isdigit() else []
    return Plan(
        found,
        set_aside,
        restored,
        identity if identity != store else "",
        [a for a in anchors if (a.seq, a.sha256) not in kept_heads],
        max(numbers, default=0) + 1,
        max((r.info.start_time for r in kept), default=0) + 1,
        sum(1 for r in runs[first:] if SHA in r.data.tags),
        identity,
    )


def _verdict(run: Run, identity: str, ring: signing.KeyRing, signed_from: int | None) -> tuple[str, str]:
    """(why `run` is set aside, "") or ("", the status to put back) or ("", "") when it stays as it is."""
    tags, seq = run.data.tags, seq_of(run)
    if SHA not in tags or seq is None:
        return "it carries no chain hash, among chained entries", ""
    if tags.get(CHAIN_STORE) and identity and tags[CHAIN_STORE] != identity:
        return f"it names store {tags[CHAIN_STORE]}, not this one ({identity})", ""
    if not audit.hashes(tags, seq):
        return "what it says no longer matches its sha256", ""
    forged = audit.unsigned(tags, seq, ring, signed_from)
    if forged:
        if tags.get(SIG) and ring.newer_than(tags.get(model_tag("when"), "")):
            raise RepairRefused(
                [
                    f"the key ring here ({ring.source}) was made after entry #{seq} was signed, so it cannot check "
                    "the chain: restore the store's keys folder (docs/team-setup.md), then verify again"
                ]
            )
        return forged, ""
    status = run.info.status
    if not audit.status_changed(tags, status):
        return "", ""
    settled = tags.get(SETTLED)
    if settled and tags.get(SETTLED_SHA) != audit.settle_sha256(tags[SHA], settled):
        return "its outcome tags were changed: what it ended as cannot be told", ""
    if tags.get(model_tag("event")) == MOVE:
        return "", settled or "RUNNING"  # settled: its outcome; never settled: an intent, which recovery settles
    return ("it was given an outcome, and only moves are settled", "") if settled else ("", "FINISHED")


def _apply(registry: Registry, plan: Plan) -> None:
    client = registry.direct
    for run, _ in plan.set_aside:
        retry_busy(client.delete_run, run.info.run_id)
    for run, status in plan.restored:
        retry_busy(client.update_run, run.info.run_id, status=status)
    if plan.identity:
        retry_busy(client.set_experiment_tag, _experiment(registry), STORE, plan.identity)
        audit.forget_identity(registry)


def _summary(run: Run, why: str) -> dict[str, Any]:
    tags = run.data.tags
    return {
        "run_id": run.info.run_id,
        "seq": seq_of(run),
        "event": tags.get(model_tag("event"), ""),
        "when": tags.get(model_tag("when"), ""),
        "stage": tags.get(model_tag("stage"), ""),
        "to": tags.get(model_tag("to"), ""),
        "why": why[:300],
    }


def _digest(runs: Any) -> str:
    """One hash over every set-aside entry as it was when set aside (its run id and what it said)."""
    return hashlib.sha256(
        b"\n".join(audit.canonical(r.data.tags, seq_of(r) or 0, r.info.run_id) for r in runs)
    ).hexdigest()
