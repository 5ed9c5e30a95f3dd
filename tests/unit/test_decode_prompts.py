"""`sampler.decode.decode_prompts`, the one batch entry that serving, measurement, the bench and the
reproducibility probe decode through: left padding, the padding id, and rows that decode as they would alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import models
from sampler import SamplerConfig
from sampler.decode import decode_prompts, left_pad, padding_id

PROMPTS = [
    "A box has 9 coins. Zoe takes 3. How many remain?",
    "Mia has 37 pens and buys 45 more. How many now?",
    "1 + 1",
]


def test_left_pad_pads_on_the_left_and_says_nothing_when_no_row_needs_it():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = left_pad([[1, 2], [3, 4]], pad_id=9)
    assert ids.tolist() == [[1, 2], [3, 4]] and mask is None


def test_the_padding_id_is_the_pad_else_the_eos_else_zero():
    assert padding_id(SimpleNamespace(pad_id=3, eos_id=1)) == 3
    assert padding_id(SimpleNamespace(pad_id=None, eos_id=1)) == 1
    assert padding_id(SimpleNamespace(pad_id=None, eos_id=None)) == 0


@pytest.mark.parametrize("name", ["tiny-llada", "tiny-ar"])
def test_each_row_of_a_batch_decodes_as_it_would_alone(name):
    handle = models.load(name)
    config = SamplerConfig(gen_length=8, block_length=8, steps=8, **handle.sampler_ids())
    prompts = [handle.encode(p) for p in PROMPTS]
    steps = []
    batch = decode_prompts(handle, prompts, config, on_step=steps.append)
    assert batch.generated.shape == (len(prompts), 8) and steps  # on_step reaches the decoder
    for row, prompt in enumerate(prompts):
        alone = decode_prompts(handle, [prompt], config)
        assert torch.equal(batch.generated[row], alone.generated[0]), (name, row)


def test_row_seeds_give_each_sampled_row_its_own_generator():
    handle = models.load("tiny-llada")
    config = SamplerConfig(gen_length=8, block_length=8, steps=8, temperature=1.0, **handle.sampler_ids())
    prompts = [handle.encode(p) for p in PROMPTS[:2]]
    batch = decode_prompts(handle, prompts, config, row_seeds=[11, 12])
    for row, seed in enumerate((11, 12)):
        alone = decode_prompts(handle, [prompts[row]], config.with_(seed=seed))
        assert torch.equal(batch.generated[row], alone.generated[0])
