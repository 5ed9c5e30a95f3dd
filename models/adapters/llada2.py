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

from models.adapters.base import AdapterError
from models.adapters.sdar import SDARAdapter
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

    DEFAULTS = LLADA2_DEFAULTS
    NAME = "llada2"

    def __init__(
        self,
        model: LLaDA2ForBlockDiffusion,
        tokenizer: Tokenizer | None = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
        generation: dict[str, Any] | None = None,
    ):
        super().__init__(model, tokenizer, defaults, path, entry_id, generation)
        self.canvas_length = model.block_size = int(self.defaults["block_length"])
        if self.canvas_length <= 0:
            raise AdapterError(f"{path or self.entry_id}: block_length {self.canvas_length} must be positive")

    @staticmethod
    def load(folder: Path, dtype: torch.dtype) -> LLaDA2ForBlockDiffusion:
        return load_llada2(folder, dtype)
