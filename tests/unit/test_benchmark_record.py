"""The benchmark record: scored answers, every figure's interval recomputable from the record, the candidates
beside the fallback of one paired run, and the newest record per (host, concurrency)."""

from __future__ import annotations

import numpy as np
import pytest

from evals.benchmark import benchmark_records, latest_benchmarks
from evals.intervals import bootstrap_interval, share_interval, wilson_interval
from evals.loadtest import Answer, Cell, LoadResult, LoadSpec, score_answers, serving_records
from evals.paired import RatioEstimate, block_rate, block_ratio, round_ratio, rounds_percentile_ratio
from registry.views import BENCHMARK_COLUMNS, benchmark_frame

TARGETS = ["5", "7", "9", "11"]


def _answer(model: str, prompt: int, right: bool, latency: float, nfe: int | None = 4) -> Answer:
    extension = {"model": model, "version": "1", "weights_sha256": "ab" * 32} | ({"nfe": nfe} if nfe else {})
    text = f"#### {TARGETS[prompt] if right else '0'}"
    return Answer(prompt, text, latency, latency / 2, 8, {"model": model, "unmask": extension})


def _cell(model: str, concurrency: int, rates: list[float], right: int, run: str = "run-1") -> Cell:
    """Eight requests in two rounds of four; the first `right` answered right, one failed when right < 7."""
    answers = [_answer(model, i % 4, i < right, 0.1 + 0.01 * i) for i in range(8)]
    if right < 7:
        answers[7] = Answer(3, error="HTTP 500: boom")
    blocks = [
        {"tokens": 32, "wall_s": 32 / r, "answered": 4, "sent": 4, "counted": True, "first": i == 0}
        for i, r in enumerate(rates)
    ]
    return Cell(
        model, concurrency, "stream+usage", answers, sum(b["wall_s"] for b in blocks), blocks=blocks, paired_run=run
    )


def _result(run: str = "run-1", concurrency: int = 4) -> LoadResult:
    spec = LoadSpec(base_url="http://127.0.0.1:1/v1", models=("tiny-llada", "tiny-ar"), concurrency=(concurrency,))
    cells = [
        _cell("tiny-llada", concurrency, [400.0, 500.0], 6, run),
        _cell("tiny-ar", concurrency, [100.0, 120.0], 8, run),
    ]
    result = LoadResult(spec, cells)
    score_answers(result, TARGETS, "strict-match")
    return result


def test_a_share_gets_wilson_where_scores_are_right_or_wrong_and_a_bootstrap_where_graded():
    mean, low, high = share_interval([1.0] * 16)
    assert mean == 1.0 and high == 1.0 and (low, high) == pytest.approx(wilson_interval(1.0, 16))
    assert low < 0.85  # sixteen right of sixteen does not prove a sure thing
    graded = share_interval([0.5, 0.75, 1.0, 0.25])
    assert graded is not None and graded[1] < graded[0] == 0.625 < graded[2]
    assert share_interval([]) is None


def test_a_percentile_interval_is_its_point_and_a_seeded_bootstrap_over_the_values():
    values = [float(v) for v in range(1, 33)]
    point, low, high = bootstrap_interval(values, 50)
    assert point == np.percentile(values, 50) and low < point < high
    assert bootstrap_interval(values, 50) == (point, low, high)  # a reviewer recomputes the same numbers
    assert bootstrap_interval([0.3], 99) == (0.3, 0.3, 0.3)
    assert bootstrap_interval([None, float("nan")], 50) is None  # type: ignore[list-item]


def test_a_side_s_tokens_per_second_is_read_over_its_rounds():
    blocks = [{"tokens": 40, "wall_s": 0.1}, {"tokens": 40, "wall_s": 0.2}, {"tokens": 40, "wall_s": 0.1}]
    rate = block_rate(blocks)
    assert rate is not None and rate.estimate == pytest.approx(120 / 0.4) and rate.low <= rate.estimate <= rate.high
    assert rate.low == pytest.approx(200) and rate.high == pytest.approx(400)  # the slowest and fastest rounds
    assert block_rate(blocks[:1]) is None  # one round shows no spread
    assert block_rate([dict(b, counted=False) for b in blocks]) is None


def test_every_answer_is_scored_and_a_failed_request_scores_zero():
    result = _result()
    llada, ar = result.cells
    assert result.metric == "strict-match"
    assert [a.score for a in llada.answers[:7]] == [1.0] * 6 + [0.0] and llada.answers[7].score is None
    assert llada.scores == [1.0] * 6 + [0.0, 0.0] and ar.scores == [1.0] * 8
    assert llada.tokens_per_forward == 2.0  # 8 text tokens over 4 model calls


def test_a_serving_record_keeps_what_each_figure_and_interval_recomputes_from():
    llada, ar = serving_records(_result())
    assert llada.metric == "strict-match" and llada.accuracy == 0.75 and ar.accuracy == 1.0
    assert llada.tokens_per_forward == 2.0 and llada.host
    requests = llada.per_request
    assert requests["score"][7] is None and requests["latency_s"][7] is None  # the failed one
    scores = [s if s is not None else 0.0 for s in requests["score"]]
    stored = llada.intervals  # kept to 6 decimals
    assert stored["accuracy"] == RatioEstimate(*share_interval(scores)).to_dict()
    assert stored["latency_p50_s"] == RatioEstimate(*bootstrap_interval(requests["latency_s"], 50)).to_dict()
    assert stored["latency_p99_s"] == RatioEstimate(*bootstrap_interval(requests["latency_s"], 99)).to_dict()
    assert stored["ttfb_p50_s"] == RatioEstimate(*bootstrap_interval(requests["ttfb_s"], 50)).to_dict()
    assert stored["tokens_per_s"] == block_rate(llada.blocks).to_dict()
    assert llada.interval("accuracy").low < 0.75 < llada.interval("accuracy").high


def test_an_unscored_load_test_says_nothing_about_accuracy():
    result = _result()
    for cell in result.cells:
        for answer in cell.answers:
            answer.score = None
    record = serving_records(result)[0]
    assert record.accuracy is None and record.metric == "" and "accuracy" not in record.intervals


def test_the_benchmark_sets_the_candidates_beside_the_fallback_of_one_paired_run():
    records = serving_records(_result()) + serving_records(_result("run-2", concurrency=16))
    unpaired = serving_records(_result("", concurrency=4))
    benchmarks = benchmark_records(records + unpaired, lambda r: r.served_as == "tiny-ar")
    assert [(b.concurrency, b.paired_run) for b in benchmarks] == [(4, "run-1"), (16, "run-2")]  # unpaired: left out
    at_4 = benchmarks[0]
    assert [s.served_as for s in at_4.sides] == ["tiny-llada", "tiny-ar"] and at_4.fallback.served_as == "tiny-ar"
    llada = at_4.candidates[0]
    assert at_4.tokens_per_s_vs_fallback(llada) == block_ratio(llada.blocks, at_4.fallback.blocks)
    assert at_4.tokens_per_s_vs_fallback(at_4.fallback) == RatioEstimate(1.0, 1.0, 1.0)
    gap = at_4.accuracy_vs_fallback(llada)
    assert gap.estimate == pytest.approx(-0.25) and gap.low < -0.25 < gap.high
    assert at_4.accuracy_vs_fallback(at_4.fallback) is None
    assert (at_4.task, at_4.metric) == ("", "strict-match")
    document = at_4.to_dict()
    assert [s["role"] for s in document["sides"]] == ["candidate", "fallback"]
    assert document["sides"][0]["tokens_per_s_vs_fallback"] == at_4.tokens_per_s_vs_fallback(llada).to_dict()


def test_without_a_fallback_a_benchmark_compares_nothing():
    [b] = benchmark_records(serving_records(_result()), lambda r: False)
    assert b.fallback is None and len(b.candidates) == 2
    assert b.tokens_per_s_vs_fallback(b.candidates[0]) is None and b.accuracy_vs_fallback(b.candidates[0]) is None


def test_the_newest_record_of_each_host_and_concurrency_is_kept():
    older = serving_records(_result("run-1"))
    newer = [
        r.__class__.from_dict(r.to_dict() | {"when": "2999-01-01T00:00:00+00:00"})
        for r in serving_records(_result("run-2"))
    ]
    other_host = [r.__class__.from_dict(r.to_dict() | {"host": "zz-other"}) for r in serving_records(_result("run-3"))]
    kept = latest_benchmarks(benchmark_records(older + newer + other_host, lambda r: r.served_as == "tiny-ar"))
    assert [(b.host, b.paired_run) for b in kept] == [(older[0].host, "run-2"), ("zz-other", "run-3")]


def test_every_surface_reads_one_worded_row_per_side_with_its_interval():
    [b] = benchmark_records(serving_records(_result()), lambda r: r.served_as == "tiny-ar")
    frame = benchmark_frame([b])
    assert list(frame.columns[: len(BENCHMARK_COLUMNS)]) == BENCHMARK_COLUMNS
    candidate, fallback = frame.to_dict(orient="records")
    assert (candidate["role"], fallback["role"]) == ("candidate", "fallback")
    assert candidate["accuracy"].startswith("75.0% (") and candidate["vs fallback (pts)"].startswith("-25.0 (")
    ratio = b.tokens_per_s_vs_fallback(b.candidates[0])
    assert candidate["tokens/s vs fallback"].startswith(f"{ratio.estimate:.3g}x (")
    assert fallback["tokens/s vs fallback"] == "reference" and fallback["vs fallback (pts)"] == "-"
    assert candidate["errors"] == "1 of 8" and candidate["tokens per forward"] == "2.00"
    assert candidate["accuracy_low"] < candidate["accuracy_value"] == 0.75 < candidate["accuracy_high"]


def test_a_bench_speedup_is_read_over_rounds_that_time_both_rows():
    ratio = round_ratio([2.0, 2.2, 1.8, 2.0], [1.0, 1.1, 0.9, 1.0])  # the load moved both rows alike: 2x each round
    assert ratio == RatioEstimate(2.0, 2.0, 2.0)
    shaky = round_ratio([2.0, 2.0, 2.0], [1.0, 0.5, 2.0])
    assert shaky.estimate == 2.0 and shaky.low < 2.0 < shaky.high
    assert round_ratio([2.0], [1.0]) is None  # one round shows no spread
    assert round_ratio([2.0, 2.0], [1.0]) is None and round_ratio([2.0, 0.0], [1.0, 1.0]) is None


def test_a_latency_ratio_at_a_concurrency_is_paired_by_round_from_the_requests_kept():
    llada, ar = serving_records(_result())
    rounds = llada.latencies_by_round()
    assert [len(r) for r in rounds] == [4, 3]  # the failed request of round 2 has no latency
    assert sum(rounds, []) == [t for t in llada.per_request["latency_s"] if t is not None]
    ratio = llada.latency_against(ar, 95)
    assert ratio == rounds_percentile_ratio(rounds, ar.latencies_by_round(), 95)
    assert ratio.low <= ratio.estimate <= ratio.high
    older = llada.__class__.from_dict(llada.to_dict() | {"blocks": [dict(b, sent=None) for b in llada.blocks]})
    assert older.latencies_by_round() is None and older.latency_against(ar) is None  # kept no round sizes
    apart = ar.__class__.from_dict(ar.to_dict() | {"paired_run": "another"})
    assert llada.latency_against(apart) is None  # two load tests apart are not compared
    assert rounds_percentile_ratio([[1.0]], [[1.0]], 95) is None
