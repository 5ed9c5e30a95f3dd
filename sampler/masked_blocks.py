"""Masked block diffusion (SDAR): each block starts as mask tokens and is unmasked over a few steps, blocks in order.

The block decoder of sampler/block_diffusion.py reads this module when `BlockDiffusionConfig.canvas` is "masked".
Blocks sit on each row's own positions (0, L, 2L, ...), so the prompt's last `len % L` tokens share the first
block with the first generated ones; the prompt's whole blocks are encoded into the cache first, and each block,
once no mask is left, is encoded after them. A step samples every position of the block (temperature, top-k,
top-p; temperature 0 takes the argmax), then the commit rule chosen by `remasking` picks which masked positions
take their sample: the `n` most confident (`low_confidence_static`), every one above `commit_threshold` and at
least `n` (`low_confidence_dynamic`), or the `n` leftmost (`sequential`), with `n` the step's share of the block.
Token-exact with SDAR's own `block_diffusion_generate` (JetAstra/SDAR generate.py) for one row after
`torch.manual_seed(seed)`; with `row_seeds`, each row of a left-padded batch decodes as it would alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from sampler.output import BlockDiffusionStats, GenerateOutput, StepCallback, StepInfo


class Draws(Protocol):
    """`sampler.block_diffusion.BatchDraws` or `RowDraws`: one categorical draw per position of the live rows."""

    def categorical(self, probs: torch.Tensor, live: torch.Tensor) -> torch.Tensor: ...


def transfer_counts(block_length: int, steps: int) -> list[int]:
    """How many masked positions each step commits: the block split evenly, the remainder on the first steps."""
    base, extra = divmod(block_length, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """`(n, vocab)` logits tempered, then cut to the top k and the smallest set over probability p (-inf elsewhere)."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1, None]  # k above the vocabulary: all
        logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        beyond = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1) > top_p
        beyond[..., 1:] = beyond[..., :-1].clone()  # keep the token that crosses p
        beyond[..., 0] = False
        cut = torch.scatter(torch.zeros_like(beyond), -1, order, beyond)
        logits = logits.masked_fill(cut, float("-inf"))
    return logits


def sample_block(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, draws: Draws, live: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, their probability), both `(batch, L)`, for block logits `(batch, L, vocab)`.

    Temperature 0 takes the argmax with its softmax probability and draws nothing."""
    B, L, V = logits.shape
    if temperature == 0:
        probs = F.softmax(logits, dim=-1)
        tokens = probs.argmax(dim=-1)
        return tokens, torch.gather(probs, -1, tokens[..., None]).squeeze(-1)
    probs = F.softmax(filter_logits(logits.reshape(B * L, V), temperature, top_k, top_p), dim=-1).view(B, L, V)
    tokens = draws.categorical(probs, live)
    return tokens, torch.gather(probs, -1, tokens[..., None]).squeeze(-1)


class LowConfidenceStatic:
    """The `n` masked positions whose sampled token is most probable."""

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, n: int, threshold: float) -> torch.Tensor:
        return _top(confidence, masked, n)


class LowConfidenceDynamic:
    """Every masked position above `threshold`, if at least `n` are; else the `n` most probable."""

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, n: int, threshold: float) -> torch.Tensor:
        high = masked & (confidence > threshold)
        enough = high.sum(dim=1, keepdim=True) >= n
        return torch.where(enough, high, _top(confidence, masked, n))


class Sequential:
    """The `n` leftmost masked positions."""

    def select(self, confidence: torch.Tensor, masked: torch.Tensor, n: int, threshold: float) -> torch.Tensor:
        return masked & (masked.long().cumsum(dim=1) <= n)


def _top(confidence: torch.Tensor, masked: torch.Tensor, n: int) -> torch.Tensor:
    """Per row, the `n` most confident masked positions (all of them when fewer are left).

    SDAR's loop asks `topk` for `n` even when fewer masks are left, which then rewrites committed (or prompt)
    positions with fresh samples; here a step commits masks only."""
    scores = torch.where(masked, confidence, -torch.inf)
    picked = torch.zeros_like(masked)
    for row, left in enumerate(masked.sum(dim=1).tolist()):
        if left:
            picked[row, torch.topk(scores[row], min(n, left)).indices] = True
    return picked


MASKED_COMMITS: dict[str, type] = {
    "low_confidence_static": LowConfidenceStatic,
    "low_confidence_dynamic": LowConfidenceDynamic,
    "sequential": Sequential,
}


@dataclass(frozen=True)
class PromptLayout:
    """Where each row's prompt goes: its whole blocks into the cache first, the rest into the first block.

    prefix `(batch, H)`: each row's whole prompt blocks, right-aligned (left padding, a multiple of L);
    prefix_mask `(batch, H)`; tails `(batch,)`: prompt tokens that open the first block; starts `(batch,)`:
    each row's position of its first block."""

    prefix: torch.Tensor
    prefix_mask: torch.Tensor
    first: torch.Tensor  # (batch, L): the prompt tail, then mask ids
    tails: torch.Tensor
    starts: torch.Tensor

    @classmethod
    def of(cls, input_ids: torch.Tensor, mask: torch.Tensor, L: int, mask_id: int, fill: int) -> PromptLayout:
        B, device = input_ids.shape[0], input_ids.device
        rows = [input_ids[r][mask[r]] for r in range(B)]  # each row's real tokens (left padding dropped)
        starts = torch.tensor([len(r) // L * L for r in rows], dtype=torch.long, device=device)
        H = int(starts.max())
        prefix = torch.full((B, H), fill, dtype=torch.long, device=device)
        prefix_mask = torch.zeros(B, H, dtype=torch.bool, device=device)
        first = torch.full((B, L), mask_id, dtype=torch.long, device=device)
        for r, ids in enumerate(rows):
            head = int(starts[r])
            prefix[r, H - head :], prefix_mask[r, H - head :] = ids[:head], True
            first[r, : len(ids) - head] = ids[head:]
        tails = torch.tensor([len(r) for r in rows], dtype=torch.long, device=device) - starts
        return cls(prefix, prefix_mask, first, tails, starts)


class MaskedBlockModel(Protocol):
    """The `BlockDenoiser` calls this loop makes (SDAR's adapter): a cache, appending to it, scoring a block."""

    canvas_length: int

    def new_cache(self) -> Any: ...

    def encode_prefix(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any
    ) -> Any: ...

    def denoise(
        self,
        canvas: torch.Tensor,
        self_conditioning: torch.Tensor | None,
        cache: Any,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor: ...


@torch.no_grad()
def generate_masked_blocks(
    model: MaskedBlockModel,
    input_ids: torch.Tensor,
    config: Any,  # a BlockDiffusionConfig with canvas "masked"
    draws: Draws,
    attention_mask: torch.Tensor | None = None,
    on_step: StepCallback | None = None,
) -> GenerateOutput:
    """`config.max_new_tokens` tokens after each row of `input_ids` `(batch, prompt_len)`, one block at a time.

    Returns sequences `(batch, prompt_len + max_new_tokens)`: the prompt as given, then each row's tokens from its
    own end on (a row that ended at an EOS holds `pad_id` after it). `nfe` counts every forward over a block:
    denoising steps and the pass that caches each committed block but the last."""
    if config.mask_id is None:
        raise ValueError("BlockDiffusionConfig.mask_id is required by the masked canvas (the model's mask token)")
    device, (B, P), L = input_ids.device, input_ids.shape, model.canvas_length
    mask = torch.ones(B, P, dtype=torch.bool, device=device) if attention_mask is None else attention_mask.bool()
    fill = config.pad_id if config.pad_id is not None else config.mask_id
    layout = PromptLayout.of(input_ids, mask, L, config.mask_id, fill)
    G = config.max_new_tokens
    needed = torch.div(layout.tails + G + L - 1, L, rounding_mode="floor")  # blocks each row decodes
    answer = torch.full((B, int(needed.max()) * L), fill, dtype=torch.long, device=device)
    eos = torch.tensor(config.eos_ids, dtype=torch.long, device=device)
    commit = MASKED_COMMITS[config.remasking]()
    counts = transfer_counts(L, config.max_denoising_steps)
    cache, keys = model.new_cache(), layout.prefix_mask
    if keys.shape[1]:
        pos = (torch.arange(keys.shape[1], device=device) - (keys.shape[1] - layout.starts)[:, None]).clamp(min=0)
        cache = model.encode_prefix(layout.prefix, keys, pos, cache)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    forwards = torch.zeros(B, dtype=torch.int, device=device)
    nfe, block_nfe, filled = 0, [], torch.zeros(B, dtype=torch.long, device=device)
    for block in range(int(needed.max())):
        canvas = layout.first.clone() if block == 0 else torch.full_like(layout.first, config.mask_id)
        pos = layout.starts[:, None] + block * L + torch.arange(L, device=device)  # (B, L)
        keys = F.pad(keys, (0, L), value=True)
        steps = 0
        for n in counts:
            masked = (canvas == config.mask_id) & ~done[:, None]
            live = masked.any(dim=1)
            if not live.any():
                break
            logits = model.denoise(canvas, None, cache, keys, pos)
            tokens, confidence = sample_block(logits, config.temperature, config.top_k, config.top_p, draws, live)
            picked = commit.select(confidence, masked, n, config.commit_threshold)
            canvas = torch.where(picked, tokens, canvas)
            forwards += live
            steps += 1
            if on_step is not None:
                on_step(committed_step(nfe + steps - 1, block, False, input_ids, answer, filled, G))
        nfe += steps
        filled = _place(answer, canvas, block, layout.tails, filled, done, L)
        done |= end_at_eos(answer, filled, eos, config.pad_id) | (filled >= G)
        if not done.all():
            cache = model.encode_prefix(canvas, keys, pos, cache)
            nfe, steps = nfe + 1, steps + 1
            forwards += ~done
        block_nfe.append(steps)
        if on_step is not None:
            on_step(committed_step(nfe - 1, block, True, input_ids, answer, filled, G))
        if done.all():
            break
    return blocks_output(input_ids, answer, G, nfe, block_nfe, forwards, config.pad_id, L)


def _place(
    answer: torch.Tensor,
    canvas: torch.Tensor,
    block: int,
    tails: torch.Tensor,
    filled: torch.Tensor,
    done: torch.Tensor,
    L: int,
) -> torch.Tensor:
    """Copy the generated part of each open row's finished block into `answer`; the rows' new filled lengths."""
    filled = filled.clone()
    for r in (~done).nonzero().flatten().tolist():
        skip = int(tails[r]) if block == 0 else 0  # the first block opens with the prompt's tail
        answer[r, filled[r] : filled[r] + L - skip] = canvas[r, skip:]
        filled[r] += L - skip
    return filled


def end_at_eos(answer: torch.Tensor, filled: torch.Tensor, eos: torch.Tensor, pad_id: int | None) -> torch.Tensor:
    """Rows whose answer so far holds an EOS; what follows the first EOS becomes `pad_id` (when there is one)."""
    if not eos.numel():
        return torch.zeros(answer.shape[0], dtype=torch.bool, device=answer.device)
    written = torch.arange(answer.shape[1], device=answer.device)[None] < filled[:, None]
    is_eos = torch.isin(answer, eos) & written
    seen = is_eos.long().cumsum(dim=1)
    if pad_id is not None:
        answer[(seen > 0) & ~((seen == 1) & is_eos)] = pad_id
    return is_eos.any(dim=1)


def committed_step(
    step: int, block: int, block_done: bool, prompt: torch.Tensor, answer: torch.Tensor, filled: torch.Tensor, G: int
) -> StepInfo:
    """What the callback hears: the prompt and the tokens every row has committed (a growing decoder)."""
    width = min(int(filled.min()), G)
    sequences = torch.cat([prompt, answer[:, :width]], dim=1)
    committed = torch.zeros_like(sequences, dtype=torch.bool)
    if block_done:
        committed[:, prompt.shape[1] :] = True
    return StepInfo(step=step, block=block, block_done=block_done, sequences=sequences, committed=committed)


def blocks_output(
    prompt: torch.Tensor,
    answer: torch.Tensor,
    G: int,
    nfe: int,
    block_nfe: list[int],
    forwards: torch.Tensor,
    pad_id: int | None,
    L: int,
) -> GenerateOutput:
    generated = answer[:, :G]
    valid = (generated != pad_id).sum(dim=-1) if pad_id is not None else torch.full_like(forwards, G)
    return GenerateOutput(
        sequences=torch.cat([prompt, generated], dim=1),
        prompt_length=prompt.shape[1],
        nfe=nfe,
        sequential_calls=nfe,
        block_nfe=block_nfe,
        tokens_per_forward=G / max(nfe, 1),
        block_diffusion=BlockDiffusionStats(
            row_tokens_per_forward=(valid / forwards.clamp(min=1)).tolist(),
            decoder_forwards=forwards.tolist(),
            canvases=len(block_nfe),
            canvas_length=L,
        ),
    )
