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
from tokenizers import Tokenizer

from models.adapters.base import AdapterError, ModelHandle, eos_list, read_json, read_tokenizer, require_safetensors
from models.checkpoint import CheckpointError
from models.sdar import SDARCache, SDARForBlockDiffusion, load_sdar

# Block-loop settings SDAR decodes with unless the catalog says otherwise (JetAstra/SDAR's README example).
SDAR_DEFAULTS: dict[str, Any] = {"canvas": "masked", "remasking": "low_confidence_dynamic", "commit_threshold": 0.9}


class SDARAdapter(ModelHandle):
    """An SDAR checkpoint: the masked block denoiser for the block sampler behind the model handle."""

    kind = "block-diffusion"

    def __init__(
        self,
        model: SDARForBlockDiffusion,
        tokenizer: Tokenizer | None = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
        generation: dict[str, Any] | None = None,
    ):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.entry_id = entry_id or (path.name if path else "sdar")
        self.defaults = SDAR_DEFAULTS | dict(defaults or {})
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
    ) -> SDARAdapter:
        folder = Path(folder)
        require_safetensors(folder)
        try:
            model = load_sdar(folder, dtype)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
        generation = (
            read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        )
        return cls(model.to(device), read_tokenizer(folder), defaults, folder, entry_id, generation)

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

    def cache_rows(self, cache: SDARCache, rows: torch.Tensor) -> SDARCache:
        return cache.rows(rows)

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
