"""The registry's changes as events other systems act on, read from the audit chain.

Every decision-relevant change unmask makes is an entry of the audit chain (registry/audit.py), in chain order
and hashed. `events_since(registry, seq)` turns the entries after `seq` into `Event`s that carry everything a
consumer needs without a second call: model, version, stage, actor, what happened, the move's ends, the version's
evidence run and its experiment, the audit run and its experiment, the entry's chain hash and store signature, and
whether the change is one to deploy (`deployable`). Only a settled alias move says deployable: a promotion moves
an alias only when its decision allowed it, and a rollback's target is what the stage serves now; an approval, a
refused promotion or a failed canary never does.

The chain is the outbox: an event is its entry, so nothing is lost while a receiver is down, and a consumer's
cursor is the `seq` of the last event it took (flows/webhooks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlflow.exceptions import MlflowException

from gates.decision import Outcome
from registry import audit
from registry.audit import MOVE, AuditEvent, parse_ref
from registry.connection import AUDIT_EXPERIMENT, RegistryError
from registry.history import move_approvers, move_how
from registry.store import Registry, model_tag

# what each audit entry is, as a consumer filters on it
TYPES = {
    MOVE: "alias.moved",
    "approval": "approval.recorded",
    "approval_void": "approval.voided",
    "approval_expired": "approval.expired",
    "approval_consumed": "approval.consumed",
    "approval_refused": "approval.refused",
    "decline": "promotion.declined",
    "promotion_request": "promotion.requested",
    "promotion_refused": "promotion.refused",
    "rollback_refused": "rollback.refused",
    "signoff": "signoff.recorded",
    "signoff_refused": "signoff.refused",
    "gate_evaluation": "decision.changed",
    "integrity_finding": "integrity.finding",
    "identity_refused": "identity.refused",
    "emergency_rollback": "rollback.emergency",
    "rollout_start": "rollout.started",
    "rollout_rollback": "canary.failed",
    "rollout_abort": "rollout.aborted",
    "evidence_registered": "evidence.registered",
    "decision_changed": "decision.changed",
    "rollout_step": "rollout.step_judged",
    "evidence_vouched": "evidence.vouched",
    "vouch_refused": "evidence.vouch_refused",
    "chain_repair": "audit.repaired",
    "chain_repair_refused": "audit.repair_refused",
    "weights_pushed": "weights.pushed",
}
SCHEMA = 1


@dataclass(frozen=True)
class Event:
    """One change, as a consumer receives it (`to_dict` is the JSON body of a webhook and a `--follow` line)."""

    id: str  # the audit entry's chain hash: unique, and the same on every delivery (receivers dedupe on it)
    seq: int
    type: str  # TYPES
    at: str
    actor: str
    model: str
    version: str
    stage: str
    summary: str
    deployable: bool
    how: str = ""  # for alias moves: promotion | rollback | emergency rollback | reconcile
    verdict: str = ""  # the decision behind it where the entry records one (adopt for a settled promotion)
    from_ref: str = ""
    to_ref: str = ""
    comment: str = ""
    status: str = ""
    approvals: tuple[str, ...] = ()
    audit: dict[str, str] = field(default_factory=dict)  # run_id, experiment_id, sha256, signature
    evidence: dict[str, str] = field(default_factory=dict)  # run_id, experiment_id of the version's evidence

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "id": self.id,
            "seq": self.seq,
            "type": self.type,
            "at": self.at,
            "actor": self.actor,
            "model": self.model,
            "version": self.version,
            "stage": self.stage,
            "summary": self.summary,
            "deployable": self.deployable,
            "how": self.how,
            "verdict": self.verdict,
            "from": self.from_ref,
            "to": self.to_ref,
            "comment": self.comment,
            "status": self.status,
            "approvals": list(self.approvals),
            "audit": dict(self.audit),
            "evidence": dict(self.evidence),
        }


def _summary(entry: AuditEvent, how: str) -> str:
    what = f"{entry.model} v{entry.version}" if entry.version else entry.model
    if entry.event == MOVE:
        held = parse_ref(entry.to_ref)
        to = f"{held[0]} v{held[1]}" if held else "nobody"
        return f"{entry.stage} moved to {to} ({how or 'move'} by {entry.who}, {entry.status.lower()})"
    if entry.event == "rollout_rollback":
        return (
            f"canary of {what} for {entry.stage} failed and was rolled back; {entry.stage} stayed with {entry.to_ref}"
        )
    said = f" ({entry.comment[:160]})" if entry.comment else ""
    return f"{what or 'the registry'}" + (f" for {entry.stage}" if entry.stage else "") + f" by {entry.who}{said}"


class EventReader:
    """Reads events from one registry, remembering each version's evidence run (one MLflow call per version)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._evidence: dict[tuple[str, str], dict[str, str]] = {}
        self._audit_experiment = ""

    def evidence_of(self, model: str, version: str) -> dict[str, str]:
        key = (model, version)
        if key not in self._evidence:
            found: dict[str, str] = {}
            if model and version:
                try:
                    run_id = self.registry.version_tags(model, version).get(model_tag("evidence_run"), "")
                    if run_id:
                        experiment = self.registry.client.get_run(run_id).info.experiment_id
                        found = {"run_id": run_id, "experiment_id": str(experiment)}
                except (RegistryError, MlflowException):  # a deleted version or run: the event still goes out
                    found = {}
            self._evidence[key] = found
        return self._evidence[key]

    def event(self, entry: AuditEvent) -> Event:
        how = move_how(entry) if entry.event == MOVE else ""
        settled = entry.event == MOVE and entry.status == "FINISHED"
        approvals = move_approvers(entry)
        adopted = Outcome.ADOPT.value if settled and how == "promotion" else ""
        verdict = str(entry.evidence.get("verdict", "")) or adopted
        if not self._audit_experiment:
            self._audit_experiment = self.registry.experiment_id(AUDIT_EXPERIMENT)
        return Event(
            id=entry.sha256 or entry.run_id,
            seq=entry.seq,
            type=TYPES.get(entry.event, entry.event),
            at=entry.when,
            actor=entry.who,
            model=entry.model,
            version=entry.version,
            stage=entry.stage,
            summary=_summary(entry, how),
            deployable=settled and bool(parse_ref(entry.to_ref)),
            how=how,
            verdict=verdict,
            from_ref=entry.from_ref,
            to_ref=entry.to_ref,
            comment=entry.comment,
            status=entry.status,
            approvals=approvals,
            audit={
                "run_id": entry.run_id,
                "experiment_id": self._audit_experiment,
                "sha256": entry.sha256,
                "signature": entry.signature,
            },
            evidence=self.evidence_of(entry.model, entry.version),
        )

    def since(self, seq: int = 0) -> list[Event]:
        """The events of the chained entries after `seq`, in chain order. A move still in flight is held back: its
        entry is settled (FINISHED or FAILED) before it goes out, so a consumer never acts on a move that failed."""
        entries = sorted((e for e in audit.events(self.registry) if e.seq > seq), key=lambda e: e.seq)
        out = []
        for entry in entries:
            if entry.event == MOVE and entry.status == "RUNNING":
                break  # later entries wait for it: events go out in chain order
            out.append(self.event(entry))
        return out


def events_since(registry: Registry, seq: int = 0) -> list[Event]:
    return EventReader(registry).since(seq)
