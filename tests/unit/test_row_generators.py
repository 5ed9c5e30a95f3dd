"""One random generator per row (`sampler/rng.py`): a seeded sampled row decodes the same alone or in a batch.

The reference draws one stream over the whole batch, so sampled rows depend on their neighbours; with
`row_seeds` each row draws only over its own positions, from its own seed, in a solo decode's order.
"""

from __future__ import annotations

import pytest
import torch

from sampler import SamplerConfig, generate
from sampler.autoregressive import generate_autoregressive
from sampler.decode import DecodeError, decode
from sampler.rng import RowGenerators, left_pads, uniform
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
LENGTHS, SEEDS = [5, 9, 7], [3, 11, 7]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=4)


@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"remasking": "random"},
        {"remasking": "random", "temperature": 0.0},
        {"parallel": "ancestral"},
        {"parallel": "ancestral", "temperature": 0.0},
        {"cfg_scale": 1.0},
        {"cache": "prefix"},
        {"parallel": "threshold", "parallel_threshold": 0.5},
        {"parallel": "entropy"},
        {"parallel": "factor"},
        {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.5},  # rows finish blocks at different steps
        {"early_exit": "eos_decided"},
    ],
)
def test_a_seeded_sampled_row_decodes_in_a_batch_as_it_does_alone(model, mode):
    prompts, attention = left_padded_prompts(LENGTHS)
    config = SamplerConfig(steps=16, gen_length=32, block_length=8, temperature=0.9, **IDS).with_(**mode)
    batched = generate(model, prompts, config, attention_mask=attention, row_seeds=SEEDS).generated
    for row, (n, seed) in enumerate(zip(LENGTHS, SEEDS)):
        alone = generate(model, prompts[row : row + 1, -n:], config.with_(seed=seed)).generated  # the plain path
        assert torch.equal(alone[0], batched[row]), (mode, row)
    shared = generate(model, prompts, config, attention_mask=attention).generated  # one generator for the batch
    assert not torch.equal(shared, batched)  # what per-row generators change: else this test proves nothing


def test_the_autoregressive_decoder_takes_a_generator_per_row_too(model):
    prompts, attention = left_padded_prompts(LENGTHS)
    config = SamplerConfig(steps=32, gen_length=32, block_length=32, temperature=0.9, **IDS)
    batched = generate_autoregressive(model, prompts, config, attention_mask=attention, row_seeds=SEEDS).generated
    for row, (n, seed) in enumerate(zip(LENGTHS, SEEDS)):
        alone = generate_autoregressive(model, prompts[row : row + 1, -n:], config.with_(seed=seed)).generated
        assert torch.equal(alone[0, : batched.shape[1]], batched[row])


def test_row_draws_skip_left_padding_and_match_a_solo_stream():
    rows = RowGenerators([1, 2], left_pads(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]), 2), torch.device("cpu"))
    draws = uniform((2, 4, 3), torch.float64, torch.device("cpu"), rows)
    alone = torch.rand((1, 2, 3), dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(draws[0, 2:], alone[0]) and bool((draws[0, :2] == 0.5).all())
    assert torch.equal(draws[1], torch.rand((4, 3), dtype=torch.float64, generator=torch.Generator().manual_seed(2)))
    later = uniform((2, 2), None, torch.device("cpu"), RowGenerators([1, 2], [3, 0], torch.device("cpu")).at(2))
    assert later.shape == (2, 2) and later[0, 0] == 0.5  # a window from position 2: row 0's position 2 is padding
    with pytest.raises(ValueError, match="3 rows"):
        uniform((2, 4), None, torch.device("cpu"), RowGenerators([1, 2, 3], [0, 0, 0], torch.device("cpu")))


def test_decode_refuses_row_seeds_it_cannot_honour():
    import models

    handle = models.load("tiny-llada")
    ids = torch.tensor([handle.encode("1 + 1")])
    config = SamplerConfig(steps=8, gen_length=8, block_length=8, temperature=0.5).with_(**handle.sampler_ids())
    with pytest.raises(DecodeError, match="2 seeds for 1 rows"):
        decode(handle, ids, config, row_seeds=[1, 2])
