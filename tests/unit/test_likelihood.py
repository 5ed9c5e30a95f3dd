"""sampler/likelihood.py on the bundled tiny models: the exact AR likelihood, the masked-diffusion bound's
Monte Carlo estimators against the bound computed over every mask set, prompt scores, commit-step logprobs,
and the in-process multiple-choice accuracy."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from evals.multiple_choice import arith_choices, choice_items, likelihood_accuracy
from evals.tasks import get_task, make_split
from models.loading import load
from sampler.decode import decode_prompts
from sampler.likelihood import (
    ELBO_ESTIMATORS,
    SAMPLE_BATCH,
    CommitLogprobs,
    causal_likelihood,
    causal_logprobs,
    diffusion_likelihood,
    elbo_estimator,
    elbo_exact,
    likelihood,
)
from sampler.prompt_scoring import ScoringSettings, score_prompts
from serving.decoding import operating_config

PROMPT = "A box has 9 coins. Zoe takes 3. How many remain?"
ANSWER = "9-3=6,0-0-0=0\n#### 6"


@functools.cache
def handle(name: str):
    return load(name)


@pytest.mark.parametrize("name", sorted(ELBO_ESTIMATORS))
def test_estimator_draws_are_a_mask_and_a_positive_weight(name):
    masks, weights = elbo_estimator(name).draw(5, 200, torch.Generator().manual_seed(1))
    assert masks.shape == (200, 5) and masks.dtype == torch.bool
    assert weights.shape == (200,) and bool((weights >= 1.0).all())  # 1/t and L/l are both >= 1
    if name == "count":  # LLaDA's: l in 1..L masked, weight L / l
        assert bool((masks.sum(1) >= 1).all())
        assert torch.allclose(weights, 5 / masks.sum(1).double())


@pytest.mark.parametrize("name", sorted(ELBO_ESTIMATORS))
def test_each_estimator_is_unbiased_for_the_bound_over_every_mask_set(name):
    """Both estimate the same bound: the mean of many samples lies within a few standard errors of it."""
    h = handle("tiny-llada")
    context, continuation = h.encode(PROMPT + "9-3=6,0-0-0=0\n#### "), h.encode("6")
    context, continuation = context[:-3], context[-3:] + continuation  # 4 tokens: 15 mask sets
    exact = elbo_exact(h, context, continuation)
    est = diffusion_likelihood(h, context, continuation, samples=400, seed=3, estimator=name)
    assert est.stderr is not None and est.stderr > 0
    assert abs(est.total - exact) < 4 * est.stderr + 1e-9, (est.total, exact, est.stderr)
    assert math.isclose(sum(est.tokens), est.total, rel_tol=1e-9, abs_tol=1e-12)


def test_the_estimate_is_seeded_and_prefers_the_right_answer():
    h = handle("tiny-llada")
    context = h.encode(PROMPT)
    right = diffusion_likelihood(h, context, h.encode(ANSWER), samples=8, seed=5)
    again = diffusion_likelihood(h, context, h.encode(ANSWER), samples=8, seed=5)
    other = diffusion_likelihood(h, context, h.encode(ANSWER), samples=8, seed=6)
    wrong = diffusion_likelihood(h, context, h.encode(ANSWER[:-1] + "7"), samples=8, seed=5)
    assert right == again and right.total != other.total
    assert right.samples == 8 and right.seed == 5 and right.estimator == "count" and not right.exact
    assert right.total > wrong.total


def recorded_decode(h, context: list[int], config, top: int):
    """One decode of `context` with its commit-step log-probabilities recorded: (output, per generated position
    (logprob, top alternatives))."""
    recorder = CommitLogprobs(top=top)
    out = decode_prompts(h, [context], config, on_step=recorder)
    return out, recorder.generated(len(context))[0]


def test_autoregressive_likelihood_is_exact_and_matches_its_own_decoding():
    """The AR's log-likelihood is the sum of next-token log softmax; its decode's commit-step logprobs are the same
    numbers (KV-cached decoding and one full forward agree)."""
    h = handle("tiny-ar")
    context = h.encode(PROMPT)
    config, _ = operating_config(h, None)
    config = config.with_(gen_length=12, block_length=12, steps=12)
    out, scored = recorded_decode(h, context, config, top=3)
    generated = out.generated[0].tolist()
    exact = causal_likelihood(h, context, generated)
    assert exact.exact and exact.stderr == 0.0 and likelihood(h, context, generated, samples=1).total == exact.total
    for value, (commit_value, top) in zip(exact.tokens, scored):
        assert commit_value == pytest.approx(value, abs=1e-5)
        assert max(top.values()) == pytest.approx(commit_value, abs=1e-9)  # greedy: the token is the top one
    logp = causal_logprobs(h, context + generated)
    assert exact.total == pytest.approx(
        sum(float(logp[i - 1, t]) for i, t in enumerate(context + generated) if i >= len(context)), abs=1e-9
    )


def test_masked_diffusion_commit_logprobs_are_the_committed_tokens_probabilities():
    h = handle("tiny-llada")
    context = h.encode(PROMPT)
    config, _ = operating_config(h, None)
    config = config.with_(gen_length=32, block_length=32, steps=16)
    out, scored = recorded_decode(h, context, config, top=2)
    plain = decode_prompts(h, [context], config)
    assert torch.equal(out.sequences, plain.sequences)  # recording changes no token
    assert len(scored) == 32 and all(v is not None and v <= 0 for v, _ in scored)
    for value, top in scored:  # temperature 0, low confidence: each committed token was its step's argmax
        assert len(top) == 2 and max(top.values()) == pytest.approx(value, abs=1e-12)


def test_prompt_scores_are_log_probabilities_that_sum_to_a_likelihood_of_any_split():
    """Issue 51, item 3: echo's per-token values are true log-probabilities (<= 0, the top alternative at least
    as likely), and from any token to the end they add up to a likelihood of that suffix given the rest: exact
    for AR, the left-to-right order's for masked diffusion. The Monte Carlo bound travels whole, with its error."""
    for name in ("tiny-ar", "tiny-llada"):
        h = handle(name)
        ids = h.encode(PROMPT + ANSWER)
        for split in (1, 7, len(h.encode(PROMPT))):
            [scores] = score_prompts(h, [ids], top=2, settings=ScoringSettings(samples=3, seed=2, split=split))
            assert scores.logprobs[0] is None and len(scores.logprobs) == len(ids)
            for value, top in zip(scores.logprobs[1:], scores.top[1:]):
                assert value <= 0.0 and len(top) == 2 and max(top.values()) >= value
            for c in (1, 7, len(ids) - 1):
                order = likelihood(h, ids[:c], ids[c:], method="left-to-right")
                assert math.fsum(scores.logprobs[c:]) == pytest.approx(order.total, abs=1e-9)
            direct = likelihood(h, ids[:split], ids[split:], samples=3, seed=2)
            assert scores.estimate.total == pytest.approx(direct.total, abs=1e-9)
            assert scores.estimate.stderr == pytest.approx(direct.stderr) and scores.split == split


def test_prompts_scored_together_are_each_scored_alone_in_fewer_forwards():
    """Issue 51, item 4: a request's prompts share forward calls (every left-to-right canvas and Monte Carlo copy
    of prompts of one length), and each gets the numbers it gets alone."""
    h = handle("tiny-llada")
    prompts = [h.encode(PROMPT + " 6"), h.encode(PROMPT + " 7"), h.encode("A box has 9 coins.")]
    settings = ScoringSettings(samples=4, seed=7)
    calls = []
    hook = h.model.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    try:
        together = score_prompts(h, prompts, top=1, settings=settings)
    finally:
        hook.remove()
    alone = [score_prompts(h, [ids], top=1, settings=settings)[0] for ids in prompts]
    assert together == alone
    same = len(prompts[0])  # the first two share a length, so their canvases share calls
    assert len(prompts[1]) == same and len(prompts[2]) != same
    expected = [
        -(-2 * (same - 1) // SAMPLE_BATCH),  # left-to-right canvases, both prompts
        -(-2 * 4 // SAMPLE_BATCH),  # their samples
        -(-(len(prompts[2]) - 1) // SAMPLE_BATCH),
        -(-4 // SAMPLE_BATCH),
    ]
    assert len(calls) == sum(expected) and sum(calls) == 2 * (same - 1 + 4) + len(prompts[2]) - 1 + 4
    own = likelihood_accuracy(h, choice_items(n=2), samples=3, seed=0, method="left-to-right")
    assert own.method == "left-to-right" and own.stderrs[0][0] == 0.0


def test_bad_input_names_what_is_wrong():
    h = handle("tiny-llada")
    with pytest.raises(ValueError, match="continuation is empty"):
        diffusion_likelihood(h, [5], [])
    with pytest.raises(ValueError, match="samples must be a positive integer"):
        diffusion_likelihood(h, [5], [6], samples=0)
    with pytest.raises(ValueError, match="unknown ELBO estimator 'nope'"):
        diffusion_likelihood(h, [5], [6], estimator="nope")
    with pytest.raises(ValueError, match="at most 12"):
        elbo_exact(h, [5], [6] * 13)


def test_multiple_choice_items_hold_the_reference_answer_among_distinct_choices():
    rng = random.Random(0)
    for item in make_split(get_task("arith"), "test", 6):
        choice = arith_choices(item, rng)
        assert choice.context == item.prompt and choice.choices[choice.gold] == item.answer
        assert len(set(choice.choices)) == 4 and all(
            c.startswith(item.answer.split("#### ")[0]) for c in choice.choices
        )
    assert [i.gold for i in choice_items(n=6)] == [i.gold for i in choice_items(n=6)]  # seeded
    with pytest.raises(ValueError, match="arith"):
        choice_items(task="sort")


def test_likelihood_accuracy_counts_the_picks_that_are_right():
    h = handle("tiny-ar")
    items = choice_items(n=3)
    result = likelihood_accuracy(h, items)
    assert result.accuracy == sum(p == i.gold for p, i in zip(result.picks, items)) / 3
    assert all(s.index(max(s)) == p for s, p in zip(result.scores, result.picks))
    assert all(e == 0.0 for row in result.stderrs for e in row)  # exact
