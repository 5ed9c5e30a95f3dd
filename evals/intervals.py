"""95% intervals of the figures a measurement reports: a share (Wilson), the difference of two shares (Newcombe),
and a percentile or a mean of per-request values (a percentile bootstrap over the requests).

Every interval here is computed from values the record keeps, with a fixed seed, so a reviewer who recomputes it
from the record gets the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

Z95 = 1.959964  # two-sided 95% normal quantile
RESAMPLES = 2000


def wilson_interval(share: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `share` measured on `n` items (0-1 when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_interval(a: float, n_a: int, b: float, n_b: int) -> tuple[float, float]:
    """A 95% interval of the difference a - b of two independent proportions (Newcombe's hybrid
    score method, built from each side's Wilson interval)."""
    lo_a, hi_a = wilson_interval(a, n_a)
    lo_b, hi_b = wilson_interval(b, n_b)
    d = a - b
    return d - math.hypot(a - lo_a, hi_b - b), d + math.hypot(hi_a - a, b - lo_b)


def bootstrap_interval(
    values: Sequence[float], q: float | None, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float, float] | None:
    """(point, low, high): the `q`-th percentile of `values` (the mean when `q` is None) and its 95% percentile
    bootstrap interval over the values; None when there are none. With one value the interval is the point."""
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if not len(data):
        return None

    def statistic(x: np.ndarray) -> Any:
        return np.mean(x, axis=-1) if q is None else np.percentile(x, q, axis=-1)

    point = float(statistic(data))
    drawn = data[np.random.default_rng(seed).integers(0, len(data), (resamples, len(data)))]
    low, high = np.percentile(statistic(drawn), [2.5, 97.5])
    return point, min(point, float(low)), max(point, float(high))


def share_interval(scores: Sequence[float]) -> tuple[float, float, float] | None:
    """(mean, low, high) of per-item scores in [0, 1]: Wilson where every score is 0 or 1 (a bootstrap would say
    [1, 1] for 16 right answers of 16), else the bootstrap of the mean (graded metrics such as char-accuracy)."""
    if not scores:
        return None
    mean = sum(scores) / len(scores)
    if all(s in (0, 1) for s in scores):
        low, high = wilson_interval(mean, len(scores))
        return mean, min(mean, low), max(mean, high)
    return bootstrap_interval(scores, None)
