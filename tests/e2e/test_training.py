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
from models import load
from models.checkpoint import load_checkpoint
from models.tokenizer_build import build_char_tokenizer, special_ids
from models.training import (
    RECIPES,
    Batch,
    TrainConfig,
    diffusion_loss,
    encode_diffusion,
    learning_rate,
    resolve_device,
    train,
)
from sampler import SamplerConfig

MICRO = TrainConfig(
    d_model=32, n_layers=1, n_heads=2, mlp_hidden=64, steps=30, lr=1e-2, warmup=5, checkpoint_every=15, log_every=5
)


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
    loaded = load(tmp_path / "out")  # the model handle evaluation reads
    assert loaded.causal is causal and loaded.mask_id == tokenizer.token_to_id("<|mdm_mask|>")
    assert loaded.eot_id == tokenizer.token_to_id("<|eot_id|>") and loaded.pad_id == tokenizer.token_to_id("<|pad|>")
    items = make_split(TASKS["arith"], "test", 4)
    result = evaluate_items(loaded, items, SamplerConfig(steps=32, gen_length=32, block_length=32), batch_size=3)
    assert result["n"] == 4 and set(result["accuracy"]) == {"strict-match", "flexible-extract"}
    assert all(isinstance(p["response"], str) for p in result["predictions"])
    files = {p.suffix for p in (tmp_path / "state").rglob("*") if p.is_file()}
    assert files <= {".json", ".safetensors"}  # no pickle anywhere


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
        device = torch.device("cpu")

        def forward(self, x, attention_mask=None):
            seen.append(x.clone())
            return type("Out", (), {"logits": torch.zeros(*x.shape, tokenizer.get_vocab_size(), requires_grad=True)})()

    diffusion_loss(Spy(), tokens, attention, response, ids["mask_token_id"], torch.Generator().manual_seed(0))
    masked = seen[0] == ids["mask_token_id"]
    assert not masked[:, :14].any() and masked[:, 14:].any()


def test_a_restart_begins_a_new_cosine_segment():
    plain = replace(MICRO, steps=60, warmup=10)
    restarted = replace(plain, steps=100, restarts=(60,), restart_lr=MICRO.lr / 2)
    # The first segment is exactly the schedule of a run that stopped at the restart.
    assert [learning_rate(restarted, s) for s in range(60)] == [learning_rate(plain, s) for s in range(60)]
    assert learning_rate(restarted, 59) < 0.1 * MICRO.lr
    assert learning_rate(restarted, 60) == pytest.approx(MICRO.lr / 2)  # no second warm-up
    later = [learning_rate(restarted, s) for s in range(60, 100)]
    assert later == sorted(later, reverse=True) and later[-1] < 0.1 * MICRO.lr / 2


def test_resume_follows_the_recipe_schedule(tmp_path, tokenizer):
    first = replace(MICRO, steps=10, checkpoint_every=10, log_every=1)
    train(first, source(), tokenizer, tmp_path / "a", tmp_path / "s", console=quiet())
    second = replace(first, steps=16, restarts=(10,), restart_lr=MICRO.lr / 4)
    _, state = train(second, source(), tokenizer, tmp_path / "b", tmp_path / "s", resume=True, console=quiet())
    assert state.step == 16
    assert [h["lr"] for h in state.history[10:]] == [learning_rate(second, s) for s in range(10, 16)]
    recipe = json.loads((tmp_path / "b" / "config.json").read_text())["unmask_training"]["recipe"]
    assert recipe["restarts"] == [10] and recipe["steps"] == 16 and recipe["d_model"] == MICRO.d_model


def test_recipes_name_known_mixtures():
    from evals.tasks.mixture import MIXTURES

    assert all(recipe.mixture in MIXTURES for recipe in RECIPES.values())


def test_unmask_train_takes_the_schedule_from_its_options(tmp_path):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    app = cli_app("train")
    args = [
        "train",
        "--model",
        "tiny-llada-base",
        "--out",
        str(tmp_path / "out"),
        "--state-dir",
        str(tmp_path / "state"),
        "--threads",
        "1",
    ]
    bad = CliRunner().invoke(app, [*args, "--mixture", "nope"])
    assert bad.exit_code == 2 and "unknown training mixture 'nope'" in bad.output
    ok = CliRunner().invoke(
        app, [*args, "--steps", "3", "--restart", "2", "--restart-lr", "0.0005", "--mixture", "sort-focus"]
    )
    assert ok.exit_code == 0, ok.output
    recipe = json.loads((tmp_path / "out" / "config.json").read_text())["unmask_training"]["recipe"]
    assert recipe["mixture"] == "sort-focus" and recipe["restarts"] == [2] and recipe["restart_lr"] == 0.0005
    assert recipe["d_model"] == RECIPES["tiny-llada"].d_model and recipe["steps"] == 3


def test_a_device_that_cannot_train_here_is_refused_by_name(tmp_path):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    app = cli_app("train")
    args = ["train", "--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state"), "--steps", "1"]
    for device, reason in [
        ("cuda:99", "CUDA device"),
        ("quantum", "got 'quantum'"),
        ("meta", "got 'meta'"),
        ("mps", "'cpu' or 'cuda[:N]'"),
    ]:
        result = CliRunner().invoke(app, [*args, "--device", device])
        assert result.exit_code == 2 and "--device" in result.output and reason in result.output, (
            device,
            result.output,
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()  # refused before any work
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU host)")
def test_a_step_on_cuda_masks_and_updates_like_the_cpu(tmp_path, tokenizer):
    """Same batches and masking noise on both devices: the weights after a few steps agree to float tolerance."""
    cfg = replace(MICRO, steps=5, checkpoint_every=5)
    cpu, _ = train(cfg, source(), tokenizer, tmp_path / "a", tmp_path / "sa", console=quiet())
    gpu, _ = train(cfg, source(), tokenizer, tmp_path / "b", tmp_path / "sb", console=quiet(), device="cuda")
    for (name, a), b in zip(cpu.state_dict().items(), gpu.state_dict().values()):
        assert torch.allclose(a, b.cpu(), atol=1e-4, rtol=1e-3), name
    assert load_checkpoint(tmp_path / "b").model.device.type == "cpu"


def test_the_long_canvas_recipe_fine_tunes_from_its_base_and_refuses_a_missing_one(tmp_path):
    from typer.testing import CliRunner

    from models.digest import weights_sha256
    from models.loading import WEIGHTS_DIR
    from tests.support.flow_fixtures import cli_app

    app = cli_app("train")
    args = [
        "train",
        "--model",
        "tiny-llada",
        "--out",
        str(tmp_path / "out"),
        "--state-dir",
        str(tmp_path / "state"),
        "--threads",
        "1",
        "--steps",
        "2",
    ]
    missing = CliRunner().invoke(app, [*args, "--init-from", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "nowhere: no checkpoint folder to fine-tune from" in missing.output
    ok = CliRunner().invoke(app, [*args, "--init-from", str(WEIGHTS_DIR / "tiny-llada")])
    assert ok.exit_code == 0, ok.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["unmask_training"]["init_sha256"] == weights_sha256(WEIGHTS_DIR / "tiny-llada")
    assert config["max_sequence_length"] == RECIPES["tiny-llada"].max_sequence_length
    assert config["unmask_training"]["recipe"]["canvas_mix"] == [list(p) for p in RECIPES["tiny-llada"].canvas_mix]


def test_mixed_canvases_follow_their_weights_and_keep_a_step_within_its_token_budget(tokenizer):
    from models.training import LONG_CANVAS_MIX, MIN_ROWS, draw_canvas, trim_rows

    cfg = RECIPES["tiny-llada"]
    drawn = [draw_canvas(cfg, 32, torch.Generator().manual_seed(s)) for s in range(4000)]
    for length, weight in LONG_CANVAS_MIX:
        assert abs(drawn.count(length) / len(drawn) - weight / sum(w for _, w in LONG_CANVAS_MIX)) < 0.03
    assert (
        min(draw_canvas(cfg, 128, torch.Generator().manual_seed(s)) for s in range(200)) == 128
    )  # never below gen_length
    batch = Batch("arith", 32, [("what is 12+30?", "2+0=2,1+3=4 #### 42")] * 48)
    for canvas in (32, 256, 512):
        kept = trim_rows(cfg, batch, canvas, tokenizer)
        prompt = len(tokenizer.encode(batch.pairs[0][0], add_special_tokens=False).ids)
        assert len(kept.pairs) == max(MIN_ROWS, min(48, cfg.canvas_tokens // (prompt + canvas)))
    assert trim_rows(RECIPES["tiny-ar"], batch, 512, tokenizer) is batch  # no budget: the batch as drawn
