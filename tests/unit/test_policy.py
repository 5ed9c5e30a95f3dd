"""The stage policy: the bundled file is complete, and a malformed one is refused with its location."""

from __future__ import annotations

import copy

import pytest
import yaml

from gates.policy import (
    GATE_KINDS,
    OPT_IN_KINDS,
    POLICY_PATH,
    STAGES,
    MetricThreshold,
    PolicyError,
    load_policy,
    parse_policy,
)

EVERY_KIND = set(GATE_KINDS) - OPT_IN_KINDS  # the opt-in kinds are shown by gates/demo-policy.yaml


def _data():
    return yaml.safe_load(POLICY_PATH.read_text())


def test_bundled_policy_has_every_gate_kind_at_every_stage():
    policy = load_policy()
    assert list(policy.stages) == list(STAGES)
    for stage in STAGES:
        sp = policy.stage(stage)
        # serving is judged from staging on: a PoC is not served under load yet; canary (a live rollout's
        # analyses) is in the demo policy's production only, so the default `unmask run` stays as it was
        assert {g.kind for g in sp.gates} == EVERY_KIND - {"canary"} - ({"serving"} if stage == "poc" else set()), stage
        assert abs(sum(sp.weights.values()) - 1) < 1e-9
    assert policy.stage("production").gate("license").params["allowed_tiers"] == ["permitted"]
    assert policy.stage("staging").requires_stage == "poc"


def test_every_gate_kind_has_its_check_and_every_opt_in_kind_is_shown_by_the_demo_policy():
    from gates.checks import GATE_CHECKS

    assert set(GATE_CHECKS) == set(GATE_KINDS)  # a kind declared is a kind judged, and the other way round
    demo = load_policy(POLICY_PATH.parent / "demo-policy.yaml")
    shown = {g.kind for stage in demo.stages.values() for g in stage.gates}
    assert OPT_IN_KINDS <= shown and OPT_IN_KINDS <= set(GATE_KINDS)


def test_thresholds_tighten_from_poc_to_production():
    p = load_policy()
    p95 = [p.stage(s).gate("latency").params["max_p95_s"] for s in STAGES]
    speed = [p.stage(s).gate("speedup").params["min_speedup"] for s in STAGES]
    assert p95 == sorted(p95, reverse=True) and speed == sorted(speed)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["stages"].pop("staging"), "stages.staging: missing"),
        (lambda d: d["stages"].__setitem__("canary", {}), "stages.canary: unknown stage"),
        (
            lambda d: d["stages"]["poc"]["gates"]["latency"].update(max_p59_s=1),
            "stages.poc.gates.latency: unknown key 'max_p59_s'",
        ),
        (
            lambda d: d["stages"]["poc"]["gates"]["latency"].pop("max_p95_s"),
            "stages.poc.gates.latency: missing required key 'max_p95_s'",
        ),
        (
            lambda d: d["stages"]["staging"]["gates"]["memory"].update(max_peak_mem_mb="lots"),
            "stages.staging.gates.memory.max_peak_mem_mb: expected",
        ),
        (
            lambda d: d["stages"]["production"]["gates"]["license"].update(allowed_tiers=["free"]),
            "stages.production.gates.license.allowed_tiers: unknown tier 'free'",
        ),
        (
            lambda d: d["stages"]["poc"]["gates"].update(vibes={"kind": "vibes"}),
            "stages.poc.gates.vibes.kind: unknown gate kind 'vibes'",
        ),
        (
            lambda d: d["stages"]["poc"]["gates"]["quality"].update(min_relative_change=1.5, relative_to="fallback"),
            "min_relative_change: expected a number in [-1, 1]",
        ),
        (
            lambda d: d["stages"]["poc"]["gates"]["quality"].update(min_absolute_change=0.1),
            "stages.poc.gates.quality.relative_to: a min change needs a baseline",
        ),
        (
            lambda d: d["stages"]["poc"]["gates"]["quality_vs_fallback"].update(relative_to="yesterday"),
            "quality_vs_fallback.relative_to: expected one of",
        ),
        (
            lambda d: d["stages"]["poc"]["gates"]["reproducibility"].update(require=["bitwise"]),
            "reproducibility.require: unknown check 'bitwise'",
        ),
        (
            lambda d: d["stages"]["poc"]["scoring"]["weights"].update(speed=1),
            "stages.poc.scoring.weights.speed: unknown criterion",
        ),
        (lambda d: d["stages"]["poc"].pop("operating_point"), "stages.poc.operating_point: expected"),
        (
            lambda d: d["stages"]["poc"].update(requires_stage="production"),
            "stages.poc.requires_stage: expected an earlier stage",
        ),
        (
            lambda d: d["stages"]["staging"]["gates"]["serving"].pop("concurrency"),
            "stages.staging.gates.serving: missing required key 'concurrency'",
        ),
        (
            lambda d: d["stages"]["staging"]["gates"]["serving"].update(concurrency=0),
            "stages.staging.gates.serving.concurrency: expected requests in flight (>= 1)",
        ),
        (
            lambda d: d["stages"]["staging"]["gates"]["serving"].update(concurrency=4.5),
            "stages.staging.gates.serving.concurrency: expected int",
        ),
        (
            lambda d: d["stages"]["production"]["gates"].update(serving={"concurrency": 16}),
            "stages.production.gates.serving: a serving gate needs at least one of p95_s_max",
        ),
        (
            lambda d: d["stages"]["production"]["gates"]["serving"].update(p95_s_max=-1),
            "stages.production.gates.serving.p95_s_max: expected a non-negative number",
        ),
        (
            lambda d: d["stages"]["production"]["gates"]["serving"].update(p99_s_max=1),
            "stages.production.gates.serving: unknown key 'p99_s_max'",
        ),
    ],
)
def test_malformed_policy_names_stage_gate_and_key(edit, message):
    data = copy.deepcopy(_data())
    edit(data)
    with pytest.raises(PolicyError) as e:
        parse_policy(data, source="policy.yaml")
    assert message in str(e.value)
    assert str(e.value).startswith("policy.yaml: ")


def test_unreadable_policy_files(tmp_path):
    with pytest.raises(PolicyError, match="not found"):
        load_policy(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("stages: [unclosed")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(bad)


@pytest.mark.parametrize(
    "mt, value, baseline, passes",
    [
        (MetricThreshold(True, threshold=0.5), 0.5, None, True),
        (MetricThreshold(True, threshold=0.5), 0.49, None, False),
        (MetricThreshold(False, threshold=1.0), 0.9, None, True),
        (MetricThreshold(False, threshold=1.0), 1.1, None, False),
        (MetricThreshold(True, min_absolute_change=0.05), 0.75, 0.70, True),  # MLflow: >= baseline + 0.05
        (MetricThreshold(True, min_absolute_change=0.05), 0.74, 0.70, False),
        (MetricThreshold(True, min_absolute_change=-0.05), 0.66, 0.70, True),  # tolerated regression
        (MetricThreshold(True, min_absolute_change=-0.05), 0.64, 0.70, False),
        (MetricThreshold(True, min_relative_change=0.1), 0.77, 0.70, True),
        (MetricThreshold(True, min_relative_change=0.1), 0.76, 0.70, False),
        (MetricThreshold(False, min_relative_change=0.2), 0.8, 1.0, True),  # lower is better: <= baseline * 0.8
        (MetricThreshold(False, min_relative_change=0.2), 0.81, 1.0, False),
        (MetricThreshold(True, min_absolute_change=0.0), 0.7, None, False),  # needs a baseline
    ],
)
def test_metric_threshold_semantics(mt, value, baseline, passes):
    assert (not mt.failures(value, baseline)) is passes
