"""DiffusionGemma: transformers' native DiffusionGemmaForBlockDiffusion, driven by unmask's block sampler.

The adapter loads the model (safetensors only, no remote code) and exposes the three calls the
block-diffusion loop needs: an empty prefix cache, `encode_prefix` (the causal encoder appends to the cache)
and `denoise` (bidirectional decoder scores a canvas, reading the cache). The loop itself, with its
random draws, lives in sampler/block_diffusion.py.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from models.adapters.base import AdapterError, ModelHandle, eos_list, read_json, read_tokenizer, require_safetensors


class DiffusionGemmaAdapter(ModelHandle):
    """A DiffusionGemma checkpoint: the block denoiser for sampler/block_diffusion.py behind the model handle."""

    kind = "block-diffusion"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | None = None,
        defaults: dict[str, Any] | None = None,
        path: Path | None = None,
        entry_id: str = "",
    ):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.entry_id = entry_id or (path.name if path else "diffusion-gemma")
        self.defaults = dict(defaults or {})
        self.canvas_length = int(model.config.canvas_length)
        self.vocab_size = int(model.config.text_config.vocab_size)
        gen = model.generation_config
        self.eos_ids = eos_list(self.defaults.get("eos_id", gen.eos_token_id))
        self.pad_id = self.defaults.get("pad_id", gen.pad_token_id)
        self._read_card()

    @property
    def dtype(self) -> torch.dtype:
        dtype: torch.dtype = self.model.model.decoder.embed_tokens.weight.dtype
        return dtype

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        entry_id: str = "",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        defaults: dict[str, Any] | None = None,
    ) -> DiffusionGemmaAdapter:
        from transformers import DiffusionGemmaForBlockDiffusion

        folder = Path(folder)
        model_type = read_json(folder / "config.json").get("model_type")
        if model_type != "diffusion_gemma":
            raise AdapterError(f"{folder / 'config.json'}: model_type is {model_type!r}, expected 'diffusion_gemma'")
        require_safetensors(folder)
        try:
            model = DiffusionGemmaForBlockDiffusion.from_pretrained(
                folder, dtype=dtype, use_safetensors=True, trust_remote_code=False, local_files_only=True
            )
        except (OSError, ValueError, KeyError) as e:
            raise AdapterError(f"{folder}: DiffusionGemmaForBlockDiffusion cannot load it ({e})") from None
        # transformers wraps PreTrainedModel.to in functools.wraps(nn.Module.to): mypy reads `device` as its `self`
        return cls(
            model.to(device).eval(),  # type: ignore[arg-type]
            read_tokenizer(folder),
            defaults,
            folder,
            entry_id,
        )

    # -- the BlockDenoiser protocol (sampler/block_diffusion.py) --------------------------------

    def new_cache(self) -> Any:  # a transformers DynamicCache
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config.get_text_config(decoder=True))

    def encode_prefix(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> Any:
        """Run the causal encoder over `input_ids` `(batch, n)`, appending their keys/values to `cache`."""
        encoder = self.model.model.encoder
        ids = input_ids.clone(memory_format=torch.contiguous_format)
        shape_only = torch.empty((ids.shape[0], ids.shape[1], 0), dtype=self.model.dtype, device=ids.device)
        masks = encoder.create_masks_for_generate(
            config=self.model.config,
            inputs_embeds=shape_only,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
            mm_token_type_ids=None,
        )
        return encoder(input_ids=ids, attention_mask=masks, cache=cache, position_ids=position_ids).cache

    def cache_rows(self, cache: Any, rows: torch.Tensor) -> Any:
        """A cache of only the batch rows `rows` `(n,)` of `cache`, for a denoising call on them; `cache` is untouched
        (its layers are copied, their keys and values indexed, never written)."""
        subset = copy.copy(cache)
        subset.layers = [copy.copy(layer) for layer in cache.layers]
        subset.batch_select_indices(rows)
        return subset

    def denoise(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        cache: Any,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits `(batch, canvas_length, vocab)` for `canvas`, attending to the whole cache."""
        masks = self.model.model.decoder.create_diffusion_decoder_attention_mask(
            config=self.model.config,
            inputs_embeds=canvas.unsqueeze(-1),
            cache=cache,
            decoder_attention_mask=attention_mask,
        )
        logits: torch.Tensor = self.model(
            decoder_input_ids=canvas,
            self_conditioning_logits=self_conditioning,
            decoder_attention_mask=masks,
            cache=cache,
            decoder_position_ids=position_ids,
        ).logits
        return logits

    # -- the adapter protocol ---------------------------------------------------------------------
