"""Lossless speculative decoding: draft several steps from one prediction, verify them in one call.

From a true state s and a guess G of its logits (the last real logits seen), the drafter replays
the step function on G: d_1 = step(s, G), d_2 = step(d_1, G), ... d_m. One batched model call
then evaluates [s, d_1, ..., d_{m-1}] and the chain is replayed with real logits: step(s, L_0)
is the true next state; while it equals d_1, L_1 is the real prediction at d_1, and so on. The
first mismatch (or d_m) ends the round at a true state, reached exactly as the one-call-per-step
loop would reach it; only the number of sequential model calls changes. Deterministic decoding
only (temperature 0), which SamplerConfig.check enforces. Only the true transitions are decoder
`step`s, so a step callback never sees a draft.

Drafts never cross a cache refresh: a refresh is a full forward that rebuilds the cache, so it
runs on its own.

In a batch, a round advances only as far as every row's drafts held. With `speculative_rows` each
row keeps its own verified prefix instead: rows then stand at different steps of the same block
(`DecodeState.row_steps`), a row whose block is done waits for the others, and every row still
walks exactly the path it walks alone. A step callback then hears one transition per round.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from sampler.cache import LogitsSource, Window
from sampler.output import SpeculativeStats

if TYPE_CHECKING:  # the sampler's loop drives these rounds; they only call its decoder
    from sampler.generate import BlockDecoder, CallCounter, DecodeState


def decode_speculative(
    decoder: BlockDecoder, source: LogitsSource, state: DecodeState, calls: CallCounter
) -> tuple[DecodeState, SpeculativeStats]:
    """Decode to the end with drafted-and-verified steps; returns the final state and what was drafted."""
    draft_length = decoder.config.speculative_draft
    drafted = accepted = 0
    guess: Window | None = None
    while not decoder.finished(state):
        if guess is None or source.refresh_due(state):
            calls.add(state.block, 1)
            (guess,) = source.logits([state])
            state = decoder.step(state, _fresh(guess))
            continue
        drafts = [state]
        while len(drafts) <= draft_length:
            nxt = decoder.advance(drafts[-1], _fresh(guess))
            drafts.append(nxt)
            if decoder.finished(nxt) or source.refresh_due(nxt) or nxt.block != state.block:
                break
        verify = drafts[:-1]  # the last draft is only compared, never evaluated
        calls.add(state.block, len(verify))
        real = source.logits(verify)
        if decoder.per_row:
            state, guess, row_drafted, row_accepted = _accept_per_row(decoder, drafts, real)
            drafted, accepted = drafted + row_drafted, accepted + row_accepted
            continue
        drafted += len(drafts) - 1
        truth = decoder.step(verify[0], _fresh(real[0]))
        j = 1
        while j < len(verify) and truth.same_as(drafts[j]):
            truth = decoder.step(drafts[j], _fresh(real[j]))  # drafts[j] is the true state: a kept step
            accepted += 1
            j += 1
        if j == len(verify) and truth.same_as(drafts[-1]):
            accepted += 1
        state, guess = truth, real[j - 1]
    return state, SpeculativeStats(drafted_steps=drafted, accepted_steps=accepted)


def _accept_per_row(
    decoder: BlockDecoder, drafts: list[DecodeState], real: list[Window]
) -> tuple[DecodeState, Window, int, int]:
    """Each row's true state after a round: the first of its drafts the verifying logits contradict,
    or its last draft. Returns (state, next guess, row-drafts made, row-drafts confirmed)."""
    start, end = decoder.bounds(drafts[0].block)
    truths = [decoder.advance(d, _fresh(w)) for d, w in zip(drafts, real)]  # truths[j]: the true successor of drafts[j]
    m, B = len(truths), drafts[0].x.shape[0]
    held = torch.ones(B, dtype=torch.bool, device=drafts[0].x.device)
    reach = torch.zeros(B, dtype=torch.long, device=held.device)  # drafts confirmed per row
    row_drafted = row_accepted = 0  # counted only while a row still had its block to decode, not while it waited
    for j in range(m):
        held &= truths[j].rows_same_as(drafts[j + 1])
        reach += held.long()
        row_steps = drafts[j].row_steps
        assert row_steps is not None, "a verified draft is in the round's block: it counts its rows' steps"
        live = ~decoder.rows_done(row_steps, drafts[j].x[:, start:end] == decoder.config.mask_id)
        row_drafted += int(live.sum())
        row_accepted += int((held & live).sum())
    final = reach.clamp(max=m - 1)  # (B,) the truth each row ends on
    rows = torch.arange(B, device=held.device)
    picked = sorted(set(final.tolist()))
    if len(picked) > 1 and any(truths[j].block != drafts[0].block for j in picked):
        final = torch.full_like(final, picked[0])  # a row left the block: all stop where every row's drafts held
        picked = picked[:1]
    path = torch.arange(m, device=held.device)[:, None] <= final[None]  # (m, B) the steps each row walked
    commits = []
    for t in truths:
        assert t.committed is not None, "`advance` records every step's commits"
        commits.append(t.committed)
    committed = (torch.stack(commits) & path[..., None]).any(dim=0)  # all of the round's commits
    if len(picked) == 1:
        after = replace(truths[picked[0]], committed=committed)
    else:

        def pick(ts: list[torch.Tensor]) -> torch.Tensor:
            return torch.stack(ts)[final, rows]  # row r from the r-th chosen truth

        # A truth that ended the decode (last block done, or every row decided) has no row_steps; no row ends on
        # it here (the chosen truths are all in the round's block), so any stand-in of the right shape will do.
        steps = pick([torch.zeros_like(final) if t.row_steps is None else t.row_steps for t in truths])
        after = replace(truths[picked[-1]], x=pick([t.x for t in truths]), committed=committed, row_steps=steps)
    decoder.report(drafts[0], after)
    guess = Window(torch.stack([w.logits for w in real])[final, rows], real[0].lo)
    return after, guess, row_drafted, row_accepted


def _fresh(window: Window) -> Window:
    """A copy: proposing may edit logits in place (EOS masking) and a guess is used many times."""
    return Window(window.logits.clone(), window.lo)
