"""The KV-cached AR decoder of the causal twin agrees with decoding by full recomputation."""

from __future__ import annotations

import pytest
import torch

from models.llada import LLaDAConfig, LLaDAModelLM, init_weights
from sampler import CommitTrace, SamplerConfig
from sampler.autoregressive import generate_autoregressive

EOS, MASK = 1, 3


@pytest.fixture(scope="module")
def causal_model():
    cfg = LLaDAConfig(
        d_model=32,
        n_heads=4,
        n_layers=2,
        mlp_hidden_size=64,
        vocab_size=40,
        max_sequence_length=128,
        mask_token_id=MASK,
        eos_token_id=EOS,
        causal=True,
    )
    return init_weights(LLaDAModelLM(cfg), seed=3, std=0.3).eval()


def naive_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Recompute the whole sequence for every new token."""
    seq = list(prompt)
    for _ in range(n):
        token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
        seq.append(token)
        if token == EOS:
            break
    return seq[len(prompt) :]


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
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
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


def reported_steps(decode, *args, **kwargs):
    steps = []
    return decode(*args, on_step=steps.append, **kwargs), steps


def test_each_token_is_one_reported_step_and_block_length_tokens_make_a_block(causal_model):
    ids, cfg = torch.tensor([[5, 9], [2, 3]]), config(12).with_(block_length=4)
    out, steps = reported_steps(generate_autoregressive, causal_model, ids, cfg)
    assert torch.equal(
        out.sequences, generate_autoregressive(causal_model, ids, cfg).sequences
    )  # the callback changes nothing
    assert [s.step for s in steps] == list(range(12)) and out.sequential_calls == out.nfe == 12
    ended = [row.index(EOS) if EOS in row else 12 for row in out.generated.tolist()]
    assert ended[0] < ended[1] == 12  # row 0 ends early, row 1 runs to the end
    for s in steps:  # a row commits its tokens up to and with its EOS, then only pads
        assert torch.equal(s.sequences, out.sequences[:, : 2 + s.step + 1])
        assert s.committed[:, :-1].sum() == 0 and s.committed[:, -1].tolist() == [s.step <= e for e in ended]
    assert [(s.step, s.block) for s in steps if s.block_done] == [(3, 0), (7, 1), (11, 2)]
    assert out.block_nfe == [4, 4, 4] and out.tokens_per_forward == 1.0 and not out.autoregressive.stopped_early
    trace = CommitTrace()  # grows with the sequence: token i committed at step i, the pads never
    generate_autoregressive(causal_model, ids, cfg, on_step=trace)
    assert trace.generated(2) == [[0, 1] + [-1] * 10, list(range(12))]


def test_rows_that_all_end_finish_the_block_at_once(causal_model):
    out, steps = reported_steps(generate_autoregressive, StopAfter(causal_model, 6), torch.tensor([[5, 9]]), config(16))
    assert out.nfe < 16 and out.autoregressive.stopped_early
    assert [(s.block, s.block_done) for s in steps] == [(0, False)] * (out.nfe - 1) + [(0, True)]


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
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
    ).eval()


def test_transformers_generate_reports_each_token_through_a_streamer(tiny_llama):
    from types import SimpleNamespace

    from sampler.decode import decode_causal_lm

    prompt = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])
    cfg = SamplerConfig(steps=16, gen_length=16, block_length=8, eos_id=6, eot_id=None)
    adapter = SimpleNamespace(model=tiny_llama, eos_ids=(6,), pad_id=0)  # what decode_causal_lm reads of an adapter
    out, steps = reported_steps(decode_causal_lm, adapter, prompt, cfg)
    assert torch.equal(out.sequences, decode_causal_lm(adapter, prompt, cfg).sequences)
    assert [s.step for s in steps] == list(range(out.nfe)) and torch.equal(
        steps[-1].sequences, out.sequences[:, : 5 + out.nfe]
    )
    ended = [row.index(6) if 6 in row else 16 for row in out.generated.tolist()]
    assert ended[0] < ended[1] == 16  # row 0 ends early (its later tokens are pads), row 1 runs to the end
    assert all(s.committed[:, -1].tolist() == [s.step <= e for e in ended] for s in steps)
    assert [s.step for s in steps if s.block_done] == [7, 15]
    ends_early = SimpleNamespace(model=tiny_llama, eos_ids=(6, 18), pad_id=0)  # both rows end within the first block
    out, steps = reported_steps(decode_causal_lm, ends_early, prompt, cfg)
    assert out.nfe < 8 and [(s.block, s.block_done) for s in steps][-1] == (0, True)
    assert out.autoregressive.stopped_early and out.autoregressive.kv_cache
