"""Memory admission: the peak a decode needs, computed from the config, matches the allocator's measured peak,
and the server caps its batches to the budget and refuses, with a clear 503, a request that cannot fit.

Measured with torch's profiler: every CPU allocation event carries the allocator's running total, so the
peak of a decode is max(total) less the total before it began (sampler.memory.peak_bytes); RSS is not used
(glibc keeps freed pages, so it neither rises nor falls with a decode reliably).
"""

from __future__ import annotations

import asyncio

import openai
import pytest
import torch
import transformers

from models import load
from models.adapters.diffusion_gemma import DiffusionGemmaAdapter
from sampler import SamplerConfig
from sampler.decode import decode_prompts
from sampler.memory import footprint, parse_bytes, peak_bytes
from serving.batching import Batcher
from tests.support.eval_fixtures import tiny_diffusion_gemma_config

PROMPT = "A box has 10 cups. Tom adds 14. How many in the box?"


def measured(handle, prompts, config) -> int:
    with torch.inference_mode():
        return peak_bytes(lambda: decode_prompts(handle, prompts, config))[1]


def diffusion_gemma(vocab: int, canvas: int) -> DiffusionGemmaAdapter:
    config = tiny_diffusion_gemma_config()
    config.text_config.vocab_size, config.canvas_length = vocab, canvas
    torch.manual_seed(0)
    adapter = DiffusionGemmaAdapter(transformers.DiffusionGemmaForBlockDiffusion(config).eval())
    adapter.eos_ids, adapter.pad_id = (), None  # every row decodes every canvas: the peak is reached
    return adapter


@pytest.mark.parametrize("vocab,canvas", [(8192, 32), (128, 8)], ids=["canvas-x-vocab-bound", "tiny"])
@pytest.mark.parametrize("rows", [1, 3])
def test_block_diffusion_peak_is_computed_within_20_percent(vocab, canvas, rows):
    adapter = diffusion_gemma(vocab, canvas)
    config = SamplerConfig(steps=6, gen_length=2 * canvas, block_length=canvas)
    prompt = list(range(3, 40))
    real = measured(adapter, [prompt] * rows, config)
    computed = footprint(adapter, len(prompt), config).batch(rows)
    assert 0.8 <= computed / real <= 1.2, (computed, real)


@pytest.mark.parametrize("gen_length,cache", [(32, "none"), (128, "none"), (128, "prefix")])
def test_llada_peak_is_computed_within_20_percent(gen_length, cache):
    handle = load("tiny-llada")
    config = SamplerConfig(steps=gen_length // 4, gen_length=gen_length, block_length=32, cache=cache).with_(
        **handle.sampler_ids()
    )
    prompt = handle.encode(PROMPT)
    real = measured(handle, [prompt] * 3, config)
    computed = footprint(handle, len(prompt), config).batch(3)
    assert 0.8 <= computed / real <= 1.2, (computed, real)


def test_the_real_diffusion_gemma_needs_about_two_gib_a_row_at_its_published_canvas():
    """The figure engines ran out of memory on (about 2.1 GiB a sequence), from the 26B config alone."""
    config = transformers.DiffusionGemmaConfig()  # the published architecture's defaults: vocabulary 262,144
    adapter = DiffusionGemmaAdapter.__new__(DiffusionGemmaAdapter)
    adapter.kind, adapter.canvas_length, adapter.eos_ids, adapter.pad_id, adapter.defaults = (
        "block-diffusion",
        256,
        (1,),
        0,
        {},
    )
    adapter.model = type(
        "Shape", (), {"config": config, "parameters": lambda self: iter([torch.zeros(1, dtype=torch.bfloat16)])}
    )()
    row = footprint(adapter, 128, SamplerConfig(steps=48, gen_length=256, block_length=256))
    assert 1.5 * 2**30 < row.terms["canvas_x_vocab"] < 2.2 * 2**30


def test_a_batch_never_holds_more_rows_than_the_budget_admits():
    handle = load("tiny-llada")
    config = SamplerConfig(steps=8, gen_length=32, block_length=32).with_(**handle.sampler_ids())
    prompt = handle.encode(PROMPT)
    peak = footprint(handle, len(prompt), config).per_row
    sizes: list[int] = []

    async def run():
        batcher = Batcher(handle, max_batch=16, window_s=0.05, memory_budget=int(2.5 * peak), on_batch=sizes.append)
        futures = [batcher.submit(prompt, config, config.hash(), peak=peak) for _ in range(6)]
        answers = await asyncio.gather(*futures)
        await batcher.drain()
        return answers

    answers = asyncio.run(run())
    assert sizes and max(sizes) == 2 and sum(sizes) == 6  # batched, but two rows at most
    assert len({tuple(a.generated) for a in answers}) == 1


def test_a_request_that_cannot_fit_is_a_503_and_the_server_keeps_serving():
    from tests.support.serving_fixtures import openai_client, running_server, settings_for, shared_serving_registry

    handle = load("tiny-llada")
    prompt = handle.encode(PROMPT)
    base = SamplerConfig(steps=16, gen_length=32, block_length=32).with_(**handle.sampler_ids())
    small = footprint(handle, len(prompt), base).per_row
    budget = int(small * 1.5)  # one 32-token request fits; a 128-token one needs about twice as much
    assert footprint(handle, len(prompt), base.with_(gen_length=128, steps=64)).per_row > budget
    settings = settings_for(shared_serving_registry().tracking_uri, names=["production"], memory_budget=budget)
    with running_server(settings) as server:
        client = openai_client(server)
        with pytest.raises(openai.APIStatusError) as refused:
            client.completions.create(model="production", prompt=PROMPT, max_tokens=128)
        assert refused.value.status_code == 503 and "memory budget" in str(refused.value)
        assert client.completions.create(model="production", prompt=PROMPT).choices[0].text


def test_budget_sizes_parse_and_bad_ones_are_named():
    assert parse_bytes("8GiB") == 8 * 2**30 and parse_bytes("512 MB") == 512 * 10**6 and parse_bytes("1000") == 1000
    for bad in ("lots", "8 parsecs", "0"):
        with pytest.raises(ValueError, match="size|above 0"):
            parse_bytes(bad)
