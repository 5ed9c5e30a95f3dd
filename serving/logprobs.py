"""Log-probabilities in OpenAI's shapes: what a request asks for, and the `logprobs` object of each choice.

Generated tokens carry the log-probability each had at the step that committed it (the batcher records it,
`sampler.likelihood.CommitLogprobs`): for an autoregressive model the exact next-token log softmax, for a
masked-diffusion model the model's distribution at that position on its commit step. With completions'
`echo`, the prompt's tokens are scored too (`sampler.prompt_scoring.score_prompts`): each carries a true
log-probability, exact for autoregressive models, the left-to-right order's for masked diffusion, so the values
from any token to the end of the prompt sum to a log-likelihood of that part given the rest; the masked-diffusion
bound's Monte Carlo estimate and its standard error travel in `unmask.likelihood` (which sets samples, seed,
estimator and where the context ends). docs/serving.md ("Log-probabilities") says what each number means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sampler.handle import Handle
from sampler.likelihood import ELBO_ESTIMATORS
from sampler.prompt_scoring import PromptScores, ScoringSettings
from serving.decoding import RequestError
from serving.schemas import Sampling

MAX_TOP = 20  # OpenAI's limit on top_logprobs (completions' logprobs: 5; 20 accepted, as vLLM does)


@dataclass(frozen=True)
class Asked:
    """What a request asks: `top` alternatives per generated token (None: no log-probabilities), and
    whether the prompt is scored (completions' echo with logprobs)."""

    top: int | None
    echo: bool


def asked_logprobs(endpoint: str, body: Sampling) -> Asked:
    """Read completions' `logprobs` (an int, the alternatives) or chat's `logprobs` (a bool) + `top_logprobs`."""
    if endpoint == "completions":
        value = getattr(body, "logprobs", None)
        top = None if value is None or value is False else (1 if value is True else int(value))
        return Asked(top, bool(getattr(body, "echo", False)) and top is not None)
    if not getattr(body, "logprobs", None):
        if getattr(body, "top_logprobs", None):
            raise RequestError("top_logprobs", "top_logprobs needs logprobs: true")
        return Asked(None, False)
    return Asked(int(getattr(body, "top_logprobs", None) or 0), False)


def check_asked(ask: Asked, body: Sampling, endpoint: str, handle: Handle) -> None:
    """RequestError for what cannot be answered: a streamed scored prompt, a decoder that shows no logits, or a
    scored prompt of a kind with no likelihood."""
    kind = handle.kind
    if ask.echo and getattr(body, "stream", False):
        raise RequestError("echo", "echo with logprobs scores the prompt before any token: use stream false")
    if ask.top is not None and not (handle.masked_diffusion or (handle.causal and handle.native)):
        raise RequestError(
            "logprobs",
            f"{handle.entry_id} ({kind}) decodes without showing unmask the logits of "
            "each step; logprobs need unmask's masked-diffusion or native autoregressive decoder",
        )
    if ask.echo and kind not in ("autoregressive", "masked-diffusion"):
        raise RequestError("echo", f"{kind} models cannot score a prompt")
    options = getattr(getattr(body, "unmask", None), "likelihood", None)
    if options is not None and not ask.echo:
        raise RequestError(
            "unmask.likelihood", "unmask.likelihood is read only when echo and logprobs score the prompt (completions)"
        )
    if endpoint == "chat" and getattr(body, "max_tokens", None) == 0:
        raise RequestError(
            "max_tokens",
            "max_tokens=0 decodes nothing; only completions with echo and logprobs (scoring the prompt) accept it",
        )


def unread_likelihood(body: Sampling, handle: Handle) -> list[str]:
    """["unmask.likelihood"] when an autoregressive model is sent it: its likelihood is exact, nothing to sample."""
    options = getattr(getattr(body, "unmask", None), "likelihood", None)
    return ["unmask.likelihood"] if options is not None and handle.causal else []


def likelihood_settings(body: Sampling, default_samples: int) -> ScoringSettings:
    """How a masked-diffusion prompt's estimate is drawn, and for which split: `unmask.likelihood`, else the
    server's default samples, seed 0, LLaDA's `count` estimator and the whole prompt after its first token."""
    options = getattr(getattr(body, "unmask", None), "likelihood", None)
    samples = options.samples if options is not None and options.samples is not None else default_samples
    seed = options.seed if options is not None and options.seed is not None else 0
    estimator = options.estimator if options is not None and options.estimator is not None else "count"
    split = options.context_tokens if options is not None and options.context_tokens is not None else 1
    if estimator not in ELBO_ESTIMATORS:
        raise RequestError("unmask.likelihood.estimator", f"{estimator!r} is not one of {', '.join(ELBO_ESTIMATORS)}")
    return ScoringSettings(samples, seed, estimator, split)


def check_scoring(prompt_tokens: int, settings: ScoringSettings, kind: str, max_token_forwards: int) -> None:
    """RequestError for a split outside the prompt, or a masked-diffusion prompt whose scoring would cost more
    token-forwards than one request may: a left-to-right canvas per token and `samples` masked copies, each
    prompt_tokens long."""
    if prompt_tokens > 1 and not settings.split < prompt_tokens:
        raise RequestError(
            "unmask.likelihood.context_tokens",
            f"context_tokens={settings.split} leaves nothing to score in a prompt of {prompt_tokens} tokens",
        )
    if kind != "masked-diffusion":
        return  # an autoregressive model scores a prompt in one forward
    order = (prompt_tokens - 1) * prompt_tokens
    cost = order + settings.samples * prompt_tokens
    if cost > max_token_forwards:
        raise RequestError(
            "prompt" if order > max_token_forwards else "unmask.likelihood.samples",
            f"scoring {prompt_tokens} prompt tokens (a canvas per token) with {settings.samples} samples is {cost} "
            f"token-forwards, above this server's limit of {max_token_forwards} per request; shorten the prompt "
            "or lower unmask.likelihood.samples",
        )


def token_text(handle: Handle, token: int) -> str:
    """A token as OpenAI lists it: its text, or its name where it decodes to nothing (EOS: `<|endoftext|>`)."""
    text = handle.decode([token])
    if text:
        return text
    tokenizer = getattr(handle, "tokenizer", None)
    name = tokenizer.id_to_token(token) if tokenizer is not None and hasattr(tokenizer, "id_to_token") else None
    return name or ""


def kept_tokens(handle: Handle, generated: list[int], keep: int, text: str) -> int:
    """How many generated tokens the answer `text` is made of, with the stop id that ended it (as OpenAI lists
    `<|endoftext|>`): up to the first stop id, fewer where a stop sequence cut the text."""
    tokens = generated[:keep]
    useful = handle.useful_length(tokens)
    if len(handle.decode(tokens[:useful])) > len(text):  # a stop sequence cut it: the tokens that make the text
        return next((k for k in range(useful + 1) if len(handle.decode(tokens[:k])) >= len(text)), useful)
    return min(useful + 1, len(tokens))


def _finite(value: float | None) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _named(handle: Handle, top: dict[int, float], k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for token, value in sorted(top.items(), key=lambda kv: -kv[1])[:k]:
        out.setdefault(token_text(handle, token), value)
    return out


def completion_logprobs(
    handle: Handle,
    generated: list[int],
    scored: list[tuple[float | None, dict[int, float]]],
    n: int,
    top: int,
    prompt: PromptScores | None,
) -> dict[str, Any]:
    """Completions' `logprobs`: tokens, token_logprobs, top_logprobs, text_offset, over the echoed prompt
    (`prompt`; its first token has none) and the `n` answer tokens."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    if prompt is not None:
        for token, value, alternatives in zip(prompt.ids, prompt.logprobs, prompt.top):
            tokens.append(token_text(handle, token))
            values.append(value)
            tops.append(None if alternatives is None else _named(handle, alternatives, max(top, 1)))
    for token, (value, alternatives) in zip(generated[:n], scored[:n]):
        tokens.append(token_text(handle, token))
        values.append(_finite(value))
        tops.append(_named(handle, alternatives, top) if top else {})
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(
    handle: Handle, generated: list[int], scored: list[tuple[float | None, dict[int, float]]], n: int, top: int
) -> dict[str, Any]:
    """Chat's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""

    def entry(token: str, value: float | None) -> dict[str, Any]:
        return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}

    content = []
    for token, (value, alternatives) in zip(generated[:n], scored[:n]):
        item = entry(token_text(handle, token), _finite(value))
        item["top_logprobs"] = [entry(t, v) for t, v in _named(handle, alternatives, top).items()] if top else []
        content.append(item)
    return {"content": content, "refusal": None}


def prompt_extension(scores: PromptScores) -> dict[str, Any]:
    """What the `unmask.likelihood` of an answer says of a scored prompt: what its token values condition on, and
    the log-likelihood of its tokens after `context_tokens` (exact, or the Monte Carlo estimate with its error)."""
    estimate = scores.estimate
    return {
        "token_logprobs": scores.order,
        "context_tokens": scores.split,
        "loglikelihood": None if estimate is None else estimate.total,
        "stderr": None if estimate is None else estimate.stderr,
        "exact": True if estimate is None else estimate.exact,
        "samples": 0 if estimate is None else estimate.samples,
        "seed": None if estimate is None else estimate.seed,
        "estimator": None if estimate is None else estimate.estimator,
    }
