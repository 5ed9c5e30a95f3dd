"""Block-granular continuous batching: rows join and leave a running batch at block boundaries.

A static batch runs until its slowest row's last block, and a request that arrives meanwhile waits
for all of it. Here every block is its own short decode over the rows running now: `decode_block`
lays each row's canvas (its prompt, its finished blocks, its current block of masks and its
remaining masks) so that the current blocks of all rows share the columns `[s, s + L)`, runs that
block exactly as `generate` would run it for the row alone, and hands each row its block. Between
two calls rows whose decode is over leave and new rows join, each at its own block 0. Rows may ask for
different lengths (`Row.gen_length`): what they must share is the block and its steps (`running_key`).

Why a row decodes as it would alone: a block's decode already starts with a full forward (every
cache policy refreshes at a block start), so re-forming the batch costs no extra forward and no
state carries over but the canvas. Rows are left-padded to the longest prefix and right-padded to
the longest remainder; padding is masked out of attention and position ids count real tokens only
(`sampler.cache.ModelCall`), the same batch invariance that static left padding relies on. The
right padding holds the mask id, so the rules that read what lies after the block (EOS padding,
early exit) see masks there as they do alone, and nothing beyond a block is ever committed.
The early-exit rule reads each row's own generation start (`BlockDecoder(text_start=...)`).

Only deterministic configs join a running batch (`joins_running_batch`): a sampled row's draws
depend on the canvas's shape; speculative decoding spans blocks and steps; guidance masks the prompt; a
refresh that keeps older keys/values (`refresh_span`) needs the row's cache from its previous block.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sampler.backends import denoiser_for
from sampler.cache import CACHE_POLICIES, REFRESH_SPANS, ModelCall
from sampler.config import SamplerConfig
from sampler.early_exit import early_exit_rule
from sampler.generate import BlockDecoder, CallCounter, make_generator
from sampler.output import StepCallback


def running_key(config: SamplerConfig) -> str:
    """Rows whose configs have equal keys may share a running batch: all but the length (and the steps that
    scale with it) equal, so every row decodes a block with the same rules in the same number of steps."""
    return config.with_(gen_length=config.block_length, steps=config.steps_per_block).hash()


def joins_running_batch(config: SamplerConfig) -> bool:
    """Whether a row under `config` decodes block by block in a running batch, exactly as alone."""
    return (
        not config.draws
        and not config.speculative_draft
        and not config.speculative_rows
        and config.cfg_scale == 0
        and config.backend == "torch"
        and getattr(REFRESH_SPANS[config.refresh_span], "joins_running_batch", True)
    )


@dataclass
class Row:
    """One prompt's place in a running batch: what is final so far and which block it decodes next."""

    prompt: list[int]
    gen_length: int  # the positions it generates, a multiple of the block length
    tokens: list[int] = field(default_factory=list)  # generated ids of its finished blocks (and decided padding)
    block: int = 0
    done: bool = False
    nfe: int = 0  # evaluations of the batches it was part of
    batches: list[int] = field(default_factory=list)  # rows in each block's batch it decoded in

    def finish_block(self, canvas: list[int], config: SamplerConfig, nfe: int, rows: int) -> None:
        """Take the block's ids and what follows (`canvas`: from the block's start to the row's own end)."""
        L = config.block_length
        block, after = canvas[:L], canvas[L:]
        self.tokens += block
        self.block += 1
        self.nfe += nfe
        self.batches.append(rows)
        if self.block == self.gen_length // L:
            self.done = True
        elif config.mask_id not in after:  # early exit or EOS prediction decided the rest as padding
            self.tokens += after
            self.done = True
        elif any(t != config.mask_id for t in after):
            raise RuntimeError(f"block {self.block - 1} committed beyond its end: {after}")

    def final_length(self, config: SamplerConfig) -> int:
        """Generated ids no later block can change: all once done, else up to the first mask left."""
        if self.done or config.mask_id not in self.tokens:
            return len(self.tokens)
        return self.tokens.index(config.mask_id)


def block_canvas(
    rows: list[Row], config: SamplerConfig, pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int, list[int]]:
    """(canvas `(B, s + L + R)`, key mask, s, per-row remainder): current blocks at `[s, s + L)`.

    Row r: left padding (`pad_id`, key 0), prompt and finished blocks ending at s, its block and its own
    remaining masks (key 1), then masks with key 0 up to the longest remainder R.
    """
    L, mask_id = config.block_length, config.mask_id
    prefixes = [row.prompt + row.tokens for row in rows]
    rests = [row.gen_length - (row.block + 1) * L for row in rows]
    s = max(map(len, prefixes))
    x = torch.full((len(rows), s + L + max(rests)), mask_id, dtype=torch.long)
    keys = torch.zeros_like(x)
    for r, (prefix, rest) in enumerate(zip(prefixes, rests)):
        lo = s - len(prefix)
        x[r, :lo] = pad_id
        x[r, lo:s] = torch.tensor(prefix, dtype=torch.long)
        keys[r, lo : s + L + rest] = 1
    return x.to(device), keys.to(device), s, rests


def decode_block(
    model: Any, rows: list[Row], config: SamplerConfig, pad_id: int, on_step: StepCallback | None = None
) -> int:
    """Decode each row's current block in one batch and advance the rows; the NFE it took.

    `config`: the rules every row decodes under (its length aside: each row's own `gen_length`).
    `on_step` hears every step (sequences are this block's canvas; its block index is 0).
    """
    if not joins_running_batch(config):
        raise ValueError(
            f"config {config.hash()} cannot decode in a running batch (sampled, speculative, guided or not torch)"
        )
    if any(row.done for row in rows):
        raise ValueError("a finished row cannot decode another block")
    if any(row.gen_length % config.block_length or row.gen_length < 1 for row in rows):
        raise ValueError(f"every row's gen_length must be a positive multiple of block_length={config.block_length}")
    device = next(model.parameters()).device
    x, keys, s, rests = block_canvas(rows, config, pad_id, device)
    L = config.block_length
    episode = config.with_(gen_length=x.shape[1] - s, steps=config.steps_per_block * ((x.shape[1] - s) // L))
    denoiser, _ = denoiser_for(model, episode)
    call = ModelCall(denoiser, keys, x != config.mask_id, episode)
    # not `logits_source`: a finished block may hold a mask the model proposed, which alone too stays a mask
    source = CACHE_POLICIES[episode.cache](call, s, episode)
    text_start = torch.tensor([s - len(row.tokens) for row in rows], device=device)
    decoder = BlockDecoder(
        episode, s, make_generator(config.seed, device), early_exit_rule(episode), on_step, text_start=text_start
    )
    state, calls = decoder.enter_block(x, 0), CallCounter()
    while state.block == 0:
        calls.add(0, 1)
        (window,) = source.logits([state])
        state = decoder.step(state, window)
    canvas = state.x.tolist()
    for r, (row, rest) in enumerate(zip(rows, rests)):
        row.finish_block(canvas[r][s : s + L + rest], config, calls.nfe, len(rows))
    return calls.nfe
