"""Random-weight LLaDA-layout models of a stated shape, for speed measured where no trained weights are needed.

LLADA_8B is LLaDA-8B's shape (32 layers, d_model 4096, 32 heads, SwiGLU 12288, vocabulary 126464, RoPE
theta 500000); SMOKE a tiny one that runs the same code path on a CPU. The text codec is the bundled
tiny tokenizer's (ids it does not know decode to nothing), so the speed is counted in token ids.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from models.adapters.llada import LLaDAAdapter
from models.checkpoint import LoadedModel, save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM
from models.loading import WEIGHTS_DIR, resolve_dtype
from models.tokenizer_build import special_ids

if TYPE_CHECKING:
    from tokenizers import Tokenizer

LLADA_8B = {
    "d_model": 4096,
    "n_heads": 32,
    "n_layers": 32,
    "mlp_hidden_size": 12288,
    "vocab_size": 126464,
    "rope_theta": 500000.0,
    "max_sequence_length": 4096,
}
SMOKE = {
    "d_model": 64,
    "n_heads": 4,
    "n_layers": 2,
    "mlp_hidden_size": 128,
    "vocab_size": 512,
    "rope_theta": 500000.0,
    "max_sequence_length": 1024,
}


def random_llada(
    shape: dict[str, Any], device: str, dtype: str, causal: bool = False, seed: int = 0
) -> tuple[LLaDAModelLM, Tokenizer, dict[str, int]]:
    """(model, tokenizer, special ids): a LLaDA-layout network of `shape` built on `device` in `dtype` (bf16 on a
    GPU: LLaDA-8B is 16 GB built there, never 32 GB of float32 first), normal(0, 0.02) weights, norms at 1."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(WEIGHTS_DIR / "tiny-llada" / "tokenizer.json"))
    ids = special_ids(tokenizer)
    cfg = LLaDAConfig(**shape, mask_token_id=ids["mask_token_id"], eos_token_id=ids["eos_token_id"], causal=causal)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(resolve_dtype(dtype))
    try:
        with torch.device(device), torch.no_grad():
            model = LLaDAModelLM(cfg)
            for name, p in model.named_parameters():
                if name.endswith(("norm.weight", "ln_f.weight")):
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
    finally:
        torch.set_default_dtype(previous)
    return model.eval(), tokenizer, ids


def random_handle(
    shape: dict[str, Any], device: str, dtype: str, causal: bool = False, name: str = "llada-8b-random"
) -> LLaDAAdapter:
    """A model handle (what `models.load` returns) over a random network of `shape`, kept in memory."""
    model, tokenizer, ids = random_llada(shape, device, dtype, causal=causal, seed=1 if causal else 0)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        mask_id=ids["mask_token_id"],
        eos_id=ids["eos_token_id"],
        eot_id=ids["eot_token_id"],
        pad_id=ids["pad_token_id"],
        path=Path(name),
        config=model.config,
        model_id=name,
    )
    return LLaDAAdapter(loaded, entry_id=name)


def write_random_llada(folder: Path, shape: dict[str, Any], device: str, dtype: str) -> Path:
    """`random_llada` saved as a checkpoint folder (safetensors shards of at most 4 GiB, the tiny tokenizer)."""
    model, tokenizer, ids = random_llada(shape, device, dtype)
    save_checkpoint(
        model,
        folder,
        tokenizer=tokenizer,
        max_shard_bytes=4 * 2**30,
        extra_config={"eot_token_id": ids["eot_token_id"], "pad_token_id": ids["pad_token_id"]},
    )
    shutil.copy(WEIGHTS_DIR / "tiny-llada" / "tokenizer_config.json", folder / "tokenizer_config.json")
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return folder


def matmul_parameters(model: LLaDAModelLM) -> int:
    """Weights a forward multiplies each position by: every parameter but the input embedding (a lookup) and
    the norms, plus the embedding again when the output head is tied to it. 2 x this = FLOPs per position."""
    cfg = model.config
    wte = model.model.transformer.wte.weight.numel()
    norms = sum(p.numel() for n, p in model.named_parameters() if n.endswith("norm.weight") or "ln_f" in n)
    total = sum(p.numel() for p in model.parameters())
    return total - wte - norms + (wte if cfg.weight_tying else 0)
