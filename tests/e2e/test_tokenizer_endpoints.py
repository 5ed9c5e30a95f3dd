"""vLLM's tokenizer endpoints on `unmask serve` (issue 51, item 11): lm-eval's own RemoteTokenizer (what its
`tokenizer_backend=remote` and `auto` use) finds them, and counts, decodes and renders chat exactly as the served
model does in process, with no copy of the model folder on the client."""

from __future__ import annotations

import httpx
import pytest

from tests.support.serving_fixtures import running_server, settings_for, shared_serving_registry


@pytest.fixture(scope="module")
def server():
    with running_server(settings_for(shared_serving_registry().tracking_uri)) as running:
        yield running


def test_lm_evals_remote_tokenizer_uses_the_served_models_own(server):
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    base = f"{server.base_url}/v1/completions"
    assert check_remote_tokenizer_support(base)
    remote = RemoteTokenizer(base)
    handle = server.pool.route("production").loaded.handle
    text = "Q: 12 + 30 = ? A: 42"
    assert remote.encode(text) == handle.encode(text)
    assert remote.decode(handle.encode(text)) == handle.decode(handle.encode(text))
    assert remote.eos_token_id == handle.eos_id  # lm-eval encodes the eos token's text back to its id
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    rendered = server.pool.route("production").loaded.chat.render(chat)
    assert remote.apply_chat_template(chat) == rendered  # the server's template, rendered on the client


def test_tokenize_counts_what_a_named_model_reads_and_bad_input_is_a_400_naming_it(server):
    handle = server.pool.route("fallback").loaded.handle
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        counted = client.post(
            "/tokenize", json={"model": "fallback", "prompt": "1 + 1", "return_token_strs": True}
        ).json()
        assert counted["tokens"] == handle.encode("1 + 1") and counted["count"] == len(counted["tokens"])
        assert counted["max_model_len"] == server.pool.route("fallback").loaded.context
        assert len(counted["token_strs"]) == counted["count"]
        chat = client.post("/tokenize", json={"model": "tiny-llada", "messages": [{"role": "user", "content": "hi"}]})
        llada = server.pool.route("production").loaded
        expected = llada.handle.encode(llada.chat.render([{"role": "user", "content": "hi"}]))
        assert chat.status_code == 200 and chat.json()["tokens"] == expected  # rendered with the model's template
        info = client.get("/tokenizer_info", params={"model": "production"}).json()
        assert info["model"] == "production" and info["vocab_size"] > 0 and info["eos_token"]
        refused = {
            "both": client.post("/tokenize", json={"prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
            "neither": client.post("/tokenize", json={"model": "production"}),
            "unknown model": client.post("/tokenize", json={"model": "nope", "prompt": "a"}),
            "out of vocabulary": client.post("/detokenize", json={"model": "production", "tokens": [0, 10**9]}),
            "not ids": client.post("/detokenize", json={"tokens": ["a"]}),
            "too long": client.post("/tokenize", json={"model": "production", "prompt": "1" * 5000}),
        }
        assert {why: r.status_code for why, r in refused.items()} == {
            "both": 400,
            "neither": 400,
            "unknown model": 404,
            "out of vocabulary": 400,
            "not ids": 400,
            "too long": 400,
        }
        assert "1000000000" in refused["out of vocabulary"].json()["error"]["message"]
        assert "exactly one of prompt or messages" in refused["both"].json()["error"]["message"]
        assert client.get("/health").json()["status"] == "ready"  # and it keeps serving
