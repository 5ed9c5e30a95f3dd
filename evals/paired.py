"""Paired speed evidence: a candidate and a baseline timed interleaved on the same prompts, with intervals.

A ratio of two sides measured one after the other is mostly the change of the machine's load between them. Here
each item is decoded by both sides back to back, in an order drawn per pair, over R rounds; a change of load
that is slower than a pair lands on both sides of it alike. Each ratio carries a 95% interval from a bootstrap
that resamples items and, within each item, rounds (the pairs stay whole), so a reviewer can recompute every
figure from the raw timings kept in the record.

Ratios are candidate / baseline: below 1 the candidate's latency is shorter (`p50`, `p95`); above 1 its text
tokens per second are more (`tokens_per_s`).

The steadiness rule: the same item's paired ratio should repeat from round to round. When, over the items, the
median of (largest / smallest paired ratio of that item across rounds) exceeds `UNSTEADY_SPREAD`, the load
changed within pairs (faster than a pair lasts), which pairing cannot cancel: the measurement says the host was
unsteady, and a gate reads it as inconclusive, never as pass or fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

RATIOS = ("p50", "p95", "tokens_per_s")
UNSTEADY_SPREAD = 1.5  # median over items of max/min of an item's paired ratio across rounds
RESAMPLES = 2000
MIN_ROUNDS = 2  # steadiness is read from the rounds: one round cannot show it


@dataclass(frozen=True)
class RatioEstimate:
    """A figure (mostly a ratio) with its 95% interval (percentile bootstrap, or Wilson for a share)."""

    estimate: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not (self.low <= self.estimate <= self.high):  # a percentile interval can miss its own point only by
            object.__setattr__(self, "low", min(self.low, self.estimate))  # rounding; widen, never narrow
            object.__setattr__(self, "high", max(self.high, self.estimate))

    def inverse(self) -> RatioEstimate:
        """The same evidence read the other way round (a latency ratio as a speedup)."""
        return RatioEstimate(1 / self.estimate, 1 / self.high, 1 / self.low)

    def covers(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self, digits: int = 2) -> str:
        """`9.3x (7.8-11x)`."""
        return f"{self.estimate:.{digits}g}x ({self.low:.{digits}g}-{self.high:.{digits}g}x)"

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 6) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RatioEstimate:
        return cls(float(data["estimate"]), float(data["low"]), float(data["high"]))


@dataclass(frozen=True)
class PairedTimings:
    """Raw timings of a paired measurement: seconds per request, [round][item], each side; the text tokens each
    item's answer holds (before EOS); and, per pair, whether the candidate decoded first."""

    candidate_s: tuple[tuple[float, ...], ...]
    baseline_s: tuple[tuple[float, ...], ...]
    candidate_tokens: tuple[int, ...]
    baseline_tokens: tuple[int, ...]
    candidate_first: tuple[tuple[bool, ...], ...]

    def __post_init__(self) -> None:
        rounds, items = len(self.candidate_s), len(self.candidate_tokens)
        shapes = [
            len(self.baseline_s) == rounds == len(self.candidate_first),
            len(self.baseline_tokens) == items,
            all(len(row) == items for row in (*self.candidate_s, *self.baseline_s, *self.candidate_first)),
        ]
        if not all(shapes) or rounds == 0 or items == 0:
            raise ValueError(f"paired timings: expected [round][item] arrays of one shape, got {rounds} rounds")
        every = [t for row in (*self.candidate_s, *self.baseline_s) for t in row]
        if not all(np.isfinite(t) and t > 0 for t in every):
            raise ValueError("paired timings: every request time must be a positive, finite number of seconds")

    @property
    def rounds(self) -> int:
        return len(self.candidate_s)

    @property
    def items(self) -> int:
        return len(self.candidate_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate_s": [[round(t, 7) for t in row] for row in self.candidate_s],
            "baseline_s": [[round(t, 7) for t in row] for row in self.baseline_s],
            "candidate_tokens": list(self.candidate_tokens),
            "baseline_tokens": list(self.baseline_tokens),
            "candidate_first": [list(row) for row in self.candidate_first],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PairedTimings:
        def grid(key: str, cast: Callable[[Any], Any]) -> tuple[tuple[Any, ...], ...]:
            return tuple(tuple(cast(v) for v in row) for row in data[key])

        return cls(
            grid("candidate_s", float),
            grid("baseline_s", float),
            tuple(int(v) for v in data["candidate_tokens"]),
            tuple(int(v) for v in data["baseline_tokens"]),
            grid("candidate_first", bool),
        )


def measure_paired(
    candidate: Callable[[int], int],
    baseline: Callable[[int], int],
    items: int,
    rounds: int,
    warmup: int = 1,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> PairedTimings:
    """Time `candidate(i)` and `baseline(i)` (each decodes item i and returns its text tokens) for every item,
    back to back in an order drawn per pair, over `rounds` rounds, after `warmup` untimed items per side. The
    first error raised by a side ends the measurement (a speed figure over the requests that happened to work
    would flatter the side that failed)."""
    if items < 1 or rounds < MIN_ROUNDS:
        raise ValueError(f"paired measurement: needs >= 1 item and >= {MIN_ROUNDS} rounds, got {items}, {rounds}")
    for i in range(warmup):
        candidate(i % items)
        baseline(i % items)
    order = np.random.default_rng(seed).random((rounds, items)) < 0.5
    times: dict[str, list[list[float]]] = {"candidate": [], "baseline": []}
    tokens: dict[str, list[int]] = {"candidate": [0] * items, "baseline": [0] * items}
    sides = {"candidate": candidate, "baseline": baseline}
    for r in range(rounds):
        row = {"candidate": [0.0] * items, "baseline": [0.0] * items}
        for i in range(items):
            for side in ("candidate", "baseline") if order[r, i] else ("baseline", "candidate"):
                start = clock()
                made = sides[side](i)
                row[side][i] = clock() - start
                if r == 0:
                    tokens[side][i] = made
        times["candidate"].append(row["candidate"])
        times["baseline"].append(row["baseline"])
    return PairedTimings(
        tuple(tuple(row) for row in times["candidate"]),
        tuple(tuple(row) for row in times["baseline"]),
        tuple(tokens["candidate"]),
        tuple(tokens["baseline"]),
        tuple(tuple(bool(v) for v in row) for row in order),
    )


def _statistic(name: str, mine: np.ndarray, theirs: np.ndarray, my_tok: np.ndarray, their_tok: np.ndarray) -> Any:
    """The ratio `name` over the last axis (one value per resample)."""
    if name == "p50":
        return np.median(mine, axis=-1) / np.median(theirs, axis=-1)
    if name == "p95":
        return np.percentile(mine, 95, axis=-1) / np.percentile(theirs, 95, axis=-1)
    if name == "tokens_per_s":  # text tokens per busy second of each side, over the same requests
        mine_rate = my_tok.sum(axis=-1) / mine.sum(axis=-1)
        their_rate = their_tok.sum(axis=-1) / theirs.sum(axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(their_rate > 0, mine_rate / np.where(their_rate > 0, their_rate, 1), np.nan)
    raise ValueError(f"unknown paired ratio {name!r}; expected one of {', '.join(RATIOS)}")


def paired_ratios(timings: PairedTimings, resamples: int = RESAMPLES, seed: int = 0) -> dict[str, RatioEstimate | None]:
    """Each ratio of `RATIOS` with its 95% interval: a bootstrap drawing items, then rounds within each drawn
    item, so both the prompts' and the load's variation widen it. None where a side made no text tokens."""
    mine = np.asarray(timings.candidate_s, dtype=float)  # [round, item]
    theirs = np.asarray(timings.baseline_s, dtype=float)
    my_tok = np.broadcast_to(np.asarray(timings.candidate_tokens, dtype=float), mine.shape)
    their_tok = np.broadcast_to(np.asarray(timings.baseline_tokens, dtype=float), theirs.shape)
    rng = np.random.default_rng(seed)
    n_rounds, n_items = mine.shape
    items = rng.integers(0, n_items, (resamples, n_items))[:, :, None]  # [b, item, 1]
    rounds = rng.integers(0, n_rounds, (resamples, n_items, n_rounds))  # [b, item, round]

    def drawn(values: np.ndarray) -> np.ndarray:
        return values[rounds, items].reshape(resamples, -1)

    out: dict[str, RatioEstimate | None] = {}
    for name in RATIOS:
        point = float(_statistic(name, mine.ravel(), theirs.ravel(), my_tok.ravel(), their_tok.ravel()))
        if not np.isfinite(point) or point <= 0:
            out[name] = None
            continue
        spread = _statistic(name, drawn(mine), drawn(theirs), drawn(my_tok), drawn(their_tok))
        spread = spread[np.isfinite(spread)]
        low, high = np.percentile(spread, [2.5, 97.5]) if len(spread) else (point, point)
        out[name] = RatioEstimate(point, float(low), float(high))
    return out


def block_ratio(
    mine: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]], resamples: int = RESAMPLES, seed: int = 0
) -> RatioEstimate | None:
    """Text tokens per wall second of `mine` over `theirs`, where block i of each side ran in round i of one
    paired load test (evals.loadtest): the point over every round, and a 95% interval from a bootstrap drawing
    rounds (a drawn round brings both sides' blocks). None with fewer than 2 rounds (no spread to read), rounds
    of unequal count, or a block whose tokens were not counted or that made none."""
    if len(mine) != len(theirs) or len(mine) < 2:
        return None
    if any(not b.get("counted", True) or b["wall_s"] <= 0 for b in [*mine, *theirs]):
        return None
    tok_m, wall_m = (np.array([float(b[k]) for b in mine]) for k in ("tokens", "wall_s"))
    tok_t, wall_t = (np.array([float(b[k]) for b in theirs]) for k in ("tokens", "wall_s"))
    if tok_m.sum() <= 0 or tok_t.sum() <= 0:
        return None
    point = float((tok_m.sum() / wall_m.sum()) / (tok_t.sum() / wall_t.sum()))
    draw = np.random.default_rng(seed).integers(0, len(mine), (resamples, len(mine)))
    mine_rate = tok_m[draw].sum(axis=1) / wall_m[draw].sum(axis=1)
    their_rate = tok_t[draw].sum(axis=1) / wall_t[draw].sum(axis=1)
    spread = (mine_rate / np.where(their_rate > 0, their_rate, np.nan))[their_rate > 0]
    low, high = np.percentile(spread, [2.5, 97.5]) if len(spread) else (point, point)
    return RatioEstimate(point, float(low), float(high))


def round_ratio(
    reference_s: Sequence[float], row_s: Sequence[float], resamples: int = RESAMPLES, seed: int = 0
) -> RatioEstimate | None:
    """The reference's median seconds over the row's (a speedup), where repetition k of both ran in round k (their
    order in a round drawn per round, evals.bench), with a 95% interval from a bootstrap drawing rounds: a drawn
    round brings both sides' times. None with fewer than 2 rounds, unequal counts, or a time that is not positive."""
    ref, row = np.asarray(reference_s, dtype=float), np.asarray(row_s, dtype=float)
    if len(ref) != len(row) or len(ref) < MIN_ROUNDS or not (np.all(ref > 0) and np.all(row > 0)):
        return None
    draw = np.random.default_rng(seed).integers(0, len(ref), (resamples, len(ref)))
    spread = np.median(ref[draw], axis=1) / np.median(row[draw], axis=1)
    low, high = np.percentile(spread, [2.5, 97.5])
    return RatioEstimate(float(np.median(ref) / np.median(row)), float(low), float(high))


def block_rate(blocks: Sequence[Mapping[str, Any]], resamples: int = RESAMPLES, seed: int = 0) -> RatioEstimate | None:
    """One side's text tokens per wall second over its blocks (the rounds of a load test), with a 95% interval
    from a bootstrap drawing blocks; None with fewer than 2 blocks, an uncounted one, or no tokens at all."""
    if len(blocks) < 2 or any(not b.get("counted", True) or b["wall_s"] <= 0 for b in blocks):
        return None
    tokens, wall = (np.array([float(b[k]) for b in blocks]) for k in ("tokens", "wall_s"))
    if tokens.sum() <= 0:
        return None
    draw = np.random.default_rng(seed).integers(0, len(blocks), (resamples, len(blocks)))
    low, high = np.percentile(tokens[draw].sum(axis=1) / wall[draw].sum(axis=1), [2.5, 97.5])
    return RatioEstimate(float(tokens.sum() / wall.sum()), float(low), float(high))


def rounds_percentile_ratio(
    mine: Sequence[Sequence[float]],
    theirs: Sequence[Sequence[float]],
    q: float,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> RatioEstimate | None:
    """The `q`-th percentile of `mine`'s request latencies over `theirs`, where round i of each side ran in round i
    of one paired load test: the point over every request, and a 95% interval from a bootstrap drawing rounds (a
    drawn round brings both sides' requests). None with fewer than 2 rounds, unequal counts, or an empty side."""
    if len(mine) != len(theirs) or len(mine) < MIN_ROUNDS or not all(mine) or not all(theirs):
        return None
    every_m, every_t = (np.concatenate([np.asarray(r, dtype=float) for r in side]) for side in (mine, theirs))
    point = float(np.percentile(every_m, q) / np.percentile(every_t, q))
    draw = np.random.default_rng(seed).integers(0, len(mine), (resamples, len(mine)))
    spread = [
        np.percentile(np.concatenate([mine[i] for i in rounds]), q)
        / np.percentile(np.concatenate([theirs[i] for i in rounds]), q)
        for rounds in draw
    ]
    low, high = np.percentile(spread, [2.5, 97.5])
    return RatioEstimate(point, float(low), float(high))


def round_spread(timings: PairedTimings) -> float:
    """The median over items of (largest / smallest paired ratio of the item across rounds): 1.0 when each
    item's candidate/baseline ratio repeats exactly."""
    ratio = np.asarray(timings.candidate_s, dtype=float) / np.asarray(timings.baseline_s, dtype=float)
    return float(np.median(ratio.max(axis=0) / ratio.min(axis=0)))


def is_steady(spread: float) -> bool:
    return spread <= UNSTEADY_SPREAD


def host_sample() -> dict[str, float]:
    """The host's 1-minute load average and its CPU time counters (jiffies: total, idle, steal), where Linux
    exposes them; {} elsewhere."""
    sample: dict[str, float] = {}
    try:
        with open("/proc/loadavg") as f:
            sample["load_1m"] = float(f.read().split()[0])
        with open("/proc/stat") as f:
            cpu = [float(v) for v in f.readline().split()[1:]]
        sample |= {"total": sum(cpu[:8]), "idle": cpu[3] + (cpu[4] if len(cpu) > 4 else 0.0)}
        sample["steal"] = cpu[7] if len(cpu) > 7 else 0.0
    except (OSError, ValueError, IndexError):
        pass
    return sample


def host_during(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The host's state over a measurement: load average at its start and end, and the shares of CPU time
    that were busy and stolen by the hypervisor between the two samples."""
    out: dict[str, float] = {}
    if "load_1m" in before and "load_1m" in after:
        out |= {"load_1m_start": before["load_1m"], "load_1m_end": after["load_1m"]}
    span = after.get("total", 0.0) - before.get("total", 0.0)
    if span > 0:
        out["busy_share"] = round(1 - (after["idle"] - before["idle"]) / span, 4)
        out["steal_share"] = round((after["steal"] - before["steal"]) / span, 4)
    return out
