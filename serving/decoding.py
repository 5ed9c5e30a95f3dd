"""From a request to the SamplerConfig that decodes it, and from generated tokens back to a choice.

The alias's operating point (the gate-chosen config) is the base; a request may override
`max_tokens`, `temperature`, `seed` and, under `unmask`, the diffusion settings. A masked-diffusion
model keeps the operating point's steps per block when only `max_tokens` changes, and decodes whole
blocks: the canvas is `max_tokens` rounded up to the block length, and the answer is cut at
`max_tokens` tokens. An autoregressive model reads only the length, temperature and seed.

A block-diffusion model (DiffusionGemma) is served through the same SamplerConfig with its canvas as
the block: `max_tokens` rounds up to whole canvases, the operating point's denoising steps per canvas
hold, and `seed` seeds the row's own generator. It always samples (its temperature schedule is the
model's `t_min`..`t_max`), so a request's `temperature` is not read, and of the `unmask` settings
only `steps` is; the effective BlockDiffusionConfig is derived from the config as in evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeGuard, cast

from sampler.block_diffusion import BlockDiffusionConfig
from sampler.config import SamplerConfig
from sampler.decode import is_deterministic
from sampler.effective import block_config_for, config_from_dict
from sampler.handle import Handle

# The kinds this server decodes.
SERVED_KINDS = ("masked-diffusion", "autoregressive", "block-diffusion")
BLOCK = "block-diffusion"
# What a block-diffusion request may set under `unmask` (the rest is the model's own decoding defaults).
_BLOCK_SETTINGS = ("steps",)
# Settings a greedy decode never reads: two greedy requests that differ only here decode alike.
_UNREAD_WHEN_GREEDY = ("seed",)


class ServedHandle(Handle, Protocol):
    """A Handle as the server loads it (`models.load`: models/adapters' ModelHandle): its folder, its weights'
    digest and the catalog's decoding defaults too."""

    path: Path | None
    defaults: dict[str, Any]  # the catalog's decoding defaults (empty for a plain folder)

    @property
    def weights_sha256(self) -> str: ...


class BlockHandle(ServedHandle, Protocol):
    """A block-diffusion handle (DiffusionGemma): its canvas is the block."""

    canvas_length: int


def is_block(handle: ServedHandle) -> TypeGuard[BlockHandle]:
    """Whether `handle` decodes block diffusion (only those handles have a `canvas_length`)."""
    return handle.kind == BLOCK


class RequestError(ValueError):
    """A request the server refuses: `param` names the field (OpenAI's error `param`), 400 unless `status` says."""

    def __init__(self, param: str | None, message: str, status: int = 400, code: str = "invalid_request"):
        super().__init__(message)
        self.param, self.message, self.status, self.code = param, message, status, code


@dataclass(frozen=True)
class Limits:
    """What one request may ask for."""

    max_tokens: int | None = None  # the largest max_tokens (and canvas) a request may decode; None: the context's room
    max_prompt_tokens: int = 384
    max_prompt_chars: int = 16_384  # checked before tokenizing, so a huge body costs nothing


def operating_config(handle: ServedHandle, recorded: dict[str, Any] | None) -> tuple[SamplerConfig, str]:
    """The base config of a served name: the recorded operating point, else the catalog's decoding defaults;
    with the model's own mask/EOS/EoT ids. Returns (config, where it came from)."""
    if recorded:
        config = config_from_dict(recorded)
        if isinstance(config, BlockDiffusionConfig):
            # a block config is recorded only by evaluating a block-diffusion model, so `handle` is one
            config = block_operating(cast(BlockHandle, handle), config)
        source = "operating point"
    else:
        known = {"gen_length", "block_length", "steps", "temperature", "remasking", "parallel", "top_k"}
        if is_block(handle):  # these are block-loop settings there (BlockDiffusionConfig's, sampler.effective)
            known -= {"temperature", "remasking", "parallel", "top_k"}
        try:
            config = SamplerConfig(**{k: v for k, v in handle.defaults.items() if k in known})
        except ValueError as e:  # e.g. a `parallel` no commit rule has: the catalog is where to fix it
            raise ValueError(f"the catalog's decoding of {handle.entry_id}: {e}") from None
        source = "catalog defaults"
    config = config.with_(**handle.sampler_ids())
    if handle.causal:
        config = autoregressive(config, config.gen_length)
    if is_block(handle) and config.block_length != handle.canvas_length:
        L = handle.canvas_length  # the canvas is the block; keep the steps per token
        canvases = math.ceil(config.gen_length / L)
        config = config.with_(
            gen_length=canvases * L,
            block_length=L,
            steps=canvases * max(1, config.steps_per_block * L // config.block_length),
        )
    return config, source


def block_operating(handle: BlockHandle, recorded: BlockDiffusionConfig) -> SamplerConfig:
    """The SamplerConfig whose effective block config is the recorded one; ValueError when none is (settings
    the request surface cannot carry, such as an entropy bound other than the model's default)."""
    L = handle.canvas_length
    canvases = math.ceil(recorded.max_new_tokens / L)
    config = SamplerConfig(
        gen_length=canvases * L, block_length=L, steps=canvases * recorded.max_denoising_steps, seed=recorded.seed
    ).with_(**handle.sampler_ids())
    derived = block_config_for(handle, config)
    if derived.to_dict() | {"max_new_tokens": recorded.max_new_tokens} != recorded.to_dict():
        differs = sorted(
            k for k, v in recorded.to_dict().items() if derived.to_dict()[k] != v and k != "max_new_tokens"
        )
        raise ValueError(
            f"operating config {recorded.to_dict()!r}: {', '.join(differs)} differ from "
            f"{handle.entry_id}'s decoding defaults; the server cannot decode it as recorded"
        )
    return config


def autoregressive(config: SamplerConfig, gen_length: int) -> SamplerConfig:
    """An AR decode reads only length, temperature and seed; one block keeps SamplerConfig's checks happy."""
    return config.with_(gen_length=gen_length, block_length=gen_length, steps=gen_length)


def request_config(
    base: SamplerConfig,
    kind: str,
    max_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    unmask: dict[str, Any],
    limits: Limits,
) -> tuple[SamplerConfig, int]:
    """(config to decode, tokens to keep) for a request over `base`; RequestError names a field that cannot work.
    `limits.max_tokens` is set: the caller bounds it (serving.local.bounded)."""
    limit = limits.max_tokens
    assert limit is not None, "request_config needs a bounded max_tokens (serving.local.bounded)"
    if max_tokens is not None and max_tokens > limit:
        raise RequestError("max_tokens", f"max_tokens={max_tokens} is above this server's limit of {limit}")
    changes: dict[str, Any] = {}
    if temperature is not None:
        changes["temperature"] = temperature
    if seed is not None:
        changes["seed"] = seed
    if kind == "autoregressive":
        keep = max_tokens or base.gen_length
        config = autoregressive(base.with_(**changes), keep)
    elif kind == BLOCK:
        unread = sorted(set(unmask) - set(_BLOCK_SETTINGS))
        if unread:
            raise RequestError(
                f"unmask.{unread[0]}",
                f"unmask.{unread[0]} is not read by block diffusion; of the "
                f"unmask settings it reads only {', '.join(_BLOCK_SETTINGS)}",
            )
        changes.pop("temperature", None)  # the model's own temperature schedule decodes
        config, keep = _diffusion(base, max_tokens, changes | unmask)
    else:
        config, keep = _diffusion(base, max_tokens, changes | unmask)
    if config.gen_length > limit:
        raise RequestError(
            "max_tokens",
            f"decoding {keep} tokens needs a canvas of {config.gen_length} "
            f"(whole blocks of {config.block_length}), above this server's limit of {limit}",
        )
    if is_deterministic(config, kind):
        config = config.with_(**{k: getattr(base, k) for k in _UNREAD_WHEN_GREEDY})
    return config, keep


def _diffusion(base: SamplerConfig, max_tokens: int | None, changes: dict[str, Any]) -> tuple[SamplerConfig, int]:
    block = changes.get("block_length", base.block_length)
    keep = max_tokens or base.gen_length
    gen_length = math.ceil(keep / block) * block
    blocks = gen_length // block
    if "steps" in changes:
        if changes["steps"] % blocks:
            raise RequestError(
                "unmask.steps",
                f"unmask.steps={changes['steps']} must be a multiple of the number of "
                f"blocks ({gen_length} // {block} = {blocks})",
            )
    else:
        # a new block length keeps the operating point's steps per token
        per_block = max(1, base.steps_per_block * block // base.block_length)
        changes["steps"] = per_block * blocks
    try:
        return base.with_(**changes, gen_length=gen_length), keep
    except ValueError as e:  # SamplerConfig names its own field; the request knows it under `unmask`
        field = str(e).split("SamplerConfig.", 1)[-1].split(" ", 1)[0].split("=", 1)[0]
        raise RequestError(f"unmask.{field}" if field in changes else None, str(e)) from None


def batch_key(config: SamplerConfig, row_seeded: bool = False, kind: str = "masked-diffusion") -> str | None:
    """Requests with equal keys may share a batch; None: decode alone.

    A sampled decode shares a batch only where the decoder gives each row its own generator
    (`row_seeded`, `sampler.decode.row_seeded`): then requests that differ only in their seed batch,
    each row drawing from its own seed as it would alone. Otherwise one generator serves the whole
    batch, a row's draws would depend on its neighbours, and a sampled request decodes alone.
    """
    if is_deterministic(config, kind):
        return config.hash()
    if row_seeded and config.seed is not None:
        return "row-seeded-" + config.with_(seed=0).hash()
    return None


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text before the earliest stop sequence, and whether one was found."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def choice_of(handle: Handle, generated: list[int], keep: int, stops: list[str]) -> dict[str, Any]:
    """text, finish_reason ('stop' at a stop id or sequence, else 'length') and completion token count."""
    tokens = generated[:keep]
    useful = handle.useful_length(tokens)
    text, stopped = cut_at_stop(handle.decode(tokens[:useful]), stops)
    return {
        "text": text,
        "finish_reason": "stop" if stopped or useful < len(tokens) else "length",
        "completion_tokens": len(handle.encode(text)) if stopped else useful,
    }
