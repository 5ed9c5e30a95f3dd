"""Per-row speculative rounds (`speculative_rows`): each row of a batch keeps its own verified
prefix, decodes the tokens of the step-by-step loop and of its solo run, and accepts about as much
of its drafts batched as it does alone."""

from __future__ import annotations

import pytest
import torch

from sampler import CommitTrace, SamplerConfig, generate
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
LENGTHS = [5, 3, 7, 4, 6, 2]
MODES = [
    {},
    {"cache": "dual"},
    {"cache": "prefix", "cfg_scale": 1.0},
    {"parallel": "threshold", "parallel_threshold": 0.5},
    {"cache": "dual", "parallel": "factor", "parallel_factor": 2.0, "early_exit": "eos_decided"},
    {"cache": "dual", "future_window": 8, "eot_predict": "eos_run", "eot_confidence": 0.3},
]
IDS_OF = ["top_k", "dual", "prefix+cfg", "threshold", "dual+factor+exit", "dual+window+eot"]


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def prompts():
    return left_padded_prompts(LENGTHS, seed=1)


@pytest.mark.parametrize("mode", MODES, ids=IDS_OF)
def test_per_row_rounds_give_the_step_by_step_tokens_in_fewer_calls(model, prompts, mode):
    ids, mask = prompts
    base = SamplerConfig(steps=32, gen_length=32, block_length=8, **IDS, **mode)
    plain = generate(model, ids, base, attention_mask=mask)
    together = generate(model, ids, base.with_(speculative_draft=4), attention_mask=mask)
    apart = generate(model, ids, base.with_(speculative_draft=4, speculative_rows=True), attention_mask=mask)
    assert torch.equal(apart.sequences, plain.sequences)
    assert apart.sequential_calls <= together.sequential_calls <= plain.sequential_calls
    assert apart.speculative.acceptance_rate > together.speculative.acceptance_rate


@pytest.mark.parametrize("mode", MODES[:2] + MODES[3:4], ids=IDS_OF[:2] + IDS_OF[3:4])
def test_each_row_decodes_as_alone_and_accepts_about_what_it_accepts_alone(model, prompts, mode):
    ids, mask = prompts
    cfg = SamplerConfig(steps=32, gen_length=32, block_length=8, speculative_draft=4, **IDS, **mode)
    batch = generate(model, ids, cfg.with_(speculative_rows=True), attention_mask=mask)
    drafted = accepted = 0
    for row, n in enumerate(LENGTHS):
        solo = generate(model, ids[row : row + 1, -n:], cfg)
        assert torch.equal(batch.generated[row], solo.generated[0]), f"row {row}"
        drafted, accepted = drafted + solo.speculative.drafted_steps, accepted + solo.speculative.accepted_steps
    assert batch.speculative.acceptance_rate >= 0.9 * accepted / drafted  # the target: within 10% of per prompt


def test_a_round_is_reported_once_and_the_trace_covers_every_commit(model, prompts):
    ids, mask = prompts
    cfg = SamplerConfig(steps=32, gen_length=32, block_length=8, speculative_draft=4, speculative_rows=True, **IDS)
    steps, trace = [], CommitTrace()
    out = generate(model, ids, cfg, attention_mask=mask, on_step=lambda s: (steps.append(s), trace(s)))
    assert len(steps) == out.sequential_calls and torch.equal(steps[-1].sequences, out.sequences)
    canvas = torch.cat([ids, torch.full((len(LENGTHS), 32), MASK_ID)], dim=1)
    for s in steps:
        assert not (s.committed & (canvas != MASK_ID)).any(), f"step {s.step} rewrote a decided position"
        canvas = s.sequences
    filled = out.generated != MASK_ID
    assert (torch.tensor(trace.generated(out.prompt_length)) >= 0)[filled].all()  # every filled position was committed


@pytest.mark.parametrize(
    "changes,message",
    [
        ({}, "speculative_rows=True lets rows of one speculative round advance apart: needs speculative_draft >= 2"),
        ({"speculative_draft": 4, "cache": "dual", "cache_refresh": 2}, "and cache_refresh=0"),
    ],
)
def test_per_row_rounds_need_drafts_and_no_mid_block_refresh(changes, message):
    with pytest.raises(ValueError, match=message):
        SamplerConfig(speculative_rows=True, **changes)


def test_per_row_rounds_are_part_of_the_hash_only_when_on():
    base = SamplerConfig(speculative_draft=4)
    assert base.with_(speculative_rows=False).hash() == base.hash() != base.with_(speculative_rows=True).hash()


def test_a_last_draft_no_row_ends_on_finishes_the_decode_without_a_crash():
    """Rows that stop at different drafts, and a draft that no row ends on finishing the whole decode (early exit):
    that draft has no per-row steps, which the round's acceptance once stacked as None (a TypeError in torch.stack).
    The per-row tokens still equal the step-by-step loop's."""
    model = tiny_model(seed=1)
    ids, mask = left_padded_prompts(LENGTHS, seed=0)
    base = SamplerConfig(steps=8, gen_length=8, block_length=8, early_exit="eos_decided", **IDS)
    plain = generate(model, ids, base, attention_mask=mask)
    rows = generate(model, ids, base.with_(speculative_draft=4, speculative_rows=True), attention_mask=mask)
    assert torch.equal(rows.generated, plain.generated)
