"""LLaDA: the native masked-diffusion model, decoded by unmask's diffusion sampler."""

from __future__ import annotations

from pathlib import Path

import torch

from models.adapters.base import AdapterError
from models.checkpoint import CheckpointError, LoadedModel, load_checkpoint


class LLaDAAdapter:
    """A LLaDA-layout checkpoint (config.json, safetensors, tokenizer.json) behind the adapter protocol."""

    kind = "masked-diffusion"

    def __init__(self, loaded: LoadedModel, entry_id: str | None = None):
        if loaded.causal:
            raise AdapterError(f"{loaded.path}: config.json sets causal=true; load it with the causal-lm adapter")
        self.loaded = loaded
        self.model = loaded.model
        self.entry_id = entry_id or loaded.model_id
        self.path: Path | None = loaded.path
        self.eos_ids = tuple(i for i in (loaded.eos_id, loaded.eot_id) if i is not None)

    @classmethod
    def from_folder(cls, folder: Path, entry_id: str | None = None, device="cpu", dtype=torch.float32) -> "LLaDAAdapter":
        try:
            return cls(load_checkpoint(folder, device=device, dtype=dtype), entry_id)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None

    def encode(self, text: str) -> list[int]:
        return self.loaded.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.loaded.decode(ids)

    def sampler_defaults(self) -> dict[str, int | None]:
        """The ids a SamplerConfig for this model must carry."""
        return {"mask_id": self.loaded.mask_id, "eos_id": self.loaded.eos_id, "eot_id": self.loaded.eot_id}
