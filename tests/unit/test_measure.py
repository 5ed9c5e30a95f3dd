"""measure(): latency, throughput, first block, tokens/s, TPF, NFE, memory; failures become counted errors."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from evals.measure import FirstBlockClock, measure
from models import load
from sampler import SamplerConfig
from tests.support.eval_fixtures import NaNWhen, write_model


@pytest.fixture(scope="module")
def diffusion(tmp_path_factory):
    return load(write_model(tmp_path_factory.mktemp("m") / "diff"))


@pytest.fixture(scope="module")
def autoregressive(tmp_path_factory):
    return load(write_model(tmp_path_factory.mktemp("m") / "ar", causal=True))


def config_for(loaded, **changes) -> SamplerConfig:
    base = dict(
        steps=8, gen_length=16, block_length=8, mask_id=loaded.mask_id, eos_id=loaded.eos_id, eot_id=loaded.eot_id
    )
    return SamplerConfig(**(base | changes))


PROMPTS = ["Mia has 3 apples.", "Sort: dcba", "Fill: 1 2 ? 4", "hi!"]


def test_diffusion_measurement_fills_every_field(diffusion):
    config = config_for(diffusion)
    m = measure(diffusion, [diffusion.encode(p) for p in PROMPTS], config, warmup=1, batch_size=2)
    f = m.record_fields()
    assert f["errors"] == 0 and f["error_messages"] == []
    assert 0 < f["latency_p50_s"] <= f["latency_p95_s"] <= f["latency_p99_s"]
    assert f["nfe"] == config.steps  # vanilla decoding spends its whole step budget
    assert f["tokens_per_forward"] == pytest.approx(config.gen_length / config.steps)
    assert 0 < f["time_to_first_block_s"] <= f["latency_p99_s"]  # first of two blocks lands before the end
    assert f["throughput_items_per_s"] > 0 and f["batch_size"] == 2
    assert 0 <= f["tokens_per_s"] <= f["tokens_per_s_with_padding"]
    assert f["peak_mem_mb"] > 0 and f["warmup"] == 1
    assert len(f["output_hash"]) == 64


def test_the_first_block_lands_when_the_step_that_finished_block_0_is_reported():
    ticks = itertools.count(1.0)
    clock = FirstBlockClock(clock=lambda: next(ticks))
    for block, done in [(0, False), (0, False), (0, True), (1, False), (1, True)]:
        clock(SimpleNamespace(block=block, block_done=done))
    assert clock.at == 3.0  # the third report finished block 0; later blocks do not move it


def test_autoregressive_measurement_times_the_first_block(autoregressive):
    config = config_for(autoregressive, steps=16, block_length=8)
    f = measure(autoregressive, [autoregressive.encode(p) for p in PROMPTS], config, warmup=0).record_fields()
    assert 0 < f["time_to_first_block_s"] <= f["latency_p99_s"]


def test_output_hash_is_deterministic_and_sensitive(diffusion):
    prompts = [diffusion.encode(p) for p in PROMPTS[:2]]
    a = measure(diffusion, prompts, config_for(diffusion), warmup=0).record_fields()["output_hash"]
    b = measure(diffusion, prompts, config_for(diffusion), warmup=0).record_fields()["output_hash"]
    c = measure(diffusion, prompts, config_for(diffusion, steps=16), warmup=0).record_fields()["output_hash"]
    assert a == b != c


def test_autoregressive_measurement(autoregressive):
    config = config_for(autoregressive, steps=16, block_length=8)
    m = measure(autoregressive, [autoregressive.encode(p) for p in PROMPTS], config, warmup=0, batch_size=4)
    f = m.record_fields()
    assert f["errors"] == 0
    assert 1 <= f["nfe"] <= config.gen_length  # one call per token, stops early once every row hit EOS
    assert f["throughput_items_per_s"] > 0


def test_nan_logits_on_one_prompt_are_counted_and_the_rest_finish(diffusion):
    poisoned = diffusion.encode("!")[0]  # only the last prompt holds this token
    broken = diffusion.with_model(NaNWhen(diffusion.model, token=poisoned))
    m = measure(broken, [broken.encode(p) for p in PROMPTS], config_for(broken), warmup=0, batch_size=2)
    bad = [r for r in m.requests if not r.ok]
    assert [r.index for r in bad] == [3] and "NonFiniteLogitsError" in bad[0].error
    assert all(r.ok for r in m.requests[:3])
    assert len(m.batch_errors) == 2  # the batch holding it failed as a whole: both its items count
    f = m.record_fields()
    assert f["errors"] == 3 and f["latency_p50_s"] > 0 and f["nfe"] == 8
    assert any("item 3" in msg for msg in f["error_messages"])


def test_a_model_that_always_fails_gives_zeros_not_a_crash(diffusion):
    broken = diffusion.with_model(NaNWhen(diffusion.model))
    f = measure(broken, [broken.encode(p) for p in PROMPTS], config_for(broken), warmup=1, batch_size=1).record_fields()
    assert f["errors"] == len(PROMPTS)
    assert f["latency_p50_s"] == 0 and f["nfe"] == 0 and f["throughput_items_per_s"] is None


def test_useful_length_stops_at_eos(diffusion):
    eos = diffusion.eos_id
    assert diffusion.useful_length([5, 6, eos, eos]) == 2 and diffusion.useful_length([5, 6]) == 2


def test_bad_arguments_are_named(diffusion):
    with pytest.raises(ValueError, match="no prompts"):
        measure(diffusion, [], config_for(diffusion))
    with pytest.raises(ValueError, match="batch_size"):
        measure(diffusion, [[1]], config_for(diffusion), batch_size=0)
