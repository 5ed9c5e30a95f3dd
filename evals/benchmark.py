"""The benchmark record: per (host, concurrency), each candidate beside the AR fallback from one paired load test.

A paired load test (`evals.loadtest`, several models, rounds interleaved) gives one ServingRecord per (model,
concurrency), each with its accuracy on the task's test items, text tokens per model call, TTFT and latency
percentiles, tokens/s, and a 95% interval on each. A `BenchmarkRecord` puts the records of one concurrency of one
such run side by side, the fallback last, and adds the two comparisons a reader asks for: tokens/s over the
fallback's (a bootstrap over the rounds both sides share) and accuracy minus the fallback's (Newcombe). Only
records that share a paired run are compared: two load tests run apart measure two machine loads.

`latest_benchmarks` keeps the newest paired run of each (host, concurrency): one record per host and level.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from evals.intervals import difference_interval
from evals.paired import RatioEstimate
from evals.records import ServingRecord


@dataclass(frozen=True)
class BenchmarkRecord:
    """One concurrency of one paired load test on one host: the candidates, then the fallback (None: none ran)."""

    host: str
    concurrency: int
    paired_run: str
    candidates: tuple[ServingRecord, ...]
    fallback: ServingRecord | None

    @property
    def sides(self) -> tuple[ServingRecord, ...]:
        return self.candidates + ((self.fallback,) if self.fallback else ())

    @property
    def when(self) -> str:
        return max((r.when for r in self.sides), default="")

    @property
    def task(self) -> str:
        return str(next((r.environment.get("task") for r in self.sides if r.environment.get("task")), ""))

    @property
    def metric(self) -> str:
        return next((r.metric for r in self.sides if r.metric), "")

    def tokens_per_s_vs_fallback(self, side: ServingRecord) -> RatioEstimate | None:
        """`side`'s text tokens/s over the fallback's, paired by round; 1x for the fallback itself."""
        if self.fallback is None:
            return None
        if side is self.fallback:
            return RatioEstimate(1.0, 1.0, 1.0)
        return side.tokens_per_s_against(self.fallback)

    def accuracy_vs_fallback(self, side: ServingRecord) -> RatioEstimate | None:
        """`side`'s accuracy minus the fallback's (a share; negative: fewer right) with its 95% interval."""
        fb = self.fallback
        if fb is None or side is fb or side.accuracy is None or fb.accuracy is None:
            return None
        low, high = difference_interval(side.accuracy, side.requests, fb.accuracy, fb.requests)
        return RatioEstimate(side.accuracy - fb.accuracy, low, high)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON: its key, then per side the record and the comparisons with the fallback."""

        def compared(side: ServingRecord) -> dict[str, Any]:
            ratio, gap = self.tokens_per_s_vs_fallback(side), self.accuracy_vs_fallback(side)
            return {
                "role": "fallback" if side is self.fallback else "candidate",
                "record": side.to_dict(),
                "tokens_per_s_vs_fallback": ratio.to_dict() if ratio else None,
                "accuracy_vs_fallback": gap.to_dict() if gap else None,
            }

        return {
            "host": self.host,
            "concurrency": self.concurrency,
            "paired_run": self.paired_run,
            "task": self.task,
            "metric": self.metric,
            "when": self.when,
            "sides": [compared(side) for side in self.sides],
        }


def benchmark_records(
    records: Iterable[ServingRecord], is_fallback: Callable[[ServingRecord], bool]
) -> list[BenchmarkRecord]:
    """The paired records grouped per (host, concurrency, paired run), in the order first seen; the first record
    `is_fallback` names in a group is its fallback. Unpaired records are left out."""
    groups: dict[tuple[str, int, str], list[ServingRecord]] = {}
    for record in records:
        if record.paired_run:
            groups.setdefault((record.host, record.concurrency, record.paired_run), []).append(record)
    out = []
    for (host, concurrency, run), group in groups.items():
        fallback = next((r for r in group if is_fallback(r)), None)
        candidates = tuple(r for r in group if r is not fallback)
        out.append(BenchmarkRecord(host, concurrency, run, candidates, fallback))
    return out


def latest_benchmarks(benchmarks: Iterable[BenchmarkRecord]) -> list[BenchmarkRecord]:
    """The newest benchmark of each (host, concurrency), by host then concurrency."""
    newest: dict[tuple[str, int], BenchmarkRecord] = {}
    for b in benchmarks:
        key = (b.host, b.concurrency)
        if key not in newest or b.when > newest[key].when:
            newest[key] = b
    return [newest[key] for key in sorted(newest)]
