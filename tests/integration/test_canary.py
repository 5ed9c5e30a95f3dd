"""Canary analysis (gates/canary.py), the rollout policy (gates/rollout_policy.py) and the rollout evidence
in MLflow (registry/rollouts.py): pure units and a real SQLite store."""

from __future__ import annotations

import pytest

from gates.canary import (
    FAIL,
    INCONCLUSIVE,
    METRICS,
    PASS,
    CanaryAnalysis,
    MetricRange,
    Observation,
    analyse,
    split_arms,
)
from gates.rollout_policy import RolloutPolicyError, load_rollout_policy, parse_rollout_policy

CANDIDATE, BASELINE = "staging", "production"
POLICY = {
    "steps": [5, 25, 50, 100],
    "interval_s": 2,
    "min_requests": 10,
    "failure_limit": 1,
    "inconclusive": "pause",
    "analysis": {
        "p95_latency_s": {"max": 1.0},
        "error_rate": {"max": 0.1},
        "decode_failure_rate": {"max": 0.1},
        "agreement": {"min": 0.5},
        "p95_ratio_vs_baseline": {"max": 3.0},
        "probe_accuracy": {"min": 0.5},
    },
}
N = 200  # enough requests for every metric's bounds to settle at a rollout's first look


def observations(arm: str, n: int, latency: float = 0.2, **fields) -> list[Observation]:
    return [Observation(arm=arm, latency_s=latency + i * 1e-3, **fields) for i in range(n)]


def healthy() -> list[Observation]:
    return observations(CANDIDATE, N, agrees=True, correct=True) + observations(BASELINE, N, correct=True)


# what each metric must say, on data built to pass, to fail, and to leave it undecided
CASES = {
    "p95_latency_s": (
        healthy(),
        observations(CANDIDATE, 20, latency=5.0) + observations(BASELINE, 20),
        observations(CANDIDATE, 19, latency=0.5) + observations(CANDIDATE, 1, latency=3.0),
    ),
    "probe_accuracy": (
        healthy(),
        observations(CANDIDATE, 20, correct=False) + observations(BASELINE, 20, correct=True),
        observations(CANDIDATE, 20),
    ),
    "error_rate": (
        healthy(),
        observations(CANDIDATE, 10, status=500) + observations(CANDIDATE, 10),
        observations(CANDIDATE, 20, status=500)[:0],
    ),
    "decode_failure_rate": (healthy(), observations(CANDIDATE, 20, decode_failure=True), []),
    "agreement": (healthy(), observations(CANDIDATE, 20, agrees=False), observations(CANDIDATE, 20)),
    "p95_ratio_vs_baseline": (
        healthy(),
        observations(CANDIDATE, N, latency=2.0) + observations(BASELINE, N, 0.1),
        observations(CANDIDATE, 20),
    ),
}


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_metric_passes_fails_and_says_when_it_cannot_judge(name):
    """The contract over the registry: a name, a pass, a fail, an inconclusive with a reason, never a crash."""
    assert name in CASES, f"metric {name} has no contract case"
    metric = METRICS[name]()
    assert metric.name == name and isinstance(metric.needs_baseline, bool)
    good, bad, unsure = CASES[name]
    bound = MetricRange(name, **{k: v for k, v in POLICY["analysis"][name].items()})
    for data, expected in ((good, PASS), (bad, FAIL), (unsure, INCONCLUSIVE)):
        verdict = metric.judge(bound, *split_arms(data, CANDIDATE, BASELINE))
        assert verdict.verdict == expected, (name, expected, verdict)
        assert verdict.metric == name and verdict.reason
        assert verdict.to_dict()["bound"] == bound.to_dict()


def test_a_retried_candidate_failure_is_the_candidates_error():
    policy = parse_rollout_policy(POLICY | {"analysis": {"error_rate": {"max": 0.1}}})
    rows = (
        observations(CANDIDATE, 10)
        + observations(CANDIDATE, 10, retried=True, status=503)
        + observations(BASELINE, 10, retry_of=CANDIDATE)
        + observations(BASELINE, 20)
    )  # the retries' answers
    result = analyse(rows, CANDIDATE, BASELINE, policy)
    assert result.verdict == FAIL and "10/20" in result.reason
    assert result.arms[CANDIDATE]["error_rate"] == 0.5 and result.arms[BASELINE]["error_rate"] == 0.0
    assert result.arms[BASELINE]["requests"] == 20  # the fallback's own traffic only


def test_too_few_requests_is_inconclusive_and_names_the_count():
    policy = parse_rollout_policy(POLICY)
    result = analyse(
        observations(CANDIDATE, 4, correct=True, agrees=True) + observations(BASELINE, 30), CANDIDATE, BASELINE, policy
    )
    assert result.verdict == INCONCLUSIVE
    assert result.reason == "4 requests on staging, 10 needed"
    assert all(m.verdict == INCONCLUSIVE for m in result.metrics)  # never a pass on a handful
    # but the exact bounds hold at any count: four answers of 9 s already show a p95 above 1 s
    slow = analyse(observations(CANDIDATE, 4, latency=9.0) + observations(BASELINE, 30), CANDIDATE, BASELINE, policy)
    assert slow.verdict == FAIL and "p95_latency_s" in slow.reason


def test_a_healthy_interval_passes_and_round_trips():
    policy = parse_rollout_policy(POLICY)
    result = analyse(healthy(), CANDIDATE, BASELINE, policy)
    assert result.verdict == PASS, result.reason
    assert CanaryAnalysis.from_dict(result.to_dict()) == result
    assert result.arms[CANDIDATE]["requests"] == N and result.arms[CANDIDATE]["agreement"] == 1.0
    assert result.arms[CANDIDATE]["probe_accuracy"] == 1.0 and result.arms[BASELINE]["probes"] == N


def test_at_full_weight_the_baseline_needs_no_traffic_but_a_ratio_does():
    policy = parse_rollout_policy(POLICY | {"analysis": {"p95_latency_s": {"max": 1.0}}})
    assert analyse(observations(CANDIDATE, N), CANDIDATE, BASELINE, policy).verdict == PASS
    ratio = parse_rollout_policy(POLICY | {"analysis": {"p95_ratio_vs_baseline": {"max": 2.0}}})
    result = analyse(observations(CANDIDATE, N), CANDIDATE, BASELINE, ratio)
    assert result.verdict == INCONCLUSIVE and "0 requests on production" in result.reason


def test_shadow_copies_judge_agreement_but_not_traffic():
    rows = observations(CANDIDATE, 12) + observations(CANDIDATE, 30, shadow=True, agrees=False)
    mine, _ = split_arms(rows, CANDIDATE, BASELINE)
    assert mine.requests == 12 and mine.agreement() == (0, 30)


def test_observations_read_request_log_rows_with_missing_columns():
    row = {"time": "t", "arm": "staging", "version": "2", "status": 200, "latency_s": 0.5, "route": "default"}
    assert Observation.from_row(row) == Observation("staging", "2", 200, 0.5, time="t")
    retried = Observation.from_row(row | {"retried": True, "agrees": False, "decode_failure": None})
    assert retried.error and retried.agrees is False and not retried.decode_failure
    assert Observation.from_row(row | {"arm": "fallback", "retry_of": "staging"}).retry_of == "staging"


@pytest.mark.parametrize(
    "change, named",
    [
        ({"steps": [5, 50]}, "rollout.steps"),
        ({"steps": [50, 25, 100]}, "rollout.steps"),
        ({"steps": "5,25"}, "rollout.steps"),
        ({"interval_s": 0}, "rollout.interval_s"),
        ({"min_requests": 2.5}, "rollout.min_requests"),
        ({"failure_limit": 0}, "rollout.failure_limit"),
        ({"inconclusive": "ignore"}, "rollout.inconclusive"),
        ({"analysis": {}}, "rollout.analysis"),
        ({"analysis": {"p99": {"max": 1}}}, "rollout.analysis.p99"),
        ({"analysis": {"error_rate": {"below": 1}}}, "rollout.analysis.error_rate.below"),
        ({"analysis": {"error_rate": {"max": "low"}}}, "rollout.analysis.error_rate.max"),
        ({"analysis": {"agreement": {"min": 0.9, "max": 0.5}}}, "rollout.analysis.agreement"),
        ({"speed": 1}, "rollout.speed"),
    ],
)
def test_a_bad_rollout_policy_is_refused_naming_its_key(tmp_path, change, named):
    path = tmp_path / "serving.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"routes": {}, "default": {"arm": "production"}, "rollout": POLICY | change}))
    with pytest.raises(RolloutPolicyError) as e:
        load_rollout_policy(path)
    assert f"{path}: {named}" in str(e.value)


def test_missing_keys_and_a_missing_rollout_are_named(tmp_path):
    with pytest.raises(RolloutPolicyError, match="rollout.interval_s: missing"):
        parse_rollout_policy({k: v for k, v in POLICY.items() if k != "interval_s"})
    path = tmp_path / "serving.yaml"
    path.write_text("default: {arm: production}\n")
    with pytest.raises(RolloutPolicyError, match="rollout: missing"):
        load_rollout_policy(path)


def test_the_serving_policy_accepts_the_rollout_key_and_the_bundled_one_parses():
    from gates.serving_policy import SERVING_POLICY_PATH, load_serving_policy

    load_serving_policy(SERVING_POLICY_PATH)  # the routes loader ignores `rollout:`
    policy = load_rollout_policy(SERVING_POLICY_PATH)
    assert policy.steps[-1] == 100 and policy.analysis


def test_rollout_evidence_round_trips_through_mlflow_and_a_forged_analysis_is_refused(tmp_path):
    from registry.integrity import EvidenceTampered
    from registry.rollouts import analyses, log_analysis, rollouts, set_rollout_status, start_rollout_run
    from tests.support.gate_fixtures import fresh_registry

    reg = fresh_registry(tmp_path)
    policy = parse_rollout_policy(POLICY)
    run = start_rollout_run(
        reg, "r1", "tiny-llada", "2", "default", "production", CANDIDATE, BASELINE, policy.to_dict()
    )
    start_rollout_run(reg, "r2", "tiny-ar", "1", "default", "production", CANDIDATE, BASELINE, policy.to_dict())
    result = analyse(healthy(), CANDIDATE, BASELINE, policy)
    child = log_analysis(reg, run, "r1", 0, 5, result.to_dict())
    set_rollout_status(reg, run, "completed", "all steps passed")
    [record] = rollouts(reg, "tiny-llada", "2")
    assert (record.id, record.status, record.route, record.candidate, record.baseline) == (
        "r1",
        "completed",
        "default",
        CANDIDATE,
        BASELINE,
    )
    assert [r.id for r in rollouts(reg)] == ["r1", "r2"]
    [analysis] = analyses(reg, "r1")
    assert (analysis.step, analysis.weight, analysis.verdict) == (0, 5, PASS)
    assert CanaryAnalysis.from_dict(analysis.analysis) == result
    metrics = reg.client.get_run(child).data.metrics
    assert metrics["staging.requests"] == N and metrics["production.error_rate"] == 0.0
    reg.client.log_text(child, '{"verdict": "pass", "forged": true}', "analysis.json")
    with pytest.raises(EvidenceTampered):
        analyses(reg, "r1")


# the canary gate kind (gates/evaluate.py) ---------------------------------------------------------------
def _canary_gate(canary: list[dict], min_weight: int = 100):
    from dataclasses import replace

    from gates.evaluate import evaluate_gates
    from gates.policy import parse_policy
    from tests.support.gate_fixtures import evidence

    gates = {"canary": {"min_weight": min_weight}}
    stage = {
        "operating_point": {"task": "arith", "gen_length": 32},
        "gates": gates,
        "scoring": {"weights": {"quality": 1}},
    }
    policy = parse_policy({"stages": {"poc": stage, "staging": stage, "production": stage}})
    [result] = evaluate_gates(replace(evidence("tiny-llada"), canary=canary), policy, "production")
    return result


def test_the_canary_gate_needs_a_rollout_that_passed_up_to_its_weight():
    none = _canary_gate([])
    assert none.inconclusive and "unmask rollout start tiny-llada --route ROUTE --to production" in none.settle
    steps = [
        {"weight": 5, "verdict": "pass", "run_id": "a"},
        {"weight": 50, "verdict": "inconclusive", "run_id": "b"},
        {"weight": 50, "verdict": "pass", "run_id": "c"},
        {"weight": 100, "verdict": "pass", "run_id": "d"},
    ]
    done = _canary_gate([{"id": "r1", "status": "running", "analyses": steps}])
    assert done.passed and done.evidence["rollout"] == "r1" and done.evidence["canary_runs"] == ["a", "b", "c", "d"]
    halfway = _canary_gate([{"id": "r2", "status": "paused", "analyses": steps[:3]}])
    assert halfway.inconclusive and "50% passed, 100% needed" in halfway.reason
    assert _canary_gate([{"id": "r2", "status": "paused", "analyses": steps[:3]}], min_weight=50).passed
    failed = [{"weight": 5, "verdict": "fail", "run_id": "x"}, {"weight": 100, "verdict": "pass", "run_id": "y"}]
    gone = _canary_gate([{"id": "r3", "status": "rolled_back", "analyses": failed}])
    assert gone.verdict == "fail" and "rolled_back" in gone.reason
    # a failed analysis on the way disqualifies even a rollout that went on
    assert _canary_gate([{"id": "r4", "status": "running", "analyses": failed}]).inconclusive


@pytest.mark.parametrize("weight", [0, 101])
def test_a_canary_gate_weight_outside_1_to_100_is_refused_by_key(weight):
    from gates.policy import PolicyError

    with pytest.raises(PolicyError, match=r"gates.canary.min_weight"):
        _canary_gate([], min_weight=weight)


def test_rollout_start_refuses_in_one_line_with_exit_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tests.support.fuzz_fixtures import unmask_app
    from tests.support.gate_fixtures import fresh_registry, register_pair

    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    register_pair(reg)
    runner = CliRunner()
    refused = runner.invoke(unmask_app(), ["rollout", "start", "tiny-llada", "--route", "default"])
    assert refused.exit_code == 2, refused.output
    assert refused.output.strip() == (
        "error: rollout of tiny-llada to production on route default refused: "
        "tiny-llada holds no `staging` version: promote it to staging first"
    )
    unknown = runner.invoke(unmask_app(), ["rollout", "start", "tiny-llada", "--route", "nope"])
    assert unknown.exit_code == 2 and "no route 'nope'" in unknown.output and len(unknown.output.splitlines()) == 1
    missing = runner.invoke(unmask_app(), ["rollout", "resume", "r-none"])
    assert missing.exit_code == 2 and "no such rollout" in missing.output


def test_the_route_table_follows_the_weights_overlay_the_controller_writes(tmp_path):
    import yaml

    from flows.rollout_state import read_weights, set_route_weights, weights_path
    from gates.serving_policy import RequestFacts
    from serving.metrics import ServingMetrics
    from serving.routing import RouteTable

    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump({"default": {"split": {"fallback": 100}}}))
    table = RouteTable(path, ["staging", "fallback"], ServingMetrics(), weights_path=weights_path())
    facts = RequestFacts("/v1/completions")

    def arms() -> set[str]:
        return {table.decide("auto", facts, f"user-{i}", "user").arm.name for i in range(200)}

    assert arms() == {"fallback"}
    set_route_weights("default", {"staging": 50, "fallback": 50})
    table.refresh()
    assert arms() == {"staging", "fallback"}
    set_route_weights("default", {"staging": 100, "fallback": 0})
    table.refresh()
    assert arms() == {"staging"}
    set_route_weights("default", None)  # out of the overlay: the route's own split again
    table.refresh()
    assert arms() == {"fallback"} and read_weights() == {}
    with pytest.raises(ValueError, match="routes.default: weights sum to 50; they must sum to 100"):
        set_route_weights("default", {"staging": 50})
