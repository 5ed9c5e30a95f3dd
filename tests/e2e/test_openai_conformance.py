"""Client code written against OpenAI's API, pointed unchanged at `unmask serve`: the official `openai` client
driving every parameter unmask accepts, litellm and langchain-openai out of the box, API keys and request ids.

One real uvicorn server (tests/support/serving_fixtures.py) over a real MLflow registry of the bundled tiny models:
`production` is tiny-llada (masked diffusion), `fallback` tiny-ar (autoregressive). The server is started
with an API key, so every client below also shows that a configured key is what it needs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

import httpx
import openai
import pytest

from tests.support.serving_fixtures import PROMPTS, ext, running_server, settings_for, shared_serving_registry

pytestmark = pytest.mark.timeout(300)

KEY = "sk-conformance-7f3a9c"  # never in a log row, a log line or an answer


@pytest.fixture(scope="module")
def server(tmp_path_factory):

    log_dir = tmp_path_factory.mktemp("conformance-log")
    settings = settings_for(shared_serving_registry().tracking_uri, log_dir=log_dir)
    settings.api_keys = frozenset({KEY})
    settings.limits = dataclasses.replace(settings.limits, max_tokens=None)  # bounded by the model's context
    with running_server(settings) as running:
        running.log_dir = log_dir
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def logged(server, until, timeout_s: float = 20.0) -> list[dict]:
    """The request-log rows once `until(rows)` holds (the writer flushes every 2 s)."""
    from serving.request_log import read_rows

    deadline = time.monotonic() + timeout_s
    while True:
        rows = read_rows(server.log_dir)
        if until(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


# the official client -------------------------------------------------------------------------------------


def test_completions_accept_every_parameter_at_its_neutral_value_and_honour_the_rest(client):
    plain = client.completions.create(model="production", prompt=PROMPTS[0], max_tokens=16)
    full = client.completions.create(
        model="production",
        prompt=PROMPTS[0],
        max_tokens=16,
        temperature=0,
        top_p=0.5,
        seed=7,
        stop=["\n\n"],
        n=2,
        best_of=2,
        frequency_penalty=0,
        presence_penalty=0,
        logit_bias={},
        logprobs=None,
        echo=True,
        suffix=None,
        user="conformance",
        stream=False,
        extra_body={"unmask": {"steps": 16}},
    )
    assert [c.index for c in full.choices] == [0, 1]
    texts = {c.text for c in full.choices}
    assert texts == {PROMPTS[0] + plain.choices[0].text}  # greedy: top_p and the seed change nothing; echo is honoured
    assert ext(full)["seeds"] == [None, None]  # nothing was drawn
    assert full.usage.prompt_tokens == plain.usage.prompt_tokens  # one prompt, counted once
    assert full.usage.completion_tokens == 2 * plain.usage.completion_tokens


def test_chat_accepts_every_parameter_at_its_neutral_value(client):
    messages = [{"role": "user", "content": PROMPTS[1]}]
    plain = client.chat.completions.create(model="fallback", messages=messages, max_tokens=16)
    full = client.chat.completions.create(
        model="fallback",
        messages=messages,
        max_completion_tokens=16,
        temperature=0,
        top_p=1,
        seed=3,
        n=1,
        stop=["\n\n"],
        frequency_penalty=0,
        presence_penalty=0,
        logit_bias={},
        logprobs=False,
        top_logprobs=None,
        response_format={"type": "text"},
        tool_choice="none",
        parallel_tool_calls=True,
        modalities=["text"],
        metadata={"team": "conformance"},
        store=False,
        service_tier="auto",
        user="conformance",
        safety_identifier="hashed-user",
        prompt_cache_key="arith",
        reasoning_effort="none",
        verbosity="medium",
        stream=False,
    )
    assert full.choices[0].message.content == plain.choices[0].message.content
    assert full.choices[0].message.role == "assistant" and full.choices[0].finish_reason in ("stop", "length")
    assert ext(full)["ignored"] is None
    told = client.chat.completions.create(
        model="fallback", messages=messages, max_tokens=16, extra_body={"unmask": {"steps": 8, "block_length": 8}}
    )
    assert ext(told)["ignored"] == ["unmask.block_length", "unmask.steps"]  # the AR twin reads neither, and says so
    assert told.choices[0].message.content == plain.choices[0].message.content


def test_a_value_that_cannot_be_honoured_is_a_400_naming_the_parameter_and_why(client):
    cases = [
        ("top_p", lambda: client.completions.create(model="production", prompt="2+2", temperature=0.8, top_p=0.9)),
        ("frequency_penalty", lambda: client.completions.create(model="fallback", prompt="2+2", frequency_penalty=1)),
        ("echo", lambda: client.completions.create(model="fallback", prompt="2+2", logprobs=2, echo=True, stream=True)),
        ("best_of", lambda: client.completions.create(model="fallback", prompt="2+2", best_of=3)),
        (
            "response_format",
            lambda: client.chat.completions.create(
                model="fallback", messages=[{"role": "user", "content": "2+2"}], response_format={"type": "json_object"}
            ),
        ),
        (
            "tools",
            lambda: client.chat.completions.create(
                model="fallback",
                messages=[{"role": "user", "content": "2+2"}],
                tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
            ),
        ),
    ]
    for param, call in cases:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == param and param in e.value.body["message"], e.value.body
    with pytest.raises(openai.BadRequestError, match="no tool support"):
        cases[-1][1]()


def test_batched_prompts_of_text_and_token_ids_each_answer_as_they_would_alone(client):
    import models

    ids = models.load("tiny-llada").encode(PROMPTS[2])
    solo = [client.completions.create(model="production", prompt=p, max_tokens=16).choices[0].text for p in PROMPTS[:3]]
    batch = client.completions.create(model="production", prompt=PROMPTS[:3], max_tokens=16)
    assert [c.text for c in batch.choices] == solo and [c.index for c in batch.choices] == [0, 1, 2]
    as_ids = client.completions.create(model="production", prompt=[ids, ids], max_tokens=16)
    assert [c.text for c in as_ids.choices] == [solo[2], solo[2]]
    one = client.completions.create(model="production", prompt=ids, max_tokens=16)
    assert one.choices[0].text == solo[2] and one.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("alias", ["production", "fallback"])
def test_several_prompts_and_choices_stream_side_by_side_each_exactly_its_plain_text(client, alias):
    asked = dict(
        model=alias,
        prompt=PROMPTS[:2],
        max_tokens=16,
        temperature=1.0,
        seed=5,
        n=2,
        extra_body={"unmask": {"block_length": 8}} if alias == "production" else None,
    )
    plain = client.completions.create(**asked)
    chunks = list(client.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
    streamed: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {c.index: c.text for c in plain.choices} and len(streamed) == 4
    finishes = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(c.choices[0].index for c in finishes) == [0, 1, 2, 3]
    assert [bool(c.model_extra.get("unmask")) for c in finishes] == [False, False, False, True]
    assert ext(finishes[-1])["seeds"] == [5, 6, 5, 6] and chunks[-1].usage == plain.usage
    chat = dict(
        model=alias, messages=[{"role": "user", "content": PROMPTS[3]}], max_tokens=16, n=3, temperature=1.0, seed=9
    )
    whole = client.chat.completions.create(**chat)
    pieces: dict[int, str] = {}
    for chunk in client.chat.completions.create(**chat, stream=True):
        for choice in chunk.choices:
            pieces[choice.index] = pieces.get(choice.index, "") + (choice.delta.content or "")
    assert pieces == {c.index: c.message.content for c in whole.choices}


@pytest.mark.parametrize("alias", ["production", "fallback"])
def test_unseeded_sampling_draws_fresh_seeds_reports_them_and_each_answer_reproduces(client, alias):
    # the tiny models are sure of their arith answers even at 1.5 (tiny-ar: 6 seeds, 1 text); of other text not
    prompt, heat = "hello there", 1.5
    # twelve draws: tiny-llada's commonest answer to this prompt is likely, so five could agree by chance (seen once)
    answers = [
        client.completions.create(model=alias, prompt=prompt, max_tokens=16, temperature=heat) for _ in range(12)
    ]
    seeds = [ext(a)["seed"] for a in answers]
    assert len({a.choices[0].text for a in answers}) >= 2  # not the seed-0 answer every time
    assert len(set(seeds)) == 12 and all(isinstance(s, int) for s in seeds)
    again = client.completions.create(model=alias, prompt=prompt, max_tokens=16, temperature=heat, seed=seeds[3])
    assert again.choices[0].text == answers[3].choices[0].text and ext(again)["seed"] == seeds[3]
    # n samples in one request: each its own drawn seed, each reproducible alone
    many = client.completions.create(model=alias, prompt=prompt, max_tokens=16, temperature=heat, n=4)
    assert len(many.choices) == 4 and len(set(ext(many)["seeds"])) == 4
    k = 2
    alone = client.completions.create(
        model=alias, prompt=prompt, max_tokens=16, temperature=heat, seed=ext(many)["seeds"][k]
    )
    assert alone.choices[0].text == many.choices[k].text
    # a seeded request with n: choice k decodes with seed + k, so choice 0 is the seeded answer alone
    seeded = client.completions.create(model=alias, prompt=prompt, max_tokens=16, temperature=heat, seed=11, n=3)
    assert ext(seeded)["seeds"] == [11, 12, 13]
    assert (
        seeded.choices[0].text
        == client.completions.create(model=alias, prompt=prompt, max_tokens=16, temperature=heat, seed=11)
        .choices[0]
        .text
    )


def test_chat_reads_content_parts_developer_tool_and_null_content_and_says_what_the_template_dropped(client):
    messages = [
        {"role": "developer", "content": "Answer with arithmetic."},
        {"role": "user", "content": "What is 1+1?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
        {
            "role": "user",
            "content": [{"type": "text", "text": PROMPTS[0][:20]}, {"type": "text", "text": PROMPTS[0][20:]}],
        },
    ]
    r = client.chat.completions.create(model="production", messages=messages, max_tokens=16)
    same = client.completions.create(model="production", prompt=PROMPTS[0], max_tokens=16)
    assert r.choices[0].message.content == same.choices[0].text  # the template's prompt: the last user turn
    # the bundled template reads only the last user turn: everything else with text is named as dropped
    assert ext(r)["chat_dropped"] == [
        {"index": 0, "role": "developer"},
        {"index": 1, "role": "user"},
        {"index": 3, "role": "tool"},
    ]
    whole = client.chat.completions.create(model="production", messages=[messages[-1]], max_tokens=16)
    assert ext(whole)["chat_dropped"] is None


def test_max_tokens_is_bounded_by_the_context_not_a_fixed_256(client, server):
    context = server.pool.route("fallback").loaded.context
    prompt = "2+2"
    long = client.completions.create(model="fallback", prompt=prompt, max_tokens=300)
    assert long.choices[0].finish_reason in ("stop", "length") and long.usage.completion_tokens <= 300
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fallback", prompt=prompt, max_tokens=context)
    assert e.value.body["param"] == "max_tokens" and f"context of {context}" in e.value.body["message"]


def test_models_show_a_real_created_time_and_no_local_path(client):
    listed = client.models.list().data
    assert all(m.created > 1_600_000_000 for m in listed)
    text = json.dumps([m.model_dump() for m in listed])
    assert os.sep + "models" + os.sep + "weights" not in text and os.getcwd() not in text


# keys and request ids ------------------------------------------------------------------------------------


def test_a_configured_key_is_required_and_never_logged(server, client, caplog):
    caplog.set_level(logging.DEBUG)
    for key in ("unused", KEY[:-1] + "x"):
        stranger = openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError) as e:
            stranger.completions.create(model="production", prompt="2+2")
        assert e.value.body["code"] == "invalid_api_key" and key not in json.dumps(e.value.body)
    assert (
        httpx.post(
            server.base_url + "/v1/completions", json={"model": "production", "prompt": "2+2"}, timeout=30
        ).status_code
        == 401
    )
    assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200  # probes need no key
    assert httpx.get(server.base_url + "/metrics", timeout=10).status_code == 200
    client.completions.create(model="production", prompt="2+2", max_tokens=4)
    rows = logged(server, lambda rows: sum(r["status"] == 401 for r in rows) >= 3)
    assert sum(r["status"] == 401 for r in rows) >= 3
    assert KEY not in json.dumps(rows, default=str) and KEY not in caplog.text


def test_a_request_id_is_accepted_echoed_and_logged(server, client):
    raw = client.completions.with_raw_response.create(
        model="production", prompt=PROMPTS[3], max_tokens=4, extra_headers={"X-Request-Id": "trace-abc-123"}
    )
    assert raw.headers["x-request-id"] == "trace-abc-123"
    made = client.completions.with_raw_response.create(model="production", prompt=PROMPTS[3], max_tokens=4)
    assert made.headers["x-request-id"].startswith("req-")
    rows = logged(server, lambda rows: any(r["request_id"] == "trace-abc-123" for r in rows))
    mine = [r for r in rows if r["request_id"] == "trace-abc-123"]
    assert len(mine) == 1 and mine[0]["status"] == 200 and mine[0]["alias"] == "production"


# other people's clients ----------------------------------------------------------------------------------


@pytest.fixture
def litellm_offline(monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list at import
    import litellm

    return litellm


def test_litellm_with_top_p_works_out_of_the_box(server, litellm_offline):
    litellm = litellm_offline
    base = server.base_url + "/v1"
    chat = litellm.completion(
        model="openai/fallback",
        api_base=base,
        api_key=KEY,
        top_p=0.9,
        temperature=0,
        max_tokens=16,
        seed=1,
        stop=["\n\n"],
        user="litellm",
        messages=[{"role": "user", "content": PROMPTS[0]}],
    )
    direct = openai.OpenAI(base_url=base, api_key=KEY).chat.completions.create(
        model="fallback", max_tokens=16, messages=[{"role": "user", "content": PROMPTS[0]}]
    )
    assert chat.choices[0].message.content == direct.choices[0].message.content
    text = litellm.text_completion(
        model="text-completion-openai/production",
        api_base=base,
        api_key=KEY,
        prompt=PROMPTS[0],
        max_tokens=16,
        top_p=1,
        temperature=0,
    )
    assert (
        text.choices[0].text
        == openai.OpenAI(base_url=base, api_key=KEY)
        .completions.create(model="production", prompt=PROMPTS[0], max_tokens=16)
        .choices[0]
        .text
    )
    sampled = litellm.completion(
        model="openai/fallback",
        api_base=base,
        api_key=KEY,
        temperature=1.2,
        top_p=1,
        max_tokens=8,
        messages=[{"role": "user", "content": PROMPTS[1]}],
    )
    assert isinstance(sampled.choices[0].message.content, str)


def test_langchain_openai_completions_and_chat_work_out_of_the_box(server):
    from langchain_openai import ChatOpenAI, OpenAI

    base = server.base_url + "/v1"
    direct = openai.OpenAI(base_url=base, api_key=KEY)
    llm = OpenAI(model="production", base_url=base, api_key=KEY, max_retries=0)  # its defaults: top_p 1, n 1, ...
    assert isinstance(llm.invoke(PROMPTS[0]), str)  # temperature 0.7, unseeded: a fresh sample
    expected = [
        direct.completions.create(model="production", prompt=p, max_tokens=256).choices[0].text for p in PROMPTS[:2]
    ]  # langchain's default max_tokens
    greedy = OpenAI(model="production", base_url=base, api_key=KEY, temperature=0, max_retries=0)
    assert greedy.invoke(PROMPTS[0]) == expected[0]
    together = greedy.generate(PROMPTS[:2])  # both prompts in one request
    assert [g[0].text for g in together.generations] == expected
    chat = ChatOpenAI(model="fallback", base_url=base, api_key=KEY, temperature=0, max_retries=0)
    answer = chat.invoke([("system", "Be brief."), ("human", PROMPTS[1])])
    assert (
        answer.content
        == direct.chat.completions.create(model="fallback", messages=[{"role": "user", "content": PROMPTS[1]}])
        .choices[0]
        .message.content
    )
    streamed = "".join(chunk.content for chunk in chat.stream(PROMPTS[1]))
    assert streamed == answer.content
