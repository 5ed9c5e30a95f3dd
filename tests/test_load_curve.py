"""How fast serving can get: the batching cap measured on the bundled tiny models (`evals.batching_cap`)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def handles():
    import models
    from models.loading import resolve_model_path

    return {name: models.load(str(resolve_model_path(name))) for name in ("tiny-llada", "tiny-ar")}


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-ar"])
def test_the_cap_on_a_bundled_tiny_model_is_timed_on_its_operating_forward(handles, name):
    from evals.batching_cap import measure_cap
    from serving_fixtures import OPERATING, PROMPTS
    from sampler.config import SamplerConfig

    handle = handles[name]
    config = SamplerConfig(**OPERATING[name]).with_(**handle.sampler_ids())
    cap = measure_cap(handle, config, [handle.encode(p) for p in PROMPTS], rows=(4,), repeats=3)
    assert set(cap.forward_s) == {1, 4} and all(s > 0 for s in cap.forward_s.values())
    assert cap.forward == ("canvas" if name == "tiny-llada" else "cached step")
    assert cap.cap(1) == 1.0 and cap.cap(4) > 0
    if name == "tiny-llada":  # four canvases are four times the work: far from the bound whatever the host does
        assert cap.cap(4) <= 4


def test_no_prompts_is_refused_by_name(handles):
    from evals.batching_cap import measure_cap
    from sampler.config import SamplerConfig

    with pytest.raises(ValueError, match="measure_cap: no prompts"):
        measure_cap(handles["tiny-ar"], SamplerConfig(), [])


def test_the_gain_of_each_loaded_level_is_read_against_the_cap_at_the_rows_it_batches():
    from evals.batching_cap import BatchingCap, cap_rows, gains_against_caps
    from gate_fixtures import serving_record

    records = [serving_record(concurrency=c, tokens_per_s=rate) for c, rate in ((1, 100.0), (4, 200.0), (32, 300.0))]
    cap = BatchingCap({1: 0.01, 4: 0.02, 16: 0.04}, "canvas")  # cap 2x at 4 rows, 4x at 16
    four, many = gains_against_caps(records, {"production": cap}, max_batch=16)
    assert (four.concurrency, four.gain, four.cap, four.share) == (4, 2.0, 2.0, 1.0)
    assert (many.concurrency, many.gain, many.cap, many.share) == (32, 3.0, 4.0, 0.75)  # 32 in flight: batches of 16
    [remote] = gains_against_caps(records[:2], {}, max_batch=16)
    assert remote.gain == 2.0 and remote.cap is None and remote.share is None
    assert cap_rows([1, 2, 32], max_batch=16) == (1, 2, 16)
