"""The OpenAI-compatible app: completions, chat completions, models, health and metrics.

`create_app(settings)` gives a FastAPI app; uvicorn runs it (`unmask serve`, or a test on a free
port). Models load in the background once the app starts, so `/health` answers 503 until every
served name is loaded, weights-checked and warmed, then 200.

A routed request (`--routes`) goes to the arm its route picks, unless that arm is unhealthy; an arm
that fails (raises, times out, NaN logits, an upstream's connection error or 5xx) is answered by the
route's fallback arm instead (before the first byte of a stream only), and the route's shadow arm
gets a copy in the background. `GET /v1/unmask/routes` shows the routes in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from models.adapters.base import AdapterError
from sampler.config import SamplerConfig
from sampler.decode import row_seeded
from sampler.proposal import NonFiniteLogitsError
from serving import errors
from serving.analysis_api import router as analysis_router
from serving.arms import ArmFailure, LocalArm
from serving.batching import Draining, QueueFull
from serving.decoding import Limits, RequestError, batch_key, choice_of, request_config
from serving.metrics import ServingMetrics
from serving.outcome import Outcome
from serving.pool import ModelPool, PoolSettings, Route
from serving.request_log import RequestLog, row
from serving.dispatch import Dispatch
from serving.routing import RouteTable
from serving.schemas import ChatCompletionRequest, CompletionRequest, Sampling, StreamOptions
from serving.streaming import DONE, Chunks, CommittedText, RowFeed, event

log = logging.getLogger("unmask.serve")

ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # metric label per path
STREAMING = ("stream=true sends server-sent events in OpenAI's chunk format; masked diffusion sends each block's "
             "text once the block is final (never text a later step may change), autoregressive models each token")
BATCHED = "deterministic decoding (temperature 0, confidence-ordered remasking), grouped by effective config"
SAMPLED_BATCHED = ("sampled decoding (temperature > 0, or random remasking) is batched with one random generator per "
                   "row, seeded by its request's seed, so each row draws what it would draw alone")
NOT_BATCHED = ("sampled decoding by a decoder with one generator for the whole batch (transformers' generate), or "
               "without a seed, is decoded alone: a row's draws would depend on its neighbours")


@dataclass
class ServeSettings:
    pool: PoolSettings
    limits: Limits = field(default_factory=Limits)
    request_timeout_s: float = 120.0
    max_body_bytes: int = 1_000_000
    request_log_dir: Path | None = None  # None: no request log
    follow_aliases: bool = True
    routes_path: Path | None = None  # a serving policy (gates/serving.yaml); None: `model` names the alias
    weights_path: Path | None = None  # the live weights overlay; None: <state folder>/rollouts/weights.json
    max_shadows: int = 4  # shadow copies in flight at once; more are dropped (and counted)


def create_app(settings: ServeSettings) -> FastAPI:
    metrics = ServingMetrics()
    pool = ModelPool(settings.pool, metrics)
    routes = RouteTable(settings.routes_path, settings.pool.names, metrics,
                        settings.weights_path or default_weights_path()) if settings.routes_path else None
    requests_log = (RequestLog(settings.request_log_dir, on_drop=metrics.log_dropped.inc)
                    if settings.request_log_dir else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(start_and_follow())]
        if routes:
            tasks.append(asyncio.create_task(routes.follow(settings.pool.poll_interval_s)))
        await dispatch.start()
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await dispatch.close()
        await pool.close()
        if requests_log:
            await asyncio.to_thread(requests_log.close)

    async def start_and_follow() -> None:
        await pool.start()
        if pool.ready and settings.follow_aliases:
            await pool.follow()

    app = FastAPI(title="unmask serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.pool, app.state.metrics, app.state.request_log = pool, metrics, requests_log
    app.state.routes = routes
    app.include_router(analysis_router)  # GET /v1/unmask/analysis, POST .../flagger (serving/analysis_api.py)

    def count_refusal(path: str, status: int, code: str, message: str) -> None:
        endpoint = ENDPOINTS.get(path, "other")
        metrics.errors.labels("unknown", endpoint, str(status), code).inc()
        if requests_log and endpoint != "other":  # a refused request is a request too; stray paths are not
            requests_log.append(row(endpoint=endpoint, alias="unknown", status=status, error=message[:500]))

    errors.install(app, count_refusal)
    app.add_middleware(errors.BodyLimit, max_bytes=settings.max_body_bytes, count=count_refusal)

    @app.get("/health")
    async def health() -> JSONResponse:
        if pool.ready:
            body = {"status": "ready", "served": {n: r.version.ref for n, r in pool.routes.items()}}
            if routes:
                body["routes"] = {"file": str(routes.path), "sha256": routes.policy.sha256,
                                  "last_error": routes.last_error, "weights_file": str(routes.weights_path),
                                  "weights_error": routes.weights_error}
                body["arms"] = {name: dispatch.health.report(name) for name in dispatch.arm_names()}
            return JSONResponse(body)
        status = "failed" if pool.error else "loading"
        return JSONResponse({"status": status, "error": pool.error}, status_code=503)

    @app.get("/v1/unmask/routes")
    async def routes_in_force() -> JSONResponse:
        """The routes in force with their live weights, arms and arm health."""
        if not routes:
            raise RequestError(None, "this server routes nothing (start it with --routes)", 404, "no_routes")
        return JSONResponse(dispatch.view())

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(route, settings) for route in pool.routes.values()]}

    @app.get("/v1/models/{name}")
    async def one_model(name: str) -> dict[str, Any]:
        route = resolve(name)
        return model_card(route, settings) | ({"id": name} if name != route.name else {})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await dispatch.answer(request, "completions", body, lambda route: body.prompt, body.max_tokens)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return await dispatch.answer(request, "chat", body, lambda route: route.loaded.chat.render(messages),
                            body.requested_tokens())

    async def decode_locally(arm: LocalArm, request: Request | None, endpoint: str, body: Sampling, prompt_of,
                             max_tokens: int | None, outcome: Outcome, limit: float, stamp: dict[str, Any],
                             on_text=None):
        route = resolve(arm.served)
        outcome.resolved(route)
        routed = (stamp["route"], stamp["arm"]) if stamp else None
        job = replace(submit(route, body, prompt_of(route), max_tokens, endpoint), routed=routed, on_text=on_text)
        try:
            if body.stream:
                return await start_stream(request, job, outcome, limit), None
            decoded = await until(request, job.future, job.future, limit - outcome.elapsed(), limit)
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
        response, facts, _ = finished(job, decoded, ttfb_s=outcome.elapsed())
        if stamp.get("retry_of"):
            response["unmask"]["retry_of"] = stamp["retry_of"]
        return response, facts

    dispatch = Dispatch(lambda: settings.request_timeout_s, settings.max_shadows, metrics, requests_log, routes,
                        decode_locally)
    app.state.dispatch = dispatch

    def resolve(name: str) -> Route:
        if not pool.ready:
            raise RequestError(None, f"models are {'not servable: ' + pool.error if pool.error else 'still loading'}",
                               503, "not_ready")
        try:
            return pool.route(name)
        except KeyError:
            raise RequestError("model", f"model {name!r} is not served here; served: "
                               f"{', '.join(pool.served())} (or the registered model one of them points at)",
                               404, "model_not_found") from None

    def submit(route: Route, body: Sampling, prompt: str, max_tokens: int | None, endpoint: str) -> Submitted:
        """Check the prompt and settings against the limits and queue the request; RequestError names the field."""
        field = "prompt" if endpoint == "completions" else "messages"
        limits, handle = settings.limits, route.loaded.handle
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
        config, keep = request_config(route.base, handle.kind, max_tokens, body.temperature, body.seed, unmask, limits)
        context = route.loaded.context
        if context and len(ids) + config.gen_length > context:
            raise RequestError("max_tokens", f"{len(ids)} prompt tokens + {config.gen_length} to decode exceed "
                               f"{route.version.model}'s context of {context}")
        key = batch_key(config, row_seeded(handle))
        feed = RowFeed() if body.stream else None
        try:  # no await since `resolve`, so the route cannot have moved on: Draining is a bug guard, not a path
            future = route.loaded.batcher.submit(ids, config, key, on_tokens=feed.put if feed else None)
        except Draining:
            raise RequestError(None, f"{route.version.ref} is being replaced; retry", 503, "draining") from None
        except QueueFull as e:
            raise RequestError(None, f"{route.version.ref} is busy ({e}); retry later", 429, "queue_full") from None
        if feed:
            feed.future = future
        echo = prompt if getattr(body, "echo", False) else ""
        return Submitted(endpoint, route, prompt, echo, ids, config, keep, key, body.stops(), future, feed,
                         body.stream_options)

    def finished(job: Submitted, decoded, ttfb_s: float) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """(the non-streamed response body, the facts the log and metrics keep, the parts a stream sends:
        choice, usage, extension) of a decoded request."""
        handle, v = job.route.loaded.handle, job.route.version
        choice = choice_of(handle, decoded.generated, job.keep, job.stops)
        usage = {"prompt_tokens": len(job.ids), "completion_tokens": choice["completion_tokens"],
                 "total_tokens": len(job.ids) + choice["completion_tokens"]}
        first_block = None if decoded.first_block_s is None else round(decoded.first_block_s, 6)
        facts = {"config_hash": job.config.hash(), "queue_s": decoded.queue_s, "prompt_tokens": len(job.ids),
                 "completion_tokens": choice["completion_tokens"], "nfe": decoded.nfe,
                 "batch_size": decoded.batch_size, "first_block_s": decoded.first_block_s}
        extension = {"alias": job.route.name, "model": v.model, "version": v.version,
                     "weights_sha256": v.weights_sha256, "config_hash": job.config.hash(),
                     "config_source": job.route.base_source, "batched": job.key is not None,
                     "batch_size": decoded.batch_size, "nfe": decoded.nfe, "queue_s": round(decoded.queue_s, 6),
                     "decode_s": round(decoded.decode_s, 6), "ttfb_s": round(ttfb_s, 6), "first_block_s": first_block,
                     "stream": job.feed is not None,
                     "route": job.routed[0] if job.routed else None, "arm": job.routed[1] if job.routed else None,
                     "retry_of": None}  # the arm that failed, when the route's fallback answers for it
        parts = {"choice": choice, "usage": usage, "extension": extension}
        common = {"created": int(time.time()), "model": v.model, "system_fingerprint": fingerprint(v),
                  "usage": usage, "unmask": extension}
        if job.endpoint == "completions":
            return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", **common,
                    "choices": [{"index": 0, "text": job.echo + choice["text"],
                                 "finish_reason": choice["finish_reason"], "logprobs": None}]}, facts, parts
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", **common,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                             "finish_reason": choice["finish_reason"], "logprobs": None}]}, facts, parts

    async def start_stream(request: Request, job: Submitted, outcome: Outcome, limit_s: float) -> StreamingResponse:
        """Wait for the first final tokens (until then every failure is a plain JSON error), then stream."""
        first = await until(request, job.feed.next(), job.future, limit_s - outcome.elapsed(), limit_s)
        if first is None and job.future.exception() is not None:
            raise job.future.exception()  # the model failed before a byte went out: a JSON 500
        v = job.route.version
        chunks = Chunks(job.endpoint, f"{'chatcmpl' if job.endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
                        int(time.time()), v.model, fingerprint(v))
        text = CommittedText(job.route.loaded.handle, job.keep, job.stops)
        include_usage = bool(job.stream_options and job.stream_options.include_usage)

        async def events():
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
                    left = settings.request_timeout_s - outcome.elapsed()
                    tokens = await asyncio.wait_for(job.feed.next(), max(left, 0.0))
                decoded = job.future.result()
                _, facts, parts = finished(job, decoded, ttfb_s=outcome.ttfb_s)
                rest = text.finish(parts["choice"]["text"])
                outcome.answered(facts)  # complete: a client that leaves during the last sends is not a 499
                if job.on_text:  # the route's shadow copy goes now, to be compared with this text
                    job.on_text(job.echo + parts["choice"]["text"])
                if rest:
                    yield event(chunks.text(rest))
                yield event(chunks.finish(parts["choice"]["finish_reason"], parts["extension"]))
                if include_usage:
                    yield event(chunks.usage(parts["usage"]))
                yield DONE
            except asyncio.TimeoutError:
                message = f"no complete answer within {settings.request_timeout_s:g} s"
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

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


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


def default_weights_path() -> Path:
    """Where a rollout controller writes the live weights overlay: <state folder>/rollouts/weights.json."""
    from gates.weights import WEIGHTS_FILE
    from models.state import state_dir

    return state_dir(create=False) / WEIGHTS_FILE  # only named: reading a missing overlay creates nothing


def fingerprint(v) -> str:
    return f"{v.model}/{v.version}@{v.weights_sha256[:12]}"


def unknown_id(handle: Any) -> int | None:
    """The tokenizer's unknown-token id (a prompt made only of it says nothing), when it has one."""
    tokenizer = getattr(handle, "tokenizer", None)
    token = getattr(getattr(tokenizer, "model", None), "unk_token", None)
    return tokenizer.token_to_id(token) if token else None


def model_card(route: Route, settings: ServeSettings) -> dict[str, Any]:
    """One `/v1/models` entry: the served name, and under `unmask` what it points at and how it decodes."""
    v, pool = route.version, settings.pool
    return {"id": route.name, "object": "model", "created": 0, "owned_by": "unmask", "unmask": {
        "model": v.model, "version": v.version, "weights_sha256": v.weights_sha256, "kind": route.loaded.handle.kind,
        "stage": v.stage, "config": route.base.to_dict(), "config_hash": route.base.hash(),
        "config_source": route.base_source, "operating_config_hash": v.operating_config_hash,
        "chat_template": route.loaded.chat.source, "streaming": STREAMING,
        "batching": {"max_batch": pool.max_batch, "window_ms": pool.batch_window_s * 1000,
                     "batched": BATCHED + ("; " + SAMPLED_BATCHED if row_seeded(route.loaded.handle) else ""),
                     "not_batched": NOT_BATCHED},
        "limits": {"max_tokens": settings.limits.max_tokens, "max_prompt_tokens": settings.limits.max_prompt_tokens,
                   "context": route.loaded.context}}}
