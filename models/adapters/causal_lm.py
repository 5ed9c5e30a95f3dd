"""Autoregressive fallback: transformers' AutoModelForCausalLM with a KV cache.

Llama- and Qwen-style safetensors checkpoints load as they are. A LLaDA-layout checkpoint with
`"causal": true` (the bundled tiny-ar) is the same Llama block under other tensor names, so it is
renamed into a `LlamaForCausalLM` and decoded by the same cached loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from models.adapters.base import AdapterError, ModelHandle, eos_list, read_json, read_tokenizer, require_safetensors
from models.checkpoint import CheckpointError, read_config, read_tensors

# LLaDA tensor name (per block where it has {i}) -> Llama tensor name.
LLADA_TO_LLAMA = {
    "model.transformer.wte.weight": "model.embed_tokens.weight",
    "model.transformer.ln_f.weight": "model.norm.weight",
    "model.transformer.ff_out.weight": "lm_head.weight",
    "model.transformer.blocks.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "model.transformer.blocks.{i}.q_proj.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "model.transformer.blocks.{i}.k_proj.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "model.transformer.blocks.{i}.v_proj.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "model.transformer.blocks.{i}.attn_out.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "model.transformer.blocks.{i}.ff_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "model.transformer.blocks.{i}.ff_proj.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "model.transformer.blocks.{i}.up_proj.weight": "model.layers.{i}.mlp.up_proj.weight",
    "model.transformer.blocks.{i}.ff_out.weight": "model.layers.{i}.mlp.down_proj.weight",
}


def llada_as_llama(folder: Path, dtype: torch.dtype) -> tuple[Any, dict[str, Any]]:
    """A causal LLaDA-layout checkpoint as a `LlamaForCausalLM` with identical weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    try:
        cfg, raw = read_config(folder)
        tensors = read_tensors(folder)
    except CheckpointError as e:
        raise AdapterError(str(e)) from None
    if not cfg.rope or cfg.include_bias:
        raise AdapterError(f"{folder / 'config.json'}: rope=false or include_bias=true has no Llama equivalent")
    config = LlamaConfig(
        vocab_size=cfg.output_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.hidden_size,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_sequence_length,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.weight_tying,
        bos_token_id=None,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=raw.get("pad_token_id", cfg.eos_token_id),
    )
    renamed = {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        key = ".".join(p if not p.isdigit() else "{i}" for p in parts)
        if key not in LLADA_TO_LLAMA:
            raise AdapterError(f"{folder}: tensor '{name}' has no Llama counterpart")
        index = next((p for p in parts if p.isdigit()), None)
        renamed[LLADA_TO_LLAMA[key].format(i=index)] = tensor.to(dtype)
    with torch.device("meta"):  # transformers leaves from_config unannotated
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(renamed, strict=False, assign=True)
    missing = [m for m in missing if not (cfg.weight_tying and m == "lm_head.weight")]
    if missing or unexpected:
        raise AdapterError(f"{folder}: renaming to Llama left missing {missing[:3]} / unexpected {unexpected[:3]}")
    if cfg.weight_tying:
        model.tie_weights()
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # buffers were built on meta
    return model.eval(), raw


class CausalLMAdapter(ModelHandle):
    """An autoregressive Hugging Face model (Llama, Qwen: the real AR fallbacks); `sampler.decode` runs
    transformers' KV-cached generate on it."""

    kind = "autoregressive"

    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer | None,
        eos_ids: tuple[int, ...],
        pad_id: int | None,
        path: Path | None,
        entry_id: str = "",
        defaults: dict[str, Any] | None = None,
    ):
        self.model, self.tokenizer, self.path = model, tokenizer, path
        self.eos_ids = eos_ids
        # rows that stop are filled with EOS, as the diffusion and native AR samplers do
        self.pad_id = eos_ids[0] if eos_ids else (pad_id if pad_id is not None else 0)
        self.entry_id = entry_id or (path.name if path else "")
        self.defaults = dict(defaults or {})
        self._read_card()

    @classmethod
    def from_folder(
        cls,
        folder: Path,
        entry_id: str = "",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        defaults: dict[str, Any] | None = None,
    ) -> CausalLMAdapter:
        """Load a Hugging Face causal LM folder (safetensors only, no remote code) or a causal LLaDA layout.

        The catalog's `defaults` may name the stop ids (`eos_id`, `eot_id`); else the folder's own.
        """
        from transformers import AutoModelForCausalLM

        folder = Path(folder)
        defaults = dict(defaults or {})
        eos_ids = tuple(defaults[k] for k in ("eos_id", "eot_id") if defaults.get(k) is not None)
        config = read_json(folder / "config.json")
        require_safetensors(folder)
        if config.get("model_type") == "llada" or "d_model" in config:
            if not config.get("causal"):
                raise AdapterError(f"{folder / 'config.json'}: a bidirectional LLaDA model; use the llada adapter")
            model, raw = llada_as_llama(folder, dtype)
            eos = eos_ids or eos_list(
                [raw.get("eos_token_id", 126081)]
                + ([raw["eot_token_id"]] if raw.get("eot_token_id") is not None else [])
            )
            pad = raw.get("pad_token_id")
        else:
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    folder, dtype=dtype, use_safetensors=True, trust_remote_code=False, local_files_only=True
                ).eval()  # type: ignore[no-untyped-call]  # transformers leaves PreTrainedModel.eval unannotated
            except (OSError, ValueError, KeyError) as e:
                raise AdapterError(f"{folder}: transformers cannot load this causal LM natively ({e})") from None
            gen = model.generation_config
            eos = eos_ids or eos_list(gen.eos_token_id if gen.eos_token_id is not None else config.get("eos_token_id"))
            pad = gen.pad_token_id if gen.pad_token_id is not None else config.get("pad_token_id")
        return cls(model.to(device), read_tokenizer(folder), eos, pad, folder, entry_id, defaults)
