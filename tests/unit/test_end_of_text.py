"""End-of-text prediction (`eot_predict='eos_run'`): a run of confident EOS predictions that reaches
the block's end is filled as padding to the end of the canvas, and never over text."""

from __future__ import annotations

import pytest
import torch

from sampler import SamplerConfig, generate
from sampler.end_of_text import EosRunPrediction
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model

IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)
M, E = MASK_ID, EOS_ID


def rule(bound=0.9):
    return EosRunPrediction(
        SamplerConfig(steps=8, gen_length=8, block_length=4, eot_predict="eos_run", eot_confidence=bound, **IDS)
    )


def test_a_confident_run_to_the_block_end_is_filled_to_the_canvas_end():
    # prompt 2, block [2, 6), then two positions after the block
    x = torch.tensor(
        [
            [7, 8, 5, M, M, M, M, M],  # p_eos sure from position 3 on: fill 3.. to the end
            [7, 8, 5, M, E, M, M, M],  # a committed EOS counts as padding: fill from 3
            [7, 8, 5, M, M, M, 9, M],  # text after the block: nothing
            [7, 8, M, M, M, M, M, M],
        ]
    )  # position 3 unsure: the run starts at 4
    seen = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.95, 0.99, 0.97, 0.99, 0.99],
            [0.0, 0.0, 0.0, 0.95, 0.10, 0.97, 0.99, 0.99],
            [0.0, 0.0, 0.0, 0.95, 0.99, 0.97, 0.99, 0.99],
            [0.0, 0.0, 0.99, 0.5, 0.99, 0.97, 0.99, 0.99],
        ]
    )
    got = rule().apply(x, seen, 0, (2, 6), 2)
    assert got.tolist() == [
        [7, 8, 5, E, E, E, E, E],
        [7, 8, 5, E, E, E, E, E],
        [7, 8, 5, M, M, M, 9, M],
        [7, 8, M, M, E, E, E, E],
    ]


def test_text_inside_the_run_or_an_unsure_block_end_fills_nothing():
    x = torch.tensor([[7, 8, M, M, 5, M, M, M], [7, 8, M, M, M, M, M, M]])
    seen = torch.tensor([[0.0, 0.0, 0.99, 0.99, 0.99, 0.5, 0.99, 0.99], [0.0, 0.0, 0.99, 0.99, 0.99, 0.5, 0.99, 0.99]])
    assert torch.equal(rule().apply(x, seen, 0, (2, 6), 2), x)  # row 0's block ends unsure; so does row 1's
    window = seen[:, 2:6]  # a dual-cache step: logits of the block only
    assert torch.equal(rule(0.4).apply(x, window, 2, (2, 6), 2)[1], torch.tensor([7, 8, E, E, E, E, E, E]))


def test_a_model_that_wants_to_stop_decodes_its_padding_in_fewer_calls():
    with torch.no_grad():  # EOS wins almost everywhere, as a padded tail does in a trained model
        model = tiny_model(seed=3)
        model.model.transformer.ff_out.weight[EOS_ID] *= 4
    ids, mask = left_padded_prompts([6, 4], seed=0)
    base = SamplerConfig(steps=64, gen_length=64, block_length=16, early_exit="eos_decided", **IDS)
    plain = generate(model, ids, base, attention_mask=mask)
    fast = generate(model, ids, base.with_(eot_predict="eos_run", eot_confidence=0.5), attention_mask=mask)
    assert fast.nfe < plain.nfe
    assert not (fast.generated == MASK_ID).any()


@pytest.mark.parametrize("bound", [0.0, 1.5])
def test_a_bound_outside_zero_one_is_refused_naming_the_field(bound):
    with pytest.raises(ValueError, match="SamplerConfig.eot_confidence must be in"):
        SamplerConfig(eot_confidence=bound)


def test_end_prediction_is_part_of_the_hash_only_when_set():
    base = SamplerConfig()
    assert base.with_(eot_predict="none").hash() == base.hash() != base.with_(eot_predict="eos_run").hash()
    on = base.with_(eot_predict="eos_run")
    assert on.with_(eot_confidence=0.8).hash() != on.hash()
