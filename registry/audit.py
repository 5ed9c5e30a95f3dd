"""The append-only audit trail: every alias move, approval, sign-off and refusal, as an MLflow run.

Each event is one run in the `unmask-audit` experiment whose tags say what happened (event, who,
when, model, version, stage, from, to, comment, evidence as JSON). Events are only ever added; the
one state change is how an alias move ends: a move is written first as a RUNNING run (the intent),
and becomes FINISHED once the alias has moved, or FAILED when it did not. A RUNNING move left by
a crash is settled by `registry.promotion.recover` (forward if the alias moved, else FAILED).
Living in MLflow, the trail is shared by everyone who shares the store (SQLite file or server).

The trail is a hash chain (docs/integrity.md). Each event is numbered (`seq`) and carries the sha256 of
the event before it and its own, over a canonical serialisation of what it says (sorted-key JSON of
actor, event, model, version, stage, from, to, comment, evidence, time, seq and the previous hash, as
stored). Appends are serialised ("read the last, write the next" under a lock every writer of the
store shares), so two writers cannot fork the chain. A move's status is excluded from its hash by
design, since it changes once after the append: `settle` records the outcome as its own tags, hashed
onto the entry's hash, so the status cannot be changed unnoticed either. `verify` recomputes the chain
and names the first entry that was edited, removed, reordered or inserted.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from mlflow.entities import Run, RunTag, ViewType

from gates.roles import Roles, RolesError, load_roles
from registry import signing
from registry.chain_lock import chain_locked
from registry.connection import AUDIT_EXPERIMENT, RegistryError
from registry.signing import Anchor
from registry.store import Registry, filter_literal, model_tag, now_iso, retry_busy

EVENTS = (
    "alias_move",
    "approval",
    "signoff",
    "promotion_refused",
    "rollback_refused",
    "gate_evaluation",
    "integrity_finding",
    # governance (registry/approvals.py, registry/identity.py): each decision on an approval, and refusals
    "promotion_request",
    "approval_refused",
    "approval_consumed",
    "approval_expired",
    "approval_void",
    "decline",
    "identity_refused",
    "signoff_refused",
    "emergency_rollback",
    # rollouts (flows/rollout.py): a canary started, rolled back by its analysis, aborted by a person
    "rollout_start",
    "rollout_rollback",
    "rollout_abort",
    # evidence and decisions (registry/tracking.py, registry/judging.py, flows/rollout.py): a version registered or
    # re-pointed at new evidence, a stage's verdict changed, a rollout step judged by its canary analysis
    "evidence_registered",
    "decision_changed",
    "rollout_step",
    # a person's key vouching for evidence registered before it could be signed (`unmask migrate`), or refused
    "evidence_vouched",
    "vouch_refused",
    # the on-call person's signed repair of a broken chain (registry/repair.py: `unmask audit --repair`), or refused
    "chain_repair",
    "chain_repair_refused",
    # a version's weights uploaded for serving hosts that lack its folder (registry/weights.py: `unmask weights push`)
    "weights_pushed",
)
MOVE = "alias_move"
REPAIR = "chain_repair"


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
    seq: int = 0  # its place in the hash chain (1 is the first); 0: written before the chain existed
    sha256: str = ""  # its chain hash ("" before the chain existed)
    signature: str = ""  # "<key id>:<hmac>" of its place and hash under the store's signing key (SIG)

    def to_dict(self) -> dict[str, Any]:
        return {
            "when": self.when,
            "event": self.event,
            "who": self.who,
            "stage": self.stage,
            "model": self.model,
            "version": self.version,
            "from": self.from_ref,
            "to": self.to_ref,
            "comment": self.comment,
            "status": self.status,
            "evidence": self.evidence,
            "audit_run_id": self.run_id,
            "seq": self.seq,
            "sha256": self.sha256,
        }


def ref(model: str | None, version: str | None) -> str:
    return f"{model}@{version}" if model and version else ""


def parse_ref(text: str) -> tuple[str, str] | None:
    if not text:
        return None
    model, _, version = text.rpartition("@")
    return model, version


# the chain's tags on each audit run, and the head kept on the audit experiment (see `verify`)
SEQ, PREV, SHA = model_tag("chain.seq"), model_tag("chain.prev"), model_tag("chain.sha256")
SETTLED, SETTLED_SHA = model_tag("chain.settled"), model_tag("chain.settled_sha256")
HEAD = model_tag("chain.head")  # "seq:sha256" of the newest entry: a removed tail shows against it
SIG = model_tag("chain.sig")  # "<key id>:<hmac>" of "seq:sha256" under the signing key (registry/signing.py)
GENESIS = "0" * 64  # the previous hash of the first entry of a store that had no events before the chain
STORE = model_tag("store_id")  # the store's identity, on the audit experiment: the same under any URI, or copied
CHAIN_STORE = model_tag("chain.store")  # the identity each entry was written in (hashed: an entry names its store)
FIELDS = {
    "actor": "who",
    "event": "event",
    "model": "model",
    "version": "version",
    "stage": "stage",
    "from": "from",
    "to": "to",
    "comment": "comment",
    "evidence": "evidence",
    "time": "when",
}  # hashed name -> tag key


def canonical(tags: Mapping[str, str], seq: int, prev_sha256: str) -> bytes:
    """The bytes an entry's hash covers: what it says, as stored, with its place and the hash before it."""
    body: dict[str, str | int] = {name: tags.get(model_tag(key), "") for name, key in FIELDS.items()}
    body |= {"seq": seq, "prev_sha256": prev_sha256}
    if tags.get(CHAIN_STORE):  # entries written before stores had an identity hash without it
        body["store"] = tags[CHAIN_STORE]
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def entry_sha256(tags: Mapping[str, str], seq: int, prev_sha256: str) -> str:
    return hashlib.sha256(canonical(tags, seq, prev_sha256)).hexdigest()


def settle_sha256(entry_sha: str, status: str) -> str:
    """The hash that ties a move's outcome (FINISHED or FAILED) to its chain entry."""
    return hashlib.sha256(f"{entry_sha}:{status}".encode()).hexdigest()


def seal(legacy: list[Run]) -> str:
    """The first chained entry's previous hash: GENESIS, or a hash over the entries written before the chain
    existed (so they cannot be edited, removed or added to unnoticed either, once the chain starts)."""
    if not legacy:
        return GENESIS
    return hashlib.sha256(b"\n".join(canonical(r.data.tags, 0, r.info.run_id) for r in legacy)).hexdigest()


@dataclass(frozen=True)
class Tail:
    """The chain's newest entry, as the next append builds on it."""

    seq: int
    sha256: str
    start_time: int


_holding = threading.local()  # per thread: {tracking URI: the tail it appended last while holding the chain's lock}


def _held_tails() -> dict[str, Tail | None]:
    tails: dict[str, Tail | None] = _holding.__dict__.setdefault("tails", {})
    return tails


@contextmanager
def appending(registry: Registry) -> Iterator[None]:
    """Hold the chain's lock across the appends of one action: each builds on the one before without reading the
    trail's tail again, and no other writer's entry comes between them. Inside a block that holds it already
    (this thread, this store) it is not taken again."""
    held = _held_tails()
    if registry.tracking_uri in held:
        yield
        return
    views: dict[str, object] = _holding.__dict__.setdefault("views", {})
    with chain_locked(registry):
        held[registry.tracking_uri] = None
        views[registry.tracking_uri] = registry.client if registry.snapshot else None  # what was read before it
        try:
            yield
        finally:
            del held[registry.tracking_uri], views[registry.tracking_uri]


def _read_under_lock(registry: Registry) -> bool:
    """Whether this thread's snapshot began after it took the chain's lock, so its read of the trail is the trail
    as it is (no other writer appends while the lock is held)."""
    views: dict[str, object] = _holding.__dict__.get("views", {})
    return registry.snapshot and registry.tracking_uri in views and registry.client is not views[registry.tracking_uri]


def _last_chained(registry: Registry) -> Run | None:
    """The newest entry that carries a chain hash (an unchained one after it was inserted: not built on)."""
    runs = registry.direct.search_runs(  # the tail as it is now, under the chain lock: never a snapshot's
        [registry.experiment_id(AUDIT_EXPERIMENT)],
        f"tags.`{SHA}` LIKE '%'",
        ViewType.ACTIVE_ONLY,
        max_results=1,
        order_by=["attributes.start_time DESC"],
    )
    return runs[0] if runs else None


def _newest_chained(registry: Registry) -> Run | None:
    """`_last_chained` picked from a snapshot's read of the whole trail (made under the chain's lock)."""
    chained = [r for r in registry.search_runs(AUDIT_EXPERIMENT) if SHA in r.data.tags]
    return max(chained, key=lambda r: r.info.start_time, default=None)


_identities: dict[tuple[str, str], str] = {}  # (tracking URI, experiment) -> the store's identity, read once


def forget_identity(registry: Registry) -> None:
    """Read the store's identity again at the next write (a repair put a removed or changed one back)."""
    _identities.pop((registry.tracking_uri, registry.experiment_id(AUDIT_EXPERIMENT)), None)


def store_identity(registry: Registry, experiment: str) -> str:
    """The store's identity (a uuid4 kept on the audit experiment), made on the first write that needs it."""
    key = (registry.tracking_uri, experiment)
    if key not in _identities:
        found = registry.client.get_experiment(experiment).tags.get(STORE, "")
        if not found:
            found = uuid.uuid4().hex
            retry_busy(registry.client.set_experiment_tag, experiment, STORE, found)
        _identities[key] = found
    return _identities[key]


def append(
    registry: Registry, event: AuditEvent, open_intent: bool = False, seq_floor: int = 0, start_floor: int = 0
) -> AuditEvent:
    """Write one event as the chain's next entry. With `open_intent`, the run stays RUNNING until `settle` ends it.
    `seq_floor`, `start_floor`: the least chain number and start time (ms) it may take (a repair numbers its entry
    past every number the chain ever used, and starts it after every entry it seals)."""
    if event.event not in EVENTS:
        raise ValueError(f"unknown audit event {event.event!r}; expected one of {', '.join(EVENTS)}")
    when = event.when or now_iso()
    tags = {
        model_tag("event"): event.event,
        model_tag("who"): event.who,
        model_tag("when"): when,
        model_tag("stage"): event.stage,
        model_tag("model"): event.model,
        model_tag("version"): event.version,
        model_tag("from"): event.from_ref,
        model_tag("to"): event.to_ref,
        model_tag("comment"): event.comment[:5000],
        model_tag("evidence"): json.dumps(event.evidence, sort_keys=True, default=str)[:7900],
    }
    experiment = registry.experiment_id(AUDIT_EXPERIMENT)
    held = _held_tails()
    with appending(registry):
        store = store_identity(registry, experiment)
        tags[CHAIN_STORE] = store
        tail = held[registry.tracking_uri]  # the entry this thread appended under the lock it still holds, else read
        if tail is None:
            last = _newest_chained(registry) if _read_under_lock(registry) else _last_chained(registry)
            if last is not None:
                tail = Tail(int(last.data.tags[SEQ]), last.data.tags[SHA], last.info.start_time)
        start = int(time.time() * 1000)
        if tail is None:
            seq, prev = 1, seal(list(registry.search_runs(AUDIT_EXPERIMENT, fresh=True)))
        else:  # the store's order is the chain's: each entry starts strictly after the one before
            seq, prev = tail.seq + 1, tail.sha256
            start = max(start, tail.start_time + 1)
        seq, start = max(seq, seq_floor), max(start, start_floor)
        sha = entry_sha256(tags, seq, prev)
        signed = signing.key_ring(registry.tracking_uri).sign(signing.head_message(seq, sha))
        tags |= {SEQ: str(seq), PREV: prev, SHA: sha, SIG: signed}
        held[registry.tracking_uri] = None  # until this entry is written: a failed write leaves the tail to be read
        run = retry_busy(
            registry.client.create_run,
            experiment,
            start_time=start,
            tags=tags,
            run_name=f"{event.event} {event.stage} {event.to_ref or event.model}".strip(),
        )
        retry_busy(registry.client.set_experiment_tag, experiment, HEAD, f"{seq}:{sha}")
        held[registry.tracking_uri] = Tail(seq, sha, start)
        signing.remember(registry.tracking_uri, Anchor(seq, sha, signed, store=store), store)
    if not open_intent:
        retry_busy(registry.client.set_terminated, run.info.run_id, "FINISHED")
    status = "RUNNING" if open_intent else "FINISHED"
    return AuditEvent(
        **{**event.__dict__, "when": when, "status": status, "run_id": run.info.run_id, "seq": seq, "sha256": sha}
    )


def settle(registry: Registry, event: AuditEvent, happened: bool) -> None:
    """End a move's intent: FINISHED when the alias moved, else FAILED, the outcome hashed onto its entry."""
    status = "FINISHED" if happened else "FAILED"
    if event.sha256:  # an intent written before the chain existed has nothing to tie the outcome to
        outcome = [RunTag(SETTLED, status), RunTag(SETTLED_SHA, settle_sha256(event.sha256, status))]
        retry_busy(registry.client.log_batch, event.run_id, tags=outcome)
    retry_busy(registry.client.set_terminated, event.run_id, status)


def _from_run(run: Run) -> AuditEvent:
    t = run.data.tags
    try:
        evidence = json.loads(t.get(model_tag("evidence")) or "{}")
    except json.JSONDecodeError:
        evidence = {"raw": t.get(model_tag("evidence"))}  # cut at MLflow's tag limit
    return AuditEvent(
        event=t.get(model_tag("event"), ""),
        who=t.get(model_tag("who"), ""),
        when=t.get(model_tag("when"), ""),
        stage=t.get(model_tag("stage"), ""),
        model=t.get(model_tag("model"), ""),
        version=t.get(model_tag("version"), ""),
        from_ref=t.get(model_tag("from"), ""),
        to_ref=t.get(model_tag("to"), ""),
        comment=t.get(model_tag("comment"), ""),
        evidence=evidence,
        status=run.info.status,
        run_id=run.info.run_id,
        seq=int(t[SEQ]) if str(t.get(SEQ, "")).isdigit() else 0,
        sha256=t.get(SHA, ""),
        signature=t.get(SIG, ""),
    )


def events(
    registry: Registry,
    model: str | None = None,
    stage: str | None = None,
    event: str | None = None,
    status: str | None = None,
) -> list[AuditEvent]:
    """Audit events, oldest first, optionally for one model, stage, kind of event or run status.

    In a snapshot (`Registry.reading()`) they are picked from its one read of the whole trail, which the chain's
    verification reads anyway; else the store filters them."""
    if registry.snapshot:
        found = [
            e
            for e in map(_from_run, registry.search_runs(AUDIT_EXPERIMENT))
            if _about(e, model)
            and (not stage or e.stage == stage)
            and (not event or e.event == event)
            and (not status or e.status == status)
        ]
        return sorted(found, key=lambda e: (e.when, e.run_id))
    filters = []
    for key, value in (("model", model), ("stage", stage), ("event", event)):
        if value:
            filters.append(f"tags.`{model_tag(key)}` = {filter_literal(value, key)}")
    if status:
        filters.append(f"attributes.status = {filter_literal(status, 'status')}")
    found = [_from_run(r) for r in registry.search_runs(AUDIT_EXPERIMENT, " and ".join(filters))]
    if model:  # a move touching a model as its previous holder belongs to its history too
        found += [
            e
            for e in (
                _from_run(r) for r in registry.search_runs(AUDIT_EXPERIMENT, f"tags.`{model_tag('event')}` = '{MOVE}'")
            )
            if e.model != model
            and _about(e, model)
            and (not stage or e.stage == stage)
            and (not status or e.status == status)
        ]
    return sorted(found, key=lambda e: (e.when, e.run_id))


def _about(e: AuditEvent, model: str | None) -> bool:
    """Whether an event belongs to `model`'s history: its own, or a move that took a stage from it."""
    return not model or e.model == model or (e.event == MOVE and (parse_ref(e.from_ref) or ("",))[0] == model)


def last_settled_move(registry: Registry, stage: str) -> AuditEvent | None:
    """The newest FINISHED alias move of a stage: one query, however long the trail grows (in a snapshot, picked
    from its read of the whole trail, in the same order)."""
    if registry.snapshot:
        settled = [
            r
            for r in registry.search_runs(AUDIT_EXPERIMENT)
            if r.info.status == "FINISHED"
            and r.data.tags.get(model_tag("stage")) == stage
            and r.data.tags.get(model_tag("event")) == MOVE
        ]
        newest = max(settled, key=lambda r: (r.info.start_time, r.data.tags.get(model_tag("when"), "")), default=None)
        return _from_run(newest) if newest is not None else None
    runs = registry.client.search_runs(
        [registry.experiment_id(AUDIT_EXPERIMENT)],
        f"tags.`{model_tag('stage')}` = {filter_literal(stage, 'stage')} and tags.`{model_tag('event')}` = '{MOVE}' "
        "and attributes.status = 'FINISHED'",
        ViewType.ACTIVE_ONLY,
        max_results=1,
        order_by=["attributes.start_time DESC", f"tags.`{model_tag('when')}` DESC"],
    )
    return _from_run(runs[0]) if runs else None


def pending_moves(registry: Registry, stage: str | None = None) -> list[AuditEvent]:
    """Alias moves whose intent was written but never settled (in flight, or interrupted)."""
    return events(registry, stage=stage, event=MOVE, status="RUNNING")


# verification ------------------------------------------------------------------------------------------
EDITED, REMOVED, REORDERED, INSERTED = "edited", "removed", "reordered", "inserted"
FORGED, TRUNCATED, REWRITTEN = "forged", "truncated", "rewritten"  # against the key ring and signed heads
INTACT, BROKEN, EMPTY, UNCHAINED = "intact", "broken", "empty", "unchained"


@dataclass(frozen=True)
class ChainBreak:
    """The first place the chain does not hold: what happened there and to which entry."""

    kind: str  # edited | removed | reordered | inserted | forged (signature) | truncated | rewritten (anchor)
    position: int  # 1-based place in the store's order (by start time) of the entry named
    run_id: str
    seq: int | None  # the chain number the entry carries (None: it carries none)
    event: str
    when: str
    detail: str

    def __str__(self) -> str:
        number = f"#{self.seq}" if self.seq is not None else "without a chain number"
        return (
            f"entry {self.position} ({number}, {self.event or '?'} at {self.when or '?'}, audit run "
            f"{self.run_id}) was {self.kind}: {self.detail}"
        )


@dataclass(frozen=True)
class ChainReport:
    """What `verify` found: intact, broken (with the first break), empty, or unchained (no chained entry yet)."""

    status: str
    entries: int  # active audit runs in the store
    chained: int  # of those, the ones with a chain hash
    legacy: int  # entries written before the chain existed (sealed into its first entry's previous hash)
    head_seq: int
    head_sha256: str
    starts_at: dict[str, Any] | None = None  # the first chained entry: position, run_id, when
    first_break: ChainBreak | None = None
    anchor: str = ""  # the signed head ("unmask-chain-anchor:seq:sha256:key:mac"), "" when the head is unsigned
    store: str = ""  # the store's identity (STORE), "" before its first entry named one
    repair: dict[str, Any] | None = None  # the newest repair the chain is linked from: seq, who, when, set aside

    @property
    def ok(self) -> bool:
        return self.status != BROKEN

    def summary(self) -> str:
        if self.status == EMPTY:
            return "audit chain: empty (no audit events yet)"
        if self.status == UNCHAINED:
            return (
                f"audit chain: not started; the {self.entries} audit event(s) were written before the chain "
                "existed (the next event starts it and seals them)"
            )
        start = self.starts_at or {}
        where = (
            f"; it starts at entry {start.get('position')} ({start.get('when')}), sealing {self.legacy} earlier "
            "unchained event(s)"
            if self.legacy
            else ""
        )
        if self.repair:
            r = self.repair
            where += (
                f"; repaired at #{r['seq']} by {r['who']} ({r['when'][:19]}), {r['set_aside']} entr"
                f"{'y' if r['set_aside'] == 1 else 'ies'} set aside"
                + ("" if r.get("signature_checked") else " (the repairer's signature not checked: no keys listed here)")
            )
        if self.status == INTACT:
            return (
                f"audit chain: intact, {self.chained} entries, head #{self.head_seq} sha256 "
                f"{self.head_sha256[:16]}{where}"
            )
        return f"audit chain: BROKEN at {self.first_break}{where}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data |= {
            "ok": self.ok,
            "summary": self.summary(),
            "first_break": asdict(self.first_break) | {"text": str(self.first_break)} if self.first_break else None,
        }
        return data


def verify(registry: Registry, anchor: Anchor | None = None) -> ChainReport:
    """Recompute the audit chain over the store's active audit runs, in the store's order, and name the first
    entry that was edited, removed, reordered or inserted (through the MLflow client or in the store itself),
    or signed by no key of the ring (forged), then check it against this machine's signed head and `anchor`
    (one kept outside the store): an entry of theirs missing is a truncation, a different hash a rewrite.

    In a snapshot (`Registry.reading`) the entries may have been read before another writer appended and moved
    this machine's anchor, which is read now: a break found there is read again from the store before it counts."""
    report = _verified(registry, anchor)
    if report.ok or not registry.snapshot:
        return report
    with registry.asking():
        return _verified(registry, anchor)


def _verified(registry: Registry, anchor: Anchor | None) -> ChainReport:
    # Read in the reverse of the order `append` writes (entry, then the head tag, then this machine's anchor): the
    # entries read last hold every one a head or anchor read before them names, so an append under way is never
    # mistaken for a removed entry (the head naming #n before the runs read show it).
    found = registry.experiment_named(AUDIT_EXPERIMENT)
    experiment_tags = found.tags if found is not None else {}
    head_tag, store = experiment_tags.get(HEAD, ""), experiment_tags.get(STORE, "")
    if anchor is not None and anchor.store and store and anchor.store != store:
        raise RegistryError(
            f"{anchor.where or 'the witness'} is the signed head of store {anchor.store}, not of this one ({store} at "
            f"{registry.tracking_uri}): another store's witness, which says nothing about this chain"
        )
    anchors = [a for a in (signing.local_anchor(registry.tracking_uri, store), anchor) if a is not None]
    runs = store_order(registry.search_runs(AUDIT_EXPERIMENT))
    chained = [r for r in runs if SHA in r.data.tags]
    first = next((i for i, r in enumerate(runs) if SHA in r.data.tags), None)
    if first is None and anchors:  # every chained entry gone, though a signed head of the chain was kept
        gone = ChainBreak(
            TRUNCATED,
            len(runs),
            runs[-1].info.run_id if runs else "",
            None,
            "",
            "",
            f"the store holds no chained entry, but the signed head in {anchors[0].where or 'the anchor'}"
            f" is #{anchors[0].seq} ({anchors[0].sha256[:16]}): the chain was removed",
        )
        return ChainReport(BROKEN, len(runs), 0, len(runs), 0, "", None, gone)
    if first is None:
        return ChainReport(EMPTY if not runs else UNCHAINED, len(runs), 0, len(runs), 0, "")
    start = {
        "position": first + 1,
        "run_id": runs[first].info.run_id,
        "when": runs[first].data.tags.get(model_tag("when"), ""),
    }
    ring = signing.key_ring(registry.tracking_uri)
    since = signing.signed_since(registry.tracking_uri, store)
    base = _repair_at(runs, first)
    repaired: dict[str, Any] = {}
    if base is None:
        found = _first_break(runs, first, head_tag, ring, anchors, since)
    else:  # the newest repair seals what came before it; the chain is linked from it on
        found, repaired = _repair_break(runs, first, base)
        link = (runs[base].data.tags.get(PREV, ""), seq_of(runs[base]) or 0)
        found = found or _first_break(runs, base, head_tag, ring, anchors, since, link)
    acknowledged = {(a.get("seq"), a.get("sha256")) for a in repaired.get("acknowledged", [])}
    found = found or _identity_break(runs, first, store) or _anchor_break(runs, chained, anchors, ring, acknowledged)
    last = chained[-1].data.tags
    head = (
        Anchor(seq_of(chained[-1]) or 0, last.get(SHA, ""), last.get(SIG, ""), store=store) if last.get(SIG) else None
    )
    if head is not None and found is None:
        signing.remember(
            registry.tracking_uri, head, store
        )  # what this machine has seen verify: a later truncation shows
    return ChainReport(
        BROKEN if found else INTACT,
        len(runs),
        len(chained),
        first,
        seq_of(chained[-1]) or 0,
        last.get(SHA, ""),
        start,
        found,
        str(head) if head else "",
        store,
        _repair_said(runs[base], repaired) if base is not None else None,
    )


def store_order(runs: Iterable[Run]) -> list[Run]:
    """Audit runs in the store's order, the one `verify` reads the chain in: by start time, then chain number."""
    return sorted(runs, key=lambda r: (r.info.start_time, seq_of(r) or 0, r.info.run_id))


def seq_of(run: Run) -> int | None:
    """The chain number an entry carries (None: it carries none)."""
    text = run.data.tags.get(SEQ, "")
    return int(text) if text.isdigit() else None


def _named(runs: list[Run], kind: str, i: int, detail: str) -> ChainBreak:
    r = runs[i]
    return ChainBreak(
        kind,
        i + 1,
        r.info.run_id,
        seq_of(r),
        r.data.tags.get(model_tag("event"), ""),
        r.data.tags.get(model_tag("when"), ""),
        detail,
    )


def hashes(tags: Mapping[str, str], seq: int) -> bool:
    """Whether what an entry says still matches its own chain hash."""
    return entry_sha256(tags, seq, tags.get(PREV, "")) == tags.get(SHA)


def unsigned(tags: Mapping[str, str], seq: int, ring: signing.KeyRing, signed_from: int | None) -> str | None:
    """Why an entry's place and hash are not signed by the key ring (None when they are, or when it was written
    before the chain was signed, `signed_from`)."""
    signature = tags.get(SIG, "")
    if signature:
        problem = ring.problem(signing.head_message(seq, tags.get(SHA, "")), signature, tags.get(model_tag("when"), ""))
        if problem:
            return f"its signature {problem}: it was written or rewritten by someone without the signing key"
        return None
    if signed_from is not None and seq >= signed_from:
        return (
            f"it carries no signature, yet the chain is signed from #{signed_from} on: it was "
            "written or rewritten by someone without the signing key"
        )
    return None


def status_changed(tags: Mapping[str, str], status: str) -> str | None:
    """How an entry's run status disagrees with the outcome hashed onto it (None when it agrees): a move's status
    is the outcome it was settled with (RUNNING until then), every other entry's is FINISHED, never settled."""
    settled = tags.get(SETTLED)
    if tags.get(model_tag("event")) == MOVE:
        if status in ("FINISHED", "FAILED") and (
            settled != status or tags.get(SETTLED_SHA) != settle_sha256(tags.get(SHA, ""), status)
        ):
            return f"its status {status} is not the outcome that was settled ({settled or 'none recorded'})"
        if status == "RUNNING" and settled:
            return f"it was settled {settled}, and its status set back to RUNNING"
    elif status == "FAILED" or settled:
        return f"its status was changed to {status} (only moves are settled)"
    return None


def _first_break(
    runs: list[Run],
    first: int,
    head_tag: str,
    ring: signing.KeyRing,
    anchors: list[Anchor],
    signed_since: int | None = None,
    start: tuple[str, int] | None = None,
) -> ChainBreak | None:
    """The first break from entry `first` on: linked from the seal of the entries before it (the chain's start),
    or, with `start` (previous hash, number), from a repair's entry, which seals those before it itself."""

    def named(kind: str, i: int, detail: str) -> ChainBreak:
        return _named(runs, kind, i, detail)

    expected_prev, expected_seq = start or (seal(runs[:first]), 1)
    seen: set[int] = set()
    # signing was on from the first signed entry, at least from any signed head kept outside the store, and from
    # the first entry this machine saw signed (`signing.signed_since`)
    signed_from = min([a.seq for a in anchors] + ([signed_since] if signed_since is not None else []), default=None)
    for i in range(first, len(runs)):
        tags = runs[i].data.tags
        seq = seq_of(runs[i])
        if SHA not in tags or seq is None:
            return named(INSERTED, i, f"it carries no chain hash, yet the chain began at entry {first + 1}")
        if seq in seen:
            return named(INSERTED, i, f"a second entry #{seq}: the chain has one already")
        if seq < expected_seq or (seq > expected_seq and any(seq_of(r) == expected_seq for r in runs[i + 1 :])):
            return named(
                REORDERED, i, f"#{seq} stands where #{expected_seq} belongs; the store's order is not the chain's"
            )
        if seq > expected_seq:
            gap = f"#{expected_seq}" if seq == expected_seq + 1 else f"#{expected_seq} to #{seq - 1}"
            return named(REMOVED, i, f"entry {gap} before it is missing (it follows #{expected_seq - 1})")
        if not hashes(tags, seq):
            return named(EDITED, i, "what it says no longer matches its sha256 (a field was changed)")
        if tags.get(PREV, "") != expected_prev:
            if i == first:
                return named(
                    EDITED,
                    i,
                    f"the {first} event(s) written before the chain began were changed, removed "
                    "or added to since it sealed them"
                    if first
                    else "its previous hash is not the chain's start (an entry was put before it)",
                )
            return named(
                EDITED,
                i - 1,
                f"#{seq} chained onto a different sha256 than this entry has: it was "
                "replaced (its content and hash rewritten)",
            )
        forged = unsigned(tags, seq, ring, signed_from)
        if forged:
            return named(FORGED, i, forged)
        if tags.get(SIG):
            signed_from = seq if signed_from is None else min(signed_from, seq)
        changed = status_changed(tags, runs[i].info.status)
        if changed:
            return named(EDITED, i, changed)
        seen.add(seq)
        expected_prev, expected_seq = tags[SHA], seq + 1
    head_seq = head_tag.split(":", 1)[0]
    if head_seq.isdigit() and int(head_seq) >= expected_seq:
        last = len(runs) - 1
        gap = f"#{expected_seq}" if int(head_seq) == expected_seq else f"#{expected_seq} to #{head_seq}"
        return named(REMOVED, last, f"entry {gap} after it is missing: the chain's head is #{head_seq}")
    return None


def _identity_break(runs: list[Run], first: int, store: str) -> ChainBreak | None:
    """The first entry naming a store other than the one whose identity the audit experiment keeps: the identity
    tag was changed or removed (to lose this machine's anchor, say)."""
    for i in range(first, len(runs)):
        named = runs[i].data.tags.get(CHAIN_STORE, "")
        if named and named != store:
            said = f"says {store}" if store else "is gone"
            return _named(
                runs, EDITED, i, f"it was written in store {named}, but the store's identity tag {said}: it was changed"
            )
    return None


def _anchor_break(
    runs: list[Run],
    chained: list[Run],
    anchors: list[Anchor],
    ring: signing.KeyRing,
    acknowledged: set[tuple[Any, Any]] | None = None,
) -> ChainBreak | None:
    """The chain against signed heads kept outside the store: each one's entry must still be there, unchanged,
    unless a repair acknowledged that head as lost (`acknowledged`: (seq, sha256) pairs)."""
    by_seq = {seq_of(r): r for r in chained}
    for anchor in anchors:
        problem = ring.problem(signing.head_message(anchor.seq, anchor.sha256), anchor.signature)
        if problem:
            raise RegistryError(
                f"the signed chain head in {anchor.where or 'the anchor'} is not signed by the key ring: "
                f"its signature {problem}"
            )
        if (anchor.seq, anchor.sha256) in (acknowledged or set()):
            continue
        entry = by_seq.get(anchor.seq)
        if entry is None:
            last = runs.index(chained[-1])
            return _named(
                runs,
                TRUNCATED,
                last,
                f"the chain ends at #{seq_of(chained[-1])}, but the signed head in "
                f"{anchor.where or 'the anchor'} is #{anchor.seq} "
                f"({anchor.sha256[:16]}): entries after it were removed and the head "
                "reset",
            )
        if entry.data.tags.get(SHA) != anchor.sha256:
            return _named(
                runs,
                REWRITTEN,
                runs.index(entry),
                f"its sha256 is not the one signed in "
                f"{anchor.where or 'the anchor'} ({anchor.sha256[:16]}): "
                "the chain was rewritten up to here",
            )
    return None


# repairs ---------------------------------------------------------------------------------------------------
# A repair (registry/repair.py) sets aside the entries that do not verify on their own, then appends one entry
# signed by an on-call person's key over what it did: the seal of every entry left before it, what it set aside,
# the signed heads it acknowledges as lost. The chain is verified from the newest repair on; before it, the seal.
def repair_payload(repair: Mapping[str, Any], who: str, comment: str) -> dict[str, Any]:
    """What a repairer's key signs: the repair as recorded, who made it and why."""
    return {**repair, "act": REPAIR, "who": who, "comment": comment}


def on_call_problem(roles: Roles, who: str) -> str | None:
    """Why `who` may not repair the chain (None when they may): the on-call person holds emergency_rollback at
    every stage."""
    stages = [stage for stage in roles.stages if not roles.may(who, stage, "emergency_rollback")]
    if not stages:
        return None
    return (
        f"{who} holds no emergency_rollback role at {', '.join(stages)} ({roles.path or roles.source}): only the "
        "on-call person repairs the chain"
    )


def repairer_problem(roles: Roles, who: str, payload: dict[str, Any], key: str, signature: str, at: str) -> str | None:
    """Why a repair is not `who`'s act as the on-call person (None when it is): they are on call, and it is signed
    by a key the roles file lists for them (at `at`: a key revoked since still stands for what it signed before)."""
    return on_call_problem(roles, who) or roles.signature_problem(
        "the chain repair", who, payload, key, signature, at, "production"
    )


def _repair_at(runs: list[Run], first: int) -> int | None:
    """The place of the newest chained repair entry, if any."""
    for i in range(len(runs) - 1, first - 1, -1):
        tags = runs[i].data.tags
        if tags.get(model_tag("event")) == REPAIR and SHA in tags:
            return i
    return None


def _repair_break(runs: list[Run], first: int, base: int) -> tuple[ChainBreak | None, dict[str, Any]]:
    """Whether the repair at `base` holds: its repairer's signature and role, and its seal of the entries before
    it (none changed, removed or added since, no move's status changed); with what it recorded."""
    entry = _from_run(runs[base])
    repair, signed = entry.evidence.get("repair"), entry.evidence.get("signed")
    if not isinstance(repair, dict) or not isinstance(signed, dict):
        return _named(runs, FORGED, base, "a chain repair that carries no repairer's signature"), {}
    payload = repair_payload(repair, entry.who, entry.comment)
    key, signature = str(signed.get("key", "")), str(signed.get("signature", ""))
    try:
        roles = load_roles()
        # where the roles file lists no keys (a serving pod's bundled one) no person's signature can be checked:
        # the repair holds on the ring's signature of its entry and on its seal, and the report says so
        checked = bool(roles.keys)
        problem = repairer_problem(roles, entry.who, payload, key, signature, entry.when) if checked else None
        problem = problem or on_call_problem(roles, entry.who)
    except RolesError as e:
        checked, problem = False, f"the roles file that would check its signature cannot be read ({e})"
    if problem:
        return _named(runs, FORGED, base, f"this repair does not count: {problem}"), repair
    repair = {**repair, "signature_checked": checked}
    if repair.get("seq") != entry.seq:
        return _named(
            runs, EDITED, base, f"this repair was signed as #{repair.get('seq')}, it stands as #{entry.seq}"
        ), {}
    if seal(runs[:base]) != repair.get("sealed"):
        return (
            _named(
                runs,
                EDITED,
                base,
                f"the {base} entries before this repair, which it sealed, were changed, removed or added to since "
                f"(repaired by {entry.who} at {entry.when[:19]})",
            ),
            repair,
        )
    for i in range(first, base):
        changed = SHA in runs[i].data.tags and status_changed(runs[i].data.tags, runs[i].info.status)
        if changed:
            return _named(runs, EDITED, i, f"{changed}, after the repair at #{entry.seq} sealed it"), repair
    return None, repair


def _repair_said(run: Run, repair: Mapping[str, Any]) -> dict[str, Any]:
    """What a report says of the repair the chain is linked from."""
    entry = _from_run(run)
    aside = repair.get("set_aside", {})
    return {
        "seq": entry.seq,
        "who": entry.who,
        "when": entry.when,
        "comment": entry.comment,
        "break": repair.get("break", ""),
        "set_aside": int(aside.get("count", 0)) if isinstance(aside, dict) else 0,
        "acknowledged": len(repair.get("acknowledged", [])),
        "signature_checked": bool(repair.get("signature_checked")),
        "run_id": run.info.run_id,
    }
