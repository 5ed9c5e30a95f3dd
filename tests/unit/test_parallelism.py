"""AUP (accuracy under parallelism) on hand-computed curves, and the `parallelism` gate kind on recorded sweep
points."""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml

from evals.parallelism import aup, quality_weight, record_curves, tpf_at_accuracy
from gates import evaluate_gates, load_policy
from gates.policy import POLICY_PATH, PolicyError, parse_policy
from gates.readable import gate_threshold
from tests.support.gate_fixtures import evidence, record

# A sweep's curve on one task: vanilla, two parallel settings that hold, one that loses 10 points.
CURVE = [(1.0, 0.80), (2.0, 0.80), (4.0, 0.78), (8.0, 0.70)]


def test_aup_of_a_known_curve_is_the_hand_computed_area():
    result = aup(CURVE)
    # (8, 70%) is more than 5 points below the least parallel point (80%): off the curve.
    # 1 * 80 + (2 - 1) * (80 + 80) / 2 + (4 - 2) * (78 W(78) + 80) / 2, W(78) = exp(-3 (1 - 78/80))
    expected = 80 + 80 + (78 * math.exp(-3 * (1 - 78 / 80)) + 80)
    assert result.aup == pytest.approx(expected) == pytest.approx(312.364, abs=1e-3)
    assert result.points == ((1.0, 0.80), (2.0, 0.80), (4.0, 0.78)) and result.dropped == ((8.0, 0.70),)
    assert result.y_max == 0.80


def test_aup_reads_on_the_papers_scale_and_penalises_lost_accuracy():
    assert aup([(1.0, 0.9)]).aup == pytest.approx(90.0)  # vanilla alone: its accuracy in percent
    assert aup([(1.0, 0.9), (4.0, 0.9)]).aup == pytest.approx(90 + 3 * 90)  # held up to TPF 4
    # the same points scored against a better model's 95%: every step is weighted down
    against = aup([(1.0, 0.9), (4.0, 0.9)], y_max=0.95).aup
    assert against == pytest.approx(90 + 3 * 90 * math.exp(-3 * (1 - 90 / 95)))
    assert quality_weight(0.0, 80.0) == pytest.approx(math.exp(-3)) and quality_weight(90.0, 80.0) == 1.0
    # order does not matter; a zero-accuracy model scores 0 without dividing by zero
    assert aup(reversed(CURVE)).aup == aup(CURVE).aup
    assert aup([(1.0, 0.0), (2.0, 0.0)]).aup == 0.0


@pytest.mark.parametrize(
    "points, message",
    [
        ([], "no points"),
        ([(0.0, 0.5)], "tokens per forward must be a positive number, got 0.0"),
        ([(1.0, 80.0)], "accuracy must be a share in [0, 1], got 80.0"),
        ([(float("nan"), 0.5)], "positive number"),
    ],
)
def test_aup_refuses_points_it_cannot_place(points, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        aup(points)


def test_tpf_at_accuracy_is_the_most_parallel_point_above_the_floor():
    assert tpf_at_accuracy(CURVE, 0.78) == (4.0, 0.78)
    assert tpf_at_accuracy(CURVE, 0.70) == (8.0, 0.70)
    assert tpf_at_accuracy(CURVE, 0.85) is None


def curve_records(candidate="tiny-llada", task="arith", curve=CURVE, **overrides):
    return [
        record(
            candidate,
            task,
            config={"steps": int(32 / tpf)},
            tokens_per_forward=tpf,
            accuracy=acc,
            run_id=f"run-{tpf}",
            **overrides,
        )
        for tpf, acc in curve
    ]


def test_record_curves_group_validated_records_by_candidate_task_and_length():
    records = curve_records() + curve_records(task="sort") + [record(valid=None, tokens_per_forward=16.0)]
    curves = record_curves(records)
    assert set(curves) == {("tiny-llada", "arith", 32), ("tiny-llada", "sort", 32)}  # the unvalidated one is not on it
    assert curves[("tiny-llada", "arith", 32)].aup == pytest.approx(aup(CURVE).aup)
    assert curves[("tiny-llada", "arith", 32)].labels == ("s32 b16", "s16 b16", "s8 b16")


# --- the parallelism gate ---------------------------------------------------------------------


def policy_with(gate: dict):
    data = yaml.safe_load(POLICY_PATH.read_text())
    data = copy.deepcopy(data)
    data["stages"]["poc"]["gates"]["parallel"] = {"kind": "parallelism", **gate}
    return parse_policy(data, source="policy.yaml")


def judge(ev, gate: dict):
    results = {r.gate: r for r in evaluate_gates(ev, policy_with(gate), "poc", {"fallback": evidence("tiny-ar")})}
    return results["parallel"]


def test_tpf_at_accuracy_passes_on_the_most_parallel_config_above_its_floor_and_cites_it():
    ev = evidence(records=curve_records())
    result = judge(ev, {"tpf_at_accuracy": {"min_tpf": 4, "accuracy_floor": 0.75}})
    assert result.verdict == "pass" and result.value == 4.0
    assert "4.00 tokens per forward at accuracy 78.0% (floor 75.0%) on arith, 4 configs, >= 4" in result.reason
    assert result.evidence["run_id"] == "run-4.0" and len(result.evidence["curve"]) == 4
    failing = judge(ev, {"tpf_at_accuracy": {"min_tpf": 6, "accuracy_floor": 0.75}})
    assert failing.verdict == "fail" and "< 6" in failing.reason
    none = judge(ev, {"tpf_at_accuracy": {"min_tpf": 1, "accuracy_floor": 0.9}})
    assert none.verdict == "fail" and "no config of tiny-llada on arith reaches accuracy 90.0%" in none.reason


def test_aup_min_judges_the_area_of_the_recorded_curve():
    ev = evidence(records=curve_records())
    passing = judge(ev, {"aup_min": 300})
    assert passing.verdict == "pass" and passing.value == pytest.approx(312.36, abs=0.01)
    assert (
        "AUP 312 over 3 of 4 configs on arith (tokens per forward 1.00-4.00, best accuracy 80.0%) >= 300"
        in passing.reason
    )
    assert judge(ev, {"aup_min": 400}).verdict == "fail"


def test_the_gate_is_inconclusive_without_the_records_it_needs_and_names_the_command():
    ev = evidence(records=curve_records(task="sort"))  # nothing on the stage's task
    result = judge(ev, {"aup_min": 100})
    assert result.verdict == "inconclusive"
    assert (
        "run unmask run (or unmask eval --sweep FILE) with points of tiny-llada on task 'arith' at gen_length 32"
        in result.settle
    )
    api = evidence(records=[record(tokens_per_forward=None)])
    assert "no tokens per forward recorded" in judge(api, {"aup_min": 100}).reason
    on_sort = judge(ev, {"aup_min": 100, "task": "sort"})  # the gate's own task
    assert on_sort.verdict == "pass"


@pytest.mark.parametrize(
    "gate, message",
    [
        ({}, "a parallelism gate needs exactly one of tpf_at_accuracy or aup_min, got neither"),
        ({"aup_min": 1, "tpf_at_accuracy": {"min_tpf": 2, "accuracy_floor": 0.5}}, "got tpf_at_accuracy, aup_min"),
        (
            {"tpf_at_accuracy": {"min_tpf": 2}},
            "parallel.tpf_at_accuracy.accuracy_floor: expected a finite number, got None",
        ),
        ({"tpf_at_accuracy": {"min_tpf": 0, "accuracy_floor": 0.5}}, "min_tpf: expected tokens per forward above 0"),
        (
            {"tpf_at_accuracy": {"min_tpf": 2, "accuracy_floor": 80}},
            "accuracy_floor: expected a share in [0, 1], got 80",
        ),
        ({"tpf_at_accuracy": {"min_tpf": 2, "accuracy_floor": 0.5, "at": 1}}, "unknown key 'at'"),
        ({"tpf_at_accuracy": [2, 0.5]}, "parallel.tpf_at_accuracy: expected dict"),
        ({"aup_min": -1}, "parallel.aup_min: expected a non-negative number"),
        ({"aup_min": float("nan")}, "parallel.aup_min: expected a finite number"),
        ({"aup_min": 1, "task": "poetry"}, "parallel.task: unknown task 'poetry'"),
    ],
)
def test_a_malformed_parallelism_gate_is_refused_naming_the_key(gate, message):
    with pytest.raises(PolicyError) as e:
        policy_with(gate)
    assert "stages.poc.gates.parallel" in str(e.value) and message in str(e.value), str(e.value)


def test_the_threshold_reads_as_a_person_writes_it_and_the_demo_policy_has_the_gate():
    spec = policy_with({"tpf_at_accuracy": {"min_tpf": 2, "accuracy_floor": 0.8}}).stage("poc").gate("parallel")
    assert gate_threshold(spec, None) == ">= 2 tokens per forward at accuracy >= 80%"
    assert gate_threshold(policy_with({"aup_min": 150}).stage("poc").gate("parallel"), None) == "AUP >= 150"
    demo = load_policy(POLICY_PATH.parent / "demo-policy.yaml")
    assert "parallelism" in {g.kind for g in demo.stage("poc").gates}


# --- recorded with the evidence: the sweep's folder and the registered version -------------------


def test_a_sweep_folder_holds_each_candidates_aup_with_the_records_of_its_curve(tmp_path):
    from evals.evidence import gather_evidence
    from evals.sweep import parse_sweep, run_sweep
    from tests.support.eval_fixtures import write_model

    refs = [str(write_model(tmp_path / "diff")), str(write_model(tmp_path / "ar", causal=True))]
    spec = parse_sweep(
        {
            "name": "aup",
            "models": refs,
            "tasks": [{"task": "arith", "n": 2}],
            "base": {"gen_length": 8, "block_length": 4},
            "grid": {"steps": [2, 4, 8]},
            "measure": {"warmup": 0, "batch_size": 2},
        }
    )
    result = run_sweep(spec, tmp_path / "out")
    gather_evidence(spec, result, plots=False, reproducibility=False)
    saved = json.loads((tmp_path / "out" / "parallelism.json").read_text())
    diffusion = next(c for c in saved if c["candidate"] == "diff")
    mine = [r for r in result.records if r.candidate == "diff"]
    assert diffusion["task"] == "arith" and diffusion["gen_length"] == 8
    assert sorted(t for t, _ in diffusion["points"] + diffusion["dropped"]) == [1.0, 2.0, 4.0]  # 8 / steps
    assert diffusion["aup"] == pytest.approx(aup([(r.tokens_per_forward, r.accuracy) for r in mine]).aup)
    assert set(diffusion["record_ids"]) <= {r.record_id for r in mine}
    assert {c["candidate"] for c in saved} == {"diff", "ar"}


def test_a_registered_version_records_its_aup_in_the_evidence_and_as_mlflow_metrics(tmp_path):
    from registry import register_evidence
    from tests.support.gate_fixtures import fresh_registry

    reg = fresh_registry(tmp_path)
    v, logged = register_evidence(reg, evidence(records=curve_records()))
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    summary = json.loads(reg.load_artifact_bytes(run_id, "evidence/evidence.json"))
    (curve,) = summary["parallelism"]
    assert (curve["task"], curve["gen_length"]) == ("arith", 32) and curve["aup"] == pytest.approx(aup(CURVE).aup)
    assert curve["record_ids"] == [r.record_id for r in logged.records[:3]]  # the 8-TPF point is off the curve
    assert reg.client.get_run(run_id).data.metrics["aup/arith/32"] == pytest.approx(aup(CURVE).aup)
