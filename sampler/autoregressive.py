"""Greedy or temperature decoding for the causal AR twin, with a KV cache.

It returns the diffusion sampler's `GenerateOutput`, so evaluation treats both kinds alike:
`sequences` is the prompt followed by `config.gen_length` positions (EOS after a row has stopped)
and `nfe` counts forward calls (one for the prompt, one per new token). Each new token is one
step for an `on_step` callback, and `block_length` tokens make a block.
"""

from __future__ import annotations

import torch

from sampler.backends import torch_backend
from sampler.config import SamplerConfig
from sampler.generate import check_inputs, make_generator
from sampler.output import AutoregressiveStats, GenerateOutput, StepCallback, StepInfo
from sampler.proposal import add_gumbel_noise, check_logits
from sampler.rng import RowGenerators


def token_step(
    step: int,
    sequences: torch.Tensor,
    live: torch.Tensor,
    block_length: int,
    last: bool,
    logits: torch.Tensor | None = None,
) -> StepInfo:
    """The StepInfo of new token `step`, the last column of `sequences` `(batch, prompt_len + step + 1)`.

    live (`(batch,)` bool): rows that had not ended before it (the others only pad). `last`: every row
    has ended, which finishes every block at once, as an early exit does in the diffusion sampler.
    logits (`(batch, vocab)`): the next-token logits the token was drawn from, when the decoder has them.
    """
    committed = torch.zeros_like(sequences, dtype=torch.bool)
    committed[:, -1] = live
    return StepInfo(
        step=step,
        block=step // block_length,
        block_done=last or (step + 1) % block_length == 0,
        sequences=sequences,
        committed=committed,
        logits=None if logits is None else logits[:, None],
        logits_lo=sequences.shape[1] - 1,
    )


def causal_output(sequences: torch.Tensor, prompt_length: int, forwards: int, config: SamplerConfig) -> GenerateOutput:
    """The GenerateOutput of a causal decoder that ran `forwards` calls, one token each."""
    bl = config.block_length
    block_nfe = [bl] * (forwards // bl) + ([forwards % bl] if forwards % bl else [])
    return GenerateOutput(
        sequences=sequences,
        prompt_length=prompt_length,
        nfe=forwards,
        sequential_calls=forwards,
        block_nfe=block_nfe,
        tokens_per_forward=1.0,
        autoregressive=AutoregressiveStats(stopped_early=forwards < config.gen_length),
    )


@torch.no_grad()
def generate_autoregressive(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    config: SamplerConfig,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
    row_seeds: list[int] | None = None,
) -> GenerateOutput:
    """Decode up to `config.gen_length` tokens after `input_ids` `(batch, prompt_len)`, left-padded
    rows marked by `attention_mask`; stops once every row has produced EOS (or EoT). `on_step`
    receives a StepInfo per token; it does not change the output. `row_seeds` (one per row) gives
    each row its own generator, so a sampled row decodes as it would alone with that seed. `config.compile`
    runs the module through torch.compile (`sampler.backends`), as the diffusion sampler does."""
    check_inputs(input_ids, config, attention_mask)
    model, _ = torch_backend(model, config)  # compile=True compiles the causal twin as it does the denoiser
    B, P = input_ids.shape
    device = input_ids.device
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    generator = make_generator(config.seed, device) if row_seeds is None else RowGenerators(row_seeds, [0] * B, device)
    stop_ids = torch.tensor([config.eos_id] + ([config.eot_id] if config.eot_id is not None else []), device=device)
    out = torch.full((B, config.gen_length), config.eos_id, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    step_input, mask = input_ids, attention_mask
    nfe = 0
    for i in range(config.gen_length):
        result = model(step_input, attention_mask=mask, past_key_values=cache, use_cache=True)
        nfe += 1
        # The model returns keys/values of this call only; the cache is their concatenation.
        new = result.past_key_values
        cache = (
            new
            if cache is None
            else [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(cache, new)]
        )
        logits = result.logits[:, -1]  # (B, V)
        check_logits(logits, f"token {i}")
        token = torch.argmax(add_gumbel_noise(logits, config.temperature, generator), dim=-1)  # (B,)
        token = torch.where(done, torch.full_like(token, config.eos_id), token)
        out[:, i] = token
        live = ~done
        done |= torch.isin(token, stop_ids)
        finished = bool(done.all())
        if on_step is not None:
            on_step(
                token_step(
                    i, torch.cat([input_ids, out[:, : i + 1]], dim=1), live, config.block_length, finished, logits
                )
            )
        if finished:
            break
        step_input = token[:, None]  # (B, 1)
        mask = torch.cat([mask, mask.new_ones(B, 1)], dim=1)
    return causal_output(torch.cat([input_ids, out], dim=1), P, nfe, config)


class TokenSteps:
    """A transformers streamer (`put`, `end`) that reports each token `generate` adds as a StepInfo.

    transformers puts the prompt `(batch, prompt_len)` first, then every step's tokens `(batch,)` on
    the CPU, the pad id in rows that have ended (assisted decoding may put `(batch, n)` at once).
    """

    def __init__(self, on_step: StepCallback, stop_ids: tuple[int, ...], block_length: int):
        self.on_step, self.block_length = on_step, block_length
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long)
        self.sequences: torch.Tensor | None = None
        self.done: torch.Tensor | None = None
        self.steps = 0

    def put(self, value: torch.Tensor) -> None:
        if self.sequences is None:
            self.sequences, self.done = value, torch.zeros(value.shape[0], dtype=torch.bool)
            return
        assert self.done is not None, "set with sequences by the first put"
        for token in (value if value.dim() == 2 else value[:, None]).unbind(dim=1):
            live = ~self.done
            self.done = self.done | torch.isin(token, self.stop_ids)
            self.sequences = torch.cat([self.sequences, token[:, None]], dim=1)
            self.on_step(token_step(self.steps, self.sequences, live, self.block_length, bool(self.done.all())))
            self.steps += 1

    def end(self) -> None:
        pass
