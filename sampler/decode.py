"""One decoding entry point over every kind of candidate, so evaluation and serving treat them alike.

`decode(handle, input_ids, config)` picks the decoder by `handle.kind` from one table (`DECODERS`):
unmask's masked-diffusion sampler, the block-diffusion sampler, or KV-cached autoregressive decoding.
`decode_prompts(handle, prompts, config)` is the one batch entry above it: token-id prompts left-padded
into one batch on the model's device (serving, measurement, the bench and the reproducibility probe use it).
The adapters (models/adapters) only load models and tokenize; decoding lives here, above them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from sampler.autoregressive import TokenSteps, causal_output, generate_autoregressive
from sampler.block_diffusion import BlockDiffusionConfig, generate_block_diffusion
from sampler.config import SamplerConfig
from sampler.effective import EffectiveConfig, effective_config
from sampler.generate import generate
from sampler.handle import Handle
from sampler.output import GenerateOutput, StepCallback


class DecodeError(ValueError):
    """A candidate that this config cannot decode; the message says why."""


def decode_masked_diffusion(
    handle: Handle,
    input_ids: torch.Tensor,
    config: SamplerConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """LLaDA-style models: the sampler with this model's own mask id."""
    if config.mask_id != handle.mask_id:
        raise DecodeError(
            f"SamplerConfig.mask_id={config.mask_id} but {handle.entry_id} masks with {handle.mask_id}; "
            f"build the config with handle.sampler_ids()"
        )
    return generate(
        handle.model, input_ids, config, attention_mask=attention_mask, on_step=on_step, row_seeds=row_seeds
    )


def decode_block_diffusion(
    adapter: Any,
    input_ids: torch.Tensor,
    config: EffectiveConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """DiffusionGemma-style uniform-state block diffusion, on the effective (block) config.

    `adapter` is a `Handle` that is also the loop's `BlockDenoiser` (DiffusionGemma's adapter)."""
    block = effective_config(adapter, config)
    assert isinstance(block, BlockDiffusionConfig), "a block-diffusion handle decodes a block config"
    return generate_block_diffusion(
        adapter, input_ids, block, attention_mask=attention_mask, on_step=on_step, row_seeds=row_seeds
    )


def decode_autoregressive(
    handle: Handle,
    input_ids: torch.Tensor,
    config: SamplerConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """unmask's own KV-cached decoder for the native causal layout (the bundled AR twin); transformers'
    cached `generate` for a Hugging Face causal LM."""
    if handle.native:
        return generate_autoregressive(
            handle.model, input_ids, config, attention_mask=attention_mask, on_step=on_step, row_seeds=row_seeds
        )
    if row_seeds is not None:
        raise DecodeError(
            f"{handle.entry_id}: transformers' generate draws from one global generator; "
            "per-row seeds are not supported"
        )
    return decode_causal_lm(handle, input_ids, config, attention_mask=attention_mask, on_step=on_step)


@torch.no_grad()
def decode_causal_lm(
    adapter: Handle,
    input_ids: torch.Tensor,
    config: SamplerConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
) -> GenerateOutput:
    """Up to `config.gen_length` new tokens through transformers' KV-cached generate; stopped rows pad with EOS.

    `config.temperature` 0 is greedy; above 0 samples from softmax(logits / temperature) with no
    top-k/top-p cut, seeded by `config.seed`. NFE is the number of forward passes (one per token).
    `on_step` receives a `sampler.output.StepInfo` per token, through a streamer; it does not change the output.
    """
    from transformers import GenerationConfig  # heavy, and only Hugging Face causal models need it

    B, P = input_ids.shape
    sample = config.temperature > 0
    gen = GenerationConfig(  # type: ignore[no-untyped-call]  # transformers leaves GenerationConfig() unannotated
        max_new_tokens=config.gen_length,
        do_sample=sample,
        temperature=config.temperature if sample else None,
        top_k=None,
        top_p=None,
        eos_token_id=list(adapter.eos_ids) or None,
        pad_token_id=adapter.pad_id,
        use_cache=True,
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


def decode_api(
    adapter: Any,
    input_ids: torch.Tensor,
    config: EffectiveConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
) -> GenerateOutput:
    adapter.status_or_raise()  # a missing key is the first thing to report
    raise DecodeError(f"model '{adapter.entry_id}' is an API model: it takes text, not token ids; use complete()")


# No tokenizer packs more characters than this into one token of ordinary text: a prompt longer than
# this many characters per position of the context cannot fit, and is refused before it is tokenised.
CHARS_PER_TOKEN_BOUND = 16


def context_length(handle: Any) -> int | None:
    """The longest canvas (prompt + generated positions) the model was trained on (`Handle.context_length`);
    None when it does not say, or for a handle with no network (an API model)."""
    return getattr(handle, "context_length", None)


def check_prompt_text(handle: Any, text: str) -> None:
    """Refuse, without tokenising it, a prompt too long for the context whatever the tokenizer does."""
    limit = context_length(handle)
    if limit and len(text) > CHARS_PER_TOKEN_BOUND * limit:
        raise DecodeError(
            f"the prompt has {len(text)} characters; {getattr(handle, 'entry_id', 'the model')}'s "
            f"max_sequence_length is {limit} tokens, so it cannot fit; shorten the prompt"
        )


def fits_context(context: int | None, prompt_length: int, gen_length: int) -> bool:
    """The prompt-fits rule: prompt and generated positions within the model's context (None: it does not say)."""
    return not context or prompt_length + gen_length <= context


def check_fits(handle: Any, prompt_length: int, gen_length: int) -> None:
    """Prompt and generated positions must fit in the model's context (beyond it RoPE extrapolates, or
    a learned position table has no row: garbage or an IndexError, never a measurement)."""
    limit = context_length(handle)
    if not fits_context(limit, prompt_length, gen_length):
        raise DecodeError(
            f"prompt ({prompt_length} tokens) + gen_length {gen_length} = {prompt_length + gen_length} "
            f"exceeds {getattr(handle, 'entry_id', 'the model')}'s max_sequence_length {limit}; "
            f"shorten the prompt or lower gen_length"
        )


DECODERS: dict[str, Callable[..., GenerateOutput]] = {
    "masked-diffusion": decode_masked_diffusion,
    "block-diffusion": decode_block_diffusion,
    "autoregressive": decode_autoregressive,
    "api": decode_api,
}


def row_seeded(handle: Handle) -> bool:
    """Whether `decode(..., row_seeds=...)` can give each row of a batch of `handle` its own generator."""
    return handle.masked_diffusion or handle.block_diffusion or (handle.causal and handle.native)


def is_deterministic(config: Any, kind: str = "masked-diffusion") -> bool:
    """No random draw reads the seed: greedy proposals and policies that draw nothing (`SamplerConfig.draws`).
    Block diffusion always draws (uniform noise, sampled canvases), whatever `temperature` says."""
    return kind != "block-diffusion" and not config.draws


def batch_row_seeds(handle: Handle, config: Any, seeds: list[int | None]) -> list[int] | None:
    """The per-row seeds a batch decodes with, as `unmask serve` batches (and the reproducibility probe checks):
    each row's own where the decode draws and `handle`'s decoder seeds rows, so a row draws what it would draw
    alone; None where no draw reads a seed, where the decoder has one generator for the batch (transformers'
    generate: a sampled request then decodes alone), or where a row has no seed (torch's global generator)."""
    if is_deterministic(config, handle.kind) or not row_seeded(handle) or None in seeds:
        return None
    return [s for s in seeds if s is not None]


def decode(
    handle: Handle,
    input_ids: torch.Tensor,
    config: EffectiveConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """Continue `input_ids` `(batch, prompt_len)` with the decoder of `handle.kind` (`models.load` gives handles).

    All kinds return the same `GenerateOutput` layout; `on_step` is told each decoding step (a
    `sampler.output.StepInfo`) and never changes the output. `config` is a SamplerConfig (a block-diffusion
    model turns it into its effective block config) or, for block diffusion, a BlockDiffusionConfig.
    `row_seeds` (where `row_seeded(handle)`): one seed per row in place of `config.seed`, so a sampled
    row decodes as it would alone.
    """
    try:
        decoder = DECODERS[handle.kind]
    except KeyError:
        raise DecodeError(f"no decoder for kind {handle.kind!r}; known: {', '.join(DECODERS)}") from None
    backend = getattr(config, "backend", "torch")  # a BlockDiffusionConfig has none: torch
    if handle.kind != "masked-diffusion" and backend != "torch":
        raise DecodeError(
            f"backend {backend!r} runs the masked-diffusion sampler only; {handle.kind} models decode with torch"
        )
    if handle.kind != "api":
        check_fits(handle, input_ids.shape[1], config.gen_length)
    if row_seeds is not None:
        if not row_seeded(handle):
            raise DecodeError(
                f"{handle.kind} decoding of {getattr(handle, 'entry_id', handle.kind)} cannot take per-row seeds"
            )
        if len(row_seeds) != input_ids.shape[0]:
            raise DecodeError(f"row_seeds: {len(row_seeds)} seeds for {input_ids.shape[0]} rows")
        return decoder(handle, input_ids, config, attention_mask=attention_mask, on_step=on_step, row_seeds=row_seeds)
    return decoder(handle, input_ids, config, attention_mask=attention_mask, on_step=on_step)


def padding_id(handle: Handle) -> int:
    """The id that left-pads a batch: the model's pad, else its EOS, else 0 (masked out either way)."""
    return next((i for i in (handle.pad_id, handle.eos_id) if i is not None), 0)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(batch, longest)` ids and attention mask; the mask is None when no row needs padding."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids, (None if bool(mask.all()) else mask)


def decode_prompts(
    handle: Handle,
    prompts: list[list[int]],
    config: EffectiveConfig,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """Decode token-id `prompts` (no padding) as one batch: left-padded to the longest (`padding_id`), on the
    model's device, through `decode`. With `row_seeds` (each row its own generator: `batch_row_seeds`), or a
    decode that draws nothing, the sampler is batch invariant under left padding: each row is what it would be
    alone. Without them a block-diffusion batch is transformers' generate: one generator over the whole batch
    and positions shared across rows, so a row depends on its neighbours."""
    ids, mask = left_pad(prompts, padding_id(handle))
    device = next(handle.model.parameters()).device
    return decode(
        handle,
        ids.to(device),
        config,
        attention_mask=None if mask is None else mask.to(device),
        on_step=on_step,
        row_seeds=row_seeds,
    )
