"""Nemotron-Labs-Diffusion: the native network against goldens from transformers' Ministral 3, and the three modes.

tests/golden/nemotron/ holds a random small Ministral 3 (YaRN over an original context of 8, Llama 4 query scaling)
written in the published layout (`encoder.`, `diffusion_head`) with the char tokenizer, the reference's logits on six
inputs (causal and bidirectional; full, after a cached prefix, left-padded) and its greedy `generate` per prompt;
reference.json records transformers' version and file sha256. bench/parity_nemotron.py regenerates them
(`reference`) and prints the parity table (`check`). The published remote modeling file was not reachable: the
backbone it subclasses is the reference.
"""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

import models
from models.adapters import folder_layout
from models.adapters.base import AdapterError
from models.adapters.nemotron import NemotronAdapter
from sampler import SamplerConfig
from sampler.block_diffusion import BlockDiffusionConfig
from sampler.decode import decode_prompts
from sampler.effective import effective_config
from tests.support import REPO

GOLDEN = REPO / "tests" / "golden" / "nemotron"
sys.path.insert(0, str(REPO / "bench"))
from parity_nemotron import PROMPTS, decode_config, native_logits, padded_batch  # noqa: E402

RECORD = json.loads((GOLDEN / "reference.json").read_text())
GREEDY = [run["generated"] for run in RECORD["greedy"]]


@pytest.fixture(scope="module")
def adapter() -> NemotronAdapter:
    return NemotronAdapter.from_folder(GOLDEN / "checkpoint")


@pytest.fixture(scope="module")
def logits(adapter: NemotronAdapter) -> dict[str, torch.Tensor]:
    return native_logits(adapter.model)


def test_the_golden_records_its_reference() -> None:
    source = RECORD["source"]
    assert source["transformers"] == "5.25.0" and all(len(d) == 64 for d in source["files"].values())
    assert source["cross_checked"]["decoding_file"]["commit"] == "4476e1dabd5368653e1761b6e92a2fce9104ccb7"
    assert folder_layout(json.loads((GOLDEN / "checkpoint" / "config.json").read_text())) == "nemotron"


@pytest.mark.parametrize(
    "case",
    [
        "causal",
        "bidirectional",
        "cached_block_causal",
        "cached_block_bidirectional",
        "left_padded_causal",
        "left_padded_bidirectional",
    ],
)
def test_logits_match_the_reference_within_1e_5(logits: dict[str, torch.Tensor], case: str) -> None:
    want, got = load_file(str(GOLDEN / "logits.safetensors"))[case], logits[case]
    if case.startswith("left_padded"):  # the padded row's own pad positions are never read
        real = padded_batch()[2]
        got, want = got[real], want[real]
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("mode", ["autoregressive", "self_speculative"])
def test_greedy_modes_are_token_identical_to_the_references_generate(adapter: NemotronAdapter, mode: str) -> None:
    """Self-speculation is lossless: solo and as one left-padded batch, it decodes transformers' greedy tokens."""
    for prompt, want in zip(PROMPTS, GREEDY):
        assert decode_prompts(adapter, [prompt], decode_config(mode)).generated[0].tolist() == want
    assert decode_prompts(adapter, PROMPTS, decode_config(mode)).generated.tolist() == GREEDY


def test_self_speculation_takes_two_forwards_a_block_and_stops_at_eos(adapter: NemotronAdapter) -> None:
    stop = GREEDY[0][6]  # a token greedy decoding emits mid-way, taken as the EOS
    cut = GREEDY[0].index(stop)
    want = GREEDY[0][: cut + 1] + [0] * (len(GREEDY[0]) - cut - 1)
    for mode in ("autoregressive", "self_speculative"):
        out = decode_prompts(adapter, [PROMPTS[0]], decode_config(mode, eos_ids=(stop,)))
        assert out.generated[0].tolist() == want, mode
    spec = decode_prompts(adapter, [PROMPTS[0]], decode_config("self_speculative"))
    assert spec.nfe == 1 + 2 * len(spec.block_nfe) and set(spec.block_nfe) == {2}
    ar = decode_prompts(adapter, [PROMPTS[0]], decode_config("autoregressive"))
    assert ar.nfe == len(GREEDY[0])  # the prompt's pass, then one a token but the last


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_block_diffusion_decodes_each_row_of_a_batch_as_alone(adapter: NemotronAdapter, temperature: float) -> None:
    config = decode_config("diffusion", temperature=temperature, seed=5)
    seeds = [3, 1, 4, 5]
    batch = decode_prompts(adapter, PROMPTS, config, row_seeds=seeds if temperature else None)
    for row, prompt in enumerate(PROMPTS):
        alone = decode_prompts(adapter, [prompt], config, row_seeds=[seeds[row]] if temperature else None)
        assert batch.generated[row].tolist() == alone.generated[0].tolist(), row
    assert batch.block_diffusion is not None and batch.block_diffusion.canvas_length == 4


def test_the_effective_config_records_the_mode(adapter: NemotronAdapter) -> None:
    config = SamplerConfig(steps=8, gen_length=8, block_length=4, seed=3).with_(**adapter.sampler_ids())
    block = effective_config(adapter, config)
    assert isinstance(block, BlockDiffusionConfig)
    assert (block.canvas, block.mode, block.temperature, block.mask_id) == ("seeded", "self_speculative", 0.0, 3)
    diffusion = effective_config(NemotronAdapter(adapter.model, defaults={"mode": "diffusion"}), config)
    assert isinstance(diffusion, BlockDiffusionConfig) and "mode" not in diffusion.to_dict()
    assert block.to_dict()["mode"] == "self_speculative" and block.hash() != diffusion.hash()
    with pytest.raises(ValueError, match="mode='self_speculative' is lossless for greedy decoding only"):
        decode_config("self_speculative", temperature=0.5)
    with pytest.raises(ValueError, match="mode='autoregressive' is read by the seeded canvas only"):
        BlockDiffusionConfig(canvas="masked", mask_id=3, mode="autoregressive")


def test_models_load_picks_the_adapter_from_the_folder() -> None:
    handle = models.load(GOLDEN / "checkpoint")
    assert isinstance(handle, NemotronAdapter) and handle.kind == "block-diffusion"
    assert handle.encode("hi") and handle.eos_ids == (1,) and handle.canvas_length == 4


def test_a_published_layout_loads_and_a_wrong_one_is_refused(tmp_path) -> None:
    folder = shutil.copytree(GOLDEN / "checkpoint", tmp_path / "nemotron")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "rope_parameters"}))
    with pytest.raises(AdapterError, match=r"config.json: required key 'rope_parameters' is missing"):
        NemotronAdapter.from_folder(folder)
    rope = config["rope_parameters"] | {"rope_type": "longrope"}
    (folder / "config.json").write_text(json.dumps(config | {"rope_parameters": rope}))
    with pytest.raises(AdapterError, match="rope_type'='longrope'"):
        NemotronAdapter.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(AdapterError, match=r"encoder\.layers\.2.*missing"):
        NemotronAdapter.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config | {"unknown_key": 1}))
    NemotronAdapter.from_folder(folder)  # unknown keys are ignored
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(AdapterError, match="only pickle weights"):
        NemotronAdapter.from_folder(folder)


class GreedyDrafts(NemotronAdapter):
    """The checkpoint with a diffusion pass that drafts autoregressive greedy's own tokens (the golden), wrong at every
    third generated position: a random network's drafts almost never match, so this is how a test makes the verify
    pass accept several drafts, reject one mid-block and go on from a cache whose rejected slots must be dropped."""

    def __init__(self, model, prompts: list[list[int]], **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.prompts = prompts

    def denoise(self, canvas, self_conditioning, cache, attention_mask, position_ids):
        logits = super().denoise(canvas, self_conditioning, cache, attention_mask, position_ids)
        drafted = torch.full_like(logits, -30.0)
        for row, prompt in enumerate(self.prompts):
            for j, position in enumerate(position_ids[row].tolist()):
                g = position - len(prompt)  # the generated token this position holds
                right = GREEDY[PROMPTS.index(prompt)][g] if g < len(GREEDY[0]) else 0
                drafted[row, j, right if g % 3 != 2 else (right + 1) % logits.shape[-1]] = 30.0
        return drafted


def test_self_speculation_stays_lossless_when_drafts_are_accepted_and_rejected_mid_block(adapter) -> None:
    config = decode_config("self_speculative")
    for prompt, want in zip(PROMPTS, GREEDY):
        out = decode_prompts(GreedyDrafts(adapter.model, [prompt]), [prompt], config)
        assert out.generated[0].tolist() == want
        assert len(out.block_nfe) < len(want) - 4  # drafts were kept: fewer blocks than tokens
    batch = decode_prompts(GreedyDrafts(adapter.model, PROMPTS), PROMPTS, config)
    assert batch.generated.tolist() == GREEDY
