"""Anytime-valid bounds for a rollout's repeated looks: exact one-sided bounds of a quantile (order statistics)
and of a share (Clopper-Pearson), each at the error budget its look gets of the rollout's whole.

A rollout analyses its candidate again and again (every step, every repeat after a failure under the limit,
every resume after a pause). Judging each look at 95% would let a candidate that in truth breaches a bound
pass one of eight looks about a third of the time. Instead look k (1, 2, ... over the whole rollout) spends
`alpha * 6 / (pi^2 k^2)` of the rollout's error budget `alpha`; those shares sum to `alpha`, so by the union
bound the chance that *any* look's bound is wrong is at most `alpha`, however many looks there are and
however the data of the looks depend on one another: the per-look intervals form a confidence sequence
(Howard, Ramdas, McAuliffe, Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences",
Ann. Statist. 2021; the canary setting: Lindon, Sanden, Shirikian, "Rapid Regression Detection in Software
Deployments through Sequential Testing", KDD 2022, arXiv:2205.14762). The bounds themselves are exact and
distribution-free, so nothing rests on a normal approximation of a handful of requests.

Every function takes numpy arrays as well as numbers (the simulation tests run thousands of rollouts at once
through the same code the analysis uses).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

DEFAULT_CONFIDENCE = 0.95  # over a whole rollout: its false-pass (and false-fail) rate is at most 5%
MAX_REQUESTS = 10_000_000  # beyond this a count is, in practice, never reached


def look_alpha(alpha: float, look: int) -> float:
    """The share of the rollout's error budget `alpha` that look `look` (1-based) may spend; sums to alpha."""
    if look < 1:
        raise ValueError(f"look {look!r}: looks are counted from 1")
    return alpha * 6.0 / (math.pi**2 * look**2)


def quantile_bound_ranks(n: int, q: float, alpha: float) -> tuple[int, int]:
    """1-based ranks (lower, upper) of the order statistics of an n-sample that bound its q-quantile from
    below and above, each wrong with probability at most `alpha` (0 where no rank does: too few requests).

    With B ~ Binomial(n, q) the count of draws at or below the true quantile, the r-th smallest draw lies
    below it exactly when B >= r: the upper rank is the smallest r with P(B >= r) <= alpha, the lower the
    largest r with P(B <= r - 1) <= alpha."""
    # scipy.stats takes 0.6 s to import: paid when an analysis first judges, not by every server that loads gates
    from scipy import stats

    ranks = np.arange(1, n + 1)
    above = np.flatnonzero(stats.binom.sf(ranks - 1, n, q) <= alpha)
    below = np.flatnonzero(stats.binom.cdf(ranks - 1, n, q) <= alpha)
    return (int(ranks[below[-1]]) if below.size else 0), (int(ranks[above[0]]) if above.size else 0)


def quantile_bounds(values: np.ndarray, q: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided bounds (lower, upper) of the q-quantile of each row of sorted `values` (shape (..., n)):
    -inf / +inf where the sample is too small to give one."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    lower_rank, upper_rank = quantile_bound_ranks(n, q, alpha)
    shape = values.shape[:-1]
    lower = values[..., lower_rank - 1] if lower_rank else np.full(shape, -np.inf)
    upper = values[..., upper_rank - 1] if upper_rank else np.full(shape, np.inf)
    return np.asarray(lower), np.asarray(upper)


def requests_for_quantile(q: float, alpha: float) -> int:
    """The fewest requests whose largest answer bounds the q-quantile from above (1 - q^n >= 1 - alpha)."""
    return int(math.ceil(math.log(alpha) / math.log(q)))


def share_bounds(k: ArrayLike, n: ArrayLike, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Clopper-Pearson one-sided bounds (lower, upper) of a share seen as k of n, each wrong with
    probability at most `alpha` (0 and 1 when n is 0)."""
    from scipy import stats

    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha, k, n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, n - k), 1.0)
    return np.nan_to_num(lower, nan=0.0), np.nan_to_num(upper, nan=1.0)


def requests_to_settle_share(
    k: int, n: int, alpha: float, max_share: float | None = None, min_share: float | None = None
) -> int | None:
    """How many more requests, all of them good (no error; right), would bring the share's bound inside its
    range (`upper <= max_share` / `lower >= min_share`); None when not within MAX_REQUESTS."""

    def settled(more: int) -> bool:
        good = k if max_share is not None else k + more  # k counts bad events for a max, good ones for a min
        lower, upper = share_bounds(good, n + more, alpha)
        return (max_share is None or float(upper) <= max_share) and (min_share is None or float(lower) >= min_share)

    if settled(0):
        return 0
    low, high = 0, 1
    while not settled(high):
        if high >= MAX_REQUESTS:
            return None
        low, high = high, min(2 * high, MAX_REQUESTS)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if settled(mid) else (mid, high)
    return high
