"""LLaDA2: the native MoE network and the masked block sampler against goldens recorded from LLaDA2's published code.

tests/golden/llada2/ holds a random small LLaDA2-MoE (2 layers, the first dense, 8 experts in 4 groups, top-2, a
shared expert, nonzero expert biases) saved by the reference's own `LLaDA2MoeModelLM.save_pretrained`, the
reference's logits on three inputs and the tokens of its `generate` after `torch.manual_seed`; reference.json
records the repository, commit and file sha256s. bench/parity_llada2.py regenerates them and prints the table.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from models.adapters import folder_layout
from models.adapters.base import AdapterError
from models.adapters.llada2 import LLaDA2Adapter
from sampler import SamplerConfig
from sampler.block_diffusion import BlockDiffusionConfig
from sampler.decode import decode_prompts
from sampler.effective import effective_config
from tests.support import REPO

GOLDEN = REPO / "tests" / "golden" / "llada2"
sys.path.insert(0, str(REPO / "bench"))
from parity_llada2 import L, adapter_for, batch_row, decode_row, native_logits, padded_batch  # noqa: E402

RECORD = json.loads((GOLDEN / "reference.json").read_text())


@pytest.fixture(scope="module")
def adapter() -> LLaDA2Adapter:
    handle: LLaDA2Adapter = adapter_for(L)
    return handle


def test_the_golden_records_its_reference() -> None:
    source = RECORD["source"]
    assert source["commit"] == "e03368da1c19784240006c928e272c18606e149d" and len(source["files"]) == 2
    assert all(len(digest) == 64 for digest in source["files"].values())
    assert folder_layout(json.loads((GOLDEN / "checkpoint" / "config.json").read_text())) == "llada2"


@pytest.mark.parametrize("case", ["full", "cached_block", "left_padded"])
def test_logits_match_the_reference_within_1e_5(adapter: LLaDA2Adapter, case: str) -> None:
    want = load_file(str(GOLDEN / "logits.safetensors"))[case]
    got = native_logits(adapter.model)[case]
    if case == "left_padded":  # the padded row's own pad positions are never read
        real = padded_batch()[2]
        got, want = got[real], want[real]
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("run", [r for r in RECORD["runs"] if not r.get("batch")], ids=lambda r: r["name"])
def test_decoding_is_token_identical_to_the_reference_generate(run: dict[str, Any]) -> None:
    assert decode_row(run, RECORD["prompts"])


def test_a_left_padded_batch_decodes_each_row_as_the_reference_does_alone() -> None:
    assert batch_row(RECORD)["agree"]


def test_routing_follows_the_expert_bias_and_top_k(adapter: LLaDA2Adapter) -> None:
    """The bias steers which experts run (not their weights); a wider top-k mixes more experts."""
    moe = adapter.model.model.layers[1].mlp
    x = torch.randn(6, adapter.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    experts, weights = moe.gate(x)
    assert experts.shape == (6, 2) and torch.allclose(weights.sum(-1), torch.full((6,), 2.5))
    bias = moe.gate.expert_bias.clone()
    try:
        moe.gate.expert_bias.fill_(0.0)
        moe.gate.expert_bias[5] = 10.0  # every token now routes to expert 5
        assert (moe.gate(x)[0] == 5).any(dim=1).all()
    finally:
        moe.gate.expert_bias.copy_(bias)
    ids = torch.tensor([RECORD["prompts"][2]])
    before = adapter.model(ids).logits
    moe.gate.cfg = moe.gate.cfg.__class__(**{**moe.gate.cfg.__dict__, "num_experts_per_tok": 3})
    try:
        assert (adapter.model(ids).logits - before).abs().max() > 1e-3
    finally:
        moe.gate.cfg = adapter.model.config


def test_the_effective_config_carries_the_masked_canvas_and_the_published_defaults(adapter: LLaDA2Adapter) -> None:
    config = SamplerConfig(steps=16, gen_length=16, block_length=8, seed=3).with_(**adapter.sampler_ids())
    block = effective_config(adapter, config)
    assert isinstance(block, BlockDiffusionConfig)
    assert (block.canvas, block.remasking, block.commit_threshold, block.mask_id) == (
        "masked",
        "low_confidence_dynamic",
        0.95,
        299,
    )
    assert (block.max_new_tokens, block.max_denoising_steps, block.seed) == (16, 8, 3)


def test_greedy_decoding_batches_like_solo(adapter: LLaDA2Adapter) -> None:
    prompts = RECORD["prompts"]
    config = BlockDiffusionConfig(
        max_new_tokens=12, max_denoising_steps=4, canvas="masked", remasking="low_confidence_dynamic",
        commit_threshold=0.5, temperature=0.0, mask_id=299, eos_ids=(), pad_id=0, seed=0,
    )  # fmt: skip
    batch = decode_prompts(adapter, prompts, config).generated
    for row, prompt in enumerate(prompts):
        assert batch[row].tolist() == decode_prompts(adapter, [prompt], config).generated[0].tolist(), row


def test_a_published_layout_loads_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    folder = shutil.copytree(GOLDEN / "checkpoint", tmp_path / "llada2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"score_function": "softmax"}))
    with pytest.raises(AdapterError, match="score_function"):
        LLaDA2Adapter.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config | {"n_group": 3}))
    with pytest.raises(AdapterError, match="n_group 3"):
        LLaDA2Adapter.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config | {"num_experts": 4, "n_group": 2}))
    with pytest.raises(AdapterError, match="model.layers.1.mlp.gate.weight' has shape"):
        LLaDA2Adapter.from_folder(folder)


def test_the_memory_footprint_counts_the_cache_of_every_committed_block(adapter: LLaDA2Adapter) -> None:
    from sampler.memory import footprint

    cfg, config = adapter.model.config, SamplerConfig(gen_length=16, block_length=16)
    found = footprint(adapter, 5, config)
    positions = 5 + 2 * L
    assert found.terms["kv_cache"] == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * positions * 4
