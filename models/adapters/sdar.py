"""SDAR: unmask's native block-diffusion network (models/sdar.py) behind the model handle, for the block sampler.

The adapter loads a published SDAR folder (config.json, safetensors, tokenizer.json; no remote code) and offers
the block loop its calls: an empty cache, `encode_prefix` (a forward that appends the keys/values of committed
blocks) and `denoise` (a forward over the current block that reads the cache and writes nothing). Decoding
itself is sampler/masked_blocks.py, chosen by the catalog's `canvas: masked`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.adapters.base import BlockCheckpointAdapter
from models.sdar import SDARCache, SDARForBlockDiffusion, load_sdar

# Block-loop settings SDAR decodes with unless the catalog says otherwise (JetAstra/SDAR's README example).
SDAR_DEFAULTS: dict[str, Any] = {"canvas": "masked", "remasking": "low_confidence_dynamic", "commit_threshold": 0.9}


class SDARAdapter(BlockCheckpointAdapter):
    """An SDAR checkpoint: the masked block denoiser for the block sampler behind the model handle."""

    DEFAULTS = SDAR_DEFAULTS
    NAME = "sdar"
    model: SDARForBlockDiffusion

    @staticmethod
    def load(folder: Path, dtype: torch.dtype) -> SDARForBlockDiffusion:
        return load_sdar(folder, dtype)

    # -- the BlockDenoiser protocol (sampler/block_diffusion.py, sampler/masked_blocks.py) -----------

    def new_cache(self) -> SDARCache:
        return SDARCache()

    def encode_prefix(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: SDARCache
    ) -> SDARCache:
        """Append the keys/values of `input_ids` `(batch, n)` (block-causal among themselves) to `cache`;
        `attention_mask` `(batch, cached + n)` covers all keys."""
        n = input_ids.shape[1]
        self.model(input_ids, position_ids, attention_mask[:, -n:], cache, store=True)
        return cache

    def denoise(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        cache: SDARCache,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits `(batch, block, vocab)` for the block `canvas`, reading (never writing) the cache."""
        L = canvas.shape[1]
        logits: torch.Tensor = self.model(canvas, position_ids, attention_mask[:, -L:], cache).logits
        return logits
