"""The append-only audit trail: every alias move, approval, sign-off and refusal, as an MLflow run.

Each event is one run in the `unmask-audit` experiment whose tags say what happened (event, who,
when, model, version, stage, from, to, comment, evidence as JSON). Events are only ever added; the
one state change is how an alias move ends: a move is written first as a RUNNING run (the intent),
and becomes FINISHED once the alias has moved, or FAILED when it did not. A RUNNING move left by
a crash is settled by `registry.promotion.recover` (forward if the alias moved, else FAILED).
Living in MLflow, the trail is shared by everyone who shares the store (SQLite file or server).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mlflow.entities import Run, ViewType

from registry.connection import AUDIT_EXPERIMENT
from registry.store import Registry, filter_literal, model_tag, now_iso

EVENTS = ("alias_move", "approval", "signoff", "promotion_refused", "rollback_refused", "gate_evaluation",
          "integrity_finding",
          # governance (registry/approvals.py, registry/identity.py): each decision on an approval, and refusals
          "promotion_request", "approval_refused", "approval_consumed", "approval_expired", "approval_void", "decline",
          "identity_refused", "signoff_refused", "emergency_rollback")
MOVE = "alias_move"


@dataclass(frozen=True)
class AuditEvent:
    event: str
    who: str
    when: str
    stage: str = ""
    model: str = ""
    version: str = ""
    from_ref: str = ""  # "model@version" that held the alias before, or ""
    to_ref: str = ""  # "model@version" that holds it after, or ""
    comment: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    status: str = "FINISHED"  # FINISHED; for moves also RUNNING (in flight or interrupted) and FAILED
    run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"when": self.when, "event": self.event, "who": self.who, "stage": self.stage, "model": self.model,
                "version": self.version, "from": self.from_ref, "to": self.to_ref, "comment": self.comment,
                "status": self.status, "evidence": self.evidence, "audit_run_id": self.run_id}


def ref(model: str | None, version: str | None) -> str:
    return f"{model}@{version}" if model and version else ""


def parse_ref(text: str) -> tuple[str, str] | None:
    if not text:
        return None
    model, _, version = text.rpartition("@")
    return model, version


def append(registry: Registry, event: AuditEvent, open_intent: bool = False) -> AuditEvent:
    """Write one event. With `open_intent`, the run stays RUNNING until `settle` ends it."""
    if event.event not in EVENTS:
        raise ValueError(f"unknown audit event {event.event!r}; expected one of {', '.join(EVENTS)}")
    when = event.when or now_iso()
    tags = {model_tag("event"): event.event, model_tag("who"): event.who, model_tag("when"): when,
            model_tag("stage"): event.stage, model_tag("model"): event.model, model_tag("version"): event.version,
            model_tag("from"): event.from_ref, model_tag("to"): event.to_ref, model_tag("comment"): event.comment[:5000],
            model_tag("evidence"): json.dumps(event.evidence, sort_keys=True, default=str)[:7900]}
    run = registry.client.create_run(registry.experiment_id(AUDIT_EXPERIMENT), tags=tags,
                                     run_name=f"{event.event} {event.stage} {event.to_ref or event.model}".strip())
    if not open_intent:
        registry.client.set_terminated(run.info.run_id, "FINISHED")
    status = "RUNNING" if open_intent else "FINISHED"
    return AuditEvent(**{**event.__dict__, "when": when, "status": status, "run_id": run.info.run_id})


def settle(registry: Registry, event: AuditEvent, happened: bool) -> None:
    registry.client.set_terminated(event.run_id, "FINISHED" if happened else "FAILED")


def _from_run(run: Run) -> AuditEvent:
    t = run.data.tags
    try:
        evidence = json.loads(t.get(model_tag("evidence")) or "{}")
    except json.JSONDecodeError:
        evidence = {"raw": t.get(model_tag("evidence"))}  # cut at MLflow's tag limit
    return AuditEvent(event=t.get(model_tag("event"), ""), who=t.get(model_tag("who"), ""),
                      when=t.get(model_tag("when"), ""), stage=t.get(model_tag("stage"), ""),
                      model=t.get(model_tag("model"), ""), version=t.get(model_tag("version"), ""),
                      from_ref=t.get(model_tag("from"), ""), to_ref=t.get(model_tag("to"), ""),
                      comment=t.get(model_tag("comment"), ""), evidence=evidence, status=run.info.status,
                      run_id=run.info.run_id)


def events(registry: Registry, model: str | None = None, stage: str | None = None,
           event: str | None = None, status: str | None = None) -> list[AuditEvent]:
    """Audit events, oldest first, optionally for one model, stage, kind of event or run status."""
    filters = []
    for key, value in (("model", model), ("stage", stage), ("event", event)):
        if value:
            filters.append(f"tags.`{model_tag(key)}` = {filter_literal(value, key)}")
    if status:
        filters.append(f"attributes.status = {filter_literal(status, 'status')}")
    found = [_from_run(r) for r in registry.search_runs(AUDIT_EXPERIMENT, " and ".join(filters))]
    if model:  # a move touching a model as its previous holder belongs to its history too
        found += [e for e in (_from_run(r) for r in registry.search_runs(
            AUDIT_EXPERIMENT, f"tags.`{model_tag('event')}` = '{MOVE}'")) if e.model != model and
            (parse_ref(e.from_ref) or ("",))[0] == model and (not stage or e.stage == stage)
            and (not status or e.status == status)]
    return sorted(found, key=lambda e: (e.when, e.run_id))


def last_settled_move(registry: Registry, stage: str) -> AuditEvent | None:
    """The newest FINISHED alias move of a stage: one query, however long the trail grows."""
    runs = registry.client.search_runs(
        [registry.experiment_id(AUDIT_EXPERIMENT)],
        f"tags.`{model_tag('stage')}` = {filter_literal(stage, 'stage')} and tags.`{model_tag('event')}` = '{MOVE}' "
        "and attributes.status = 'FINISHED'", ViewType.ACTIVE_ONLY, max_results=1,
        order_by=["attributes.start_time DESC", f"tags.`{model_tag('when')}` DESC"])
    return _from_run(runs[0]) if runs else None


def pending_moves(registry: Registry, stage: str | None = None) -> list[AuditEvent]:
    """Alias moves whose intent was written but never settled (in flight, or interrupted)."""
    return events(registry, stage=stage, event=MOVE, status="RUNNING")
