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
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Mapping, Protocol

from gates.intervals import Z95, wilson_interval
from gates.readable import milliseconds, percent, significant
from gates.verdict import FAIL, INCONCLUSIVE, PASS

P95 = 0.95


@dataclass(frozen=True)
class MetricRange:
    """One analysis metric and the range its value must lie in (`min` and/or `max`)."""

    metric: str
    min: float | None = None
    max: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "min": self.min, "max": self.max}


class AnalysisSettings(Protocol):
    """What an analysis reads of a rollout policy (`gates.rollout_policy.RolloutPolicy`)."""

    min_requests: int
    analysis: tuple[MetricRange, ...]


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
    retried: bool = False  # the arm failed and the fallback answered instead
    retry_of: str = ""  # on the fallback's answer to a retried request: the arm that failed (its row counts there)
    time: str = ""

    @property
    def error(self) -> bool:
        return self.status >= 400 or self.retried

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Observation":
        """From a request-log row (columns a server does not write yet read as their defaults)."""
        def flag(name: str) -> bool:
            return bool(row.get(name) or False)

        agrees = row.get("agrees")
        latency = row.get("latency_s")
        return cls(arm=str(row.get("arm") or ""), version=str(row.get("version") or ""),
                   status=int(row.get("status") or 0), latency_s=None if latency is None else float(latency),
                   decode_failure=flag("decode_failure"), shadow=flag("shadow"),
                   agrees=None if agrees is None else bool(agrees), retried=flag("retried"),
                   retry_of=str(row.get("retry_of") or ""), time=str(row.get("time") or ""))


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
        return sorted(o.latency_s for o in self.served if not o.error and o.latency_s is not None
                      and math.isfinite(o.latency_s))

    def share(self, flag: str) -> float | None:
        if not self.served:
            return None
        return sum(bool(getattr(o, flag)) for o in self.served) / len(self.served)

    def agreement(self) -> tuple[int, int]:
        """(answers equal to the baseline's, answers compared) over shadowed and probe answers."""
        compared = [o for o in (*self.served, *self.shadowed) if o.agrees is not None]
        return sum(o.agrees for o in compared), len(compared)

    def summary(self) -> dict[str, Any]:
        """The per-arm numbers logged with each analysis (MLflow metrics)."""
        latencies = self.latencies()
        same, compared = self.agreement()
        return {"requests": self.requests, "p95_s": quantile(latencies, P95) if latencies else None,
                "error_rate": self.share("error"), "decode_failure_rate": self.share("decode_failure"),
                "agreement": same / compared if compared else None}


def split_arms(observations: list[Observation], candidate: str, baseline: str) -> tuple[ArmSample, ArmSample]:
    def sample(arm: str) -> ArmSample:  # a retry's answer belongs to the failed attempt's arm, counted there
        return ArmSample(arm, tuple(o for o in observations if o.arm == arm and not o.shadow and not o.retry_of),
                         tuple(o for o in observations if o.arm == arm and o.shadow))

    return sample(candidate), sample(baseline)


@dataclass(frozen=True)
class MetricVerdict:
    metric: str
    verdict: str
    value: float | None
    bound: dict[str, Any]
    reason: str
    interval: tuple[float, float] | None = None

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

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "metrics": [m.to_dict() for m in self.metrics],
                "arms": self.arms, "candidate": self.candidate, "baseline": self.baseline}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CanaryAnalysis":
        metrics = tuple(MetricVerdict(**{**m, "interval": tuple(m["interval"]) if m.get("interval") else None})
                        for m in data.get("metrics", ()))
        return cls(data["verdict"], data["reason"], metrics, dict(data.get("arms") or {}),
                   data.get("candidate", ""), data.get("baseline", ""))


# the metrics ------------------------------------------------------------------------------------------------
class CanaryMetric(Protocol):
    """One analysis metric. A new one: one class + one `METRICS` line; the contract test covers it."""

    name: ClassVar[str]
    needs_baseline: ClassVar[bool]  # compares with the baseline arm (which then needs min_requests too)

    def judge(self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample) -> MetricVerdict: ...


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values` (linear between order statistics)."""
    position = q * (len(values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def quantile_interval(values: list[float], q: float) -> tuple[float, float]:
    """A distribution-free ~95% interval of the q-quantile of sorted `values`, from the order statistics a
    binomial(n, q) count brackets; an end beyond the sample is the sample's extreme."""
    n = len(values)
    spread = Z95 * math.sqrt(n * q * (1 - q))
    low = max(0, math.floor(n * q - spread) - 1)
    high = min(n - 1, math.ceil(n * q + spread))
    return values[low], values[high]


def within(value: float, bound: MetricRange) -> bool:
    return (bound.max is None or value <= bound.max) and (bound.min is None or value >= bound.min)


def describe(bound: MetricRange, shown) -> str:
    parts = ([f">= {shown(bound.min)}"] if bound.min is not None else []) + (
        [f"<= {shown(bound.max)}"] if bound.max is not None else [])
    return " and ".join(parts)


def _interval_verdict(name: str, bound: MetricRange, value: float, interval: tuple[float, float], words: str,
                      shown) -> MetricVerdict:
    """Three-valued on an interval: pass when all of it is in range, fail when all of it is out, else inconclusive."""
    lo, hi = interval
    span = f"{words} {shown(value)} (95% interval {shown(lo)}-{shown(hi)})"
    if within(lo, bound) and within(hi, bound):
        return MetricVerdict(name, PASS, value, bound.to_dict(), f"{span} {describe(bound, shown)}", interval)
    outside_max = bound.max is not None and lo > bound.max
    outside_min = bound.min is not None and hi < bound.min
    if outside_max or outside_min:
        return MetricVerdict(name, FAIL, value, bound.to_dict(), f"{span} breaches {describe(bound, shown)}", interval)
    return MetricVerdict(name, INCONCLUSIVE, value, bound.to_dict(),
                         f"{span}: the interval spans the bound {describe(bound, shown)}; more requests settle it",
                         interval)


def _point_verdict(name: str, bound: MetricRange, value: float, words: str, shown, note: str = "") -> MetricVerdict:
    ok = within(value, bound)
    return MetricVerdict(name, PASS if ok else FAIL, value, bound.to_dict(),
                         f"{words} {shown(value)}{note} {'meets' if ok else 'breaches'} {describe(bound, shown)}")


def _no_data(name: str, bound: MetricRange, why: str) -> MetricVerdict:
    return MetricVerdict(name, INCONCLUSIVE, None, bound.to_dict(), why)


def _seconds(value: float) -> str:
    return f"{milliseconds(value)} ms"


class P95Latency:
    """p95 latency of the candidate's own answers, judged on the interval of the 95th percentile."""

    name: ClassVar[str] = "p95_latency_s"
    needs_baseline: ClassVar[bool] = False

    def judge(self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample) -> MetricVerdict:
        latencies = candidate.latencies()
        if not latencies:
            return _no_data(self.name, bound, f"no answer from {candidate.arm} to measure a p95 on")
        return _interval_verdict(self.name, bound, quantile(latencies, P95), quantile_interval(latencies, P95),
                                 f"p95 on {candidate.arm}", _seconds)


class P95RatioVsBaseline:
    """The candidate's p95 over the baseline's, in the same interval (so load and machine cancel out)."""

    name: ClassVar[str] = "p95_ratio_vs_baseline"
    needs_baseline: ClassVar[bool] = True

    def judge(self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample) -> MetricVerdict:
        mine, theirs = candidate.latencies(), baseline.latencies()
        if not mine or not theirs:
            return _no_data(self.name, bound, f"no answers from {candidate.arm if not mine else baseline.arm} to "
                                              "compare p95 latencies")
        base = quantile(theirs, P95)
        if base <= 0:
            return _no_data(self.name, bound, f"the p95 on {baseline.arm} is not positive")
        return _point_verdict(self.name, bound, quantile(mine, P95) / base,
                              f"p95 {candidate.arm} / {baseline.arm}", lambda v: f"{significant(v)}x")


class _Rate:
    """A share of the candidate's requests, decided on its point value (its Wilson interval is reported)."""

    name: ClassVar[str]
    needs_baseline: ClassVar[bool] = False
    flag: ClassVar[str]
    words: ClassVar[str]

    def judge(self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample) -> MetricVerdict:
        rate = candidate.share(self.flag)
        if rate is None:
            return _no_data(self.name, bound, f"no requests on {candidate.arm}")
        lo, hi = wilson_interval(rate, candidate.requests)
        count = sum(bool(getattr(o, self.flag)) for o in candidate.served)
        return _point_verdict(self.name, bound, rate, f"{self.words} on {candidate.arm}", percent,
                              f" ({count}/{candidate.requests}, 95% CI {percent(lo)}-{percent(hi)})")


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

    def judge(self, bound: MetricRange, candidate: ArmSample, baseline: ArmSample) -> MetricVerdict:
        same, compared = candidate.agreement()
        if not compared:
            return _no_data(self.name, bound, f"no shadowed or probe answers of {candidate.arm} compared with "
                                              f"{baseline.arm}; shadow some traffic to it")
        share = same / compared
        lo, hi = wilson_interval(share, compared)
        return _point_verdict(self.name, bound, share, f"agreement of {candidate.arm} with {baseline.arm}", percent,
                              f" ({same}/{compared}, 95% CI {percent(lo)}-{percent(hi)})")


METRICS: dict[str, type] = {m.name: m for m in (P95Latency, P95RatioVsBaseline, ErrorRate, DecodeFailureRate,
                                                Agreement)}


# the analysis ----------------------------------------------------------------------------------------------
def analyse(observations: list[Observation], candidate: str, baseline: str, policy: AnalysisSettings) -> CanaryAnalysis:
    """Judge one interval's requests against the policy's analysis; three-valued."""
    mine, theirs = split_arms(observations, candidate, baseline)
    arms = {candidate: mine.summary(), baseline: theirs.summary()}
    short = []
    if mine.requests < policy.min_requests:
        short.append(f"{mine.requests} requests on {candidate}, {policy.min_requests} needed")
    verdicts = []
    for bound in policy.analysis:
        metric = METRICS[bound.metric]()
        if short:
            verdicts.append(_no_data(metric.name, bound, short[0]))
        elif metric.needs_baseline and theirs.requests < policy.min_requests:
            verdicts.append(_no_data(metric.name, bound, f"{theirs.requests} requests on {baseline}, "
                                                         f"{policy.min_requests} needed to compare with it"))
        else:
            verdicts.append(metric.judge(bound, mine, theirs))
    failed = [v for v in verdicts if v.verdict == FAIL]
    unsure = [v for v in verdicts if v.verdict == INCONCLUSIVE]
    if failed:
        verdict, reason = FAIL, "; ".join(f"{v.metric}: {v.reason}" for v in failed)
    elif short:
        verdict, reason = INCONCLUSIVE, short[0]
    elif unsure:
        verdict, reason = INCONCLUSIVE, "; ".join(f"{v.metric}: {v.reason}" for v in unsure)
    else:
        verdict, reason = PASS, "; ".join(f"{v.metric}: {v.reason}" for v in verdicts)
    return CanaryAnalysis(verdict, reason, tuple(verdicts), arms, candidate, baseline)
