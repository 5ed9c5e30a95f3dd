"""Sweeps: file checking, one record per point, incremental saving, failures that lose nothing, plots."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from evals import sweep as sweep_module
from evals.plots import plot_quality_latency, quality_latency_front
from evals.store import load_records
from evals.sweep import SweepError, default_sweep_path, load_sweep, parse_sweep, run_sweep, valid_points
from sampler.block_diffusion import BlockDiffusionConfig
from tests.support.eval_fixtures import (
    hub_llama_copy,
    write_diffusion_gemma,
    write_llada2,
    write_model,
    write_nemotron,
    write_sdar,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return str(write_model(root / "diff")), str(write_model(root / "ar", causal=True))


def small_sweep(model_refs, **changes) -> dict:
    base = {
        "name": "t",
        "models": list(model_refs),
        "tasks": [{"task": "arith", "n": 3}],
        "base": {"gen_length": 8, "block_length": 4},
        "grid": {"steps": [2, 8]},
        "measure": {"warmup": 0, "batch_size": 2},
    }
    return base | changes


BAD = [
    ({"modles": ["x"]}, "modles"),
    ({"models": []}, "models"),
    ({"grid": {"stepz": [4]}}, "grid.stepz"),
    ({"grid": {"steps": 4}}, "grid.steps"),
    ({"grid": [{"steps": [4]}, {"cache": "dual"}]}, "grid[1].cache"),
    ({"base": {"gen_lenght": 16}}, "base.gen_lenght"),
    ({"tasks": [{"task": "arithmetic"}]}, "tasks[0].task"),
    ({"tasks": [{"task": "arith", "n": 0}]}, "tasks[0].n"),
    ({"tasks": [{"task": "arith", "file": "x.jsonl"}]}, "tasks[0]"),
    ({"tasks": [{"task": "arith", "splt": "test"}]}, "tasks[0].splt"),
    ({"measure": {"batch_size": 0}}, "measure.batch_size"),
    ({"measure": {"repeats": 3}}, "measure.repeats"),
    ({"grid": {"steps": [3]}}, "no grid point"),  # 3 steps cannot split over 2 blocks of 4
]


@pytest.mark.parametrize("change,named", BAD, ids=[b[1] for b in BAD])
def test_bad_sweep_is_a_clear_error_naming_the_key(change, named, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(small_sweep(["m"], **change)))
    with pytest.raises(SweepError) as info:
        load_sweep(path)
    assert named in str(info.value) and str(path) in str(info.value)


def test_unreadable_sweep_files(tmp_path):
    with pytest.raises(SweepError, match="not found"):
        load_sweep(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("models: [a\n")
    with pytest.raises(SweepError, match="not valid YAML"):
        load_sweep(tmp_path / "broken.yaml")


def test_default_sweep_is_valid_and_small():
    spec = load_sweep(default_sweep_path())
    assert spec.models == ["tiny-llada", "tiny-dgemma", "tiny-ar"]  # both diffusion families and the AR fallback
    points = valid_points(spec, spec.tasks[0])
    assert 3 <= len(points) <= 14
    assert len(valid_points(spec, spec.tasks[0], kind="autoregressive")) == 1  # the AR reference point
    # block diffusion reads only the step budget: the steps curve, one point per distinct budget, down to one
    # step per canvas (where tiny-dgemma's quality falls)
    assert [p["steps"] for p in valid_points(spec, spec.tasks[0], kind="block-diffusion")] == [1, 2, 4, 8, 16, 32]


# slow: about 8 s alone on two cores; GX and matplotlib imports, three decoding points
def test_sweep_yields_one_validated_record_per_point_and_saves_them(models, tmp_path):
    events = []
    result = run_sweep(parse_sweep(small_sweep(models)), tmp_path, on_event=lambda k, i: events.append(k))
    assert result.failures == []
    kinds = [(r.candidate, r.kind, r.config["steps"]) for r in result.records]
    assert kinds == [("diff", "masked-diffusion", 2), ("diff", "masked-diffusion", 8), ("ar", "autoregressive", 8)]
    assert all(r.valid is True and r.n_items == 3 == r.expected_items for r in result.records)
    assert all(r.fingerprint["torch"] == torch.__version__ and r.fingerprint["git_commit"] for r in result.records)
    assert events.count("record") == 3 and events.count("request") == 9 and events[0] == "plan"
    on_disk = load_records(tmp_path / "records.parquet")
    assert [r.to_dict() for r in on_disk] == [r.to_dict() for r in result.records]
    assert len(load_records(tmp_path / "records.csv")) == 3
    assert len(list((tmp_path / "validation").glob("*.html"))) == 3
    assert (tmp_path / "task-validation-arith-test.json").is_file()
    paths = plot_quality_latency(result.records, tmp_path)
    assert paths[0].stat().st_size > 5000


def test_a_point_that_crashes_loses_nothing_finished(models, tmp_path, monkeypatch):
    real = sweep_module.measure_point
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("worker died")
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "measure_point", flaky)
    result = run_sweep(parse_sweep(small_sweep([models[0], "no-such-model"])), tmp_path)
    assert len(result.records) == 1 and len(load_records(tmp_path / "records.parquet")) == 1
    assert any("worker died" in f for f in result.failures)
    assert any("no-such-model" in f for f in result.failures)
    assert (tmp_path / "failures.json").is_file()


def test_a_checkpoint_with_nan_weights_gives_an_invalid_record(models, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = write_model(tmp_path / "nan-model")
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k in tensors if k.endswith("ff_out.weight") and "blocks" not in k)
    tensors[name][:] = float("nan")
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    result = run_sweep(parse_sweep(small_sweep([str(folder)], grid={"steps": [2]})), tmp_path / "out")
    (record,) = result.records
    assert record.errors == 3 + 3  # every request alone and every batch item
    assert "NonFiniteLogitsError" in record.error_messages[0]
    assert record.valid is False
    failed = {f["expectation"] for f in record.validation["failed"]}
    assert "expect_column_values_to_be_between" in failed  # latencies are not positive
    assert load_records(tmp_path / "out")[0].valid is False


def test_task_file_sweep(models, tmp_path):
    import json

    path = tmp_path / "gsm.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"question": f"What is {i}+1?", "answer": f"{i}+1={i + 1}\n#### {i + 1}"}) for i in range(3)
        )
        + "\n"
    )
    spec = parse_sweep(small_sweep(models[:1], tasks=[{"file": str(path)}], grid={"steps": [2]}))
    (record,) = run_sweep(spec, tmp_path / "out").records
    assert record.task == "gsm8k" and record.n_items == 3 and record.accuracy_strict is not None and record.valid


def test_pareto_front():
    points = [(1.0, 0.2), (2.0, 0.5), (1.5, 0.1), (3.0, 0.5), (4.0, 0.9)]
    assert quality_latency_front(points) == [0, 1, 4]


def test_a_broken_validator_marks_records_invalid_and_keeps_them(models, tmp_path, monkeypatch):
    import evals.validation

    def broken(record, html=True):
        raise RuntimeError("GX exploded")

    monkeypatch.setattr(evals.validation, "validate_record", broken)
    (record,) = run_sweep(parse_sweep(small_sweep(models[:1], grid={"steps": [2]})), tmp_path).records
    assert record.valid is False and "GX exploded" in record.validation["error"]
    assert load_records(tmp_path)[0].valid is False


def test_threads_setting(tmp_path):
    assert parse_sweep(small_sweep(["m"], threads=1)).threads == 1
    with pytest.raises(SweepError, match="threads"):
        parse_sweep(small_sweep(["m"], threads=0))


def test_catalog_settings_are_sampler_settings():
    from evals.sweep import catalog_settings, sampler_keys

    settings = catalog_settings("llada-8b-instruct")
    assert settings["steps"] == 128 and set(settings) <= sampler_keys() and "mask_id" not in settings
    assert catalog_settings("no-such-model") == {}


# slow: two models, GX validation: about 10 s on two cores
def test_a_hugging_face_causal_lm_is_swept_like_its_llada_layout_twin(models, tmp_path):
    hub = hub_llama_copy(models[1], tmp_path / "hub-llama")
    assert json.loads((hub / "config.json").read_text())["model_type"] == "llama"
    result = run_sweep(parse_sweep(small_sweep([models[1], str(hub)])), tmp_path / "out")
    assert result.failures == []
    native, converted = result.records
    assert (converted.candidate, converted.kind, converted.role) == ("hub-llama", "autoregressive", "fallback")
    assert converted.valid is True and converted.n_items == 3 and converted.errors == 0
    # the same network decoded by transformers' generate and by unmask's own AR decoder: the same tokens
    assert converted.output_hash == native.output_hash and converted.accuracy == native.accuracy
    assert converted.nfe == native.nfe and converted.time_to_first_block_s is not None
    assert converted.throughput_items_per_s is not None and converted.weights_sha256 != native.weights_sha256


# slow: transformers' DiffusionGemma, GX validation: about 10 s on two cores
def test_a_diffusion_gemma_block_diffusion_model_is_swept_on_its_own_settings(models, tmp_path):
    folder = write_diffusion_gemma(tmp_path / "dg")
    grid = [{"steps": [2, 8]}, {"steps": [8], "parallel": ["threshold"], "parallel_threshold": [0.9]}]
    result = run_sweep(parse_sweep(small_sweep([str(folder)], grid=grid)), tmp_path / "out")
    assert result.failures == []
    # the block loop reads gen_length, steps and seed only, so the parallel point is the steps-8 point again;
    # the record holds the effective block config that decoded (steps per canvas, the model's new tokens)
    assert [r.config["max_denoising_steps"] for r in result.records] == [2, 8]
    fast, slow = result.records
    for r in result.records:
        assert (r.candidate, r.kind, r.role) == ("dg", "block-diffusion", "candidate")
        assert r.valid is True and r.n_items == 3 and r.errors == 0 and r.time_to_first_block_s is not None
        assert r.config["max_new_tokens"] == r.gen_length == 8  # one canvas of the model
        assert r.config_hash == BlockDiffusionConfig(**(r.config | {"eos_ids": tuple(r.config["eos_ids"])})).hash()
    assert 1 <= fast.nfe <= 2 < slow.nfe <= 8  # denoising steps per canvas, at most the budget
    again = run_sweep(parse_sweep(small_sweep([str(folder)], grid={"steps": [2]})), tmp_path / "again")
    assert again.records[0].output_hash == fast.output_hash  # seeded block sampling: the same tokens


# slow: GX validation and a plot-free sweep, about 8 s on two cores
@pytest.mark.parametrize("family", ["sdar", "llada2", "nemotron"])
def test_a_masked_block_diffusion_model_is_swept_on_its_masked_canvas(models, tmp_path, family):
    """What `unmask eval` runs, on a random SDAR and the LLaDA2 MoE and Nemotron-Labs-Diffusion parity checkpoints:
    block-diffusion records holding the masked canvas (Nemotron's: seeded, self-speculative) that decoded."""
    folder = {"sdar": write_sdar, "llada2": write_llada2, "nemotron": write_nemotron}[family](tmp_path / family)
    result = run_sweep(parse_sweep(small_sweep([str(folder)], grid={"steps": [2, 8]})), tmp_path / "out")
    assert result.failures == []
    for r in result.records:
        assert (r.candidate, r.kind, r.role) == (family, "block-diffusion", "candidate")
        assert r.valid is True and r.n_items == 3 and r.errors == 0
        assert (r.config["canvas"], r.config["remasking"], r.config["max_new_tokens"]) == (
            "seeded" if family == "nemotron" else "masked",
            "low_confidence_dynamic",
            8,
        )
        assert r.config.get("mode") == ("self_speculative" if family == "nemotron" else None)
    if family == "sdar":  # steps spread over 2 blocks of 4
        assert [r.config["max_denoising_steps"] for r in result.records] == [1, 4]
