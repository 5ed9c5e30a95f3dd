"""`unmask serve` through the real `openai` client against a real uvicorn server on loopback.

The registry is a real MLflow SQLite store holding the bundled tiny models (tests/support/serving_fixtures.py);
the server resolves `production` (tiny-llada) and `fallback` (tiny-ar) through it.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pandas as pd
import pytest

from serving.request_log import read_rows
from tests.support import REPO
from tests.support.serving_fixtures import (
    PROMPTS,
    digest,
    openai_client,
    running_server,
    settings_for,
    shared_serving_registry,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    registry = shared_serving_registry()
    log_dir = tmp_path_factory.mktemp("request-log")
    with running_server(settings_for(registry.tracking_uri, log_dir=log_dir)) as running:
        running.log_dir = log_dir
        running.registry = registry
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_a_completion_names_the_version_and_weights_it_came_from(client, server):
    r = client.completions.create(model="production", prompt=PROMPTS[0])
    assert r.choices[0].text.endswith("#### 24")  # the arith answer the tiny model was trained to give
    assert r.choices[0].finish_reason == "stop"
    assert r.model == "tiny-llada"
    ext = r.model_extra["unmask"]
    assert ext["alias"] == "production" and ext["version"] == server.registry.versions["tiny-llada"]
    assert ext["weights_sha256"] == digest("tiny-llada")
    assert r.system_fingerprint == f"tiny-llada/{ext['version']}@{digest('tiny-llada')[:12]}"
    assert ext["config_source"] == "operating point" and ext["nfe"] == 16  # the operating point's 16 steps
    assert r.usage.completion_tokens == len(r.choices[0].text)  # a char-level tokenizer: one token a character


def test_chat_renders_the_models_template_and_answers_like_the_bare_prompt(client):
    chat = client.chat.completions.create(
        model="fallback",
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPTS[1]}],
    )
    plain = client.completions.create(model="fallback", prompt=PROMPTS[1])
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.model == "tiny-ar" and chat.model_extra["unmask"]["alias"] == "fallback"


def test_a_registered_model_name_routes_to_the_version_an_alias_serves(client):
    r = client.completions.create(model="tiny-ar", prompt=PROMPTS[2])
    assert r.model_extra["unmask"]["alias"] == "fallback" and r.model == "tiny-ar"


def test_models_lists_served_names_with_operating_config_and_batching_rules(client):
    listed = client.models.list().data
    cards = {m.id: m.model_extra["unmask"] for m in listed}
    assert set(cards) == {"production", "fallback"}
    assert all(m.created > 1_600_000_000 for m in listed)  # when the version was registered, not 0
    assert str(REPO) not in json.dumps([m.model_dump() for m in listed])  # no local paths
    assert cards["production"]["config"]["steps"] == 16 and cards["production"]["kind"] == "masked-diffusion"
    assert "decoded alone" in cards["production"]["batching"]["not_batched"]
    assert "one random generator per row" in cards["production"]["batching"]["batched"]
    assert cards["fallback"]["chat_template"] == "tokenizer_config.json"
    one = client.models.retrieve("tiny-ar")  # a registered model name reaches the alias that serves it
    assert one.id == "tiny-ar" and one.model_extra["unmask"]["version"] == cards["fallback"]["version"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("staging")


def test_request_overrides_reach_the_decoder(client):
    short = client.completions.create(model="production", prompt=PROMPTS[0], max_tokens=5)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 5
    stopped = client.completions.create(model="production", prompt=PROMPTS[0], stop=["\n"])
    assert "\n" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    fewer = client.completions.create(model="production", prompt=PROMPTS[0], extra_body={"unmask": {"steps": 8}})
    assert fewer.model_extra["unmask"]["nfe"] == 8


def test_sampled_decoding_batches_with_a_generator_per_row_and_a_seed_repeats_it(client):
    a, b = (client.completions.create(model="production", prompt=PROMPTS[3], temperature=1.0, seed=7) for _ in range(2))
    assert a.model_extra["unmask"][
        "batched"
    ]  # batchable: each row draws from its own seed (tests/unit/test_row_generators.py)
    assert a.choices[0].text == b.choices[0].text
    other = client.completions.create(model="production", prompt=PROMPTS[3], temperature=1.0, seed=8)
    assert other.model_extra["unmask"]["config_hash"] != a.model_extra["unmask"]["config_hash"]  # the seed is read


def test_client_errors_are_4xx_naming_the_field(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="staging", prompt=PROMPTS[0])
    assert e.value.body["param"] == "model" and "production" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="production", prompt=PROMPTS[0], top_p=0.5, temperature=0.7)
    assert e.value.body["param"] == "top_p" and "nucleus" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:  # 32 tokens are 1 block; 3 blocks of 8 cannot take 16 steps
        client.completions.create(
            model="production",
            prompt=PROMPTS[0],
            max_tokens=24,
            extra_body={"unmask": {"steps": 16, "block_length": 8}},
        )
    assert e.value.body["param"] == "unmask.steps"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="production", prompt=PROMPTS[0], max_tokens=4096)
    assert e.value.body["param"] == "max_tokens"


# (body, field the error must name); every one is refused with a 4xx, none is a 5xx
MALFORMED = [
    (b"{", "body"),
    (b"not json", "body"),
    (b"[]", "body"),
    (b"null", "body"),
    (b'"text"', "body"),
    (b"", "body"),
    ({}, "model"),
    ({"model": "production"}, "prompt"),
    ({"prompt": "hi"}, "model"),
    ({"model": "production", "prompt": ""}, "prompt"),
    ({"model": "production", "prompt": "   "}, "prompt"),
    ({"model": "production", "prompt": 12}, "prompt"),
    ({"model": "production", "prompt": [1, -2, 3]}, "prompt"),
    ({"model": "production", "prompt": ["a", " "]}, "prompt"),
    ({"model": "production", "prompt": [[]]}, "prompt"),
    ({"model": "production", "prompt": [10**9]}, "prompt"),
    ({"model": "production", "prompt": ["a"] * 33}, "prompt"),
    ({"model": "production", "prompt": None}, "prompt"),
    ({"model": 7, "prompt": "hi"}, "model"),
    ({"model": "", "prompt": "hi"}, "model"),
    ({"model": "no-such-model", "prompt": "hi"}, "model"),
    ({"model": "production", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": "production", "prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"model": "production", "prompt": "hi", "max_tokens": "10"}, "max_tokens"),
    ({"model": "production", "prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
    ({"model": "production", "prompt": "hi", "max_tokens": 10**6}, "max_tokens"),
    ({"model": "production", "prompt": "hi", "temperature": -1}, "temperature"),
    ({"model": "production", "prompt": "hi", "temperature": 9}, "temperature"),
    ({"model": "production", "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": "production", "prompt": "hi", "seed": -1}, "seed"),
    ({"model": "production", "prompt": "hi", "seed": "x"}, "seed"),
    ({"model": "production", "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"model": "production", "prompt": "hi", "stop": [""]}, "stop"),
    ({"model": "production", "prompt": "hi", "stop": 5}, "stop"),
    ({"model": "production", "prompt": "hi", "n": 0}, "n"),
    ({"model": "production", "prompt": "hi", "n": 99}, "n"),
    ({"model": "production", "prompt": "hi", "best_of": 3}, "best_of"),
    ({"model": "production", "prompt": "hi", "n": 2, "best_of": 1}, "best_of"),
    ({"model": "production", "prompt": "hi", "temperature": 0.7, "top_p": 0.9}, "top_p"),
    ({"model": "production", "prompt": "hi", "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"model": "production", "prompt": "hi", "presence_penalty": -1}, "presence_penalty"),
    ({"model": "production", "prompt": "hi", "logprobs": 2, "echo": True, "stream": True}, "echo"),
    ({"model": "production", "prompt": "hi", "suffix": "!"}, "suffix"),
    ({"model": "production", "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": "production", "prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
    (
        {"model": "production", "prompt": "hi", "stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
    ),
    (
        {"model": "production", "prompt": "hi", "stream": True, "stream_options": {"usage": True}},
        "stream_options.usage",
    ),
    ({"model": "production", "prompt": "hi", "logit_bias": {"1": 5}}, "logit_bias"),
    ({"model": "production", "prompt": "hi", "unmask": {"steps": 0}}, "unmask.steps"),
    ({"model": "production", "prompt": "hi", "unmask": {"steps": 16.5}}, "unmask.steps"),
    ({"model": "production", "prompt": "hi", "unmask": {"warp": 9}}, "unmask.warp"),
    ({"model": "production", "prompt": "hi", "unmask": {"parallel": "magic"}}, "unmask.parallel"),
    ({"model": "production", "prompt": "hi", "unmask": {"parallel_threshold": 1.5}}, "unmask.parallel_threshold"),
    ({"model": "production", "prompt": "hi", "unmask": {"remasking": "chaos"}}, "unmask.remasking"),
    ({"model": "production", "prompt": "hi", "unmask": "fast"}, "unmask"),
    ({"model": "production", "prompt": "x" * 3000}, "prompt"),
    ({"model": "production", "prompt": "日本語だけ"}, "prompt"),
    ({"model": "production", "prompt": "1+1" * 300}, "prompt"),
]
MALFORMED_CHAT = [
    ({"model": "fallback"}, "messages"),
    ({"model": "fallback", "messages": []}, "messages"),
    ({"model": "fallback", "messages": "hi"}, "messages"),
    ({"model": "fallback", "messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ({"model": "fallback", "messages": [{"role": "user"}]}, "messages.0.content"),
    ({"model": "fallback", "messages": [{"role": "user", "content": "hi", "mood": "x"}]}, "messages.0.mood"),
    ({"model": "fallback", "messages": [{"role": "system", "content": "only a system turn"}]}, "messages"),
    (
        {"model": "fallback", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
        "max_completion_tokens",
    ),
    (
        {
            "model": "fallback",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                {"role": "user", "content": "hi"},
            ],
        },
        "messages.0.content.0",
    ),
    (
        {
            "model": "fallback",
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
        },
        "response_format",
    ),
    (
        {
            "model": "fallback",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "tools",
    ),
    ({"model": "fallback", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, "tool_choice"),
    ({"model": "fallback", "messages": [{"role": "user", "content": "hi"}], "store": True}, "store"),
    ({"model": "fallback", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    (
        {"model": "fallback", "messages": [{"role": "user", "content": "hi"}], "modalities": ["text", "audio"]},
        "modalities",
    ),
    ({"model": "fallback", "messages": [{"role": "user", "content": "hi"}], "verbosity": "high"}, "verbosity"),
]


def _post(base: str, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else None
    return httpx.post(
        base + path,
        content=content,
        json=None if content is not None else body,
        headers={"content-type": "application/json"},
        timeout=30,
    )


def test_malformed_requests_are_4xx_naming_the_field_and_the_server_keeps_serving(server, client):
    cases = [("/v1/completions", b, f) for b, f in MALFORMED] + [
        ("/v1/chat/completions", b, f) for b, f in MALFORMED_CHAT
    ]
    assert len(cases) >= 30
    problems = []
    for path, body, field in cases:
        r = _post(server.base_url, path, body)
        error = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
        if (
            not 400 <= r.status_code < 500
            or error.get("param") != field
            or field.split(".")[-1] not in error.get("message", "")
        ):
            problems.append((path, str(body)[:60], r.status_code, r.text[:200]))
    assert not problems, problems
    oversize = httpx.post(
        server.base_url + "/v1/completions",
        content=b"x" * 100_000,
        timeout=30,
        headers={"content-type": "application/json"},
    )
    assert oversize.status_code == 413 and oversize.json()["error"]["param"] == "body"
    assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ready"
    assert client.completions.create(model="production", prompt=PROMPTS[0]).choices[0].text.endswith("#### 24")


def test_metrics_count_requests_errors_batches_and_tokens_per_model_and_alias(server, client):
    client.completions.create(model="fallback", prompt=PROMPTS[0])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="fallback", prompt=PROMPTS[0], max_tokens=-1)
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    tiny_ar = 'alias="fallback",endpoint="completions",model="tiny-ar",status="200",version="1"'
    assert f"unmask_requests_total{{{tiny_ar}}}" in text
    refused = 'unmask_request_errors_total{alias="unknown",code="invalid_value",endpoint="completions",status="400"}'
    assert any(line.startswith(refused + " ") and float(line.split()[-1]) >= 1 for line in text.splitlines())
    for name in (
        "unmask_request_latency_seconds_bucket",
        "unmask_batch_size_bucket",
        "unmask_queue_depth",
        "unmask_completion_tokens_total",
        "unmask_nfe_total",
        "unmask_served_version",
    ):
        assert f"{name}{{" in text, name
    served = [line for line in text.splitlines() if line.startswith("unmask_served_version{") and line.endswith(" 1.0")]
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert f'{name}{{model_name="fallback"}} 0.0' in text, name  # idle now: the gateway gauges (docs/serving.md)
    assert any(f'weights_sha256="{digest("tiny-ar")}"' in line for line in served)


def test_every_request_gets_a_row_in_the_parquet_request_log(server, client):
    client.completions.create(model="production", prompt=PROMPTS[1], user="request-log-test")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="not-served", prompt=PROMPTS[1])
    with pytest.raises(openai.BadRequestError):  # refused by the schema, before any handler runs
        client.completions.create(model="production", prompt=PROMPTS[1], max_tokens=-1)
    deadline = time.monotonic() + 20
    while True:  # the log is written off the request path, every couple of seconds
        rows = pd.DataFrame(read_rows(server.log_dir))
        logged = len(rows) and (rows.alias == "not-served").any() and rows.error.str.contains("max_tokens").any()
        if logged or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ok = rows[(rows.alias == "production") & (rows.status == 200)]
    assert len(ok) and (ok.model == "tiny-llada").all() and (ok.version == "1").all()
    assert (ok.nfe > 0).all() and (ok.completion_tokens > 0).all() and (ok.latency_s > 0).all()
    missing = rows[rows.alias == "not-served"]
    assert list(missing.status) == [404] and missing.model.isna().all()
    refused = rows[(rows.status == 400) & (rows.alias == "unknown")]
    assert refused.error.str.contains("max_tokens: Input should be greater than or equal to 0").any()
