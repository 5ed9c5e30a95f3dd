"""The masked block sampler's admission estimate (sampler/memory.py) for SDAR and LLaDA2's mixture of experts.

A sparse LLaDA2 layer does not run the dense `intermediate_size` SwiGLU: it holds each token's
`num_experts_per_tok` expert outputs and one expert's (or the shared experts') SwiGLU of `moe_intermediate_size`.
The estimate takes the wider of the dense and the sparse layer, and is held against the peak the CPU allocator
measured (sampler.memory.peak_bytes) on small random checkpoints whose expert width differs clearly from the dense.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from models.adapters.llada2 import LLaDA2Adapter
from models.adapters.sdar import SDARAdapter
from models.llada2 import LLaDA2Config, LLaDA2ForBlockDiffusion
from sampler import SamplerConfig
from sampler.decode import decode_prompts
from sampler.memory import footprint, peak_bytes
from tests.support import REPO

MASK = 63
SMALL = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=32,  # the dense layer's SwiGLU: narrow
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    moe_intermediate_size=16,
    num_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    num_shared_experts=1,
    first_k_dense_replace=1,  # layer 0 dense, layer 1 sparse
    pad_token_id=0,
    eos_token_id=1,
    mask_token_id=MASK,
)
PROMPT = [2 + i % 60 for i in range(256)]


def llada2(**changes: Any) -> LLaDA2Adapter:
    torch.manual_seed(0)
    model = LLaDA2ForBlockDiffusion(LLaDA2Config(**(SMALL | changes)))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return LLaDA2Adapter(model.eval(), defaults={"block_length": 8, "mask_id": MASK})


def config(handle: Any) -> SamplerConfig:
    return SamplerConfig(steps=8, gen_length=8, block_length=8, temperature=0.0).with_(**handle.sampler_ids())


def prompt_activations(**changes: Any) -> int:
    handle = llada2(**changes)
    return footprint(handle, len(PROMPT), config(handle)).terms["encoder_activations"]


def test_sdar_keeps_its_figure():
    """SDAR has no experts: the prompt's activations stay (4 hidden + attention + 3 intermediate) x dtype + logits."""
    handle = SDARAdapter.from_folder(REPO / "tests" / "golden" / "sdar" / "checkpoint")
    cfg, T = handle.model.config, 11
    attention = (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    width = cfg.hidden_size * 4 + attention + cfg.intermediate_size * 3
    found = footprint(handle, T, SamplerConfig(gen_length=32, block_length=32).with_(**handle.sampler_ids()))
    assert found.terms["encoder_activations"] == T * (width * 4 + cfg.vocab_size * 4)


def test_a_sparse_layer_grows_with_the_expert_width_and_the_experts_per_token():
    base = prompt_activations()
    wider = prompt_activations(moe_intermediate_size=512)
    more = prompt_activations(moe_intermediate_size=512, num_experts_per_tok=4)
    assert base < wider < more
    # the dense intermediate size (32) is what the estimate read before: it no longer bounds a sparse layer
    assert wider - base == len(PROMPT) * 3 * (512 - 16) * 4  # one expert's SwiGLU, float32
    assert more - wider == len(PROMPT) * 2 * 64 * (4 + 4)  # two more (hidden,) outputs a token and their weighting


def test_a_wider_dense_layer_still_sets_the_figure():
    handle = llada2(intermediate_size=2048)
    cfg = handle.model.config
    attention = (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    dense = cfg.hidden_size * 4 + attention + 2048 * 3
    found = footprint(handle, len(PROMPT), config(handle)).terms["encoder_activations"]
    assert found == len(PROMPT) * (dense * 4 + cfg.vocab_size * 4)


@pytest.mark.parametrize(
    "changes",
    [
        dict(moe_intermediate_size=512, num_experts_per_tok=4),  # one expert's SwiGLU dominates
        dict(moe_intermediate_size=512, num_shared_experts=4),  # the fused shared experts dominate
        dict(hidden_size=256, head_dim=64, moe_intermediate_size=32, num_experts=16, num_experts_per_tok=8,
             topk_group=4),  # each token's (k, hidden) expert outputs dominate, as in the published models
    ],
    ids=["expert-width", "shared-experts", "experts-per-token"],
)  # fmt: skip
def test_a_sparse_llada2_peak_is_computed_within_20_percent_of_the_measured(changes: dict[str, Any]):
    handle = llada2(**changes)
    with torch.inference_mode():
        real = peak_bytes(lambda: decode_prompts(handle, [PROMPT], config(handle)))[1]
    computed = footprint(handle, len(PROMPT), config(handle)).per_row
    assert 0.8 <= computed / real <= 1.2, (computed, real)
