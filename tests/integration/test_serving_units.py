"""The serving parts one at a time, with no server: request -> SamplerConfig, batching keys and the batcher's
grouping (on the bundled tiny-llada), chat templates in their sandbox, the Parquet request log."""

from __future__ import annotations

import asyncio
import json
import time

import pandas as pd
import pytest
import torch

import models
from models.catalog import load_catalog
from registry.clock import SimulatedClock
from sampler.config import SamplerConfig
from sampler.masked_blocks import filter_logits
from sampler.proposal import keep_top_k
from serving.access import ApiKeyError, load_api_keys
from serving.batching import QUIET_SHARE, Batcher, QueueFull
from serving.chat import ChatTemplateError, chat_template
from serving.decoding import Limits, RequestError, batch_key, cut_at_stop, operating_config, request_config
from serving.local import seeded
from serving.relay import upstream_payload
from serving.request_log import RequestLog, row
from serving.schemas import ChatCompletionRequest, CompletionRequest
from serving.surface import parameter_table, parameters
from tests.support import REPO

BASE = SamplerConfig(gen_length=32, block_length=16, steps=16, mask_id=3, eos_id=1, eot_id=2)
LIMITS = Limits(max_tokens=128)


@pytest.fixture(scope="module")
def llada():
    return models.load("tiny-llada")


def test_max_tokens_decodes_whole_blocks_at_the_operating_points_steps_per_block():
    config, keep = request_config(BASE, "masked-diffusion", 40, None, None, {}, LIMITS)
    assert (config.gen_length, config.block_length, config.steps, keep) == (48, 16, 24, 40)
    config, keep = request_config(BASE, "masked-diffusion", None, None, None, {"block_length": 8}, LIMITS)
    assert (config.gen_length, config.block_length, config.steps) == (32, 8, 16)  # steps per token kept


def test_a_setting_that_cannot_decode_names_the_request_field():
    with pytest.raises(RequestError) as e:
        request_config(BASE, "masked-diffusion", 32, None, None, {"steps": 3}, LIMITS)
    assert e.value.param == "unmask.steps" and "multiple of the number of blocks" in e.value.message
    with pytest.raises(RequestError) as e:  # 100 tokens in blocks of 96 need a 192-token canvas
        request_config(BASE, "masked-diffusion", 100, None, None, {"block_length": 96}, LIMITS)
    assert e.value.param == "max_tokens" and "192" in e.value.message
    with pytest.raises(RequestError) as e:
        request_config(BASE, "masked-diffusion", 129, None, None, {}, LIMITS)
    assert e.value.param == "max_tokens"


def test_a_request_s_top_k_reaches_the_config_keys_its_batch_and_is_refused_where_nothing_reads_it():
    """Dream's own generate keeps the 50 likeliest tokens (issue 52): a request can ask for that decode."""
    body = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "unmask": {"top_k": 50}})
    config, _ = request_config(BASE, "masked-diffusion", None, None, None, body.unmask.overrides(), LIMITS)
    assert config.top_k == 50 and batch_key(config) != batch_key(config.with_(top_k=0))  # never batched with top_k 0
    for bad in (-1, 1.5, "50"):
        with pytest.raises(ValueError, match="top_k"):
            CompletionRequest.model_validate({"model": "m", "prompt": "hi", "unmask": {"top_k": bad}})
    with pytest.raises(RequestError) as e:  # a block-diffusion model reads only unmask.steps
        request_config(BASE, "block-diffusion", None, None, None, {"top_k": 50}, LIMITS)
    assert e.value.param == "unmask.top_k"


def test_a_catalog_entry_can_state_dream_s_decoding_and_the_server_decodes_with_it(dream, monkeypatch):
    """Before an operating point is recorded, `unmask serve` decodes with the catalog's defaults: Dream's entry says
    its schedule, order and top-k (models/catalog.yaml, dream-7b-instruct), which reached no config before."""
    stated = {k: load_catalog().get("dream-7b-instruct").decoding[k] for k in ("parallel", "remasking", "top_k")}
    assert stated == {"parallel": "timesteps", "remasking": "neg_entropy", "top_k": 50}
    monkeypatch.setattr(dream, "defaults", {**dream.defaults, **stated})
    config, source = operating_config(dream, None)
    assert source == "catalog defaults" and (config.parallel, config.remasking, config.top_k) == tuple(stated.values())
    monkeypatch.setattr(dream, "defaults", {**dream.defaults, "parallel": "timestep"})
    with pytest.raises(ValueError, match="the catalog's decoding of tiny-dream: .*parallel"):
        operating_config(dream, None)


def test_a_top_k_above_the_vocabulary_keeps_every_token():
    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(filter_logits(logits, 1.0, 1_000_000, 1.0), logits)
    assert torch.equal(keep_top_k(logits, 1_000_000), logits)


def test_an_autoregressive_model_reads_only_length_temperature_and_seed():
    config, keep = request_config(BASE, "autoregressive", 10, 0.5, 3, {"steps": 7, "block_length": 4}, LIMITS)
    assert (config.gen_length, config.temperature, config.seed, keep) == (10, 0.5, 3, 10)
    assert (config.steps, config.block_length) == (10, 10)


def test_greedy_requests_share_a_batch_key_whatever_their_seed_and_sampled_ones_never_batch():
    a, _ = request_config(BASE, "masked-diffusion", None, 0.0, 1, {}, LIMITS)
    b, _ = request_config(BASE, "masked-diffusion", None, 0.0, 2, {}, LIMITS)
    assert batch_key(a) == batch_key(b) is not None
    sampled, _ = request_config(BASE, "masked-diffusion", None, 0.7, 1, {}, LIMITS)
    shuffled, _ = request_config(BASE, "masked-diffusion", None, 0.0, 1, {"remasking": "random"}, LIMITS)
    assert batch_key(sampled) is None and batch_key(shuffled) is None
    other, _ = request_config(BASE, "masked-diffusion", None, 0.0, None, {"steps": 8}, LIMITS)
    assert batch_key(other) != batch_key(a)


def test_sampled_requests_share_a_batch_key_across_seeds_only_where_each_row_has_its_own_generator():
    one, _ = request_config(BASE, "masked-diffusion", None, 0.7, 1, {}, LIMITS)
    two, _ = request_config(BASE, "masked-diffusion", None, 0.7, 2, {}, LIMITS)
    hotter, _ = request_config(BASE, "masked-diffusion", None, 0.9, 1, {}, LIMITS)
    assert batch_key(one, row_seeded=True) == batch_key(two, row_seeded=True) is not None
    assert batch_key(hotter, row_seeded=True) != batch_key(one, row_seeded=True)
    assert batch_key(one.with_(seed=None), row_seeded=True) is None  # torch's global RNG: never batched
    greedy, _ = request_config(BASE, "masked-diffusion", None, 0.0, 1, {}, LIMITS)
    assert batch_key(greedy, row_seeded=True) == batch_key(greedy)


def test_operating_config_takes_the_recorded_point_with_the_models_own_ids(llada):
    config, source = operating_config(llada, {"gen_length": 32, "block_length": 32, "steps": 8, "mask_id": 126336})
    assert source == "operating point" and (config.steps, config.mask_id, config.eos_id) == (8, 3, 1)
    config, source = operating_config(llada, None)
    assert source == "catalog defaults" and (config.gen_length, config.steps) == (64, 64)  # models/catalog.yaml


def test_stop_sequences_cut_at_the_earliest():
    assert cut_at_stop("7+5=12\n#### 12", ["####", "\n"]) == ("7+5=12", True)
    assert cut_at_stop("abc", ["x"]) == ("abc", False)


def test_request_schema_refuses_unknown_fields_and_accepts_whole_numbers_for_floats():
    ok = CompletionRequest.model_validate(
        {"model": "production", "prompt": "hi", "temperature": 0, "unmask": {"parallel_threshold": 1}}
    )
    assert ok.temperature == 0.0 and ok.unmask.parallel_threshold == 1.0
    with pytest.raises(ValueError, match="top_k"):
        CompletionRequest.model_validate({"model": "production", "prompt": "hi", "top_k": 5})
    with pytest.raises(ValueError, match="temperature"):
        CompletionRequest.model_validate({"model": "production", "prompt": "hi", "temperature": "0.5"})


@pytest.fixture(scope="module")
def dream():
    return models.load("tiny-dream")


# Dream (issue 52) decodes with its own schedule and order: one block, parallel=timesteps, remasking neg_entropy
@pytest.mark.parametrize(
    "family,settings", [("llada", {}), ("dream", {"parallel": "timesteps", "remasking": "neg_entropy", "top_k": 50})]
)
def test_the_batcher_groups_same_key_requests_and_decodes_each_row_as_if_alone(request, family, settings):
    llada = request.getfixturevalue(family)
    config = BASE.with_(gen_length=16, block_length=16, steps=4, **settings, **llada.sampler_ids())
    prompts = [llada.encode(p) for p in ("A box has 9 coins. Zoe takes 3. How many remain?", "Tom has 4 pens.", "12")]
    sizes: list[int] = []

    async def run():
        batcher = Batcher(llada, max_batch=8, window_s=0.2, max_pending=8, on_batch=sizes.append)
        together = [batcher.submit(p, config, "k") for p in prompts]
        alone = batcher.submit(prompts[0], config.with_(temperature=1.0), None)
        results = await asyncio.gather(*together, alone)
        solo = [await batcher.submit(p, config, "k") for p in prompts]
        await batcher.drain()
        return results, solo

    results, solo = asyncio.run(run())
    assert sizes[:2] == [3, 1] and [r.batch_size for r in results] == [3, 3, 3, 1]
    assert [r.generated for r in results[:3]] == [r.generated for r in solo]


def test_requests_that_arrive_mid_batch_join_at_the_next_block_and_decode_as_if_alone(llada):
    config = BASE.with_(gen_length=32, block_length=8, steps=16)  # four blocks
    later = [config.with_(gen_length=16, steps=8), config.with_(gen_length=48, steps=24)]  # other lengths join too
    texts = ("A box has 9 coins. Zoe takes 3. How many remain?", "Tom has 4 pens.", "12", "Sam buys 7 apples.")
    prompts = [llada.encode(p) for p in texts]
    sizes: list[int] = []

    async def run():
        batcher = Batcher(llada, max_batch=8, window_s=0.0, max_pending=8, on_batch=sizes.append)
        late: list[asyncio.Future] = []
        streamed: list[int] = []

        def first_block_final(tokens: list[int], scored: object) -> None:  # its first block is done: two arrive
            assert scored is None  # it asked for no log-probabilities
            streamed.extend(tokens)
            if not late:
                late.extend(batcher.submit(p, c, c.hash()) for p, c in zip(prompts[1:3], later))

        first = await batcher.submit(prompts[0], config, "k", on_tokens=first_block_final)
        joined = await asyncio.gather(*late)
        solo = [await batcher.submit(p, c, c.hash()) for p, c in zip(prompts, [config, *later])]
        await batcher.drain()
        return first, joined, solo, streamed

    first, joined, solo, streamed = asyncio.run(run())
    assert sizes[:2] == [1, 3]  # block 1 of the first request decoded beside block 0 of the two that arrived
    assert [r.generated for r in (first, *joined)] == [r.generated for r in solo]
    assert streamed == first.generated  # streamed block by block, nothing lost or repeated
    assert first.batch_size > 1  # the first request finished in the batch they joined: they did not wait for it


@pytest.mark.timeout(120)  # before the fix the worker died and every request of the batch waited for ever
def test_a_stream_whose_callback_fails_ends_alone_and_the_running_batch_goes_on(llada):
    config = BASE.with_(gen_length=32, block_length=8, steps=16)
    prompts = [llada.encode(p) for p in ("Tom has 4 pens.", "12")]

    def broken(tokens: list[int], scored: object) -> None:
        raise RuntimeError("the client's stream is gone")

    async def run():
        batcher = Batcher(llada, max_batch=8, window_s=0.0, max_pending=8)
        failing = batcher.submit(prompts[0], config, "k", on_tokens=broken)
        other = batcher.submit(prompts[1], config, "k")
        outcomes = await asyncio.gather(failing, other, return_exceptions=True)
        later = await batcher.submit(prompts[1], config, "k")  # the worker is still there
        await batcher.drain()
        return outcomes, later, batcher.load

    (failed, answered), later, load = asyncio.run(run())
    assert isinstance(failed, RuntimeError) and "stream is gone" in str(failed)
    assert answered.generated == later.generated and load == 0


def test_a_static_batch_takes_the_prompts_closest_in_length_to_the_oldest_and_the_rest_go_next(llada):
    config = BASE.with_(gen_length=16, block_length=16, steps=4)
    short, long = llada.encode("Tom has 4 pens."), llada.encode("A box has 9 coins. Zoe takes 3. How many remain? " * 3)

    sizes: list[int] = []

    async def run():
        batcher = Batcher(llada, max_batch=2, window_s=0.2, max_pending=8, continuous=False, on_batch=sizes.append)
        futures = [batcher.submit(p, config, "k") for p in (short, long, short[:-1])]
        results = await asyncio.gather(*futures)
        await batcher.drain()
        return results

    first, longest, close = asyncio.run(run())
    assert (first.batch_size, close.batch_size, longest.batch_size) == (2, 2, 1)  # no row padded to the long prompt
    assert sizes == [2, 1]  # the long prompt went in the next batch, alone


def test_a_lone_request_does_not_wait_for_company_and_requests_that_overlap_do(llada):
    """In simulated time (registry/clock.py), so the waits are exact: the lone request starts at once, the pair
    that arrived together waits exactly the quiet share of the window (no one else arrived), not the whole window."""
    config = BASE.with_(gen_length=16, block_length=16, steps=4)
    prompt = llada.encode("Tom has 4 pens.")
    clock = SimulatedClock()

    async def run():
        batcher = Batcher(llada, max_batch=8, window_s=2.0, max_pending=8, continuous=False, clock=clock)
        lone = await batcher.submit(prompt, config, "k")
        pair = await asyncio.gather(batcher.submit(prompt, config, "k"), batcher.submit(prompt, config, "k"))
        await batcher.drain()
        return lone, pair

    lone, pair = asyncio.run(run())
    assert lone.batch_size == 1 and lone.queue_s == 0.0  # one at a time: the two-second window would be waste
    assert [r.batch_size for r in pair] == [2, 2]  # the second arrived beside the first: the window held it ...
    assert [r.queue_s for r in pair] == [2.0 * QUIET_SHARE] * 2  # ... until its quiet share passed, no one arriving
    assert clock.sleeps == [2.0 * QUIET_SHARE]  # the only wait of the run


def test_the_batcher_refuses_beyond_max_pending_and_frees_a_cancelled_slot(llada):
    config = BASE.with_(gen_length=16, block_length=16, steps=2)

    async def run():
        batcher = Batcher(llada, max_batch=1, window_s=0.0, max_pending=2)
        first = batcher.submit([5, 6], config, "k")
        second = batcher.submit([5, 6], config, "k")
        with pytest.raises(QueueFull):
            batcher.submit([5, 6], config, "k")
        second.cancel()  # a client that gave up
        third = batcher.submit([5, 6], config, "k")  # its slot is free at once
        await asyncio.gather(first, third)
        await batcher.drain()
        return batcher.load

    assert asyncio.run(run()) == 0


def test_admission_is_fair_between_clients_so_a_heavy_one_gets_the_429(llada):
    """Issue 51, item 8: one client looping on many choices took the whole queue and another got 429 on nearly
    every request. Alone, a client may hold all but an eighth of the queue; while others hold rows, each may hold
    an equal share, so the one over its share is refused, however empty the queue still is."""
    config = BASE.with_(gen_length=16, block_length=16, steps=2)

    async def run():
        batcher = Batcher(llada, max_batch=1, window_s=0.0, max_pending=16)
        assert batcher.most_one_client_holds == 14
        with pytest.raises(QueueFull, match="one client may hold 14 of the 16"):
            batcher.admit("heavy", 15)
        batcher.admit("heavy", 10)
        heavy = [batcher.submit([5, 6], config, "k", client="heavy") for _ in range(10)]
        batcher.admit("light", 1)  # the reserve, and its share, leave room for the client that asks once
        light = batcher.submit([5, 6], config, "k", client="light")
        with pytest.raises(QueueFull, match="fair share is 8 while 1 other"):
            batcher.admit("heavy", 1)  # 11 of 16 queued: room, but not for the client over its share
        await light
        await asyncio.gather(*heavy)
        batcher.admit("heavy", 14)  # alone again: all but the reserve
        await batcher.drain()

    asyncio.run(run())


def test_chat_templates_render_in_a_sandbox(tmp_path):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "  2+2?  "}]
    bundled = chat_template(models.load("tiny-ar").path)
    assert bundled.source.endswith("tokenizer_config.json") and bundled.render(messages) == "2+2?"
    assert chat_template(tmp_path).source == "none"  # no template: chat is refused, not guessed
    with pytest.raises(ChatTemplateError, match="no chat template"):
        chat_template(tmp_path).render(messages)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"})
    )
    with pytest.raises(ChatTemplateError, match="tokenizer_config.json"):
        chat_template(tmp_path).render(messages)


def test_the_request_log_flushes_full_batches_while_open_and_the_rest_on_close(tmp_path):
    log = RequestLog(tmp_path, flush_rows=3, flush_s=60)
    for i in range(3):
        log.append(row(endpoint="completions", alias="production", status=200, latency_s=0.1 * i, nfe=i))
    deadline = time.monotonic() + 20
    while not log.files() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pd.read_parquet(log.files()[0])) == 3  # written while open, by the writer thread
    for i in range(3, 7):
        log.append(row(endpoint="chat", alias="fallback", status=400, error="max_tokens: ...", nfe=i))
    log.close()
    frame = pd.concat([pd.read_parquet(f) for f in log.files()])
    assert len(frame) == 7 and sorted(frame.nfe) == list(range(7))
    assert not list(tmp_path.glob("*.partial"))


def test_registry_reads_resolve_aliases_and_model_names_to_versions_with_their_operating_point():
    from registry import Registry, RegistryError
    from registry.serving import holder, served_version
    from tests.support.serving_fixtures import OPERATING, digest, shared_serving_registry

    shared = shared_serving_registry()
    reg = Registry(shared.tracking_uri)
    assert holder(reg, "production") == ("tiny-llada", shared.versions["tiny-llada"])
    assert holder(reg, "candidate") == holder(reg, "tiny-llada")  # tiny-ar holds `fallback`, not `candidate`
    assert holder(reg, "fallback") == ("tiny-ar", shared.versions["tiny-ar"]) and holder(reg, "staging") is None
    with pytest.raises(RegistryError, match="tiny-ar, tiny-llada"):
        holder(reg, "no-such-model")
    version = served_version(reg, "production")
    assert (version.stage, version.source, version.weights_sha256) == ("production", "tiny-llada", digest("tiny-llada"))
    assert {k: version.operating_config[k] for k in OPERATING["tiny-llada"]} == OPERATING["tiny-llada"]
    assert served_version(reg, "fallback").stage == "production" and served_version(reg, "candidate").stage == "poc"


def test_weights_override_loads_a_copy_that_hashes_right_and_refuses_one_that_does_not(tmp_path):
    import shutil

    from models.loading import resolve_model_path
    from registry.serving import ServedVersion
    from serving.pool import WeightsMismatch, load_checked
    from tests.support.serving_fixtures import digest

    version = ServedVersion(
        name="production",
        model="tiny-llada",
        version="3",
        weights_sha256=digest("tiny-llada"),
        source="tiny-llada",
        kind="masked-diffusion",
        stage="production",
    )
    copy = shutil.copytree(resolve_model_path("tiny-llada"), tmp_path / "copy")
    assert load_checked(version, {"tiny-llada": str(copy)}, "cpu", "float32").path == copy
    with pytest.raises(WeightsMismatch) as e:
        load_checked(version, {"tiny-llada": str(resolve_model_path("tiny-ar"))}, "cpu", "float32")
    assert digest("tiny-ar") in str(e.value) and digest("tiny-llada") in str(e.value) and "tiny-llada/3" in str(e.value)


def test_the_parameter_table_in_the_docs_is_the_surface_and_covers_every_request_field():

    docs = (REPO / "docs" / "serving.md").read_text()
    assert parameter_table() in docs  # the docs' table is generated from serving.surface.PARAMETERS
    for endpoint, schema in (("completions", CompletionRequest), ("chat", ChatCompletionRequest)):
        assert set(schema.model_fields) == set(parameters(endpoint)), endpoint  # one entry per accepted field


def test_the_relay_sends_upstream_only_what_the_client_set():

    bare = CompletionRequest.model_validate({"model": "auto", "prompt": "2+2"})
    assert upstream_payload(bare) == {"prompt": "2+2"}  # no injected n, echo, stream or best_of
    tuned = CompletionRequest.model_validate(
        {"model": "auto", "prompt": ["a", "b"], "n": 1, "top_p": 0.9, "unmask": {"steps": 8}}
    )
    assert upstream_payload(tuned) == {"prompt": ["a", "b"], "n": 1, "top_p": 0.9, "unmask": {"steps": 8}}
    chat = ChatCompletionRequest.model_validate(
        {"model": "auto", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    )
    assert upstream_payload(chat) == {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}


def test_unseeded_sampled_choices_draw_distinct_seeds_and_a_seed_s_gives_s_plus_k():

    sampled, greedy = SamplerConfig(temperature=1.0), SamplerConfig(temperature=0.0)
    drawn = [c.seed for c in seeded(sampled, None, 8)]
    assert len(set(drawn)) == 8 and all(0 <= s < 2**63 for s in drawn)
    assert [c.seed for c in seeded(sampled, None, 1)] != [c.seed for c in seeded(sampled, None, 1)]
    assert [c.seed for c in seeded(sampled, 2**63 - 1, 2)] == [2**63 - 1, 0]
    assert seeded(greedy, None, 3) == [greedy] * 3  # nothing drawn: one config, one batch key


def test_api_keys_come_from_a_file_and_the_environment_and_bad_ones_are_named(tmp_path):

    keys = tmp_path / "keys"
    keys.write_text("# team keys\nsk-alpha-0001\n\n  sk-beta-00002  \n")
    assert load_api_keys(keys, {"UNMASK_API_KEYS": "sk-gamma-003,"}) == {
        "sk-alpha-0001",
        "sk-beta-00002",
        "sk-gamma-003",
    }
    assert load_api_keys(None, {}) == frozenset()
    with pytest.raises(ApiKeyError, match="cannot be read"):
        load_api_keys(tmp_path / "missing", {})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ApiKeyError, match="no key in it"):
        load_api_keys(tmp_path / "empty", {})
    with pytest.raises(ApiKeyError, match="shorter than 8") as e:
        load_api_keys(None, {"UNMASK_API_KEYS": "abc"})
    assert "abc" not in str(e.value)  # a key is never in a message


def test_a_chat_template_that_leaves_messages_out_says_which():
    bundled = chat_template(models.load("tiny-ar").path)
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "2+2?"},
    ]
    rendered = bundled.render_chat(messages)
    assert rendered.text == "2+2?"
    assert rendered.dropped == [{"index": 0, "role": "developer"}, {"index": 1, "role": "user"}]


@pytest.mark.parametrize("family", ["sdar", "llada2", "nemotron"])
def test_the_batcher_decodes_each_masked_block_row_as_if_alone(tmp_path, family):
    """A random SDAR, and the LLaDA2 MoE and Nemotron-Labs-Diffusion parity checkpoints (masked block diffusion; the
    last self-speculative, greedy) behind the batcher: requests with their own seeds share a left-padded batch, and
    each answer is the one it gets alone."""
    from serving.decoding import BLOCK, operating_config
    from tests.support.eval_fixtures import write_llada2, write_nemotron, write_sdar

    writers = {"sdar": write_sdar, "llada2": write_llada2, "nemotron": write_nemotron}
    handle = models.load(writers[family](tmp_path / family))
    base, _ = operating_config(handle, None)
    config, _ = request_config(base.with_(gen_length=8, block_length=4, steps=8), BLOCK, 12, None, 5, {}, LIMITS)
    prompts = [handle.encode(p) for p in ("Sort: cab", "Tom has 4 pens.", "12")]
    seeds = [config.with_(seed=s) for s in (5, 6, 7)]
    sizes: list[int] = []

    async def run():
        batcher = Batcher(handle, max_batch=8, window_s=0.2, max_pending=8, on_batch=sizes.append)
        keys = [batch_key(c, True, BLOCK) for c in seeds]
        together = await asyncio.gather(*(batcher.submit(p, c, k) for p, c, k in zip(prompts, seeds, keys)))
        solo = [await batcher.submit(p, c, k) for p, c, k in zip(prompts, seeds, keys)]
        await batcher.drain()
        return together, solo

    together, solo = asyncio.run(run())
    assert sizes[0] == 3 and [r.batch_size for r in together] == [3, 3, 3]
    assert [r.generated for r in together] == [r.generated for r in solo]
    assert len({tuple(r.generated) for r in together}) == 3
