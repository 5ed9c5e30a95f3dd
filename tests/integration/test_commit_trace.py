"""`CommitTrace` (an `on_step` callback) and `unmask generate --trace`: which step committed each
position, without changing what is decoded."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from flows.commands.generate import END, MASKED, commit_timeline
from sampler import CommitTrace, SamplerConfig, generate
from tests.support.flow_fixtures import cli_app
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


def test_one_token_per_step_commits_each_position_once_block_by_block(model):
    prompts, attention = left_padded_prompts([5, 9, 7])
    config = SamplerConfig(steps=32, gen_length=32, block_length=8, **IDS)
    plain = generate(model, prompts, config, attention_mask=attention)
    trace = CommitTrace()
    traced = generate(model, prompts, config, attention_mask=attention, on_step=trace)
    assert torch.equal(plain.sequences, traced.sequences)
    assert int(trace.steps.max()) + 1 == traced.sequential_calls == 32  # every step was reported, once
    for row in trace.generated(traced.prompt_length):
        assert sorted(row) == list(range(32))  # every step commits exactly one position
        blocks = [row[b * 8 : (b + 1) * 8] for b in range(4)]
        assert all(max(blocks[b]) < min(blocks[b + 1]) for b in range(3))  # semi-autoregressive order


def test_speculative_drafts_that_are_rejected_leave_no_trace(model):
    prompts, attention = left_padded_prompts([6, 4])
    config = SamplerConfig(steps=16, gen_length=32, block_length=8, parallel="threshold", parallel_threshold=0.3, **IDS)
    plain_trace, fast_trace, reported = CommitTrace(), CommitTrace(), []
    plain = generate(model, prompts, config, attention_mask=attention, on_step=plain_trace)
    fast = generate(
        model,
        prompts,
        replace(config, speculative_draft=4),
        attention_mask=attention,
        on_step=lambda info: (reported.append(info.step), fast_trace(info)),
    )
    assert torch.equal(plain.sequences, fast.sequences)
    assert fast.speculative.drafted_steps > fast.speculative.accepted_steps  # some drafts were rejected
    assert fast_trace.generated(fast.prompt_length) == plain_trace.generated(plain.prompt_length)
    assert reported == list(range(plain.sequential_calls))  # the kept steps, each once


def test_timeline_shows_the_end_of_the_canvas_decided_first():
    pieces = ["a", "b", END, END]
    lines, summary = commit_timeline(pieces, [3, 2, 0, 1], snapshots=4)
    assert lines == [
        f"step 0  {MASKED}{MASKED}{END}{MASKED}",
        f"step 1  {MASKED}{MASKED}{END}{END}",
        f"step 2  {MASKED}b{END}{END}",
        f"step 3  ab{END}{END}",
    ]
    assert summary.endswith("2 of 2")
    _, in_order = commit_timeline(pieces, [0, 1, 2, 3])
    assert in_order.endswith("0 of 2")


def test_unmask_generate_trace_prints_the_timeline():
    result = CliRunner().invoke(
        cli_app("generate"), ["generate", "Sort: dcba", "--gen-length", "32", "--trace"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    steps = [line for line in result.output.splitlines() if line.startswith("step ")]
    assert len(steps) == 12 and steps[-1].split()[1] == "31" and MASKED not in steps[-1].split("  ", 1)[1]
    assert "end tokens committed before the text was complete:" in result.output


def test_unmask_generate_decodes_the_ar_twin_autoregressively():
    prompt = "A box has 10 cups. Tom adds 14. How many in the box?"
    result = CliRunner().invoke(
        cli_app("generate"), ["generate", prompt, "--model", "tiny-ar", "--gen-length", "32", "--raw"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("#### 24")  # the diffusion sampler on this causal model gave digit soup
    traced = CliRunner().invoke(
        cli_app("generate"), ["generate", prompt, "--model", "tiny-ar", "--trace"], env={"COLUMNS": "200"}
    )
    assert traced.exit_code == 2 and "autoregressive" in traced.output
