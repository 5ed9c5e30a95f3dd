"""Latency, throughput, tokens per forward, NFE and memory of one decoder on a list of prompts.

Each request is timed on its own (batch 1, after warm-up), then the same prompts run in batches
for throughput. A request that fails (NaN/inf logits, any exception) becomes a counted error with
its message; the other requests still finish, so nothing measured is lost. An API model (text in,
text out) is measured through its endpoint instead (`measure_endpoint`, one request at a time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from evals.fingerprint import output_hash
from evals.loadtest import LoadSpec, run_load
from sampler.decode import decode_prompts

MAX_ERROR_MESSAGES = 5


class FirstBlockClock:
    """An `on_step` callback (sampler.output.StepInfo): when the step that completed block 0 was reported.

    Every decoder reports its steps, so this reads the same for unmask's samplers, transformers'
    `generate` and the ONNX Runtime backend: AR decoders complete block 0 with the block_length-th
    token, an early exit (or every row ending) completes it at once.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.at: float | None = None  # the clock's time at that report

    def __call__(self, info: Any) -> None:
        now = self.clock()
        if self.at is None and info.block == 0 and info.block_done:
            self.at = now


class PeakMemory:
    """Peak resident memory (MB) of this process while inside the block, sampled every `interval` s;
    on CUDA the peak allocated memory instead."""

    def __init__(self, device: str | torch.device = "cpu", interval: float = 0.005):
        self.cuda = str(device).startswith("cuda")
        self.interval = interval
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while True:
            self.peak_mb = max(self.peak_mb, proc.memory_info().rss / 2**20)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            self.peak_mb = torch.cuda.max_memory_allocated() / 2**20
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()


@dataclass
class RequestResult:
    """One prompt decoded alone."""

    index: int
    tokens: list[int] | None = None  # generated ids, every position (EOS padding included)
    latency_s: float | None = None
    first_block_s: float | None = None
    nfe: int = 0  # canvases the model evaluated (a speculative call may evaluate several)
    calls: int = 0  # sequential model calls (decoding steps)
    useful_tokens: int = 0  # before the first EOS/EoT
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Measurement:
    """What `measure` found; `record_fields()` gives the EvalRecord fields it fills."""

    requests: list[RequestResult]
    batch_size: int
    warmup: int
    throughput_items_per_s: float | None = None
    batch_errors: list[str] = field(default_factory=list)  # one message per failed batch item
    peak_mem_mb: float = 0.0

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def errors(self) -> int:
        return sum(not r.ok for r in self.requests) + len(self.batch_errors)

    def error_messages(self) -> list[str]:
        msgs = [f"item {r.index}: {r.error}" for r in self.requests if not r.ok] + self.batch_errors
        return msgs[:MAX_ERROR_MESSAGES] + (
            [f"... and {len(msgs) - MAX_ERROR_MESSAGES} more"] if len(msgs) > MAX_ERROR_MESSAGES else []
        )

    def record_fields(self) -> dict[str, Any]:
        ok = self.ok
        latencies = np.array([r.latency_s for r in ok], dtype=float)
        busy = float(latencies.sum())
        p50, p95, p99 = (float(np.percentile(latencies, q)) for q in (50, 95, 99)) if len(ok) else (0.0, 0.0, 0.0)
        positions = sum(len(r.tokens) for r in ok if r.tokens is not None)  # an answered request has them
        nfe = sum(r.nfe for r in ok)
        calls = sum(r.calls for r in ok)
        first = [r.first_block_s for r in ok if r.first_block_s is not None]
        return {
            "latency_p50_s": p50,
            "latency_p95_s": p95,
            "latency_p99_s": p99,
            "time_to_first_block_s": float(np.median(first)) if first else None,
            "throughput_items_per_s": self.throughput_items_per_s,
            "batch_size": self.batch_size,
            "tokens_per_s": sum(r.useful_tokens for r in ok) / busy if busy > 0 else 0.0,
            "tokens_per_s_with_padding": positions / busy if busy > 0 else 0.0,
            "tokens_per_forward": positions / calls if calls else 0.0,  # per sequential call, as the sampler counts it
            "nfe": nfe / len(ok) if ok else 0.0,
            "peak_mem_mb": self.peak_mem_mb,
            "errors": self.errors,
            "error_messages": self.error_messages(),
            "output_hash": output_hash(r.tokens for r in self.requests),
            "warmup": self.warmup,
        }


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def measure(
    loaded: Any,
    prompts: list[list[int]],
    config: Any,
    *,
    warmup: int = 1,
    batch_size: int = 1,
    throughput_items: int | None = None,
    device: str | torch.device = "cpu",
    on_request: Callable[[RequestResult], None] | None = None,
) -> Measurement:
    """Decode each prompt alone (timed, after `warmup` discarded requests), then in batches of `batch_size`.

    prompts: token ids per request (no padding). `loaded` is a model handle (`models.load`). Never raises
    for a failing request: the error is counted and the request's tokens are None.
    """
    if not prompts:
        raise ValueError("measure: no prompts to decode")
    if batch_size < 1:
        raise ValueError(f"measure: batch_size must be >= 1, got {batch_size}")

    def run_one(index: int, prompt: list[int]) -> RequestResult:
        clock = FirstBlockClock()
        start = time.perf_counter()
        try:
            out = decode_prompts(loaded, [prompt], config, on_step=clock)
            if str(device).startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as e:  # NaN logits, shape errors, OOM: counted, never fatal to the run
            return RequestResult(index=index, error=describe_error(e))
        end = time.perf_counter()
        tokens = out.sequences[0, out.prompt_length :].tolist()
        first = clock.at - start if clock.at is not None else None
        return RequestResult(
            index=index,
            tokens=tokens,
            latency_s=end - start,
            first_block_s=first,
            nfe=int(out.nfe),
            calls=int(out.sequential_calls),
            useful_tokens=loaded.useful_length(tokens),
        )

    with PeakMemory(device) as memory:
        for i in range(warmup):
            run_one(-1, prompts[i % len(prompts)])
        requests = []
        for i, prompt in enumerate(prompts):
            result = run_one(i, prompt)
            requests.append(result)
            if on_request is not None:
                on_request(result)
        measurement = Measurement(requests=requests, batch_size=batch_size, warmup=warmup)
        pool = prompts[: throughput_items or len(prompts)]
        if batch_size == 1:
            busy = sum(r.latency_s for r in requests[: len(pool)] if r.ok and r.latency_s is not None)
            done = sum(r.ok for r in requests[: len(pool)])
            measurement.throughput_items_per_s = done / busy if busy > 0 else None
        else:
            measurement.throughput_items_per_s, measurement.batch_errors = throughput(
                loaded, config, pool, batch_size, device
            )
    measurement.peak_mem_mb = memory.peak_mb
    return measurement


def throughput(
    loaded: Any, config: Any, prompts: list[list[int]], batch_size: int, device: str | torch.device = "cpu"
) -> tuple[float | None, list[str]]:
    """Items per second decoding `prompts` in left-padded batches (`decode_prompts`); failed batches count as
    errors."""
    done, busy, errors = 0, 0.0, []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        t0 = time.perf_counter()
        try:
            decode_prompts(loaded, chunk, config)
            if str(device).startswith("cuda"):
                torch.cuda.synchronize()
        except Exception as e:
            errors += [f"batch item {start + j} (batch {batch_size}): {describe_error(e)}" for j in range(len(chunk))]
            continue
        busy += time.perf_counter() - t0
        done += len(chunk)
    return (done / busy if busy > 0 else None), errors


def measure_endpoint(
    adapter: Any, prompts: list[str], config: Any, on_answer: Callable[[Any], None] | None = None
) -> tuple[list[str | None], dict[str, Any]]:
    """An API model's solo answers to `prompts` (None where a request failed) and the EvalRecord fields they give.

    `adapter` is a `models.adapters.APIAdapter` (base URL, served model name, key); `config` supplies the
    answer length (`gen_length` -> max_tokens) and temperature. Token-level fields (NFE, tokens per forward)
    and memory are not measurable through an API: None, not zero.
    """
    import hashlib

    spec = LoadSpec(
        base_url=adapter.base_url,
        models=(adapter.api_model,),
        concurrency=(1,),
        requests=len(prompts),
        max_tokens=config.gen_length,
        temperature=config.temperature,
        endpoint="chat",
        api_key=adapter.api_key(),
        timeout_s=adapter.timeout_s,
    )

    def heard(kind: str, info: dict[str, Any]) -> None:
        if kind == "answer" and on_answer is not None:
            on_answer(info["answer"])

    cell = run_load(spec, prompts, heard).cells[0]
    answers = sorted(cell.answers, key=lambda a: a.prompt)
    ok = [a for a in answers if a.ok]
    busy = sum(a.latency_s or 0.0 for a in ok)  # an answered request has one
    tokens = sum(a.tokens or 0 for a in ok)
    digest = hashlib.sha256()
    for a in answers:
        digest.update(b"error" if a.text is None else a.text.encode())
        digest.update(b"\n")
    fields = {
        "latency_p50_s": cell.latency(50) or 0.0,
        "latency_p95_s": cell.latency(95) or 0.0,
        "latency_p99_s": cell.latency(99) or 0.0,
        "time_to_first_block_s": cell.ttfb_p50_s if cell.streamed else None,  # a plain answer has no first block
        "throughput_items_per_s": len(ok) / busy if busy > 0 else None,
        "batch_size": 1,
        "tokens_per_s": tokens / busy if busy > 0 else 0.0,
        "tokens_per_s_with_padding": tokens / busy if busy > 0 else 0.0,
        "tokens_per_forward": None,
        "nfe": None,
        "peak_mem_mb": None,
        "errors": cell.errors,
        "error_messages": cell.error_messages(),
        "output_hash": digest.hexdigest(),
        "warmup": 0,
    }
    return [a.text if a.ok else None for a in answers], fields
