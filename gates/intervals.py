"""Verdicts on intervals: whether a share's 95% interval (evals.intervals: Wilson, Newcombe) spans the bound a
quality verdict turned on and how many items would settle it; a ratio judged on its interval and how many rounds
would settle it.

Every quality metric is a share of items scored right, so its sampling error is a binomial one.
"""

from __future__ import annotations

import math
from typing import Any

from evals.intervals import difference_interval, wilson_interval
from evals.paired import RatioEstimate
from gates.verdict import FAIL, INCONCLUSIVE, PASS, Verdict


def spans_bound(mt: Any, value: float, n: int, base_value: float | None, base_n: int | None) -> bool:
    """Whether a 95% interval of the verdict spans a bound it turned on (more items could change it)."""
    lo, hi = wilson_interval(value, n)
    spans = mt.threshold is not None and lo < mt.threshold < hi
    if base_value is not None and base_n:
        d_lo, d_hi = difference_interval(value, n, base_value, base_n)
        spans |= mt.min_absolute_change is not None and d_lo < mt.min_absolute_change < d_hi
    return spans


MAX_ITEMS_TO_SETTLE = 1_000_000  # beyond this a share that close to its bound is, in practice, never settled


def items_to_settle(
    mt: Any, value: float, n: int, base_value: float | None = None, base_n: int | None = None
) -> int | None:
    """The fewest items per side at which the same measured shares would settle the verdict (None: not
    within MAX_ITEMS_TO_SETTLE, e.g. a share exactly on its bound). Intervals narrow as n grows."""

    def spans(m: int) -> bool:
        return spans_bound(mt, value, m, base_value, None if base_n is None else max(m, base_n))

    if not spans(n):
        return n
    low, high = n, max(2 * n, 1)
    while spans(high):
        if high >= MAX_ITEMS_TO_SETTLE:
            return None
        low, high = high, min(2 * high, MAX_ITEMS_TO_SETTLE)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if spans(mid) else (low, mid)
    return high


MAX_ROUNDS_TO_SETTLE = 10_000


def ratio_verdict(ratio: RatioEstimate, bound: float) -> Verdict:
    """A ratio that must reach `bound` (at least), judged on its 95% interval: pass when the whole interval
    clears the bound, fail when it lies wholly below, inconclusive when it spans it."""
    if ratio.low >= bound:
        return PASS
    return FAIL if ratio.high < bound else INCONCLUSIVE


def rounds_to_settle(ratio: RatioEstimate, bound: float, rounds: int) -> int | None:
    """Rounds in all at which an interval like this one (its width in log space shrinking as 1/sqrt(rounds))
    would leave `bound` outside at the same estimate; None when the estimate lies on the bound or more than
    MAX_ROUNDS_TO_SETTLE would be needed."""
    if bound <= 0:
        return rounds
    centre, edge = math.log(ratio.estimate), math.log(bound)
    distance = abs(centre - edge)
    reach = centre - math.log(ratio.low) if edge < centre else math.log(ratio.high) - centre
    if distance < 1e-9:
        return None
    need = math.ceil(rounds * (reach / distance) ** 2)
    return need if need <= MAX_ROUNDS_TO_SETTLE else None
