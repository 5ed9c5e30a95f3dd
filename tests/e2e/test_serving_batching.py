"""The serving promises under load: answers do not depend on the batch, a full queue is a 429, an alias move
is picked up with no failed request, and weights that differ from the registry's record are refused.

Real parts throughout: uvicorn on loopback, the `openai` async client, MLflow SQLite, the bundled models.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.support import REPO
from tests.support.servers import free_port
from tests.support.serving_fixtures import (
    PROMPTS,
    digest,
    running_server,
    serving_registry,
    settings_for,
    shared_serving_registry,
)

pytestmark = pytest.mark.timeout(240)


def arith_prompts(n: int) -> list[str]:
    from evals.evaluate import load_task

    return [item.prompt for item in load_task("arith", "test", n).items]


def async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


async def complete_all(
    server, alias: str, prompts: list[str], concurrency: int, options: list[dict] | None = None
) -> list[tuple[str, int]]:
    """(text, batch size) per prompt (with `options[i]` as request fields), at most `concurrency` in flight."""
    gate = asyncio.Semaphore(concurrency)
    async with async_client(server) as client:

        async def one(prompt: str, extra: dict) -> tuple[str, int]:
            async with gate:
                r = await client.completions.create(model=alias, prompt=prompt, **extra)
                return r.choices[0].text, r.model_extra["unmask"]["batch_size"]

        return list(await asyncio.gather(*(one(p, o) for p, o in zip(prompts, options or [{}] * len(prompts)))))


@pytest.mark.parametrize("alias", ["production", "fallback"])  # tiny-llada (masked diffusion), tiny-ar (its AR twin)
def test_answers_at_16_concurrent_are_byte_identical_to_the_same_prompts_sent_solo(alias):
    prompts = arith_prompts(32)
    assert len(set(map(len, prompts))) > 1  # prompts of several lengths: batches need left padding
    settings = settings_for(shared_serving_registry().tracking_uri, names=[alias], max_batch=16, batch_window_s=0.05)
    with running_server(settings) as server:
        solo = asyncio.run(complete_all(server, alias, prompts, concurrency=1))
        together = asyncio.run(complete_all(server, alias, prompts, concurrency=16))
    assert {size for _, size in solo} == {1}
    assert max(size for _, size in together) >= 4  # it did batch, or this test would prove nothing
    differing = [(p, a, b) for p, (a, _), (b, _) in zip(prompts, solo, together) if a != b]
    assert not differing, differing[:3]
    assert sum(text.count("####") for text, _ in solo) >= 16  # real answers, not empty strings


def test_rows_that_join_a_running_batch_at_different_blocks_answer_as_they_do_solo():
    prompts = arith_prompts(24)
    # blocks of 8, and one to four of them per answer: lengths differ, and rows join at every block
    options = [
        {"max_tokens": 8 * (1 + i % 4), "extra_body": {"unmask": {"block_length": 8}}} for i in range(len(prompts))
    ]
    settings = settings_for(
        shared_serving_registry().tracking_uri, names=["production"], max_batch=8, batch_window_s=0.0, continuous=True
    )
    with running_server(settings) as server:
        solo = asyncio.run(complete_all(server, "production", prompts, concurrency=1, options=options))
        # a closed loop of 8: each answer frees a slot that the next prompt takes at the next block boundary
        together = asyncio.run(complete_all(server, "production", prompts, concurrency=8, options=options))
    assert max(size for _, size in together) > 1
    differing = [(p, a, b) for p, (a, _), (b, _) in zip(prompts, solo, together) if a != b]
    assert not differing, differing[:3]


@pytest.mark.parametrize("alias", ["production", "fallback"])
def test_seeded_sampled_answers_batch_with_a_generator_per_row_and_equal_the_solo_answers(alias):
    prompts = arith_prompts(16)
    heat = 2.0 if alias == "fallback" else 0.8  # the AR twin is so sure of itself that only 2.0 changes answers
    options = [{"temperature": heat, "seed": 100 + i} for i in range(len(prompts))]  # each request its own seed
    if alias == "production":  # random remasking too: its draws are per row as well
        options = [
            o | {"extra_body": {"unmask": {"remasking": "random"}}} if i % 2 else o for i, o in enumerate(options)
        ]
    settings = settings_for(shared_serving_registry().tracking_uri, names=[alias], max_batch=16, batch_window_s=0.05)
    with running_server(settings) as server:
        solo = asyncio.run(complete_all(server, alias, prompts, concurrency=1, options=options))
        together = asyncio.run(complete_all(server, alias, prompts, concurrency=16, options=options))
        greedy = asyncio.run(complete_all(server, alias, prompts, concurrency=1))
    assert {size for _, size in solo} == {1} and max(size for _, size in together) >= 4
    differing = [(p, a, b) for p, (a, _), (b, _) in zip(prompts, solo, together) if a != b]
    assert not differing, differing[:3]
    assert [a for a, _ in solo] != [g for g, _ in greedy]  # it did sample, or this test would prove nothing


def test_a_full_queue_answers_429_with_retry_after_and_the_server_keeps_serving():
    settings = settings_for(shared_serving_registry().tracking_uri, names=["production"], max_batch=1, max_pending=1)

    async def burst(server) -> list[object]:
        async with async_client(server) as client:

            async def one(i: int):
                try:
                    return await client.completions.create(
                        model="production", prompt=PROMPTS[i % 4], max_tokens=64, extra_body={"unmask": {"steps": 64}}
                    )
                except openai.APIStatusError as e:
                    return e

            return list(await asyncio.gather(*(one(i) for i in range(6))))

    with running_server(settings) as server:
        outcomes = asyncio.run(burst(server))
        refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
        answered = [o for o in outcomes if not isinstance(o, Exception)]
        assert len(refused) + len(answered) == 6, outcomes  # nothing but answers and 429s
        assert refused and answered
        assert all(int(e.response.headers["retry-after"]) >= 1 for e in refused)
        assert refused[0].body["code"] == "queue_full"
        assert httpx.get(server.base_url + "/health", timeout=10).json()["status"] == "ready"
        text = httpx.get(server.base_url + "/metrics", timeout=10).text
        assert 'code="queue_full",endpoint="completions",status="429"' in text


def test_an_alias_move_is_served_within_a_poll_with_no_failed_request_and_bad_weights_are_refused(tmp_path):
    registry = serving_registry(tmp_path / "registry")
    from registry import Registry, register_evidence, rollback
    from tests.support.gate_fixtures import evidence, record

    reg = Registry(registry.tracking_uri)
    bogus = "0" * 64  # a version of tiny-llada whose recorded weights are not the bundled folder's
    bad_version, _ = register_evidence(
        reg, evidence("tiny-llada", [record("tiny-llada", weights_sha256=bogus)], weights_sha256=bogus)
    )
    settings = settings_for(registry.tracking_uri, poll_interval_s=0.3)

    async def load_while(server, move, stop_when) -> list[tuple[int, str]]:
        """Four clients, each sending production requests back to back until `stop_when(seen)`; `move()` runs
        once after the first answers. Returns (client, model) per answer; any failure raises."""
        seen: list[tuple[int, str]] = []
        moved = False
        deadline = time.monotonic() + 90
        async with async_client(server) as client:

            async def worker(i: int):
                nonlocal moved
                while not stop_when(seen) and time.monotonic() < deadline:
                    r = await client.completions.create(model="production", prompt=PROMPTS[i], max_tokens=16)
                    seen.append((i, r.model))
                    if len(seen) >= 8 and not moved:
                        moved = True
                        await asyncio.to_thread(move)

            await asyncio.gather(*(worker(i) for i in range(4)))
        return seen

    with running_server(settings) as server:
        seen = asyncio.run(
            load_while(  # a rollback: production goes back to the fallback, tiny-ar
                server,
                lambda: rollback("production", who="oncall", comment="serving test", registry=reg),
                lambda seen: sum(m == "tiny-ar" for _, m in seen) >= 12,
            )
        )
        models = [m for _, m in seen]
        assert models[0] == "tiny-llada" and models.count("tiny-ar") >= 12  # every request answered, none failed
        for i in range(4):  # per client, once the new version answered, the old one never did again
            mine = [m for c, m in seen if c == i]
            first_new = mine.index("tiny-ar") if "tiny-ar" in mine else len(mine)
            assert "tiny-llada" not in mine[first_new:], mine
        deadline = time.monotonic() + 30
        while ("tiny-llada", registry.versions["tiny-llada"]) in server.pool.loaded and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ("tiny-llada", registry.versions["tiny-llada"]) not in server.pool.loaded  # drained and unloaded

        # production moved behind unmask's back (no recorded move), and to weights the registry does not vouch for:
        # the server does not follow a move the audit trail lacks, so the last good holder keeps serving
        reg.client.set_registered_model_alias("tiny-llada", "production", bad_version)
        reg.client.delete_registered_model_alias("tiny-ar", "production")
        time.sleep(2)  # several polls (0.3 s apart): each sees the drift and keeps the audited holder
        r = httpx.post(
            server.base_url + "/v1/completions", json={"model": "production", "prompt": PROMPTS[0]}, timeout=60
        ).json()
        assert r["model"] == "tiny-ar" and r["unmask"]["weights_sha256"] == digest("tiny-ar")
        assert ("tiny-llada", bad_version) not in server.pool.loaded  # the unvouched weights were never loaded


def test_unmask_serve_refuses_a_folder_whose_weights_differ_from_the_registered_version(tmp_path):
    bogus = "f" * 64
    registry = serving_registry(tmp_path / "registry", weights={"tiny-llada": bogus})
    env = dict(
        os.environ, MLFLOW_TRACKING_URI=registry.tracking_uri, UNMASK_HOME=str(tmp_path / "home"), PYTHONPATH=str(REPO)
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "serve",
            "--alias",
            "production",
            "--port",
            str(free_port()),
            "--no-request-log",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "refusing to serve tiny-llada/" in done.stderr and bogus in done.stderr
    assert digest("tiny-llada") in done.stderr  # what the folder really hashes to


@pytest.mark.parametrize("continuous", [False, True])
def test_a_client_that_hangs_up_while_queued_frees_its_slot_and_is_never_decoded(continuous):
    settings = settings_for(
        shared_serving_registry().tracking_uri, names=["production"], max_batch=1, max_pending=4, continuous=continuous
    )
    slow = {"model": "production", "prompt": PROMPTS[0], "max_tokens": 128, "unmask": {"steps": 128}}

    def batches(server) -> float:
        text = httpx.get(server.base_url + "/metrics", timeout=10).text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("unmask_batches_total{"))

    async def scenario(server):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            ahead = [asyncio.create_task(client.post("/v1/completions", json=slow)) for _ in range(3)]
            await asyncio.sleep(0.2)  # one is decoding, two wait; the next one queues behind them all
            with pytest.raises(httpx.TimeoutException):
                await client.post("/v1/completions", json=slow, timeout=0.25)
            return await asyncio.gather(*ahead)

    with running_server(settings) as server:
        assert [r.status_code for r in asyncio.run(scenario(server))] == [200] * 3
        after = httpx.post(
            server.base_url + "/v1/completions", json={"model": "production", "prompt": PROMPTS[1]}, timeout=60
        )
        assert after.status_code == 200
        # the three ahead and the last; the abandoned one never ran. A running batch re-forms at every block, so
        # there each block is a batch: the three ahead decode 128 tokens in blocks of 32, the last one a block
        assert batches(server) == (3 * (128 // 32) + 1 if continuous else 4)
        assert server.pool.routes["production"].loaded.batcher.load == 0


def test_a_request_past_its_timeout_is_a_504_and_the_server_keeps_serving():
    settings = settings_for(shared_serving_registry().tracking_uri, names=["production"])
    settings.request_timeout_s = 0.05  # 128 model calls never fit in 50 ms on a CPU
    slow = {"model": "production", "prompt": PROMPTS[0], "max_tokens": 128, "unmask": {"steps": 128}}
    with running_server(settings) as server:
        r = httpx.post(server.base_url + "/v1/completions", json=slow, timeout=60)
        assert (
            r.status_code == 504 and r.json()["error"]["code"] == "timeout" and "0.05 s" in r.json()["error"]["message"]
        )
        settings.request_timeout_s = 60.0  # read per request: the next one may take its time
        ok = httpx.post(
            server.base_url + "/v1/completions", json={"model": "production", "prompt": PROMPTS[1]}, timeout=60
        )
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"].endswith("#### 82")


def test_unmask_serve_answers_logs_and_shuts_down_gracefully_on_sigterm(tmp_path):
    import signal

    from tests.support.servers import stop, wait_healthy

    registry = shared_serving_registry()
    home, port = tmp_path / "home", free_port()
    env = dict(os.environ, MLFLOW_TRACKING_URI=registry.tracking_uri, UNMASK_HOME=str(home), PYTHONPATH=str(REPO))
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", "serve", "--port", str(port), "--poll", "1"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", server, log, timeout_s=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="production", messages=[{"role": "user", "content": PROMPTS[0]}])
        assert r.choices[0].message.content.endswith("#### 24") and r.model == "tiny-llada"
        server.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught; unmask exits on it through Python's
        # exit path (128 + 15, as `unmask run` does, so atexit hooks run)
        assert server.wait(timeout=60) in (0, -signal.SIGTERM, 128 + signal.SIGTERM), log.read_text()[-2000:]
        assert "Application shutdown complete" in log.read_text()
    finally:
        stop(server)
    import pandas as pd

    from serving.request_log import read_rows

    rows = pd.DataFrame(read_rows(home / "serving" / "requests"))
    assert list(rows.endpoint) == ["chat"] and list(rows.status) == [200] and list(rows.alias) == ["production"]
