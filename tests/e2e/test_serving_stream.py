"""Streaming (`stream: true`) through the real `openai` client against a real uvicorn server on loopback.

The promise: a stream sends only text no later step can change (a masked-diffusion model's finished
blocks, the AR twin's tokens), and the concatenated stream is the non-streamed answer, byte for byte.
Plus: time to first byte and first block in responses, the request log and /metrics; errors before
the first byte are JSON, after it an error chunk; a client that hangs up mid-stream frees its slot.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pandas as pd
import pytest
import torch

from serving.request_log import read_rows
from tests.support.llada_fixtures import EOS_ID, EOT_ID, MASK_ID, left_padded_prompts, tiny_model
from tests.support.serving_fixtures import PROMPTS, openai_client, running_server, settings_for, shared_serving_registry

pytestmark = pytest.mark.timeout(240)


SAMPLER_IDS = dict(mask_id=MASK_ID, eos_id=EOS_ID, eot_id=EOT_ID)


@pytest.mark.parametrize(
    "mode",
    [
        {},
        {"parallel": "threshold", "parallel_threshold": 0.3},
        {"early_exit": "eos_decided"},
        {"cache": "prefix", "speculative_draft": 3, "parallel": "threshold", "parallel_threshold": 0.5},
        {"temperature": 0.9, "remasking": "random", "seed": 5},
        "autoregressive",
    ],
)
def test_final_prefix_reports_only_tokens_no_later_step_changes(mode):
    from sampler import FinalPrefix, SamplerConfig, generate
    from sampler.autoregressive import generate_autoregressive

    model = tiny_model(seed=4)
    prompts, attention = left_padded_prompts([5, 9, 7])
    config = SamplerConfig(steps=16, gen_length=32, block_length=8, **SAMPLER_IDS).with_(
        **(mode if isinstance(mode, dict) else {})
    )
    reported = []
    prefix = FinalPrefix(
        prompts.shape[1],
        8,
        MASK_ID,
        canvas=mode != "autoregressive",
        on_final=lambda info, lengths: reported.append(
            (info.block, lengths, [row[prompts.shape[1] :][:n].tolist() for row, n in zip(info.sequences, lengths)])
        ),
    )
    decoder = generate_autoregressive if mode == "autoregressive" else generate
    out = decoder(model, prompts, config, attention_mask=attention, on_step=prefix)
    final = out.generated.tolist()
    assert len(reported) > 1
    for block, lengths, tokens in reported:
        assert all(t == f[:n] for t, f, n in zip(tokens, final, lengths))  # never text a later step changed
        if mode != "autoregressive" and any(n < 32 for n in lengths):  # a canvas is final block by block
            assert all(n <= (block + 1) * 8 for n in lengths)
    assert all(a <= b for (_, one, _), (_, two, _) in zip(reported, reported[1:]) for a, b in zip(one, two))
    # the last report covers the canvas, short of a mask the model proposed itself (a later step could fill it)
    if mode == "autoregressive":  # one report a token, until every row ended
        assert reported[-1][1] == [len(reported)] * 3
    else:
        assert reported[-1][1] == [row.index(MASK_ID) if MASK_ID in row else 32 for row in final]


def test_committed_text_holds_back_what_a_stop_sequence_could_still_claim():
    import models
    from serving.decoding import choice_of
    from serving.streaming import CommittedText

    handle = models.load("tiny-llada")
    answer = "0+4=4,1+1+0=2\n#### 24"
    ids = handle.encode(answer) + [handle.eos_id] * 11
    for stops in ([], ["=2"], ["+1+0"], ["1+0=", "4,1+1+0=2"], ["#", "\n#### 2"], ["4 "], ["0+4"]):
        for step in (1, 3, 8):
            text = CommittedText(handle, 32, stops)
            pieces = [text.add(ids[i : i + step]) for i in range(0, len(ids), step)]
            expected = choice_of(handle, ids, 32, stops)["text"]
            assert "".join(pieces) + text.finish(expected) == expected
            assert text.complete
            for i in range(1, len(pieces) + 1):  # nothing sent that the answer does not start with
                assert expected.startswith("".join(pieces[:i]))
    partial = CommittedText(handle, 32, ["1+0=", "4,1+1+0=2"])
    assert partial.add(handle.encode("0+4=4,1+")) == "0+4="  # '4,1+' may begin the second stop
    assert not partial.complete and partial.add(handle.encode("1+0=2")) == "" and partial.complete
    with pytest.raises(ValueError, match="does not start with"):
        partial.finish("0+5")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("request-log")
    settings = settings_for(shared_serving_registry().tracking_uri, log_dir=log_dir)
    with running_server(settings) as running:
        running.log_dir, running.settings = log_dir, settings
        yield running


def logged_rows(server, until, timeout_s: float = 20.0) -> pd.DataFrame:
    """The request log so far, once `until(rows)` holds (it is written off the request path) or time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = pd.DataFrame(read_rows(server.log_dir))
        if (len(rows) and until(rows)) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def streamed(client, alias: str, prompt: str, **options):
    """(content chunks' texts, finish chunk, usage chunk) of one streamed completion."""
    chunks = list(
        client.completions.create(
            model=alias, prompt=prompt, stream=True, stream_options={"include_usage": True}, **options
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage: last, no choices
    finish = chunks[-2]
    assert finish.choices[0].finish_reason is not None and all(c.choices[0].finish_reason is None for c in chunks[:-2])
    return [c.choices[0].text for c in chunks[:-2] if c.choices[0].text], finish, chunks[-1].usage


BLOCKS_OF_8 = {"max_tokens": 32, "extra_body": {"unmask": {"block_length": 8}}}
CASES = {  # the tiny models answer PROMPTS[0] with '0+4=4,1+1+0=2\n#### 24'
    "operating point": {},
    "blocks of 8": BLOCKS_OF_8,
    "stop mid-block": BLOCKS_OF_8 | {"stop": ["=2"]},  # falls at characters 11-12, inside the second block
    "stop across blocks": BLOCKS_OF_8 | {"stop": ["+1+0"]},  # characters 7-10: from the first block into the second
    "later stop begins earlier": BLOCKS_OF_8 | {"stop": ["1+0=", "4,1+1+0=2"]},  # the second one cuts first
    "max_tokens mid-block": {"max_tokens": 11, "extra_body": {"unmask": {"block_length": 8}}},
    "sampled": {"temperature": 0.8, "seed": 3},
}


@pytest.mark.parametrize("alias", ["production", "fallback"])  # tiny-llada (masked diffusion), tiny-ar
@pytest.mark.parametrize("case", list(CASES))
def test_the_concatenated_stream_is_the_non_streamed_answer_byte_for_byte(client, alias, case):
    options = CASES[case]
    if alias == "fallback":  # the AR twin reads no diffusion settings
        options = {k: v for k, v in options.items() if k != "extra_body"}
    answers = []
    for prompt in PROMPTS[:2]:
        plain = client.completions.create(model=alias, prompt=prompt, **options)
        answers.append(plain.choices[0])
        texts, finish, usage = streamed(client, alias, prompt, **options)
        assert "".join(texts) == plain.choices[0].text, (case, texts)
        assert finish.choices[0].finish_reason == plain.choices[0].finish_reason
        assert usage.completion_tokens == plain.usage.completion_tokens
        assert usage.prompt_tokens == plain.usage.prompt_tokens
        assert finish.model_extra["unmask"]["config_hash"] == plain.model_extra["unmask"]["config_hash"]
    if case == "stop mid-block":  # the stop did cut (else the case would test nothing)
        assert answers[0].text == "0+4=4,1+1+0" and answers[0].finish_reason == "stop"


def test_a_diffusion_stream_sends_each_block_once_it_is_final(client):
    texts, finish, _ = streamed(client, "production", PROMPTS[0], **BLOCKS_OF_8)
    assert len(texts) > 1  # the answer spans several blocks of 8: one chunk per finished block
    ends = [len("".join(texts[: i + 1])) for i in range(len(texts))]  # one character per token
    assert all(end % 8 == 0 for end in ends[:-1]), texts  # every chunk but the last ends where a block ends
    ext = finish.model_extra["unmask"]
    assert ext["stream"] and ext["nfe"] == 16 and ext["model"] == "tiny-llada"  # 4 blocks of 4 steps
    assert 0 < ext["first_block_s"] <= ext["ttfb_s"]  # the first byte waits for the first final block


def test_an_autoregressive_stream_sends_tokens_as_they_come(client):
    texts, finish, usage = streamed(client, "fallback", PROMPTS[0])
    assert len(texts) == usage.completion_tokens > 1 and texts == list("".join(texts))  # one chunk a token
    assert finish.model_extra["unmask"]["model"] == "tiny-ar"


def test_a_streamed_chat_sends_the_role_first_then_the_same_content_as_without_streaming(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPTS[1]}]
    plain = client.chat.completions.create(model="production", messages=messages, **BLOCKS_OF_8)
    chunks = list(client.chat.completions.create(model="production", messages=messages, stream=True, **BLOCKS_OF_8))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason == "stop"
    assert chunks[-1].usage is None  # no include_usage: no usage chunk


def test_echo_streams_the_prompt_first(client):
    chunks = list(client.completions.create(model="production", prompt=PROMPTS[2], echo=True, stream=True))
    plain = client.completions.create(model="production", prompt=PROMPTS[2], echo=True)
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    assert [c.choices[0].text for c in chunks if c.choices[0].text][0] == PROMPTS[2]


def test_concurrent_streams_are_batched_and_each_row_gets_its_own_stream(server, client):
    solo = [client.completions.create(model="production", prompt=p, **BLOCKS_OF_8).choices[0].text for p in PROMPTS]

    async def all_streams():
        async with openai.AsyncOpenAI(
            base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60
        ) as aclient:

            async def one(prompt):
                texts, sizes = [], []
                async for chunk in await aclient.completions.create(
                    model="production", prompt=prompt, stream=True, **BLOCKS_OF_8
                ):
                    texts.append(chunk.choices[0].text)
                    if chunk.choices[0].finish_reason:
                        sizes.append(chunk.model_extra["unmask"]["batch_size"])
                return "".join(texts), sizes[0]

            return await asyncio.gather(*(one(p) for p in PROMPTS))

    together = asyncio.run(all_streams())
    assert [text for text, _ in together] == solo
    assert max(size for _, size in together) > 1  # they did share a batch, or this would prove nothing


def test_errors_before_the_first_byte_are_json_4xx_naming_the_field(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="staging", prompt=PROMPTS[0], stream=True)
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="production", prompt=PROMPTS[0], stream=True, max_tokens=4096)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:  # stream_options without stream
        client.completions.create(model="production", prompt=PROMPTS[0], stream_options={"include_usage": True})
    assert e.value.body["param"] == "stream_options"


def test_ttfb_and_first_block_reach_responses_the_request_log_and_metrics(server, client):
    plain = client.completions.create(model="production", prompt=PROMPTS[3], user="ttfb")
    ext = plain.model_extra["unmask"]
    assert not ext["stream"] and 0 < ext["first_block_s"] <= ext["ttfb_s"]  # non-streamed: ttfb is the latency
    streamed(client, "fallback", PROMPTS[3])

    def both_kinds(rows):
        flags = rows[rows.status == 200].stream.astype(bool)
        return flags.any() and (~flags).any()

    rows = logged_rows(server, both_kinds)
    ok = rows[rows.status == 200]
    flag = ok.stream.astype(bool)
    streams, plains = ok[flag], ok[~flag]
    assert len(streams) and len(plains)
    assert ((streams.ttfb_s > 0) & (streams.ttfb_s <= streams.latency_s)).all()
    assert (streams.first_block_s > 0).all() and (plains.first_block_s > 0).all()
    assert (plains.ttfb_s == plains.latency_s).all()
    assert rows.columns[:15].tolist() == [
        "time",
        "endpoint",
        "alias",
        "model",
        "version",
        "weights_sha256",
        "config_hash",
        "status",
        "error",
        "latency_s",
        "queue_s",
        "prompt_tokens",
        "completion_tokens",
        "nfe",
        "batch_size",
    ]  # the old columns stay first
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    for name in ("unmask_ttfb_seconds", "unmask_first_block_seconds"):
        for stream in ("true", "false"):
            counts = [
                line
                for line in text.splitlines()
                if line.startswith(f"{name}_count{{") and f'stream="{stream}"' in line
            ]
            assert counts and any(float(line.split()[-1]) >= 1 for line in counts), (name, stream)


class FaultyModel(torch.nn.Module):
    """The served network, counting its calls; it fails from call `fail_at` on, or sleeps `delay_s` a call.

    A fault a real model cannot be made to produce on demand: the only stand-in in these tests.
    """

    def __init__(self, inner: torch.nn.Module, fail_at: int | None = None, delay_s: float = 0.0):
        super().__init__()
        self.inner, self.fail_at, self.delay_s, self.calls = inner, fail_at, delay_s, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError(f"injected fault at model call {self.calls}")
        time.sleep(self.delay_s)
        return self.inner(*args, **kwargs)


def with_faulty_model(server, **fault) -> tuple[FaultyModel, object]:
    """Swap the production batcher's network for a FaultyModel; returns (it, the handle to restore)."""
    batcher = server.pool.route("production").loaded.batcher
    original = batcher.handle
    faulty = FaultyModel(original.model, **fault)
    batcher.handle = original.with_model(faulty)
    return faulty, original


def restore(server, original) -> None:
    server.pool.route("production").loaded.batcher.handle = original


def test_a_failure_after_the_first_byte_ends_the_stream_with_an_error_chunk_and_is_logged(server, client, caplog):
    _, original = with_faulty_model(server, fail_at=6)  # blocks of 8 take 4 steps: the first block gets out
    try:
        received = []
        with pytest.raises(openai.APIError) as e, caplog.at_level("ERROR", logger="unmask.serve"):
            for chunk in client.completions.create(model="production", prompt=PROMPTS[0], stream=True, **BLOCKS_OF_8):
                received.append(chunk.choices[0].text)
        assert "".join(received) == "0+4=4,1+"  # the first block, then the error
        assert e.value.body["code"] == "server_error" and "after streaming began" in e.value.body["message"]
        assert any("stream failed after its first byte" in r.getMessage() for r in caplog.records)
        rows = logged_rows(server, lambda rows: ((rows.status == 500) & rows.stream.astype(bool)).any())
        assert rows[(rows.status == 500) & rows.stream.astype(bool)].error.str.contains("injected fault").any()
        restore(server, original)
        with_faulty_model(server, fail_at=1)
        with pytest.raises(openai.InternalServerError) as e:  # nothing was sent yet: a plain JSON 500
            client.completions.create(model="production", prompt=PROMPTS[0], stream=True)
        assert e.value.status_code == 500 and e.value.body["code"] == "server_error"
    finally:
        restore(server, original)
    assert client.completions.create(model="production", prompt=PROMPTS[0]).choices[0].text.endswith("#### 24")


def test_a_stream_past_its_timeout_ends_with_a_timeout_error_chunk_and_a_504_row(server, client):
    _, original = with_faulty_model(server, delay_s=0.05)  # the first block after ~0.2 s, the answer after ~3 s
    server.settings.request_timeout_s = 1.0
    try:
        received = []
        with pytest.raises(openai.APIError) as e:
            for chunk in client.completions.create(
                model="production",
                prompt=PROMPTS[2],
                stream=True,
                max_tokens=128,
                user="timeout",
                extra_body={"unmask": {"block_length": 8, "steps": 64}},
            ):
                received.append(chunk.choices[0].text)
        assert "".join(received)  # the stream had begun
        assert e.value.body["code"] == "timeout" and "1 s" in e.value.body["message"]
    finally:
        server.settings.request_timeout_s = 60.0
        restore(server, original)
    rows = logged_rows(server, lambda rows: (rows.status == 504).any())
    timed_out = rows[rows.status == 504]
    assert len(timed_out) == 1 and timed_out.stream.astype(bool).all() and (timed_out.ttfb_s > 0).all()
    assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ready"


def test_a_client_that_hangs_up_mid_stream_frees_its_slot_and_stops_its_batch(server, client):
    faulty, original = with_faulty_model(server, delay_s=0.05)  # 16 blocks of 4 steps: ~3 s of decoding
    batcher = server.pool.route("production").loaded.batcher
    body = {
        "model": "production",
        "prompt": PROMPTS[1],
        "stream": True,
        "max_tokens": 128,
        "unmask": {"block_length": 8, "steps": 64},
    }
    try:
        with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            first = next(response.iter_lines())
            assert first.startswith("data: {")
        deadline = time.monotonic() + 20
        while batcher.load and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batcher.load == 0
        assert faulty.calls < 64  # the batch stopped once nobody read it, well before its 64 steps
    finally:
        restore(server, original)
    assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ready"
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    depth = [line for line in metrics.splitlines() if line.startswith('unmask_queue_depth{model="tiny-llada"')]
    assert depth and all(float(line.split()[-1]) == 0 for line in depth)
    assert client.completions.create(model="production", prompt=PROMPTS[0]).choices[0].text.endswith("#### 24")
    rows = logged_rows(server, lambda rows: (rows.status == 499).any())
    gone = rows[rows.status == 499]
    assert len(gone) == 1 and gone.stream.astype(bool).all() and gone.error.str.contains("mid-stream").all()
