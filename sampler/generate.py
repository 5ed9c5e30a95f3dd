"""The diffusion sampler: LLaDA's semi-autoregressive masked decoding, token-exact.

The loop owns the canvas, the blocks and the model calls; what varies (which tokens to commit,
how many, how confident) lives in small objects chosen by the SamplerConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sampler.config import SamplerConfig
from sampler.proposal import check_logits, propose
from sampler.remasking import remasking_policy
from sampler.schedule import UniformTransferSchedule


class Denoiser(Protocol):
    """Hugging Face convention: `model(input_ids, attention_mask=None).logits` `(batch, seq, vocab)`."""

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> Any: ...


@dataclass
class GenerateOutput:
    """sequences (`torch.LongTensor` of shape `(batch, prompt_len + gen_length)`): prompt + generation."""

    sequences: torch.Tensor
    prompt_length: int
    nfe: int  # model calls; a CFG step's batched (cond + uncond) call counts once
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def generated(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_length :]


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A private generator for a seed (same stream as `torch.manual_seed(seed)` on CPU), else the global one."""
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)


def guided_logits(
    model: Denoiser, x: torch.Tensor, attention_mask, prompt_index: torch.Tensor, cfg_scale: float, mask_id: int
) -> torch.Tensor:
    """One model call; with CFG, the conditional and prompt-masked rows go in one batch."""
    if cfg_scale <= 0:
        return model(x, attention_mask=attention_mask).logits
    un_x = x.clone()
    un_x[prompt_index] = mask_id
    both = torch.cat([x, un_x], dim=0)
    mask2 = None if attention_mask is None else torch.cat([attention_mask, attention_mask], dim=0)
    cond, uncond = torch.chunk(model(both, attention_mask=mask2).logits, 2, dim=0)
    return uncond + (cfg_scale + 1) * (cond - uncond)


def check_inputs(input_ids: torch.Tensor, config: SamplerConfig, attention_mask: torch.Tensor | None) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape (batch, prompt_len), got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}"
        )


@torch.no_grad()
def generate(
    model: Denoiser,
    input_ids: torch.Tensor,
    config: SamplerConfig,
    attention_mask: torch.Tensor | None = None,
) -> GenerateOutput:
    """Fill `config.gen_length` masked positions after `input_ids` `(batch, prompt_len)`, block by block.

    Masks inside the prompt (infilling) are decoded too, as in the reference: they compete with
    the current block's masks for each step's commits.
    """
    check_inputs(input_ids, config, attention_mask)
    device = input_ids.device
    B, P = input_ids.shape
    x = torch.full((B, P + config.gen_length), config.mask_id, dtype=torch.long, device=device)
    x[:, :P] = input_ids
    if attention_mask is not None:
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, config.gen_length)], dim=-1)
    prompt_index = x != config.mask_id
    generator = make_generator(config.seed, device)
    policy = remasking_policy(config.remasking)
    schedule = UniformTransferSchedule()
    nfe = 0
    for b in range(config.num_blocks):
        start, end = P + b * config.block_length, P + (b + 1) * config.block_length
        counts = schedule.counts(x[:, start:end] == config.mask_id, config.steps_per_block)  # (B, s)
        for i in range(config.steps_per_block):
            mask_index = x == config.mask_id
            logits = guided_logits(model, x, attention_mask, prompt_index, config.cfg_scale, config.mask_id)
            nfe += 1
            check_logits(logits, f"block {b} step {i}")
            x0, confidence = propose(logits, config, policy, generator)
            confidence[:, end:] = -torch.inf  # nothing beyond the current block
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, confidence, -torch.inf)
            commit = commit_top_k(confidence, counts[:, i])
            x[commit] = x0[commit]
    return GenerateOutput(sequences=x, prompt_length=P, nfe=nfe)


def commit_top_k(confidence: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Boolean `(batch, seq)`: per row, the `k[row]` most confident positions."""
    commit = torch.zeros_like(confidence, dtype=torch.bool)
    for j in range(confidence.shape[0]):
        _, index = torch.topk(confidence[j], k=int(k[j]))
        commit[j, index] = True
    return commit
