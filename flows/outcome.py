"""What one candidate's evaluation gives (`evaluate-candidate`'s result): a typed `CandidateOutcome`.

Across a flow boundary (a Prefect result, the CLI's JSON) it travels as the plain dict `to_dict()` gives, the
same keys in the same order as ever; inside, the review, scorecard and summary read it typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from gates.decision import Decision


@dataclass(frozen=True)
class CandidateOutcome:
    """One candidate evaluated and judged, or (`error`) one whose evaluation failed."""

    candidate: str = ""
    ref: str = ""  # what was asked for: a catalog id, a bundled model or a path
    role: str = ""
    kind: str = ""
    version: str = ""
    weights_sha256: str = ""
    points: int = 0  # sweep points planned
    cached: int = 0  # of them, served from cache
    failures: list[str] = field(default_factory=list)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> gates.decision.Decision.to_dict()
    qualified: str | None = None  # the highest stage whose gates all passed
    mlflow_run: str = ""
    evidence_run_id: str = ""
    evidence_reused: bool = False
    tracking_uri: str = ""
    files: str = ""  # the folder of the evaluation's files (under <state>/evals/)
    error: str = ""  # why the evaluation failed ("" when it did not)

    @classmethod
    def failed(cls, model_id: str, message: str) -> CandidateOutcome:
        return cls(candidate=model_id, ref=model_id, error=message)

    @classmethod
    def of(cls, value: CandidateOutcome | Mapping[str, Any]) -> CandidateOutcome:
        """A typed outcome from one, or from its plain dict (keys it lacks read as their defaults)."""
        if isinstance(value, CandidateOutcome):
            return value
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in value.items() if k in known})

    def decisions(self) -> list[Decision]:
        """The decision of every stage judged, poc first (none for a failed evaluation)."""
        return [] if self.error else [Decision.from_dict(d) for d in self.verdicts.values()]

    def gates(self, stage: str) -> list[dict[str, Any]]:
        """The gate result dicts of `stage` (none for a stage not judged, or a failed evaluation)."""
        return list(self.verdicts.get(stage, {}).get("gates", []))

    def passed(self, stage: str, ignore: set[str] | frozenset[str] = frozenset()) -> bool:
        """Whether every gate of `stage` (but those named in `ignore`) passed (a failed evaluation passes nothing)."""
        gates = [] if self.error else self.gates(stage)
        return bool(gates) and all(g["passed"] for g in gates if g["gate"] not in ignore)

    def to_dict(self) -> dict[str, Any]:
        if self.error:
            return {"candidate": self.candidate, "ref": self.ref, "error": self.error}
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "error"}
