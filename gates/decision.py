"""The decision line: per candidate and stage, what an architect reads first (pure; no I/O).

Accuracy with its 95% Wilson interval at the stage's operating point; p95 latency and text tokens/s as ratios to
the AR fallback at the same concurrency (the serving gate's, where both have a load test there, else solo on the
sweep); the stage verdict on the gates judged afresh; and what blocks it. Sign-off gates (`SIGNED_KINDS`) block
promotion, never the ranking: a candidate whose measured gates pass is ranked on its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from evals.records import CandidateEvidence, EvalRecord
from gates.checks import serving_at
from gates.evaluate import SIGNED_KINDS, stage_verdict
from gates.intervals import wilson_interval
from gates.policy import StagePolicy
from gates.readable import significant
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
    concurrency: int = 1  # requests in flight the ratios compare at (1: solo, timed paired with the fallback)
    p95_ratio: float | None = None  # candidate p95 / fallback p95 (below 1: faster)
    tokens_per_s_ratio: float | None = None  # candidate text tokens/s / fallback's (above 1: faster)
    fallback_accuracy: float | None = None
    blocks: tuple[str, ...] = ()  # "gate: reason" for each gate not passing
    open_signoffs: tuple[str, ...] = ()  # the sign-off gates among them
    p95_interval: tuple[float, float] | None = None  # 95% interval of p95_ratio (paired measurement)
    tokens_per_s_interval: tuple[float, float] | None = None
    paired: bool = False  # the ratios come from a paired, interleaved measurement (evals.paired)
    steady: bool = True  # the paired measurement's rounds agree (evals.paired.is_steady)

    @property
    def promotable(self) -> bool:
        return self.verdict == "pass"

    def p95_text(self) -> str:
        """The p95 ratio as every surface shows it: `4.0x faster (3.5-4.6x)`, `at 16 in flight, unpaired`."""
        return ratio_text(self.p95_ratio, True, self.p95_interval) + self._where()

    def tokens_per_s_text(self) -> str:
        return ratio_text(self.tokens_per_s_ratio, False, self.tokens_per_s_interval) + self._where()

    def _where(self) -> str:
        if self.p95_ratio is None and self.tokens_per_s_ratio is None:
            return ""
        if self.concurrency > 1:
            return f" at {self.concurrency} in flight" + ("" if self.paired else ", unpaired")
        if not self.paired:
            return " (unpaired)"
        return "" if self.steady else " (host unsteady)"

    @property
    def measured_pass(self) -> bool:
        """Every gate that judges a measurement passes (only sign-offs may be open): ranked on evidence."""
        return len(self.blocks) == len(self.open_signoffs)


def _primary(evidence: CandidateEvidence | None, stage: StagePolicy) -> EvalRecord | None:
    return next((r for r in operating_records(evidence, stage) if r.task == stage.operating_point.task), None)


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
    concurrency, p95, tps, p95_ci, tps_ci, paired, steady = 1, None, None, None, None, False, True
    op = stage.operating_point
    speed = evidence.speed_against(fallback, op.task, op.gen_length, primary.config_hash) if primary else None
    if speed is not None and theirs is not None and speed.baseline_config_hash == theirs.config_hash:
        p95_est, tps_est = speed.ratio("p95"), speed.ratio("tokens_per_s")
        p95, p95_ci = (p95_est.estimate, (p95_est.low, p95_est.high)) if p95_est else (None, None)
        tps, tps_ci = (tps_est.estimate, (tps_est.low, tps_est.high)) if tps_est else (None, None)
        paired, steady = True, speed.steady
    load = next((g.params["concurrency"] for g in stage.gates if g.kind == "serving"), None)
    served = serving_at(evidence, load) if load else None
    served_theirs = serving_at(fallback, load, served.paired_run) if load and served else None
    if load and served and served_theirs:  # one paired load test of both (tokens/s with its interval), or two
        concurrency, p95_ci, steady = load, None, True
        p95 = _ratio(served.latency_p95_s, served_theirs.latency_p95_s)
        tps = _ratio(served.tokens_per_s, served_theirs.tokens_per_s)
        paired_tps = served.tokens_per_s_against(served_theirs)
        paired = paired_tps is not None
        tps_ci = (paired_tps.low, paired_tps.high) if paired_tps else None
        tps = paired_tps.estimate if paired_tps else tps
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
        p95_interval=p95_ci,
        tokens_per_s_interval=tps_ci,
        paired=paired,
        steady=steady,
    )


def ratio_text(ratio: float | None, faster_below_one: bool, interval: tuple[float, float] | None = None) -> str:
    """A ratio to the fallback as read, with its 95% interval when it has one: a latency ratio (below 1:
    faster) as `4.02x faster (3.51-4.60x)`, any other as `2.10x (1.80-2.40x)`, three significant digits (an
    edge near a bound of 1 stays legible); "—" when one side was not measured."""
    if ratio is None:
        return "—"
    if ratio <= 0 or not faster_below_one:
        return f"{significant(ratio)}x" + (
            f" ({significant(interval[0])}–{significant(interval[1])}x)" if interval else ""
        )
    faster = ratio <= 1
    shown = 1 / ratio if faster else ratio
    text = f"{significant(shown)}x {'faster' if faster else 'slower'}"
    if interval:
        low, high = (1 / interval[1], 1 / interval[0]) if faster else interval
        text += f" ({significant(low)}–{significant(high)}x)"
    return text
