"""The OpenAI-compatible app: completions, chat completions, models, health and metrics.

`create_app(settings)` gives a FastAPI app; uvicorn runs it (`unmask serve`, or a test on a free
port). Models load in the background once the app starts, so `/health` answers 503 until every
served name is loaded, weights-checked and warmed, then 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from models.adapters.base import AdapterError
from serving import errors
from serving.batching import Draining, QueueFull
from serving.decoding import Limits, RequestError, batch_key, choice_of, request_config
from serving.metrics import ServingMetrics
from serving.pool import ModelPool, PoolSettings, Route
from serving.request_log import RequestLog, row
from serving.schemas import ChatCompletionRequest, CompletionRequest, Sampling

log = logging.getLogger("unmask.serve")

ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # metric label per path
NOT_BATCHED = ("sampled decoding (temperature > 0, or random remasking) is decoded alone: a batch shares one "
               "random generator, so a row's draws would depend on its neighbours")


@dataclass
class ServeSettings:
    pool: PoolSettings
    limits: Limits = field(default_factory=Limits)
    request_timeout_s: float = 120.0
    max_body_bytes: int = 1_000_000
    request_log_dir: Path | None = None  # None: no request log
    follow_aliases: bool = True


def create_app(settings: ServeSettings) -> FastAPI:
    metrics = ServingMetrics()
    pool = ModelPool(settings.pool, metrics)
    requests_log = (RequestLog(settings.request_log_dir, on_drop=metrics.log_dropped.inc)
                    if settings.request_log_dir else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(start_and_follow())]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close()
        if requests_log:
            await asyncio.to_thread(requests_log.close)

    async def start_and_follow() -> None:
        await pool.start()
        if pool.ready and settings.follow_aliases:
            await pool.follow()

    app = FastAPI(title="unmask serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.pool, app.state.metrics, app.state.request_log = pool, metrics, requests_log

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
            return JSONResponse({"status": "ready", "served": {n: r.version.ref for n, r in pool.routes.items()}})
        status = "failed" if pool.error else "loading"
        return JSONResponse({"status": status, "error": pool.error}, status_code=503)

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
    async def completions(body: CompletionRequest, request: Request) -> JSONResponse:
        return await answer(request, "completions", body, lambda route: body.prompt, body.max_tokens)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> JSONResponse:
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return await answer(request, "chat", body, lambda route: route.loaded.chat.render(messages),
                            body.requested_tokens())

    async def answer(request: Request, endpoint: str, body: Sampling, prompt_of,
                     max_tokens: int | None) -> JSONResponse:
        arrived = time.monotonic()
        route: Route | None = None
        entry: dict[str, Any] = {"endpoint": endpoint, "alias": body.model}
        try:
            route = resolve(body.model)
            entry |= {"alias": route.name, "model": route.version.model, "version": route.version.version,
                      "weights_sha256": route.version.weights_sha256}
            response, facts = await decode_one(request, route, body, prompt_of(route), max_tokens, endpoint)
            entry |= facts | {"status": 200}
            labels = (route.name, route.version.model, route.version.version)
            metrics.requests.labels(*labels, endpoint, "200").inc()
            metrics.latency.labels(*labels).observe(time.monotonic() - arrived)
            metrics.queue_wait.labels(*labels).observe(facts["queue_s"])
            metrics.prompt_tokens.labels(*labels).inc(facts["prompt_tokens"])
            metrics.completion_tokens.labels(*labels).inc(facts["completion_tokens"])
            metrics.nfe.labels(*labels).inc(facts["nfe"])
            return JSONResponse(response)
        except RequestError as e:
            entry |= {"status": e.status, "error": e.message}
            alias = route.name if route else "unknown"
            metrics.errors.labels(alias, endpoint, str(e.status), e.code).inc()
            if route:
                metrics.requests.labels(route.name, route.version.model, route.version.version, endpoint,
                                        str(e.status)).inc()
            raise
        except Exception as e:
            entry |= {"status": 500, "error": f"{type(e).__name__}: {e}"}
            metrics.errors.labels(route.name if route else "unknown", endpoint, "500", "server_error").inc()
            log.exception("%s request failed", endpoint)
            raise
        finally:
            if requests_log:
                requests_log.append(row(**entry, latency_s=time.monotonic() - arrived))

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

    async def decode_one(request: Request, route: Route, body: Sampling, prompt: str, max_tokens: int | None,
                         endpoint: str) -> tuple[dict[str, Any], dict[str, Any]]:
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
        key = batch_key(config)
        try:  # no await since `resolve`, so the route cannot have moved on: Draining is a bug guard, not a path
            future = route.loaded.batcher.submit(ids, config, key)
        except Draining:
            raise RequestError(None, f"{route.version.ref} is being replaced; retry", 503, "draining") from None
        except QueueFull as e:
            raise RequestError(None, f"{route.version.ref} is busy ({e}); retry later", 429, "queue_full") from None
        decoded = await wait_for_answer(request, future, settings.request_timeout_s)
        choice = choice_of(handle, decoded.generated, keep, body.stops())
        usage = {"prompt_tokens": len(ids), "completion_tokens": choice["completion_tokens"],
                 "total_tokens": len(ids) + choice["completion_tokens"]}
        v = route.version
        facts = {"config_hash": config.hash(), "queue_s": decoded.queue_s, "prompt_tokens": len(ids),
                 "completion_tokens": choice["completion_tokens"], "nfe": decoded.nfe, "batch_size": decoded.batch_size}
        extension = {"alias": route.name, "model": v.model, "version": v.version, "weights_sha256": v.weights_sha256,
                     "config_hash": config.hash(), "config_source": route.base_source, "batched": key is not None,
                     "batch_size": decoded.batch_size, "nfe": decoded.nfe, "queue_s": round(decoded.queue_s, 6),
                     "decode_s": round(decoded.decode_s, 6)}
        common = {"created": int(time.time()), "model": v.model,
                  "system_fingerprint": f"{v.model}/{v.version}@{v.weights_sha256[:12]}", "usage": usage,
                  "unmask": extension}
        if endpoint == "completions":
            text = prompt + choice["text"] if getattr(body, "echo", False) else choice["text"]
            return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", **common,
                    "choices": [{"index": 0, "text": text, "finish_reason": choice["finish_reason"],
                                 "logprobs": None}]}, facts
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", **common,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                             "finish_reason": choice["finish_reason"], "logprobs": None}]}, facts

    return app


async def wait_for_answer(request: Request, future: asyncio.Future, timeout_s: float):
    """The batcher's answer; a client that hangs up, or a timeout, cancels the request and frees its slot."""
    async def hung_up() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(hung_up())
    try:
        done, _ = await asyncio.wait({future, watcher}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if future in done:
        return future.result()
    future.cancel()  # still queued: the batcher skips it; already decoding: its row is dropped
    if watcher in done:
        raise RequestError(None, "the client closed the connection before the answer", 499, "client_closed")
    raise RequestError(None, f"no answer within {timeout_s:g} s", 504, "timeout")


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
        "chat_template": route.loaded.chat.source,
        "batching": {"max_batch": pool.max_batch, "window_ms": pool.batch_window_s * 1000,
                     "batched": "deterministic decoding (temperature 0, confidence-ordered remasking), grouped by "
                                "effective config", "not_batched": NOT_BATCHED},
        "limits": {"max_tokens": settings.limits.max_tokens, "max_prompt_tokens": settings.limits.max_prompt_tokens,
                   "context": route.loaded.context}}}
