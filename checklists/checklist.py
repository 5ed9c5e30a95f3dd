"""Governance checklists per stage: load and validate the YAML, and decide whether one is complete.

This layer knows no other unmask package: gate results and records are read by attribute or key
(`result.gate`, `result.passed`; `record.valid` or `record["valid"]`), sign-offs are plain dicts
`{"by": ..., "at": ..., "comment": ...}`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checklists.yaml_file import read_yaml_file

CHECKLIST_DIR = Path(__file__).resolve().parent
CHECKLISTS_ENV = "UNMASK_CHECKLISTS"
# The stages of a rollout, in promotion order: the one definition policy, registry aliases and flows share.
STAGES = ("poc", "staging", "production")
FRAMEWORKS = ("nist_ai_rmf", "eu_ai_act_annex_iv", "iso_42001")
NIST_FUNCTIONS = ("GOVERN", "MAP", "MEASURE", "MANAGE")


class ChecklistError(ValueError):
    """A checklist that cannot be used; the message names the file, item and field."""


@dataclass(frozen=True)
class Evidence:
    kind: str  # "automatic" or "manual"
    gates: tuple[str, ...] = ()  # automatic: these gates of the stage passed
    record_field: str | None = None  # automatic: every judged record satisfies the condition
    equals: Any = None
    non_empty: bool = False


@dataclass(frozen=True)
class ChecklistItem:
    id: str
    text: str
    frameworks: dict[str, str]
    evidence: Evidence


@dataclass(frozen=True)
class Checklist:
    stage: str
    items: tuple[ChecklistItem, ...]
    source: str = "<memory>"

    def manual_items(self) -> list[str]:
        return [i.id for i in self.items if i.evidence.kind == "manual"]

    def gates_named(self) -> set[str]:
        return {g for i in self.items for g in i.evidence.gates}


@dataclass(frozen=True)
class ItemStatus:
    id: str
    text: str
    kind: str
    done: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChecklistStatus:
    stage: str
    items: tuple[ItemStatus, ...]

    @property
    def complete(self) -> bool:
        return all(i.done for i in self.items)

    def missing(self) -> list[str]:
        return [f"checklist {self.stage}/{i.id}: {i.reason}" for i in self.items if not i.done]

    def to_dicts(self) -> list[dict[str, Any]]:
        return [
            {
                "stage": self.stage,
                "item": i.id,
                "text": i.text,
                "kind": i.kind,
                "done": i.done,
                "reason": i.reason,
                "evidence": i.evidence,
            }
            for i in self.items
        ]


def checklist_dir() -> Path:
    """Where the stage checklists are read from: $UNMASK_CHECKLISTS (an organisation's own), else the bundled ones."""
    return Path(os.environ.get(CHECKLISTS_ENV) or CHECKLIST_DIR).expanduser()


def load_checklist(stage: str, directory: str | Path | None = None) -> Checklist:
    """Read and validate `<checklist_dir()>/<stage>.yaml`."""
    if stage not in STAGES:
        raise ChecklistError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    path = Path(directory or checklist_dir()) / f"{stage}.yaml"
    data, _ = read_yaml_file(path, ChecklistError, "checklist")
    checklist = parse_checklist(data, source=str(path))
    if checklist.stage != stage:
        raise ChecklistError(f"{path}: stage: expected {stage!r}, got {checklist.stage!r}")
    return checklist


def parse_checklist(data: Any, source: str = "<memory>") -> Checklist:
    """Validate a checklist given as plain data."""
    if not isinstance(data, dict):
        raise ChecklistError(
            f"{source}: expected {{stage: one of {', '.join(STAGES)}, items: [...]}}, got {type(data).__name__}"
        )
    if data.get("stage") not in STAGES:
        raise ChecklistError(f"{source}: stage: expected one of {', '.join(STAGES)}, got {data.get('stage')!r}")
    if not isinstance(data.get("items"), list):
        raise ChecklistError(f"{source}: items: expected a list of items, got {data.get('items')!r}")
    if not data["items"]:
        raise ChecklistError(
            f"{source}: items: expected at least one item, got []; a stage with nothing to check "
            f"would pass every promotion"
        )
    items, seen = [], set()
    for n, raw in enumerate(data["items"]):
        where = f"{source}: items[{n}]"
        if not isinstance(raw, dict):
            raise ChecklistError(f"{where}: expected a mapping, got {type(raw).__name__}")
        item_id = raw.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise ChecklistError(f"{where}.id: expected a non-empty string, got {item_id!r}")
        where = f"{source}: item {item_id!r}"
        if item_id in seen:
            raise ChecklistError(f"{where}: duplicate id")
        seen.add(item_id)
        unknown = sorted(set(raw) - {"id", "text", "frameworks", "evidence"})
        if unknown:
            raise ChecklistError(f"{where}: unknown key {unknown[0]!r}; expected id, text, frameworks, evidence")
        if not isinstance(raw.get("text"), str) or not raw["text"].strip():
            raise ChecklistError(f"{where}.text: expected a sentence, got {raw.get('text')!r}")
        items.append(
            ChecklistItem(
                item_id, raw["text"], _frameworks(raw.get("frameworks"), where), _evidence(raw.get("evidence"), where)
            )
        )
    return Checklist(stage=data["stage"], items=tuple(items), source=source)


def _frameworks(data: Any, where: str) -> dict[str, str]:
    if not isinstance(data, dict) or set(data) != set(FRAMEWORKS):
        raise ChecklistError(f"{where}.frameworks: expected exactly {', '.join(FRAMEWORKS)}, got {data!r}")
    out = {k: str(v) for k, v in data.items()}
    if out["nist_ai_rmf"].split(" ")[0] not in NIST_FUNCTIONS:
        raise ChecklistError(
            f"{where}.frameworks.nist_ai_rmf: expected a function ({', '.join(NIST_FUNCTIONS)}) "
            f"and category, got {out['nist_ai_rmf']!r}"
        )
    return out


def _evidence(data: Any, where: str) -> Evidence:
    if not isinstance(data, dict) or data.get("kind") not in ("automatic", "manual"):
        raise ChecklistError(f"{where}.evidence.kind: expected 'automatic' or 'manual', got {data!r}")
    if data["kind"] == "manual":
        if set(data) - {"kind", "gate"}:
            raise ChecklistError(
                f"{where}.evidence: a manual item takes only kind, and a gate that reads its sign-off "
                f"(its sign-off is recorded later)"
            )
        gate = data.get("gate")
        if gate is not None and (not isinstance(gate, str) or not gate):
            raise ChecklistError(f"{where}.evidence.gate: expected the name of the gate that reads this sign-off")
        return Evidence("manual", (gate,) if gate else ())
    unknown = sorted(set(data) - {"kind", "gate", "record_field", "equals", "non_empty"})
    if unknown:
        raise ChecklistError(
            f"{where}.evidence: unknown key {unknown[0]!r}; expected kind, gate, record_field, equals, non_empty"
        )
    gates = data.get("gate")
    gates = (gates,) if isinstance(gates, str) else gates or ()
    if not isinstance(gates, (list, tuple)) or not all(isinstance(g, str) and g for g in gates):
        raise ChecklistError(
            f"{where}.evidence.gate: expected a gate name or a list of gate names, got {data['gate']!r}"
        )
    gates = tuple(gates)
    record_field = data.get("record_field")
    if record_field is not None and (not isinstance(record_field, str) or not record_field):
        raise ChecklistError(f"{where}.evidence.record_field: expected a record field name, got {record_field!r}")
    if "non_empty" in data and not isinstance(data["non_empty"], bool):
        raise ChecklistError(f"{where}.evidence.non_empty: expected true or false, got {data['non_empty']!r}")
    if bool(gates) == bool(record_field):
        raise ChecklistError(f"{where}.evidence: an automatic item needs exactly one of gate or record_field")
    if record_field and ("equals" in data) == bool(data.get("non_empty")):
        raise ChecklistError(
            f"{where}.evidence: record_field {record_field!r} needs exactly one of equals or non_empty"
        )
    return Evidence("automatic", gates, record_field, data.get("equals"), bool(data.get("non_empty")))


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _not_passed(result: Any) -> str:
    """How a gate that did not pass reads: failed, or inconclusive (too little evidence to judge)."""
    return "is inconclusive" if _get(result, "verdict") == "inconclusive" else "failed"


def checklist_status(
    checklist: Checklist, gate_results: Iterable[Any], records: Iterable[Any], signoffs: Mapping[str, Mapping[str, Any]]
) -> ChecklistStatus:
    """Which items are done: automatic ones from gate results and record fields, manual ones from sign-offs."""
    by_gate = {_get(r, "gate"): r for r in gate_results}
    records = list(records)
    statuses = []
    for item in checklist.items:
        ev = item.evidence
        if ev.kind == "manual" and ev.gates:  # its gate says whether a sign-off is needed, and reads it
            statuses.append(_gated_manual_status(item, by_gate.get(ev.gates[0]), signoffs.get(item.id)))
        elif ev.kind == "manual":
            statuses.append(_manual_status(item, signoffs.get(item.id)))
        elif ev.gates:
            missing = [g for g in ev.gates if g not in by_gate]
            failed = [g for g in ev.gates if g in by_gate and not _get(by_gate[g], "passed")]
            done = not missing and not failed
            reason = (
                "gates passed: " + ", ".join(ev.gates)
                if done
                else "; ".join(
                    [f"gate {g} not evaluated" for g in missing]
                    + [f"gate {g} {_not_passed(by_gate[g])}: {_get(by_gate[g], 'reason')}" for g in failed]
                )
            )
            cited = {g: (_get(by_gate[g], "evidence") or {}).get("record_id") for g in ev.gates if g in by_gate}
            statuses.append(ItemStatus(item.id, item.text, "automatic", done, reason, {"gates": cited}))
        else:
            statuses.append(_field_status(item, records))
    return ChecklistStatus(checklist.stage, tuple(statuses))


def _manual_status(item: ChecklistItem, signoff: Mapping[str, Any] | None) -> ItemStatus:
    if not signoff:
        return ItemStatus(item.id, item.text, "manual", False, "needs a sign-off (who, when, comment)")
    lacking = [k for k in ("by", "at", "comment") if not str(signoff.get(k) or "").strip()]
    if lacking:
        return ItemStatus(item.id, item.text, "manual", False, f"sign-off lacks {', '.join(lacking)}", dict(signoff))
    return ItemStatus(
        item.id,
        item.text,
        "manual",
        True,
        f"signed off by {signoff['by']} at {signoff['at']}: {signoff['comment']}",
        dict(signoff),
    )


def _gated_manual_status(item: ChecklistItem, result: Any, signoff: Mapping[str, Any] | None) -> ItemStatus:
    """A manual item whose gate decides it: done when the gate passed (with this sign-off, or needing none)."""
    shown = dict(signoff or {})
    if result is None:
        return ItemStatus(item.id, item.text, "manual", False, f"gate {item.evidence.gates[0]} not evaluated", shown)
    if not _get(result, "passed"):
        return ItemStatus(item.id, item.text, "manual", False, str(_get(result, "reason")), shown)
    return ItemStatus(item.id, item.text, "manual", True, str(_get(result, "reason")), shown)


def _field_status(item: ChecklistItem, records: list[Any]) -> ItemStatus:
    ev = item.evidence
    if not records:
        return ItemStatus(item.id, item.text, "automatic", False, f"no record to read {ev.record_field} from")
    assert ev.record_field is not None  # an automatic item without gates names a record field (_evidence)
    bad = []
    for r in records:
        value = _get(r, ev.record_field)
        ok = bool(value) if ev.non_empty else value == ev.equals
        if not ok:
            bad.append(f"{_get(r, 'record_id')}: {ev.record_field}={value!r}")
    want = "non-empty" if ev.non_empty else f"== {ev.equals!r}"
    done = not bad
    reason = (
        f"{ev.record_field} {want} on all {len(records)} records"
        if done
        else f"{ev.record_field} not {want} on {len(bad)} record(s): {'; '.join(bad[:3])}"
    )
    return ItemStatus(
        item.id, item.text, "automatic", done, reason, {"record_ids": [_get(r, "record_id") for r in records]}
    )
