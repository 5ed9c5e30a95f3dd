"""The KV-cached AR decoder of the causal twin agrees with decoding by full recomputation."""

from __future__ import annotations

import pytest
import torch

from models.llada import LLaDAConfig, LLaDAModelLM, init_weights
from sampler import SamplerConfig
from sampler.autoregressive import generate_autoregressive

EOS, MASK = 1, 3


@pytest.fixture(scope="module")
def causal_model():
    cfg = LLaDAConfig(d_model=32, n_heads=4, n_layers=2, mlp_hidden_size=64, vocab_size=40, max_sequence_length=128,
                      mask_token_id=MASK, eos_token_id=EOS, causal=True)
    return init_weights(LLaDAModelLM(cfg), seed=3, std=0.3).eval()


def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Recompute the whole sequence for every new token."""
    seq = list(prompt)
    for _ in range(n):
        token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        seq.append(token)
        if token == EOS:
            break
    return seq[len(prompt):]


def config(n: int, **kw) -> SamplerConfig:
    return SamplerConfig(steps=n, gen_length=n, block_length=n, mask_id=MASK, eos_id=EOS, eot_id=None, **kw)


def test_cached_greedy_equals_recomputation(causal_model):
    prompt = [5, 9, 12, 7]
    out = generate_autoregressive(causal_model, torch.tensor([prompt]), config(12))
    expected = naive_greedy(causal_model, prompt, 12)
    assert out.generated[0, : len(expected)].tolist() == expected
    assert out.sequences[0, :4].tolist() == prompt
    assert out.nfe == len(expected)  # one call for the prompt (yields the first token), one per further token


def test_left_padded_batch_equals_single_rows(causal_model):
    prompts = [[5, 9, 12, 7, 20], [8, 30], [11, 6, 2 + 20]]
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    batched = generate_autoregressive(causal_model, ids, config(10), attention_mask=mask)
    for i, p in enumerate(prompts):
        single = generate_autoregressive(causal_model, torch.tensor([p]), config(10))
        assert batched.generated[i].tolist() == single.generated[0].tolist()


class StopAfter(torch.nn.Module):
    """Wraps a model so EOS wins once the sequence reaches `length` tokens."""

    def __init__(self, model, length: int):
        super().__init__()
        self.inner, self.length = model, length

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        out = self.inner(input_ids, attention_mask=attention_mask, past_key_values=past_key_values, use_cache=use_cache)
        if attention_mask.shape[1] >= self.length:
            out.logits[:, -1, EOS] += 1e4
        return out


def test_stops_at_eos_and_pads_with_it(causal_model):
    out = generate_autoregressive(StopAfter(causal_model, 6), torch.tensor([[5, 9]]), config(16))
    row = out.generated[0].tolist()
    first = row.index(EOS)
    assert first <= 4 and all(t == EOS for t in row[first:])
    assert out.nfe == first + 1


def test_temperature_sampling_is_seeded(causal_model):
    a = generate_autoregressive(causal_model, torch.tensor([[5, 9]]), config(8, temperature=1.0, seed=7))
    b = generate_autoregressive(causal_model, torch.tensor([[5, 9]]), config(8, temperature=1.0, seed=7))
    assert torch.equal(a.sequences, b.sequences)
