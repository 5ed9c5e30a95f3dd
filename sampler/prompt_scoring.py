"""A prompt scored token by token, as OpenAI's completions `echo` with `logprobs` reports it, and its likelihood.

Each token after the first carries a true log-probability, whatever the model kind: an autoregressive model's
log p(token i | tokens before it), exact; a masked-diffusion model's log p(token i | tokens before it, token i and
every later position masked), the left-to-right order of `sampler.likelihood.left_to_right_likelihood`. The
values from any token c to the end sum to that order's exact log-likelihood of tokens c.. given the tokens
before c, so a client that sums a continuation (lm-eval) gets a likelihood of it without saying where the
context ends. The masked-diffusion bound's Monte Carlo estimate (LLaDA's) cannot be split that way (its
per-split estimates differ by more than their noise allows), so it travels whole, with its standard error, in
`PromptScores.estimate`, for the split the caller names.

A request's prompts are scored together: every canvas of prompts of one length (each token's left-to-right
canvas, each Monte Carlo sample's masked copy) goes through the model in shared forward calls of SAMPLE_BATCH.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from sampler.handle import Handle
from sampler.likelihood import (
    DEFAULT_SAMPLES,
    DEFAULT_SEED,
    Likelihood,
    canvas_logprobs,
    causal_logprobs,
    draw_masks,
    elbo_canvases,
    elbo_estimate,
    left_to_right_canvases,
)


@dataclass(frozen=True)
class ScoringSettings:
    """How a masked-diffusion prompt's estimate is drawn (`samples`, `seed`, `estimator`) and where its context
    ends (`split`: the estimate is of tokens split.. given the ones before)."""

    samples: int = DEFAULT_SAMPLES
    seed: int = DEFAULT_SEED
    estimator: str = "count"
    split: int = 1


@dataclass(frozen=True)
class PromptScores:
    """Per token of a prompt: the first has no value (None). logprobs[i] and top[i] (the `top` most likely ids
    and their log-probabilities): see the module docstring; each value is <= 0. estimate: log p(ids[split:] |
    ids[:split]), exact (autoregressive) or the masked-diffusion bound's estimate with its standard error; None
    for a prompt of one token."""

    ids: list[int]
    logprobs: list[float | None]
    top: list[dict[int, float] | None]
    estimate: Likelihood | None
    split: int
    order: str  # what logprobs[i] conditions on: next-token (autoregressive) or left-to-right (masked diffusion)


def _causal_scores(handle: Handle, ids: list[int], top: int, split: int) -> PromptScores:
    if len(ids) == 1:
        return PromptScores(list(ids), [None], [None], None, split, "next-token")
    logp = causal_logprobs(handle, ids)  # (n - 1, V)
    best = torch.topk(logp, k=min(max(top, 1), logp.shape[-1]), dim=-1)
    values = [float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
    tops = [dict(zip(best.indices[i].tolist(), best.values[i].tolist())) for i in range(len(ids) - 1)]
    tokens = values[split - 1 :]
    estimate = Likelihood(total=math.fsum(tokens), tokens=tokens, stderr=0.0, samples=0, exact=True)
    return PromptScores(list(ids), [None, *values], [None, *tops], estimate, split, "next-token")


def _stacked(
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Canvases, positions and targets of several prompts (of one length) as one stack of each."""
    canvases, positions, targets = zip(*parts)
    return torch.cat(canvases), torch.cat(positions), torch.cat(targets)


def _diffusion_scores(
    handle: Handle, prompts: list[list[int]], top: int, settings: ScoringSettings
) -> list[PromptScores]:
    """Prompts of one length, every canvas of them in shared forwards: the left-to-right ones, then the samples."""
    split = settings.split
    drawn = [
        draw_masks(handle, ids[:split], ids[split:], settings.samples, settings.seed, settings.estimator)
        for ids in prompts
    ]
    orders = [left_to_right_canvases(handle, ids, 1) for ids in prompts]
    values, best_ids, best = canvas_logprobs(handle, *_stacked(orders), top=max(top, 1))
    samples = [elbo_canvases(handle, ids[:split], ids[split:], masks) for ids, (masks, _) in zip(prompts, drawn)]
    sampled, _, _ = canvas_logprobs(handle, *_stacked(samples))
    out, n = [], len(prompts[0]) - 1
    for k, (ids, (masks, weights)) in enumerate(zip(prompts, drawn)):
        rows = slice(k * n, (k + 1) * n)
        tops = [dict(zip(i.tolist(), v.tolist())) for i, v in zip(best_ids[rows, 0], best[rows, 0])]
        logp = sampled[k * settings.samples : (k + 1) * settings.samples]  # (samples, L)
        estimate = elbo_estimate(masks, weights, logp, settings.seed, settings.estimator)
        out.append(
            PromptScores(list(ids), [None, *values[rows, 0].tolist()], [None, *tops], estimate, split, "left-to-right")
        )
    return out


def score_prompts(
    handle: Handle, prompts: list[list[int]], top: int = 1, settings: ScoringSettings | None = None
) -> list[PromptScores]:
    """Score every token of each prompt after its first (see PromptScores), prompt i's scores at i. A prompt of
    one token has nothing to score; `settings.split` must lie inside every longer prompt."""
    settings = settings or ScoringSettings()
    if not prompts or any(not ids for ids in prompts):
        raise ValueError("score_prompts: no tokens")
    if any(not 1 <= settings.split < len(ids) for ids in prompts if len(ids) > 1):
        raise ValueError(f"score_prompts: split {settings.split} must leave at least one token to score in each prompt")
    if handle.causal:
        return [_causal_scores(handle, ids, top, settings.split) for ids in prompts]
    if not handle.masked_diffusion:
        raise ValueError(f"score_prompts: {handle.kind} models ({handle.entry_id}) cannot score a prompt here")
    scored: dict[int, PromptScores] = {}
    lengths = sorted({len(ids) for ids in prompts})
    for length in lengths:  # prompts of one length share forward calls
        group = [i for i, ids in enumerate(prompts) if len(ids) == length]
        if length == 1:
            scored.update(
                {
                    i: PromptScores(list(prompts[i]), [None], [None], None, settings.split, "left-to-right")
                    for i in group
                }
            )
            continue
        scored.update(zip(group, _diffusion_scores(handle, [prompts[i] for i in group], top, settings)))
    return [scored[i] for i in range(len(prompts))]
