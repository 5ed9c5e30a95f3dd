"""Accuracy under parallelism (AUP): one number for how much parallel decoding a model can take.

AUP is the measure of d3LLM (Qian et al., "d3LLM: Ultra-Fast Diffusion LLM using Pseudo-Trajectory
Distillation", arXiv:2601.07568, 2026; the dLLM leaderboard's `aup_utils.py` and the blog
https://hao-ai-lab.github.io/blogs/text-diffusion/). It does not depend on the machine: its x axis is
tokens per forward (TPF, positions committed per model call), not tokens per second.

Given operating points (rho_i, y_i) of one model on one task (TPF, accuracy in percent), sorted by TPF:

- the points more than `max_drop` (5 points) below the accuracy of the least parallel point are left out;
- AUP = rho_1 * y_1 + sum_{i>=2} (rho_i - rho_{i-1}) * (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2,
  the area under the accuracy-vs-TPF curve from 0, by the trapezoid rule, where
- W(y) = min(exp(-alpha * (1 - y / y_max)), 1), alpha = 3, weights down accuracy lost against y_max,
  the best accuracy of the compared points (the paper: of all methods on the task).

Accuracy goes in as a share in [0, 1] (unmask's records) and is scaled to percent inside, so a value
reads on the paper's scale: vanilla decoding alone (TPF 1) at 90% scores 90; the same 90% held up to
TPF 4 scores 360.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from evals.plots import point_label

ALPHA = 3.0  # the paper's penalty for accuracy below y_max
MAX_DROP = 0.05  # points more than 5 accuracy points below the least parallel one are not on the curve


def quality_weight(y: float, y_max: float, alpha: float = ALPHA) -> float:
    """W(y) = min(exp(-alpha (1 - y / y_max)), 1): 1 at the best accuracy, e^-alpha at none."""
    if y_max <= 0:
        return 1.0
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


@dataclass(frozen=True)
class AUPResult:
    """The AUP of one curve and the points it was computed from (accuracy as a share, TPF as measured)."""

    aup: float
    points: tuple[tuple[float, float], ...]  # (tpf, accuracy) on the curve, by TPF
    dropped: tuple[tuple[float, float], ...] = ()  # points left out: over `max_drop` below the first
    y_max: float = 0.0
    labels: tuple[str, ...] = field(default=(), compare=False)  # what each point on the curve is (a config name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "aup": self.aup,
            "y_max": self.y_max,
            "points": [list(p) for p in self.points],
            "dropped": [list(p) for p in self.dropped],
            "labels": list(self.labels),
        }


def aup(
    points: Iterable[tuple[float, float]],
    y_max: float | None = None,
    *,
    alpha: float = ALPHA,
    max_drop: float = MAX_DROP,
    labels: Iterable[str] | None = None,
) -> AUPResult:
    """The AUP of (tokens per forward, accuracy in [0, 1]) points; `y_max` defaults to their best accuracy.

    ValueError names a point with a TPF that is not positive or an accuracy outside [0, 1]."""
    pairs = [(float(t), float(a)) for t, a in points]
    names = list(labels) if labels is not None else [""] * len(pairs)
    if not pairs:
        raise ValueError("aup: no points (tokens per forward, accuracy) given")
    for tpf, acc in pairs:
        if not (math.isfinite(tpf) and tpf > 0):
            raise ValueError(f"aup: tokens per forward must be a positive number, got {tpf!r}")
        if not (math.isfinite(acc) and 0.0 <= acc <= 1.0):
            raise ValueError(f"aup: accuracy must be a share in [0, 1], got {acc!r}")
    order = sorted(range(len(pairs)), key=lambda i: (pairs[i][0], -pairs[i][1]))
    first = pairs[order[0]][1]
    kept = [i for i in order if pairs[i][1] >= first - max_drop - 1e-12]
    dropped = tuple(pairs[i] for i in order if i not in kept)
    best = max(a for _, a in pairs) if y_max is None else float(y_max)
    curve = [(pairs[i][0], 100.0 * pairs[i][1]) for i in kept]
    top = 100.0 * best
    area = curve[0][0] * curve[0][1]
    for (r0, y0), (r1, y1) in zip(curve, curve[1:]):
        area += 0.5 * (r1 - r0) * (y1 * quality_weight(y1, top, alpha) + y0 * quality_weight(y0, top, alpha))
    return AUPResult(
        aup=area,
        points=tuple(pairs[i] for i in kept),
        dropped=dropped,
        y_max=best,
        labels=tuple(names[i] for i in kept),
    )


def tpf_at_accuracy(points: Iterable[tuple[float, float]], accuracy_floor: float) -> tuple[float, float] | None:
    """The most parallel (tpf, accuracy) point whose accuracy is at least `accuracy_floor`; None when none is."""
    above = [(float(t), float(a)) for t, a in points if a >= accuracy_floor]
    return max(above, key=lambda p: (p[0], p[1])) if above else None


def record_curves(records: Iterable[Any]) -> dict[tuple[str, str, int], AUPResult]:
    """{(candidate, task, gen_length): AUPResult} over validated records that measured TPF (one point per config).

    Records with `valid` other than True, or without a tokens-per-forward (an API model), are not on a curve."""
    groups: dict[tuple[str, str, int], list[Any]] = {}
    for r in records:
        if r.valid is True and r.tokens_per_forward:
            groups.setdefault((r.candidate, r.task, r.gen_length), []).append(r)
    return {
        key: aup([(r.tokens_per_forward, r.accuracy) for r in rows], labels=[point_label(r) or "vanilla" for r in rows])
        for key, rows in groups.items()
    }


def parallelism_summary(records: list[Any]) -> list[dict[str, Any]]:
    """AUP per candidate, task and generation length over the validated records, with the curve's points and the
    ids of the records they came from: what an evaluation folder's `parallelism.json` and a registered version's
    `evidence/evidence.json` hold (the parallelism gate and the quality-latency page compute the same numbers)."""
    rows = []
    for (candidate, task, gen_length), curve in sorted(record_curves(records).items()):
        ids = {
            (r.tokens_per_forward, r.accuracy): r.record_id
            for r in records
            if r.valid is True and (r.candidate, r.task, r.gen_length) == (candidate, task, gen_length)
        }
        rows.append(
            {
                "candidate": candidate,
                "task": task,
                "gen_length": gen_length,
                **curve.to_dict(),
                "record_ids": [ids.get(point) for point in curve.points],
            }
        )
    return rows
