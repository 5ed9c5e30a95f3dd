"""Multi-criteria ranking of the candidates that passed a stage's hard gates.

Criteria: quality (benefit), p95 latency (cost), peak memory (cost), license tier (benefit; permitted
3 ... unknown 0). Weights come from the stage policy.

Library use (pymcdm 1.4): `pymcdm.methods.WSM` (weighted sum) and `pymcdm.methods.TOPSIS`, both on
min-max normalised columns (`pymcdm.normalizations.minmax_normalization`), and
`pymcdm.helpers.rrankdata` for ranks. Hand-written, because pymcdm has no equivalent:
- the Pareto front (pymcdm has no dominance filter);
- the +/-20 % weight sensitivity table (`pymcdm.helpers.param_sensitivity` varies a method's
  constructor parameter, not the criteria weights);
- the degenerate cases pymcdm does not handle: one alternative, or alternatives equal on every
  criterion (TOPSIS divides 0 by 0 and returns NaN; here they tie), and criteria of weight 0 (pymcdm
  warns), which are dropped first. pymcdm's validation is switched off (`validation=False`) because
  it warns on every dominated alternative, which is the normal case here; inputs are checked here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from evals.records import CandidateEvidence
from gates.evaluate import SIGNED_KINDS
from gates.policy import CRITERIA, LICENSE_TIERS, StagePolicy
from gates.results import GateResult, operating_records

TIER_SCORE = {tier: len(LICENSE_TIERS) - 1 - i for i, tier in enumerate(LICENSE_TIERS)}  # permitted 3 .. unknown 0
CRITERION_TYPES = {"quality": 1, "latency": -1, "memory": -1, "license": 1}  # 1 benefit, -1 cost


@dataclass(frozen=True)
class Alternative:
    """One candidate's operating point, as the decision matrix sees it."""

    candidate: str
    quality: float
    latency: float
    memory: float
    license: float
    record_id: str = ""

    def row(self) -> list[float]:
        return [getattr(self, c) for c in CRITERIA]


def alternative(evidence: CandidateEvidence, stage: StagePolicy) -> Alternative | None:
    """The criteria values of a candidate at the stage's operating point; None without a validated record."""
    records = operating_records(evidence, stage)
    primary = next((r for r in records if r.task == stage.operating_point.task), None)
    if primary is None:
        return None
    tier = evidence.license.tier if evidence.license else "unknown"
    return Alternative(
        evidence.candidate,
        primary.accuracy,
        primary.latency_p95_s,
        max((r.peak_mem_mb for r in records if r.peak_mem_mb is not None), default=math.nan),  # nan: an API model's
        float(TIER_SCORE.get(tier, 0)),
        primary.record_id,
    )


def _active(weights: dict[str, float]) -> list[str]:
    return [c for c in CRITERIA if weights.get(c, 0.0) > 0]


def _scores(matrix: np.ndarray, weights: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(weighted sum, TOPSIS) preferences, higher is better, for rows of `matrix` (columns: CRITERIA)."""
    active = _active(weights)
    cols = [CRITERIA.index(c) for c in active]
    sub = matrix[:, cols].astype(float)
    w = np.array([weights[c] for c in active], dtype=float)
    w = w / w.sum()
    types = np.array([CRITERION_TYPES[c] for c in active])
    if len(sub) == 1:
        return np.ones(1), np.ones(1)
    # pymcdm imports matplotlib.pyplot with its package (0.4 s): a server or a CLI that never ranks skips it
    from pymcdm.methods import TOPSIS, WSM
    from pymcdm.normalizations import minmax_normalization

    wsum = WSM(normalization_function=minmax_normalization)(sub, w, types, validation=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        topsis = TOPSIS(normalization_function=minmax_normalization)(sub, w, types, validation=False)
    # All alternatives equal on every criterion: TOPSIS gives 0/0; they tie.
    return wsum, np.nan_to_num(topsis, nan=1.0)


def undominated(alternatives: list[Alternative]) -> list[bool]:
    """True for each alternative that no other one dominates (at least as good everywhere, better somewhere)."""
    signed = np.array([[v * CRITERION_TYPES[c] for c, v in zip(CRITERIA, a.row())] for a in alternatives])
    front = []
    for i in range(len(signed)):
        dominated = any(
            np.all(signed[j] >= signed[i]) and np.any(signed[j] > signed[i]) for j in range(len(signed)) if j != i
        )
        front.append(not dominated)
    return front


def rank(alternatives: list[Alternative], weights: dict[str, float]) -> pd.DataFrame:
    """Scores and ranks (1 = best) by weighted sum and TOPSIS, plus Pareto membership; best TOPSIS first."""
    columns = [
        "candidate",
        *CRITERIA,
        "weighted_sum",
        "topsis",
        "rank_weighted_sum",
        "rank_topsis",
        "pareto",
        "record_id",
    ]
    if not alternatives:
        return pd.DataFrame(columns=columns)
    from pymcdm.helpers import rrankdata

    matrix = np.array([a.row() for a in alternatives])
    wsum, topsis = _scores(matrix, weights)
    frame = pd.DataFrame(
        {
            "candidate": [a.candidate for a in alternatives],
            **{c: matrix[:, i] for i, c in enumerate(CRITERIA)},
            "weighted_sum": wsum,
            "topsis": topsis,
            "rank_weighted_sum": rrankdata(wsum).astype(int),
            "rank_topsis": rrankdata(topsis).astype(int),
            "pareto": undominated(alternatives),
            "record_id": [a.record_id for a in alternatives],
        }
    )
    return frame.sort_values(["rank_topsis", "candidate"]).reset_index(drop=True)[columns]


def sensitivity(alternatives: list[Alternative], weights: dict[str, float], delta: float = 0.2) -> pd.DataFrame:
    """Does the ranking hold when each weight moves by +/-delta (others rescaled to sum to 1)?

    One row per (criterion, direction): the perturbed weight, the top candidate by each method and
    whether each method's full ranking equals the unperturbed one.
    """
    base = rank(alternatives, weights)
    rows = []
    for criterion in CRITERIA:
        for direction in (-1, 1):
            moved = dict(weights)
            moved[criterion] = weights.get(criterion, 0.0) * (1 + direction * delta)
            total = sum(moved.values())
            moved = {c: v / total for c, v in moved.items()}
            ranked = rank(alternatives, moved)
            rows.append(
                {
                    "criterion": criterion,
                    "change": f"{direction * delta:+.0%}",
                    "weight": round(moved[criterion], 4),
                    "top_weighted_sum": _top(ranked, "rank_weighted_sum"),
                    "top_topsis": _top(ranked, "rank_topsis"),
                    "weighted_sum_ranking_holds": _order(ranked, "rank_weighted_sum")
                    == _order(base, "rank_weighted_sum"),
                    "topsis_ranking_holds": _order(ranked, "rank_topsis") == _order(base, "rank_topsis"),
                }
            )
    return pd.DataFrame(rows)


def _order(frame: pd.DataFrame, column: str) -> list[str]:
    return list(frame.sort_values([column, "candidate"])["candidate"])


def _top(frame: pd.DataFrame, column: str) -> str | None:
    order = _order(frame, column)
    return order[0] if order else None


def score_survivors(
    candidates: list[CandidateEvidence], gate_results: dict[str, list[GateResult]], stage: StagePolicy
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Hard gates filter, scores rank: (ranking of survivors, sensitivity table, who was filtered and why).

    The gates that judge a measurement filter; a sign-off gate (`SIGNED_KINDS`) still open does not: the version
    is ranked on its evidence, its `open_signoffs` column names what keeps it from being promotable ("" when
    nothing does)."""
    signed = {g.name for g in stage.gates if g.kind in SIGNED_KINDS}
    survivors, filtered, pending = [], [], {}
    for evidence in candidates:
        results = gate_results.get(evidence.candidate, [])
        alt = alternative(evidence, stage)
        measured = [r for r in results if r.gate not in signed]
        if results and all(r.passed for r in measured) and alt is not None:
            survivors.append(alt)
            pending[evidence.candidate] = ", ".join(r.gate for r in results if r.gate in signed and not r.passed)
        else:
            failed = [f"{r.gate}: {r.reason}" for r in results if not r.passed] or ["no gate results"]
            filtered.append({"candidate": evidence.candidate, "failed_gates": failed})
    filtered_frame = pd.DataFrame(filtered, columns=["candidate", "failed_gates"])
    ranking = rank(survivors, stage.weights)
    ranking["open_signoffs"] = [pending.get(c, "") for c in ranking.candidate]
    return ranking, sensitivity(survivors, stage.weights), filtered_frame
