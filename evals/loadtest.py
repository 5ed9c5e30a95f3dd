"""Load tests: a bounded load on any OpenAI-compatible endpoint, measured the way N users feel it.

`run_load(spec, prompts)` drives the endpoint with the `openai` package's async client: for each
model and concurrency, `concurrency` workers send prompts one after another until `requests` were
sent or `duration_s` passed (a closed loop: the load is bounded by construction). Every answer is
timed (latency, time to first byte on a stream), its generated tokens are read from the response's
`usage.completion_tokens` (text tokens, no EOS padding) and its text is compared with the solo
(concurrency 1) answer to the same prompt. `serving_records(result)` turns each (model,
concurrency) cell into a `ServingRecord`, the evidence the `serving` gate reads.

Streaming is used where the server streams: one probe request per model asks for `stream=True`
(with `stream_options.include_usage`, then without); a 400 means the server does not stream, and
the cell is measured non-streamed with TTFB equal to latency (`streamed: false` says so).

A load test stops early on SIGINT (Ctrl-C) or SIGTERM: no request is sent after it, the answers in flight are
awaited, and the cells measured so far are the result (`LoadResult.stopped` names the signal, a note says so), so a
long load cut short still reports, and logs, what it measured.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import platform
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from evals.intervals import bootstrap_interval, share_interval
from evals.paired import RatioEstimate, block_rate
from evals.records import ServingRecord
from evals.tasks.scoring import score

if TYPE_CHECKING:
    import openai  # imported where used: a load test's client only

ENDPOINTS = ("completions", "chat")
MODES = ("stream+usage", "stream", "plain")  # probed in this order, first accepted wins
MAX_ERROR_MESSAGES = 5
MAX_REQUESTS = 10_000  # per model and level: a bounded load (100000000 once ran until killed)
MAX_CONCURRENCY = 1_024  # requests in flight at once
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # a load test stops sending on either and reports what it measured

Event = Callable[[str, dict[str, Any]], None]


class LoadTestError(ValueError):
    """A load test that cannot run; the message names the argument (or the endpoint) and what is wrong."""


@dataclass(frozen=True)
class LoadSpec:
    """What to load: an endpoint, the model names it serves, the concurrencies and the bounds of each cell."""

    base_url: str  # up to and including /v1
    models: tuple[str, ...]  # names the endpoint serves (aliases, registered models, upstream names)
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests: int = 32  # per (model, concurrency) cell
    duration_s: float | None = None  # a cell stops sending once this has passed, even before `requests`
    max_tokens: int | None = None  # None: the server's (the operating point's) length
    endpoint: str = "completions"  # or "chat"
    temperature: float | None = None  # None: the server's
    api_key: str = "unused"
    timeout_s: float = 120.0  # per request
    stream: bool = True  # probe for streaming; False: measure non-streamed only
    # with several models, each level's requests go in `rounds` blocks per model, the models' blocks of a round
    # in an order drawn per round (seeded): a change of load lands on every model alike (evals.paired)
    rounds: int = 4
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadSpec:
        """`dataclasses.asdict(spec)` back, through JSON (its tuples come back as lists)."""
        return cls(**dict(data, models=tuple(data["models"]), concurrency=tuple(data["concurrency"])))


def check_spec(spec: LoadSpec) -> None:
    """Raise LoadTestError naming the first argument that cannot be used."""
    if not spec.base_url.startswith(("http://", "https://")):
        raise LoadTestError(
            f"--url {spec.base_url!r}: expected an http(s):// base URL such as http://127.0.0.1:8000/v1"
        )
    if not spec.models or not all(isinstance(m, str) and m for m in spec.models):
        raise LoadTestError("--model: name at least one served model (e.g. --model production --model fallback)")
    if not spec.concurrency:
        raise LoadTestError("--concurrency: give at least one level, e.g. 1,4,16")
    bad = [c for c in spec.concurrency if not isinstance(c, int) or isinstance(c, bool) or c < 1]
    if bad:
        raise LoadTestError(f"--concurrency: {bad[0]!r} is not a positive integer (requests in flight)")
    if not isinstance(spec.requests, int) or spec.requests < 1:
        raise LoadTestError(f"--requests: {spec.requests!r} is not a positive integer (requests per model and level)")
    if spec.requests > MAX_REQUESTS:
        raise LoadTestError(f"--requests: {spec.requests!r} is above the bound of {MAX_REQUESTS} per model and level")
    if max(spec.concurrency) > MAX_CONCURRENCY:
        raise LoadTestError(
            f"--concurrency: {max(spec.concurrency)!r} is above the bound of {MAX_CONCURRENCY} requests in flight"
        )
    if spec.duration_s is not None and not spec.duration_s > 0:
        raise LoadTestError(f"--duration: {spec.duration_s!r} is not a positive number of seconds")
    if spec.max_tokens is not None and spec.max_tokens < 1:
        raise LoadTestError(f"--max-tokens: {spec.max_tokens!r} is not a positive integer")
    if not isinstance(spec.rounds, int) or isinstance(spec.rounds, bool) or spec.rounds < 1:
        raise LoadTestError(f"--rounds: {spec.rounds!r} is not a positive integer (blocks per model and level)")
    if spec.endpoint not in ENDPOINTS:
        raise LoadTestError(f"--endpoint: {spec.endpoint!r}; expected one of {', '.join(ENDPOINTS)}")
    if spec.duration_s is not None and not math.isfinite(spec.duration_s):
        raise LoadTestError(f"--duration: {spec.duration_s!r} is not a finite number of seconds")
    if not spec.timeout_s > 0 or not math.isfinite(spec.timeout_s):
        raise LoadTestError(f"--timeout: {spec.timeout_s!r} is not a positive number of seconds")


def levels(spec: LoadSpec) -> list[int]:
    """The concurrencies run, solo first: the solo answers are what every other level is compared with."""
    return sorted(set(spec.concurrency) | {1})


@dataclass
class Answer:
    """One request's outcome."""

    prompt: int  # index into the prompts
    text: str | None = None
    latency_s: float | None = None
    ttfb_s: float | None = None  # time to the first streamed chunk; the latency when not streamed
    tokens: int | None = None  # usage.completion_tokens
    served: dict[str, Any] = field(default_factory=dict)  # model, and the `unmask` extension when the server adds it
    error: str | None = None
    score: float | None = None  # against the prompt's target under the task's metric (`score_answers`)

    @property
    def tokens_per_forward(self) -> float | None:
        """Text tokens over the model calls of the decode that made them (`unmask.nfe`; rows batched together share
        their calls); None when the server does not say."""
        nfe = (self.served.get("unmask") or {}).get("nfe")
        if self.tokens is None or not isinstance(nfe, int | float) or nfe <= 0:
            return None
        return self.tokens / nfe

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Cell:
    """Every answer of one (model, concurrency), and what they add up to."""

    model: str
    concurrency: int
    mode: str  # how it was requested (MODES)
    answers: list[Answer]
    wall_s: float
    same_answer_share: float | None = None  # against the solo answers; None for the solo cell itself
    # per round of a paired load test, in round order: {"tokens", "wall_s", "answered", "first"} (first: the
    # model's block opened the round); [] when the cell ran as one block
    blocks: list[dict[str, Any]] = field(default_factory=list)
    paired_run: str = ""  # the id every cell of one paired load test shares; "" when unpaired

    @property
    def ok(self) -> list[Answer]:
        return [a for a in self.answers if a.ok]

    @property
    def errors(self) -> int:
        return len(self.answers) - len(self.ok)

    @property
    def error_rate(self) -> float:
        return self.errors / len(self.answers) if self.answers else 0.0

    def latency(self, q: float) -> float | None:
        values = [a.latency_s for a in self.ok if a.latency_s is not None]  # an answer has one (one_request)
        return float(np.percentile(values, q)) if values else None

    @property
    def ttfb_p50_s(self) -> float | None:
        values = [a.ttfb_s for a in self.ok if a.ttfb_s is not None]
        return float(np.median(values)) if values else None

    @property
    def tokens_per_s(self) -> float | None:
        tokens = [a.tokens for a in self.ok]
        counted = [t for t in tokens if t is not None]
        if not tokens or len(counted) < len(tokens) or self.wall_s <= 0:
            return None
        return sum(counted) / self.wall_s

    @property
    def scores(self) -> list[float]:
        """Every request's score, a failed one 0 (a figure over the requests that happened to work would flatter
        the side that failed); [] when the answers were not scored."""
        if not any(a.score is not None for a in self.answers):
            return []
        return [a.score if a.ok and a.score is not None else 0.0 for a in self.answers]

    @property
    def tokens_per_forward(self) -> float | None:
        values = [a.tokens_per_forward for a in self.ok]
        given = [v for v in values if v is not None]
        return sum(given) / len(given) if given and len(given) == len(values) else None

    @property
    def requests_per_s(self) -> float:
        return len(self.ok) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def streamed(self) -> bool:
        return self.mode != "plain"

    def served(self) -> dict[str, Any]:
        """Who answered (model, version, weights sha256), as most of the answers name it."""
        seen = Counter(tuple(sorted(_identity(a.served).items())) for a in self.ok)
        return dict(seen.most_common(1)[0][0]) if seen else {"model": self.model, "version": "", "weights_sha256": ""}

    def error_messages(self) -> list[str]:
        counts = Counter(a.error for a in self.answers if not a.ok)
        return [f"{n}x {message}" for message, n in counts.most_common(MAX_ERROR_MESSAGES)]


@dataclass
class LoadResult:
    spec: LoadSpec
    cells: list[Cell]
    notes: list[str] = field(default_factory=list)  # streaming refused, answers from several versions, ...
    metric: str = ""  # what the answers were scored by (`score_answers`); "" when they were not
    stopped: str = ""  # the signal that stopped it early (SIGINT, SIGTERM); "" when it ran to its bounds

    def cell(self, model: str, concurrency: int) -> Cell | None:
        return next((c for c in self.cells if c.model == model and c.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (`evals.load_process` carries a result from the process that measured it)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadResult:
        cells = [Cell(**dict(c, answers=[Answer(**a) for a in c["answers"]])) for c in data["cells"]]
        notes, metric, stopped = list(data.get("notes", [])), str(data.get("metric", "")), str(data.get("stopped", ""))
        return cls(LoadSpec.from_dict(data["spec"]), cells, notes, metric, stopped)


def _identity(served: dict[str, Any]) -> dict[str, str]:
    extension = served.get("unmask") or {}
    return {
        "model": str(extension.get("model") or served.get("model") or ""),
        "version": str(extension.get("version") or ""),
        "weights_sha256": str(extension.get("weights_sha256") or ""),
    }


def _server_message(error: Any) -> str:
    """What an error response says, without the client's own prefix ("Error code: 400 - {...}")."""
    body = getattr(error, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return str(body["message"])
    return str(getattr(error, "message", error))


def _describe(error: BaseException) -> str:
    import openai

    if isinstance(error, openai.APIStatusError):
        return f"HTTP {error.status_code}: {_server_message(error)}"[:300]
    if isinstance(error, openai.APITimeoutError):
        return "timed out"
    if isinstance(error, openai.APIConnectionError):
        return f"connection failed: {error.__cause__ or error}"[:300]
    return f"{type(error).__name__}: {error}"[:300]


def client_for(spec: LoadSpec) -> openai.AsyncOpenAI:
    """The async client every request of a load test goes through (no retries: a failure is a measurement)."""
    import openai

    return openai.AsyncOpenAI(
        base_url=spec.base_url, api_key=spec.api_key or "unused", max_retries=0, timeout=spec.timeout_s
    )


def _request(spec: LoadSpec, model: str, prompt: str, mode: str) -> dict[str, Any]:
    # one user per prompt: a server's sticky traffic split (routes, rollouts) spreads the load over its arms
    body: dict[str, Any] = {"model": model, "user": f"loadtest-{hashlib.sha256(prompt.encode()).hexdigest()[:12]}"}
    # one seed for every request: a sampled decode (block diffusion always samples) answers a prompt the same at
    # every concurrency, so "same as solo" measures batching, not the seed a server drew
    body["seed"] = spec.seed
    if spec.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if spec.max_tokens is not None:
        body["max_tokens"] = spec.max_tokens
    if spec.temperature is not None:
        body["temperature"] = spec.temperature
    if mode != "plain":
        body["stream"] = True
    if mode == "stream+usage":
        body["stream_options"] = {"include_usage": True}
    return body


def _create(client: Any, spec: LoadSpec) -> Callable[..., Any]:
    endpoint = client.chat.completions if spec.endpoint == "chat" else client.completions
    create: Callable[..., Any] = endpoint.create
    return create


async def one_request(client: Any, spec: LoadSpec, model: str, prompt: str, index: int, mode: str) -> Answer:
    """Send one prompt; never raises for a failed request (the error is the answer)."""
    started = time.perf_counter()
    answer = Answer(prompt=index)
    try:
        response = await _create(client, spec)(**_request(spec, model, prompt, mode))
        if mode == "plain":
            answer.latency_s = answer.ttfb_s = time.perf_counter() - started
            choice = response.choices[0]
            answer.text = choice.message.content if spec.endpoint == "chat" else choice.text
            answer.tokens = response.usage.completion_tokens if response.usage else None
            answer.served = {"model": response.model, "unmask": (response.model_extra or {}).get("unmask")}
            return answer
        parts: list[str] = []
        async for chunk in response:
            if answer.ttfb_s is None:
                answer.ttfb_s = time.perf_counter() - started
            for choice in chunk.choices or []:
                piece = choice.delta.content if spec.endpoint == "chat" else choice.text
                parts.append(piece or "")
            if chunk.usage is not None:
                answer.tokens = chunk.usage.completion_tokens
            extension = (chunk.model_extra or {}).get("unmask")
            if extension or not answer.served:
                answer.served = {"model": chunk.model, "unmask": extension or answer.served.get("unmask")}
        answer.latency_s = time.perf_counter() - started
        answer.text = "".join(parts)
        return answer
    except Exception as e:
        answer.error = _describe(e)
        return answer


async def probe_mode(client: Any, spec: LoadSpec, model: str, prompt: str) -> tuple[str, str | None]:
    """The first of MODES the endpoint accepts for `model`, and a note when streaming was refused."""
    import openai

    if not spec.stream:
        return "plain", None
    refusals = []
    for mode in MODES[:-1]:
        try:
            usage = False
            async for chunk in await _create(client, spec)(**_request(spec, model, prompt, mode)):
                usage |= chunk.usage is not None
            if mode == "stream" or usage:
                return mode, None
            refusals.append(f"{mode}: no usage in the stream")
        except openai.BadRequestError as e:
            refusals.append(f"{mode}: HTTP 400, {_server_message(e)}"[:200])
        except Exception as e:
            return "plain", f"{model}: the streaming probe failed ({_describe(e)}); measured non-streamed"
    return "plain", (
        f"{model}: the server refused streaming ({refusals[-1]}); measured non-streamed, so TTFB is the whole latency"
    )


async def run_cell(
    client: Any,
    spec: LoadSpec,
    model: str,
    prompts: list[str],
    concurrency: int,
    mode: str,
    on_event: Event,
    stop: asyncio.Event | None = None,
) -> Cell:
    """`concurrency` workers, each sending the next prompt when its last one is answered, until the bounds (or
    `stop`: the answers in flight are awaited)."""
    answers: list[Answer] = []
    sent = 0
    started = time.perf_counter()
    stopping = stop or asyncio.Event()

    async def worker() -> None:
        nonlocal sent
        while (
            sent < spec.requests
            and (spec.duration_s is None or time.perf_counter() - started < spec.duration_s)
            and not stopping.is_set()
        ):
            index = sent
            sent += 1  # no await since the check: workers never send the same index
            answer = await one_request(client, spec, model, prompts[index % len(prompts)], index % len(prompts), mode)
            answers.append(answer)
            on_event("answer", {"model": model, "concurrency": concurrency, "ok": answer.ok, "answer": answer})

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Cell(model, concurrency, mode, answers, time.perf_counter() - started)


def round_sizes(requests: int, concurrency: int, rounds: int) -> list[int]:
    """Requests per round: `rounds` blocks (fewer when a block would not fill `concurrency` workers), sizes
    differing by at most one and summing to `requests`."""
    n = max(1, min(rounds, requests // max(concurrency, 1)))
    return [requests // n + (i < requests % n) for i in range(n)]


async def run_paired_level(
    client: Any,
    spec: LoadSpec,
    prompts: list[str],
    concurrency: int,
    modes: dict[str, str],
    run_id: str,
    rng: Any,
    on_event: Event,
    stop: asyncio.Event | None = None,
) -> dict[str, Cell]:
    """Every model at one level, in rounds: each round runs one block per model, in an order drawn per round; a
    model's cell joins its blocks (its wall time is theirs summed, its answers theirs) and keeps each block. After
    `stop`, no block starts."""
    stopping = stop or asyncio.Event()
    blocks: dict[str, list[Cell]] = {m: [] for m in spec.models}
    first: dict[str, list[bool]] = {m: [] for m in spec.models}
    for model in spec.models:
        on_event("cell", {"model": model, "concurrency": concurrency, "total": spec.requests, "mode": modes[model]})
    for size in round_sizes(spec.requests, concurrency, spec.rounds):
        order = [spec.models[i] for i in rng.permutation(len(spec.models))]
        for model in order:
            if stopping.is_set():
                break
            sized = replace(spec, requests=size)
            cell = await run_cell(client, sized, model, prompts, concurrency, modes[model], on_event, stopping)
            blocks[model].append(cell)
            first[model].append(model == order[0])
    cells = {}
    for model, parts in blocks.items():
        cells[model] = Cell(
            model,
            concurrency,
            modes[model],
            [a for part in parts for a in part.answers],
            sum(part.wall_s for part in parts),
            blocks=[
                {
                    "tokens": sum(a.tokens or 0 for a in part.ok),
                    "wall_s": round(part.wall_s, 6),
                    "answered": len(part.ok),
                    "sent": len(part.answers),
                    "counted": all(a.tokens is not None for a in part.ok),
                    "first": opened,
                }
                for part, opened in zip(parts, first[model], strict=True)
            ],
            paired_run=run_id,
        )
    return cells


def score_answers(result: LoadResult, targets: Sequence[str], metric: str) -> None:
    """Score every answer against its prompt's target under `metric` (evals.tasks.scoring); `targets[i]` is the
    target of prompt i."""
    for cell in result.cells:
        for answer in cell.ok:
            answer.score = float(score(metric, answer.text or "", targets[answer.prompt]))
    result.metric = metric


def same_answer_share(cell: Cell, solo: Cell) -> float | None:
    """Share of `cell`'s answered prompts whose text is byte-identical to the solo answer to that prompt."""
    reference = {a.prompt: a.text for a in solo.ok}
    pairs = [(a.text, reference[a.prompt]) for a in cell.ok if a.prompt in reference]
    return sum(x == y for x, y in pairs) / len(pairs) if pairs else None


async def run_load_async(
    spec: LoadSpec, prompts: list[str], on_event: Event | None = None, stop: asyncio.Event | None = None
) -> LoadResult:
    """Every model at every level (paired round by round with several models); after `stop`, no request is sent and
    the cells that hold an answer are the result."""
    check_spec(spec)
    if not prompts:
        raise LoadTestError("no prompts to send (the task suite gave none)")
    notify = on_event or (lambda kind, info: None)
    stopping = stop or asyncio.Event()
    result = LoadResult(spec, [])
    async with client_for(spec) as client:
        await check_endpoint(client, spec)
        if len(spec.models) > 1 and spec.rounds > 1:
            await _run_paired(client, spec, prompts, result, notify, stopping)
            return result
        for model in spec.models:
            if stopping.is_set():
                break
            mode, note = await probe_mode(client, spec, model, prompts[0])
            if note:
                result.notes.append(note)
            solo = None
            for concurrency in levels(spec):
                if stopping.is_set():
                    break
                notify("cell", {"model": model, "concurrency": concurrency, "total": spec.requests, "mode": mode})
                cell = await run_cell(client, spec, model, prompts, concurrency, mode, notify, stopping)
                if concurrency == 1:
                    solo = cell
                else:
                    assert solo is not None  # levels() runs concurrency 1 first
                    cell.same_answer_share = same_answer_share(cell, solo)
                if cell.answers:
                    result.cells.append(cell)
            _note_versions(result, model)
    return result


async def _run_paired(
    client: Any, spec: LoadSpec, prompts: list[str], result: LoadResult, notify: Event, stop: asyncio.Event
) -> None:
    """Every level with the models interleaved round by round (`run_paired_level`); cells model by model."""
    modes = {}
    for model in spec.models:
        modes[model], note = await probe_mode(client, spec, model, prompts[0])
        if note:
            result.notes.append(note)
    run_id = hashlib.sha256(f"{time.time_ns()}:{spec.base_url}:{spec.models}".encode()).hexdigest()[:16]
    rng = np.random.default_rng(spec.seed)
    by_level = {}
    for concurrency in levels(spec):
        if stop.is_set():
            break
        by_level[concurrency] = await run_paired_level(
            client, spec, prompts, concurrency, modes, run_id, rng, notify, stop
        )
    for model in spec.models:
        solo = by_level[1][model] if by_level else None  # levels() runs 1 first: every other level has it
        for concurrency, cells in by_level.items():
            if concurrency != 1 and solo is not None:
                cells[model].same_answer_share = same_answer_share(cells[model], solo)
            if cells[model].answers:
                result.cells.append(cells[model])
        _note_versions(result, model)


def _note_versions(result: LoadResult, model: str) -> None:
    names = {tuple(sorted(_identity(a.served).items())) for c in result.cells if c.model == model for a in c.ok}
    if len(names) > 1:
        result.notes.append(
            f"{model}: answers came from {len(names)} different versions during the test "
            "(an alias moved?); each record names the one most answers came from"
        )


def run_load(spec: LoadSpec, prompts: list[str], on_event: Event | None = None) -> LoadResult:
    """Run the load test to its bounds, or (from the main thread) until SIGINT or SIGTERM stops it early with what it
    measured; LoadTestError for bad arguments or an unreachable URL."""

    async def measured() -> LoadResult:
        loop, stop, caught = asyncio.get_running_loop(), asyncio.Event(), []
        watched = STOP_SIGNALS if threading.current_thread() is threading.main_thread() else ()

        def on_signal(received: signal.Signals) -> None:
            caught.append(received)
            stop.set()

        for received in watched:
            loop.add_signal_handler(received, on_signal, received)
        try:
            result = await run_load_async(spec, prompts, on_event, stop)
        finally:
            for received in watched:
                loop.remove_signal_handler(received)
        if caught:
            result.stopped = caught[0].name
            answered = sum(len(c.answers) for c in result.cells)
            result.notes.append(
                f"stopped early by {result.stopped} after {answered} answers: the cells measured until then are the "
                "result"
            )
        return result

    return asyncio.run(measured())


async def check_endpoint(client: Any, spec: LoadSpec) -> None:
    """Refuse, in one line, an endpoint that does not answer (before any cell is measured)."""
    import openai

    try:
        await client.with_options(timeout=min(spec.timeout_s, 10.0)).models.list()
    except openai.APIConnectionError as e:
        raise LoadTestError(f"{spec.base_url}: cannot connect ({e.__cause__ or e})") from None
    except openai.NotFoundError:
        return  # some OpenAI-compatible servers do not list models; the requests will tell
    except openai.APIStatusError as e:
        raise LoadTestError(
            f"{spec.base_url}: GET /models answered HTTP {e.status_code} ({_server_message(e)})"
        ) from None


def figure_intervals(cell: Cell) -> dict[str, dict[str, float]]:
    """The 95% interval of each INTERVAL_FIGURES the cell measured: latency and TTFB percentiles by a bootstrap
    over its answered requests, accuracy by Wilson (a graded metric: the bootstrap of the mean) over every request,
    tokens/s by a bootstrap over its rounds (evals.paired.block_rate; none for a cell run as one block)."""
    latencies = [a.latency_s for a in cell.ok if a.latency_s is not None]
    ttfbs = [a.ttfb_s for a in cell.ok if a.ttfb_s is not None]
    found = {
        "latency_p50_s": bootstrap_interval(latencies, 50),
        "latency_p99_s": bootstrap_interval(latencies, 99),
        "ttfb_p50_s": bootstrap_interval(ttfbs, 50),
        "accuracy": share_interval(cell.scores),
    }
    out = {name: RatioEstimate(*figure).to_dict() for name, figure in found.items() if figure is not None}
    rate = block_rate(cell.blocks)
    if rate is not None:
        out["tokens_per_s"] = rate.to_dict()
    return out


def per_request(cell: Cell) -> dict[str, list[Any]]:
    """The cell's requests in the order sent: the values every figure and interval of its record comes from."""
    return {
        "latency_s": [a.latency_s if a.ok else None for a in cell.answers],
        "ttfb_s": [a.ttfb_s if a.ok else None for a in cell.answers],
        "tokens": [a.tokens if a.ok else None for a in cell.answers],
        "score": [a.score if a.ok else None for a in cell.answers],
    }


def serving_records(result: LoadResult, environment: dict[str, Any] | None = None) -> list[ServingRecord]:
    """One ServingRecord per cell, naming the version that answered, with its intervals and per-request values."""
    when = datetime.now(UTC).isoformat(timespec="seconds")
    records = []
    for cell in result.cells:
        served = cell.served()
        scores = cell.scores
        records.append(
            ServingRecord(
                model=served["model"] or cell.model,
                version=served["version"],
                weights_sha256=served["weights_sha256"],
                concurrency=cell.concurrency,
                requests=len(cell.answers),
                latency_p50_s=cell.latency(50),
                latency_p95_s=cell.latency(95),
                latency_p99_s=cell.latency(99),
                ttfb_p50_s=cell.ttfb_p50_s,
                tokens_per_s=cell.tokens_per_s,
                requests_per_s=cell.requests_per_s,
                error_rate=cell.error_rate,
                same_answer_share=cell.same_answer_share,
                streamed=cell.streamed,
                paired_run=cell.paired_run,
                blocks=list(cell.blocks),
                served_as=cell.model,
                base_url=result.spec.base_url,
                when=when,
                environment=dict(environment or {}),
                metric=result.metric if scores else "",
                accuracy=sum(scores) / len(scores) if scores else None,
                tokens_per_forward=cell.tokens_per_forward,
                intervals=figure_intervals(cell),
                per_request=per_request(cell),
                host=platform.node(),
            )
        )
    return records
