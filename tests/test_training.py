"""Micro-training: the loss falls, the checkpoint loads and decodes, training resumes exactly."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from rich.console import Console

from evals.quality import evaluate_items
from evals.tasks import TASKS, alphabet, make_split
from evals.tasks.mixture import TrainingMixture
from models.checkpoint import load_checkpoint
from models.tokenizer_build import build_char_tokenizer, special_ids
from models.training import Batch, TrainConfig, diffusion_loss, encode_diffusion, train
from sampler import SamplerConfig

MICRO = TrainConfig(d_model=32, n_layers=1, n_heads=2, mlp_hidden=64, steps=30, lr=1e-2, warmup=5,
                    checkpoint_every=15, log_every=5)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer(alphabet())


def source(seed=0):
    return TrainingMixture(TASKS, {"arith": 1.0, "infill": 1.0}, {"arith": 8, "infill": 8}, seed=seed)


def quiet():
    return Console(quiet=True)


@pytest.mark.parametrize("causal", [False, True], ids=["diffusion", "autoregressive"])
def test_micro_training_lowers_loss_and_saves_a_loadable_model(tmp_path, tokenizer, causal):
    cfg = replace(MICRO, causal=causal, model_id="micro")
    _, state = train(cfg, source(), tokenizer, tmp_path / "out", tmp_path / "state", console=quiet())
    losses = [h["loss"] for h in state.history]
    assert state.step == 30 and losses[-1] < 0.7 * losses[0]
    loaded = load_checkpoint(tmp_path / "out")
    assert loaded.causal is causal and loaded.mask_id == tokenizer.token_to_id("<|mdm_mask|>")
    assert loaded.eot_id == tokenizer.token_to_id("<|eot_id|>") and loaded.pad_id == tokenizer.token_to_id("<|pad|>")
    items = make_split(TASKS["arith"], "test", 4)
    result = evaluate_items(loaded, items, SamplerConfig(steps=32, gen_length=32, block_length=32), batch_size=3)
    assert result["n"] == 4 and set(result["accuracy"]) == {"strict-match", "flexible-extract"}
    assert all(isinstance(p["response"], str) for p in result["predictions"])
    files = {p.suffix for p in (tmp_path / "state").rglob("*") if p.is_file()}
    assert files <= {".json", ".safetensors"}  # no pickle anywhere


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, tokenizer):
    cfg = replace(MICRO, steps=20, checkpoint_every=10)
    straight, _ = train(cfg, source(), tokenizer, tmp_path / "a", tmp_path / "sa", console=quiet())
    train(cfg, source(), tokenizer, tmp_path / "b", tmp_path / "sb", stop_after=10, console=quiet())
    resumed, state = train(cfg, source(), tokenizer, tmp_path / "b", tmp_path / "sb", resume=True, console=quiet())
    assert state.step == 20
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    meta = json.loads((tmp_path / "b" / "config.json").read_text())
    assert meta["unmask_training"]["steps"] == 20


def test_diffusion_loss_masks_only_the_response(tokenizer):
    ids = special_ids(tokenizer)
    batch = Batch("arith", 32, [("Tom has 3 pens", "3+1=4\n#### 4"), ("A box", "1+1=2\n#### 2")])
    tokens, attention, response = encode_diffusion(tokenizer, batch, 32, ids)
    assert tokens.shape == (2, 14 + 32) and attention[1, :9].sum() == 0  # "A box" is left-padded
    assert (tokens[0, 14 + 12 :] == ids["eos_token_id"]).all()  # EOS padding is part of the target
    seen = []

    class Spy(torch.nn.Module):
        def forward(self, x, attention_mask=None):
            seen.append(x.clone())
            return type("Out", (), {"logits": torch.zeros(*x.shape, tokenizer.get_vocab_size(), requires_grad=True)})()

    diffusion_loss(Spy(), tokens, attention, response, ids["mask_token_id"], torch.Generator().manual_seed(0))
    masked = seen[0] == ids["mask_token_id"]
    assert not masked[:, :14].any() and masked[:, 14:].any()
