"""How likely a model finds a text: exact for autoregressive models, a Monte Carlo bound for masked diffusion.

An autoregressive model's log-likelihood of a continuation is exact: the sum of the log softmax of the
next-token distribution at each of its tokens. A masked-diffusion model has no such sum; LLaDA scores a
continuation `y` (length L) after a prompt `p` by the masked-diffusion evidence lower bound

    log p(y | p) >= E_S [ w(S) * sum_{i in S} log p_theta(y_i | p, y with the positions S masked) ]

estimated by Monte Carlo over random mask sets S of the continuation (the prompt is never masked). Two
estimators of the same bound, one class each in ELBO_ESTIMATORS:

- `count` (LLaDA's lower-variance form, the default): the number of masked tokens l is uniform on
  {1, ..., L}, the l positions are drawn uniformly without replacement, w = L / l.
- `ratio` (the bound as written): a masking ratio t ~ U(0, 1], each position masked independently with
  probability t, w = 1 / t. Unbiased too, but its variance is unbounded (small t, one masked token);
  kept for comparison.

Both have the same expectation, `elbo_exact` (every mask set, weighted), which the tests check them
against. Samples come from a private CPU generator seeded by `seed`, so an estimate is reproducible
on any device and the same in process and through the server. Per-token values split the estimate by
position (a sample's weighted log-probability at each masked position), so they sum to the estimate.

`left_to_right_likelihood` is the one order a masked-diffusion model can be scored in without sampling and
without knowing where the context ends: token i given the tokens before it, every later position masked. The
bound above is the average of such orders' log-probabilities over every order of the continuation; this is
one of them, computed exactly, and each of its terms is a true log-probability (sampler/prompt_scoring.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from sampler.handle import Handle
from sampler.output import StepInfo

DEFAULT_SAMPLES = (
    8  # Monte Carlo mask samples per estimate (LLaDA's evaluation used 128; the standard error says how far to trust 8)
)
DEFAULT_SEED = 0
SAMPLE_BATCH = 32  # masked canvases per forward call
LIKELIHOOD_METHODS = ("elbo", "left-to-right")  # a masked-diffusion model's: the bound's estimate, or one fixed order


class ElboEstimator(Protocol):
    def draw(self, length: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(masks `(n, length)` bool, weights `(n,)` float64) for `n` samples over a continuation of `length`."""
        ...


class CountEstimator:
    """LLaDA's: l ~ U{1..L} masked tokens, placed uniformly without replacement, weight L / l."""

    def draw(self, length: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        count = torch.randint(1, length + 1, (n,), generator=generator)  # (n,)
        rank = torch.rand(n, length, generator=generator).argsort(dim=1).argsort(dim=1)  # a random permutation
        return rank < count[:, None], length / count.double()


class RatioEstimator:
    """t ~ U(0, 1], each token masked with probability t, weight 1 / t."""

    def draw(self, length: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        t = 1.0 - torch.rand(n, generator=generator, dtype=torch.float64)  # (0, 1]
        masks = torch.rand(n, length, generator=generator, dtype=torch.float64) < t[:, None]
        return masks, 1.0 / t


ELBO_ESTIMATORS: dict[str, type] = {"count": CountEstimator, "ratio": RatioEstimator}


def elbo_estimator(name: str) -> ElboEstimator:
    try:
        estimator: ElboEstimator = ELBO_ESTIMATORS[name]()
    except KeyError:
        raise ValueError(f"unknown ELBO estimator {name!r}; known: {', '.join(sorted(ELBO_ESTIMATORS))}") from None
    return estimator


@dataclass(frozen=True)
class Likelihood:
    """The log-likelihood of a continuation (exact) or its Monte Carlo lower-bound estimate.

    tokens: per continuation token, its share of `total` (they sum to it). stderr: the estimate's
    standard error (0.0 when exact; None with one sample). samples: mask samples (0 when exact).
    """

    total: float
    tokens: list[float]
    stderr: float | None
    samples: int
    exact: bool
    estimator: str | None = None
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "loglikelihood": self.total,
            "stderr": self.stderr,
            "samples": self.samples,
            "exact": self.exact,
            "estimator": self.estimator,
            "seed": self.seed,
        }


def _check_ids(context: list[int], continuation: list[int]) -> None:
    if not continuation:
        raise ValueError("likelihood: the continuation is empty")
    for name, ids in (("context", context), ("continuation", continuation)):
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
            raise ValueError(f"likelihood: {name} must be non-negative token ids")


def _device(handle: Handle) -> torch.device:
    device: torch.device = next(handle.model.parameters()).device
    return device


@torch.no_grad()
def causal_logprobs(handle: Handle, ids: list[int]) -> torch.Tensor:
    """Log softmax `(len(ids) - 1, vocab)` of the next-token distribution after each prefix of `ids`:
    row i is the distribution of token i + 1. One forward of a causal model."""
    x = torch.tensor([ids], dtype=torch.long, device=_device(handle))
    logits = handle.model(x).logits[0, :-1]  # (T - 1, V)
    return F.log_softmax(logits.double(), dim=-1)


def causal_likelihood(handle: Handle, context: list[int], continuation: list[int]) -> Likelihood:
    """Exact log p(continuation | context) of an autoregressive model (an empty context scores from token 1)."""
    _check_ids(context, continuation)
    ids = list(context) + list(continuation)
    logp = causal_logprobs(handle, ids)  # (T - 1, V)
    start = max(len(context), 1)  # the first token of an empty context has no distribution to be read from
    tokens = [float(logp[i - 1, ids[i]]) for i in range(start, len(ids))]
    if not context:
        tokens = [math.nan] + tokens
    return Likelihood(
        total=math.fsum(t for t in tokens if not math.isnan(t)), tokens=tokens, stderr=0.0, samples=0, exact=True
    )


@torch.no_grad()
def canvas_logprobs(
    handle: Handle, canvases: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, top: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read canvases `(N, T)` long at `positions` `(N, K)`: (log p(targets) `(N, K)` float64, the `top` most likely
    ids `(N, K, top)` and their log-probabilities), in forward calls of SAMPLE_BATCH canvases (the same numbers
    whatever else shares a call: the models here are batch invariant)."""
    values, ids, best = [], [], []
    for rows, at, want in zip(*(torch.split(t, SAMPLE_BATCH) for t in (canvases, positions, targets))):
        logits = handle.model(rows.to(_device(handle))).logits  # (b, T, V)
        logp = F.log_softmax(logits[torch.arange(rows.shape[0])[:, None], at.to(logits.device)].double(), dim=-1)
        values.append(logp.gather(-1, want.to(logp.device)[..., None])[..., 0].cpu())  # (b, K)
        chosen = torch.topk(logp, k=min(top, logp.shape[-1]), dim=-1)
        ids.append(chosen.indices.cpu())
        best.append(chosen.values.cpu())
    return torch.cat(values), torch.cat(ids), torch.cat(best)


def _mask_id(handle: Handle) -> int:
    if handle.mask_id is None:
        raise ValueError(f"likelihood: {handle.entry_id} has no mask token; it is not a masked-diffusion model")
    return handle.mask_id


def elbo_canvases(
    handle: Handle, context: list[int], continuation: list[int], masks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(canvases `(n, T)`, positions `(n, L)`, targets `(n, L)`): context + continuation with `masks` `(n, L)` masked,
    read at every continuation position (only the masked ones count)."""
    P, n = len(context), masks.shape[0]
    row = torch.tensor(list(context) + list(continuation), dtype=torch.long)
    canvases = row.repeat(n, 1)
    canvases[:, P:] = torch.where(masks, _mask_id(handle), canvases[:, P:])
    return canvases, torch.arange(P, len(row)).expand(n, -1), row[P:].expand(n, -1)


def left_to_right_canvases(
    handle: Handle, ids: list[int], start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(canvases, positions `(n, 1)`, targets `(n, 1)`) for tokens start.. of `ids`: canvas i shows the tokens before
    token i and masks it and every later one, so the model's distribution there is log p(token i | tokens before it)."""
    row = torch.tensor(ids, dtype=torch.long)
    at = torch.arange(start, len(ids))  # (n,)
    canvases = torch.where(torch.arange(len(ids))[None, :] < at[:, None], row, _mask_id(handle))  # (n, T)
    return canvases, at[:, None], row[at][:, None]


def elbo_estimate(
    masks: torch.Tensor, weights: torch.Tensor, logp: torch.Tensor, seed: int, estimator: str
) -> Likelihood:
    """The Monte Carlo estimate from `masks` `(n, L)`, their `weights` `(n,)` and the log-probabilities `logp` `(n, L)`
    read on those canvases."""
    samples = masks.shape[0]
    scored = torch.where(masks, logp, torch.zeros_like(logp)) * weights[:, None]  # (n, L): each sample's terms
    per_sample = scored.sum(dim=1)  # (n,)
    stderr = float(per_sample.std(unbiased=True) / math.sqrt(samples)) if samples > 1 else None
    return Likelihood(
        total=float(per_sample.mean()),
        tokens=scored.mean(dim=0).tolist(),
        stderr=stderr,
        samples=samples,
        exact=False,
        estimator=estimator,
        seed=seed,
    )


def draw_masks(
    handle: Handle, context: list[int], continuation: list[int], samples: int, seed: int, estimator: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masks `(samples, L)`, weights `(samples,)`) of one estimate, checked and drawn from `seed`."""
    _check_ids(context, continuation)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ValueError(f"likelihood: samples must be a positive integer, got {samples!r}")
    _mask_id(handle)
    return elbo_estimator(estimator).draw(len(continuation), samples, torch.Generator().manual_seed(seed))


def diffusion_likelihood(
    handle: Handle,
    context: list[int],
    continuation: list[int],
    samples: int = DEFAULT_SAMPLES,
    seed: int = DEFAULT_SEED,
    estimator: str = "count",
) -> Likelihood:
    """Monte Carlo estimate of the masked-diffusion lower bound on log p(continuation | context)."""
    masks, weights = draw_masks(handle, context, continuation, samples, seed, estimator)
    logp, _, _ = canvas_logprobs(handle, *elbo_canvases(handle, context, continuation, masks))  # (n, L)
    return elbo_estimate(masks, weights, logp, seed, estimator)


def left_to_right_likelihood(handle: Handle, context: list[int], continuation: list[int]) -> Likelihood:
    """Exact log-probability of `continuation` when a masked-diffusion model unmasks it one token at a time, left
    to right: the sum over its tokens of log p(token | context and the tokens before it, the rest masked). One
    canvas per token, no sampling; the terms are what an echoed prompt's tokens carry (sampler.prompt_scoring)."""
    _check_ids(context, continuation)
    if not context:
        raise ValueError("likelihood: left-to-right needs a context of at least one token")
    logp, _, _ = canvas_logprobs(
        handle, *left_to_right_canvases(handle, list(context) + list(continuation), len(context))
    )
    tokens = logp[:, 0].tolist()
    return Likelihood(
        total=math.fsum(tokens), tokens=tokens, stderr=0.0, samples=0, exact=True, estimator="left-to-right"
    )


def elbo_exact(handle: Handle, context: list[int], continuation: list[int]) -> float:
    """The bound both estimators estimate, summed over every mask set S (weight 1 / (|S| C(L, |S|))):
    2^L - 1 masked canvases, so for short continuations only (tests)."""
    _check_ids(context, continuation)
    L = len(continuation)
    if L > 12:
        raise ValueError(f"elbo_exact: {L} tokens would need {2**L - 1} forwards; at most 12")
    sets = [s for k in range(1, L + 1) for s in itertools.combinations(range(L), k)]
    masks = torch.zeros(len(sets), L, dtype=torch.bool)
    for r, s in enumerate(sets):
        masks[r, list(s)] = True
    logp, _, _ = canvas_logprobs(handle, *elbo_canvases(handle, context, continuation, masks))
    size = masks.sum(dim=1)
    weight = torch.tensor([1.0 / (k * math.comb(L, k)) for k in size.tolist()], dtype=torch.float64)
    return float((torch.where(masks, logp, torch.zeros_like(logp)).sum(dim=1) * weight).sum())


def likelihood(
    handle: Handle,
    context: list[int],
    continuation: list[int],
    samples: int = DEFAULT_SAMPLES,
    seed: int = DEFAULT_SEED,
    estimator: str = "count",
    method: str = "elbo",
) -> Likelihood:
    """log p(continuation | context): exact for an autoregressive model (samples, seed, estimator, method unread);
    for a masked-diffusion one, `method` elbo: the Monte Carlo lower bound, left-to-right: the exact log-probability
    of unmasking it one token at a time (what lm-eval sums through the server, docs/serving.md)."""
    if method not in LIKELIHOOD_METHODS:
        raise ValueError(f"likelihood: unknown method {method!r}; known: {', '.join(LIKELIHOOD_METHODS)}")
    if handle.causal:
        return causal_likelihood(handle, context, continuation)
    if handle.masked_diffusion and method == "left-to-right":
        return left_to_right_likelihood(handle, context, continuation)
    if handle.masked_diffusion:
        return diffusion_likelihood(handle, context, continuation, samples, seed, estimator)
    raise ValueError(
        f"likelihood: {handle.kind} models ({handle.entry_id}) have no likelihood here; "
        "autoregressive and masked-diffusion models do"
    )


class CommitLogprobs:
    """An `on_step` callback: the log-probability each generated token had at the step that committed it.

    Autoregressive decoders: the exact next-token log softmax. Masked diffusion: the model's distribution
    at the position on the step that committed it (temperature not applied; a token is committed once).
    Needs steps that carry `logits` (StepInfo.logits); positions never committed (the prompt, an early
    exit's padding) have none. `top` alternatives per position are kept as well.
    """

    def __init__(self, top: int = 0):
        self.top = top
        self.logprob: torch.Tensor | None = None  # (B, seq) float64, nan where uncommitted
        self.top_ids: torch.Tensor | None = None  # (B, seq, top)
        self.top_logprobs: torch.Tensor | None = None

    def _grow(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Room for `shape` `(B, T)`; returns (logprob, top_ids, top_logprobs)."""
        B, T = shape
        if self.logprob is None or self.top_ids is None or self.top_logprobs is None:  # all three, or none
            self.logprob = torch.full((B, T), math.nan, dtype=torch.float64)
            self.top_ids = torch.zeros((B, T, self.top), dtype=torch.long)
            self.top_logprobs = torch.full((B, T, self.top), math.nan, dtype=torch.float64)
        elif self.logprob.shape[1] < T:  # AR decoders grow the sequence
            extra = T - self.logprob.shape[1]
            self.logprob = F.pad(self.logprob, (0, extra), value=math.nan)
            self.top_ids = F.pad(self.top_ids, (0, 0, 0, extra))
            self.top_logprobs = F.pad(self.top_logprobs, (0, 0, 0, extra), value=math.nan)
        return self.logprob, self.top_ids, self.top_logprobs

    def __call__(self, info: StepInfo) -> None:
        if info.logits is None:
            raise ValueError("CommitLogprobs: this decoder's steps carry no logits")
        logprob, top_ids, top_logprobs = self._grow(tuple(info.committed.shape))
        lo, W = info.logits_lo, info.logits.shape[1]
        committed = info.committed[:, lo : lo + W].cpu()  # (B, W)
        if not bool(committed.any()):
            return
        rows, cols = committed.nonzero(as_tuple=True)
        logp = F.log_softmax(info.logits[rows.to(info.logits.device), cols.to(info.logits.device)].double(), dim=-1)
        tokens = info.sequences[rows, cols + lo].to(logp.device)
        logprob[rows, cols + lo] = logp.gather(-1, tokens[:, None])[:, 0].cpu()
        if self.top:
            best = torch.topk(logp, k=min(self.top, logp.shape[-1]), dim=-1)
            top_ids[rows, cols + lo] = best.indices.cpu()
            top_logprobs[rows, cols + lo] = best.values.cpu()

    def generated(self, prompt_length: int) -> list[list[tuple[float | None, dict[int, float]]]]:
        """Per row, per generated position: (log-probability or None, {top id: log-probability})."""
        if self.logprob is None:
            return []
        return [self.span(b, prompt_length, self.logprob.shape[1]) for b in range(self.logprob.shape[0])]

    def span(self, row: int, start: int, end: int) -> list[tuple[float | None, dict[int, float]]]:
        """Row `row`'s positions [start, end) as `generated` lists them (what a stream sends as its tokens settle)."""
        if self.logprob is None or self.top_ids is None or self.top_logprobs is None:
            return [(None, {})] * max(end - start, 0)
        out = []
        for pos in range(start, end):
            value = float(self.logprob[row, pos]) if pos < self.logprob.shape[1] else math.nan
            tops = (
                {}
                if not self.top or math.isnan(value)
                else dict(zip(self.top_ids[row, pos].tolist(), self.top_logprobs[row, pos].tolist()))
            )
            out.append((None if math.isnan(value) else value, tops))
        return out
