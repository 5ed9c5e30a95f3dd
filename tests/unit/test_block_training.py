"""tiny-dgemma's recipe: DiffusionGemma's block-diffusion objective trains, saves, loads, decodes and resumes
exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from rich.console import Console

from evals.quality import evaluate_items
from evals.tasks import TASKS, alphabet, make_split
from evals.tasks.mixture import TrainingMixture
from models import load
from models.block_training import block_diffusion_loss, encode_canvases
from models.tokenizer_build import build_char_tokenizer, special_ids
from models.training import RECIPES, objective_for, train
from sampler import SamplerConfig

MICRO = replace(
    RECIPES["tiny-dgemma"],
    model_id="micro-dgemma",
    d_model=32,
    n_layers=1,
    n_heads=2,
    mlp_hidden=64,
    steps=24,
    lr=1e-2,
    warmup=2,
    checkpoint_every=12,
    log_every=6,
    canvas_length=16,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(alphabet())


def source(seed=0):
    return TrainingMixture(TASKS, {"arith": 1.0, "infill": 1.0}, {"arith": 8, "infill": 8}, seed=seed)


def test_canvases_hold_the_response_then_eos(tokenizer):
    ids = special_ids(tokenizer)
    tokens, attention, target, P = encode_canvases(tokenizer, [("ab", "x" * 20), ("abcd", "y")], 16, ids)
    assert tokens.shape == (2, 4 + 32) and P == 4  # 20 letters + EOS need two canvases of 16
    assert attention[0].tolist()[:2] == [0, 0] and tokens[0, 2:4].tolist() == tokenizer.encode("ab").ids
    assert (tokens[1, P + 1 :] == ids["eos_token_id"]).all() and target[1].sum() == 2  # "y" and its EOS


def test_uniform_state_noise_never_uses_a_mask_token_and_self_conditioning_changes_the_loss(tokenizer):
    ids = special_ids(tokenizer)
    model = objective_for(MICRO).build(MICRO, tokenizer)
    tokens, attention, target, P = encode_canvases(tokenizer, [("Fill: 1 ? 3", "2"), ("Fill: 4 ? 6", "5")], 16, ids)
    seen = []
    model.register_forward_pre_hook(lambda m, args, kw: seen.append(kw["decoder_input_ids"].clone()), with_kwargs=True)
    plain = block_diffusion_loss(
        model, tokens, attention, target, P, torch.Generator().manual_seed(1), self_conditioning_p=0.0
    )
    assert len(seen) == 1 and not (seen[0] == ids["mask_token_id"]).all()  # one pass; random tokens, no [MASK]
    seen.clear()
    both = block_diffusion_loss(
        model, tokens, attention, target, P, torch.Generator().manual_seed(1), self_conditioning_p=1.0
    )
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the no-grad pass, then the self-conditioned one
    assert both.item() != pytest.approx(plain.item())


def test_micro_training_lowers_loss_saves_loads_and_decodes(tmp_path, tokenizer):
    _, state = train(MICRO, source(), tokenizer, tmp_path / "out", tmp_path / "state", console=Console(quiet=True))
    losses = [h["loss"] for h in state.history]
    assert state.step == 24 and losses[-1] < 0.8 * losses[0]
    assert {p.suffix for p in (tmp_path / "state").rglob("*") if p.is_file()} <= {".json", ".safetensors"}
    handle = load(tmp_path / "out")  # the layout picks transformers' DiffusionGemma through the adapter
    assert (
        handle.kind == "block-diffusion"
        and handle.canvas_length == 16
        and tuple(handle.eos_ids) == (ids_eos(tokenizer),)
    )
    result = evaluate_items(
        handle,
        make_split(TASKS["arith"], "test", 3),
        SamplerConfig(steps=8, gen_length=32, block_length=32),
        batch_size=2,
    )
    assert result["n"] == 3 and all(isinstance(p["response"], str) for p in result["predictions"])


def ids_eos(tokenizer) -> int:
    return special_ids(tokenizer)["eos_token_id"]


def test_resume_continues_exactly(tmp_path, tokenizer):
    cfg = replace(MICRO, steps=8, checkpoint_every=4)
    straight, _ = train(cfg, source(), tokenizer, tmp_path / "a", tmp_path / "sa", console=Console(quiet=True))
    train(cfg, source(), tokenizer, tmp_path / "b", tmp_path / "sb", stop_after=4, console=Console(quiet=True))
    resumed, state = train(
        cfg, source(), tokenizer, tmp_path / "b", tmp_path / "sb", resume=True, console=Console(quiet=True)
    )
    assert state.step == 8
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
