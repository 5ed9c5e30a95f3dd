"""Prefix and dual KV caches: a cached call sees the same positions as a full forward, and a
refresh every step (k = 1) gives exactly the no-cache tokens."""

from __future__ import annotations

import itertools

import pytest
import torch

from sampler import SamplerConfig, generate
from tests.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.mark.parametrize("reuse", ["prefix", "dual"])
def test_cached_block_logits_equal_the_full_forward_on_an_unchanged_canvas(model, reuse):
    """Keys cached after RoPE plus the block's true position ids reproduce the full forward."""
    ids, mask = left_padded_prompts([6, 3], seed=5)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([ids, torch.randint(0, 44, (2, 16), generator=g)], dim=1)
    full_mask = torch.cat([mask, torch.ones(2, 16, dtype=torch.long)], dim=1)
    with torch.no_grad():
        full = model(x, attention_mask=full_mask, use_cache=True)
        start, end = 10, 14  # a block in the middle of the generation
        hi = x.shape[1] if reuse == "prefix" else end
        keep = torch.cat([torch.arange(0, start), torch.arange(hi, x.shape[1])])
        past = [(k[:, :, keep], v[:, :, keep]) for k, v in full.past_key_values]
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        cached = model(x[:, start:hi], attention_mask=torch.cat([full_mask[:, keep], full_mask[:, start:hi]], dim=1),
                       position_ids=positions[:, start:hi], past_key_values=past).logits
    assert torch.allclose(cached, full.logits[:, start:hi], atol=1e-5)


GRID = list(itertools.product(
    ["prefix", "dual"],
    [(16, 16, 4), (8, 16, 8)],  # (steps, gen_length, block_length)
    [0.0, 0.7],  # temperature
    [0.0, 1.0],  # cfg_scale
    [1, 3],  # batch
))


@pytest.mark.parametrize("reuse,shape,temperature,cfg_scale,batch", GRID)
def test_refresh_every_step_equals_no_cache(model, reuse, shape, temperature, cfg_scale, batch):
    steps, gen_length, block_length = shape
    ids, mask = left_padded_prompts([5, 3, 7][:batch], seed=batch)
    mask = mask if batch > 1 else None
    base = SamplerConfig(steps=steps, gen_length=gen_length, block_length=block_length, temperature=temperature,
                         cfg_scale=cfg_scale, seed=11, **IDS)
    plain = generate(model, ids, base, attention_mask=mask)
    cached = generate(model, ids, base.with_(cache=reuse, cache_refresh=1), attention_mask=mask)
    assert torch.equal(cached.sequences, plain.sequences)
    assert cached.nfe == plain.nfe == steps


@pytest.mark.parametrize("reuse", ["prefix", "dual"])
@pytest.mark.parametrize("refresh", [0, 2, 3])
def test_cached_decoding_completes_with_the_same_call_count(model, reuse, refresh):
    ids, mask = left_padded_prompts([5, 3], seed=7)
    cfg = SamplerConfig(steps=24, gen_length=24, block_length=8, cache=reuse, cache_refresh=refresh,
                        cfg_scale=0.5, **IDS)
    out = generate(model, ids, cfg, attention_mask=mask)
    assert out.nfe == 24 and out.block_nfe == [8, 8, 8]
    assert (out.generated != MASK_ID).float().mean() > 0.9  # MASK_ID itself may be proposed


def test_cached_calls_use_only_the_window(model):
    """A dual-cache step feeds the model the block only; prefix cache the block and the suffix."""
    ids, _ = left_padded_prompts([4], seed=0)
    widths = {"prefix": [], "dual": []}
    for reuse in widths:
        def spy(x, attention_mask=None, **kw):
            widths[reuse].append(x.shape[1])
            return model(x, attention_mask=attention_mask, **kw)
        generate(spy, ids, SamplerConfig(steps=8, gen_length=16, block_length=8, cache=reuse, **IDS))
    assert widths["prefix"] == [20, 16, 16, 16, 20, 8, 8, 8]
    assert widths["dual"] == [20, 8, 8, 8, 20, 8, 8, 8]


def test_cache_refuses_masks_inside_the_prompt(model):
    ids = torch.tensor([[1, MASK_ID, 3, 4]])
    with pytest.raises(ValueError, match="SamplerConfig.cache='dual' cannot decode masks inside the prompt"):
        generate(model, ids, SamplerConfig(steps=8, gen_length=8, block_length=8, cache="dual", **IDS))
