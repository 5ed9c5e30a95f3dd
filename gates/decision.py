"""The decision line: per candidate and stage, what an architect reads first (pure; no I/O).

Accuracy with its 95% Wilson interval at the stage's operating point; p95 latency and text tokens/s as ratios to
the AR fallback at the same concurrency (the serving gate's, where both have a load test there, else solo on the
sweep); the stage verdict on the gates judged afresh; and what blocks it. Sign-off gates (`SIGNED_KINDS`) block
promotion, never the ranking: a candidate whose measured gates pass is ranked on its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from evals.records import CandidateEvidence, EvalRecord, ServingRecord
from gates.evaluate import SIGNED_KINDS, stage_verdict
from gates.intervals import wilson_interval
from gates.policy import StagePolicy
from gates.results import GateResult, operating_records


@dataclass(frozen=True)
class DecisionLine:
    """One candidate at one stage, against the AR fallback."""

    model: str
    version: str
    stage: str
    verdict: str  # pass / fail / inconclusive (gates judged afresh on the stored evidence)
    accuracy: float | None = None
    accuracy_interval: tuple[float, float] | None = None
    n_items: int = 0
    task: str = ""
    fallback: str = ""  # "tiny-ar v1"; "" when no fallback is registered
    concurrency: int = 1  # requests in flight the ratios compare at (1: the sweep, solo)
    p95_ratio: float | None = None  # candidate p95 / fallback p95 (below 1: faster)
    tokens_per_s_ratio: float | None = None  # candidate text tokens/s / fallback's (above 1: faster)
    fallback_accuracy: float | None = None
    blocks: tuple[str, ...] = ()  # "gate: reason" for each gate not passing
    open_signoffs: tuple[str, ...] = ()  # the sign-off gates among them

    @property
    def promotable(self) -> bool:
        return self.verdict == "pass"

    @property
    def measured_pass(self) -> bool:
        """Every gate that judges a measurement passes (only sign-offs may be open): ranked on evidence."""
        return len(self.blocks) == len(self.open_signoffs)


def _primary(evidence: CandidateEvidence | None, stage: StagePolicy) -> EvalRecord | None:
    return next((r for r in operating_records(evidence, stage) if r.task == stage.operating_point.task), None)


def _serving(evidence: CandidateEvidence | None, concurrency: int | None) -> ServingRecord | None:
    found = [r for r in (evidence.serving if evidence else ()) if r.concurrency == concurrency]
    return max(found, key=lambda r: r.when) if found else None


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine is not None and theirs else None


def decision_line(
    evidence: CandidateEvidence,
    version: str,
    stage: StagePolicy,
    results: list[GateResult],
    fallback: CandidateEvidence | None = None,
    fallback_version: str = "",
) -> DecisionLine:
    """The decision line of one candidate's evidence at a stage, from gate results judged on that evidence."""
    primary, theirs = _primary(evidence, stage), _primary(fallback, stage)
    interval = wilson_interval(primary.accuracy, primary.n_items) if primary else None
    concurrency, p95, tps = 1, None, None
    if primary and theirs:
        p95, tps = (
            _ratio(primary.latency_p95_s, theirs.latency_p95_s),
            _ratio(primary.tokens_per_s, theirs.tokens_per_s),
        )
    load = next((g.params["concurrency"] for g in stage.gates if g.kind == "serving"), None)
    served, served_theirs = _serving(evidence, load), _serving(fallback, load)
    if load and served and served_theirs:
        concurrency = load
        p95 = _ratio(served.latency_p95_s, served_theirs.latency_p95_s)
        tps = _ratio(served.tokens_per_s, served_theirs.tokens_per_s)
    kinds = {g.name: g.kind for g in stage.gates}
    open_ = [r for r in results if r.verdict != "pass"]
    return DecisionLine(
        evidence.candidate,
        version,
        stage.stage,
        stage_verdict(results) if results else "inconclusive",
        primary.accuracy if primary else None,
        interval,
        primary.n_items if primary else 0,
        stage.operating_point.task,
        f"{fallback.candidate} v{fallback_version}" if fallback else "",
        concurrency,
        p95,
        tps,
        theirs.accuracy if theirs else None,
        tuple(f"{r.gate}: {r.reason}" for r in open_),
        tuple(r.gate for r in open_ if kinds.get(r.gate) in SIGNED_KINDS),
    )


def ratio_text(ratio: float | None, faster_below_one: bool) -> str:
    """`0.25x (4.0x faster)`: a ratio to the fallback with its reading; "—" when one side was not measured."""
    if ratio is None:
        return "—"
    if ratio <= 0 or not faster_below_one:
        return f"{ratio:.2g}x"
    speed = 1 / ratio
    return f"{ratio:.2g}x ({max(speed, ratio):.2g}x {'faster' if speed >= 1 else 'slower'})"
