"""future_window: a forward sees the current block and W positions after it, never the rest of the
canvas; a window that covers the canvas is the plain decode, and a windowed block decodes as the
same block of a canvas that ends where the window does."""

from __future__ import annotations

import pytest
import torch

from sampler import SamplerConfig, generate
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
MODES = [
    {},
    {"cache": "prefix"},
    {"cache": "dual"},
    {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.5},
    {"early_exit": "eos_decided"},
]
MODE_IDS = ["no-cache", "prefix", "dual", "dual+threshold", "exit"]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def prompts():
    return left_padded_prompts([5, 3, 7], seed=1)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_window_covering_the_canvas_is_the_plain_decode(model, prompts, mode):
    ids, mask = prompts
    base = SamplerConfig(steps=32, gen_length=32, block_length=8, **IDS, **mode)
    plain = generate(model, ids, base, attention_mask=mask)
    covering = generate(model, ids, base.with_(future_window=24), attention_mask=mask)  # block 0 ends 24 before the end
    assert torch.equal(covering.sequences, plain.sequences)


@pytest.mark.parametrize("mode", MODES[:3], ids=MODE_IDS[:3])
def test_a_windowed_block_decodes_as_on_a_canvas_that_ends_at_the_window(model, prompts, mode):
    """Block 0 of a 64-position canvas with W=8 sees what block 0 of a 16-position canvas sees."""
    ids, mask = prompts
    long = SamplerConfig(steps=64, gen_length=64, block_length=8, future_window=8, **IDS, **mode)
    short = SamplerConfig(steps=16, gen_length=16, block_length=8, **IDS, **mode)  # the same 8 steps per block
    P = ids.shape[1]
    windowed = generate(model, ids, long, attention_mask=mask).sequences[:, : P + 8]
    assert torch.equal(windowed, generate(model, ids, short, attention_mask=mask).sequences[:, : P + 8])
    whole = generate(model, ids, long.with_(future_window=0), attention_mask=mask).sequences[:, : P + 8]
    assert not torch.equal(windowed, whole)  # the window changed what the model saw: it is lossy by design


@pytest.mark.parametrize(
    "cache,expected",
    [
        ("none", [20, 20, 24, 24, 28, 28, 32, 32]),  # prompt 4 + the block's end + 12, capped at the canvas (32)
        ("prefix", [20, 16, 24, 16, 28, 16, 32, 16]),  # between refreshes: the block and the window after it
        ("dual", [20, 4, 24, 4, 28, 4, 32, 4]),  # between refreshes: the block alone
    ],
)
def test_no_forward_runs_past_the_window(model, cache, expected):
    ids, _ = left_padded_prompts([4], seed=0)
    widths = []

    def spy(x, attention_mask=None, **kw):
        widths.append(x.shape[1])
        return model(x, attention_mask=attention_mask, **kw)

    cfg = SamplerConfig(steps=14, gen_length=28, block_length=4, future_window=12, cache=cache, **IDS)
    out = generate(spy, ids, cfg)
    assert widths[:8] == expected and len(widths) == 14
    assert (out.generated != MASK_ID).float().mean() > 0.9  # MASK_ID itself may be proposed


@pytest.mark.parametrize(
    "mode",
    [{}, {"cache": "dual"}, {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.5}],
    ids=MODE_IDS[:1] + MODE_IDS[2:4],
)
def test_speculative_decoding_stays_lossless_under_a_window(model, prompts, mode):
    ids, mask = prompts
    base = SamplerConfig(steps=32, gen_length=32, block_length=8, future_window=8, **IDS, **mode)
    plain = generate(model, ids, base, attention_mask=mask)
    fast = generate(model, ids, base.with_(speculative_draft=4), attention_mask=mask)
    assert torch.equal(fast.sequences, plain.sequences)
    assert fast.sequential_calls <= plain.sequential_calls


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_padded_batch_decodes_each_row_as_alone_under_a_window(model, prompts, mode):
    ids, mask = prompts
    cfg = SamplerConfig(steps=32, gen_length=32, block_length=8, future_window=8, **IDS, **mode)
    batch = generate(model, ids, cfg, attention_mask=mask).generated
    for row, n in enumerate([5, 3, 7]):
        solo = generate(model, ids[row : row + 1, -n:], cfg).generated
        if mode.get("early_exit"):
            text = lambda r: r.tolist()[: r.tolist().index(EOS_ID)] if EOS_ID in r.tolist() else r.tolist()  # noqa: E731
            assert text(batch[row]) == text(solo[0])
        else:
            assert torch.equal(batch[row], solo[0]), f"row {row}"


def test_a_negative_window_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"SamplerConfig.future_window must be a non-negative integer, got -1"):
        SamplerConfig(future_window=-1)


def test_the_window_is_part_of_the_hash_only_when_set():
    base = SamplerConfig()
    assert base.with_(future_window=0).hash() == base.hash() != base.with_(future_window=32).hash()
