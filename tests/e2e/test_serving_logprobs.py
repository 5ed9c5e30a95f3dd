"""Log-probabilities through a real uvicorn server, driven by the real `openai` client: generated tokens'
logprobs (completions and chat), echo with prompt scores (max_tokens 0 too), the masked-diffusion
likelihood's settings and standard errors, each equal to the in-process computation; and the refusals."""

from __future__ import annotations

import dataclasses
import math

import openai
import pytest

from gates.request_limits import RequestLimits
from sampler.likelihood import SAMPLE_BATCH, causal_likelihood, diffusion_likelihood, left_to_right_likelihood
from sampler.prompt_scoring import ScoringSettings, score_prompts
from tests.support.serving_fixtures import openai_client, running_server, settings_for, shared_serving_registry

PROMPT = "A box has 9 coins. Zoe takes 3. How many remain?"
SHORT = "A box has 9 coins."


@pytest.fixture(scope="module")
def server():
    settings = dataclasses.replace(
        settings_for(shared_serving_registry().tracking_uri),
        likelihood_samples=3,
        compute=RequestLimits(max_token_forwards=65536),  # low enough that scoring 1024 samples meets it
    )
    with running_server(settings) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def handle_of(server, alias: str):
    return server.pool.route(alias).loaded.handle


def test_autoregressive_echo_scores_the_prompt_exactly(server, client):
    """lm-eval's loglikelihood request: echo, logprobs, max_tokens 0 (and 1); the sum over the continuation is
    the in-process exact log-likelihood."""
    h = handle_of(server, "fallback")
    context, continuation = PROMPT, "9-3=6,0-0-0=0\n#### 6"
    ids = h.encode(context + continuation)
    for max_tokens in (0, 1):
        r = client.completions.create(
            model="fallback", prompt=context + continuation, max_tokens=max_tokens, echo=True, logprobs=1, temperature=0
        )
        lp = r.choices[0].logprobs
        assert len(lp.tokens) == len(ids) + max_tokens and lp.token_logprobs[0] is None
        assert r.choices[0].text.startswith(context + continuation)
        ctxlen = len(h.encode(context))
        served = math.fsum(lp.token_logprobs[ctxlen : len(ids)])
        assert served == pytest.approx(causal_likelihood(h, ids[:ctxlen], ids[ctxlen:]).total, abs=1e-6)
        assert all(len(t) == 1 for t in lp.top_logprobs[1:])
        assert lp.text_offset[:3] == [0, 1, 2]
    said = r.model_extra["unmask"]["likelihood"][0]
    assert said["exact"] is True and said["token_logprobs"] == "next-token" and said["stderr"] == 0.0
    sampled = client.completions.create(
        model="fallback",
        prompt=context,
        max_tokens=0,
        echo=True,
        logprobs=1,
        extra_body={"unmask": {"likelihood": {"samples": 4}}},
    )
    assert sampled.model_extra["unmask"]["ignored"] == ["unmask.likelihood"]  # exact: nothing to sample, and said so


def test_masked_diffusion_echo_carries_log_probabilities_and_the_bound_in_its_own_field(server, client):
    """Issue 51, item 3: every echoed token_logprob is a true log-probability (<= 0; the left-to-right order's),
    what lm-eval sums (token_logprobs[ctxlen:-1] of a max_tokens 1 answer) is that order's log-likelihood of the
    continuation, and the Monte Carlo bound's estimate and standard error for the split the client names travel in
    unmask.likelihood, each equal to the in-process computation."""
    h = handle_of(server, "production")
    context, continuation = PROMPT, "9-3=6,0-0-0=0\n#### 6"
    ids, ctxlen = h.encode(context + continuation), len(h.encode(context))
    r = client.completions.create(
        model="production",
        prompt=context + continuation,
        max_tokens=1,
        echo=True,
        logprobs=1,
        extra_body={"unmask": {"likelihood": {"samples": 4, "seed": 7, "context_tokens": ctxlen}}},
    )
    lp = r.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == len(ids) + 1
    for value, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert value <= 0.0 and max(top.values()) >= value
    order = left_to_right_likelihood(h, ids[:ctxlen], ids[ctxlen:])
    assert math.fsum(lp.token_logprobs[ctxlen:-1]) == pytest.approx(order.total, abs=1e-9)
    scored = r.model_extra["unmask"]["likelihood"][0]
    direct = diffusion_likelihood(h, ids[:ctxlen], ids[ctxlen:], samples=4, seed=7)
    assert scored["token_logprobs"] == "left-to-right" and scored["context_tokens"] == ctxlen
    assert scored["samples"] == 4 and scored["seed"] == 7 and scored["estimator"] == "count" and not scored["exact"]
    assert scored["loglikelihood"] == pytest.approx(direct.total, abs=1e-9)
    assert scored["stderr"] == pytest.approx(direct.stderr)
    default = client.completions.create(model="production", prompt=SHORT, max_tokens=0, echo=True, logprobs=1)
    said = default.model_extra["unmask"]["likelihood"][0]
    assert said["samples"] == 3 and said["context_tokens"] == 1  # the server's --likelihood-samples, whole prompt


def test_the_prompts_of_one_request_share_forwards_and_score_as_each_alone_and_in_process(server, client):
    """Issue 51, item 4: lm-eval may send several prompts in one request; they are scored in shared forward calls
    (every left-to-right canvas and Monte Carlo copy of prompts of one length), and each prompt's numbers are
    what it gets alone and what `score_prompts` gives in process."""
    h = handle_of(server, "production")
    prompts = [PROMPT + " 6", PROMPT + " 7", SHORT]
    ids = [h.encode(p) for p in prompts]
    options = {"unmask": {"likelihood": {"samples": 4, "seed": 7}}}
    calls: list[int] = []
    hook = h.model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    try:
        together = client.completions.create(
            model="production", prompt=prompts, max_tokens=0, echo=True, logprobs=1, extra_body=options
        )
    finally:
        hook.remove()
    assert len(ids[0]) == len(ids[1]) != len(ids[2])  # the first two share a length, so they share calls
    canvases = [2 * (len(ids[0]) - 1), 2 * 4, len(ids[2]) - 1, 4]  # per length: left-to-right, then the samples
    assert sum(calls) == sum(canvases) and len(calls) == sum(-(-c // SAMPLE_BATCH) for c in canvases)
    local = score_prompts(h, ids, top=1, settings=ScoringSettings(samples=4, seed=7))
    for k, prompt in enumerate(prompts):
        alone = client.completions.create(
            model="production", prompt=prompt, max_tokens=0, echo=True, logprobs=1, extra_body=options
        )
        assert together.choices[k].logprobs == alone.choices[0].logprobs
        assert together.choices[k].logprobs.token_logprobs == local[k].logprobs
        said = together.model_extra["unmask"]["likelihood"][k]
        assert said == alone.model_extra["unmask"]["likelihood"][0]
        assert said["loglikelihood"] == local[k].estimate.total and said["stderr"] == local[k].estimate.stderr


def test_generated_tokens_carry_their_commit_step_logprobs(server, client):
    for alias in ("fallback", "production"):
        h = handle_of(server, alias)
        r = client.completions.create(model=alias, prompt=PROMPT, max_tokens=8, logprobs=2, temperature=0)
        lp = r.choices[0].logprobs
        assert "".join(lp.tokens) == r.choices[0].text and len(lp.tokens) == 8
        for value, top in zip(lp.token_logprobs, lp.top_logprobs):  # greedy: each token was its step's best
            assert value <= 0 and len(top) == 2 and max(top.values()) == pytest.approx(value, abs=1e-9)
        if alias == "fallback":  # exact: what scoring prompt + answer in process gives
            exact = causal_likelihood(h, h.encode(PROMPT), h.encode(r.choices[0].text))
            assert lp.token_logprobs == pytest.approx(exact.tokens, abs=1e-5)
        chat = client.chat.completions.create(
            model=alias,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8,
            logprobs=True,
            top_logprobs=3,
            temperature=0,
        )
        content = chat.choices[0].logprobs.content
        assert "".join(c.token for c in content) == chat.choices[0].message.content
        assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob == pytest.approx(c.logprob) for c in content)
    plain = client.completions.create(model="production", prompt=PROMPT, max_tokens=8, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == r.choices[0].text


@pytest.mark.parametrize("alias", ["fallback", "production"])
def test_streamed_chunks_carry_the_logprobs_of_the_tokens_they_complete(server, client, alias):
    """Issue 51, item 10: each chunk's logprobs are its tokens', and put together they are the non-streamed
    answer's, entry for entry (autoregressive: token by token; masked diffusion: block by block)."""
    whole = client.completions.create(model=alias, prompt=PROMPT, max_tokens=12, logprobs=2, temperature=0)
    chunks = list(
        client.completions.create(model=alias, prompt=PROMPT, max_tokens=12, logprobs=2, temperature=0, stream=True)
    )
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs is not None]
    if alias == "fallback":  # autoregressive: a chunk per token, each with its own score, as the text goes out
        assert [len(p.tokens) for p in parts] == [1] * len(whole.choices[0].logprobs.tokens)
    for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for p in parts for x in getattr(p, field)] == getattr(whole.choices[0].logprobs, field), field
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    for c in chunks:  # a chunk's logprobs are of its own text's tokens (a stop id's come with the last chunk)
        if c.choices and c.choices[0].logprobs is not None and c.choices[0].text:
            assert "".join(c.choices[0].logprobs.tokens).startswith(c.choices[0].text) or c.choices[0].text.startswith(
                "".join(c.choices[0].logprobs.tokens)
            )
    messages = [{"role": "user", "content": PROMPT}]
    said = client.chat.completions.create(model=alias, messages=messages, max_tokens=12, logprobs=True, top_logprobs=2)
    streamed = client.chat.completions.create(
        model=alias, messages=messages, max_tokens=12, logprobs=True, top_logprobs=2, stream=True
    )
    content = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in content] == [e.model_dump() for e in said.choices[0].logprobs.content]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "production", "prompt": SHORT, "max_tokens": 0}, "max_tokens"),
        (
            {"model": "production", "prompt": SHORT, "max_tokens": 4, "logprobs": 1, "stream": True, "echo": True},
            "echo",
        ),
        (
            {
                "model": "production",
                "prompt": SHORT,
                "max_tokens": 0,
                "echo": True,
                "logprobs": 1,
                "unmask": {"likelihood": {"estimator": "nope"}},
            },
            "unmask.likelihood.estimator",
        ),
        (
            {"model": "production", "prompt": SHORT, "max_tokens": 4, "unmask": {"likelihood": {"samples": 4}}},
            "unmask.likelihood",
        ),
        (
            {
                "model": "production",
                "prompt": " ".join([PROMPT] * 4),
                "max_tokens": 0,
                "echo": True,
                "logprobs": 1,
                "unmask": {"likelihood": {"samples": 1024}},
            },
            "unmask.likelihood.samples",
        ),  # the compute cap
        (
            {
                "model": "production",
                "prompt": SHORT,
                "max_tokens": 0,
                "echo": True,
                "logprobs": 1,
                "unmask": {"likelihood": {"context_tokens": 500}},
            },
            "unmask.likelihood.context_tokens",
        ),  # a split past the prompt's end
    ],
)
def test_what_cannot_be_answered_is_a_400_naming_it(server, client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(
            **{k: v for k, v in body.items() if k != "unmask"},
            extra_body={"unmask": body["unmask"]} if "unmask" in body else None,
        )
    assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="production", messages=[{"role": "user", "content": SHORT}], max_tokens=4, top_logprobs=2
        )
    assert e.value.body["param"] == "top_logprobs"
    assert client.completions.create(model="production", prompt=SHORT, max_tokens=2).choices[0].text  # still serving
