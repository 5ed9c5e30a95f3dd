"""Serving a block-diffusion (DiffusionGemma) model: exact dynamic batching, committed-canvas streaming, stops.

Real parts throughout: a tiny random DiffusionGemma saved by transformers as safetensors in a tmp folder
(tests/support/eval_fixtures.py), registered in a real MLflow SQLite registry at a recorded BlockDiffusionConfig
operating point, served by uvicorn on loopback and driven by the `openai` client and `unmask loadtest`'s
load runner.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pandas as pd
import pytest

from serving.request_log import read_rows
from tests.support.eval_fixtures import write_diffusion_gemma
from tests.support.gate_fixtures import block_evidence, fresh_registry
from tests.support.serving_fixtures import PROMPTS, openai_client, running_server, settings_for

pytestmark = pytest.mark.timeout(300)
MODEL = "tiny-dgemma-random"
# What an evaluation records for block diffusion: the effective config (3 canvases of 8, 4 steps each).
OPERATING = {
    "max_new_tokens": 24,
    "max_denoising_steps": 4,
    "entropy_bound": 0.1,
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "eos_ids": [1],
    "pad_id": 0,
    "seed": 0,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from models.digest import weights_sha256
    from registry import register_evidence
    from registry.promotion import _move

    root = tmp_path_factory.mktemp("dgemma-serving")
    folder = write_diffusion_gemma(root / MODEL)
    sha = weights_sha256(folder)
    reg = fresh_registry(root)
    version, _ = register_evidence(reg, block_evidence(MODEL, OPERATING, sha))
    _move(reg, "production", None, (MODEL, version), "serving-test", "block diffusion serving", {"kind": "promotion"})
    log_dir = root / "request-log"
    settings = settings_for(
        reg.tracking_uri,
        names=["production"],
        log_dir=log_dir,
        sources={MODEL: str(folder)},
        max_batch=16,
        batch_window_s=0.05,
    )
    with running_server(settings) as running:
        running.log_dir = log_dir
        yield running


def prompts(n: int) -> list[str]:
    return [f"{PROMPTS[i % len(PROMPTS)][: 12 + 3 * i]}" for i in range(n)]  # 16 lengths: batches left-pad


async def all_at_once(server, texts: list[str], options: list[dict]) -> list[tuple[str, int]]:
    async with openai.AsyncOpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120
    ) as client:

        async def one(prompt, extra):
            r = await client.completions.create(model="production", prompt=prompt, **extra)
            return r.choices[0].text, r.model_extra["unmask"]["batch_size"]

        return list(await asyncio.gather(*(one(p, o) for p, o in zip(texts, options))))


def test_16_concurrent_answers_are_byte_identical_to_the_solo_answers_seed_by_seed(server):
    client = openai_client(server)
    texts = prompts(16)
    options = [{"seed": i % 5} for i in range(16)]  # an unseeded request draws its own seed (the test below)
    solo = []
    for prompt, extra in zip(texts, options):
        r = client.completions.create(model="production", prompt=prompt, **extra)
        solo.append(r.choices[0].text)
        assert r.model_extra["unmask"]["batch_size"] == 1
    together = asyncio.run(all_at_once(server, texts, options))
    assert max(size for _, size in together) >= 4  # it did batch, or this test would prove nothing
    assert [t for t, _ in together] == solo
    assert len(set(solo)) > 8  # seeds and prompts really change the answers: the comparison is not trivial
    other = client.completions.create(model="production", prompt=texts[1], seed=99).choices[0].text
    assert (
        other != solo[1]
        or other != client.completions.create(model="production", prompt=texts[1], seed=98).choices[0].text
    )


def test_n_choices_and_unseeded_requests_draw_seeds_as_for_every_kind(server):
    """Issue 51, item 1: block diffusion always samples, so choice k of seed s decodes with seed s + k, and an
    unseeded request draws a fresh seed that it reports (it decoded at the operating point's seed 0 before)."""
    client = openai_client(server)
    prompt = prompts(3)[2]
    four = client.completions.create(model="production", prompt=prompt, n=4, seed=40)
    assert four.model_extra["unmask"]["seeds"] == [40, 41, 42, 43]
    alone = [client.completions.create(model="production", prompt=prompt, seed=s).choices[0].text for s in (40, 43)]
    assert [four.choices[0].text, four.choices[3].text] == alone  # choice k is seed 40 + k, reproducible alone
    assert len({c.text for c in four.choices}) > 1  # four draws, not one answer four times
    unseeded = [client.completions.create(model="production", prompt=prompt) for _ in range(2)]
    seeds = [r.model_extra["unmask"]["seeds"][0] for r in unseeded]
    assert all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
    again = client.completions.create(model="production", prompt=prompt, seed=seeds[0]).choices[0].text
    assert again == unseeded[0].choices[0].text  # the seed it reports reproduces it


def stream_text(client, **request) -> tuple[list[str], str]:
    chunks = list(client.completions.create(model="production", stream=True, **request))
    return [c.choices[0].text for c in chunks if c.choices and c.choices[0].text], chunks[-1].choices[0].finish_reason


@pytest.mark.parametrize("case", ["operating point", "two canvases", "stop string", "chat"])
def test_the_concatenated_stream_is_the_plain_answer_and_sends_whole_canvases(server, case):
    client = openai_client(server)
    prompt = PROMPTS[0]
    plain_text = client.completions.create(model="production", prompt=prompt, seed=3).choices[0].text
    request = {"prompt": prompt, "seed": 3}
    if case == "two canvases":
        request["max_tokens"] = 13  # two canvases of 8 decoded, cut at 13 tokens
    if case == "stop string":
        request["stop"] = [plain_text[10:12]]  # falls inside the second canvas
    if case == "chat":
        messages = [{"role": "user", "content": prompt}]
        plain = client.chat.completions.create(model="production", messages=messages, seed=3)
        chunks = list(client.chat.completions.create(model="production", messages=messages, seed=3, stream=True))
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
        )
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
        return
    plain = client.completions.create(model="production", **request).choices[0]
    pieces, finish = stream_text(client, **request)
    assert "".join(pieces) == plain.text and finish == plain.finish_reason
    if case == "stop string":
        assert plain.finish_reason == "stop" and len(plain.text) < len(plain_text)
    if case == "operating point":
        assert len(pieces) >= 2  # one run of text per committed canvas, not the whole answer at the end


def test_unread_settings_are_a_400_naming_the_field_and_the_server_keeps_serving(server):
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="production", prompt=PROMPTS[1], extra_body={"unmask": {"remasking": "random"}})
    assert bad.value.status_code == 400 and "unmask.remasking is not read by block diffusion" in str(bad.value)
    assert client.completions.create(model="production", prompt=PROMPTS[1]).choices[0].finish_reason in (
        "stop",
        "length",
    )


def test_requests_reach_the_request_log_metrics_and_a_load_test(server):
    from evals.loadtest import LoadSpec, run_load

    result = run_load(
        LoadSpec(base_url=server.base_url + "/v1", models=("production",), concurrency=(1, 4), requests=8), prompts(8)
    )
    cells = {cell.concurrency: cell for cell in result.cells}
    assert cells[4].error_rate == 0 and cells[4].same_answer_share == 1.0  # concurrency changed no answer
    deadline, rows = time.monotonic() + 20, pd.DataFrame()
    while time.monotonic() < deadline and len(rows) < 16:
        rows = pd.DataFrame(read_rows(server.log_dir))
        time.sleep(0.2)
    assert len(rows) >= 16 and set(rows.model) == {MODEL} and (rows[rows.status == 200].nfe > 0).all()
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    assert any(
        line.startswith("unmask_requests_total{") and f'model="{MODEL}"' in line for line in metrics.splitlines()
    )
