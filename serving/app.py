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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from gates.request_limits import RequestLimits
from gates.serving_policy import AUTO
from gates.weights import WEIGHTS_FILE
from models.state import state_dir
from sampler.decode import row_seeded
from sampler.likelihood import DEFAULT_SAMPLES
from serving import errors
from serving.access import Access
from serving.analysis_api import router as analysis_router
from serving.attempt import Attempt, Prompt
from serving.decoding import Limits, RequestError
from serving.dispatch import Dispatch
from serving.evidence import open_evidence
from serving.local import LocalServing
from serving.metrics import ServingMetrics
from serving.pool import ModelPool, PoolSettings, Route
from serving.request_log import RequestLog, row
from serving.responses import Batching, ModelCard, ModelFacts, TokenLimits
from serving.routing import RouteTable
from serving.schemas import ChatCompletionRequest, CompletionRequest
from serving.tokenizing import DetokenizeRequest, TokenizeRequest, Tokenizers

log = logging.getLogger("unmask.serve")

ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}  # metric label per path
STREAMING = (
    "stream=true sends server-sent events in OpenAI's chunk format; masked diffusion sends each block's "
    "text once the block is final (never text a later step may change), autoregressive models each token"
)
BATCHED = "deterministic decoding (temperature 0, confidence-ordered remasking), grouped by effective config"
SAMPLED_BATCHED = (
    "sampled decoding (temperature > 0, or random remasking) is batched with one random generator per "
    "row, seeded by its request's seed, so each row draws what it would draw alone"
)
NOT_BATCHED = (
    "sampled decoding by a decoder with one generator for the whole batch (transformers' generate) is "
    "decoded alone: a row's draws would depend on its neighbours. A sampled request without a seed gets "
    "one drawn from the OS (reported in unmask.seeds), so it batches like a seeded one"
)


@dataclass
class ServeSettings:
    pool: PoolSettings
    limits: Limits = field(default_factory=Limits)
    request_timeout_s: float = 120.0
    max_body_bytes: int = 1_000_000
    request_log_dir: Path | None = None  # None: no request log
    # the team PostgreSQL the request log's journals go to and the analysis reads (UNMASK_EVIDENCE_URL); None: the
    # request log's folder (serving/evidence.py)
    evidence_url: str | None = None
    follow_aliases: bool = True
    routes_path: Path | None = None  # a serving policy (gates/serving.yaml); None: `model` names the alias
    # the route an outside controller (KServe, Argo Rollouts, Flagger) splits between revisions, this server being
    # one arm: its one served name. Every request is logged with that route and arm, so the canary analysis sees it
    route: str | None = None
    weights_path: Path | None = None  # the live weights overlay; None: <state folder>/rollouts/weights.json
    max_shadows: int = 4  # shadow copies in flight at once; more are dropped (and counted)
    compute: RequestLimits = field(default_factory=RequestLimits)  # per-request caps (serving policy `limits:`)
    api_keys: frozenset[str] = frozenset()  # empty: the API is open (serving/access.py)
    analysis_keys: frozenset[str] = frozenset()  # the controllers' keys, valid on the canary analysis only
    likelihood_samples: int = DEFAULT_SAMPLES  # masked diffusion scoring an echoed prompt (sampler/likelihood.py)


def routed_as(route: str | None, routes_path: Path | None, names: list[str]) -> tuple[str, str] | None:
    """(route, arm) every request of a server given `route` is logged as: the arm is its one served name.
    ValueError, naming the flags, for a route beside a routes file or with more or fewer than one served name."""
    if route is None:
        return None
    if route == AUTO:
        raise ValueError(f"--route {AUTO!r}: reserved (a request for `auto` asks a router to pick its route)")
    if routes_path is not None:
        raise ValueError(
            f"--route {route!r} with --routes {routes_path}: a server with a routes file logs the route and arm it "
            "picks for each request itself; --route is for one arm of a controller's split"
        )
    if len(names) != 1:
        raise ValueError(
            f"--route {route!r}: serve exactly one name (--alias or --model), the arm its requests are logged as; "
            f"serving {', '.join(names) or 'none'}"
        )
    return route, names[0]


def create_app(settings: ServeSettings) -> FastAPI:
    """The app: its parts (pool, routes, request log, local serving, dispatch), lifespan, error handling, routes."""
    metrics = ServingMetrics()
    pool = ModelPool(settings.pool, metrics)
    routes = (
        RouteTable(settings.routes_path, settings.pool.names, metrics, settings.weights_path or default_weights_path())
        if settings.routes_path
        else None
    )
    requests_log = (
        RequestLog(
            settings.request_log_dir,
            on_drop=metrics.log_dropped.inc,
            store=open_evidence(settings.evidence_url or settings.request_log_dir),
        )
        if settings.request_log_dir
        else None
    )
    local = LocalServing(pool, settings)
    dispatch = Dispatch(
        lambda: settings.request_timeout_s,
        settings.max_shadows,
        metrics,
        requests_log,
        routes,
        local,
        routed_as(settings.route, settings.routes_path, settings.pool.names),
    )
    app = FastAPI(
        title="unmask serve",
        lifespan=lifespan_of(settings, pool, routes, dispatch, requests_log),
        docs_url=None,
        redoc_url=None,
    )
    app.state.pool, app.state.metrics, app.state.request_log = pool, metrics, requests_log
    app.state.routes, app.state.dispatch, app.state.evidence_url = routes, dispatch, settings.evidence_url

    def count_refusal(path: str, status: int, code: str, message: str) -> None:
        endpoint = ENDPOINTS.get(path, "other")
        metrics.errors.labels("unknown", endpoint, str(status), code).inc()
        if requests_log and endpoint != "other":  # a refused request is a request too; stray paths are not
            requests_log.append(row(endpoint=endpoint, alias="unknown", status=status, error=message[:500]))

    errors.install(app, count_refusal)
    app.add_middleware(errors.BodyLimit, max_bytes=settings.max_body_bytes, count=count_refusal)
    # outermost: before the body is read
    app.add_middleware(Access, keys=settings.api_keys, count=count_refusal, analysis_keys=settings.analysis_keys)
    add_routes(app, settings, pool, routes, dispatch, local, metrics)
    app.include_router(analysis_router)  # GET /v1/unmask/analysis, POST .../flagger (serving/analysis_api.py)
    return app


def lifespan_of(
    settings: ServeSettings,
    pool: ModelPool,
    routes: RouteTable | None,
    dispatch: Dispatch,
    requests_log: RequestLog | None,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """Load the models (then follow alias moves) and the routes file in the background; drain all on the way out."""

    async def start_and_follow() -> None:
        await pool.start()
        if pool.ready and settings.follow_aliases:
            await pool.follow()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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

    return lifespan


def add_routes(
    app: FastAPI,
    settings: ServeSettings,
    pool: ModelPool,
    routes: RouteTable | None,
    dispatch: Dispatch,
    local: LocalServing,
    metrics: ServingMetrics,
) -> None:
    """The HTTP routes: health, routes in force, metrics, models, completions, chat completions and the
    tokenizer endpoints."""

    @app.get("/health")
    async def health() -> JSONResponse:
        if pool.ready:
            body = {"status": "ready", "served": {n: r.version.ref for n, r in pool.routes.items()}}
            if routes:
                body["routes"] = {
                    "file": str(routes.path),
                    "sha256": routes.policy.sha256,
                    "last_error": routes.last_error,
                    "weights_file": str(routes.weights_path),
                    "weights_error": routes.weights_error,
                }
                body["arms"] = {name: dispatch.arm_health.report(name) for name in dispatch.arm_names()}
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
        route = local.resolve(name)
        return model_card(route, settings) | ({"id": name} if name != route.name else {})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        prompts = Prompt(body.prompts())
        return await dispatch.answer(Attempt(request, "completions", body, lambda route: prompts, body.max_tokens))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        messages = [m.for_template() for m in body.messages]

        def rendered(route: Route) -> Prompt:
            chat = route.loaded.chat.render_chat(messages)
            return Prompt([chat.text], chat.dropped)

        return await dispatch.answer(Attempt(request, "chat", body, rendered, body.requested_tokens()))

    tokenizers = Tokenizers(local, settings.limits)  # vLLM's tokenizer endpoints, at the root as vLLM has them

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        return tokenizers.tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        return tokenizers.detokenize(body)

    @app.get("/tokenizer_info")
    async def tokenizer_info(model: str | None = None) -> dict[str, Any]:
        return tokenizers.info(model)


def default_weights_path() -> Path:
    """Where a rollout controller writes the live weights overlay: <state folder>/rollouts/weights.json."""
    return state_dir(create=False) / WEIGHTS_FILE  # only named: reading a missing overlay creates nothing


def model_card(route: Route, settings: ServeSettings) -> dict[str, Any]:
    """One `/v1/models` entry: the served name, and under `unmask` what it points at and how it decodes."""
    v, pool, limits = route.version, settings.pool, settings.limits
    batched = BATCHED + ("; " + SAMPLED_BATCHED if row_seeded(route.loaded.handle) else "")
    return ModelCard(
        id=route.name,
        created=v.created,
        unmask=ModelFacts(
            model=v.model,
            version=v.version,
            weights_sha256=v.weights_sha256,
            kind=route.loaded.handle.kind,
            stage=v.stage,
            config=route.base.to_dict(),
            config_hash=route.base.hash(),
            config_source=route.base_source,
            operating_config_hash=v.operating_config_hash,
            chat_template=route.loaded.chat.source,
            streaming=STREAMING,
            batching=Batching(
                max_batch=pool.max_batch, window_ms=pool.batch_window_s * 1000, batched=batched, not_batched=NOT_BATCHED
            ),
            limits=TokenLimits(
                max_tokens=limits.max_tokens, max_prompt_tokens=limits.max_prompt_tokens, context=route.loaded.context
            ),
        ),
    ).model_dump()
