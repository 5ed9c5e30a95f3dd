"""Each gate passes and fails for its stated reason, citing the record it read; gates read validated records only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evals.records import ReproducibilityResult
from gates import GateResult, all_passed, evaluate_gates, gate_report_markdown, load_policy
from tests.support.gate_fixtures import evidence, fast_llada, record, serving_record, signoffs

POLICY = load_policy()
BASE = {"fallback": evidence("tiny-ar"), "production": None}
SIGNED = signoffs("tooling-maturity")
PAIRED_HALF = "0.500x on p95 (95% CI 0.500-0.500x, paired: 3 rounds x 8 items) < 1x"


def judge(ev, stage="poc", base=BASE, signed=SIGNED) -> dict[str, GateResult]:
    return {r.gate: r for r in evaluate_gates(ev, POLICY, stage, base, signed)}


def test_tiny_llada_passes_poc_and_staging_but_is_too_slow_for_production():
    assert all_passed(list(judge(evidence(), "poc").values()))
    assert all_passed(list(judge(evidence(), "staging").values()))
    prod = judge(evidence(), "production")
    assert [g for g, r in prod.items() if not r.passed] == ["speedup"]
    assert prod["speedup"].value == 0.5 and PAIRED_HALF in prod["speedup"].reason
    assert all_passed(list(judge(fast_llada(), "production").values()))


def test_every_result_cites_record_run_and_hash():
    ev = evidence(records=[record(run_id="run-arith"), record(task="sort", run_id="run-sort")])
    for r in judge(ev).values():
        assert r.stage == "poc"
        assert r.evidence["record_id"] == ev.records[0].record_id
        assert r.evidence["run_id"] in {"run-arith", "run-sort"}
        assert r.evidence["weights_sha256"] == ev.records[0].weights_sha256


@pytest.mark.parametrize(
    "gate, changed, stage, reason",
    [
        ("quality", dict(accuracy=0.25), "poc", "25.0% is not >= threshold 30.0%"),
        ("quality_vs_fallback", dict(accuracy=0.49), "poc", "49.0% is not >= baseline 70.0% - 20.0%"),
        ("quality_vs_fallback", dict(accuracy=0.64), "staging", "is not >= baseline 70.0% - 5.00%"),
        ("latency", dict(latency_p95_s=2.5), "staging", "p95 2500 ms at gen_length 32 > SLA 2000 ms"),
        (
            "speedup",
            dict(latency_p95_s=0.5),
            "poc",
            "0.180x on p95 (95% CI 0.180-0.180x, paired: 3 rounds x 8 items) < 0.2x",
        ),
        ("memory", dict(peak_mem_mb=20000.0), "poc", "peak memory 20000 MB (arith) > budget 16384 MB"),
        ("error_rate", dict(errors=7), "poc", "error rate 5.83% (7/120 on arith) > 5%"),
        ("error_rate", dict(errors=2), "staging", "error rate 1.67% (2/120 on arith) > 1%"),
    ],
)
def test_record_driven_gates_fail_for_their_reason(gate, changed, stage, reason):
    passing = judge(evidence(), stage)[gate]
    assert passing.passed, passing.reason
    failing = judge(evidence(records=[record(**changed), record(task="sort")]), stage)[gate]
    assert not failing.passed and failing.verdict == "fail" and reason in failing.reason, failing.reason


def test_reasons_word_numbers_as_people_read_them_never_as_raw_floats():
    import re

    ev = evidence(
        records=[
            record(latency_p95_s=0.02230288574997985, accuracy=0.7234567, peak_mem_mb=797.1484375),
            record(task="sort"),
        ]
    )
    for stage in ("poc", "staging", "production"):
        for r in judge(ev, stage).values():
            assert not re.search(r"\d\.\d{4,}", r.reason), r.reason  # no float printed past 3 significant digits
    results = judge(ev, "poc")
    assert "p95 22.3 ms" in results["latency"].reason and "797 MB" in results["memory"].reason
    assert (
        "accuracy on arith 72.3% vs fallback 70.0% meets >= fallback - 20 pts" in results["quality_vs_fallback"].reason
    )


def test_too_few_items_is_inconclusive_and_says_how_many_more_would_settle_it():
    r = judge(evidence(records=[record(n_items=16), record(task="sort", n_items=16)]), "staging")["data_validity"]
    assert r.verdict == "inconclusive" and not r.passed and r.value == 16
    assert r.settle == "needs 34 more items on arith (50 per task)" and r.evidence["items_needed"] == 34
    assert r.reason == "arith measured on 16 items, fewer than 50; needs 34 more items on arith (50 per task)"
    assert judge(evidence(records=[record(n_items=16), record(task="sort")]), "poc")["data_validity"].verdict == "pass"


def test_no_record_at_all_is_inconclusive_but_invalid_records_fail():
    other_length = evidence(records=[record(config={"gen_length": 128}, gen_length=128)])
    results = judge(other_length)
    for gate in ("quality", "latency", "data_validity", "memory", "speedup"):
        assert (
            results[gate].verdict == "inconclusive" and "measure task 'arith' at gen_length 32" in results[gate].settle
        )
    assert results["license"].verdict == "pass"  # what is there is still judged
    invalid = judge(evidence(records=[record(valid=False), record(task="sort")]))
    assert invalid["data_validity"].verdict == "fail"  # bad data is a fault, not missing evidence
    assert judge(evidence(reproducibility=None))["reproducibility"].verdict == "inconclusive"


def test_a_gate_that_asks_for_a_settled_result_is_inconclusive_while_the_interval_spans_its_bound():
    from evals.intervals import wilson_interval
    from gates import parse_policy
    from gates.intervals import items_to_settle

    data = __import__("yaml").safe_load(__import__("gates.policy", fromlist=["POLICY_PATH"]).POLICY_PATH.read_text())
    data["stages"]["staging"]["gates"]["quality"]["require_settled"] = True  # threshold 0.5
    strict = parse_policy(data)
    close = evidence(records=[record(n_items=16, accuracy=0.5625), record(task="sort")])
    r = {g.gate: g for g in evaluate_gates(close, strict, "staging", BASE, SIGNED)}["quality"]
    assert r.verdict == "inconclusive" and r.evidence["settled"] is False
    need = r.evidence["items_needed"] + 16
    assert r.settle == f"needs {need - 16} more items on arith ({need} in all) at this accuracy"
    lo, _ = wilson_interval(0.5625, need)
    assert lo >= 0.5 > wilson_interval(0.5625, need - 1)[0]  # the fewest items that settle it
    assert items_to_settle(strict.stage("staging").gate("quality").metric_threshold, 0.5, 16) is None  # on the bound
    far = {g.gate: g for g in evaluate_gates(evidence(), strict, "staging", BASE, SIGNED)}["quality"]
    assert far.verdict == "pass"  # 0.72 on 120 items: settled
    assert {g.gate: g for g in evaluate_gates(close, POLICY, "staging", BASE, SIGNED)}["quality"].verdict == "pass"
    data["stages"]["staging"]["gates"]["quality"]["require_settled"] = "yes"
    with pytest.raises(Exception, match=r"stages.staging.gates.quality.require_settled: expected bool"):
        parse_policy(data)


def test_a_verdict_and_passed_agree_and_old_reports_read_without_a_verdict():
    old = {"gate": "latency", "stage": "poc", "passed": False, "value": 1.0, "threshold": 0.5, "reason": "slow"}
    assert (
        GateResult.from_dict(old).verdict == "fail" and GateResult.from_dict(old | {"passed": True}).verdict == "pass"
    )
    with pytest.raises(ValueError, match="contradicts"):
        GateResult("g", "poc", True, None, None, "", verdict="inconclusive")
    with pytest.raises(ValueError, match="not one of"):
        GateResult("g", "poc", False, None, None, "", verdict="maybe")


def test_error_rate_gate_fails_on_a_load_failure():
    r = judge(replace(evidence(), failures=["tiny-llada: decode raised RuntimeError"]))["error_rate"]
    assert not r.passed and "load or decode failed" in r.reason


def test_quality_vs_production_compares_with_the_production_model_when_there_is_one():
    first = judge(fast_llada(), "production")["quality_vs_production"]
    assert first.passed and "no production model yet" in first.reason
    worse = fast_llada()
    worse = replace(worse, records=[replace(r, accuracy=0.70) for r in worse.records])
    r = judge(worse, "production", base=BASE | {"production": fast_llada()})["quality_vs_production"]
    assert not r.passed and r.evidence["baseline"] == "production" and "min relative change -0.02" in r.reason


def test_license_gate_by_tier_and_stage():
    assert judge(evidence(tier="caution"), "staging")["license"].passed
    r = judge(evidence(tier="caution"), "production")["license"]
    assert not r.passed and r.value == "caution" and "not allowed at production (permitted)" in r.reason
    assert not judge(evidence(license=None))["license"].passed


def test_reproducibility_gate_names_what_failed():
    assert judge(evidence(), "production")["reproducibility"].passed
    repro = ReproducibilityResult("tiny-llada", False, True, False, True, ["fresh process: output hash differs"])
    assert judge(evidence(reproducibility=repro), "poc")["reproducibility"].passed  # poc asks same_process only
    r = judge(evidence(reproducibility=repro), "staging")["reproducibility"]
    assert not r.passed and "fresh_process failed" in r.reason and "output hash differs" in r.reason
    assert "no reproducibility probe result" in judge(evidence(reproducibility=None))["reproducibility"].reason


def test_tooling_maturity_needs_the_checklist_signoff():
    assert judge(evidence())["tooling_maturity"].passed
    r = judge(evidence(), signed={})["tooling_maturity"]
    assert not r.passed and "'tooling-maturity'" in r.reason


def test_unvalidated_or_invalid_records_count_as_no_evidence():
    for valid in (None, False):
        ev = evidence(
            records=[record(valid=valid, validation={"failed": ["latency_p95_s not null"]}), record(task="sort")]
        )
        results = judge(ev)
        assert not results["data_validity"].passed and results["data_validity"].verdict == "fail"
        assert "gates use validated records only" in results["data_validity"].reason
        assert not results["quality"].passed and "no validated record" in results["quality"].reason
        assert results["quality"].verdict == "inconclusive"  # no evidence to judge quality on, nothing more
    assert (
        "latency_p95_s not null"
        in judge(evidence(records=[record(valid=False, validation={"failed": ["latency_p95_s not null"]})]))[
            "data_validity"
        ].reason
    )


def test_missing_fallback_fails_the_relative_gates():
    results = judge(evidence(), base={})
    assert not results["quality_vs_fallback"].passed and not results["speedup"].passed
    assert results["quality_vs_fallback"].verdict == "fail"  # the policy says fail with no baseline (if_no_baseline)
    assert "no validated fallback record" in results["speedup"].reason
    assert results["speedup"].verdict == "inconclusive"


def test_operating_point_is_the_best_config_at_the_stated_length_unless_the_card_names_one():
    slow_good = record(config={"steps": 16, "seed": 1}, accuracy=0.80, latency_p95_s=0.30)
    other_length = record(config={"gen_length": 128}, gen_length=128, accuracy=0.95)
    results = judge(evidence(records=[record(), slow_good, other_length]))
    assert results["quality"].value == 0.80 and results["latency"].value == 0.30
    pinned = evidence(records=[record(), slow_good], card={"operating_config_hash": record().config_hash})
    assert judge(pinned)["quality"].value == 0.72


def test_bare_records_are_accepted_and_must_be_one_candidate():
    results = evaluate_gates([record(), record(task="sort")], POLICY, "poc", BASE, SIGNED)
    assert not {r.gate: r for r in results}["license"].passed  # no license evidence in bare records
    with pytest.raises(ValueError, match="several candidates"):
        evaluate_gates([record(), record("tiny-ar")], POLICY, "poc", BASE)


def test_gate_report_markdown_and_roundtrip():
    results = evaluate_gates(evidence(), POLICY, "production", BASE, SIGNED)
    md = gate_report_markdown(results, "tiny-llada v1")
    assert "Stage **production**: FAILED (12/13 gates)" in md and "| speedup | **no** |" in md
    assert [GateResult.from_dict(r.to_dict()) for r in results] == results


def test_intervals_match_published_values():
    from evals.intervals import difference_interval, wilson_interval

    assert [round(x, 4) for x in wilson_interval(1.0, 16)] == [0.8064, 1.0]  # 16 of 16 right
    assert [round(x, 3) for x in wilson_interval(0.0, 10)] == [0.0, 0.278]
    # Newcombe (1998), Statistics in Medicine 17:873, method 10: 56/70 vs 48/80 -> 0.0524 to 0.3339
    assert [round(x, 4) for x in difference_interval(56 / 70, 70, 48 / 80, 80)] == [0.0524, 0.3339]
    assert wilson_interval(0.5, 0) == (0.0, 1.0)


def test_a_quality_verdict_on_few_items_says_it_is_not_settled():
    """16 items cannot rank two models 6 points apart: the gate keeps its verdict and says so."""

    def pair(n, candidate, fallback):
        return (
            evidence(records=[record(n_items=n, accuracy=candidate)]),
            {
                "fallback": evidence("tiny-ar", records=[record("tiny-ar", n_items=n, accuracy=fallback)]),
                "production": None,
            },
        )

    few, base = pair(16, 1.0, 15 / 16)
    r = judge(few, "staging", base=base)["quality_vs_fallback"]
    assert r.passed and "not settled" in r.reason and "on 16 items" in r.reason
    assert r.evidence["settled"] is False and r.evidence["ci95"] == [0.8064, 1.0]
    low, high = r.evidence["difference_ci95"]
    assert low < -0.05 < high  # the tolerated regression lies inside the interval

    many, base = pair(200, 0.895, 0.995)  # tiny-llada and tiny-ar on 200 held-out arith items
    r = judge(many, "staging", base=base)["quality_vs_fallback"]
    assert not r.passed and r.evidence["settled"] is True and "not settled" not in r.reason
    assert r.evidence["difference_ci95"][1] < -0.05  # the whole interval is a larger regression than tolerated

    sure = judge(evidence(records=[record(n_items=200, accuracy=0.9)]), "staging")["quality"]  # threshold 0.5
    assert sure.passed and sure.evidence["settled"] is True and "difference" not in sure.reason


# --- serving: what `unmask loadtest` measured through the server --------------------------------------


def test_serving_gate_passes_on_the_record_at_its_concurrency_and_cites_its_run():
    r = judge(evidence(), "production")["serving"]
    assert r.passed, r.reason
    assert r.value == {"p95_s": 0.9, "error_rate": 0.0, "throughput_vs_fallback": 1.2}
    assert r.threshold == {
        "concurrency": 16,
        "p95_s_max": 2.0,
        "error_rate_max": 0.0,
        "throughput_vs_fallback_min": 1.0,
    }
    assert (
        r.evidence["serving_run_id"] == "serving-tiny-llada"
        and r.evidence["baseline_serving_run_id"] == "serving-tiny-ar"
    )
    assert "at concurrency 16 (64 requests)" in r.reason


@pytest.mark.parametrize(
    "changed, stage, reason",
    [
        (dict(latency_p95_s=2.5), "production", "p95 2500 ms > 2000 ms"),
        (dict(latency_p95_s=None), "production", "no p95 measured"),
        (dict(error_rate=0.02), "staging", "error rate 2.00% > 1.00%"),
        (dict(tokens_per_s=700.0), "production", "tokens/s vs fallback 0.875x (95% CI 0.875-0.875x, paired: 4 rounds)"),
        (dict(tokens_per_s=None), "staging", "tokens/s vs fallback not measured in pairs"),
    ],
)
def test_serving_gate_fails_for_its_reason(changed, stage, reason):
    r = judge(evidence(serving=[serving_record(**changed)]), stage)["serving"]
    assert not r.passed and reason in r.reason, r.reason


@pytest.mark.parametrize(
    "candidate_levels, fallback_levels, reason",
    [
        (
            [],
            [16],
            "no serving record yet of tiny-llada at concurrency 16; run unmask loadtest --model tiny-llada "
            "--concurrency 16",
        ),
        ([4], [16], "no serving record yet of tiny-llada at concurrency 16"),  # another level does not count
        ([16], [], "no serving record yet of the fallback at concurrency 16; run unmask loadtest --model fallback"),
    ],
)
def test_serving_gate_without_a_record_says_which_load_test_to_run(candidate_levels, fallback_levels, reason):
    ev = evidence(serving=[serving_record(concurrency=c) for c in candidate_levels])
    base = {
        "fallback": evidence("tiny-ar", serving=[serving_record("tiny-ar", concurrency=c) for c in fallback_levels]),
        "production": None,
    }
    r = judge(ev, "staging", base=base)["serving"]
    assert not r.passed and r.value is None and reason in r.reason, r.reason


def test_serving_gate_reads_only_the_limits_its_policy_states():
    from gates import parse_policy

    data = {
        "stages": {
            s: {
                "operating_point": {"task": "arith", "gen_length": 32},
                "scoring": {"weights": {"quality": 1}},
                "gates": {"serving": {"concurrency": 16, "p95_s_max": 1.0}},
            }
            for s in ("poc", "staging", "production")
        }
    }
    [r] = evaluate_gates(
        evidence(serving=[serving_record(error_rate=0.5, tokens_per_s=1.0)]),
        parse_policy(data),
        "poc",
        {"fallback": None, "production": None},
    )
    assert r.passed and r.value == {"p95_s": 0.9}  # no fallback needed, errors not judged: the policy did not ask


def test_serving_verdicts_read_as_a_person_writes_them():
    from gates.readable import gate_value

    r = judge(evidence(), "production")["serving"]
    assert gate_value("serving", r.value) == "p95 900 ms, errors 0%, 1.20x fallback tokens/s"
    assert gate_value("serving", {"p95_s": None}) == "p95 s -"


def test_promotion_is_refused_for_an_inconclusive_gate_with_a_reason_of_its_own_kind():
    from gates import ReasonKind, decide
    from gates.roles import parse_roles
    from tests.support.governance import bundled_with_keys, signed_signoffs, signers_of

    roles = parse_roles(bundled_with_keys(["ada"]))  # staging counts only signed sign-offs
    signed = signed_signoffs("staging", signers_of(["ada"])["ada"])
    thin = evidence(records=[record(n_items=16), record(task="sort", n_items=16)])
    decision = decide(thin, POLICY, "staging", BASE, signed, None, {"poc"}, roles=roles)
    assert not decision.allowed and not decision.gates_passed
    kinds = {r.kind: r.text for r in decision.reasons}
    assert kinds[ReasonKind.INCONCLUSIVE] == (
        "gate data_validity is inconclusive: arith measured on 16 items, fewer "
        "than 50; needs 34 more items on arith (50 per task)"
    )
    assert ReasonKind.GATE not in kinds  # nothing failed: the evidence is too thin to judge
    assert next(r for r in decision.reasons if r.kind is ReasonKind.INCONCLUSIVE).blocking
    unlicensed = decide(evidence(license=None), POLICY, "staging", BASE, signed, None, {"poc"}, roles=roles)
    checklist = [r.text for r in unlicensed.reasons if r.kind is ReasonKind.CHECKLIST]
    assert any("gate license is inconclusive: no license check result" in text for text in checklist), checklist


def test_the_gate_report_counts_inconclusive_gates_apart():
    results = evaluate_gates(
        evidence(records=[record(n_items=16), record(task="sort", n_items=16)]), POLICY, "staging", BASE, SIGNED
    )
    md = gate_report_markdown(results)
    assert "Stage **staging**: INCONCLUSIVE (11/12 gates, 1 inconclusive)" in md
    assert "| data_validity | *inconclusive* |" in md
