"""The batching cap: the most a static batch of n rows can gain at the model itself, measured on its forward.

A served batch of n rows costs one forward of n rows per decoding step where n solo requests cost n
forwards of one row, so n rows answer at most `cap(n) = n * t(1) / t(n)` times faster than one, whatever
the server does around the model. A load test's tokens/s at n in flight over its tokens/s solo (the
achieved gain) is then read against that cap: near it, the server batches as well as the model allows;
far below it, the loss is in the serving path (windows, queueing, the HTTP stack), not the network.
The cap bounds the gain only where the forward is most of a request's time. Where the per-step work
around it (the sampler, Python, HTTP) is comparable, as on the bundled tiny models on a CPU, batching
amortises that work too and the gain can pass the cap: a share above 100% says the forward is not
what limits that server.

What is timed is the forward the operating point repeats: for masked diffusion one forward over the
whole canvas (prompt + `gen_length` masks, left-padded as serving pads a batch); for an autoregressive
model one cached decoding step, a 1-token input over a KV cache of the prompt. Block diffusion decodes
through its own encoder/decoder calls and is not measured here (`measure_cap` says so).

The decode cap (`measure_decode_cap`) times what a static batch really replaces: a whole `sampler.decode` at
the operating point of n prompts as one batch, against the same prompts decoded one by one. A decode is
several forwards of different shapes (a refresh over the canvas, windows over a block) and the sampler's
step around each, and a batch runs until its slowest row is done, so on a compute-bound host it is usually
lower than the forward's cap (docs/experiments/serving-batching: 1.4-2.2x against 2.2-2.4x for tiny-llada).
It is measured for every kind `decode` runs, block diffusion included.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from evals.records import ServingRecord
from sampler.config import SamplerConfig
from sampler.decode import decode, left_pad, padding_id
from sampler.handle import Handle

ROWS = (1, 4, 16)
REPEATS = 9  # timed forwards per row count, after one untimed warm-up; the median is kept
DECODE_REPEATS = 3  # rounds of whole decodes (each: every prompt alone, then each batch)


@dataclass(frozen=True)
class BatchingCap:
    """Median seconds of one forward per row count, and which forward that was."""

    forward_s: dict[int, float]  # rows -> seconds (for "decode": rows 1 is the mean of each prompt alone)
    forward: str  # "canvas" (masked diffusion), "cached step" (autoregressive) or "decode" (a whole decode)

    def cap(self, rows: int) -> float:
        """The most a static batch of `rows` can gain over one row at the model: rows * t(1) / t(rows)."""
        return rows * self.forward_s[1] / self.forward_s[rows]


@dataclass(frozen=True)
class GainAgainstCap:
    """One loaded level of one model: the batching gain it achieved, and the most the model allows there."""

    served_as: str
    concurrency: int
    gain: float | None  # tokens/s at `concurrency` over tokens/s solo; None when either was not measured
    cap: float | None  # at min(concurrency, max batch) rows; None when the model was not measured (a remote one)
    decode_cap: float | None = None  # the whole decode's cap at those rows (`measure_decode_cap`), where measured

    @property
    def share(self) -> float | None:
        return _share(self.gain, self.cap)

    @property
    def decode_share(self) -> float | None:
        return _share(self.gain, self.decode_cap)


def _share(gain: float | None, cap: float | None) -> float | None:
    return gain / cap if gain is not None and cap else None


def cap_rows(concurrency: list[int], max_batch: int) -> tuple[int, ...]:
    """The row counts a load at these concurrencies batches: no batch is larger than `max_batch`."""
    return tuple(sorted({min(c, max_batch) for c in concurrency} | {1}))


def gains_against_caps(
    records: list[ServingRecord],
    caps: dict[str, BatchingCap | None],
    max_batch: int,
    decode_caps: dict[str, BatchingCap | None] | None = None,
) -> list[GainAgainstCap]:
    """Each loaded level (concurrency above 1) of each served name, its gain over solo beside its caps."""
    solo = {r.served_as: r.tokens_per_s for r in records if r.concurrency == 1}
    found = []
    for r in records:
        if r.concurrency == 1:
            continue
        base, rows = solo.get(r.served_as), min(r.concurrency, max_batch)
        gain = r.tokens_per_s / base if r.tokens_per_s is not None and base else None
        cap, decoded = caps.get(r.served_as), (decode_caps or {}).get(r.served_as)
        found.append(
            GainAgainstCap(
                r.served_as, r.concurrency, gain, cap.cap(rows) if cap else None, decoded.cap(rows) if decoded else None
            )
        )
    return found


def measure_cap(
    handle: Handle,
    config: SamplerConfig,
    prompts: list[list[int]],
    rows: tuple[int, ...] = ROWS,
    repeats: int = REPEATS,
) -> BatchingCap:
    """Time the operating point's forward over batches of `rows` rows (the token-id `prompts`, cycled), 1 always
    included; ValueError for a kind whose forward this does not measure, or no prompts."""
    if not prompts:
        raise ValueError("measure_cap: no prompts to build the batch from")
    if handle.masked_diffusion:
        build, what = canvas_forward(handle, config), "canvas"
    elif handle.causal:
        build, what = cached_step(handle), "cached step"
    else:
        raise ValueError(
            f"{handle.kind}: the batching cap is measured for masked-diffusion and autoregressive "
            "models only (block diffusion decodes through its own encoder/decoder calls)"
        )
    device = next(handle.model.parameters()).device
    prepared = {}
    with torch.inference_mode():
        for n in sorted(set(rows) | {1}):
            ids, mask = left_pad([prompts[i % len(prompts)] for i in range(n)], padding_id(handle))
            prepared[n] = build(ids.to(device), None if mask is None else mask.to(device))
            prepared[n]()()  # warm-up: allocator and kernel selection for this shape
        # rounds over every row count, so a host busy for a while slows them alike instead of one of them
        times = [{n: _seconds(prepare, device) for n, prepare in prepared.items()} for _ in range(repeats)]
    return BatchingCap({n: statistics.median(t[n] for t in times) for n in prepared}, what)


def measure_decode_cap(
    handle: Handle,
    config: SamplerConfig,
    prompts: list[list[int]],
    rows: tuple[int, ...] = ROWS,
    repeats: int = DECODE_REPEATS,
) -> BatchingCap:
    """Time a whole decode at `config` of the first n `prompts` (cycled) as one batch per row count n, and each of
    the largest batch's prompts alone (their mean is the one-row time); rounds over all of them, medians kept."""
    if not prompts:
        raise ValueError("measure_decode_cap: no prompts to build the batch from")
    device = next(handle.model.parameters()).device
    largest = [prompts[i % len(prompts)] for i in range(max(rows))]
    pad = padding_id(handle)

    def batch_of(chosen: list[list[int]]) -> Callable[[], Callable[[], Any]]:
        ids, mask = left_pad(chosen, pad)
        ids, mask = ids.to(device), None if mask is None else mask.to(device)
        return lambda: lambda: decode(handle, ids, config, attention_mask=mask)

    alone = [batch_of([p]) for p in largest]
    batches = {n: batch_of(largest[:n]) for n in sorted(set(rows) - {1})}
    with torch.inference_mode():
        for prepare in [alone[0], *batches.values()]:
            prepare()()  # warm-up
        times = []
        for _ in range(repeats):
            solo = {1: statistics.fmean(_seconds(prepare, device) for prepare in alone)}
            times.append(solo | {n: _seconds(prepare, device) for n, prepare in batches.items()})
    return BatchingCap({n: statistics.median(t[n] for t in times) for n in times[0]}, "decode")


# A forward builder takes the padded prompts `(rows, prompt_len)` and their mask (None: no padding) and gives
# `prepare`: the untimed setup, returning the call that is timed.
Forward = Callable[[torch.Tensor, "torch.Tensor | None"], Callable[[], Callable[[], Any]]]


def canvas_forward(handle: Handle, config: SamplerConfig) -> Forward:
    """The masked-diffusion step: one forward over prompt + `gen_length` mask positions."""

    def build(ids: torch.Tensor, mask: torch.Tensor | None) -> Callable[[], Callable[[], Any]]:
        assert handle.mask_id is not None  # a masked-diffusion model's handle carries its mask id
        canvas = torch.cat([ids, ids.new_full((ids.shape[0], config.gen_length), handle.mask_id)], dim=1)
        full = None if mask is None else torch.cat([mask, mask.new_ones(ids.shape[0], config.gen_length)], dim=1)
        return lambda: lambda: handle.model(canvas, attention_mask=full)

    return build


def cached_step(handle: Handle) -> Forward:
    """The autoregressive step: one token over the prompt's KV cache, rebuilt (untimed) before each timed call
    because a Hugging Face cache grows in place."""

    def build(ids: torch.Tensor, mask: torch.Tensor | None) -> Callable[[], Callable[[], Any]]:
        mask = torch.ones_like(ids) if mask is None else mask
        step_mask = torch.cat([mask, mask.new_ones(ids.shape[0], 1)], dim=1)

        def prepare() -> Callable[[], Any]:
            cache = handle.model(ids, attention_mask=mask, use_cache=True).past_key_values
            return lambda: handle.model(ids[:, -1:], attention_mask=step_mask, past_key_values=cache, use_cache=True)

        return prepare

    return build


def _seconds(prepare: Callable[[], Callable[[], Any]], device: torch.device) -> float:
    """Wall seconds of the call `prepare` gives, its setup excluded and the device synchronised around it."""
    call = prepare()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
