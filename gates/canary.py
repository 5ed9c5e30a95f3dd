"""Canary analysis: one rollout step's live requests judged pass, fail or inconclusive (pure, no I/O).

The input is the interval's `Observation`s (one per request the route served, from the request log), the
candidate and baseline arm names and the `RolloutPolicy`. Each metric of the policy's `analysis` is a small
class behind `CanaryMetric`, registered in `METRICS`; each gives a `MetricVerdict`, and the step's verdict
is fail if any metric failed, else inconclusive if any is (or the candidate served fewer than
`min_requests`: nothing is judged on a handful of requests), else pass.

A candidate request that failed and was answered by the fallback instead (`retried`) is still the
candidate's error: the client saw an answer, the candidate did not give it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar, Protocol

import numpy as np

from gates.readable import milliseconds, percent, significant
from gates.sequential import (
    DEFAULT_CONFIDENCE,
    look_alpha,
    quantile_bounds,
    requests_for_quantile,
    requests_to_settle_share,
    share_bounds,
)
from gates.verdict import FAIL as FAIL  # re-exported: the analysis API reads them here
from gates.verdict import INCONCLUSIVE
from gates.verdict import PASS as PASS

P95 = 0.95
ALPHA_FIRST_LOOK = look_alpha(1 - DEFAULT_CONFIDENCE, 1)  # a metric judged on its own: a rollout's first look


@dataclass(frozen=True)
class MetricRange:
    """One analysis metric and the range its value must lie in (`min` and/or `max`)."""

    metric: str
    min: float | None = None
    max: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "min": self.min, "max": self.max}


class AnalysisSettings(Protocol):
    """What an analysis reads of a rollout policy (`gates.rollout_policy.RolloutPolicy`, a frozen dataclass:
    read-only members)."""

    @property
    def min_requests(self) -> int: ...

    @property
    def analysis(self) -> tuple[MetricRange, ...]: ...

    # over the whole rollout: every look together is wrong with probability <= 1 - confidence
    @property
    def confidence(self) -> float: ...


@dataclass(frozen=True)
class Observation:
    """One request a route served during an interval, as the request log holds it."""

    arm: str  # the arm the split chose (a retried request keeps the arm that failed)
    version: str = ""
    status: int = 200
    latency_s: float | None = None
    decode_failure: bool = False  # NaN/inf logits or an undecodable answer
    shadow: bool = False  # a shadow copy: answered by the arm, never returned to the client
    agrees: bool | None = None  # for shadowed or probe answers: equal to the baseline's (None: not compared)
    correct: bool | None = None  # for probe answers: equal to the probe's known answer (None: not a probe)
    retried: bool = False  # the arm failed and the fallback answered instead
    retry_of: str = ""  # on the fallback's answer to a retried request: the arm that failed (its row counts there)
    time: str = ""

    @property
    def error(self) -> bool:
        return self.status >= 400 or self.retried

    @classmethod
    def from_probe(cls, row: Mapping[str, Any]) -> Observation:
        """From a probe-log line (evals/canary_probes.py): graded, never client traffic (its request is in the
        request log already), so kept beside the arm's traffic like a shadow copy."""
        correct, agrees = row.get("correct"), row.get("agrees")
        return cls(
            arm=str(row.get("arm") or ""),
            status=int(row.get("status") or 0),
            shadow=True,
            correct=None if correct is None else bool(correct),
            agrees=None if agrees is None else bool(agrees),
            time=str(row.get("time") or ""),
        )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Observation:
        """From a request-log row (columns a server does not write yet read as their defaults)."""

        def flag(name: str) -> bool:
            return bool(row.get(name) or False)

        agrees, correct = row.get("agrees"), row.get("probe_correct")
        latency = row.get("latency_s")
        return cls(
            arm=str(row.get("arm") or ""),
            version=str(row.get("version") or ""),
            status=int(row.get("status") or 0),
            latency_s=None if latency is None else float(latency),
            decode_failure=flag("decode_failure"),
            shadow=flag("shadow"),
            agrees=None if agrees is None else bool(agrees),
            retried=flag("retried"),
            correct=None if correct is None else bool(correct),
            retry_of=str(row.get("retry_of") or ""),
            time=str(row.get("time") or ""),
        )


@dataclass(frozen=True)
class ArmSample:
    """What one arm served in the interval (shadow copies apart: they judge agreement only)."""

    arm: str
    served: tuple[Observation, ...]
    shadowed: tuple[Observation, ...] = ()

    @property
    def requests(self) -> int:
        return len(self.served)

    def latencies(self) -> list[float]:
        """Latencies of the answers the arm gave itself (errors and retries are counted as errors instead)."""
        return sorted(
            o.latency_s for o in self.served if not o.error and o.latency_s is not None and math.isfinite(o.latency_s)
        )

    def share(self, flag: str) -> float | None:
        if not self.served:
            return None
        return sum(bool(getattr(o, flag)) for o in self.served) / len(self.served)

    def agreement(self) -> tuple[int, int]:
        """(answers equal to the baseline's, answers compared) over shadowed and probe answers."""
        compared = [o for o in (*self.served, *self.shadowed) if o.agrees is not None]
        return sum(bool(o.agrees) for o in compared), len(compared)

    def probe_accuracy(self) -> tuple[int, int]:
        """(probe answers equal to their known answer, probe answers graded) of the arm's own answers."""
        graded = [o for o in (*self.served, *self.shadowed) if o.correct is not None and not o.error]
        return sum(bool(o.correct) for o in graded), len(graded)

    def summary(self) -> dict[str, Any]:
        """The per-arm numbers logged with each analysis (MLflow metrics)."""
        latencies = self.latencies()
        same, compared = self.agreement()
        right, graded = self.probe_accuracy()
        return {
            "requests": self.requests,
            "p95_s": quantile(latencies, P95) if latencies else None,
            "error_rate": self.share("error"),
            "decode_failure_rate": self.share("decode_failure"),
            "agreement": same / compared if compared else None,
            "probe_accuracy": right / graded if graded else None,
            "probes": graded,
        }


def split_arms(observations: list[Observation], candidate: str, baseline: str) -> tuple[ArmSample, ArmSample]:
    def sample(arm: str) -> ArmSample:  # a retry's answer belongs to the failed attempt's arm, counted there
        return ArmSample(
            arm,
            tuple(o for o in observations if o.arm == arm and not o.shadow and not o.retry_of),
            tuple(o for o in observations if o.arm == arm and o.shadow),
        )

    return sample(candidate), sample(baseline)


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    verdict: str
    value: float | None
    bound: dict[str, Any]
    reason: str
    interval: tuple[float | None, float | None] | None = None  # one-sided bounds at `confidence` (None: none yet)
    confidence: float | None = None  # the look's confidence in each bound (the rollout's budget, spent by look)
    n: int | None = None  # the samples judged
    needed: int | None = None  # on an inconclusive: more requests that would settle it, when known

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CanaryAnalysis:
    """One step's analysis: the verdict, why, each metric's verdict and each arm's numbers."""

    verdict: str
    reason: str
    metrics: tuple[MetricVerdict, ...]
    arms: dict[str, dict[str, Any]] = field(default_factory=dict)  # arm -> summary()
    candidate: str = ""
    baseline: str = ""
    look: int = 1  # which look of its rollout this is (1-based): it spends look_alpha(alpha, look)
    confidence: float | None = None  # each bound's confidence at this look

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "metrics": [m.to_dict() for m in self.metrics],
            "arms": self.arms,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "look": self.look,
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CanaryAnalysis:
        metrics = tuple(
            MetricVerdict(**{**m, "interval": tuple(m["interval"]) if m.get("interval") else None})
            for m in data.get("metrics", ())
        )
        return cls(
            data["verdict"],
            data["reason"],
            metrics,
            dict(data.get("arms") or {}),
            data.get("candidate", ""),
            data.get("baseline", ""),
            int(data.get("look") or 1),
            data.get("confidence"),
        )


# the metrics ------------------------------------------------------------------------------------------------
class CanaryMetric(Protocol):
    """One analysis metric. A new one: one class + one `METRICS` line; the contract test covers it."""

    name: ClassVar[str]
    needs_baseline: ClassVar[bool]  # compares with the baseline arm (which then needs min_requests too)

    def judge(
        self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample, alpha: float = ALPHA_FIRST_LOOK
    ) -> MetricVerdict: ...


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values` (linear between order statistics)."""
    position = q * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def within(value: float, bound: MetricRange) -> bool:
    return (bound.max is None or value <= bound.max) and (bound.min is None or value >= bound.min)


def describe(bound: MetricRange, shown: Callable[[float], str]) -> str:
    parts = ([f">= {shown(bound.min)}"] if bound.min is not None else []) + (
        [f"<= {shown(bound.max)}"] if bound.max is not None else []
    )
    return " and ".join(parts)


def _bounded_verdict(
    name: str,
    bound: MetricRange,
    value: float,
    lower: float,
    upper: float,
    alpha: float,
    n: int,
    words: str,
    shown: Callable[[float], str],
    needed: int | None = None,
    note: str = "",
) -> MetricVerdict:
    """Three-valued on the look's one-sided bounds (each wrong with probability <= alpha; -inf/inf: none):
    pass when the bound on the side that matters is inside the range, fail when the other is outside it,
    else inconclusive, naming how many more requests would settle it when that is known."""
    confidence = 1.0 - alpha
    interval = (None if not math.isfinite(lower) else float(lower), None if not math.isfinite(upper) else float(upper))
    ends = "-".join("?" if e is None else shown(e) for e in interval)
    span = f"{words} {shown(value)}{note} ({significant(confidence * 100)}% bounds {ends}, n={n})"
    made: dict[str, Any] = dict(value=value, bound=bound.to_dict(), interval=interval, confidence=confidence, n=n)
    if (bound.max is not None and lower > bound.max) or (bound.min is not None and upper < bound.min):
        return MetricVerdict(name, FAIL, reason=f"{span} breaches {describe(bound, shown)}", **made)
    if within(upper, bound) and within(lower, bound):
        return MetricVerdict(name, PASS, reason=f"{span} {describe(bound, shown)}", **made)
    more = f"; {needed} more requests needed to settle it" if needed else "; more requests settle it"
    return MetricVerdict(
        name, INCONCLUSIVE, reason=f"{span}: the bounds span {describe(bound, shown)}{more}", needed=needed, **made
    )


def _no_data(name: str, bound: MetricRange, why: str, needed: int | None = None) -> MetricVerdict:
    return MetricVerdict(name, INCONCLUSIVE, None, bound.to_dict(), why, needed=needed)


def _seconds(value: float) -> str:
    return f"{milliseconds(value)} ms"


def _quantile_needed(n: int, alpha: float) -> int | None:
    """More requests before the sample's order statistics can bound a p95 from above at all."""
    return max(0, requests_for_quantile(P95, alpha) - n) or None


class P95Latency:
    """p95 latency of the candidate's own answers, judged on exact order-statistic bounds of the 95th
    percentile: a pass needs its upper bound (an order statistic above the true p95 with probability
    >= 1 - alpha) in range, so with fewer than log(alpha)/log(0.95) answers it is never a pass."""

    name: ClassVar[str] = "p95_latency_s"
    needs_baseline: ClassVar[bool] = False

    def judge(
        self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample, alpha: float = ALPHA_FIRST_LOOK
    ) -> MetricVerdict:
        latencies = candidate.latencies()
        if not latencies:
            return _no_data(
                self.name,
                bound,
                f"no answer from {candidate.arm} to measure a p95 on",
                requests_for_quantile(P95, alpha),
            )
        lower, upper = quantile_bounds(np.array(latencies), P95, alpha)
        return _bounded_verdict(
            self.name,
            bound,
            quantile(latencies, P95),
            float(lower),
            float(upper),
            alpha,
            len(latencies),
            f"p95 on {candidate.arm}",
            _seconds,
            _quantile_needed(len(latencies), alpha),
        )


class P95RatioVsBaseline:
    """The candidate's p95 over the baseline's, in the same interval (so load and machine cancel out); its
    bounds are the ratio of each arm's order-statistic bounds, half the look's budget to each arm."""

    name: ClassVar[str] = "p95_ratio_vs_baseline"
    needs_baseline: ClassVar[bool] = True

    def judge(
        self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample, alpha: float = ALPHA_FIRST_LOOK
    ) -> MetricVerdict:
        mine, theirs = candidate.latencies(), baseline.latencies()
        if not mine or not theirs:
            empty = candidate if not mine else baseline
            return _no_data(
                self.name,
                bound,
                f"{empty.requests} requests on {empty.arm}, no answers from it to compare p95 latencies",
            )
        base = quantile(theirs, P95)
        if base <= 0:
            return _no_data(self.name, bound, f"the p95 on {baseline.arm} is not positive")
        mine_lo, mine_hi = (float(b) for b in quantile_bounds(np.array(mine), P95, alpha / 2))
        base_lo, base_hi = (float(b) for b in quantile_bounds(np.array(theirs), P95, alpha / 2))
        lower = mine_lo / base_hi if math.isfinite(mine_lo) and math.isfinite(base_hi) and base_hi > 0 else -math.inf
        upper = mine_hi / base_lo if math.isfinite(mine_hi) and base_lo > 0 else math.inf
        needed = max(_quantile_needed(len(mine), alpha / 2) or 0, _quantile_needed(len(theirs), alpha / 2) or 0)
        return _bounded_verdict(
            self.name,
            bound,
            quantile(mine, P95) / base,
            lower,
            upper,
            alpha,
            len(mine),
            f"p95 {candidate.arm} / {baseline.arm}",
            lambda v: f"{significant(v)}x",
            needed or None,
        )


def _share_verdict(name: str, bound: MetricRange, count: int, n: int, alpha: float, words: str) -> MetricVerdict:
    """A share judged on its Clopper-Pearson bounds at the look's budget (never on its point value)."""
    lower, upper = share_bounds(count, n, alpha)
    needed = requests_to_settle_share(count, n, alpha, bound.max, bound.min)
    return _bounded_verdict(
        name, bound, count / n, float(lower), float(upper), alpha, n, words, percent, needed or None, f" ({count}/{n})"
    )


class _Rate:
    """A share of the candidate's requests, judged on its exact (Clopper-Pearson) bounds: 0 errors in 8
    requests is not a pass of `max: 0.05`, its upper bound is above 30%."""

    name: ClassVar[str]
    needs_baseline: ClassVar[bool] = False
    flag: ClassVar[str]
    words: ClassVar[str]

    def judge(
        self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample, alpha: float = ALPHA_FIRST_LOOK
    ) -> MetricVerdict:
        if not candidate.requests:
            return _no_data(self.name, bound, f"no requests on {candidate.arm}")
        count = sum(bool(getattr(o, self.flag)) for o in candidate.served)
        return _share_verdict(self.name, bound, count, candidate.requests, alpha, f"{self.words} on {candidate.arm}")


class ErrorRate(_Rate):
    """Failed requests (status >= 400, or retried on the fallback) over the candidate's requests."""

    name: ClassVar[str] = "error_rate"
    flag: ClassVar[str] = "error"
    words: ClassVar[str] = "error rate"


class DecodeFailureRate(_Rate):
    """Answers with NaN/inf logits or undecodable output over the candidate's requests."""

    name: ClassVar[str] = "decode_failure_rate"
    flag: ClassVar[str] = "decode_failure"
    words: ClassVar[str] = "decode failures"


class Agreement:
    """Share of the candidate's shadowed or probe answers equal to the baseline's (the quality side)."""

    name: ClassVar[str] = "agreement"
    needs_baseline: ClassVar[bool] = False

    def judge(
        self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample, alpha: float = ALPHA_FIRST_LOOK
    ) -> MetricVerdict:
        same, compared = candidate.agreement()
        if not compared:
            return _no_data(
                self.name,
                bound,
                f"no shadowed or probe answers of {candidate.arm} compared with "
                f"{baseline.arm}; shadow some traffic to it or mix in probes",
            )
        return _share_verdict(
            self.name, bound, same, compared, alpha, f"agreement of {candidate.arm} with {baseline.arm}"
        )


class ProbeAccuracy:
    """Exact-match accuracy of the candidate's answers to probe prompts with known answers (held out from the
    sweep, mixed into its live traffic: serving/probes.py); the baseline's is reported beside it."""

    name: ClassVar[str] = "probe_accuracy"
    needs_baseline: ClassVar[bool] = False

    def judge(
        self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample, alpha: float = ALPHA_FIRST_LOOK
    ) -> MetricVerdict:
        right, graded = candidate.probe_accuracy()
        if not graded:
            return _no_data(
                self.name,
                bound,
                f"no probe answers of {candidate.arm} graded; mix probes into its traffic (serving policy `probes:`)",
            )
        base_right, base_graded = baseline.probe_accuracy()
        note = (
            f"; {baseline.arm} {percent(base_right / base_graded)} ({base_right}/{base_graded})" if base_graded else ""
        )
        verdict = _share_verdict(self.name, bound, right, graded, alpha, f"probe accuracy of {candidate.arm}")
        return replace(verdict, reason=verdict.reason + note)


METRICS: dict[str, type] = {
    m.name: m for m in (P95Latency, P95RatioVsBaseline, ErrorRate, DecodeFailureRate, Agreement, ProbeAccuracy)
}


# the analysis ----------------------------------------------------------------------------------------------
def analyse(
    observations: list[Observation], candidate: str, baseline: str, policy: AnalysisSettings, look: int = 1
) -> CanaryAnalysis:
    """Judge one interval's requests against the policy's analysis; three-valued. `look` counts the rollout's
    analyses (1-based, repeats and resumes included): it spends `look_alpha(1 - confidence, look)`, so every
    look of a rollout together passes a breaching candidate with probability at most 1 - confidence.

    The metrics' bounds hold at any sample size, so a fail stands on a handful of requests; a pass needs
    `min_requests` on the candidate (and on the baseline for a comparison) besides its bounds."""
    alpha = look_alpha(1 - getattr(policy, "confidence", DEFAULT_CONFIDENCE), look)
    mine, theirs = split_arms(observations, candidate, baseline)
    arms = {candidate: mine.summary(), baseline: theirs.summary()}
    short = starved(observations, mine, theirs, policy.min_requests)
    verdicts = []
    for bound in policy.analysis:
        metric = METRICS[bound.metric]()
        verdict = metric.judge(bound, mine, theirs, alpha)
        if verdict.verdict == PASS and short:
            verdict = replace(
                verdict,
                verdict=INCONCLUSIVE,
                reason=f"{short}; {verdict.reason}",
                needed=policy.min_requests - mine.requests,
            )
        elif verdict.verdict == PASS and metric.needs_baseline and theirs.requests < policy.min_requests:
            verdict = replace(
                verdict,
                verdict=INCONCLUSIVE,
                reason=f"{theirs.requests} requests on {baseline}, {policy.min_requests} needed to compare with it",
            )
        verdicts.append(verdict)
    failed = [v for v in verdicts if v.verdict == FAIL]
    unsure = [v for v in verdicts if v.verdict == INCONCLUSIVE]
    if failed:
        verdict, reason = FAIL, "; ".join(f"{v.metric}: {v.reason}" for v in failed)
    elif short:
        verdict, reason = INCONCLUSIVE, short
    elif unsure:
        verdict, reason = INCONCLUSIVE, "; ".join(f"{v.metric}: {v.reason}" for v in unsure)
    else:
        verdict, reason = PASS, "; ".join(f"{v.metric}: {v.reason}" for v in verdicts)
    return CanaryAnalysis(verdict, reason, tuple(verdicts), arms, candidate, baseline, look, 1 - alpha)


def starved(observations: list[Observation], mine: ArmSample, theirs: ArmSample, min_requests: int) -> str:
    """Why the candidate served too few requests to pass ("" when it served enough): no traffic at all, none
    routed to the candidate, or too few."""
    if mine.requests >= min_requests:
        return ""
    if not observations:
        return (
            f"no requests at all on the route in the interval (0 on {mine.arm}, 0 on {theirs.arm}): nothing "
            f"is sending traffic; {min_requests} needed on {mine.arm}"
        )
    if not mine.requests:
        return (
            f"0 requests routed to {mine.arm} while {theirs.arm} served {theirs.requests}: the split sends the "
            f"candidate nothing (does the server serve the `{mine.arm}` arm?); {min_requests} needed"
        )
    return f"{mine.requests} requests on {mine.arm}, {min_requests} needed"
