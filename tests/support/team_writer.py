"""One evaluator process of tests/e2e/test_team_registry.py: it waits for the start file, then writes the shared
server at the same time as the others: five audit events, and either a promotion or an evidence registration.
It prints one JSON line saying what happened."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from registry import PromotionRefused, Registry, audit, promote, register_evidence
from registry.audit import AuditEvent
from tests.support.gate_fixtures import evidence, record

APPENDS = 5


def team_evidence(model: str):
    """Evidence of a model of its own (its own weights), as an evaluator would register it."""
    weights = hashlib.sha256(model.encode()).hexdigest()
    records = [
        replace(record("tiny-llada", task), candidate=model, weights_sha256=weights) for task in ("arith", "sort")
    ]
    return replace(evidence("tiny-llada", records), candidate=model, weights_sha256=weights, serving=[])


def main(role: str, url: str, name: str, start_file: str) -> dict:
    reg = Registry(url)
    while not Path(start_file).exists():  # every writer is imported and connected before any writes
        time.sleep(0.01)
    done: dict = {"name": name, "role": role}
    for i in range(APPENDS):
        audit.append(reg, AuditEvent("approval", name, "", "poc", "team-probe", "1", comment=f"{name} {i}"))
        if i == 1 and role == "promote":
            try:
                done["moved"] = promote(
                    "tiny-llada", "poc", approver=name, comment="PoC evidence reviewed", registry=reg
                ).to_dict()["to"]
            except PromotionRefused as e:
                done["refused"] = e.reasons
        if i == 1 and role == "evidence":
            done["version"], _ = register_evidence(reg, team_evidence(f"team-{name}"))
    return done


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])), flush=True)
