"""Nemotron-Labs-Diffusion: unmask's native network (models/nemotron_diffusion.py) behind the model handle.

The adapter loads a published folder (config.json, safetensors, tokenizer.json; no remote code) and offers the
seeded block loop (sampler/seeded_blocks.py, chosen by the catalog's `canvas: seeded`) its calls: an empty cache,
`extend` (a causal pass whose keys join the cache: the prompt, a finished block, a verify pass), `denoise` (a
bidirectional pass over a block that reads the cache and writes nothing) and `retract` (drop a rejected draft's
slots). The catalog's `mode` picks block diffusion, self-speculation or autoregressive decoding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from models.adapters.base import AdapterError, ModelHandle, eos_list, read_json, read_tokenizer, require_safetensors
from models.checkpoint import CheckpointError
from models.nemotron_diffusion import NemotronCache, NemotronDiffusionModel, load_nemotron

# Decoding settings unless the catalog says otherwise: the lossless self-speculative mode (greedy). Block diffusion's
# commit rule is SDAR's (models/adapters/sdar.py): the published config names no threshold of its own.
NEMOTRON_DEFAULTS: dict[str, Any] = {
    "canvas": "seeded",
    "mode": "self_speculative",
    "temperature": 0.0,
    "remasking": "low_confidence_dynamic",
    "commit_threshold": 0.9,
}


class NemotronAdapter(ModelHandle):
    """A Nemotron-Labs-Diffusion checkpoint: causal and bidirectional passes over one KV cache for the block sampler."""

    kind = "block-diffusion"

    def __init__(
        self,
        model: NemotronDiffusionModel,
        tokenizer: Tokenizer | None = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
        generation: dict[str, Any] | None = None,
    ):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.entry_id = entry_id or (path.name if path else "nemotron-labs-diffusion")
        self.defaults = NEMOTRON_DEFAULTS | dict(defaults or {})
        cfg = model.config
        self.canvas_length = cfg.block_size
        self.vocab_size = cfg.vocab_size
        self.mask_id = self.defaults.get("mask_id", cfg.mask_token_id)
        if self.mask_id is None:
            raise AdapterError(f"{path or self.entry_id}: config.json has no mask_token_id and the catalog none")
        gen = generation or {}
        self.eos_ids = eos_list(self.defaults.get("eos_id", gen.get("eos_token_id", cfg.eos_token_id)))
        self.pad_id = self.defaults.get("pad_id", gen.get("pad_token_id", cfg.pad_token_id))
        self.defaults.setdefault("mask_id", self.mask_id)
        self._read_card()

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = self.model.dtype
        return dtype

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        entry_id: str = "",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        defaults: dict[str, Any] | None = None,
    ) -> NemotronAdapter:
        folder = Path(folder)
        require_safetensors(folder)
        try:
            model = load_nemotron(folder, dtype)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
        generation = (
            read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        )
        return cls(model.to(device), read_tokenizer(folder), defaults, folder, entry_id, generation)

    # -- the SeededBlockModel protocol (sampler/seeded_blocks.py) -----------------------------------

    def new_cache(self) -> NemotronCache:
        return NemotronCache()

    def extend(
        self, input_ids: torch.Tensor, key_mask: torch.Tensor, position_ids: torch.Tensor, cache: NemotronCache
    ) -> torch.Tensor:
        """Causal float32 logits `(batch, n, vocab)`; the keys/values of `input_ids` `(batch, n)` join `cache`."""
        logits: torch.Tensor = self.model(input_ids, position_ids, key_mask, cache, store=True, causal=True).logits
        return logits

    def denoise(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        cache: NemotronCache,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Bidirectional float32 logits `(batch, block, vocab)` for `canvas`, reading (never writing) the cache."""
        L = canvas.shape[1]
        logits: torch.Tensor = self.model(canvas, position_ids, attention_mask[:, -L:], cache, causal=False).logits
        return logits

    def retract(self, cache: NemotronCache, keep: torch.Tensor) -> None:
        """Mask out the cache's last `keep.shape[1]` slots where `keep` `(batch, n)` is False (rejected drafts)."""
        assert cache.key_mask is not None, "retract follows a pass that stored keys"
        cache.key_mask[:, -keep.shape[1] :] &= keep

    def cache_rows(self, cache: NemotronCache, rows: torch.Tensor) -> NemotronCache:
        return cache.rows(rows)
