"""Evidence and gate reports edited in the artifact store as a hostile user with write access would edit them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

import registry.read as read


def artifact_file(reg, model, version, path) -> Path:
    run_id = reg.version_tags(model, version)["unmask.evidence_run"]
    return Path(unquote(urlparse(reg.client.get_run(run_id).info.artifact_uri).path)) / path


def forge_records(reg, model="tiny-llada", version="1") -> tuple[str, str]:
    """Edit a version's records.json as a hostile user would: accuracy 1.0, p95 0.01 s; (old, new) sha256."""
    file = artifact_file(reg, model, version, "evidence/records.json")
    before = hashlib.sha256(file.read_bytes()).hexdigest()
    data = json.loads(file.read_text())
    for r in data["records"]:
        r["accuracy"], r["latency_p95_s"] = 1.0, 0.01
    file.write_text(json.dumps(data, indent=2))
    return before, hashlib.sha256(file.read_bytes()).hexdigest()


def flip_gate_report(reg, model="tiny-llada", version="1", stage="staging") -> None:
    """Edit a stored gate report as a hostile user would: every failed gate flipped to passed."""
    file = artifact_file(reg, model, version, f"gates/{stage}.json")
    data = json.loads(file.read_text())
    assert not data["passed"]  # the staging gates of the fixture fail: there is something to flip
    data["passed"] = True
    for r in data["results"]:
        r["passed"], r["verdict"] = True, "pass"
    file.write_text(json.dumps(data, indent=2))


def findings(reg, kind):
    events = read.audit_events(event="integrity_finding", registry=reg)
    return events[events.evidence.map(lambda e: e.get("kind") == kind)]
