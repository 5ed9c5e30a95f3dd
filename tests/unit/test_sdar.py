"""SDAR: the native network and the masked block sampler against goldens recorded from SDAR's published code.

tests/golden/sdar/ holds a random small SDAR saved by the reference's own `SDARForCausalLM.save_pretrained`
(safetensors), the reference's logits on three inputs and the tokens of its `block_diffusion_generate` (JetAstra/SDAR
generate.py) after `torch.manual_seed`; reference.json records the repository, commit and file sha256s.
bench/parity_sdar.py regenerates them (`reference`, in a scratch venv) and prints the parity table (`check`).
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from models.adapters.base import AdapterError
from models.adapters.sdar import SDARAdapter
from sampler import SamplerConfig
from sampler.block_diffusion import BlockDiffusionConfig
from sampler.decode import decode_prompts
from sampler.effective import effective_config
from tests.support import REPO

GOLDEN = REPO / "tests" / "golden" / "sdar"
sys.path.insert(0, str(REPO / "bench"))
from parity_sdar import batch_row, block_config, native_logits  # noqa: E402

RECORD = json.loads((GOLDEN / "reference.json").read_text())


@pytest.fixture(scope="module")
def adapter():
    return SDARAdapter.from_folder(GOLDEN / "checkpoint")


def test_the_golden_records_its_reference():
    source = RECORD["source"]
    assert source["commit"] == "c2041a8333333d685f6e15122c84f60f51f85ebd" and len(source["files"]) == 4
    assert all(len(digest) == 64 for digest in source["files"].values())


@pytest.mark.parametrize("case", ["full", "cached_block", "left_padded"])
def test_logits_match_the_reference_within_1e_5(adapter, case):
    want = load_file(str(GOLDEN / "logits.safetensors"))[case]
    got = native_logits(adapter.model)[case]
    if case == "left_padded":  # the padded row's own pad positions are never read
        real = torch.tensor([[False] * 3 + [True] * 9, [True] * 12])
        got, want = got[real], want[real]
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("run", [r for r in RECORD["runs"] if not r.get("batch")], ids=lambda r: r["name"])
def test_decoding_is_token_identical_to_the_reference_loop(adapter, run):
    kwargs, prompt = run["kwargs"], RECORD["prompts"][run["prompt"]]
    config = block_config(kwargs, run["seed"], tuple(kwargs.get("stopping_criteria_idx") or ()))
    out = decode_prompts(adapter, [prompt], config)
    assert out.generated[0].tolist() == run["tokens"][len(prompt) : len(prompt) + kwargs["gen_length"]]


def test_a_left_padded_batch_decodes_each_row_as_the_reference_does_alone(adapter):
    assert batch_row(adapter, RECORD)["agree"]


def test_the_effective_config_carries_the_masked_canvas_and_the_catalog_defaults(adapter):
    config = SamplerConfig(steps=8, gen_length=8, block_length=4, seed=3).with_(**adapter.sampler_ids())
    block = effective_config(adapter, config)
    assert isinstance(block, BlockDiffusionConfig)
    assert (block.canvas, block.remasking, block.commit_threshold, block.mask_id) == (
        "masked",
        "low_confidence_dynamic",
        0.9,
        259,
    )
    assert (block.max_new_tokens, block.max_denoising_steps, block.seed) == (8, 4, 3)
    assert block.to_dict()["canvas"] == "masked" and BlockDiffusionConfig().hash() != block.hash()


def test_uniform_canvas_configs_keep_their_fields_and_refuse_masked_settings():
    before = {"max_new_tokens", "max_denoising_steps", "entropy_bound", "t_min", "t_max", "stability_threshold"}
    before |= {"confidence_threshold", "eos_ids", "pad_id", "seed"}
    assert set(BlockDiffusionConfig().to_dict()) == before  # hashes recorded before the masked canvas still hold
    with pytest.raises(ValueError, match="remasking is read by the masked canvas only"):
        BlockDiffusionConfig(remasking="sequential")
    with pytest.raises(ValueError, match="remasking='entropy_bounded'; known"):
        BlockDiffusionConfig(canvas="masked", remasking="entropy_bounded", mask_id=3)


def test_greedy_decoding_draws_nothing_and_batches_like_solo(adapter):
    prompts = RECORD["prompts"]
    config = block_config(RECORD["runs"][0]["kwargs"] | {"temperature": 0.0}, 0)
    batch = decode_prompts(adapter, prompts, config).generated
    for row, prompt in enumerate(prompts):
        alone = decode_prompts(adapter, [prompt], config.__class__(**{**config.to_dict(), "seed": 9})).generated
        assert batch[row].tolist() == alone[0].tolist(), row


def test_a_published_layout_loads_and_a_wrong_one_is_refused(tmp_path):
    folder = shutil.copytree(GOLDEN / "checkpoint", tmp_path / "sdar")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    with pytest.raises(AdapterError, match="rope_scaling"):
        SDARAdapter.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(AdapterError, match="model.layers.2.*missing"):
        SDARAdapter.from_folder(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(AdapterError, match="only pickle weights"):
        SDARAdapter.from_folder(folder)


def test_the_memory_footprint_counts_the_cache_of_every_committed_block(adapter):
    """The serving admission's estimate of one row (sampler/memory.py): the KV cache of the prompt and of every block
    the generation commits, by hand from the config's shapes."""
    from sampler.memory import footprint

    cfg, config = adapter.model.config, SamplerConfig(gen_length=32, block_length=32)
    found = footprint(adapter, 8, config)
    blocks = -(-effective_config(adapter, config).max_new_tokens // cfg.block_size)
    positions = 8 + blocks * cfg.block_size
    assert found.terms["kv_cache"] == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * positions * 4
    assert found.per_row == found.terms["kv_cache"] + max(
        found.terms["canvas_x_vocab"], found.terms["encoder_activations"]
    )
