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
"""

from __future__ import annotations

from typing import Any

from sampler.cache import LogitsSource, Window
from sampler.output import SpeculativeStats


def decode_speculative(decoder, source: LogitsSource, state, calls) -> tuple[Any, SpeculativeStats]:
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
            if decoder.finished(nxt) or source.refresh_due(nxt):
                break
        verify = drafts[:-1]  # the last draft is only compared, never evaluated
        calls.add(state.block, len(verify))
        real = source.logits(verify)
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


def _fresh(window: Window) -> Window:
    """A copy: proposing may edit logits in place (EOS masking) and a guess is used many times."""
    return Window(window.logits.clone(), window.lo)
