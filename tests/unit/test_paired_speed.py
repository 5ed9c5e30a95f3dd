"""Paired speed evidence (evals.paired) and the speedup gate judged on its interval (gates.checks.SpeedupGate).

The timing source is simulated: each side's decode advances a clock by the item's true cost times the host's
load at that moment, so a load that changes during the run, and the true ratio, are known exactly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from evals.paired import (
    PairedTimings,
    RatioEstimate,
    host_during,
    host_sample,
    is_steady,
    measure_paired,
    paired_ratios,
    round_spread,
)
from gates.evaluate import evaluate_gates
from gates.intervals import ratio_verdict, rounds_to_settle
from gates.policy import load_policy
from tests.support import REPO
from tests.support.gate_fixtures import evidence, paired, record, serving_record

ITEMS, ROUNDS, TRUE_RATIO = 16, 4, 0.4  # the candidate takes 0.4x the baseline's time on every item
BASE_COST = [0.02 + 0.002 * i for i in range(ITEMS)]


class Host:
    """A simulated host: `load(now)` multiplies every request's cost; a little jitter per request."""

    def __init__(self, load: Callable[[float], float], seed: int = 0) -> None:
        self.now, self.load, self.rng = 0.0, load, random.Random(seed)

    def clock(self) -> float:
        return self.now

    def side(self, costs: list[float], tokens: int = 24) -> Callable[[int], int]:
        def decode(i: int) -> int:
            self.now += costs[i] * self.load(self.now) * self.rng.uniform(0.97, 1.03)
            return tokens

        return decode


def paired_on(host: Host, rounds: int = ROUNDS) -> PairedTimings:
    cand = host.side([c * TRUE_RATIO for c in BASE_COST], tokens=24)
    base = host.side(BASE_COST, tokens=24)
    return measure_paired(cand, base, ITEMS, rounds, warmup=0, seed=1, clock=host.clock)


def sequential_on(host: Host, rounds: int = ROUNDS) -> float:
    """The old procedure: every request of the baseline first, then every request of the candidate."""
    base, cand = host.side(BASE_COST), host.side([c * TRUE_RATIO for c in BASE_COST])
    times: dict[str, list[list[float]]] = {"base": [], "cand": []}
    for name, side in (("base", base), ("cand", cand)):
        for _ in range(rounds):
            row = []
            for i in range(ITEMS):
                start = host.now
                side(i)
                row.append(host.now - start)
            times[name].append(row)
    return float(np.percentile(times["cand"], 95) / np.percentile(times["base"], 95))


def test_a_load_starting_during_the_run_moves_the_sequential_ratio_and_not_the_paired_interval():
    duration = ROUNDS * sum(BASE_COST) * (1 + TRUE_RATIO)  # the run's length on a quiet host
    switch = ROUNDS * sum(BASE_COST)  # when a sequential run has measured the baseline; the paired run is 71% in
    burner = lambda now: 1.0 if now < switch else 3.0  # noqa: E731 - a CPU burner starts then
    assert 0.6 < switch / duration < 0.8

    timings = paired_on(Host(burner))
    ratios = paired_ratios(timings)
    p95 = ratios["p95"]
    assert p95 is not None and p95.covers(TRUE_RATIO), p95
    assert p95.high / p95.low < 1.5  # and it is not covering it by being vague
    assert is_steady(round_spread(timings))  # load changed between pairs, not within them: steady
    tps = ratios["tokens_per_s"]
    assert tps is not None and tps.covers(1 / TRUE_RATIO), tps

    old = sequential_on(Host(burner))
    assert not p95.covers(old) and old > 2.5 * TRUE_RATIO, old  # the old figure is mostly the burner


def test_a_load_that_changes_within_pairs_reads_as_an_unsteady_host():
    rng = random.Random(7)
    timings = paired_on(Host(lambda now: rng.choice([1.0, 4.0])))
    assert round_spread(timings) > 1.5 and not is_steady(round_spread(timings))


def test_a_steady_host_gives_a_tight_interval_around_the_true_ratio():
    timings = paired_on(Host(lambda now: 1.0))
    for name, truth in (("p50", TRUE_RATIO), ("p95", TRUE_RATIO), ("tokens_per_s", 1 / TRUE_RATIO)):
        ratio = paired_ratios(timings)[name]
        assert ratio is not None and ratio.covers(truth) and ratio.high / ratio.low < 1.2, (name, ratio)
    assert round_spread(timings) < 1.1


def test_every_pair_runs_both_sides_in_an_order_drawn_per_pair():
    calls: list[tuple[str, int]] = []

    def side(name: str) -> Callable[[int], int]:
        return lambda i: calls.append((name, i)) or 5  # type: ignore[func-returns-value]

    timings = measure_paired(side("c"), side("b"), 6, 3, warmup=1, seed=3)
    timed = calls[2:]  # after one warm-up item per side
    assert len(timed) == 6 * 3 * 2
    for k in range(0, len(timed), 2):  # each pair: both sides, one item, back to back
        (first, i), (second, j) = timed[k], timed[k + 1]
        assert i == j and {first, second} == {"c", "b"}
        r, item = divmod(k // 2, 6)
        assert timings.candidate_first[r][item] == (first == "c")
    orders = {v for row in timings.candidate_first for v in row}
    assert orders == {True, False}
    assert timings.candidate_tokens == (5,) * 6


def test_a_side_that_fails_ends_the_measurement():
    def broken(i: int) -> int:
        if i == 3:
            raise RuntimeError("NaN logits at item 3")
        return 1

    with pytest.raises(RuntimeError, match="item 3"):
        measure_paired(broken, lambda i: 1, 5, 2, warmup=0)
    with pytest.raises(ValueError, match="rounds"):
        measure_paired(lambda i: 1, lambda i: 1, 5, 1)


def test_timings_are_checked_and_round_trip_so_a_reviewer_recomputes_each_ratio():
    timings = paired_on(Host(lambda now: 1.0))
    again = PairedTimings.from_dict(timings.to_dict())
    assert paired_ratios(again) == paired_ratios(PairedTimings.from_dict(again.to_dict()))
    for name, value in paired_ratios(again).items():
        assert value is not None and math.isclose(value.estimate, paired_ratios(timings)[name].estimate, rel_tol=1e-4)
    bad = timings.to_dict()
    bad["baseline_s"][0][2] = float("nan")
    with pytest.raises(ValueError, match="positive, finite"):
        PairedTimings.from_dict(bad)
    bad = timings.to_dict()
    bad["candidate_s"][1] = bad["candidate_s"][1][:-1]
    with pytest.raises(ValueError, match="one shape"):
        PairedTimings.from_dict(bad)


def test_a_side_without_text_tokens_has_no_tokens_per_second_ratio():
    timings = paired_on(Host(lambda now: 1.0))
    silent = replace(timings, baseline_tokens=(0,) * ITEMS)
    assert paired_ratios(silent)["tokens_per_s"] is None
    assert paired_ratios(silent)["p95"] is not None


def test_ratio_estimates_read_both_ways():
    r = RatioEstimate(0.25, 0.2, 0.3)
    assert r.inverse() == RatioEstimate(4.0, 1 / 0.3, 5.0)
    assert r.text() == "0.25x (0.2-0.3x)"
    assert RatioEstimate.from_dict(r.to_dict()) == r
    assert RatioEstimate(1.0, 1.1, 1.2).low == 1.0  # a point outside its interval widens it


def test_the_host_sample_names_load_and_cpu_shares_on_linux():
    before = host_sample()
    sum(i * i for i in range(200_000))
    during = host_during(before, host_sample())
    if before:  # Linux: /proc is there
        assert {"load_1m_start", "load_1m_end"} <= set(during)
        assert all(0 <= during[k] <= 1 for k in ("busy_share", "steal_share") if k in during)


def test_a_ratio_is_pass_or_fail_only_when_its_whole_interval_says_so():
    assert ratio_verdict(RatioEstimate(2.0, 1.5, 2.5), 1.0) == "pass"
    assert ratio_verdict(RatioEstimate(0.5, 0.4, 0.6), 1.0) == "fail"
    assert ratio_verdict(RatioEstimate(1.1, 0.9, 1.3), 1.0) == "inconclusive"
    need = rounds_to_settle(RatioEstimate(1.1, 0.9, 1.3), 1.0, 4)
    assert need is not None and need > 4
    assert rounds_to_settle(RatioEstimate(1.0, 0.9, 1.1), 1.0, 4) is None  # on the bound: never settles
    closer = rounds_to_settle(RatioEstimate(1.05, 0.9, 1.2), 1.0, 4)
    assert closer is not None and closer > need  # nearer the bound, more rounds


POLICY = load_policy()  # the bundled policy: production asks min_speedup 1.0 over the fallback


def speedup(ev, base=None):
    results = evaluate_gates(ev, POLICY, "production", {"fallback": base or evidence("tiny-ar")})
    return next(r for r in results if r.gate == "speedup")


def with_speed(ratio: float, **overrides):
    mine, theirs = record(), record("tiny-ar")
    return evidence(speed=[paired(mine, theirs, ratio=ratio, **overrides)])


def test_the_speedup_gate_passes_fails_or_waits_on_the_interval():
    fast = speedup(with_speed(0.4))  # candidate p95 0.4x the fallback's: 2.5x faster, every pair alike
    assert fast.verdict == "pass" and fast.value == 2.5 and fast.evidence["ci95"] == [2.5, 2.5]
    assert "paired: 3 rounds x 8 items" in fast.reason
    slow = speedup(with_speed(2.0))
    assert slow.verdict == "fail" and slow.value == 0.5

    mine, theirs = record(), record("tiny-ar")
    noisy = paired(mine, theirs, ratio=1.0)
    spanning = replace(noisy, ratios=noisy.ratios | {"p95": {"estimate": 0.95, "low": 0.8, "high": 1.1}})
    unsure = speedup(evidence(speed=[spanning]))
    assert unsure.verdict == "inconclusive" and "more rounds" in unsure.settle, unsure.settle
    assert unsure.evidence["rounds_needed"] > 3


def test_an_unsteady_host_is_inconclusive_whatever_the_ratio():
    mine, theirs = record(), record("tiny-ar")
    shaky = paired(mine, theirs, ratio=0.2, steady=False, spread=2.4)
    result = speedup(evidence(speed=[shaky]))
    assert result.verdict == "inconclusive" and "unsteady" in result.reason and "2.4x" in result.reason


def test_no_paired_measurement_or_one_against_other_weights_is_inconclusive():
    assert speedup(evidence(speed=[])).verdict == "inconclusive"
    mine, theirs = record(), record("tiny-ar")
    other = paired(mine, theirs, ratio=0.4, baseline_weights_sha256="f" * 64)  # another fallback build
    result = speedup(evidence(speed=[other]))
    assert result.verdict == "inconclusive" and "no paired speed measurement" in result.reason
    stale = paired(mine, theirs, ratio=0.4, baseline_config_hash="0" * 16)  # the fallback's config changed
    assert "no current paired" in speedup(evidence(speed=[stale])).reason


def test_the_fallback_against_itself_is_one_by_definition():
    result = speedup(evidence("tiny-ar"))
    assert result.verdict == "pass" and result.value == 1.0 and "itself" in result.reason


def test_the_decision_figures_show_the_paired_ratios_with_their_intervals_and_says_when_they_are_not():
    from gates.decision import figures

    stage = POLICY.stage("poc")
    fallback = evidence("tiny-ar")
    mine = with_speed(0.4)
    line = figures(mine, stage, [], fallback, "1")
    assert line.paired and line.p95_ratio == pytest.approx(0.4) and line.p95_interval is not None
    assert line.p95_text() == "2.50x faster (2.50–2.50x)" and line.tokens_per_s_text() == "2.50x (2.50–2.50x)"

    shaky = evidence(speed=[paired(record(), record("tiny-ar"), ratio=0.4, steady=False)])
    assert figures(shaky, stage, [], fallback, "1").p95_text().endswith("(host unsteady)")

    unmeasured = figures(evidence(speed=[]), stage, [], fallback, "1")
    assert unmeasured.p95_ratio is None and unmeasured.p95_text() == "—"  # no figure without pairing

    served = figures(mine, POLICY.stage("staging"), [], fallback, "1")  # one paired load test at 16
    assert served.concurrency == 16 and served.p95_text() == "1.50x slower at 16 in flight"
    assert served.tokens_per_s_text() == "1.20x (1.20–1.20x) at 16 in flight"
    apart = evidence("tiny-ar", serving=[serving_record("tiny-ar", paired_run="", blocks=[])])
    unpaired = figures(mine, POLICY.stage("staging"), [], apart, "1")
    assert unpaired.tokens_per_s_text() == "1.20x at 16 in flight, unpaired"


def test_the_serving_gate_judges_tokens_per_second_on_the_paired_interval():
    def serving(mine, theirs):
        fallback = evidence("tiny-ar", serving=[theirs])
        results = evaluate_gates(evidence(serving=[mine]), POLICY, "production", {"fallback": fallback})
        return next(r for r in results if r.gate == "serving")

    assert serving(serving_record(), serving_record("tiny-ar")).verdict == "pass"  # 1.2x, every round alike
    apart = serving(serving_record(), serving_record("tiny-ar", paired_run="another", blocks=[]))
    assert apart.verdict == "inconclusive" and "not measured in pairs" in apart.reason
    assert apart.evidence["settle_command"].startswith("unmask loadtest --model tiny-llada --model fallback")
    wobbly = [{"tokens": t, "wall_s": 1.0, "answered": 16, "counted": True, "first": True} for t in (700, 1300)] * 2
    spans = serving(serving_record(blocks=wobbly), serving_record("tiny-ar"))  # rounds at 0.875x and 1.6x
    assert spans.verdict == "inconclusive" and "spans 1.00x" in spans.reason, spans.reason
    slow = serving(serving_record(latency_p95_s=9.0, blocks=wobbly), serving_record("tiny-ar"))
    assert slow.verdict == "fail"  # a limit missed outright fails, whatever the ratio's interval


def test_a_bound_of_zero_passes_any_paired_measurement_even_on_an_unsteady_host():
    demo = load_policy(REPO / "gates" / "demo-policy.yaml")  # min_speedup 0.0: the demo asks no speed
    shaky = paired(record(), record("tiny-ar"), ratio=3.0, steady=False, spread=2.0)
    results = evaluate_gates(evidence(speed=[shaky]), demo, "poc", {"fallback": evidence("tiny-ar")})
    result = next(r for r in results if r.gate == "speedup")
    assert result.verdict == "pass" and "asks no more" in result.reason
    missing = evaluate_gates(evidence(speed=[]), demo, "poc", {"fallback": evidence("tiny-ar")})
    assert next(r for r in missing if r.gate == "speedup").verdict == "inconclusive"  # but it needs a measurement
