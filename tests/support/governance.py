"""The governance tests' people and roles: the OS account running the tests (`ME`) registers the evidence and
requests, ada signs off, grace and linus approve, olga is on call, mallory holds no role."""

from __future__ import annotations

import yaml

import registry.read as read
from checklists import load_checklist
from registry import promote, sign_off
from registry.identity import os_account
from tests.support.gate_fixtures import OK, fast_llada, fresh_registry, register_pair

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


def governed_registry(tmp_path, monkeypatch):
    """A registry of the tiny pair under roles_data(), every manual checklist item of every stage signed off by ada."""
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump(roles_data()))
    monkeypatch.setenv("UNMASK_ROLES", str(path))
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
    """The test roles with this OS account among the approvers (the CLI acts as the OS account, always)."""
    data = roles_data()
    data["users"], data["groups"]["approvers"] = PEOPLE + [ME], data["groups"]["approvers"] + [ME]
    (tmp_path / "roles.yaml").write_text(yaml.safe_dump(data))
