"""The governance tests' people and roles: the OS account running the tests (`ME`) registers the evidence and
requests, ada signs off, grace and linus approve, olga is on call, mallory holds no role.

Staging and production count only acts signed by a key the roles file lists (`gates.roles.SIGNED_STAGES`), so the
roles these tests write list each person's public key (`with_keys`), and the test's keys folder ($UNMASK_KEYS_HOME,
one per test) holds every person's key pair, as each person's own folder would hold theirs: one OS account runs the
tests, and with keys, two listed keys are two people."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import registry.read as read
from checklists import load_checklist
from gates.promotion import signoff_payload
from gates.roles import ROLES_PATH
from registry import keys, promote, sign_off
from registry.identity import os_account
from tests.support.gate_fixtures import ALL_MANUAL, OK, fast_llada, fresh_registry, register_pair, signoffs

PEOPLE = ["ada", "bob", "eve", "grace", "linus", "mallory", "olga"]
ME = os_account()  # the identity of this process on the embedded store: no environment variable changes it


def roles_data(**stage_overrides):
    stage = {"sign_off": {"*": ["architects"]}, "approve": ["approvers"], "emergency_rollback": ["oncall"]}
    data = {
        "users": PEOPLE,
        "groups": {"architects": ["ada"], "approvers": ["bob", "eve", "grace", "linus"], "oncall": ["olga"]},
        "stages": {
            "poc": stage | {"self_approval": True},
            "staging": stage | {"approvals": {"count": 1, "distinct": True}},
            "production": stage | {"approvals": {"count": 2, "distinct": True}},
        },
    }
    for stage_name, overrides in stage_overrides.items():
        data["stages"][stage_name] = data["stages"][stage_name] | overrides
    return data


def signers_of(people, home: Path | None = None) -> dict[str, keys.Signer]:
    """Each of `people`'s key pair in the test's keys folder (or `home`), made the first time it is asked for."""
    home = home or keys.keys_home()
    return {p: keys.signer(p, home) or keys.init(p, home, default=False) for p in people}


def with_keys(
    data: dict[str, Any], people=None, revoked: dict[str, str] | None = None, home: Path | None = None
) -> dict[str, Any]:
    """`data` (a roles mapping) listing the public key of each of `people` (default: every user it names) and of
    `ME`, who registers the evidence (added to its users where they are named); a person in `revoked` gets that
    `revoked:` time."""
    named = [u for u in data["users"] if u != "*"]
    people = list(dict.fromkeys([*(named if people is None else people), ME]))
    if "*" not in data["users"] and ME not in data["users"]:
        data["users"] = [*data["users"], ME]
    revoked = revoked or {}
    data["keys"] = {
        p: [{"key": s.public_line, "revoked": revoked[p]} if p in revoked else s.public_line]
        for p, s in signers_of(people, home).items()
    }
    return data


def write_roles(tmp_path: Path, monkeypatch, data: dict[str, Any], name: str = "roles.yaml") -> Path:
    """`data` as the roles file $UNMASK_ROLES names."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("UNMASK_ROLES", str(path))
    return path


def keyed_roles(tmp_path, monkeypatch, people=PEOPLE, revoked: dict[str, str] | None = None, **stages):
    """roles_data() listing the keys of `people` and `ME` (made in the test's keys folder), as $UNMASK_ROLES.
    Returns {person: Signer}."""
    write_roles(tmp_path, monkeypatch, with_keys(roles_data(**stages), people, revoked))
    return signers_of([*people, ME])


def bundled_with_keys(people=PEOPLE, home: Path | None = None) -> dict[str, Any]:
    """The bundled roles (`gates/roles.yaml`: anyone may do anything) listing the keys of `people` and `ME`: what a
    team that keeps the bundled rules adds to reach staging and production."""
    return with_keys(yaml.safe_load(Path(ROLES_PATH).read_text()), people, home=home)


def team_environment(root: Path, people=PEOPLE) -> dict[str, str]:
    """For a fixture wider than a test: the key pairs of `people` and `ME` in `root`/keys and the bundled roles
    listing them in `root`/team-roles.yaml; the variables that act with them (a test that uses the fixture sets them
    again, as the conftest gives each test an empty keys folder)."""
    home = root / "keys"
    path = root / "team-roles.yaml"
    path.write_text(yaml.safe_dump(bundled_with_keys(people, home=home)))
    return {keys.KEYS_ENV: str(home), "UNMASK_ROLES": str(path)}


@pytest.fixture
def team_keys(tmp_path, monkeypatch) -> dict[str, keys.Signer]:
    """The bundled roles listing the keys of PEOPLE and `ME` as $UNMASK_ROLES, their key pairs in the test's keys
    folder: what a team adds to the bundled rules to reach staging and production. {person: Signer}."""
    write_roles(tmp_path, monkeypatch, bundled_with_keys(), "team-roles.yaml")
    return signers_of([*PEOPLE, ME])


def signed_signoffs(
    stage: str, signer: keys.Signer, items=ALL_MANUAL, model: str = "tiny-llada", version: str = ""
) -> dict[str, dict[str, str]]:
    """`items` of `stage` signed off by `signer`'s person with their key, as `decide` reads them (version "": a
    decision that reads no registry)."""
    out = {}
    for item, so in signoffs(*items, by=signer.person).items():
        so["key"], so["signature"] = signer.sign(signoff_payload(model, version, stage, item, so))
        out[item] = so
    return out


def governed_registry(tmp_path, monkeypatch):
    """A registry of the tiny pair under roles_data() with everyone's keys listed, every manual checklist item of
    every stage signed off by ada."""
    keyed_roles(tmp_path, monkeypatch)
    monkeypatch.setenv("LOGNAME", "eve")  # ignored: the registrant is the real uid's OS account, not $LOGNAME
    registry = fresh_registry(tmp_path)
    register_pair(registry, fast_llada())
    for stage in ("poc", "staging", "production"):
        for item in load_checklist(stage).manual_items():
            sign_off(registry, "tiny-llada", "1", stage, item, "ada", f"{item} checked for {stage}")
    return registry


def at_poc(reg):
    promote("tiny-llada", "poc", approver="bob", comment=OK, registry=reg)  # poc: bob may approve his own request


def refusals(reg, event):
    return read.audit_events(event=event, registry=reg)


def roles_with_me(tmp_path) -> None:
    """The test roles, keys listed, with this OS account among the approvers (the CLI acts as the OS account)."""
    data = roles_data()
    data["users"], data["groups"]["approvers"] = PEOPLE + [ME], data["groups"]["approvers"] + [ME]
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(with_keys(data)))
