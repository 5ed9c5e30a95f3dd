"""The ONNX Runtime backend: exported with dynamic batch and sequence axes, same tokens as torch."""

from __future__ import annotations

import pytest
import torch

from sampler import SamplerConfig, generate
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def test_backend_needs_a_native_torch_module():
    with pytest.raises(ValueError, match="backend='onnxruntime' needs a native LLaDA torch module"):
        generate(
            lambda x, attention_mask=None: None,
            torch.tensor([[1, 2]]),
            SamplerConfig(steps=8, gen_length=8, block_length=8, backend="onnxruntime", **IDS),
        )


def test_exported_graphs_match_torch_at_any_batch_and_length(model):
    from sampler.onnx_backend import onnx_denoiser

    ort_model = onnx_denoiser(model)
    assert ort_model.provider in ("CPUExecutionProvider", "CUDAExecutionProvider")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for B, T in [(1, 1), (1, 9), (3, 4), (4, 33)]:
            x = torch.randint(0, 44, (B, T), generator=g)
            mask = torch.ones(B, T, dtype=torch.long)
            mask[0, : T // 3] = 0
            assert torch.allclose(
                ort_model(x, attention_mask=mask).logits, model(x, attention_mask=mask).logits, atol=1e-4
            )
        full = model(torch.randint(0, 44, (2, 20), generator=g), use_cache=True)
        past = [(k[:, :, :12], v[:, :, :12]) for k, v in full.past_key_values]
        x, keys = torch.randint(0, 44, (2, 5), generator=g), torch.ones(2, 17, dtype=torch.long)
        positions = torch.arange(12, 17).expand(2, 5)
        expected = model(x, attention_mask=keys, position_ids=positions, past_key_values=past).logits
        got = ort_model(x, attention_mask=keys, position_ids=positions, past_key_values=past).logits
        assert torch.allclose(got, expected, atol=1e-4)


GRID = [
    ({}, 1),
    ({}, 3),
    ({"cfg_scale": 1.0}, 3),
    ({"cache": "dual"}, 3),
    ({"cache": "prefix", "cache_refresh": 2}, 1),
    ({"parallel": "threshold", "parallel_threshold": 0.5}, 3),
    (
        {
            "cache": "dual",
            "parallel": "factor",
            "parallel_factor": 2.0,
            "speculative_draft": 3,
            "early_exit": "eos_decided",
        },
        3,
    ),
]


@pytest.mark.parametrize("mode,batch", GRID)
def test_onnxruntime_tokens_equal_torch_tokens(model, mode, batch):
    ids, mask = left_padded_prompts([5, 3, 7][:batch], seed=batch)
    mask = mask if batch > 1 else None
    cfg = SamplerConfig(steps=16, gen_length=16, block_length=8, **IDS, **mode)
    torch_out = generate(model, ids, cfg, attention_mask=mask)
    ort_out = generate(model, ids, cfg.with_(backend="onnxruntime"), attention_mask=mask)
    assert torch.equal(ort_out.sequences, torch_out.sequences)
    assert ort_out.provider in ("CPUExecutionProvider", "CUDAExecutionProvider")
    assert ort_out.nfe == torch_out.nfe
