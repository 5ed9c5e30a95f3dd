"""The contract every gate check keeps (gates/checks.py, `GATE_CHECKS`): for each registered kind, a pass, a fail
and an inconclusive verdict (with what would settle it) on hand-built evidence, each a well-formed `GateResult`."""

from __future__ import annotations

import json

import pytest

from gates.checks import GATE_CHECKS
from gates.evaluate import SIGNED_KINDS, evaluate_gates
from gates.policy import parse_policy
from gates.results import GateResult
from gates.verdict import FAIL, INCONCLUSIVE, PASS, Verdict
from tests.support.gate_fixtures import evidence, fast_llada, record, serving_record, signoffs

FALLBACK = {"fallback": evidence("tiny-ar")}
ROLLED = [{"weight": 5, "verdict": "pass", "run_id": "a"}, {"weight": 50, "verdict": "pass", "run_id": "b"}]

# kind: (gate params, {verdict: (evidence, baselines, signoffs)}); a kind a sign-off decides has no inconclusive
CASES = {
    "quality": (
        {"metric": "accuracy", "threshold": 0.5},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(records=[record(accuracy=0.3)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(records=[record(task="sort")]), FALLBACK, {}),
        },
    ),
    "latency": (
        {"max_p95_s": 1.0},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(records=[record(latency_p95_s=2.0)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(records=[record(task="sort")]), FALLBACK, {}),
        },
    ),
    "speedup": (
        {"relative_to": "fallback", "min_speedup": 0.2},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(records=[record(latency_p95_s=10.0)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(), {}, {}),
        },
    ),
    "memory": (
        {"max_peak_mem_mb": 1000},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(records=[record(peak_mem_mb=5000.0)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(records=[record(peak_mem_mb=None)]), FALLBACK, {}),
        },
    ),
    "license": (
        {"allowed_tiers": ["permitted"]},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(tier="restricted"), FALLBACK, {}),
            INCONCLUSIVE: (evidence(license=None), FALLBACK, {}),
        },
    ),
    "reproducibility": (
        {"require": ["same_process"]},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(reproducible=False), FALLBACK, {}),
            INCONCLUSIVE: (evidence(reproducibility=None), FALLBACK, {}),
        },
    ),
    "data_validity": (
        {"min_items": 50},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(records=[record(valid=False)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(records=[record(n_items=20)]), FALLBACK, {}),
        },
    ),
    "error_rate": (
        {"max_error_rate": 0.05},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(records=[record(errors=30)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(records=[record(task="sort")]), FALLBACK, {}),
        },
    ),
    "tooling_maturity": (
        {"checklist_item": "tooling-maturity"},
        {PASS: (evidence(), FALLBACK, signoffs("tooling-maturity")), FAIL: (evidence(), FALLBACK, {})},
    ),
    "license_review": (
        {"checklist_item": "license-review"},
        {
            PASS: (evidence(), FALLBACK, {}),  # Apache-2.0: permissive, no sign-off needed
            FAIL: (evidence(tier="caution"), FALLBACK, {}),  # a LicenseRef-*: class sign-off, not signed
            INCONCLUSIVE: (evidence(license=None), FALLBACK, {}),
        },
    ),
    "serving": (
        {"concurrency": 16, "p95_s_max": 5.0},
        {
            PASS: (evidence(), FALLBACK, {}),
            FAIL: (evidence(serving=[serving_record(latency_p95_s=9.0)]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(serving=[]), FALLBACK, {}),
        },
    ),
    "canary": (
        {"min_weight": 50},
        {
            PASS: (evidence(canary=[{"id": "r1", "status": "running", "analyses": ROLLED}]), FALLBACK, {}),
            FAIL: (evidence(canary=[{"id": "r2", "status": "rolled_back", "analyses": ROLLED[:1]}]), FALLBACK, {}),
            INCONCLUSIVE: (evidence(canary=[]), FALLBACK, {}),
        },
    ),
    "parallelism": (
        {"tpf_at_accuracy": {"min_tpf": 2, "accuracy_floor": 0.7}},
        {
            PASS: (fast_llada(), FALLBACK, {}),
            FAIL: (evidence(), FALLBACK, {}),
            INCONCLUSIVE: (evidence(records=[record(tokens_per_forward=None)]), FALLBACK, {}),
        },
    ),
}


def _judge(kind: str, params: dict, case: tuple) -> GateResult:
    stage = {
        "operating_point": {"task": "arith", "gen_length": 32},
        "gates": {"g": {"kind": kind, **params}},
        "scoring": {"weights": {"quality": 1}},
    }
    policy = parse_policy({"stages": {"poc": stage, "staging": stage, "production": stage}})
    ev, baselines, signed = case
    [result] = evaluate_gates(ev, policy, "staging", baselines, signed)
    return result


def test_every_registered_gate_kind_has_its_contract_cases():
    assert set(CASES) == set(GATE_CHECKS)
    assert all(check.kind == kind for kind, check in GATE_CHECKS.items())


@pytest.mark.parametrize("kind,verdict", [(k, v) for k in sorted(CASES) for v in Verdict])
def test_a_gate_check_gives_each_verdict_as_a_well_formed_result(kind, verdict):
    params, cases = CASES[kind]
    if verdict not in cases:  # only a gate a checklist sign-off decides has nothing to be unsure about
        assert verdict == INCONCLUSIVE and kind in SIGNED_KINDS
        return
    result = _judge(kind, params, cases[verdict])
    assert (result.gate, result.stage, result.verdict) == ("g", "staging", verdict), result.reason
    assert isinstance(result.verdict, Verdict) and result.passed == (verdict == PASS)
    assert result.reason and isinstance(result.evidence, dict)
    if verdict == INCONCLUSIVE:  # says what would settle it, in the reason too
        assert result.settle and result.reason.endswith(result.settle)
    else:
        assert result.settle == ""
    assert GateResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
