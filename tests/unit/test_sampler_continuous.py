"""Block-granular continuous batching (sampler/continuous.py): rows that join a running batch at different
blocks, and leave it when done, decode exactly what `generate` gives each prompt alone.

Real parts: the bundled tiny-llada's trained weights, held-out arith prompts of several lengths.
"""

from __future__ import annotations

import pytest
import torch

import models
from evals.tasks import get_task, make_split
from sampler.config import COMMIT_RULES, SamplerConfig
from sampler.continuous import Row, decode_block, joins_running_batch, running_key
from sampler.decode import padding_id
from sampler.generate import generate

ARRIVALS = [0, 0, 1, 2, 2, 3, 5]  # the block boundary at which each prompt joins


@pytest.fixture(scope="module")
def llada():
    return models.load("tiny-llada")


@pytest.fixture(scope="module")
def prompts(llada):
    rows = [llada.encode(item.prompt) for item in make_split(get_task("arith"), "test", len(ARRIVALS), seed=0)]
    assert len(set(map(len, rows))) > 1  # rows need padding on the left as well as on the right
    return rows


def run_continuously(llada, prompts: list[list[int]], config: SamplerConfig, lengths: list[int]) -> list[Row]:
    """Rows (of `lengths`) join at their ARRIVALS boundary, decode a block per call, and leave when done."""
    rows, running, boundary = [Row(p, n) for p, n in zip(prompts, lengths)], [], 0
    while not all(row.done for row in rows):
        running = [row for row in running if not row.done]
        running += [row for row, at in zip(rows, ARRIVALS) if at == boundary]
        if running:
            decode_block(llada.model, running, config, padding_id(llada))
        boundary += 1
    return rows


CONFIGS = [
    {"gen_length": 32, "block_length": 8, "steps": 16},
    {
        "gen_length": 32,
        "block_length": 8,
        "steps": 32,
        "parallel": "threshold",
        "cache": "dual",
        "early_exit": "eos_decided",
    },
    {
        "gen_length": 64,
        "block_length": 8,
        "steps": 32,
        "parallel": "threshold",
        "cache": "prefix",
        "future_window": 16,
        "early_exit": "eos_decided",
    },
    {
        "gen_length": 64,
        "block_length": 16,
        "steps": 64,
        "cache": "dual",
        "eot_predict": "eos_run",
        "early_exit": "eos_decided",
    },
    {
        "gen_length": 48,
        "block_length": 16,
        "steps": 24,
        "remasking": "low_confidence",
        "cache": "dual",
        "cache_refresh": 2,
        "future_window": 8,
    },
] + [
    {"gen_length": 32, "block_length": 8, "steps": 32, "parallel": rule}
    for rule, policy in COMMIT_RULES.items()
    if not getattr(policy, "draws", False)  # a rule that draws (ancestral) never joins: test below
]


@pytest.mark.parametrize("settings", CONFIGS, ids=lambda s: "/".join(f"{k}={v}" for k, v in s.items()))
def test_rows_joining_at_different_blocks_decode_what_they_decode_alone(llada, prompts, settings):
    config = SamplerConfig(**settings, **llada.sampler_ids())
    with torch.inference_mode():
        alone = [generate(llada.model, torch.tensor([p]), config).sequences[0, len(p) :].tolist() for p in prompts]
        rows = run_continuously(llada, prompts, config, [config.gen_length] * len(prompts))
    assert [row.tokens for row in rows] == alone
    assert max(max(row.batches) for row in rows) >= 3  # they did share blocks, or this proves nothing
    if config.early_exit != "none":
        assert any(row.block < config.num_blocks for row in rows)  # some left early, the others kept going


def test_rows_of_different_lengths_share_a_running_batch_and_decode_what_they_decode_alone(llada, prompts):
    config = SamplerConfig(
        gen_length=32,
        block_length=8,
        steps=32,
        parallel="threshold",
        cache="dual",
        future_window=8,
        **llada.sampler_ids(),
    )
    lengths = [8, 40, 16, 32, 24, 8, 48]  # max_tokens of seven requests, in whole blocks
    own = [config.with_(gen_length=n, steps=n) for n in lengths]
    assert len({running_key(c) for c in own}) == 1 and len({c.hash() for c in own}) == len(set(lengths))
    with torch.inference_mode():
        alone = [
            generate(llada.model, torch.tensor([p]), c).sequences[0, len(p) :].tolist() for p, c in zip(prompts, own)
        ]
        rows = run_continuously(llada, prompts, config, lengths)
    assert [row.tokens for row in rows] == alone and [len(row.tokens) for row in rows] == lengths


def test_a_row_streams_only_what_no_later_block_can_change(llada, prompts):
    config = SamplerConfig(gen_length=32, block_length=8, steps=16, **llada.sampler_ids())
    row = Row(prompts[0], config.gen_length)
    with torch.inference_mode():
        decode_block(llada.model, [row], config, padding_id(llada))
    assert not row.done and row.final_length(config) == 8 == len(row.tokens)
    with pytest.raises(ValueError, match="finished row"):
        while True:
            decode_block(llada.model, [row], config, padding_id(llada))
    assert row.done and row.final_length(config) == 32


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.7},
        {"remasking": "random"},
        {"parallel": "ancestral"},
        {"speculative_draft": 4},
        {"cfg_scale": 1.0},
        {"backend": "onnxruntime"},
    ],
)
def test_configs_whose_rows_depend_on_the_batch_do_not_join_a_running_batch(llada, prompts, change):
    config = SamplerConfig(gen_length=32, block_length=8, steps=16, **llada.sampler_ids()).with_(**change)
    assert not joins_running_batch(config)
    with pytest.raises(ValueError, match="cannot decode in a running batch"):
        decode_block(llada.model, [Row(prompts[0], 32)], config, padding_id(llada))
