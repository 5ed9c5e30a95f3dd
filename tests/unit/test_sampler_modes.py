"""Fast-decoding modes: config validation and hashing, commit rules on hand-built confidences,
early exit, and batch invariance with left padding in every mode."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from sampler import CommitTrace, SamplerConfig, generate
from sampler.commit import EntropyBoundedCommit, FactorCommit, ThresholdCommit, TopKCommit
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
NEG = -torch.inf


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("parallel", "greedy", "SamplerConfig.parallel='greedy'"),
        ("parallel_threshold", 0.0, "SamplerConfig.parallel_threshold must be in"),
        ("parallel_factor", -1.0, "SamplerConfig.parallel_factor must be > 0"),
        ("entropy_bound", 0.0, "SamplerConfig.entropy_bound must be > 0"),
        ("cache", "both", "SamplerConfig.cache='both'"),
        ("cache_refresh", -1, "SamplerConfig.cache_refresh must be a non-negative integer"),
        ("speculative_draft", 1, "SamplerConfig.speculative_draft=1"),
        ("early_exit", "soon", "SamplerConfig.early_exit='soon'"),
        ("backend", "tensorrt", "SamplerConfig.backend='tensorrt'"),
    ],
)
def test_bad_mode_settings_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        SamplerConfig(**{field: value})


def test_speculative_needs_deterministic_decoding():
    with pytest.raises(ValueError, match="speculative_draft=4 is lossless only for deterministic"):
        SamplerConfig(speculative_draft=4, temperature=0.5)


def test_configs_recorded_before_the_modes_keep_their_hash():
    cfg = SamplerConfig(steps=64, gen_length=64, temperature=0.5)
    old_fields = {k: v for k, v in cfg.to_dict().items() if k not in SamplerConfig._HASH_OPTIONAL}
    old = hashlib.sha256(json.dumps(old_fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert cfg.hash() == old
    changed = [
        cfg.with_(parallel="threshold"),
        cfg.with_(cache="dual"),
        cfg.with_(cache="dual", cache_refresh=4),
        cfg.with_(early_exit="eos_decided"),
        cfg.with_(backend="onnxruntime"),
        cfg.with_(parallel_factor=2.0),
    ]
    assert len({c.hash() for c in changed} | {old}) == len(changed) + 1
    round_trip = SamplerConfig.from_json(changed[2].to_json())
    assert round_trip == changed[2] and round_trip.hash() == changed[2].hash()


def _cfg(**kw):
    return SamplerConfig(**({"steps": 8, "gen_length": 8, "block_length": 8} | kw))


def test_threshold_commits_all_confident_and_at_least_one():
    rule = ThresholdCommit(_cfg(parallel="threshold", parallel_threshold=0.9))
    conf = torch.tensor([[0.95, 0.2, 0.91, NEG], [0.5, 0.3, NEG, 0.4], [NEG, NEG, NEG, NEG]])
    got = rule.select(conf, None, 0, None)
    assert got.tolist() == [[True, False, True, False], [True, False, False, False], [False] * 4]


def test_factor_rule_commits_while_n_plus_one_times_doubt_is_small():
    rule = FactorCommit(_cfg(parallel="factor", parallel_factor=1.0))
    # sorted: 0.9 (2*0.1=0.2<1), 0.8 (3*0.2=0.6<1), 0.7 (4*0.3=1.2 stop), 0.99 first
    conf = torch.tensor([[0.7, 0.9, 0.99, 0.8, NEG]])
    assert rule.select(conf, None, 0, None).tolist() == [[False, True, True, True, False]]
    low = torch.tensor([[0.1, 0.3, NEG]])
    assert rule.select(low, None, 0, None).tolist() == [[False, True, False]]


def test_entropy_rule_commits_lowest_entropy_under_the_bound():
    rule = EntropyBoundedCommit(_cfg(parallel="entropy", entropy_bound=0.5))
    conf = torch.tensor([[0.9, 0.8, 0.7, NEG]])
    entropy = torch.tensor([[0.3, 0.1, 0.2, 0.0]])
    assert rule.select(conf, lambda: entropy, 0, None).tolist() == [[False, True, True, False]]
    big = torch.tensor([[2.0, 3.0, 4.0, 0.0]])
    assert rule.select(conf, lambda: big, 0, None).tolist() == [[True, False, False, False]]


def test_top_k_follows_the_schedule():
    rule = TopKCommit(_cfg())
    plan = rule.plan(torch.ones(1, 5, dtype=torch.bool), 2)
    assert plan.tolist() == [[3, 2]]
    conf = torch.tensor([[0.1, 0.5, 0.3, 0.9, NEG]])
    assert rule.select(conf, None, 0, plan).tolist() == [[False, True, True, True, False]]


@pytest.mark.parametrize("parallel", ["threshold", "factor", "entropy"])
def test_parallel_rules_fill_every_block_in_fewer_calls(model, parallel):
    ids, mask = left_padded_prompts([5, 3], seed=2)
    cfg = SamplerConfig(
        steps=32,
        gen_length=32,
        block_length=8,
        parallel=parallel,
        parallel_threshold=0.5,
        parallel_factor=3.0,
        entropy_bound=8.0,
        **IDS,
    )
    out = generate(model, ids, cfg, attention_mask=mask)
    assert not (out.generated == MASK_ID).any()
    assert out.nfe < 32 and len(out.block_nfe) == 4
    assert out.tokens_per_forward == pytest.approx(32 / out.nfe)


def test_parallel_threshold_one_is_one_token_per_step_when_unsure(model):
    ids, _ = left_padded_prompts([6], seed=0)
    base = SamplerConfig(steps=16, gen_length=16, block_length=8, **IDS)
    vanilla = generate(model, ids, base)
    strict = generate(model, ids, base.with_(parallel="threshold", parallel_threshold=1.0))
    assert torch.equal(vanilla.sequences, strict.sequences) and strict.nfe == 16


def _text_before_eos(row: torch.Tensor) -> list[int]:
    tokens = row.tolist()
    return tokens[: tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


@pytest.mark.parametrize("shape", [(32, 32, 8), (24, 24, 24), (16, 32, 8)])  # (steps, gen, block)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_early_exit_keeps_the_text_before_the_first_eos(shape, seed):
    model = tiny_model(seed=seed)
    steps, gen, block = shape
    ids, mask = left_padded_prompts([4, 7, 2], seed=seed)
    base = SamplerConfig(steps=steps, gen_length=gen, block_length=block, **IDS)
    full = generate(model, ids, base, attention_mask=mask)
    fast = generate(model, ids, base.with_(early_exit="eos_decided"), attention_mask=mask)
    for row in range(3):
        assert _text_before_eos(fast.generated[row]) == _text_before_eos(full.generated[row])
    assert fast.nfe + fast.early_exit.nfe_saved == steps


def test_early_exit_saves_calls_on_a_model_that_ends_early(model):
    ids, _ = left_padded_prompts([6], seed=0)
    with torch.no_grad():  # a model that wants to stop: EOS wins almost everywhere
        eos_model = tiny_model(seed=3)
        eos_model.model.transformer.ff_out.weight[EOS_ID] *= 4
    cfg = SamplerConfig(steps=64, gen_length=64, block_length=16, early_exit="eos_decided", **IDS)
    out = generate(eos_model, ids, cfg)
    assert out.early_exit.nfe_saved > 0 and out.early_exit.blocks_skipped > 0
    assert out.nfe == 64 - out.early_exit.nfe_saved


def test_stats_keeps_the_untyped_layout_for_readers_outside_unmask(model):
    ids, mask = left_padded_prompts([5, 3])
    cfg = SamplerConfig(steps=16, gen_length=16, block_length=8, early_exit="eos_decided", speculative_draft=3, **IDS)
    out = generate(model, ids, cfg, attention_mask=mask)
    spec = out.speculative
    assert out.stats == {
        "nfe": out.nfe,
        "sequential_calls": out.sequential_calls,
        "tokens_per_forward": out.tokens_per_forward,
        "block_nfe": out.block_nfe,
        "blocks_skipped": out.early_exit.blocks_skipped,  # no nfe_saved: no fixed budget
        "drafted_steps": spec.drafted_steps,
        "accepted_steps": spec.accepted_steps,
        "acceptance_rate": spec.acceptance_rate,
    }
    assert out.early_exit.nfe_saved is None and spec.drafted_steps > 0


MODES = [
    {},
    {"parallel": "threshold", "parallel_threshold": 0.5},
    {"parallel": "factor", "parallel_factor": 2.0},
    {"parallel": "entropy", "entropy_bound": 1.0},
    {"cache": "prefix"},
    {"cache": "dual", "cache_refresh": 3},
    {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.5},
    {"speculative_draft": 4},
    {"cache": "dual", "speculative_draft": 3, "early_exit": "eos_decided"},
    {"early_exit": "eos_decided", "parallel": "factor", "parallel_factor": 2.0},
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: ",".join(f"{k}={v}" for k, v in m.items()) or "vanilla")
def test_left_padded_batch_rows_equal_their_solo_runs_in_every_mode(model, mode):
    lengths = [5, 2, 8]
    ids, mask = left_padded_prompts(lengths, seed=4)
    cfg = SamplerConfig(steps=16, gen_length=16, block_length=8, **IDS, **mode)
    batch = generate(model, ids, cfg, attention_mask=mask).generated
    for row, n in enumerate(lengths):
        solo = generate(model, ids[row : row + 1, -n:], cfg).generated
        if mode.get("early_exit"):
            assert _text_before_eos(batch[row]) == _text_before_eos(solo[0]), f"row {row}"
        else:
            assert torch.equal(batch[row], solo[0]), f"row {row} differs in a padded batch"


def test_margin_and_entropy_remasking_rank_positions_their_own_way():
    from sampler.remasking import remasking_policy

    torn = torch.tensor([0.5, 0.49, 0.01, 0.0])  # a sure top token, but a close second
    spread = torch.tensor([0.4, 0.2, 0.2, 0.2])  # a clear winner over a flat rest
    logits = torch.stack([torn, spread]).clamp_min(1e-12).log()[None]  # (1, 2, 4)
    x0 = logits.argmax(-1)
    low, margin, entropy = (
        remasking_policy(n).confidence(logits, x0, None)[0] for n in ("low_confidence", "margin", "entropy")
    )
    assert low[0] > low[1] and margin[0] < margin[1]  # margin commits the clear winner first
    assert margin.tolist() == pytest.approx([0.01, 0.2], abs=1e-5)
    assert entropy[0] > entropy[1] and 0 < entropy.min() and entropy.max() <= 1  # exp(-H): the flat rest is less sure


@pytest.mark.parametrize("remasking", ["margin", "entropy"])
def test_every_remasking_policy_decodes_one_token_per_step(model, remasking):
    ids, mask = left_padded_prompts([5, 3])
    config = SamplerConfig(steps=16, gen_length=16, block_length=8, remasking=remasking, **IDS)
    order, plain_order = CommitTrace(), CommitTrace()
    out = generate(model, ids, config, attention_mask=mask, on_step=order)
    assert (out.generated != MASK_ID).all() and out.nfe == 16
    for row in order.generated(out.prompt_length):
        assert sorted(row) == list(range(16))  # each step commits exactly one position
    again = generate(model, ids, config, attention_mask=mask)
    assert torch.equal(out.sequences, again.sequences)
    plain = generate(model, ids, config.with_(remasking="low_confidence"), attention_mask=mask, on_step=plain_order)
    assert plain_order.generated(plain.prompt_length) != order.generated(
        out.prompt_length
    )  # another order on this model
