"""Tiny random-weight model folders with a character tokenizer, for evaluation tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from evals.tasks import alphabet
from models.checkpoint import save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM, init_weights
from models.loading import WEIGHTS_DIR
from models.tokenizer_build import build_char_tokenizer, special_ids
from tests.support import REPO


class NaNWhen(torch.nn.Module):
    """Wraps a model so its logits are NaN for any row whose input holds `token` (or always, if None)."""

    def __init__(self, model: torch.nn.Module, token: int | None = None):
        super().__init__()
        self.inner = model
        self.token = token
        self.config = model.config

    def forward(self, input_ids, attention_mask=None, **kwargs):
        out = self.inner(input_ids, attention_mask=attention_mask, **kwargs)
        rows = (
            torch.ones(input_ids.shape[0], dtype=torch.bool)
            if self.token is None
            else (input_ids == self.token).any(-1)
        )
        out.logits[rows] = float("nan")
        return out


def write_model(folder: Path, causal: bool = False, seed: int = 0, card_license: str | None = "apache-2.0") -> Path:
    """A 2-layer char-level LLaDA-layout (or causal) model with random weights, saved as a checkpoint folder."""
    tokenizer = build_char_tokenizer("")
    ids = special_ids(tokenizer)
    vocab = tokenizer.get_vocab_size()
    cfg = LLaDAConfig(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        mlp_hidden_size=48,
        vocab_size=vocab,
        embedding_size=vocab,
        max_sequence_length=256,
        mask_token_id=ids["mask_token_id"],
        eos_token_id=ids["eos_token_id"],
        causal=causal,
    )
    model = init_weights(LLaDAModelLM(cfg), seed=seed, std=0.3)
    save_checkpoint(
        model,
        folder,
        tokenizer=tokenizer,
        extra_config={"eot_token_id": ids["eot_token_id"], "pad_token_id": ids["pad_token_id"]},
    )
    if card_license:
        (folder / "README.md").write_text(f"---\nlicense: {card_license}\n---\n# tiny test model\n")
    return folder


def write_random_model(folder, causal=False, seed=0):
    """A 2-layer LLaDA-layout (or causal) model over the tasks' alphabet with a 1024-position window, for the bench's
    longer canvases; no model card."""
    tokenizer = build_char_tokenizer(alphabet())
    ids = special_ids(tokenizer)
    cfg = LLaDAConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        mlp_hidden_size=64,
        vocab_size=tokenizer.get_vocab_size(),
        max_sequence_length=1024,
        mask_token_id=ids["mask_token_id"],
        eos_token_id=ids["eos_token_id"],
        causal=causal,
    )
    model = init_weights(LLaDAModelLM(cfg), seed=seed, std=0.3)
    return save_checkpoint(
        model,
        folder,
        tokenizer=tokenizer,
        extra_config={"eot_token_id": ids["eot_token_id"], "pad_token_id": ids["pad_token_id"]},
    )


def hub_llama_copy(folder, out):
    """A causal LLaDA-layout checkpoint saved by transformers as a LlamaForCausalLM: what a Hub Llama/Qwen
    fallback folder looks like (config.json with model_type llama, HF tensor names, generation_config.json
    stopping on EOS and EoT), with the same weights, tokenizer and model card."""
    from models.adapters.causal_lm import llada_as_llama

    model, raw = llada_as_llama(Path(folder), torch.float32)
    model.generation_config.eos_token_id = [raw["eos_token_id"], raw["eot_token_id"]]
    model.save_pretrained(out)
    for name in ("tokenizer.json", "README.md"):
        shutil.copy(Path(folder) / name, out / name)
    return out


def tiny_diffusion_gemma_config():
    """A tiny random DiffusionGemma: 2 layers, 4 experts, vocabulary 128 (the char tokenizer's 101 ids fit),
    canvas 8."""
    import transformers

    text = dict(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        sliding_window=8,
        max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention"],
        use_bidirectional_attention="vision",
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=16,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    # A None vision config would build the full-size default tower; this one is a few thousand weights.
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=64,
        patch_size=4,
        pooling_kernel_size=2,
    )
    return transformers.DiffusionGemmaConfig(
        text_config=text, vision_config=vision, canvas_length=8, boi_token_id=125, eoi_token_id=126, image_token_id=127
    )


def write_diffusion_gemma(folder: Path, seed: int = 0) -> Path:
    """The tiny DiffusionGemma saved by transformers (safetensors) with the char tokenizer and a card."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config())
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 1, 0  # the tokenizer's EOS and pad
    model.save_pretrained(folder)
    build_char_tokenizer("").save(str(folder / "tokenizer.json"))
    # the bundled models' chat template (single-turn: the last user message is the prompt), as random_weights does
    shutil.copy(WEIGHTS_DIR / "tiny-llada" / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny block-diffusion test model\n")
    return folder


def write_sdar(folder: Path, seed: int = 0) -> Path:
    """A tiny random SDAR (2 layers, vocabulary 128, block 4) in the published layout, with the char tokenizer,
    its chat template and a card; mask, EOS and pad are the tokenizer's."""
    from models.sdar import SDARConfig, random_sdar, save_sdar

    tokenizer = build_char_tokenizer("")
    ids = special_ids(tokenizer)
    cfg = SDARConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        block_size=4,
        mask_token_id=ids["mask_token_id"],
        eos_token_id=ids["eos_token_id"],
    )
    save_sdar(random_sdar(cfg, seed=seed, std=0.3), folder, {"pad_token_id": ids["pad_token_id"]})
    tokenizer.save(str(folder / "tokenizer.json"))
    shutil.copy(WEIGHTS_DIR / "tiny-llada" / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny SDAR test model\n")
    return folder


def write_llada2(folder: Path) -> Path:
    """The LLaDA2 parity checkpoint (tests/golden/llada2: 2 layers, 8 routed experts in 4 groups, vocabulary 300) with
    the char tokenizer, its mask, EOS and pad ids named in config.json, and a card."""
    shutil.copytree(REPO / "tests" / "golden" / "llada2" / "checkpoint", folder)
    tokenizer = build_char_tokenizer("")
    ids = special_ids(tokenizer)
    config = json.loads((folder / "config.json").read_text())
    config |= {k: ids[k] for k in ("mask_token_id", "eos_token_id", "pad_token_id")}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save(str(folder / "tokenizer.json"))
    shutil.copy(WEIGHTS_DIR / "tiny-llada" / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny LLaDA2 test model\n")
    return folder


def write_nemotron(folder: Path) -> Path:
    """The Nemotron-Labs-Diffusion parity checkpoint (tests/golden/nemotron: 2 layers, YaRN, block 4, the char
    tokenizer's ids in config.json) with its chat template and a card."""
    shutil.copytree(REPO / "tests" / "golden" / "nemotron" / "checkpoint", folder)
    shutil.copy(WEIGHTS_DIR / "tiny-llada" / "tokenizer_config.json", folder / "tokenizer_config.json")
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny Nemotron-Labs-Diffusion test model\n")
    return folder
