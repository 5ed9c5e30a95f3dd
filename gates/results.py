"""What a gate says: `GateResult` (one gate of one stage on one version), and which records a stage judges
(its operating point). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from evals.records import CandidateEvidence, EvalRecord
from gates.policy import StagePolicy
from gates.verdict import FAIL, PASS, VERDICTS, Verdict


@dataclass(frozen=True)
class GateResult:
    """The verdict of one gate of one stage on one candidate version.

    `verdict`: pass, fail or inconclusive (too little evidence to judge); `passed` is True for a pass only.
    Built without a verdict (a report written before verdicts), it is read from `passed`.
    `settle`: for an inconclusive verdict, the evidence that would settle it ("needs 34 more items on arith").
    """

    gate: str
    stage: str
    passed: bool
    value: Any
    threshold: Any
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    verdict: Verdict | str = ""  # a Verdict once built; "" reads it from `passed`
    settle: str = ""

    def __post_init__(self) -> None:
        verdict = self.verdict or (PASS if self.passed else FAIL)
        if verdict not in VERDICTS:
            raise ValueError(f"gate {self.gate}: verdict {verdict!r} is not one of {', '.join(VERDICTS)}")
        if bool(self.passed) != (verdict == PASS):
            raise ValueError(f"gate {self.gate}: passed={self.passed!r} contradicts verdict {verdict!r}")
        object.__setattr__(self, "verdict", Verdict(verdict))

    @property
    def inconclusive(self) -> bool:
        return self.verdict == Verdict.INCONCLUSIVE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateResult:
        return cls(
            **{k: data[k] for k in ("gate", "stage", "passed", "value", "threshold", "reason")},
            evidence=dict(data.get("evidence") or {}),
            verdict=data.get("verdict") or "",
            settle=data.get("settle") or "",
        )


Baseline = Mapping[str, CandidateEvidence | None]


def as_evidence(evidence_or_records: CandidateEvidence | list[EvalRecord]) -> CandidateEvidence:
    """Accept a `CandidateEvidence` or a bare list of records of one candidate."""
    if isinstance(evidence_or_records, CandidateEvidence):
        return evidence_or_records
    records = list(evidence_or_records)
    if not records:
        raise ValueError("evaluate_gates: no records given")
    names = {r.candidate for r in records}
    if len(names) > 1:
        raise ValueError(f"evaluate_gates: records of several candidates given: {', '.join(sorted(names))}")
    first = records[0]
    return CandidateEvidence(
        candidate=first.candidate,
        role=first.role,
        kind=first.kind,
        records=records,
        model_revision=first.model_revision,
        weights_sha256=first.weights_sha256,
    )


def operating_records(evidence: CandidateEvidence | None, stage: StagePolicy) -> list[EvalRecord]:
    """The validated records of the one SamplerConfig a stage judges (all tasks of that config)."""
    if evidence is None:
        return []
    valid = [r for r in evidence.records if r.valid is True and r.gen_length == stage.operating_point.gen_length]
    chosen = evidence.card.get("operating_config_hash")
    if not chosen:
        at_task = [r for r in valid if r.task == stage.operating_point.task]
        if not at_task:
            return []
        chosen = max(at_task, key=lambda r: (r.accuracy, -r.latency_p95_s, r.config_hash)).config_hash
    return [r for r in valid if r.config_hash == chosen]


def speed_points(
    evidence: CandidateEvidence, baseline: CandidateEvidence, stages: Iterable[StagePolicy]
) -> list[tuple[EvalRecord, EvalRecord]]:
    """(candidate record, baseline record) at each distinct operating point of `stages`: the configs a speed
    gate compares, which a paired measurement times."""
    pairs: dict[tuple[str, str, str], tuple[EvalRecord, EvalRecord]] = {}
    for stage in stages:
        mine = primary_record(operating_records(evidence, stage), stage)
        theirs = primary_record(operating_records(baseline, stage), stage)
        if mine is not None and theirs is not None:
            pairs.setdefault((mine.record_id, theirs.record_id, mine.task), (mine, theirs))
    return list(pairs.values())


def primary_record(records: list[EvalRecord], stage: StagePolicy) -> EvalRecord | None:
    for r in records:
        if r.task == stage.operating_point.task:
            return r
    return None


def cite(record: EvalRecord | None) -> dict[str, Any]:
    if record is None:
        return {}
    return {
        "record_id": record.record_id,
        "run_id": record.run_id,
        "config_hash": record.config_hash,
        "output_hash": record.output_hash,
        "weights_sha256": record.weights_sha256,
        "task": record.task,
    }
