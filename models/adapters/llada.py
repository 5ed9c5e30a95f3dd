"""LLaDA layout: the native model, bidirectional (masked diffusion) or causal (the bundled AR twin)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.adapters.base import AdapterError, ModelHandle
from models.checkpoint import CheckpointError, LoadedModel, load_checkpoint


class LLaDAAdapter(ModelHandle):
    """A LLaDA-layout checkpoint (config.json, safetensors, tokenizer.json).

    Its kind follows config.json: `causal: true` is an autoregressive model that unmask's own
    KV-cached AR decoder runs, anything else the masked-diffusion sampler.
    """

    def __init__(self, loaded: LoadedModel, entry_id: str | None = None, defaults: dict[str, Any] | None = None):
        self.kind = "autoregressive" if loaded.causal else "masked-diffusion"
        self.model, self.tokenizer, self.path = loaded.model, loaded.tokenizer, loaded.path
        self.config = loaded.config
        self.entry_id = entry_id or loaded.model_id
        self.mask_id = (
            loaded.mask_id
        )  # the causal twin keeps its tokenizer's mask id: its configs (and hashes) carry it
        self.eos_ids = tuple(i for i in (loaded.eos_id, loaded.eot_id) if i is not None)
        self.pad_id = loaded.pad_id
        self.card = loaded.card
        self.defaults = dict(defaults or {})

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        entry_id: str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        defaults: dict[str, Any] | None = None,
    ) -> LLaDAAdapter:
        try:
            return cls(load_checkpoint(folder, device=device, dtype=dtype), entry_id, defaults)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
