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

from models.adapters.base import BlockCheckpointAdapter
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


class NemotronAdapter(BlockCheckpointAdapter):
    """A Nemotron-Labs-Diffusion checkpoint: causal and bidirectional passes over one KV cache for the block sampler."""

    DEFAULTS = NEMOTRON_DEFAULTS
    NAME = "nemotron-labs-diffusion"
    model: NemotronDiffusionModel

    @staticmethod
    def load(folder: Path, dtype: torch.dtype) -> NemotronDiffusionModel:
        return load_nemotron(folder, dtype)

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
