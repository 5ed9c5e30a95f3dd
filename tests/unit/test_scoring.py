"""Multi-criteria ranking: hard gates filter first, weighted sum and TOPSIS rank, Pareto front, sensitivity."""

from __future__ import annotations

import numpy as np
import pytest

from gates import evaluate_gates, load_policy
from gates.scoring import Alternative, alternative, rank, score_survivors, sensitivity, undominated
from tests.support.gate_fixtures import evidence, fast_llada, record, signoffs

POLICY = load_policy()
WEIGHTS = POLICY.stage("poc").weights

A = Alternative("accurate", quality=0.90, latency=0.50, memory=900, license=3)
B = Alternative("fast", quality=0.85, latency=0.10, memory=400, license=3)
C = Alternative("dominated", quality=0.65, latency=0.20, memory=800, license=2)


def test_rank_orders_by_both_methods_and_marks_the_pareto_front():
    table = rank([A, B, C], WEIGHTS)
    assert list(table["candidate"]) == ["fast", "accurate", "dominated"]
    assert table.set_index("candidate")["pareto"].to_dict() == {"fast": True, "accurate": True, "dominated": False}
    assert table["rank_weighted_sum"].tolist()[-1] == 3 and table["rank_topsis"].tolist() == [1, 2, 3]
    assert ((table["topsis"] >= 0) & (table["topsis"] <= 1)).all()


def test_weights_decide_between_pareto_optimal_candidates():
    by_quality = rank([A, B], {"quality": 0.9, "latency": 0.1, "memory": 0.0, "license": 0.0})
    by_speed = rank([A, B], {"quality": 0.1, "latency": 0.9, "memory": 0.0, "license": 0.0})
    assert by_quality["candidate"][0] == "accurate" and by_speed["candidate"][0] == "fast"


def test_degenerate_inputs_tie_instead_of_nan():
    one = rank([A], WEIGHTS)
    assert one["topsis"].tolist() == [1.0] and one["rank_topsis"].tolist() == [1]
    twins = rank([A, Alternative("twin", 0.90, 0.50, 900, 3)], WEIGHTS)
    assert not np.isnan(twins["topsis"]).any()
    assert rank([], WEIGHTS).empty


def test_pareto_front():
    assert undominated([A, B, C]) == [True, True, False]


def test_sensitivity_table_moves_each_weight_by_20_percent():
    table = sensitivity([A, B, C], WEIGHTS)
    assert len(table) == 8 and set(table["change"]) == {"-20%", "+20%"}
    assert set(table["criterion"]) == {"quality", "latency", "memory", "license"}
    assert table["topsis_ranking_holds"].all()
    moved = table[(table.criterion == "quality") & (table.change == "+20%")]["weight"].item()
    assert moved == pytest.approx(0.4 * 1.2 / (1 + 0.4 * 0.2), abs=1e-4)
    # a close call flips: equal weights on quality and latency, near-equal alternatives
    close = sensitivity(
        [Alternative("q", 0.80, 0.30, 500, 3), Alternative("l", 0.70, 0.20, 500, 3)],
        {"quality": 0.5, "latency": 0.5, "memory": 0.0, "license": 0.0},
    )
    assert not close["weighted_sum_ranking_holds"].all()


def test_hard_gates_filter_before_scores_rank():
    stage = POLICY.stage("production")
    base = {"fallback": evidence("tiny-ar"), "production": None}
    signed = signoffs("tooling-maturity")
    slow, fast, ar = evidence(), fast_llada(), evidence("tiny-ar")
    fast = type(fast)(**{**fast.__dict__, "candidate": "tiny-llada-fast"})
    results = {e.candidate: evaluate_gates(e, POLICY, "production", base, signed) for e in (slow, fast, ar)}
    ranking, table, filtered = score_survivors([slow, fast, ar], results, stage)
    assert set(ranking["candidate"]) == {"tiny-llada-fast", "tiny-ar"}
    assert filtered.set_index("candidate").loc["tiny-llada", "failed_gates"][0].startswith("speedup:")
    assert len(table) == 8


def test_alternative_reads_the_operating_point():
    alt = alternative(evidence(tier="caution"), POLICY.stage("poc"))
    assert (alt.quality, alt.latency, alt.memory, alt.license) == (0.72, 0.18, 430.0, 2.0)
    assert alternative(evidence(records=[record(valid=None)]), POLICY.stage("poc")) is None
