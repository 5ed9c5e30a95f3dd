"""`compile=True`: the torch module runs through torch.compile, once per module, and decodes the
tokens eager decoding gives (on a peaky model, where ~1e-5 rounding cannot flip an argmax)."""

from __future__ import annotations

import pytest
import torch

from sampler import SamplerConfig, generate
from sampler import backends as sampler_backends
from sampler.autoregressive import generate_autoregressive
from sampler.backends import compiled
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)


def test_compile_is_refused_with_another_backend_and_hashed_only_when_on():
    with pytest.raises(ValueError, match="SamplerConfig.compile=True compiles the torch module; backend='onnxruntime'"):
        SamplerConfig(compile=True, backend="onnxruntime")
    with pytest.raises(ValueError, match="SamplerConfig.compile must be true or false, got 'yes'"):
        SamplerConfig(compile="yes")
    base = SamplerConfig()
    assert base.with_(compile=False).hash() == base.hash() != base.with_(compile=True).hash()


def test_a_plain_callable_is_left_as_it_is():
    spy = lambda x, attention_mask=None: None  # noqa: E731
    assert compiled(spy) is spy


def test_compiled_decoding_gives_the_eager_tokens_and_compiles_once():
    model = tiny_model(seed=3)
    ids, mask = left_padded_prompts([5, 3], seed=2)
    cfg = SamplerConfig(
        steps=16,
        gen_length=32,
        block_length=16,
        cache="dual",
        future_window=8,
        parallel="threshold",
        parallel_threshold=0.5,
        **IDS,
    )
    eager = generate(model, ids, cfg, attention_mask=mask)
    fast = generate(model, ids, cfg.with_(compile=True), attention_mask=mask)
    assert torch.equal(fast.sequences, eager.sequences)
    assert compiled(model) is compiled(model)


def test_the_causal_twin_compiles_too_and_gives_its_eager_tokens():
    """A compiled comparison of the two kinds compiles both: the AR decoder reads `compile` as the sampler does."""
    model = tiny_model(seed=4, causal=True)
    ids, mask = left_padded_prompts([5, 3], seed=1)
    cfg = SamplerConfig(steps=12, gen_length=12, block_length=12, **IDS)
    eager = generate_autoregressive(model, ids, cfg, attention_mask=mask)
    fast = generate_autoregressive(model, ids, cfg.with_(compile=True), attention_mask=mask)
    assert torch.equal(fast.sequences, eager.sequences)
    assert model in sampler_backends._COMPILED  # it ran through the compiled wrapper
