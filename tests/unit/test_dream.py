"""Dream (issue 52): the native model and sampler against golden outputs of Dream's published code.

tests/golden/dream holds what Dream's own modeling_dream.py and generation_utils.py (the Hub files; the
repository, commit and sha256 of each are in reference.json) computed on the bundled random checkpoint
models/weights/tiny-dream, under transformers 4.46.2: raw logits of an unpadded and a left-padded batch, and the
token ids of `diffusion_generate` at temperature 0 for every deterministic algorithm, and of `origin` (which draws)
after torch.manual_seed at temperatures 0 and 0.8, alone and batched (bench/parity_dream.py regenerates them). The
native code must give the logits to 1e-5 and the tokens exactly.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import models
from models.adapters import AdapterError, DreamAdapter, folder_layout
from models.adapters.dream import ALGORITHMS, SAMPLED, dream_settings
from sampler import SamplerConfig, generate
from sampler.decode import decode_prompts
from tests.support import REPO

GOLDEN = REPO / "tests" / "golden" / "dream"
CHECKPOINT = REPO / "models" / "weights" / "tiny-dream"
RECORD = json.loads((GOLDEN / "reference.json").read_text())


@pytest.fixture(scope="module")
def dream() -> DreamAdapter:
    handle = models.load("tiny-dream")
    assert isinstance(handle, DreamAdapter)
    return handle


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = torch.tensor(p), 1
    return ids, mask


def test_the_golden_outputs_record_the_reference_they_came_from():
    ref = RECORD["reference"]
    assert ref["commit"] and len(ref["commit"]) == 40 and ref["repository"].startswith("https://github.com/")
    assert set(ref["sha256"]) == {"modeling_dream.py", "configuration_dream.py", "generation_utils.py"}
    digest = hashlib.sha256((CHECKPOINT / "model.safetensors").read_bytes()).hexdigest()
    assert RECORD["checkpoint_sha256"]["model.safetensors"] == digest


def test_raw_logits_match_the_reference_with_and_without_padding(dream):
    stored = load_file(str(GOLDEN / "logits.safetensors"))
    with torch.no_grad():
        plain = dream.model.network(stored["plain_ids"]).logits
        padded = dream.model.network(stored["padded_ids"], stored["padded_mask"]).logits
    assert (plain - stored["plain"]).abs().max() <= 1e-5
    assert (padded - stored["padded"]).abs().max() <= 1e-5


def test_the_denoiser_scores_each_position_with_the_logits_dream_computes_one_place_before(dream):
    ids = torch.tensor([[40, 41, 3, 3, 3]])
    raw = dream.model.network(ids).logits
    aligned = dream.model(ids).logits
    assert torch.equal(aligned[:, 1:], raw[:, :-1]) and torch.equal(aligned[:, 0], raw[:, 0])


def decode_case(dream: DreamAdapter, case: dict) -> list[list[int]]:
    """The native decode of a golden case: its algorithm's settings, its temperature and seed where it draws."""
    ids, mask = left_padded(case["prompts"], dream.pad_id or 0)
    settings = dream_settings(case["alg"], case["gen_length"], case["steps"], case["top_k"], case.get("temperature", 0))
    config = SamplerConfig(**settings, **dream.sampler_ids(), seed=case.get("seed", 0))
    out = generate(dream.model, ids, config, attention_mask=mask if len(case["prompts"]) > 1 else None)
    return out.sequences.tolist()


@pytest.mark.parametrize("alg", [a for a in ALGORITHMS if a not in SAMPLED])
def test_the_sampler_decodes_the_tokens_dreams_generate_decodes(dream, alg):
    cases = [c for c in RECORD["decodes"] if c["alg"] == alg]
    assert len(cases) == 16  # 2 top-k x 2 lengths x (3 prompts alone + 1 left-padded batch)
    for case in cases:
        assert decode_case(dream, case) == case["sequences"], case


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_seeded_origin_decodes_the_tokens_dreams_generate_draws_after_the_same_manual_seed(dream, temperature):
    # origin reveals each mask with probability 1 - s/t: positions drawn at any temperature, tokens above 0; the
    # batch draws one stream over its rows' masks, as Dream's does
    cases = [c for c in RECORD["decodes"] if c["alg"] == "origin" and c["temperature"] == temperature]
    assert len(cases) == 16 and all(isinstance(c["seed"], int) for c in cases)
    for case in cases:
        assert decode_case(dream, case) == case["sequences"], case


def test_a_sampled_algorithm_is_refused_where_the_sampler_does_not_draw_as_dream_does():
    assert dream_settings("origin", 16, 8, temperature=0.8)["parallel"] == "ancestral"
    with pytest.raises(ValueError, match="'entropy' at temperature 0.8"):
        dream_settings("entropy", 16, 8, temperature=0.8)


@pytest.mark.parametrize("alg,temperature", [("entropy", 0.0), ("origin", 0.8)])
def test_a_batched_row_decodes_as_it_does_alone(dream, alg, temperature):
    config = SamplerConfig(**dream_settings(alg, 16, 8, 50, temperature), **dream.sampler_ids())
    prompts = [dream.encode(p) for p in ("Tom has 4 pens.", "12", "A box has 9 coins.")]
    seeds = [3, 11, 7]  # origin draws: each row from its own seed, as it would alone
    together = decode_prompts(dream, prompts, config, row_seeds=seeds if config.draws else None)
    alone = [decode_prompts(dream, [p], config.with_(seed=s)) for p, s in zip(prompts, seeds)]
    assert [row.tolist() for row in together.generated] == [a.generated[0].tolist() for a in alone]


def test_cached_decoding_is_refused_with_the_reason(dream):
    config = SamplerConfig(**dream_settings("maskgit_plus", 16, 8), **dream.sampler_ids()).with_(
        block_length=8, cache="prefix"
    )
    with pytest.raises(ValueError, match="cache='none'"):
        generate(dream.model, torch.tensor([[40, 41, 42]]), config)


def test_the_published_layout_is_recognised_and_a_config_it_cannot_compute_is_refused(tmp_path):
    assert folder_layout({"model_type": "Dream"}) == "dream"
    folder = tmp_path / "dream"
    shutil.copytree(CHECKPOINT, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"use_sliding_window": True}))
    with pytest.raises(AdapterError, match="use_sliding_window"):
        DreamAdapter.from_folder(folder)
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(AdapterError, match=r"model.layers.2.* missing"):
        DreamAdapter.from_folder(folder)
