"""One contract for every policy a SamplerConfig can name: commit rule, remasking policy, cache
policy, early-exit rule and backend. Decoding fills every mask, every step commits and is reported
once, a left-padded batch decodes each row as that row alone, and the config round-trips.

The cases come from the registries themselves (`sampler.config.POLICY_REGISTRIES`), so a new
policy, one class and one registry line, is covered without editing this file.
"""

from __future__ import annotations

import re

import pytest
import torch

from sampler import SamplerConfig, generate
from sampler.config import POLICY_REGISTRIES
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

LENGTHS = [5, 2, 8]
BLOCK = 8
# As many steps per block as positions: top_k's schedule then commits one position per step (with
# more steps than positions some scheduled steps commit nothing, by design).
BASE = dict(steps=16, gen_length=16, block_length=BLOCK, mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
CASES = [
    pytest.param(field, name, id=f"{field}={name}")
    for field, registry in POLICY_REGISTRIES.items()
    for name in registry
]


def config_for(field: str, name: str, **changes) -> SamplerConfig:
    """BASE with `field` set to `name`, and beside it what the policy says it needs (its first choice each)."""
    needs = {other: allowed[0] for other, allowed in getattr(POLICY_REGISTRIES[field][name], "requires", {}).items()}
    return SamplerConfig(**(BASE | needs | {field: name} | changes))


def speculative_supports(field: str, name: str) -> bool:
    try:
        config_for(field, name, speculative_draft=3)
    except ValueError:  # drafting needs deterministic decoding: random remasking is refused
        return False
    return True


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@pytest.fixture(scope="module")
def prompts():
    return left_padded_prompts(LENGTHS, seed=4)


def decode_with_steps(model, ids, config, mask=None):
    steps = []
    return generate(model, ids, config, attention_mask=mask, on_step=steps.append), steps


@pytest.mark.parametrize("field,name", CASES)
def test_every_mask_is_filled_and_every_step_commits_and_is_reported_once(model, prompts, field, name):
    ids, mask = prompts
    config = config_for(field, name)
    # a rule whose reference leaves some steps empty (Dream's timesteps) says so; it must still fill every mask
    every_step = getattr(POLICY_REGISTRIES[field][name], "commits_every_step", True)
    out, steps = decode_with_steps(model, ids, config, mask)
    assert not (out.generated == MASK_ID).any()
    assert torch.equal(
        out.sequences, generate(model, ids, config, attention_mask=mask).sequences
    )  # the callback changes nothing

    assert [s.step for s in steps] == list(range(out.sequential_calls))  # one call per step, each step reported once
    assert sum(out.block_nfe) == out.sequential_calls == out.nfe
    assert out.tokens_per_forward == pytest.approx(config.gen_length / out.sequential_calls)
    canvas = torch.cat([ids, torch.full((len(LENGTHS), config.gen_length), MASK_ID)], dim=1)  # where decoding starts
    for s in steps:
        masked = canvas == MASK_ID
        assert not (s.committed & ~masked).any(), f"step {s.step} rewrote a decided position"
        start = ids.shape[1] + s.block * BLOCK
        open_rows = masked[:, start : start + BLOCK].any(dim=-1)  # rows with a mask left in the step's block
        if every_step:
            assert s.committed[open_rows].any(dim=-1).all(), f"step {s.step} committed nothing in a row with masks"
        canvas = s.sequences
    assert torch.equal(canvas, out.sequences)
    finished = [s.block for s in steps if s.block_done]
    assert finished == sorted(set(finished)) and steps[-1].block_done  # each block finishes once, decoding ends on one

    # Each mode's own record is there exactly when the mode is on.
    assert (out.early_exit is None) == (config.early_exit == "none")
    assert (out.provider is None) == (config.backend == "torch")
    assert out.speculative is None and out.autoregressive is None and out.block_diffusion is None


@pytest.mark.parametrize("field,name", CASES)
def test_a_padded_batch_decodes_each_row_as_it_decodes_alone(model, prompts, field, name):
    ids, mask = prompts
    config = config_for(field, name)
    batch, batch_steps = decode_with_steps(model, ids, config, mask)
    invariant = getattr(POLICY_REGISTRIES[field][name], "batch_invariant", True)
    for row, n in enumerate(LENGTHS):
        solo, solo_steps = decode_with_steps(model, ids[row : row + 1, -n:], config)
        if invariant:
            assert torch.equal(batch.generated[row], solo.generated[0]), f"row {row} differs in a padded batch"
        elif getattr(POLICY_REGISTRIES[field][name], "counts_scheduled", True):
            # The policy draws one noise stream over the whole canvas, so which positions a row commits
            # depends on its batch; how many it commits per step is the row's own schedule (unless the
            # policy draws that too: the ancestral rule).
            per_step = lambda steps, r, P: [int(s.committed[r, P:].sum()) for s in steps]  # noqa: E731
            assert per_step(batch_steps, row, ids.shape[1]) == per_step(solo_steps, 0, n)
    if not invariant:  # and a seeded run is reproducible, batch for batch; with a generator per row, row for row
        assert torch.equal(generate(model, ids, config, attention_mask=mask).sequences, batch.sequences)
        seeded = generate(model, ids, config, attention_mask=mask, row_seeds=[5, 6, 7]).generated
        for row, n in enumerate(LENGTHS):
            alone = generate(model, ids[row : row + 1, -n:], config.with_(seed=5 + row)).generated
            assert torch.equal(seeded[row], alone[0]), f"row {row} with its own seed differs in a padded batch"


@pytest.mark.parametrize("field,name", [c for c in CASES if speculative_supports(*c.values)])
def test_speculative_decoding_reports_the_kept_steps_only(model, prompts, field, name):
    ids, mask = prompts
    config = config_for(field, name)
    plain, plain_steps = decode_with_steps(model, ids, config, mask)
    fast, fast_steps = decode_with_steps(model, ids, config.with_(speculative_draft=3), mask)
    assert torch.equal(fast.sequences, plain.sequences)
    assert (
        fast.speculative.drafted_steps > fast.speculative.accepted_steps
    )  # drafts were rejected, and none shows below
    assert [(s.step, s.block, s.block_done) for s in fast_steps] == [
        (s.step, s.block, s.block_done) for s in plain_steps
    ]
    assert all(
        torch.equal(f.committed, p.committed) and torch.equal(f.sequences, p.sequences)
        for f, p in zip(fast_steps, plain_steps)
    )
    assert fast.sequential_calls < plain.sequential_calls == len(fast_steps)


@pytest.mark.parametrize("field,name", CASES)
def test_the_config_round_trips_and_keeps_its_hash(field, name):
    config = config_for(field, name)
    again = SamplerConfig.from_json(config.to_json())
    assert again == config and again.hash() == config.hash() == config_for(field, name).hash()
    default = SamplerConfig(**BASE)
    assert (config.hash() == default.hash()) == (name == getattr(default, field))  # the name is part of the hash


@pytest.mark.parametrize("field", list(POLICY_REGISTRIES))
def test_an_unknown_name_is_refused_naming_the_field_and_the_known_names(field):
    known = ", ".join(sorted(POLICY_REGISTRIES[field]))
    with pytest.raises(ValueError, match=re.escape(f"SamplerConfig.{field}='no-such-policy'; known: {known}")):
        SamplerConfig(**{field: "no-such-policy"})
