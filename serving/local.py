"""This server's own models as an arm: resolve a served name, check and queue a request, answer it whole or streamed.

`LocalServing.answer(arm, attempt)` is what `Dispatch` calls for a local arm (through its `LocalDecoder`
protocol). A request is parsed against the limits in one place (`LocalServing.parse`: prompt size,
vocabulary, prompt tokens, the decoding settings, the prompt-fits rule), queued on its version's
batcher, then answered as a typed body (serving/responses.py) or as a stream of OpenAI chunks that
sends only text no later step may change.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse

from gates.request_limits import RequestLimits
from models.adapters.base import AdapterError
from sampler.config import SamplerConfig
from sampler.decode import fits_context, row_seeded
from sampler.handle import Handle
from sampler.memory import footprint, mib
from sampler.proposal import NonFiniteLogitsError
from serving import errors
from serving.arms import ArmFailure, LocalArm
from serving.attempt import Attempt
from serving.batching import Decoded, Draining, QueueFull
from serving.decoding import Limits, RequestError, batch_key, choice_of, request_config
from serving.limits import check_compute
from serving.outcome import Outcome
from serving.pool import ModelPool, Route
from serving.responses import (AssistantMessage, ChatChoice, ChatCompletionResponse, CompletionChoice,
                               CompletionResponse, Extension, Usage)
from serving.schemas import StreamOptions
from serving.streaming import DONE, Chunks, CommittedText, RowFeed, event

log = logging.getLogger("unmask.serve")


class ServingLimits(Protocol):
    """What local serving reads of the server's settings, per request (a test may change them live)."""

    limits: Limits
    request_timeout_s: float
    compute: RequestLimits  # per-request compute caps (serving policy `limits:`, serving/limits.py)


@dataclass(frozen=True)
class Parsed:
    """A request checked against its route: its prompt ids and the config that decodes it."""

    ids: list[int]
    config: SamplerConfig
    keep: int  # tokens the answer may keep (the canvas is whole blocks)
    peak: int = 0  # bytes its row needs at the decode's peak


@dataclass(frozen=True)
class Submitted:
    """A queued request: what decodes it, how its answer is cut, and where its final tokens arrive."""

    endpoint: str
    route: Route
    prompt: str
    echo: str  # the prompt when the request asked for it back (completions' `echo`), else ''
    ids: list[int]
    config: SamplerConfig
    keep: int  # tokens the answer may keep (the canvas is whole blocks)
    key: str | None  # the batch key; None: decoded alone
    stops: list[str]
    future: asyncio.Future
    feed: RowFeed | None  # streamed requests only
    stream_options: StreamOptions | None = None
    routed: tuple[str, str] | None = None  # (route, arm) when `--routes` routed it
    on_text: Any = None  # streamed: called with the whole answer text once it is complete (a shadow compares it)


@dataclass(frozen=True)
class Finished:
    """A decoded request: its choice (text, finish_reason, completion_tokens), usage, extension, log facts."""

    choice: dict[str, Any]
    usage: Usage
    extension: Extension
    facts: dict[str, Any]


class LocalServing:
    """The local arm of one app: its pool of loaded versions and the server's limits."""

    def __init__(self, pool: ModelPool, settings: ServingLimits):
        self.pool, self.settings = pool, settings

    def resolve(self, name: str) -> Route:
        pool = self.pool
        if not pool.ready:
            raise RequestError(None, f"models are {'not servable: ' + pool.error if pool.error else 'still loading'}",
                               503, "not_ready")
        try:
            return pool.route(name)
        except KeyError:
            raise RequestError("model", f"model {name!r} is not served here; served: "
                               f"{', '.join(pool.served())} (or the registered model one of them points at)",
                               404, "model_not_found") from None

    async def answer(self, arm: LocalArm, attempt: Attempt) -> tuple[Any, dict[str, Any] | None]:
        """(the answer body, or a StreamingResponse; facts for the log) of `attempt` on `arm`'s alias.
        ArmFailure: a failure the route's fallback may answer; RequestError: the request's own fault."""
        route = self.resolve(arm.served)
        outcome, limit = attempt.outcome, attempt.limit_s
        outcome.resolved(route)
        job = replace(self.submit(route, attempt), routed=attempt.routed, on_text=attempt.on_text)
        try:
            if attempt.body.stream:
                return await self.start_stream(attempt.request, job, outcome, limit), None
            decoded = await until(attempt.request, job.future, job.future, limit - outcome.elapsed(), limit)
        except RequestError as e:
            if e.status == 504:
                raise ArmFailure(504, "timeout", f"{arm.name}: {e.message}", "timeout") from None
            raise
        except NonFiniteLogitsError as e:
            raise ArmFailure(500, "decode_failure", f"{arm.name}: {e}", "decode_failure", True,
                             public=f"{arm.name} failed to decode (non-finite logits)") from None
        except Exception as e:
            raise ArmFailure(500, "server_error", f"{type(e).__name__}: {e}", "error",
                             public=f"the server failed on this request ({type(e).__name__}); it keeps serving") from e
        done = finished(job, decoded, ttfb_s=outcome.elapsed())
        if attempt.retry_of:
            done = replace(done, extension=done.extension.model_copy(update={"retry_of": attempt.retry_of}))
        return response_body(job, done).model_dump(), done.facts

    def parse(self, route: Route, endpoint: str, prompt: str, attempt: Attempt) -> Parsed:
        """Check the prompt and settings against the limits and the model; RequestError names the field."""
        field = "prompt" if endpoint == "completions" else "messages"
        limits, handle, body = self.settings.limits, route.loaded.handle, attempt.body
        if len(prompt) > limits.max_prompt_chars:
            raise RequestError(field, f"{field}: {len(prompt)} characters, above this server's limit of "
                               f"{limits.max_prompt_chars}")
        try:
            ids = handle.encode(prompt)
        except AdapterError as e:
            raise RequestError(field, f"{field}: cannot be tokenized: {e}") from None
        if not ids or set(ids) <= {unknown_id(handle)}:
            raise RequestError(field, f"{field}: none of its characters is in {route.version.model}'s vocabulary")
        if len(ids) > limits.max_prompt_tokens:
            raise RequestError(field, f"{field}: {len(ids)} tokens, above this server's limit of "
                               f"{limits.max_prompt_tokens}")
        unmask = body.unmask.overrides() if body.unmask else {}
        config, keep = request_config(route.base, handle.kind, attempt.max_tokens, body.temperature, body.seed,
                                      unmask, limits)
        check_compute(config, len(ids), handle.kind, self.settings.compute)
        context = route.loaded.context
        if not fits_context(context, len(ids), config.gen_length):
            raise RequestError("max_tokens", f"{len(ids)} prompt tokens + {config.gen_length} to decode exceed "
                               f"{route.version.model}'s context of {context}")
        peak = footprint(handle, len(ids), config).per_row
        budget = route.loaded.batcher.memory_budget
        if budget is not None and peak > budget:
            raise RequestError(None, f"decoding {len(ids)} prompt tokens + {config.gen_length} needs {mib(peak)} at its "
                               f"peak, above this server's memory budget of {mib(budget)} (--memory-budget)",
                               503, "insufficient_memory")
        return Parsed(ids, config, keep, peak)

    def submit(self, route: Route, attempt: Attempt) -> Submitted:
        """Parse the request for `route` and queue it on the route's batcher."""
        endpoint, body = attempt.endpoint, attempt.body
        prompt = attempt.prompt_of(route)
        parsed = self.parse(route, endpoint, prompt, attempt)
        key = batch_key(parsed.config, row_seeded(route.loaded.handle), route.loaded.handle.kind)
        feed = RowFeed() if body.stream else None
        try:  # no await since `resolve`, so the route cannot have moved on: Draining is a bug guard, not a path
            future = route.loaded.batcher.submit(parsed.ids, parsed.config, key, on_tokens=feed.put if feed else None,
                                                 peak=parsed.peak)
        except Draining:
            raise RequestError(None, f"{route.version.ref} is being replaced; retry", 503, "draining") from None
        except QueueFull as e:
            raise RequestError(None, f"{route.version.ref} is busy ({e}); retry later", 429, "queue_full") from None
        if feed:
            feed.future = future
        echo = prompt if getattr(body, "echo", False) else ""
        return Submitted(endpoint, route, prompt, echo, parsed.ids, parsed.config, parsed.keep, key, body.stops(),
                         future, feed, body.stream_options)

    async def start_stream(self, request: Request, job: Submitted, outcome: Outcome,
                           limit_s: float) -> StreamingResponse:
        """Wait for the first final tokens (until then every failure is a plain JSON error), then stream."""
        first = await until(request, job.feed.next(), job.future, limit_s - outcome.elapsed(), limit_s)
        if first is None and job.future.exception() is not None:
            raise job.future.exception()  # the model failed before a byte went out: a JSON 500
        return StreamingResponse(self.events(job, outcome, first), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def events(self, job: Submitted, outcome: Outcome, first: list[int] | None):
        """The server-sent events of a stream whose first final tokens are `first`; it records its own outcome."""
        v = job.route.version
        chunks = Chunks(job.endpoint, f"{'chatcmpl' if job.endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
                        int(time.time()), v.model, fingerprint(v))
        text = CommittedText(job.route.loaded.handle, job.keep, job.stops)
        include_usage = bool(job.stream_options and job.stream_options.include_usage)
        try:
            outcome.first_byte()
            yield event(chunks.opening())
            if job.echo:
                yield event(chunks.text(job.echo))
            tokens = first
            while tokens is not None:
                delta = text.add(tokens)
                if delta:
                    yield event(chunks.text(delta))
                left = self.settings.request_timeout_s - outcome.elapsed()
                tokens = await asyncio.wait_for(job.feed.next(), max(left, 0.0))
            done = finished(job, job.future.result(), ttfb_s=outcome.ttfb_s)
            rest = text.finish(done.choice["text"])
            outcome.answered(done.facts)  # complete: a client that leaves during the last sends is not a 499
            if job.on_text:  # the route's shadow copy goes now, to be compared with this text
                job.on_text(job.echo + done.choice["text"])
            if rest:
                yield event(chunks.text(rest))
            yield event(chunks.finish(done.choice["finish_reason"], done.extension.model_dump()))
            if include_usage:
                yield event(chunks.usage(done.usage.model_dump()))
            yield DONE
        except asyncio.TimeoutError:
            message = f"no complete answer within {self.settings.request_timeout_s:g} s"
            log.error("%s stream ended early: %s", job.endpoint, message)
            outcome.failed(504, "timeout", message)
            yield event(errors.error_body(504, message, None, "timeout"))
            yield DONE
        except Exception as e:  # noqa: BLE001 - after the first byte, an error can only be told in the stream
            log.exception("%s stream failed after its first byte", job.endpoint)
            outcome.failed(500, "server_error", f"{type(e).__name__}: {e}")
            yield event(errors.error_body(500, f"the server failed on this request ({type(e).__name__}) after "
                                               "streaming began; it keeps serving", None, "server_error"))
            yield DONE
        finally:
            if not job.future.done():  # hung up or failed mid-stream: free the slot (a lone batch stops)
                job.future.cancel()
            if not outcome.recorded:
                outcome.failed(499, "client_closed", "the client closed the connection mid-stream")


def finished(job: Submitted, decoded: Decoded, ttfb_s: float) -> Finished:
    """The choice, usage, `unmask` extension and log facts of a decoded request."""
    v = job.route.version
    choice = choice_of(job.route.loaded.handle, decoded.generated, job.keep, job.stops)
    usage = Usage(prompt_tokens=len(job.ids), completion_tokens=choice["completion_tokens"],
                  total_tokens=len(job.ids) + choice["completion_tokens"])
    first_block = None if decoded.first_block_s is None else round(decoded.first_block_s, 6)
    facts = {"config_hash": job.config.hash(), "queue_s": decoded.queue_s, "prompt_tokens": len(job.ids),
             "completion_tokens": choice["completion_tokens"], "nfe": decoded.nfe,
             "batch_size": decoded.batch_size, "first_block_s": decoded.first_block_s}
    extension = Extension(
        alias=job.route.name, model=v.model, version=v.version, weights_sha256=v.weights_sha256,
        config_hash=job.config.hash(), config_source=job.route.base_source, batched=job.key is not None,
        batch_size=decoded.batch_size, nfe=decoded.nfe, queue_s=round(decoded.queue_s, 6),
        decode_s=round(decoded.decode_s, 6), ttfb_s=round(ttfb_s, 6), first_block_s=first_block,
        stream=job.feed is not None, route=job.routed[0] if job.routed else None,
        arm=job.routed[1] if job.routed else None)
    return Finished(choice, usage, extension, facts)


def response_body(job: Submitted, done: Finished) -> CompletionResponse | ChatCompletionResponse:
    """The non-streamed answer of a finished request, in the shape of its endpoint."""
    v, choice = job.route.version, done.choice
    common = {"created": int(time.time()), "model": v.model, "system_fingerprint": fingerprint(v),
              "usage": done.usage, "unmask": done.extension}
    if job.endpoint == "completions":
        return CompletionResponse(id=f"cmpl-{uuid.uuid4().hex}", **common, choices=[
            CompletionChoice(text=job.echo + choice["text"], finish_reason=choice["finish_reason"])])
    return ChatCompletionResponse(id=f"chatcmpl-{uuid.uuid4().hex}", **common, choices=[
        ChatChoice(message=AssistantMessage(content=choice["text"]), finish_reason=choice["finish_reason"])])


async def until(request: Request | None, awaitable, future: asyncio.Future, timeout_s: float, limit_s: float):
    """`awaitable`'s result; a client that hangs up, or `timeout_s` (what is left of the request's `limit_s`)
    passing, cancels the request (`future`) and frees its slot. A shadow copy has no client (`request` None)."""
    async def hung_up() -> None:
        if request is None:
            await asyncio.Event().wait()  # nobody to hang up
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waited = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(hung_up())
    try:
        done, _ = await asyncio.wait({waited, watcher}, timeout=max(timeout_s, 0.0),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if waited in done:
        return waited.result()
    waited.cancel()
    future.cancel()  # still queued: the batcher skips it; already decoding: its row is dropped (a lone batch stops)
    if watcher in done:
        raise RequestError(None, "the client closed the connection before the answer", 499, "client_closed")
    raise RequestError(None, f"no answer within {limit_s:g} s", 504, "timeout")


def fingerprint(v) -> str:
    return f"{v.model}/{v.version}@{v.weights_sha256[:12]}"


def unknown_id(handle: Handle) -> int | None:
    """The tokenizer's unknown-token id (a prompt made only of it says nothing), when it has one."""
    tokenizer = getattr(handle, "tokenizer", None)
    token = getattr(getattr(tokenizer, "model", None), "unk_token", None)
    return tokenizer.token_to_id(token) if token else None
