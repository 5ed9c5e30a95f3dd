"""Per-request compute caps (issue 36): one client cannot starve the others.

`unmask.steps: 4096` was accepted; one answer took about a minute, and three such requests made ordinary 16-token
answers take 37-40 s instead of 0.1-0.2 s. The serving policy's `limits:` (gates/request_limits.py) caps steps,
canvas, token-forwards and time per request; serving/limits.py applies them before a request is queued.
"""

from __future__ import annotations

import threading

import pytest

from gates.request_limits import RequestLimits
from sampler.config import SamplerConfig
from serving.decoding import RequestError
from serving.limits import check_compute

CONFIG = SamplerConfig(gen_length=32, block_length=32, steps=16, mask_id=3, eos_id=1, eot_id=2)


def test_an_ordinary_request_is_within_the_default_caps():
    check_compute(CONFIG, 40, "masked-diffusion", RequestLimits())


@pytest.mark.parametrize(
    "changes, prompt, limits, field, shown",
    [
        ({"steps": 4096, "gen_length": 4096, "block_length": 4096}, 10, RequestLimits(), "unmask.steps", "4096"),
        ({"steps": 64}, 10, RequestLimits(), "unmask.steps", "canvas of 32"),  # more steps than tokens
        ({"steps": 32}, 10, RequestLimits(max_steps=16), "unmask.steps", "limit of 16"),
        ({}, 1000, RequestLimits(max_canvas=512), "max_tokens", "canvas of 1032"),
        ({"steps": 32}, 200, RequestLimits(max_token_forwards=4096), "unmask.steps", "7424 token-forwards"),
    ],
)
def test_a_request_above_a_cap_is_refused_naming_its_field(changes, prompt, limits, field, shown):
    with pytest.raises(RequestError) as e:
        check_compute(CONFIG.with_(**changes), prompt, "masked-diffusion", limits)
    assert e.value.param == field and shown in e.value.message and e.value.status == 400


def test_autoregressive_decoding_is_bounded_by_max_tokens_and_context_alone():
    check_compute(CONFIG.with_(steps=32), 10, "autoregressive", RequestLimits(max_steps=1))


# a real server and about 40 requests on loopback: ~20 s on two cores
def test_three_heavy_requests_beside_light_ones_are_refused_before_any_model_evaluation(tmp_path):
    """Heavy requests are refused at admission, so they cost the light ones nothing: the model evaluations and
    batches the server counts in a round of light requests are the same alone and beside three heavy ones. (How
    long the light answers take is a benchmark's question, not a test's.)"""
    import httpx
    import openai

    from tests.support.serving_fixtures import (
        PROMPTS,
        openai_client,
        running_server,
        settings_for,
        shared_serving_registry,
    )

    settings = settings_for(shared_serving_registry().tracking_uri, log_dir=None)
    settings.limits = type(settings.limits)(max_tokens=4096, max_prompt_tokens=200, max_prompt_chars=2000)
    heavy_body = {"unmask": {"steps": 4096}}  # the request: 4096 steps over a 4096-token canvas
    with running_server(settings) as server:
        client = openai_client(server)

        def counted() -> tuple[float, float]:
            """(model evaluations, batches) the server has counted so far, over every model and version."""
            text = httpx.get(server.base_url + "/metrics", timeout=30).text
            total = {"unmask_nfe_total": 0.0, "unmask_batches_total": 0.0}
            for line in text.splitlines():
                name = line.split("{", 1)[0].split(" ", 1)[0]
                if name in total:
                    total[name] += float(line.rsplit(" ", 1)[1])
            return total["unmask_nfe_total"], total["unmask_batches_total"]

        def lights() -> tuple[float, float]:
            before = counted()
            for i in range(4):
                client.completions.create(model="production", prompt=PROMPTS[i % 4], max_tokens=16, seed=i)
            after = counted()
            return after[0] - before[0], after[1] - before[1]

        heavy_answers: list[object] = []

        def heavy() -> None:
            try:
                heavy_answers.append(
                    client.completions.create(
                        model="production", prompt=PROMPTS[0], max_tokens=4096, extra_body=heavy_body
                    )
                )
            except openai.APIStatusError as e:
                heavy_answers.append(e)

        lights()  # warm
        alone, beside = [], []
        for _ in range(2):  # alternated: alone, then beside three heavy requests
            alone.append(lights())
            threads = [threading.Thread(target=heavy) for _ in range(3)]
            for t in threads:
                t.start()
            beside.append(lights())
            for t in threads:
                t.join(120)
    assert len(heavy_answers) == 6
    assert all(isinstance(a, openai.BadRequestError) for a in heavy_answers), heavy_answers
    assert all("unmask.steps" in str(a) for a in heavy_answers)
    assert all(nfe > 0 for nfe, _ in alone), alone  # the counters move: the comparison below is not vacuous
    assert beside == alone, (alone, beside)  # the heavy requests added no model evaluation and no batch


def test_a_serving_policy_limit_reaches_the_server(tmp_path):
    import httpx

    from gates.serving_policy import load_serving_policy
    from tests.support.serving_fixtures import PROMPTS, running_server, settings_for, shared_serving_registry

    policy = tmp_path / "serving.yaml"
    policy.write_text("default: {arm: production}\nlimits: {max_steps: 8}\n")
    settings = settings_for(shared_serving_registry().tracking_uri, log_dir=None)
    settings.compute = load_serving_policy(policy).limits
    with running_server(settings) as server:
        body = {"model": "production", "prompt": PROMPTS[0], "max_tokens": 16, "unmask": {"steps": 16}}
        refused = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
        body["unmask"]["steps"] = 8
        answered = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
        health = httpx.get(server.base_url + "/health", timeout=10).json()["status"]
    assert refused.status_code == 400 and "limit of 8" in refused.text
    assert answered.status_code == 200 and health == "ready"
