"""Evidence waiting for MLflow: written locally before logging, removed once the registry has it.

When the tracking server is down, a finished evaluation is not lost: its `CandidateEvidence`
stays in `<state>/outbox/` as JSON and is logged by the next flow that reaches the registry.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evals.records import CandidateEvidence, EvalRecord, LicenseResult, ReproducibilityResult, SpeedComparison
from evals.store import write_atomic
from models.state import state_dir


def evidence_to_dict(evidence: CandidateEvidence) -> dict[str, Any]:
    return {
        "candidate": evidence.candidate,
        "role": evidence.role,
        "kind": evidence.kind,
        "records": [r.to_dict() for r in evidence.records],
        "reproducibility": evidence.reproducibility.to_dict() if evidence.reproducibility else None,
        "license": evidence.license.to_dict() if evidence.license else None,
        "model_revision": evidence.model_revision,
        "weights_sha256": evidence.weights_sha256,
        "card": evidence.card,
        "failures": list(evidence.failures),
        "speed": [s.to_dict() for s in evidence.speed],
    }


def evidence_from_dict(data: dict[str, Any]) -> CandidateEvidence:
    repro, lic = data.get("reproducibility"), data.get("license")
    return CandidateEvidence(
        candidate=data["candidate"],
        role=data["role"],
        kind=data["kind"],
        records=[EvalRecord.from_dict(r) for r in data.get("records", [])],
        reproducibility=ReproducibilityResult(**repro) if repro else None,
        license=LicenseResult(**lic) if lic else None,
        model_revision=data.get("model_revision", ""),
        weights_sha256=data.get("weights_sha256", ""),
        card=data.get("card") or {},
        failures=list(data.get("failures") or []),
        speed=[SpeedComparison.from_dict(s) for s in data.get("speed") or []],
    )


def outbox_dir() -> Path:
    folder = state_dir() / "outbox"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def outbox_path(evidence: CandidateEvidence) -> Path:
    weights = (evidence.weights_sha256 or "noweights")[:12]
    return outbox_dir() / f"{evidence.candidate.replace('/', '_')}-{weights}.json"


def hold(evidence: CandidateEvidence) -> Path:
    """Keep `evidence` locally (atomically) until `release`; a later hold of the same version replaces it."""
    path = outbox_path(evidence)
    text = json.dumps(evidence_to_dict(evidence), default=str)
    write_atomic(path, lambda tmp: tmp.write_text(text))  # a refused write names `path`
    return path


def release(evidence: CandidateEvidence) -> None:
    outbox_path(evidence).unlink(missing_ok=True)


def pending() -> list[tuple[Path, CandidateEvidence]]:
    """Evidence held back from the registry, oldest first."""
    found = []
    for path in sorted(outbox_dir().glob("*.json"), key=lambda p: p.stat().st_mtime):
        found.append((path, evidence_from_dict(json.loads(path.read_text()))))
    return found
