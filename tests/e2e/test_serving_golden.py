"""A golden transcript of `unmask serve`: a fixed set of requests against a real uvicorn server over the
bundled tiny models, whose response bodies, streamed chunks and request-log rows must equal a checked-in file.

What varies from run to run (ids, clocks, timings, temporary paths) is replaced by a placeholder that keeps
whether the value was there (a float stays "<float>", None stays None), so everything else — texts, finish
reasons, token counts, NFE, config hashes, error messages and params, route/arm/retry/shadow columns, the
order of the log's rows — is compared exactly. It guards refactors of serving/ that must not change a byte.

Regenerate (only for an intended change of behaviour, and say so in the commit):
`UNMASK_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/e2e/test_serving_golden.py`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest
import yaml

from serving import Limits
from serving.request_log import read_rows
from tests.support import REPO
from tests.support.serving_fixtures import PROMPTS, running_server, serving_registry, settings_for

GOLDEN = REPO / "tests" / "golden" / "serving_transcript.json"
VARYING = {"time", "since", "latency_s", "queue_s", "decode_s", "ttfb_s", "first_block_s"}

POLICY = {
    "arms": {
        "aborting": {"alias": "production", "faults": {"abort_share": 100}},
        "stuck": {"alias": "production", "timeout_s": 0.3, "faults": {"delay_s": 5}},
        "poisoned": {"alias": "production", "faults": {"nan_share": 100}},
    },
    "routes": {
        "abort": {
            "match": {"header": {"name": "X-Route", "value": "abort"}},
            "arm": "aborting",
            "fallback": "fallback",
        },
        "stall": {"match": {"header": {"name": "X-Route", "value": "stall"}}, "arm": "stuck", "fallback": "fallback"},
        "nan": {"match": {"header": {"name": "X-Route", "value": "nan"}}, "arm": "poisoned", "fallback": "fallback"},
        "mirror": {
            "match": {"header": {"name": "X-Route", "value": "mirror"}},
            "arm": "production",
            "shadow": {"arm": "fallback", "share": 100},
        },
        "long": {"match": {"max_tokens_above": 24}, "arm": "fallback"},
    },
    "default": {"arm": "production"},
}

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# (name, method, path, body or None, headers, streamed); sent one at a time, in this order
REQUESTS = [
    ("plain", "POST", COMPLETIONS, {"model": "production", "prompt": PROMPTS[0], "max_tokens": 8}, {}, False),
    ("default-length", "POST", COMPLETIONS, {"model": "production", "prompt": PROMPTS[1]}, {}, False),
    (
        "echo-and-stop",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": PROMPTS[0], "echo": True, "stop": ["4"], "max_tokens": 16},
        {},
        False,
    ),
    ("ar", "POST", COMPLETIONS, {"model": "fallback", "prompt": PROMPTS[2], "max_tokens": 12}, {}, False),
    ("by-model-name", "POST", COMPLETIONS, {"model": "tiny-ar", "prompt": PROMPTS[3], "max_tokens": 4}, {}, False),
    (
        "sampled",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0.8, "seed": 3},
        {},
        False,
    ),
    (
        "overrides",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": PROMPTS[2], "max_tokens": 16, "unmask": {"steps": 8, "block_length": 8}},
        {},
        False,
    ),
    (
        "chat",
        "POST",
        CHAT,
        {"model": "production", "messages": [{"role": "user", "content": PROMPTS[0]}], "max_tokens": 8},
        {},
        False,
    ),
    (
        "chat-ar",
        "POST",
        CHAT,
        {
            "model": "fallback",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[1]}],
            "max_completion_tokens": 6,
        },
        {},
        False,
    ),
    (
        "stream",
        "POST",
        COMPLETIONS,
        {
            "model": "production",
            "prompt": PROMPTS[3],
            "max_tokens": 16,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        {},
        True,
    ),
    (
        "stream-echo",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": PROMPTS[0], "max_tokens": 8, "stream": True, "echo": True},
        {},
        True,
    ),
    (
        "stream-chat-ar",
        "POST",
        CHAT,
        {"model": "fallback", "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 6, "stream": True},
        {},
        True,
    ),
    ("routed-default", "POST", COMPLETIONS, {"model": "auto", "prompt": PROMPTS[0], "max_tokens": 4}, {}, False),
    ("routed-long", "POST", COMPLETIONS, {"model": "auto", "prompt": PROMPTS[1], "max_tokens": 32}, {}, False),
    (
        "routed-abort",
        "POST",
        COMPLETIONS,
        {"model": "auto", "prompt": PROMPTS[2], "max_tokens": 4},
        {"X-Route": "abort"},
        False,
    ),
    (
        "routed-stall",
        "POST",
        CHAT,
        {"model": "auto", "messages": [{"role": "user", "content": PROMPTS[3]}], "max_tokens": 4},
        {"X-Route": "stall"},
        False,
    ),
    (
        "routed-nan",
        "POST",
        COMPLETIONS,
        {"model": "auto", "prompt": PROMPTS[0], "max_tokens": 4},
        {"X-Route": "nan"},
        False,
    ),
    (
        "routed-nan-stream",
        "POST",
        COMPLETIONS,
        {"model": "auto", "prompt": PROMPTS[1], "max_tokens": 4, "stream": True},
        {"X-Route": "nan"},
        True,
    ),
    (
        "routed-mirror",
        "POST",
        COMPLETIONS,
        {"model": "auto", "prompt": PROMPTS[2], "max_tokens": 8},
        {"X-Route": "mirror"},
        False,
    ),
    ("unknown-model", "POST", COMPLETIONS, {"model": "staging", "prompt": PROMPTS[0]}, {}, False),
    (
        "too-many-tokens",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": PROMPTS[0], "max_tokens": 4096},
        {},
        False,
    ),
    (
        "bad-steps",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": PROMPTS[0], "max_tokens": 24, "unmask": {"steps": 16, "block_length": 8}},
        {},
        False,
    ),
    ("too-long-chars", "POST", COMPLETIONS, {"model": "production", "prompt": "x" * 3000}, {}, False),
    ("too-long-tokens", "POST", COMPLETIONS, {"model": "production", "prompt": "1+1" * 300}, {}, False),
    (
        "beyond-context",
        "POST",
        COMPLETIONS,
        {"model": "production", "prompt": "1+1" * 200, "max_tokens": 64},
        {},
        False,
    ),
    (
        "beyond-context-chat",
        "POST",
        CHAT,
        {"model": "fallback", "messages": [{"role": "user", "content": "1+1" * 200}], "max_tokens": 64},
        {},
        False,
    ),
    ("no-vocabulary", "POST", COMPLETIONS, {"model": "production", "prompt": "日本語だけ"}, {}, False),
    ("malformed", "POST", COMPLETIONS, {"model": "production", "prompt": "hi", "temperature": 9}, {}, False),
    ("not-json", "POST", COMPLETIONS, b"{", {}, False),
    ("bad-chat", "POST", CHAT, {"model": "fallback", "messages": [{"role": "wizard", "content": "hi"}]}, {}, False),
    ("models", "GET", "/v1/models", None, {}, False),
    ("one-model", "GET", "/v1/models/tiny-llada", None, {}, False),
    ("routes", "GET", "/v1/unmask/routes", None, {}, False),
    ("health", "GET", "/health", None, {}, False),
]


def normalised(value, tmp: str):
    """`value` with what varies between runs replaced: ids, clocks, timings, the run's temporary folder."""
    if isinstance(value, dict):
        return {
            k: (None if v is None else "<varies>")
            if k in VARYING or random_id(k, v) or clock(k, v)
            else normalised(v, tmp)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [normalised(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(tmp, "<tmp>").replace(str(REPO), "<repo>")  # the checkout's folder varies too
    return value


def random_id(key: str, value) -> bool:
    return (key == "id" and isinstance(value, str) and value.startswith(("cmpl-", "chatcmpl-"))) or (
        key == "request_id" and isinstance(value, str) and value.startswith("req-")
    )  # one the server made


def clock(key: str, value) -> bool:
    return key == "created" and value != 0  # an answer's time, or when a model card's version was registered


def send(client: httpx.Client, method: str, path: str, body, headers: dict, streamed: bool) -> dict:
    content = body if isinstance(body, bytes) else None
    options = {"headers": {"content-type": "application/json", **headers}}
    if content is not None:
        options["content"] = content
    elif body is not None:
        options["json"] = body
    if not streamed:
        r = client.request(method, path, **options)
        return {"status": r.status_code, "body": r.json()}
    with client.stream(method, path, **options) as r:
        lines = [line for line in r.iter_lines() if line]
    events = [line.removeprefix("data: ") for line in lines]
    return {"status": r.status_code, "events": [e if e == "[DONE]" else json.loads(e) for e in events]}


def shadows_done(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("unmask_shadow_requests_total{")
    )


def transcript(folder: Path) -> dict:
    registry = serving_registry(folder / "registry")
    routes = folder / "serving.yaml"
    routes.write_text(yaml.safe_dump(POLICY, sort_keys=False))
    settings = settings_for(registry.tracking_uri, log_dir=folder / "log")
    settings.limits = Limits(max_tokens=128, max_prompt_tokens=700, max_prompt_chars=2000)  # the context binds first
    settings.routes_path, settings.weights_path = routes, folder / "weights.json"
    answers = {}
    with running_server(settings) as server:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            for name, method, path, body, headers, streamed in REQUESTS:
                before = shadows_done(client)
                answers[name] = send(client, method, path, body, headers, streamed)
                if name == "routed-mirror":  # its shadow copy's row goes before the next request's
                    deadline = time.monotonic() + 30
                    while shadows_done(client) == before:
                        assert time.monotonic() < deadline, "the shadow copy never finished"
                        time.sleep(0.05)
    rows = read_rows(folder / "log")  # the server has stopped: every row is flushed
    return normalised({"answers": answers, "request_log": rows}, str(folder))


@pytest.mark.timeout(300)
def test_serving_transcript_is_byte_for_byte_the_golden_one(tmp_path):
    got = transcript(tmp_path)
    text = json.dumps(got, indent=1, ensure_ascii=False)  # key order kept: it is part of the bytes + "\n"
    if os.environ.get("UNMASK_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text, encoding="utf-8")
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert len(got["request_log"]) >= len(REQUESTS) - 4  # every request but the four GETs leaves a row
    for name in expected["answers"]:
        assert got["answers"].get(name) == expected["answers"][name], name
    assert got["answers"].keys() == expected["answers"].keys()
    for i, (row, want) in enumerate(zip(got["request_log"], expected["request_log"])):
        assert row == want, f"request-log row {i}"
    assert len(got["request_log"]) == len(expected["request_log"])
    assert text == GOLDEN.read_text(encoding="utf-8")
