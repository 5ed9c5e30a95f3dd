"""This server's own models as an arm: resolve a served name, check and queue a request, answer it whole or streamed.

`LocalServing.answer(arm, attempt)` is what `Dispatch` calls for a local arm (through its `LocalDecoder`
protocol). A request is parsed against the limits in one place (`LocalServing.parse`: prompt size,
vocabulary, prompt tokens, the decoding settings, the prompt-fits rule), queued on its version's
batcher, then answered as a typed body (serving/responses.py) or as a stream of OpenAI chunks that
sends only text no later step may change.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from gates.request_limits import RequestLimits
from models.adapters.base import AdapterError
from registry.serving import ServedVersion
from sampler.config import SamplerConfig
from sampler.decode import fits_context, is_deterministic, row_seeded
from sampler.handle import Handle
from sampler.memory import footprint, mib
from sampler.prompt_scoring import PromptScores, ScoringSettings, score_prompts
from sampler.proposal import NonFiniteLogitsError
from serving import errors
from serving.arms import ArmFailure, LocalArm
from serving.attempt import Attempt
from serving.batching import Decoded, Draining, QueueFull
from serving.chat import ChatTemplateError
from serving.decoding import Limits, RequestError, batch_key, choice_of, request_config
from serving.limits import check_compute
from serving.logprobs import (
    Asked,
    asked_logprobs,
    chat_logprobs,
    check_asked,
    check_scoring,
    completion_logprobs,
    kept_tokens,
    likelihood_settings,
    prompt_extension,
    unread_likelihood,
)
from serving.outcome import Outcome
from serving.pool import ModelPool, Route
from serving.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionResponse,
    Extension,
    Usage,
)
from serving.streaming import DONE, Arrival, Chunks, CommittedText, RowFeed, StreamedScores, event
from serving.surface import Served, check_surface

SEED_SPACE = 2**63  # OpenAI's seed is a signed 64-bit integer; drawn seeds stay non-negative
T = TypeVar("T")

log = logging.getLogger("unmask.serve")


class ServingLimits(Protocol):
    """What local serving reads of the server's settings, per request (a test may change them live)."""

    limits: Limits
    request_timeout_s: float
    compute: RequestLimits  # per-request compute caps (serving policy `limits:`, serving/limits.py)
    likelihood_samples: int  # Monte Carlo samples when a masked-diffusion model scores a prompt (echo + logprobs)


@dataclass(frozen=True)
class Parsed:
    """A request checked against its route: its prompt ids and the config that decodes it."""

    ids: list[int]
    config: SamplerConfig
    keep: int  # tokens the answer may keep (the canvas is whole blocks)
    ignored: list[str]  # request settings this model does not read (an AR model: the diffusion ones)
    peak: int = 0  # bytes its row needs at the decode's peak


@dataclass(frozen=True)
class Row:
    """One choice of a request: its prompt, the config (with its own seed) that decodes it, where it arrives."""

    prompt: int  # which of the request's prompts
    ids: list[int]
    echo: str  # the prompt when the request asked for it back (completions' `echo`), else ''
    config: SamplerConfig
    key: str | None  # the batch key; None: decoded alone
    future: asyncio.Future[Decoded]
    feed: RowFeed | None  # streamed requests only

    @property
    def stream_feed(self) -> RowFeed:
        """The feed of a streamed request's row."""
        assert self.feed is not None, "only a streamed request's rows are read as streams, and each has its feed"
        return self.feed


@dataclass(frozen=True)
class Submitted:
    """A queued request: its rows (prompts x n), how its answers are cut, and what its answer reports."""

    endpoint: str
    route: Route
    rows: list[Row]
    keep: int  # tokens the answer may keep (the canvas is whole blocks)
    stops: list[str]
    include_usage: bool = False
    routed: tuple[str, str] | None = None  # (route, arm) when `--routes` routed it, or `--route` names them
    # streamed: called with the whole answer text once it is complete (a shadow compares it)
    on_text: Callable[[str], None] | None = None
    retry_of: str | None = None  # the arm that failed, when this answers for it
    dropped: list[dict[str, Any]] | None = None  # chat: messages the template left out
    ask: Asked = Asked(None, False)  # log-probabilities asked for (serving/logprobs.py)
    likelihood: ScoringSettings | None = None  # how a masked-diffusion prompt is estimated, when it is scored
    scores: dict[int, PromptScores] | None = None  # per prompt, its scored tokens (echo with logprobs)
    ignored: list[str] | None = None  # settings the model does not read

    @property
    def row(self) -> Row:
        """The one row of a streamed request."""
        return self.rows[0]

    @property
    def future(self) -> asyncio.Future[Decoded] | asyncio.Future[list[Decoded]]:
        """Done when every row is: a request's one future, as a waiter or a canceller sees it."""
        return self.rows[0].future if len(self.rows) == 1 else _gathered(self.rows)

    def cancel(self) -> None:
        for r in self.rows:
            if not r.future.done():
                r.future.cancel()


def _gathered(rows: list[Row]) -> asyncio.Future[list[Decoded]]:
    return asyncio.gather(*(r.future for r in rows))


@dataclass(frozen=True)
class Finished:
    """A decoded request: its choices (text, finish_reason, completion_tokens), usage, extension, log facts."""

    choices: list[dict[str, Any]]
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
            raise RequestError(
                None, f"models are {'not servable: ' + pool.error if pool.error else 'still loading'}", 503, "not_ready"
            )
        try:
            return pool.route(name)
        except KeyError:
            raise RequestError(
                "model",
                f"model {name!r} is not served here; served: "
                f"{', '.join(pool.served())} (or the registered model one of them points at)",
                404,
                "model_not_found",
            ) from None

    async def answer(self, arm: LocalArm, attempt: Attempt) -> tuple[Any, dict[str, Any] | None]:
        """(the answer body, or a StreamingResponse; facts for the log) of `attempt` on `arm`'s alias.
        ArmFailure: a failure the route's fallback may answer; RequestError: the request's own fault."""
        route = self.resolve(arm.served)
        outcome, limit = attempt.outcome, attempt.limit_s
        assert outcome is not None, "Dispatch gives each attempt its outcome"
        outcome.resolved(route)
        job = replace(
            self.submit(route, attempt), routed=attempt.routed, on_text=attempt.on_text, retry_of=attempt.retry_of
        )
        try:
            if attempt.body.stream:
                return await self.start_stream(attempt.request, job, outcome, limit), None
            decoded: Decoded | list[Decoded] = await until(
                attempt.request, job.future, job, limit - outcome.elapsed(), limit
            )
            decoded = decoded if isinstance(decoded, list) else [decoded]
            if job.ask.echo:
                job = replace(
                    job, scores=await until(attempt.request, self.score(job), job, limit - outcome.elapsed(), limit)
                )
        except RequestError as e:
            if e.status == 504:
                raise ArmFailure(504, "timeout", f"{arm.name}: {e.message}", "timeout") from None
            raise
        except NonFiniteLogitsError as e:
            raise ArmFailure(
                500,
                "decode_failure",
                f"{arm.name}: {e}",
                "decode_failure",
                True,
                public=f"{arm.name} failed to decode (non-finite logits)",
            ) from None
        except Exception as e:
            raise ArmFailure(
                500,
                "server_error",
                f"{type(e).__name__}: {e}",
                "error",
                public=f"the server failed on this request ({type(e).__name__}); it keeps serving",
            ) from e
        done = finished(job, decoded, ttfb_s=outcome.elapsed())
        return response_body(job, done).model_dump(), done.facts

    async def score(self, job: Submitted) -> dict[int, PromptScores]:
        """Each prompt's tokens scored (echo with logprobs), in the version's decode thread."""
        handle, batcher = job.route.loaded.handle, job.route.loaded.batcher
        assert job.likelihood is not None, "scored only when echo asks, which sets the likelihood settings"
        prompts = {r.prompt: r.ids for r in job.rows}  # each prompt once, all in one call: they share forwards
        scored = await batcher.run(
            score_prompts, handle, list(prompts.values()), max(job.ask.top or 0, 1), job.likelihood
        )
        return dict(zip(prompts, scored))

    def parse(self, route: Route, endpoint: str, prompt: str | list[int], attempt: Attempt) -> Parsed:
        """Check one prompt (text, or token ids) and the request's settings against the limits and the model;
        RequestError names the field."""
        field = "prompt" if endpoint == "completions" else "messages"
        limits, handle, body = self.settings.limits, route.loaded.handle, attempt.body
        ids = self.prompt_ids(route, field, prompt)
        if len(ids) > limits.max_prompt_tokens:
            raise RequestError(
                field, f"{field}: {len(ids)} tokens, above this server's limit of {limits.max_prompt_tokens}"
            )
        unmask = body.unmask.overrides() if body.unmask else {}
        # an autoregressive model reads none of the diffusion settings; the answer names them (`unmask.ignored`),
        # not a 400, so a request a diffusion arm would take is still answered by an AR fallback
        ignored = sorted(f"unmask.{k}" for k in unmask) if handle.kind == "autoregressive" else []
        context = route.loaded.context
        # without --max-tokens the bound is the model's context (not a fixed 256); the prompt's share of it is
        # checked below, after the compute caps, which name the setting that made a request too costly
        if limits.max_tokens is None and context is not None and (attempt.max_tokens or 0) > context:
            raise RequestError(
                "max_tokens", f"max_tokens={attempt.max_tokens} is above {route.version.model}'s context of {context}"
            )
        config, keep = request_config(
            route.base,
            handle.kind,
            attempt.max_tokens,
            body.temperature,
            body.seed,
            unmask,
            replace(limits, max_tokens=bounded(limits.max_tokens, context)),
        )
        check_surface(body, endpoint, Served(config, handle.kind, route.loaded.chat.reads_tools))
        check_compute(config, len(ids), handle.kind, self.settings.compute)
        if not fits_context(context, len(ids), config.gen_length):
            raise RequestError(
                "max_tokens",
                f"max_tokens={keep}: {len(ids)} prompt tokens + {config.gen_length} to "
                f"decode exceed {route.version.model}'s context of {context}",
            )
        peak = footprint(handle, len(ids), config).per_row
        budget = route.loaded.batcher.memory_budget
        if budget is not None and peak > budget:
            raise RequestError(
                None,
                f"decoding {len(ids)} prompt tokens + {config.gen_length} needs {mib(peak)} at its "
                f"peak, above this server's memory budget of {mib(budget)} (--memory-budget)",
                503,
                "insufficient_memory",
            )
        return Parsed(ids, config, keep, ignored, peak)

    def prompt_ids(self, route: Route, field: str, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids: a text tokenized, or ids checked against the vocabulary."""
        limits, handle = self.settings.limits, route.loaded.handle
        if isinstance(prompt, list):
            vocab = vocabulary_size(handle)
            bad = [t for t in prompt if (vocab is not None and t >= vocab) or t == handle.mask_id]
            if bad:
                why = "the mask token" if bad[0] == handle.mask_id else f"outside the vocabulary of {vocab}"
                raise RequestError(field, f"{field}: token id {bad[0]} is {why} of {route.version.model}")
            return list(prompt)
        if len(prompt) > limits.max_prompt_chars:
            raise RequestError(
                field, f"{field}: {len(prompt)} characters, above this server's limit of {limits.max_prompt_chars}"
            )
        try:
            ids = handle.encode(prompt)
        except AdapterError as e:
            raise RequestError(field, f"{field}: cannot be tokenized: {e}") from None
        if not ids or set(ids) <= {unknown_id(handle)}:
            raise RequestError(field, f"{field}: none of its characters is in {route.version.model}'s vocabulary")
        return ids

    def submit(self, route: Route, attempt: Attempt) -> Submitted:
        """Parse the request for `route` and queue its rows (each prompt, `n` times) on the route's batcher."""
        endpoint, body = attempt.endpoint, attempt.body
        try:
            asked = attempt.prompt_of(route)
        except ChatTemplateError as e:
            raise RequestError("messages", str(e)) from None
        ask, handle = asked_logprobs(endpoint, body), route.loaded.handle
        check_asked(ask, body, endpoint, handle)
        scoring_only = attempt.max_tokens == 0  # completions scoring an echoed prompt: nothing to decode
        if scoring_only and not ask.echo:
            raise RequestError(
                "max_tokens", "max_tokens=0 decodes nothing: it needs echo and logprobs (scoring the prompt)"
            )
        checked = replace(attempt, max_tokens=1) if scoring_only else attempt
        parsed = [self.parse(route, endpoint, p, checked) for p in asked.prompts]
        n = body.choices_per_prompt()
        likelihood = likelihood_settings(body, self.settings.likelihood_samples) if ask.echo else None
        if likelihood:  # before anything is queued
            for p in parsed:
                check_scoring(len(p.ids), likelihood, handle.kind, self.settings.compute.max_token_forwards)
        planned = [
            (i, p, config) for i, p in enumerate(parsed) for config in seeded(p.config, body.seed, n, handle.kind)
        ]
        batcher, client = route.loaded.batcher, client_of(attempt)
        room = batcher.most_one_client_holds
        if len(planned) > room:  # could never be queued whole: the request's fault, not a retry-later 429
            raise RequestError(
                "n",
                f"{len(asked.prompts)} prompt(s) x n={n} are {len(planned)} choices, above the "
                f"{room} requests one client may have queued per model on this server",
            )
        rows: list[Row] = []
        try:  # no await since `resolve`, so the route cannot have moved on: Draining is a bug guard, not a path
            if not scoring_only:
                batcher.admit(client, len(planned))  # each choice is a row; a heavy client waits, not the rest
            for i, p, config in planned:
                key = batch_key(config, row_seeded(handle), handle.kind)
                feed = RowFeed() if body.stream else None
                if scoring_only:
                    future = asyncio.get_running_loop().create_future()
                    future.set_result(Decoded([], 0, 0, 0.0, 0.0, None, [] if ask.top is not None else None))
                else:
                    future = batcher.submit(
                        p.ids,
                        config,
                        key,
                        on_tokens=feed.put if feed else None,
                        peak=p.peak,
                        logprobs=ask.top,
                        client=client,
                    )
                if feed:
                    feed.future = future
                echo = asked.prompts[i] if getattr(body, "echo", False) else ""
                rows.append(
                    Row(i, p.ids, echo if isinstance(echo, str) else handle.decode(echo), config, key, future, feed)
                )
        except (Draining, QueueFull) as e:
            for r in rows:  # a request is queued whole or not at all
                r.future.cancel()
            if isinstance(e, Draining):
                raise RequestError(None, f"{route.version.ref} is being replaced; retry", 503, "draining") from None
            raise RequestError(None, f"{route.version.ref} is busy ({e}); retry later", 429, "queue_full") from None
        return Submitted(
            endpoint,
            route,
            rows,
            0 if scoring_only else parsed[0].keep,
            body.stops(),
            body.include_usage(),
            dropped=asked.dropped or None,
            ask=ask,
            likelihood=likelihood,
            ignored=(parsed[0].ignored + unread_likelihood(body, handle)) or None,
        )

    async def start_stream(
        self, request: Request | None, job: Submitted, outcome: Outcome, limit_s: float
    ) -> StreamingResponse:
        """Wait for the first final tokens (until then every failure is a plain JSON error), then stream."""
        row = job.row
        first = await until(request, row.stream_feed.next(), job, limit_s - outcome.elapsed(), limit_s)
        if first is None:
            error = row.future.exception()
            if error is not None:
                raise error  # the model failed before a byte went out: a JSON 500
        return StreamingResponse(
            self.events(job, outcome, first),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def events(self, job: Submitted, outcome: Outcome, first: Arrival | None) -> AsyncIterator[bytes]:
        """The server-sent events of a stream whose first final tokens are `first`; it records its own outcome."""
        v = job.route.version
        chunks = Chunks(
            job.endpoint,
            f"{'chatcmpl' if job.endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
            int(time.time()),
            v.model,
            fingerprint(v),
        )
        handle = job.route.loaded.handle
        texts = [CommittedText(handle, job.keep, job.stops) for _ in job.rows]
        asked, top = job.ask.top is not None, job.ask.top or 0
        scores = [StreamedScores(handle, job.keep, job.endpoint == "chat", top) for _ in job.rows]
        try:
            ttfb_s = outcome.first_byte()
            for i, row in enumerate(job.rows):
                yield event(chunks.opening(i))
                if row.echo:
                    yield event(chunks.text(row.echo, i))
            left = lambda: max(self.settings.request_timeout_s - outcome.elapsed(), 0.0)  # noqa: E731
            async for i, (tokens, scored) in arrivals(job.rows, first, left):
                delta = texts[i].add(tokens)
                if asked:
                    scores[i].add(tokens, scored)
                if delta:  # with the scores of the tokens this text completes, when asked
                    yield event(chunks.text(delta, i, scores[i].covered(texts[i].sent) if asked else None))
            done = finished(job, [r.future.result() for r in job.rows], ttfb_s=ttfb_s)
            rests = [text.finish(choice["text"]) for text, choice in zip(texts, done.choices)]
            outcome.answered(done.facts)  # complete: a client that leaves during the last sends is not a 499
            if job.on_text:  # the route's shadow copy goes now, to be compared with this text
                job.on_text(job.row.echo + done.choices[0]["text"])
            for i, (rest, choice) in enumerate(zip(rests, done.choices)):
                left_scores = scores[i].rest(choice.get("logprobs"))  # the stop id's, a cut tail's: the rest
                if rest:
                    yield event(chunks.text(rest, i, left_scores))
                    left_scores = None
                last = i == len(done.choices) - 1  # the `unmask` object rides on the last finish chunk
                extension = done.extension.model_dump() if last else None
                yield event(chunks.finish(choice["finish_reason"], extension, i, left_scores))
            if job.include_usage:
                yield event(chunks.usage(done.usage.model_dump()))
            yield DONE
        except TimeoutError:
            message = f"no complete answer within {self.settings.request_timeout_s:g} s"
            log.error("%s stream ended early: %s", job.endpoint, message)
            outcome.failed(504, "timeout", message)
            yield event(errors.error_body(504, message, None, "timeout"))
            yield DONE
        except Exception as e:
            log.exception("%s stream failed after its first byte", job.endpoint)
            outcome.failed(500, "server_error", f"{type(e).__name__}: {e}")
            yield event(
                errors.error_body(
                    500,
                    f"the server failed on this request ({type(e).__name__}) after streaming began; it keeps serving",
                    None,
                    "server_error",
                )
            )
            yield DONE
        finally:
            job.cancel()  # hung up or failed mid-stream: free the slot (a lone batch stops)
            if not outcome.recorded:
                outcome.failed(499, "client_closed", "the client closed the connection mid-stream")


async def arrivals(
    rows: list[Row], first: Arrival | None, left: Callable[[], float]
) -> AsyncIterator[tuple[int, Arrival]]:
    """(row index, (final tokens, their scores)) as any streamed row's arrive, row 0's `first` first; ends when
    every row's decode is over. asyncio.TimeoutError when `left()` seconds pass with nothing new."""
    if first is not None:
        yield 0, first
    waiting = {i: asyncio.ensure_future(r.stream_feed.next()) for i, r in enumerate(rows) if i or first is not None}
    try:
        while waiting:
            done, _ = await asyncio.wait(waiting.values(), timeout=left(), return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise TimeoutError
            for i, task in sorted(waiting.items()):
                if task not in done:
                    continue
                tokens = task.result()
                if tokens is None:
                    del waiting[i]
                    continue
                waiting[i] = asyncio.ensure_future(rows[i].stream_feed.next())
                yield i, tokens
    finally:
        for task in waiting.values():
            task.cancel()


def client_of(attempt: Attempt) -> str:
    """Who a request is, for fair admission: its API key (hashed), else the body's `user`, else its address."""
    request = attempt.request
    if request is None:
        return "shadow"  # a shadow copy is the server's own
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    user = getattr(attempt.body, "user", None)
    if user:
        return f"user:{user}"
    return "address:" + (request.client.host if request.client else "")


def finished(job: Submitted, decoded: list[Decoded], ttfb_s: float) -> Finished:
    """The choices, usage, `unmask` extension and log facts of a decoded request (one `Decoded` per row)."""
    v, handle = job.route.version, job.route.loaded.handle
    choices = [choice_of(handle, d.generated, job.keep, job.stops) for d in decoded]
    if job.ask.top is not None:
        for row, d, c in zip(job.rows, decoded, choices):
            n = kept_tokens(handle, d.generated, job.keep, c["text"]) if d.generated else 0
            c["logprobs"] = (
                chat_logprobs(handle, d.generated, d.logprobs or [], n, job.ask.top)
                if job.endpoint == "chat"
                else completion_logprobs(
                    handle, d.generated, d.logprobs or [], n, job.ask.top, (job.scores or {}).get(row.prompt)
                )
            )
    prompt_tokens = sum({r.prompt: len(r.ids) for r in job.rows}.values())  # each prompt once, however many choices
    completion_tokens = sum(c["completion_tokens"] for c in choices)
    usage = Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )
    blocks = [d.first_block_s for d in decoded if d.first_block_s is not None]
    first_block = round(min(blocks), 6) if blocks else None
    config = job.row.config
    nfe, batch_size = sum(d.nfe for d in decoded), max(d.batch_size for d in decoded)
    queue_s, decode_s = max(d.queue_s for d in decoded), max(d.decode_s for d in decoded)
    seeds = [None if is_deterministic(r.config, handle.kind) else r.config.seed for r in job.rows]
    facts = {
        "config_hash": config.hash(),
        "queue_s": queue_s,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "nfe": nfe,
        "batch_size": batch_size,
        "first_block_s": min(blocks) if blocks else None,
    }
    extension = Extension(
        alias=job.route.name,
        model=v.model,
        version=v.version,
        weights_sha256=v.weights_sha256,
        config_hash=config.hash(),
        config_source=job.route.base_source,
        batched=job.row.key is not None,
        batch_size=batch_size,
        nfe=nfe,
        queue_s=round(queue_s, 6),
        decode_s=round(decode_s, 6),
        ttfb_s=round(ttfb_s, 6),
        first_block_s=first_block,
        stream=job.row.feed is not None,
        route=job.routed[0] if job.routed else None,
        arm=job.routed[1] if job.routed else None,
        retry_of=job.retry_of,
        seed=seeds[0],
        seeds=seeds,
        chat_dropped=job.dropped,
        ignored=job.ignored,
        likelihood=[prompt_extension(job.scores[r.prompt]) for r in job.rows] if job.scores else None,
    )
    return Finished(choices, usage, extension, facts)


def response_body(job: Submitted, done: Finished) -> CompletionResponse | ChatCompletionResponse:
    """The non-streamed answer of a finished request, in the shape of its endpoint; choice i is row i."""
    v = job.route.version
    common: dict[str, Any] = {
        "created": int(time.time()),
        "model": v.model,
        "system_fingerprint": fingerprint(v),
        "usage": done.usage,
        "unmask": done.extension,
    }
    if job.endpoint == "completions":
        return CompletionResponse(
            id=f"cmpl-{uuid.uuid4().hex}",
            **common,
            choices=[
                CompletionChoice(
                    index=i, text=row.echo + c["text"], finish_reason=c["finish_reason"], logprobs=c.get("logprobs")
                )
                for i, (row, c) in enumerate(zip(job.rows, done.choices))
            ],
        )
    return ChatCompletionResponse(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        **common,
        choices=[
            ChatChoice(
                index=i,
                message=AssistantMessage(content=c["text"]),
                finish_reason=c["finish_reason"],
                logprobs=c.get("logprobs"),
            )
            for i, c in enumerate(done.choices)
        ],
    )


def seeded(config: SamplerConfig, seed: int | None, n: int, kind: str = "masked-diffusion") -> list[SamplerConfig]:
    """The config of each of a prompt's `n` choices. Sampled decoding gives choice k the seed `seed + k`, or,
    without a seed, one drawn from the OS, so unseeded answers differ and each can be reproduced from the seed
    its answer reports; a greedy decode reads no seed and all choices are one config. Whether a decode samples
    depends on the model's `kind` (block diffusion always draws: `is_deterministic`)."""
    if is_deterministic(config, kind):
        return [config] * n
    first = seed if seed is not None else None
    return [
        config.with_(seed=(first + k) % SEED_SPACE if first is not None else secrets.randbelow(SEED_SPACE))
        for k in range(n)
    ]


def bounded(limit: int | None, context: int | None) -> int:
    """The largest max_tokens (and canvas) a request may ask for: the server's --max-tokens if set, else the
    model's context (a model that names no context: 4096); the prompt must fit beside it too (`fits_context`)."""
    return limit if limit is not None else (context or 4096)


async def until(
    request: Request | None, awaitable: Awaitable[T], job: Submitted, timeout_s: float, limit_s: float
) -> T:
    """`awaitable`'s result; a client that hangs up, or `timeout_s` (what is left of the request's `limit_s`)
    passing, cancels the request's rows (`job`) and frees their slots. A shadow copy has no client (`request` None)."""

    async def hung_up() -> None:
        if request is None:
            await asyncio.Event().wait()  # nobody to hang up
            return
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waited = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(hung_up())
    try:
        done, _ = await asyncio.wait(
            {waited, watcher}, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        watcher.cancel()
    if waited in done:
        return waited.result()
    waited.cancel()
    job.cancel()  # still queued: the batcher skips it; already decoding: its row is dropped (a lone batch stops)
    if watcher in done:
        raise RequestError(None, "the client closed the connection before the answer", 499, "client_closed")
    raise RequestError(None, f"no answer within {limit_s:g} s", 504, "timeout")


def fingerprint(v: ServedVersion) -> str:
    return f"{v.model}/{v.version}@{v.weights_sha256[:12]}"


def vocabulary_size(handle: Handle) -> int | None:
    """How many token ids the tokenizer knows (a prompt of ids must stay below it), when it says."""
    tokenizer = getattr(handle, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "get_vocab_size"):
        size: int = tokenizer.get_vocab_size(with_added_tokens=True)
        return size
    return getattr(getattr(getattr(handle, "model", None), "config", None), "vocab_size", None)


def unknown_id(handle: Handle) -> int | None:
    """The tokenizer's unknown-token id (a prompt made only of it says nothing), when it has one."""
    tokenizer = getattr(handle, "tokenizer", None)
    token = getattr(getattr(tokenizer, "model", None), "unk_token", None)
    return tokenizer.token_to_id(token) if token and tokenizer is not None else None  # a token comes from one
