"""Which version held each stage when: the stage aliases' timeline, read from the audit chain.

Every alias move (promotion, rollback, emergency rollback, reconcile) is an `alias_move` entry of the hash
chain (registry/audit.py) with who moved it, from which holder to which, when, why and the approvals it used. A
stage's settled moves, in chain order, cut time into tenures: from the move that gave a version the alias to the
next move of that stage (or to now). `stage_history` reads them and verifies the chain in the same call; a chain
that does not verify is said so (`StageHistory.verified`, `problem`), never read as if it did.

A move written but never settled (interrupted: `unmask promote` recovers it) changed nothing yet and is listed
apart; a move that failed is no tenure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gates.promotion import move_payload
from gates.roles import Roles
from registry import audit
from registry.audit import MOVE, AuditEvent, ChainReport, parse_ref
from registry.store import STAGE_ALIASES, Registry


class HistoryError(ValueError):
    """A history question that cannot be asked (an unreadable time, an unknown stage): names what and why."""


def parse_time(text: str, option: str = "--at") -> datetime:
    """An ISO 8601 time (a date alone is its midnight UTC; no offset is UTC), or `now`; HistoryError otherwise."""
    if text.strip().lower() == "now":
        return datetime.now(UTC)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise HistoryError(
            f"{option} {text!r}: not a time; give ISO 8601 such as 2026-12-05, 2026-12-05T14:30Z or now"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _time(text: str) -> datetime:
    return parse_time(text, "audit entry time")


@dataclass(frozen=True)
class Tenure:
    """One holder of one stage alias, from the move that gave it the alias until the next move of the stage ("":
    it holds it now). An empty `model` is a stretch when nobody held the stage."""

    stage: str
    model: str
    version: str
    since: str  # ISO time of the move
    until: str  # ISO time of the next move of the stage; "" while it holds
    moved_by: str
    how: str  # promotion | rollback | emergency rollback | reconcile (the move's evidence kind)
    why: str  # the move's comment
    previous: str  # "model@version" that held the stage before ("" when nobody did)
    approvals: tuple[str, ...] = ()  # who approved it (promotions)
    audit_run_id: str = ""
    seq: int = 0
    sha256: str = ""
    key: str = ""  # the fingerprint of the mover's key that signed the move ("" when unsigned)
    signature: str = ""  # whether that signature verifies against the roles file's keys, in words

    @property
    def holder(self) -> str:
        return f"{self.model} v{self.version}" if self.model else "nobody"

    def held_s(self, now: datetime | None = None) -> float:
        """Seconds it held (or has held so far) the stage."""
        end = _time(self.until) if self.until else (now or datetime.now(UTC))
        return max(0.0, (end - _time(self.since)).total_seconds())

    def covers(self, when: datetime) -> bool:
        return _time(self.since) <= when and (not self.until or when < _time(self.until))

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "model": self.model,
            "version": self.version,
            "since": self.since,
            "until": self.until,
            "held_s": round(self.held_s(), 3),
            "moved_by": self.moved_by,
            "how": self.how,
            "why": self.why,
            "previous": self.previous,
            "approvals": list(self.approvals),
            "audit_run_id": self.audit_run_id,
            "seq": self.seq,
            "sha256": self.sha256,
            "key": self.key,
            "signature": self.signature,
        }


CANARY_ENDS = {"rollout_rollback": "canary rollback", "rollout_abort": "canary abort"}


@dataclass(frozen=True)
class CanaryEnd:
    """A rollout that ended without a move: its candidate's weight went back to 0 and the stage alias stayed with
    `holder` (flows/rollout.py). It ends no tenure; it explains one."""

    stage: str
    model: str
    version: str
    when: str
    who: str
    how: str  # canary rollback | canary abort
    why: str
    holder: str  # "model@version" that kept the stage
    audit_run_id: str = ""
    seq: int = 0
    sha256: str = ""

    @classmethod
    def of(cls, e: AuditEvent) -> CanaryEnd:
        return cls(
            e.stage,
            e.model,
            e.version,
            e.when,
            e.who,
            CANARY_ENDS[e.event],
            e.comment,
            e.to_ref,
            e.run_id,
            e.seq,
            e.sha256,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.how,
            "stage": self.stage,
            "model": self.model,
            "version": self.version,
            "since": self.when,
            "moved_by": self.who,
            "how": self.how,
            "why": self.why,
            "previous": self.holder,
            "audit_run_id": self.audit_run_id,
            "seq": self.seq,
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class StageHistory:
    """The tenures asked for (oldest first), the chain's verification they were read under, moves in flight, and
    the canaries that ended without moving the alias."""

    tenures: tuple[Tenure, ...]
    chain: ChainReport
    pending: tuple[AuditEvent, ...] = ()
    canaries: tuple[CanaryEnd, ...] = ()

    def rows(self) -> list[dict[str, Any]]:
        """Tenures and canary ends as one list of dicts, in time order (what CSV and JSON print)."""
        every = [t.to_dict() | {"kind": "tenure"} for t in self.tenures] + [c.to_dict() for c in self.canaries]
        return sorted(every, key=lambda r: (r["since"], r["seq"]))

    @property
    def verified(self) -> bool:
        return self.chain.ok

    @property
    def problem(self) -> str:
        """Why the timeline cannot be trusted ("" when the chain verifies)."""
        if self.verified:
            return ""
        return f"the audit chain does not verify, so this timeline is not evidence: {self.chain.summary()}"

    def at(self, stage: str, when: datetime) -> Tenure | None:
        """The tenure of `stage` covering `when`; None before the stage's first move."""
        return next((t for t in self.tenures if t.stage == stage and t.covers(when)), None)

    def stages(self) -> list[str]:
        return [s for s in STAGE_ALIASES if any(t.stage == s for t in self.tenures)]


def move_how(event: AuditEvent) -> str:
    """How an alias move came about: promotion, rollback, emergency rollback (on a broken chain), reconcile."""
    kind = str(event.evidence.get("kind", "")) or "move"
    return "emergency rollback" if kind == "rollback" and event.evidence.get("broken_chain") else kind


def move_approvers(event: AuditEvent) -> tuple[str, ...]:
    """Who approved the move (the approvals a promotion used)."""
    approvals = event.evidence.get("approvals") or []
    return tuple(str(a.get("by", "")) for a in approvals if isinstance(a, dict) and a.get("by"))


def move_signature(e: AuditEvent, roles: Roles | None) -> tuple[str, str]:
    """(key fingerprint, in words whether the mover's signature over the move holds): checked against the keys
    `roles` lists where it lists any; without them only said to be there."""
    found = e.evidence.get("signed")
    signed: dict[str, Any] = found if isinstance(found, dict) else {}
    key, signature = str(signed.get("key", "")), str(signed.get("signature", ""))
    if roles is None or not roles.keys:
        return key, (f"signed with {key} (no keys listed to check it)" if key else "unsigned")
    payload = move_payload(e.stage, e.from_ref, e.to_ref, e.who, e.when, e.comment)
    problem = roles.signature_problem(
        f"the move of {e.stage} by {e.who} at {e.when}", e.who, payload, key, signature, e.when, e.stage
    )
    return key, problem or f"signed by {e.who}"


def tenures(moves: Iterable[AuditEvent], roles: Roles | None = None) -> list[Tenure]:
    """Every stage's tenures from its settled alias moves: each move starts one, the stage's next move ends it;
    each says whether its mover signed it (`move_signature`)."""
    by_stage: dict[str, list[AuditEvent]] = {}
    for e in moves:
        if e.event == MOVE and e.status == "FINISHED" and e.stage:
            by_stage.setdefault(e.stage, []).append(e)
    out = []
    for stage, stage_moves in by_stage.items():
        ordered = sorted(stage_moves, key=lambda e: (e.seq or 0, e.when, e.run_id))
        for i, e in enumerate(ordered):
            holder = parse_ref(e.to_ref) or ("", "")
            out.append(
                Tenure(
                    stage,
                    holder[0],
                    holder[1],
                    e.when,
                    ordered[i + 1].when if i + 1 < len(ordered) else "",
                    e.who,
                    move_how(e),
                    e.comment,
                    e.from_ref,
                    move_approvers(e),
                    e.run_id,
                    e.seq,
                    e.sha256,
                    *move_signature(e, roles),
                )
            )
    order = {s: i for i, s in enumerate(STAGE_ALIASES)}
    return sorted(out, key=lambda t: (order.get(t.stage, len(order)), t.since, t.seq))


def stage_history(
    registry: Registry, model: str | None = None, stage: str | None = None, roles: Roles | None = None
) -> StageHistory:
    """The timeline of every stage alias (or `stage`'s), narrowed to the tenures of `model` when given, read from
    the audit chain and verified with it; each move's signature checked against `roles`' keys."""
    if stage is not None and stage not in STAGE_ALIASES:
        raise HistoryError(f"--stage {stage!r}: unknown stage; expected one of {', '.join(STAGE_ALIASES)}")
    chain = audit.verify(registry)
    entries = audit.events(registry, stage=stage)  # one read: moves, and the canaries that ended without one
    moves = [e for e in entries if e.event == MOVE]
    found = [t for t in tenures(moves, roles) if model is None or t.model == model]
    pending = tuple(e for e in moves if e.status == "RUNNING" and (model is None or e.model == model))
    ends = [CanaryEnd.of(e) for e in entries if e.event in CANARY_ENDS and (model is None or e.model == model)]
    return StageHistory(tuple(found), chain, pending, tuple(sorted(ends, key=lambda c: (c.when, c.seq))))


def duration_text(seconds: float) -> str:
    """`3 d 4 h`, `2 h 5 min`, `12 min`, `40 s`: the two largest units a person reads."""
    units = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    parts: list[str] = []
    left = int(seconds)
    for name, size in units:
        if left >= size or (name == "s" and not parts):
            parts.append(f"{left // size} {name}")
            left %= size
        if len(parts) == 2:
            break
    return " ".join(parts)
