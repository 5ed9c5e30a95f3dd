"""Speculative decoding is lossless: the same tokens as the one-call-per-step loop, fewer
sequential model calls when drafts are right."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sampler import SamplerConfig, generate
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, VOCAB, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


CASES = [
    # (draft, mode, batch, cfg_scale)
    (2, {}, 1, 0.0),
    (4, {}, 3, 0.0),
    (6, {}, 3, 1.0),
    (4, {"parallel": "threshold", "parallel_threshold": 0.5}, 3, 0.0),
    (3, {"parallel": "factor", "parallel_factor": 2.0}, 1, 0.0),
    (4, {"parallel": "entropy", "entropy_bound": 4.0}, 3, 0.0),
    (4, {"cache": "prefix"}, 3, 0.0),
    (4, {"cache": "dual"}, 1, 1.0),
    (3, {"cache": "dual", "cache_refresh": 3}, 3, 0.0),
    (4, {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.5}, 3, 0.0),
    (4, {"early_exit": "eos_decided"}, 3, 0.0),
    (4, {"confidence_eos_eot_inf": True, "logits_eos_inf": True}, 3, 0.0),
]


@pytest.mark.parametrize("draft,mode,batch,cfg_scale", CASES)
@pytest.mark.parametrize("shape", [(32, 32, 8), (16, 32, 16)])
def test_speculative_tokens_equal_the_step_by_step_tokens(model, draft, mode, batch, cfg_scale, shape):
    steps, gen_length, block_length = shape
    ids, mask = left_padded_prompts([5, 3, 7][:batch], seed=batch)
    mask = mask if batch > 1 else None
    base = SamplerConfig(
        steps=steps, gen_length=gen_length, block_length=block_length, cfg_scale=cfg_scale, **IDS, **mode
    )
    plain = generate(model, ids, base, attention_mask=mask)
    fast = generate(model, ids, base.with_(speculative_draft=draft), attention_mask=mask)
    assert torch.equal(fast.sequences, plain.sequences)
    assert fast.sequential_calls <= plain.sequential_calls
    assert 0.0 <= fast.speculative.acceptance_rate <= 1.0
    assert fast.speculative.accepted_steps <= fast.speculative.drafted_steps


class FrozenPredictions:
    """A denoiser whose logits depend on position only, so every drafted step is right."""

    def __init__(self, length: int = 64):
        self.table = torch.randn(length, VOCAB, generator=torch.Generator().manual_seed(0)) * 3
        self.calls = []

    def __call__(self, x, attention_mask=None):
        self.calls.append(x.shape[0])
        return SimpleNamespace(logits=self.table[: x.shape[1]].expand(x.shape[0], -1, -1).clone())


def test_right_drafts_are_all_accepted_and_cut_sequential_calls():
    ids = torch.tensor([[1, 2, 3, 4]])
    base = SamplerConfig(steps=32, gen_length=32, block_length=8, **IDS)
    plain_model, spec_model = FrozenPredictions(), FrozenPredictions()
    plain = generate(plain_model, ids, base)
    fast = generate(spec_model, ids, base.with_(speculative_draft=4))
    assert torch.equal(fast.sequences, plain.sequences)
    assert fast.speculative.acceptance_rate == 1.0
    assert len(spec_model.calls) == fast.sequential_calls <= 32 // 3
    assert plain.sequential_calls == 32 and plain.speculative is None
    assert max(spec_model.calls) <= 4  # at most one canvas per drafted step in a verify call
