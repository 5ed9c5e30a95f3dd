"""DiffusionGemma block diffusion: unmask's sampler reproduces transformers' generate() token for token.

A tiny random DiffusionGemma (2 layers, 4 experts, vocabulary 128, canvas 8) with a tiny vision
tower (tests/support/eval_fixtures.py) is built; both decoders run from the same seed, so they see the same random
draws in the same order (initial canvas; per step: sample, re-noise).
"""

from __future__ import annotations

import pytest
import torch
import transformers

from models.adapters.base import AdapterError
from models.adapters.diffusion_gemma import DiffusionGemmaAdapter
from sampler import SamplerConfig
from sampler.block_diffusion import BlockDiffusionConfig, generate_block_diffusion
from sampler.decode import decode
from sampler.effective import block_config_for
from tests.support.eval_fixtures import tiny_diffusion_gemma_config as tiny_config

PROMPTS = torch.tensor([[2, 5, 6, 7, 8], [2, 9, 10, 11, 12], [2, 30, 31, 32, 33], [2, 40, 41, 42, 43]])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return transformers.DiffusionGemmaForBlockDiffusion(tiny_config()).eval()


# (transformers generate() kwargs, the same settings for unmask's BlockDiffusionConfig)
CASES = {
    "three-canvases": (dict(max_new_tokens=24, max_denoising_steps=6), dict()),
    "eos-and-pad": (
        dict(max_new_tokens=24, max_denoising_steps=6, eos_token_id=23, pad_token_id=0),
        dict(eos_ids=(23,), pad_id=0),
    ),
    "rows-stop-at-different-steps": (
        dict(max_new_tokens=16, max_denoising_steps=8, stability_threshold=0, confidence_threshold=4.83),
        dict(stability_threshold=0, confidence_threshold=4.83),
    ),
    "stable-and-confident": (
        dict(
            max_new_tokens=16,
            max_denoising_steps=8,
            stability_threshold=0,
            confidence_threshold=100.0,
            eos_token_id=[23, 97],
            pad_token_id=0,
        ),
        dict(stability_threshold=0, confidence_threshold=100.0, eos_ids=(23, 97), pad_id=0),
    ),
    "wide-entropy-bound": (dict(max_new_tokens=16, max_denoising_steps=4, entropy_bound=3.0), dict(entropy_bound=3.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_diffusion_matches_transformers_generate(model, case):
    hf_kwargs, ours = CASES[case]
    seed = 11
    torch.manual_seed(seed)
    reference = model.generate(PROMPTS, **hf_kwargs)
    config = BlockDiffusionConfig(
        max_new_tokens=hf_kwargs["max_new_tokens"],
        max_denoising_steps=hf_kwargs["max_denoising_steps"],
        seed=seed,
        **ours,
    )
    out = generate_block_diffusion(DiffusionGemmaAdapter(model), PROMPTS, config)
    assert torch.equal(out.sequences, reference.sequences)
    assert out.block_diffusion.row_tokens_per_forward == reference.tokens_per_forward.tolist()
    assert out.prompt_length == PROMPTS.shape[1] and out.nfe >= max(out.block_diffusion.decoder_forwards)


def test_rows_that_stop_early_are_counted_apart(model):
    _, ours = CASES["rows-stop-at-different-steps"]
    out = generate_block_diffusion(
        DiffusionGemmaAdapter(model),
        PROMPTS,
        BlockDiffusionConfig(max_new_tokens=16, max_denoising_steps=8, seed=11, **ours),
    )
    forwards = out.block_diffusion.decoder_forwards
    assert len(set(forwards)) > 1  # the case really exercises per-row early stopping
    assert all(f < 16 for f in forwards)
    assert out.block_diffusion.row_tokens_per_forward == pytest.approx([16 / f for f in forwards])


def test_left_padded_batch_matches(model):
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    torch.manual_seed(5)
    reference = model.generate(PROMPTS, attention_mask=mask, max_new_tokens=16, max_denoising_steps=4)
    out = generate_block_diffusion(
        DiffusionGemmaAdapter(model),
        PROMPTS,
        BlockDiffusionConfig(max_new_tokens=16, max_denoising_steps=4, seed=5),
        attention_mask=mask,
    )
    assert torch.equal(out.sequences, reference.sequences)


def test_adapter_loads_safetensors_and_decodes_from_a_sampler_config(model, tmp_path):
    model.save_pretrained(tmp_path / "dg")
    assert list((tmp_path / "dg").glob("*.safetensors"))
    adapter = DiffusionGemmaAdapter.from_folder(
        tmp_path / "dg", dtype=torch.float32, defaults={"entropy_bound": 0.5, "t_min": 0.4, "t_max": 0.8}
    )
    config = SamplerConfig(steps=12, gen_length=16, block_length=16, seed=3)
    block = block_config_for(adapter, config)
    assert (block.max_new_tokens, block.max_denoising_steps, block.entropy_bound, block.seed) == (16, 6, 0.5, 3)
    first, again = decode(adapter, PROMPTS[:2], config), decode(adapter, PROMPTS[:2], config)
    assert torch.equal(first.sequences, again.sequences)  # seeded: reproducible
    assert first.sequences.shape == (2, 5 + 16) and first.block_diffusion.canvases == 2
    other = decode(adapter, PROMPTS[:2], config.with_(seed=4))
    assert not torch.equal(first.sequences, other.sequences)


def test_the_adapter_encodes_text_as_the_adapter_protocol_says(model, tmp_path):
    """The block loop's cache call is `encode_prefix`, so `encode(text)` stays the text codec."""
    from models.tokenizer_build import build_char_tokenizer

    tokenizer = build_char_tokenizer("")
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    adapter = DiffusionGemmaAdapter(model, tokenizer, path=tmp_path)
    assert adapter.encode("Sort: cab") == tokenizer.encode("Sort: cab", add_special_tokens=False).ids
    assert adapter.decode(adapter.encode("Sort: cab")) == "Sort: cab"
    with pytest.raises(AdapterError, match="no tokenizer.json"):
        DiffusionGemmaAdapter(model, path=tmp_path).encode("x")


def test_pickle_only_or_wrong_folder_is_refused(model, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    model.config.save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(AdapterError, match="only pickle weights"):
        DiffusionGemmaAdapter.from_folder(folder)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(AdapterError, match="expected 'diffusion_gemma'"):
        DiffusionGemmaAdapter.from_folder(folder)


def test_config_rejects_impossible_settings():
    with pytest.raises(ValueError, match="max_denoising_steps"):
        BlockDiffusionConfig(max_denoising_steps=0)
    with pytest.raises(ValueError, match="t_min < t_max"):
        BlockDiffusionConfig(t_min=0.9, t_max=0.8)
    assert BlockDiffusionConfig().hash() == BlockDiffusionConfig().hash() != BlockDiffusionConfig(seed=1).hash()


def test_with_row_seeds_each_row_of_a_left_padded_batch_decodes_as_it_does_alone(model):
    """What serving's dynamic batching relies on: one generator per row, positions from each row's first token."""
    from sampler.decode import decode_prompts

    adapter = DiffusionGemmaAdapter(model)
    adapter.eos_ids, adapter.pad_id = (23,), 0
    prompts = [[2, 5, 6, 7, 8, 9, 10], [2, 9], [2, 30, 31, 32], [2, 40, 41, 42, 43, 44]]
    config = SamplerConfig(steps=12, gen_length=24, block_length=8, seed=0)
    seeds = [3, 1, 4, 1]
    batch = decode_prompts(adapter, prompts, config, row_seeds=seeds).generated
    for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
        alone = decode_prompts(adapter, [prompt], config.with_(seed=seed)).generated[0]
        assert torch.equal(batch[row, : len(alone)], alone), row
        assert (batch[row, len(alone) :] == 0).all()  # a row that ended early holds padding while the batch goes on
    assert len({tuple(r.tolist()) for r in batch}) == 4
