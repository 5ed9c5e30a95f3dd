"""Seeded blocks (Nemotron-Labs-Diffusion): a causal pass seeds each block, diffusion fills the rest of it.

The block decoder of sampler/block_diffusion.py reads this module when `BlockDiffusionConfig.canvas` is "seeded".
The prompt is encoded causally into the KV cache; its last position's prediction is the seed, the first token of
the first block. A block is `[seed, mask, ..., mask]` at the row's next positions; `mode` says how it is filled:

- `diffusion`: denoised in steps, bidirectionally over the cached prefix; each step samples every masked position
  and the commit rule chosen by `remasking` (sampler/masked_blocks.py's, SDAR's) picks which take their sample. Once
  full, the block is encoded causally, its last position giving the next seed.
- `self_speculative`: one bidirectional pass drafts every mask (argmax), one causal pass over `[seed, drafts]`
  verifies them: the causal prediction at index i is the token after it, so the drafts are kept while each equals
  the causal prediction before it; the row gains the seed and those drafts, and the causal prediction after the
  last kept one is the next seed. Rejected drafts' cache slots are masked out. Every kept token is the causal
  argmax of its prefix: the output is autoregressive greedy decoding's, in two passes per block (SGLang's
  LinearSpec, python/sglang/srt/dllm/algorithm/linear_spec.py, does the same).
- `autoregressive`: blocks of one position, so each causal pass adds one token.

The mask token is never proposed (as LinearSpec). Each row keeps its own positions and cache slots, so a row of a
left-padded batch decodes as it would alone (with `row_seeds` when sampling).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from sampler.masked_blocks import (
    MASKED_COMMITS,
    Draws,
    blocks_output,
    committed_step,
    end_at_eos,
    sample_block,
    transfer_counts,
)
from sampler.output import GenerateOutput, StepCallback

SEEDED_MODES = ("diffusion", "self_speculative", "autoregressive")


class SeededBlockModel(Protocol):
    """What this loop calls (Nemotron-Labs-Diffusion's adapter): a cache, causal passes that extend it, diffusion
    passes that read it, and dropping slots of rejected drafts."""

    canvas_length: int

    def new_cache(self) -> Any: ...

    def extend(
        self, input_ids: torch.Tensor, key_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        """Causal float32 logits `(batch, n, vocab)` of `input_ids` `(batch, n)`, whose keys join the cache."""

    def denoise(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        cache: Any,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Bidirectional float32 logits `(batch, L, vocab)` of the block `canvas`, reading (never writing) the cache;
        the last L columns of `attention_mask` mark the block's real keys."""

    def retract(self, cache: Any, keep: torch.Tensor) -> None:
        """Mask out the cache's last `keep.shape[1]` slots where `keep` `(batch, n)` is False."""


def no_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """`logits` with the mask token ruled out: it is never proposed."""
    return logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))


@torch.no_grad()
def generate_seeded_blocks(
    model: SeededBlockModel,
    input_ids: torch.Tensor,
    config: Any,  # a BlockDiffusionConfig with canvas "seeded"
    draws: Draws,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
) -> GenerateOutput:
    """`config.max_new_tokens` tokens after each row of `input_ids` `(batch, prompt_len)`, a seeded block at a time.

    Returns sequences `(batch, prompt_len + max_new_tokens)`: the prompt as given, then each row's tokens (after an
    EOS, `pad_id`). `nfe` counts every forward: the prompt's, each block's denoising steps (or its draft) and its
    causal pass."""
    if config.mask_id is None:
        raise ValueError("BlockDiffusionConfig.mask_id is required by the seeded canvas (the model's mask token)")
    device, (B, P) = input_ids.device, input_ids.shape
    L = 1 if config.mode == "autoregressive" else model.canvas_length
    mask = torch.ones(B, P, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.bool()
    G, mask_id = config.max_new_tokens, config.mask_id
    answer = torch.full((B, G + L), config.pad_id if config.pad_id is not None else mask_id, device=device)
    eos = torch.tensor(config.eos_ids, dtype=torch.long, device=device)
    commit = MASKED_COMMITS[config.remasking]()
    counts = transfer_counts(L - 1, min(config.max_denoising_steps, L - 1)) if L > 1 else []
    offsets = torch.arange(L, device=device)
    filled = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    cache = model.new_cache()
    logits = model.extend(input_ids, mask, (mask.long().cumsum(1) - 1).clamp(min=0), cache)
    seed = _propose(logits[:, -1:], config, draws, ~done)  # (B, 1)
    forwards = torch.ones(B, dtype=torch.int, device=device)
    nfe, block_nfe, following = 1, [], mask.long().sum(1)  # following: each row's next position
    keys = torch.ones(B, L, dtype=torch.bool, device=device)
    while not done.all():
        block = torch.full((B, L), mask_id, dtype=torch.long, device=device)
        block[:, :1] = seed
        pos = following[:, None] + offsets  # (B, L)
        live = ~done
        if config.mode == "self_speculative":
            draft = no_mask(model.denoise(block, None, cache, keys, pos), mask_id).argmax(-1)
            block[:, 1:] = draft[:, 1:]
            verify = no_mask(model.extend(block, keys, pos, cache), mask_id).argmax(-1)  # [i]: the token after i
            kept = (block[:, 1:] == verify[:, :-1]).long().cumprod(1).sum(1)  # (B,) drafts kept
            model.retract(cache, offsets[None] <= kept[:, None])
            take, seed, calls = kept + 1, verify.gather(1, kept[:, None]), 2
        else:
            block, calls = _denoise(model, block, cache, keys, pos, config, counts, commit, draws, done)
            take = torch.full((B,), L, device=device)
        forwards += live.int() * calls
        filled = _place(answer, block, take, filled, done)
        done |= end_at_eos(answer, filled, eos, config.pad_id) | (filled >= G)
        if config.mode != "self_speculative" and not done.all():
            logits = model.extend(block, keys, pos, cache)
            seed, calls = _propose(logits[:, -1:], config, draws, ~done), calls + 1
            forwards += ~done
        following = following + take
        nfe += calls
        block_nfe.append(calls)
        if on_step is not None:
            on_step(committed_step(nfe - 1, len(block_nfe) - 1, True, input_ids, answer, filled, G))
    return blocks_output(input_ids, answer, G, nfe, block_nfe, forwards, config.pad_id, L)


def _propose(logits: torch.Tensor, config: Any, draws: Draws, live: torch.Tensor) -> torch.Tensor:
    """Tokens `(B, n)` drawn from `logits` `(B, n, vocab)` (temperature 0: the argmax), never the mask token."""
    tokens, _ = sample_block(
        no_mask(logits, config.mask_id), config.temperature, config.top_k, config.top_p, draws, live
    )
    return tokens


def _denoise(
    model: SeededBlockModel,
    block: torch.Tensor,
    cache: Any,
    keys: torch.Tensor,
    pos: torch.Tensor,
    config: Any,
    counts: list[int],
    commit: Any,
    draws: Draws,
    done: torch.Tensor,
) -> tuple[torch.Tensor, int]:
    """Fill the masks of `block` `(B, L)` in `len(counts)` steps at most; (the block, the forwards it took)."""
    calls = 0
    for n in counts:
        masked = (block == config.mask_id) & ~done[:, None]
        live = masked.any(dim=1)
        if not live.any():
            break
        logits = no_mask(model.denoise(block, None, cache, keys, pos), config.mask_id)
        tokens, confidence = sample_block(logits, config.temperature, config.top_k, config.top_p, draws, live)
        block = torch.where(commit.select(confidence, masked, n, config.commit_threshold), tokens, block)
        calls += 1
    return block, calls


def _place(
    answer: torch.Tensor, block: torch.Tensor, take: torch.Tensor, filled: torch.Tensor, done: torch.Tensor
) -> torch.Tensor:
    """Copy each open row's first `take` tokens of `block` into `answer`; the rows' new filled lengths."""
    filled = filled.clone()
    for r in (~done).nonzero().flatten().tolist():
        n = int(take[r])
        answer[r, filled[r] : filled[r] + n] = block[r, :n]
        filled[r] += n
    return filled
