"""Prefix and dual KV caches: a cached call sees the same positions as a full forward, and a
refresh every step (k = 1) gives exactly the no-cache tokens."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from sampler import SamplerConfig, generate
from sampler.continuous import joins_running_batch
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

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
        cached = model(
            x[:, start:hi],
            attention_mask=torch.cat([full_mask[:, keep], full_mask[:, start:hi]], dim=1),
            position_ids=positions[:, start:hi],
            past_key_values=past,
        ).logits
    assert torch.allclose(cached, full.logits[:, start:hi], atol=1e-5)


GRID = list(
    itertools.product(
        ["prefix", "dual"],
        [(16, 16, 4), (8, 16, 8)],  # (steps, gen_length, block_length)
        [0.0, 0.7],  # temperature
        [0.0, 1.0],  # cfg_scale
        [1, 3],  # batch
    )
)


@pytest.mark.parametrize("reuse,shape,temperature,cfg_scale,batch", GRID)
def test_refresh_every_step_equals_no_cache(model, reuse, shape, temperature, cfg_scale, batch):
    steps, gen_length, block_length = shape
    ids, mask = left_padded_prompts([5, 3, 7][:batch], seed=batch)
    mask = mask if batch > 1 else None
    base = SamplerConfig(
        steps=steps,
        gen_length=gen_length,
        block_length=block_length,
        temperature=temperature,
        cfg_scale=cfg_scale,
        seed=11,
        **IDS,
    )
    plain = generate(model, ids, base, attention_mask=mask)
    cached = generate(model, ids, base.with_(cache=reuse, cache_refresh=1), attention_mask=mask)
    assert torch.equal(cached.sequences, plain.sequences)
    assert cached.nfe == plain.nfe == steps


@pytest.mark.parametrize("reuse", ["prefix", "dual"])
@pytest.mark.parametrize("refresh", [0, 2, 3])
def test_cached_decoding_completes_with_the_same_call_count(model, reuse, refresh):
    ids, mask = left_padded_prompts([5, 3], seed=7)
    cfg = SamplerConfig(
        steps=24, gen_length=24, block_length=8, cache=reuse, cache_refresh=refresh, cfg_scale=0.5, **IDS
    )
    out = generate(model, ids, cfg, attention_mask=mask)
    assert out.nfe == 24 and out.block_nfe == [8, 8, 8]
    assert (out.generated != MASK_ID).float().mean() > 0.9  # MASK_ID itself may be proposed


def test_cached_calls_use_only_the_window(model):
    """A dual-cache step feeds the model the block only; prefix cache the block and the suffix."""
    ids, _ = left_padded_prompts([4], seed=0)
    widths = {"prefix": [], "dual": []}
    for reuse in widths:

        def spy(x, attention_mask=None, _seen=widths[reuse], **kw):
            _seen.append(x.shape[1])
            return model(x, attention_mask=attention_mask, **kw)

        generate(spy, ids, SamplerConfig(steps=8, gen_length=16, block_length=8, cache=reuse, **IDS))
    assert widths["prefix"] == [20, 16, 16, 16, 20, 8, 8, 8]
    assert widths["dual"] == [20, 8, 8, 8, 20, 8, 8, 8]


def test_cache_refuses_masks_inside_the_prompt(model):
    ids = torch.tensor([[1, MASK_ID, 3, 4]])
    with pytest.raises(ValueError, match="SamplerConfig.cache='dual' cannot decode masks inside the prompt"):
        generate(model, ids, SamplerConfig(steps=8, gen_length=8, block_length=8, cache="dual", **IDS))


def test_a_span_refresh_recomputes_from_the_cached_block_start(model):
    """`refresh_span='from_cached_block'`: block 0's refresh is the whole canvas, block b's starts at block b - 1
    (its tokens are new), and a refresh inside a block starts at that block."""
    ids, _ = left_padded_prompts([4], seed=0)
    widths = {}
    for span in ("canvas", "from_cached_block"):
        widths[span] = []

        def spy(x, attention_mask=None, _seen=widths[span], **kw):
            _seen.append((x.shape[1], 0 if kw.get("past_key_values") is None else kw["past_key_values"][0][0].shape[2]))
            return model(x, attention_mask=attention_mask, **kw)

        generate(
            spy,
            ids,
            SamplerConfig(
                steps=12, gen_length=24, block_length=8, cache="dual", cache_refresh=2, refresh_span=span, **IDS
            ),
        )
    # (positions run, cached keys given): per block of 4 steps, refreshes at steps 0 and 2, a window of 8 after each
    assert widths["canvas"] == [(28, 0), (8, 28)] * 6
    assert widths["from_cached_block"] == [
        (28, 0),
        (8, 28),
        (24, 4),
        (8, 28),  # block 0: from the prompt's end
        (24, 4),
        (8, 28),
        (16, 12),
        (8, 28),  # block 1: from block 0, then itself
        (16, 12),
        (8, 28),
        (8, 20),
        (8, 28),
    ]


GRID_SPAN = [
    case
    for case in itertools.product(["prefix", "dual"], [0.0, 1.0], [1, 3], [0, 3], [0, 4])
    if not (case[4] and case[1])
]  # the future window with and without the rest, CFG once


@pytest.mark.parametrize("reuse,cfg_scale,batch,refresh,window", GRID_SPAN)
def test_a_span_refresh_of_a_causal_model_equals_the_whole_canvas_refresh(reuse, cfg_scale, batch, refresh, window):
    """Under causal attention a position's keys/values depend only on what precedes it, and everything before the
    cached block is final, so the kept keys/values are what a whole-canvas refresh computes: same logits, same tokens.
    (A bidirectional model's kept keys saw the canvas as it was: lossy, measured, not tested for equality.)"""
    causal = tiny_model(seed=5, causal=True)
    ids, mask = left_padded_prompts([5, 3, 7][:batch], seed=batch)
    mask = mask if batch > 1 else None
    base = SamplerConfig(
        steps=12,
        gen_length=24,
        block_length=8,
        cache=reuse,
        cache_refresh=refresh,
        cfg_scale=cfg_scale,
        future_window=window,
        **IDS,
    )
    runs = {}
    for span in ("canvas", "from_cached_block"):
        steps = []
        runs[span] = (
            generate(causal, ids, base.with_(refresh_span=span), attention_mask=mask, on_step=steps.append),
            steps,
        )
    (whole, whole_steps), (kept, kept_steps) = runs["canvas"], runs["from_cached_block"]
    assert torch.equal(kept.sequences, whole.sequences) and kept.nfe == whole.nfe
    P = ids.shape[1]
    for a, b in zip(whole_steps, kept_steps):  # each step's logits over its block, wherever its window starts
        start = P + a.block * 8
        block_a = a.logits[:, start - a.logits_lo : start - a.logits_lo + 8]
        block_b = b.logits[:, start - b.logits_lo : start - b.logits_lo + 8]
        assert torch.allclose(block_a, block_b, atol=1e-4), f"step {a.step}"
    assert any(s.logits_lo > 0 for s in kept_steps if s.step % 4 == 0 and s.step)  # the spans did start later


@pytest.mark.parametrize(
    "changes,needs",
    [
        ({"cache": "none"}, "needs cache in 'dual', 'prefix'; got cache='none'"),
        ({"cache": "dual", "backend": "onnxruntime"}, "needs backend in 'torch'; got backend='onnxruntime'"),
    ],
)
def test_a_span_refresh_is_refused_where_it_cannot_work(changes, needs):
    with pytest.raises(ValueError, match=re.escape(f"SamplerConfig.refresh_span='from_cached_block' {needs}")):
        SamplerConfig(steps=8, gen_length=8, block_length=8, refresh_span="from_cached_block", **changes, **IDS)


def test_a_span_refresh_decodes_statically_not_in_a_running_batch():
    config = SamplerConfig(steps=8, gen_length=16, block_length=8, cache="dual", **IDS)
    assert joins_running_batch(config) and not joins_running_batch(config.with_(refresh_span="from_cached_block"))


def test_a_cached_window_computes_only_the_rows_with_a_mask_in_it(model):
    """Rows whose block is done wait for the others without being computed; their tokens are unchanged."""
    ids, mask = left_padded_prompts([5, 3, 7, 4], seed=9)
    rows = []

    def spy(x, attention_mask=None, **kw):
        rows.append((x.shape[0], kw.get("past_key_values") is not None))
        return model(x, attention_mask=attention_mask, **kw)

    config = SamplerConfig(
        steps=16, gen_length=16, block_length=8, cache="dual", parallel="threshold", parallel_threshold=0.5, **IDS
    )
    out = generate(spy, ids, config, attention_mask=mask)
    assert torch.equal(out.sequences, generate(model, ids, config, attention_mask=mask).sequences)
    assert all(n == 4 for n, cached in rows if not cached)  # refreshes keep every row's keys/values
    assert any(n < 4 for n, cached in rows if cached), rows
