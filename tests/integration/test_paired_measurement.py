"""A paired speed measurement of real checkpoints (evals.pipeline.measure_speed): a random-weight masked-diffusion
candidate and its causal twin, decoded interleaved on the same prompts; the record keeps what a reviewer needs to
recompute every ratio."""

from __future__ import annotations

from evals import pipeline
from evals.paired import PairedTimings, paired_ratios, round_spread
from evals.records import EvalRecord, SpeedComparison
from evals.sweep import load_sweep
from tests.support.flow_fixtures import CANDIDATE, FALLBACK, tiny_models, write_sweep


def test_a_candidate_and_the_fallback_are_timed_in_pairs_on_the_same_prompts(tmp_path):
    models = tiny_models(tmp_path / "models")
    spec = load_sweep(write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]], n=4))
    plans = {name: pipeline.plan_points(pipeline.prepare_candidate(models[name]), spec) for name in models}
    point = plans[CANDIDATE].points[0]
    fallback_point = plans[FALLBACK].points[0]
    baseline = EvalRecord.from_dict(pipeline.measure_point(fallback_point, plans[FALLBACK], html=False).record)

    speed = pipeline.measure_speed(point, plans[CANDIDATE], baseline, models[FALLBACK], rounds=2)

    assert (speed.task, speed.items, speed.rounds) == ("arith", 4, 2)
    assert (speed.config_hash, speed.baseline_config_hash) == (point.config_hash, baseline.config_hash)
    assert speed.baseline_weights_sha256 == baseline.weights_sha256 and speed.baseline_model == FALLBACK
    timings = PairedTimings.from_dict(speed.timings)
    assert timings.rounds == 2 and timings.items == 4
    assert all(t > 0 for row in timings.candidate_s + timings.baseline_s for t in row)
    recomputed = paired_ratios(timings, seed=speed.seed)
    for name in ("p50", "p95"):
        ratio = speed.ratio(name)
        assert ratio is not None and ratio.low <= ratio.estimate <= ratio.high
        assert ratio.to_dict() == recomputed[name].to_dict()  # the stored figure is the stored data's, exactly
    assert speed.spread == round(round_spread(timings), 4) and speed.steady == (speed.spread <= 1.5)
    assert speed.host.get("threads") == plans[CANDIDATE].threads
    assert SpeedComparison.from_dict(speed.to_dict()) == speed


def test_a_rerun_keeps_the_paired_measurement_its_registered_version_holds(tmp_path):
    from flows.tasks import measure_speed
    from tests.support.gate_fixtures import evidence, fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    held = evidence()
    register_pair(reg, held)
    prepared = pipeline.PreparedCandidate(
        ref="tiny-llada",
        candidate=held.candidate,
        path=str(tmp_path),
        role="candidate",
        kind=held.kind,
        revision="local",
        weights_sha256=held.weights_sha256,
        ids={},
        card=held.card,
    )
    no_points = pipeline.SweepPlan(name="tiny", device="cpu", dtype="float32", measure={}, points=[])
    records = [r.to_dict() for r in held.records]
    kept = measure_speed.fn(prepared, no_points, records, reg.tracking_uri, rounds=3)  # nothing to measure: kept
    assert [SpeedComparison.from_dict(s) for s in kept] == held.speed and held.speed
    assert measure_speed.fn(prepared, no_points, records, reg.tracking_uri, remeasure=True) == []
    assert measure_speed.fn(prepared, no_points, records, reg.tracking_uri, rounds=5) == []  # held 3 rounds: anew
