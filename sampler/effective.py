"""What each model kind reads of the requested settings, and the effective config that really decodes.

A `SamplerConfig` is what a user asks for. A masked-diffusion model reads all of it; the
autoregressive decoders read only `gen_length`, `temperature` and `seed`; the block-diffusion
sampler reads `gen_length`, `steps` and `seed` and takes the rest (entropy bound, temperature
schedule, stopping thresholds; for SDAR's masked canvas its commit rule, threshold and sampling) from the model's
catalog defaults. `effective_config` turns the
request into the config that decodes; records, cache keys and dossiers hold that one and its hash,
so changing a catalog default changes the hash and re-measures.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from sampler.block_diffusion import MASKED_LOOPS, BlockDiffusionConfig
from sampler.config import SamplerConfig

EffectiveConfig = SamplerConfig | BlockDiffusionConfig

# The SamplerConfig settings each kind reads; a kind not listed (masked diffusion) reads every one.
SETTINGS_READ: dict[str, frozenset[str]] = {
    "autoregressive": frozenset({"gen_length", "temperature", "seed"}),
    "block-diffusion": frozenset({"gen_length", "steps", "seed"}),
    "api": frozenset({"gen_length", "temperature"}),  # max_tokens and temperature of an OpenAI-compatible request
}
# Catalog decoding defaults the block sampler takes in place of SamplerConfig fields.
BLOCK_DEFAULTS = ("entropy_bound", "t_min", "t_max", "stability_threshold", "confidence_threshold")
# ... and, for a model decoded on the masked canvas (SDAR: `canvas: masked`), these.
# (Nemotron-Labs-Diffusion's `canvas: seeded` reads them too, and its `mode`.)
MASKED_DEFAULTS = ("canvas", "remasking", "commit_threshold", "temperature", "top_k", "top_p", "mask_id", "mode")


def settings_read(kind: str) -> frozenset[str] | None:
    """The SamplerConfig settings a model of `kind` reads; None: all of them."""
    return SETTINGS_READ.get(kind)


def block_config_for(handle: Any, config: SamplerConfig) -> BlockDiffusionConfig:
    """gen_length -> new tokens, steps spread over the model's canvases, seed; the catalog's defaults
    (`handle.defaults`) supply the entropy bound, temperature schedule and stopping thresholds."""
    canvases = math.ceil(config.gen_length / handle.canvas_length)
    read = BLOCK_DEFAULTS + (MASKED_DEFAULTS if handle.defaults.get("canvas") in MASKED_LOOPS else ())
    return BlockDiffusionConfig(
        max_new_tokens=config.gen_length,
        max_denoising_steps=max(1, config.steps // canvases),
        eos_ids=tuple(handle.eos_ids),
        pad_id=handle.pad_id,
        seed=config.seed,
        **{k: handle.defaults[k] for k in read if k in handle.defaults},
    )


def effective_config(handle: Any, config: EffectiveConfig) -> EffectiveConfig:
    """The config that decodes `config` on `handle` (a block config for block diffusion; else as given)."""
    if isinstance(config, BlockDiffusionConfig) or handle.kind != "block-diffusion":
        return config
    return block_config_for(handle, config)


def config_from_dict(data: dict[str, Any]) -> EffectiveConfig:
    """A SamplerConfig or BlockDiffusionConfig from its `to_dict()` form (told apart by their fields)."""
    block_fields = {f.name for f in fields(BlockDiffusionConfig)}
    if "max_denoising_steps" in data:
        unknown = sorted(set(data) - block_fields)
        if unknown:
            raise ValueError(
                f"BlockDiffusionConfig: unknown setting '{unknown[0]}'; known: {', '.join(sorted(block_fields))}"
            )
        return BlockDiffusionConfig(**(data | {"eos_ids": tuple(data.get("eos_ids") or ())}))
    return SamplerConfig.from_dict(data)
