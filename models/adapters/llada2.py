"""LLaDA2.0: unmask's native MoE block-diffusion network (models/llada2.py) behind the model handle.

LLaDA2 decodes as SDAR does (sampler/masked_blocks.py, `canvas: masked`): blocks of mask tokens in order, each
unmasked over `steps` steps, every position above a confidence threshold committed and at least the step's share
of the block (its generate's rule is `low_confidence_dynamic`). So the adapter is SDAR's, with LLaDA2's loader and
its block length: a decoding setting here (the catalog's `block_length`, else generate's 32), which the network's
block mask follows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from models.adapters.base import AdapterError, read_json, read_tokenizer, require_safetensors
from models.adapters.sdar import SDARAdapter
from models.checkpoint import CheckpointError
from models.llada2 import LLaDA2ForBlockDiffusion, load_llada2

# LLaDA2's generate defaults (inclusionAI/LLaDA2.0-mini modeling_llada2_moe.py): block_length 32, threshold 0.95,
# top-k/top-p off; the threshold rule with at least the step's share is `low_confidence_dynamic`.
LLADA2_DEFAULTS: dict[str, Any] = {
    "canvas": "masked",
    "remasking": "low_confidence_dynamic",
    "commit_threshold": 0.95,
    "block_length": 32,
    "top_k": 0,
    "top_p": 1.0,
}


class LLaDA2Adapter(SDARAdapter):
    """A LLaDA2 checkpoint: the masked block denoiser for the block sampler behind the model handle."""

    def __init__(
        self,
        model: LLaDA2ForBlockDiffusion,
        tokenizer: Tokenizer | None = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
        generation: dict[str, Any] | None = None,
    ):
        settings = LLADA2_DEFAULTS | dict(defaults or {})
        super().__init__(model, tokenizer, settings, path, entry_id or (path.name if path else "llada2"), generation)
        self.canvas_length = model.block_size = int(self.defaults["block_length"])
        if self.canvas_length <= 0:
            raise AdapterError(f"{path or self.entry_id}: block_length {self.canvas_length} must be positive")

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        entry_id: str = "",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        defaults: dict[str, Any] | None = None,
    ) -> LLaDA2Adapter:
        folder = Path(folder)
        require_safetensors(folder)
        try:
            model = load_llada2(folder, dtype)
        except CheckpointError as e:
            raise AdapterError(str(e)) from None
        generation = (
            read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
        )
        return cls(model.to(device), read_tokenizer(folder), defaults, folder, entry_id, generation)
