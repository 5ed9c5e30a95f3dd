"""Adapters: every kind of candidate behind one model handle (`models.load`) and one `decode`; every entry loads or
says why."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
import yaml

from models import load
from models.adapters import AdapterError, APIAdapter, CausalLMAdapter, LLaDAAdapter, NotEvaluable, availability
from models.catalog import load_catalog
from models.checkpoint import save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM, init_weights
from sampler import SamplerConfig, generate
from sampler.decode import DecodeError, decode

PROMPT = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])


def tiny_llada(folder, causal: bool, seed: int = 1):
    cfg = LLaDAConfig(
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        n_layers=2,
        vocab_size=50,
        mask_token_id=49,
        eos_token_id=48,
        max_sequence_length=128,
        causal=causal,
    )
    model = init_weights(LLaDAModelLM(cfg), seed=seed)
    save_checkpoint(model, folder)
    return model.eval()


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama saved by transformers as safetensors (what a Hub Llama/Qwen folder looks like)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def greedy_without_cache(forward, ids, n):
    """Reference AR decoding: recompute the whole prefix at every step, take the argmax."""
    x = ids
    with torch.no_grad():
        for _ in range(n):
            x = torch.cat([x, forward(x).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return x


def test_llada_adapter_runs_the_diffusion_sampler(tmp_path):
    model = tiny_llada(tmp_path / "llada", causal=False)
    adapter = load(tmp_path / "llada")
    assert isinstance(adapter, LLaDAAdapter) and adapter.kind == "masked-diffusion"
    config = SamplerConfig(steps=8, gen_length=8, block_length=4, **adapter.sampler_ids())
    out = decode(adapter, PROMPT, config)
    assert torch.equal(out.sequences, generate(model, PROMPT, config).sequences)
    with pytest.raises(DecodeError, match="mask_id"):
        decode(adapter, PROMPT, config.with_(mask_id=7))


def test_causal_llada_layout_runs_as_llama_with_identical_logits_and_tokens(tmp_path):
    native = tiny_llada(tmp_path / "ar", causal=True)
    adapter = load(tmp_path / "ar", adapter="causal-lm")
    assert isinstance(adapter, CausalLMAdapter) and type(adapter.model).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert torch.equal(adapter.model(PROMPT).logits, native(PROMPT).logits)
    config = SamplerConfig(steps=12, gen_length=12, block_length=12, mask_id=49, eos_id=48, eot_id=None)
    out = decode(adapter, PROMPT, config)
    expected = greedy_without_cache(native, PROMPT, 12)
    for row in range(2):  # up to the first EOS; after it the row is EOS-filled
        tokens = expected[row, 5:].tolist()
        stop = tokens.index(48) + 1 if 48 in tokens else 12
        assert out.sequences[row, 5 : 5 + stop].tolist() == tokens[:stop]
    from sampler.autoregressive import generate_autoregressive

    twin = generate_autoregressive(native, PROMPT, config)
    assert torch.equal(out.sequences, twin.sequences)  # the same answer as unmask's own AR decoder


def test_hf_causal_lm_greedy_kv_cache_matches_full_recompute(tiny_llama):
    adapter = load(tiny_llama)
    assert isinstance(adapter, CausalLMAdapter) and adapter.eos_ids == (2,)
    out = decode(adapter, PROMPT, SamplerConfig(steps=10, gen_length=10, block_length=10, eos_id=2, eot_id=None))
    assert out.sequences.shape == (2, 15) and out.stats["kv_cache"]
    expected = greedy_without_cache(adapter.model, PROMPT, 10)
    for row in range(2):
        tokens = expected[row, 5:].tolist()
        stop = tokens.index(2) + 1 if 2 in tokens else 10
        assert out.sequences[row, 5 : 5 + stop].tolist() == tokens[:stop]
        assert set(out.sequences[row, 5 + stop :].tolist()) <= {2}


def test_hf_causal_lm_sampling_is_seeded(tiny_llama):
    adapter = load(tiny_llama)
    config = SamplerConfig(steps=10, gen_length=10, block_length=10, temperature=1.0, seed=5)
    a, b = decode(adapter, PROMPT, config), decode(adapter, PROMPT, config)
    assert torch.equal(a.sequences, b.sequences)
    assert not torch.equal(a.sequences, decode(adapter, PROMPT, config.with_(seed=6)).sequences)


def test_pickle_only_causal_lm_is_refused(tmp_path, tiny_llama):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_llama / "config.json").read_text())
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(AdapterError, match="only pickle weights"):
        load(folder)


def test_catalog_id_loads_through_its_source_folder(tmp_path, tiny_llama):
    catalog_path = tmp_path / "catalog.yaml"
    catalog_path.write_text(
        yaml.safe_dump(
            {
                "entries": [
                    {
                        "id": "my-llama",
                        "family": "llama",
                        "kind": "autoregressive",
                        "role": "fallback",
                        "source": str(tiny_llama),
                        "allow_outside_source": True,
                        "license": "Apache-2.0",
                        "adapter": "causal-lm",
                        "decoding": {"eos_id": 2},
                    },
                    {
                        "id": "remote",
                        "family": "llama",
                        "kind": "autoregressive",
                        "role": "fallback",
                        "source": "hf://o/remote",
                        "revision": "main",
                        "license": "Apache-2.0",
                        "adapter": "causal-lm",
                    },
                ]
            }
        )
    )
    catalog = load_catalog(catalog_path)
    adapter = load("my-llama", catalog=catalog, store=tmp_path / "store")
    assert adapter.entry_id == "my-llama" and adapter.eos_ids == (2,)
    with pytest.raises(NotEvaluable, match=r"not pulled yet: run `unmask pull remote`"):
        load("remote", catalog=catalog, store=tmp_path / "store")


def test_every_shipped_entry_loads_or_explains_why_not(tmp_path):
    for entry in load_catalog():
        ok, reason = availability(entry, store=tmp_path / "store")
        assert reason
        if ok:
            adapter = load(entry.id, store=tmp_path / "store")
            assert adapter.entry_id == entry.id
        elif not entry.is_api:
            with pytest.raises(NotEvaluable):
                load(entry.id, store=tmp_path / "store")


class _ChatHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = self.headers["Authorization"] == "Bearer k" and self.path == "/v1/chat/completions"
        reply = {"choices": [{"message": {"content": f"echo {body['model']}: {body['messages'][0]['content']}"}}]}
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(reply).encode())

    def log_message(self, *args):
        pass


def test_api_entry_is_not_evaluable_without_a_key_then_answers_with_one(monkeypatch, tmp_path):
    mercury = load_catalog().get("mercury")
    monkeypatch.delenv(mercury.api_key_env, raising=False)
    adapter = load("mercury")
    assert isinstance(adapter, APIAdapter) and adapter.entry.license == "other"
    with pytest.raises(NotEvaluable, match=f"needs a key in \\${mercury.api_key_env}"):
        adapter.complete("hi")
    server = HTTPServer(("127.0.0.1", 0), _ChatHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        catalog_path = tmp_path / "catalog.yaml"
        catalog_path.write_text(
            yaml.safe_dump(
                {
                    "entries": [
                        {
                            "id": "local-api",
                            "family": "mercury",
                            "kind": "api",
                            "role": "candidate",
                            "source": f"http://127.0.0.1:{server.server_port}/v1",
                            "api_model": "m",
                            "api_key_env": "TEST_API_KEY",
                            "license": "other",
                            "license_name": "Terms",
                            "license_link": "https://example.com/terms",
                        }
                    ]
                }
            )
        )
        monkeypatch.setenv("TEST_API_KEY", "k")
        local = load("local-api", catalog=load_catalog(catalog_path))
        assert local.complete("hello") == "echo m: hello"
        with pytest.raises(DecodeError, match="text, not token ids"):
            decode(local, PROMPT, SamplerConfig())
    finally:
        server.shutdown()
