"""One decoding entry point over every kind of candidate, so evaluation treats them alike.

`decode(adapter, input_ids, config)` picks the decoder by the adapter's catalog kind: unmask's
masked-diffusion sampler, the block-diffusion sampler, or KV-cached autoregressive decoding. The
adapters (models/adapters) only load models and tokenize; decoding lives here, above them.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch

from sampler.block_diffusion import BlockDiffusionConfig, generate_block_diffusion
from sampler.config import SamplerConfig
from sampler.generate import GenerateOutput, generate


class DecodeError(ValueError):
    """A candidate that this config cannot decode; the message says why."""


def decode_masked_diffusion(adapter: Any, input_ids, config: SamplerConfig, attention_mask=None) -> GenerateOutput:
    """LLaDA-style models: the sampler with this model's own mask id."""
    ids = adapter.sampler_defaults()
    if config.mask_id != ids["mask_id"]:
        raise DecodeError(
            f"SamplerConfig.mask_id={config.mask_id} but {adapter.entry_id} masks with {ids['mask_id']}; "
            f"build the config with adapter.sampler_defaults()"
        )
    return generate(adapter.model, input_ids, config, attention_mask=attention_mask)


def block_config_for(adapter: Any, config: SamplerConfig | BlockDiffusionConfig) -> BlockDiffusionConfig:
    """Translate a SamplerConfig: gen_length -> new tokens, steps spread over the canvases, seed.

    The catalog's decoding defaults supply the entropy bound, temperature schedule and stopping
    thresholds; SamplerConfig.temperature does not apply (the schedule replaces it).
    """
    if isinstance(config, BlockDiffusionConfig):
        return config
    defaults = adapter.defaults
    canvases = math.ceil(config.gen_length / adapter.canvas_length)
    keys = ("entropy_bound", "t_min", "t_max", "stability_threshold", "confidence_threshold")
    return BlockDiffusionConfig(
        max_new_tokens=config.gen_length,
        max_denoising_steps=max(1, config.steps // canvases),
        eos_ids=adapter.eos_ids, pad_id=adapter.pad_id, seed=config.seed,
        **{k: defaults[k] for k in keys if k in defaults},
    )


def decode_block_diffusion(adapter: Any, input_ids, config, attention_mask=None) -> GenerateOutput:
    """DiffusionGemma-style uniform-state block diffusion."""
    return generate_block_diffusion(adapter, input_ids, block_config_for(adapter, config), attention_mask=attention_mask)


@torch.no_grad()
def decode_causal_lm(adapter: Any, input_ids, config: SamplerConfig, attention_mask=None,
                     on_step: Callable[[Any], None] | None = None) -> GenerateOutput:
    """Up to `config.gen_length` new tokens through transformers' KV-cached generate; stopped rows pad with EOS.

    `config.temperature` 0 is greedy; above 0 samples from softmax(logits / temperature) with no
    top-k/top-p cut, seeded by `config.seed`. NFE is the number of forward passes (one per token).
    `on_step` receives a `sampler.output.StepInfo` per token, through a streamer; it does not change the output.
    """
    from transformers import GenerationConfig

    from sampler.autoregressive import TokenSteps, causal_output

    B, P = input_ids.shape
    sample = config.temperature > 0
    gen = GenerationConfig(
        max_new_tokens=config.gen_length, do_sample=sample, temperature=config.temperature if sample else None,
        top_k=None, top_p=None, eos_token_id=list(adapter.eos_ids) or None, pad_token_id=adapter.pad_id, use_cache=True,
    )
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    devices = [input_ids.device] if input_ids.device.type == "cuda" else []
    rng = torch.random.fork_rng(devices=devices) if config.seed is not None else contextlib.nullcontext()
    with rng:
        if config.seed is not None:
            torch.manual_seed(config.seed)
        streamer = None if on_step is None else TokenSteps(on_step, tuple(adapter.eos_ids), config.block_length)
        out = adapter.model.generate(input_ids=input_ids, attention_mask=mask, generation_config=gen, streamer=streamer)
    steps = out.shape[1] - P
    if steps < config.gen_length:
        out = torch.cat([out, out.new_full((B, config.gen_length - steps), adapter.pad_id)], dim=1)
    return causal_output(out, P, steps, config)


def decode_api(adapter: Any, input_ids, config, attention_mask=None) -> GenerateOutput:
    adapter.status_or_raise()  # a missing key is the first thing to report
    raise DecodeError(f"model '{adapter.entry_id}' is an API model: it takes text, not token ids; use complete()")


DECODERS: dict[str, Callable[..., GenerateOutput]] = {
    "masked-diffusion": decode_masked_diffusion,
    "block-diffusion": decode_block_diffusion,
    "autoregressive": decode_causal_lm,
    "api": decode_api,
}


def decode(adapter: Any, input_ids: torch.Tensor, config, attention_mask: torch.Tensor | None = None) -> GenerateOutput:
    """Continue `input_ids` `(batch, prompt_len)` with the decoder of `adapter.kind`."""
    try:
        decoder = DECODERS[adapter.kind]
    except KeyError:
        raise DecodeError(f"no decoder for kind {adapter.kind!r}; known: {', '.join(DECODERS)}") from None
    return decoder(adapter, input_ids, config, attention_mask=attention_mask)


def decoding_kind(loaded: Any) -> str:
    """'masked-diffusion', 'autoregressive' or 'block-diffusion': an adapter names its kind, a
    `models.LoadedModel` (the LLaDA layout) is autoregressive when its config is causal."""
    return getattr(loaded, "kind", None) or ("autoregressive" if loaded.causal else "masked-diffusion")


def decode_loaded(loaded: Any, input_ids: torch.Tensor, config: SamplerConfig, attention_mask: torch.Tensor | None = None,
                  **options: Any) -> GenerateOutput:
    """Decode with what `models.load_model` returned, by its kind; all kinds return the same `GenerateOutput` layout.

    A bidirectional LLaDA layout runs the diffusion sampler (`options` such as `record_commits` go to
    it); a causal LLaDA layout (the bundled AR twin) runs unmask's KV-cached AR decoder. An adapter
    names its kind: a Hugging Face causal LM runs transformers' cached `generate`, a DiffusionGemma
    the block-diffusion sampler (`block_config_for` translates the SamplerConfig).
    """
    kind = decoding_kind(loaded)
    if kind != "masked-diffusion" and getattr(config, "backend", "torch") != "torch":
        raise DecodeError(f"backend {config.backend!r} runs the masked-diffusion sampler only; "
                          f"{kind} models decode with torch")
    adapter_kind = getattr(loaded, "kind", None)  # only adapters name a kind; a LoadedModel runs unmask's samplers
    if adapter_kind == "block-diffusion":
        return decode_block_diffusion(loaded, input_ids, config, attention_mask=attention_mask)
    if adapter_kind == "autoregressive":
        return decode_causal_lm(loaded, input_ids, config, attention_mask=attention_mask)
    if loaded.causal:
        from sampler.autoregressive import generate_autoregressive

        return generate_autoregressive(loaded.model, input_ids, config, attention_mask=attention_mask)
    return generate(loaded.model, input_ids, config, attention_mask=attention_mask, **options)


def sampler_ids(loaded: Any) -> dict[str, int | None]:
    """The token ids a SamplerConfig for `loaded` must carry: its own mask, EOS and EoT (EoT may be None).
    A model without a mask token (a Hugging Face causal LM) leaves `mask_id` at the config's default."""
    ids = {"mask_id": loaded.mask_id, "eos_id": loaded.eos_id, "eot_id": loaded.eot_id}
    return {k: v for k, v in ids.items() if v is not None or k == "eot_id"}
