"""Roles: who may sign off, approve and roll back, per stage (`gates/roles.yaml`, or $UNMASK_ROLES).

`load_roles()` reads the file into frozen dataclasses and refuses a malformed one with a `RolesError`
naming the file and the key: unknown keys, stages, checklist items, users or groups are errors, so a
typo never silently widens (or empties) who may act.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from checklists import STAGES, ChecklistError, load_checklist
from checklists.yaml_file import read_yaml_file
from gates.signatures import KeyFormatError, PublicKey, parse_public_key, signature_problem

ROLES_PATH = Path(__file__).resolve().parent / "roles.yaml"
ROLES_ENV = "UNMASK_ROLES"
ANYONE = "*"
DUTIES = ("sign_off", "approve", "emergency_rollback")
MAX_APPROVALS = 10  # with "*" for approvers nothing bounds the count; more than this many is a typo, not a rule
_STAGE_KEYS = {"sign_off", "approve", "emergency_rollback", "approvals", "approval_ttl_hours", "self_approval"}


# Where four eyes hold (approver != registrant, != tooling signer, != requester) and where only acts signed by a
# key the roles file lists count, whatever the file says: a tag anyone with write access can write is no person.
FOUR_EYES_STAGES = ("staging", "production")
SIGNED_STAGES = FOUR_EYES_STAGES


class RolesError(ValueError):
    """A roles file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class StageRoles:
    """Who may act on one stage, and how many approvals a promotion to it needs."""

    stage: str
    sign_off: dict[str, tuple[str, ...]]  # checklist item (or "*") -> rule entries
    approve: tuple[str, ...]
    emergency_rollback: tuple[str, ...]
    approvals_count: int = 1
    approvals_distinct: bool = True
    approval_ttl_hours: float = 72.0
    self_approval: bool = False


@dataclass(frozen=True)
class Roles:
    users: tuple[str, ...]
    groups: dict[str, tuple[str, ...]]
    stages: dict[str, StageRoles]
    source: str = "<memory>"
    path: str = ""
    sha256: str = ""
    demo: bool = False  # `demo: true`: people made up to show the rules (gates/demo-roles.yaml); pages say DEMO
    keys: dict[str, tuple[PublicKey, ...]] = field(default_factory=dict)  # person -> public keys (allowed signers)

    @property
    def signed(self) -> bool:
        """Whether the roles file lists keys: then an act counts only as a listed key's, at every stage."""
        return bool(self.keys)

    def signs(self, stage: str) -> bool:
        """Whether only signed acts count at `stage`: always at staging and production (`SIGNED_STAGES`), whatever
        this file says, and at every stage once it lists keys."""
        return self.signed or stage in SIGNED_STAGES

    def signature_problem(
        self, what: str, person: str, payload: dict[str, Any], key: str, signature: str, at: str, stage: str
    ) -> str | None:
        """Why an act at `stage` does not count as `person`'s signed act (None when it does, or when the stage
        counts unsigned acts: poc under a roles file that lists no keys)."""
        if not self.signs(stage):
            return None
        if not self.signed:
            return (
                f"{what} counts for nothing: {stage} counts only acts signed by a key the roles file lists, and "
                f"{self.path or self.source} lists none (`unmask keys init`, docs/governance.md)"
            )
        return signature_problem(self.keys, what, person, payload, key, signature, at)

    def cited(self) -> dict[str, str]:
        """What a decision records of the roles behind it."""
        return {"path": self.path or self.source, "sha256": self.sha256}

    def stage(self, stage: str) -> StageRoles:
        if stage not in self.stages:
            raise RolesError(f"{self.source}: unknown stage {stage!r}; stages: {', '.join(self.stages)}")
        return self.stages[stage]

    def rule(self, stage: str, duty: str, item: str | None = None) -> tuple[str, ...]:
        """The rule entries for a duty of a stage (for sign_off: the item's own rule, else the "*" rule)."""
        roles = self.stage(stage)
        if duty == "sign_off":
            return roles.sign_off.get(item or "", roles.sign_off.get(ANYONE, ()))
        if duty not in DUTIES:
            raise ValueError(f"unknown duty {duty!r}; expected one of {', '.join(DUTIES)}")
        entries: tuple[str, ...] = getattr(roles, duty)  # approve or emergency_rollback
        return entries

    def may(self, user: str, stage: str, duty: str, item: str | None = None) -> bool:
        """Whether `user` holds the role for `duty` at `stage`."""
        for entry in self.rule(stage, duty, item):
            members = self.groups.get(entry, (entry,))
            if ANYONE in members or user in members:
                return True
        return False

    def describe(self, stage: str, duty: str, item: str | None = None) -> str:
        """The rule in words, for a refusal: "architects (ada, grace)"."""
        parts = []
        for entry in self.rule(stage, duty, item):
            members = self.groups.get(entry)
            parts.append(f"{entry} ({', '.join(members)})" if members is not None else entry)
        return ", ".join(parts) or "nobody"


def load_roles(path: str | Path | None = None) -> Roles:
    """Read and validate a roles file (default: $UNMASK_ROLES, else the bundled `gates/roles.yaml`)."""
    path = Path(path or os.environ.get(ROLES_ENV) or ROLES_PATH)
    data, raw = read_yaml_file(path, RolesError, "roles")
    parsed = parse_roles(data, source=str(path))
    return replace(parsed, path=str(path.resolve()), sha256=hashlib.sha256(raw).hexdigest())


def parse_roles(data: Any, source: str = "<memory>") -> Roles:
    """Validate roles given as plain data (what `yaml.safe_load` returns)."""
    if not isinstance(data, dict):
        raise RolesError(f"{source}: expected a mapping with users, groups and stages")
    unknown = sorted(set(data) - {"users", "groups", "stages", "demo", "keys"})
    if unknown:
        raise RolesError(f"{source}: {unknown[0]}: unknown key; expected users, groups, stages, demo, keys")
    if not isinstance(data.get("demo", False), bool):
        raise RolesError(f"{source}: demo: expected true or false, got {data['demo']!r}")
    users = _names(data.get("users"), f"{source}: users")
    if not users:
        raise RolesError(f'{source}: users: expected a non-empty list of user names (or "*" for anyone)')
    groups_data = data.get("groups") or {}
    if not isinstance(groups_data, dict):
        raise RolesError(f"{source}: groups: expected a mapping of group name to a list of users")
    groups = {}
    for name, members in groups_data.items():
        where = f"{source}: groups.{name}"
        if not isinstance(name, str) or not name.strip() or name == ANYONE:
            raise RolesError(f"{where}: a group needs a name other than {ANYONE!r}")
        if name in users:
            raise RolesError(f"{where}: {name!r} is a user too; a name is a user or a group, not both")
        groups[name] = _names(members, where)
        for member in groups[name]:
            _check_user(member, users, where)
    stages_data = data.get("stages")
    if not isinstance(stages_data, dict):
        raise RolesError(f"{source}: stages: expected a mapping of stage to its rules")
    bad = sorted(set(stages_data) - set(STAGES))
    if bad:
        raise RolesError(f"{source}: stages.{bad[0]}: unknown stage; expected one of {', '.join(STAGES)}")
    stages = {}
    for stage in STAGES:
        if stage not in stages_data:
            raise RolesError(f"{source}: stages.{stage}: missing; every stage ({', '.join(STAGES)}) needs its rules")
        stages[stage] = _parse_stage(stages_data[stage], stage, f"{source}: stages.{stage}", users, groups)
    keys = _parse_keys(data.get("keys"), f"{source}: keys", users)
    canonical = json.dumps(data, sort_keys=True, default=str).encode()
    return Roles(
        users,
        groups,
        stages,
        source=source,
        sha256=hashlib.sha256(canonical).hexdigest(),
        demo=data.get("demo", False),
        keys=keys,
    )


def _parse_keys(data: Any, where: str, users: tuple[str, ...]) -> dict[str, tuple[PublicKey, ...]]:
    """`keys: {person: [ "ssh-ed25519 AAAA... comment" | {key: ..., added: ISO, revoked: ISO} ]}`: each person's
    public keys; one key belongs to one person."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RolesError(f"{where}: expected a mapping of person to a list of public keys")
    found: dict[str, tuple[PublicKey, ...]] = {}
    owner: dict[str, str] = {}
    for person, entries in data.items():
        at = f"{where}.{person}"
        if not isinstance(person, str) or not person.strip() or person == ANYONE:
            raise RolesError(f"{at}: keys belong to a named person, not {person!r}")
        _check_user(person, users, at)
        if not isinstance(entries, list) or not entries:
            raise RolesError(f"{at}: expected a non-empty list of public keys")
        keys = []
        for i, entry in enumerate(entries):
            here = f"{at}[{i}]"
            entry = {"key": entry} if isinstance(entry, str) else entry
            if not isinstance(entry, dict) or set(entry) - {"key", "added", "revoked"} or "key" not in entry:
                raise RolesError(f"{here}: expected a public key line or {{key: ..., added: ISO, revoked: ISO}}")
            try:
                _, fp = parse_public_key(entry["key"], here)
            except KeyFormatError as e:
                raise RolesError(str(e)) from None
            times = {name: _utc(entry.get(name), f"{here}.{name}") for name in ("added", "revoked")}
            if fp in owner:
                raise RolesError(f"{here}: key {fp} is listed for {owner[fp]} already; one key is one person's")
            owner[fp] = person
            keys.append(PublicKey(person, entry["key"].strip(), fp, times["added"], times["revoked"]))
        found[person] = tuple(keys)
    return found


def _utc(value: Any, where: str) -> str:
    """An ISO time (YAML may have read it as a datetime) as the registry writes times (UTC ISO 8601)."""
    if value is None or value == "":
        return ""
    try:
        when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise RolesError(f"{where}: expected an ISO time like 2026-12-01T00:00:00Z, got {value!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat()


def _parse_stage(
    data: Any, stage: str, where: str, users: tuple[str, ...], groups: dict[str, tuple[str, ...]]
) -> StageRoles:
    if not isinstance(data, dict):
        raise RolesError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - _STAGE_KEYS)
    if unknown:
        raise RolesError(f"{where}: {unknown[0]}: unknown key; expected {', '.join(sorted(_STAGE_KEYS))}")
    for key in ("approve", "emergency_rollback", "sign_off"):
        if key not in data:
            raise RolesError(f'{where}: {key}: missing; say who may ("*" for anyone, [] for nobody)')

    def rule(entries: Any, at: str) -> tuple[str, ...]:
        names = _names(entries, at)
        for entry in names:
            if entry != ANYONE and entry not in groups:
                _check_user(entry, users, at, also="a group")
                near = difflib.get_close_matches(entry, list(groups), n=1, cutoff=0.75)
                if near and entry not in users:  # only "*" lets it in: a group's name mistyped, most likely
                    raise RolesError(
                        f"{at}: {entry!r} is not a group (did you mean {near[0]!r}?); groups: {', '.join(groups)}"
                    )
        return names

    sign_off_data = data["sign_off"]
    if not isinstance(sign_off_data, dict):
        raise RolesError(f'{where}.sign_off: expected a mapping of checklist item (or "*") to who may sign it off')
    try:
        manual = load_checklist(stage).manual_items()
    except ChecklistError as e:
        raise RolesError(f"{where}.sign_off: the {stage} checklist cannot be read: {e}") from None
    for item in sign_off_data:
        if item != ANYONE and item not in manual:
            raise RolesError(
                f"{where}.sign_off.{item}: not a manual item of the {stage} checklist; "
                f"manual items: {', '.join(manual)}"
            )
    sign_off = {item: rule(entries, f"{where}.sign_off.{item}") for item, entries in sign_off_data.items()}
    approvals = data.get("approvals", {"count": 1, "distinct": True})
    if not isinstance(approvals, dict) or set(approvals) - {"count", "distinct"}:
        raise RolesError(f"{where}.approvals: expected {{count: <int>, distinct: true}}, got {approvals!r}")
    count, distinct = approvals.get("count", 1), approvals.get("distinct", True)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise RolesError(f"{where}.approvals.count: expected a positive integer, got {count!r}")
    if distinct is not True:
        raise RolesError(
            f"{where}.approvals.distinct: expected true (one person approving twice is one approval), got {distinct!r}"
        )
    if stage == "production" and count < 2:
        raise RolesError(f"{where}.approvals.count: production needs at least 2 distinct approvers, got {count}")
    approvers = _people(rule(data["approve"], f"{where}.approve"), groups)
    if approvers is not None and count > len(approvers):
        raise RolesError(
            f"{where}.approvals.count: {count} distinct approvals cannot be met by the "
            f"{len(approvers)} who may approve ({', '.join(sorted(approvers)) or 'nobody'})"
        )
    if approvers is None and count > MAX_APPROVALS:
        raise RolesError(f"{where}.approvals.count: expected at most {MAX_APPROVALS} approvals, got {count}")
    ttl = data.get("approval_ttl_hours", 72)
    if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not 0 < ttl < float("inf"):
        raise RolesError(f"{where}.approval_ttl_hours: expected a positive number of hours, got {ttl!r}")
    self_approval = data.get("self_approval", False)
    if not isinstance(self_approval, bool):
        raise RolesError(f"{where}.self_approval: expected true or false, got {self_approval!r}")
    return StageRoles(
        stage,
        sign_off,
        rule(data["approve"], f"{where}.approve"),
        rule(data["emergency_rollback"], f"{where}.emergency_rollback"),
        count,
        distinct,
        float(ttl),
        self_approval,
    )


def _names(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RolesError(f"{where}: expected a list of names, got {value!r}")
    names = tuple(v.strip() for v in value)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RolesError(f"{where}: {twice[0]!r} is listed twice; each name once")
    return names


def _people(entries: tuple[str, ...], groups: dict[str, tuple[str, ...]]) -> set[str] | None:
    """The distinct people a rule names (its groups' members included); None when it admits anyone."""
    people: set[str] = set()
    for entry in entries:
        people.update(groups.get(entry, (entry,)))
    return None if ANYONE in people else people


def _check_user(name: str, users: tuple[str, ...], where: str, also: str = "") -> None:
    if name != ANYONE and ANYONE not in users and name not in users:
        raise RolesError(
            f"{where}: {name!r} is not a known user{' or ' + also if also else ''}; users: {', '.join(users)}"
        )
