"""`unmask loadtest`: a bounded load on an OpenAI-compatible endpoint, per model and concurrency, side by side.

Without `--url` it serves the named aliases or registered models itself (`unmask serve`'s app on a
free 127.0.0.1 port, in this process) over the registry; with `--url` it loads any endpoint (another
`unmask serve`, vLLM, SGLang, a hosted API). The measuring is `evals.loadtest`; each (model,
concurrency) becomes a ServingRecord, logged against the registered version that answered
(`registry.loadtests`), which the `serving` gate reads.

Serving here, it also times each loaded model's forward, and its whole decode, at the row counts the load
batches (`evals.batching_cap`) and prints the batching gain each level achieved against both caps; and every run
plots tokens/s against p95 latency, one line per model (`--plot`), logged with the records.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flows.commands import options
from flows.commands.table import Column, FittedTable, table_console
from gates.readable import NONE, milliseconds, percent, significant

if TYPE_CHECKING:
    from evals.batching_cap import BatchingCap, GainAgainstCap
    from evals.loadtest import LoadResult, LoadSpec
    from evals.records import ServingRecord
    from serving.pool import ModelPool

console = table_console(200)


def parse_levels(text: str) -> tuple[int, ...]:
    """`1,4,16` -> (1, 4, 16); LoadTestError names --concurrency for anything else."""
    from evals.loadtest import LoadTestError

    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise LoadTestError(
            f"--concurrency {text!r}: expected comma-separated positive integers, e.g. 1,4,16"
        ) from None
    if not values:
        raise LoadTestError(f"--concurrency {text!r}: expected comma-separated positive integers, e.g. 1,4,16")
    return values


@dataclass(frozen=True)
class LocalServer:
    """The app `local_server` runs: its /v1 URL, and its model pool (the loaded versions, in this process)."""

    url: str
    pool: Any  # serving.pool.ModelPool


@contextlib.contextmanager
def local_server(
    names: list[str],
    tracking_uri: str | None = None,
    *,
    sources: dict[str, str] | None = None,
    max_batch: int = 16,
    batch_window_s: float = 0.01,
    max_pending: int = 1024,
    device: str = "cpu",
    dtype: str = "float32",
    continuous: bool | None = None,
    timeout_s: float = 600.0,
    max_tokens: int = 256,
    asked_tokens: int | None = None,
) -> Iterator[LocalServer]:
    """`unmask serve`'s app over the registry on a free 127.0.0.1 port (uvicorn in a thread); yields its /v1 URL
    and its pool, whose loaded models the batching cap is measured on.

    Raises LoadTestError when the names cannot be served (the pool's own message: no holder, weights differ ...),
    or when `asked_tokens` (--max-tokens) does not fit a served model's context: before a request is sent.
    """
    import asyncio
    import socket
    import threading
    import time

    import uvicorn

    from evals.loadtest import LoadTestError
    from serving import Limits, PoolSettings, ServeSettings, create_app

    app = create_app(
        ServeSettings(
            pool=PoolSettings(
                names=list(names),
                tracking_uri=tracking_uri,
                sources=dict(sources or {}),
                device=device,
                dtype=dtype,
                max_batch=max_batch,
                batch_window_s=batch_window_s,
                max_pending=max_pending,
                continuous=continuous,
            ),
            limits=Limits(max_tokens=max_tokens),
            request_timeout_s=timeout_s,
        )
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), name="unmask-loadtest-server", daemon=True)
    thread.start()
    try:
        pool = app.state.pool
        while not pool.ready:
            if pool.error:
                raise LoadTestError(f"cannot serve {', '.join(names)}: {pool.error}")
            if not thread.is_alive():
                raise LoadTestError(f"the local server for {', '.join(names)} stopped before it was ready")
            time.sleep(0.1)
        for name in names if asked_tokens else ():
            try:
                context = pool.route(name).loaded.context
            except KeyError:  # nobody holds it yet: the server refuses its requests, and they are counted as errors
                continue
            if context and asked_tokens >= context:
                raise LoadTestError(
                    f"--max-tokens {asked_tokens}: does not fit {name}'s context of {context} tokens "
                    f"(prompt included); ask for fewer"
                )
        yield LocalServer(f"http://127.0.0.1:{port}/v1", pool)
    finally:
        server.should_exit = True
        thread.join(60)


def loadtest_command(
    model: list[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Served name to load (alias or registered model); repeat (default: production, fallback).",
    ),
    concurrency: str = typer.Option(
        "1,4,16",
        "--concurrency",
        "-c",
        help="Requests in flight, comma-separated; 1 (the solo reference) is always run.",
    ),
    requests: int = typer.Option(32, "--requests", "-n", help="Requests per model and concurrency."),
    duration: float = typer.Option(None, "--duration", help="Seconds per model and concurrency at most."),
    rounds: int = typer.Option(
        4,
        "--rounds",
        help="With several models: each level's requests in this many blocks per model, interleaved round by round "
        "in an order drawn per round, so ratios between models are paired and carry an interval (1: one after the "
        "other, unpaired).",
    ),
    url: str = typer.Option(
        None,
        "--url",
        help="An OpenAI-compatible base URL (…/v1); default: serve the registry here on a free 127.0.0.1 port.",
    ),
    api_key_env: str = typer.Option(None, "--api-key-env", help="Environment variable holding the endpoint's key."),
    entry: str = typer.Option(
        None,
        "--entry",
        help="An api catalog entry to load: its base URL, model name and key "
        "variable (instead of --url, --model, --api-key-env).",
    ),
    task: str = typer.Option("arith", "--task", help="Task suite the prompts come from (evals/tasks)."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Answer length (default: the served operating point)."),
    endpoint: str = typer.Option(
        None, "--endpoint", help="completions or chat (default: completions; chat for --entry)."
    ),
    max_batch: int = typer.Option(
        16, "--max-batch", callback=options.positive, help="Without --url: the local server's largest batch."
    ),
    timeout_s: float = typer.Option(120.0, "--timeout", help="Per-request timeout in seconds."),
    stream: bool = typer.Option(
        True, "--stream/--no-stream", help="Measure TTFB on a stream where the server streams."
    ),
    json_path: Path = typer.Option(None, "--json", callback=options.output_path, help="Write records, notes here."),
    plot: Path = typer.Option(
        None,
        "--plot",
        callback=options.output_path,
        help="Write the tokens/s vs p95 curve here (PNG; default: under $UNMASK_HOME/loadtests/).",
    ),
    log: bool = typer.Option(
        True, "--log/--no-log", help="Log the serving records to MLflow against the registered version that answered."
    ),
) -> None:
    """Load an OpenAI-compatible endpoint at several concurrencies: latency, TTFB, throughput, errors, exactness.
    Ctrl-C or SIGTERM stops it early with what it measured."""
    from evals.loadtest import LoadSpec, LoadTestError

    try:
        key = "unused"
        if entry:
            url, served, key = entry_endpoint(entry)
            names = list(model or [served])
        else:
            names = list(model or ["production", "fallback"])
        if api_key_env:
            if not os.environ.get(api_key_env):
                raise LoadTestError(f"--api-key-env {api_key_env}: the environment variable is not set")
            key = os.environ[api_key_env]
        spec = LoadSpec(
            base_url=(url or "http://127.0.0.1/v1").rstrip("/"),
            models=tuple(names),
            concurrency=parse_levels(concurrency),
            requests=requests,
            duration_s=duration,
            max_tokens=max_tokens,
            endpoint=endpoint or ("chat" if entry else "completions"),
            timeout_s=timeout_s,
            stream=stream,
            api_key=key,
            rounds=rounds,
        )
        measured = measure_load(spec, task, here=not url, max_batch=max_batch)
    except LoadTestError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    result, records, caps, decode_caps = measured.result, measured.records, measured.caps, measured.decode_caps
    show_results(result, records, caps, max_batch, decode_caps)
    logged = save_results(records, plot, log)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(
            json.dumps(
                {
                    "base_url": result.spec.base_url if url else "local",
                    "task": task,
                    "records": [r.to_dict() for r in logged],
                    "notes": result.notes,
                    "stopped": result.stopped,  # the signal that cut it short; "" when it ran to its bounds
                    "errors": {f"{c.model}@{c.concurrency}": c.error_messages() for c in result.cells if c.errors},
                },
                indent=2,
            )
        )
        console.print(f"records: {json_path}", highlight=False)


@dataclass(frozen=True)
class Measured:
    """A load test's result, its records (scored, with intervals), and the batching caps where it served here."""

    result: LoadResult
    records: list[ServingRecord]
    caps: dict[str, Any] | None = None
    decode_caps: dict[str, Any] | None = None


def measure_load(spec: LoadSpec, task: str, here: bool, max_batch: int = 16, caps: bool = True) -> Measured:
    """Load `spec` with the prompts of `task`'s test split and score each answer against its target (the task's
    bench metric); `here`: serve `spec.models` on this machine first (the client in a process of its own, off the
    server's interpreter lock), and with `caps` time the batching caps. LoadTestError for anything that cannot
    run, before a request is sent."""
    from dataclasses import replace

    from evals.bench import bench_metric
    from evals.evaluate import load_task
    from evals.fingerprint import environment_fingerprint
    from evals.loadtest import LoadTestError, check_spec, levels, score_answers, serving_records

    check_spec(spec)
    try:
        items = load_task(task, "test", max(spec.requests, 1)).items
        metric = bench_metric(task)
    except (KeyError, ValueError) as e:
        raise LoadTestError(f"--task {task!r}: {e}") from None
    prompts = [item.prompt for item in items]
    serve_here = local_server(
        list(spec.models),
        max_batch=max_batch,
        timeout_s=spec.timeout_s,
        max_tokens=max(256, spec.max_tokens or 0),
        asked_tokens=spec.max_tokens,
    )
    found: dict[str, dict[str, Any] | None] = {"caps": None, "decode_caps": None}
    with serve_here if here else contextlib.nullcontext() as server:
        result = run_with_progress(replace(spec, base_url=server.url) if server else spec, prompts, apart=here)
        if server and caps and not result.stopped:  # stopped early: the user wants the figures, not more timing
            from evals.batching_cap import cap_rows, measure_decode_cap

            rows = cap_rows(levels(spec), max_batch)
            found["caps"] = served_caps(server.pool, list(spec.models), prompts, rows)
            found["decode_caps"] = served_caps(server.pool, list(spec.models), prompts, rows, measure_decode_cap)
    score_answers(result, [item.target for item in items], metric)
    environment = environment_fingerprint("cpu", task=task, served_by="local" if here else "url")
    return Measured(result, serving_records(result, environment), found["caps"], found["decode_caps"])


def save_results(records: list[ServingRecord], plot: Path | None, log: bool) -> list[ServingRecord]:
    """Plot the curve and, with --log, log the records and the plot to MLflow; the records, with run ids where
    logged."""
    plotted = plot_curve(records, plot)
    logged, skipped = log_records(records, plotted) if log else (records, [])
    for why in skipped:
        console.print(f"[yellow]not logged:[/yellow] {why}", highlight=False)
    if log and any(r.run_id for r in logged):
        console.print(
            f"logged {sum(bool(r.run_id) for r in logged)} serving record(s) to MLflow; the serving gate "
            "reads them (unmask gates)",
            highlight=False,
        )
    return logged


def show_results(
    result: LoadResult,
    records: list[ServingRecord],
    caps: dict[str, Any] | None,
    max_batch: int,
    decode_caps: dict[str, Any] | None = None,
) -> None:
    """The results table (its model, in flight, tokens/s and p95 columns are the curve's points), the notes, the
    errors, and the batching gain against the caps, the forward's and the whole decode's (`caps` None: a remote
    endpoint, whose model is not here)."""
    from evals.batching_cap import gains_against_caps

    console.print(results_table(result, records))
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    for cell in result.cells:
        for message in cell.error_messages():
            console.print(f"[red]errors[/red] {cell.model} at {cell.concurrency}: {message}", highlight=False)
    gains = gains_against_caps(records, caps or {}, max_batch, decode_caps)
    if gains:
        console.print(cap_table(gains, max_batch))
    if caps is None:
        console.print(
            "batching cap: unknown (the model behind --url is not in this process, so its forward cannot "
            "be timed; run without --url to measure it)",
            highlight=False,
        )


def served_caps(
    pool: ModelPool,
    names: list[str],
    prompts: list[str],
    rows: tuple[int, ...],
    measure: Callable[..., BatchingCap] | None = None,
) -> dict[str, Any]:
    """The batching cap (`evals.batching_cap`; `measure`: its `measure_cap`, the default, or `measure_decode_cap`) of
    each served name's loaded model at its operating point; None for a name with no holder or a kind it does not
    measure. Call it after the load, while the server still runs: the forwards are timed on the pool's compute
    thread, where its batches ran (a forward timed on another thread competes with that thread's idle OpenMP team,
    a one-row forward most: serving.pool)."""
    from evals.batching_cap import measure_cap

    measure = measure or measure_cap
    caps: dict[str, Any] = {}
    for name in names:
        try:
            route = pool.route(name)
        except KeyError:
            caps[name] = None
            continue
        handle = route.loaded.handle
        try:
            caps[name] = pool.compute.submit(
                measure, handle, route.base, [handle.encode(p) for p in prompts[: max(rows)]], rows
            ).result()
        except ValueError as e:
            console.print(f"[yellow]note:[/yellow] {name}: no batching cap ({e})", highlight=False)
            caps[name] = None
    return caps


def cap_table(gains: list[GainAgainstCap], max_batch: int) -> FittedTable:
    """Per model and loaded level: tokens/s over solo (the gain), the caps at that many rows (one forward's, a whole
    decode's), and the gain's share of each."""
    table = FittedTable(
        "batching gain against the cap (n rows' forward, and n rows' whole decode, vs one row's, timed in process)",
        [
            Column("model"),
            Column("in flight", "right"),
            Column("gain (tokens/s vs solo)", "right"),
            Column("cap", "right"),
            Column("gain / cap", "right"),
            Column("decode cap", "right"),
            Column("gain / decode cap", "right"),
        ],
    )
    for g in gains:
        rows = min(g.concurrency, max_batch)
        cap = f"{significant(g.cap)}x at {rows} rows" if g.cap else "unknown"
        decoded = f"{significant(g.decode_cap)}x" if g.decode_cap else "unknown"
        table.add_row(
            g.served_as,
            str(g.concurrency),
            f"{significant(g.gain)}x" if g.gain is not None else NONE,
            cap,
            percent(g.share),
            decoded,
            percent(g.decode_share),
        )
    return table


def plot_curve(records: list[ServingRecord], plot: Path | None) -> Path | None:
    """Tokens/s against p95 per model (`evals.plots.plot_load_curve`) at `plot`, else under the state folder;
    None (and a note) when no cell has both measurements."""
    from evals.plots import plot_load_curve
    from evals.sweep import timestamped_folder
    from models.state import state_dir

    path = plot or timestamped_folder(state_dir() / "loadtests", "load") / "curve.png"
    try:
        plot_load_curve(records, path)
    except ValueError as e:
        console.print(f"[yellow]not plotted:[/yellow] {e}", highlight=False)
        return None
    console.print(f"throughput vs p95 plot: {path}", highlight=False)
    return Path(path)


def entry_endpoint(entry_id: str) -> tuple[str, str, str]:
    """(base URL, served model name, key) of an api catalog entry; LoadTestError naming --entry or the key variable."""
    from evals.loadtest import LoadTestError
    from models.adapters import APIAdapter, NotEvaluable
    from models.catalog import CatalogError, load_catalog

    try:
        found = load_catalog().get(entry_id)
    except CatalogError as e:
        raise LoadTestError(f"--entry {entry_id}: {e}") from None
    if not found.is_api:
        raise LoadTestError(f"--entry {entry_id}: kind {found.kind!r}, not api; serve it (no --url) to load it")
    adapter = APIAdapter(found)
    try:
        return adapter.base_url, adapter.api_model, adapter.api_key()
    except NotEvaluable as e:
        raise LoadTestError(f"--entry {entry_id}: {e}") from None


def run_with_progress(spec: LoadSpec, prompts: list[str], apart: bool = False) -> LoadResult:
    """`run_load` with a progress bar; `apart`: from a child process (`evals.load_process`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evals.load_process import run_load_apart
    from evals.loadtest import levels, run_load
    from flows.progress import report, set_reporter

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("connecting", total=len(spec.models) * len(levels(spec)) * spec.requests)

        def show(kind: str, info: dict[str, Any]) -> None:
            if kind == "cell":
                progress.update(bar, description=f"{info['model']} at {info['concurrency']} in flight ({info['mode']})")
            elif kind == "answer":
                progress.advance(bar)

        set_reporter(show)
        try:
            load = run_load_apart if apart else run_load
            return load(spec, prompts, on_event=lambda kind, info: report(kind, **info))
        finally:
            set_reporter(None)


def log_records(records: list[ServingRecord], plot: Path | None = None) -> tuple[list[ServingRecord], list[str]]:
    """Log each record naming a registered version to MLflow, and the curve `plot` drawn from them beside them;
    (records with run ids where logged, reasons skipped)."""
    from registry import Registry
    from registry.connection import RegistryError
    from registry.loadtests import log_load_curve, log_serving_record

    logged: list[ServingRecord] = []
    skipped: list[str] = []
    try:
        registry = Registry()
    except RegistryError as e:
        return records, [f"the registry cannot be reached ({e})"]
    for record in records:
        if not record.version:
            skipped.append(f"{record.served_as} at {record.concurrency}: the server named no registered version")
            logged.append(record)
            continue
        try:
            logged.append(log_serving_record(registry, record))
        except RegistryError as e:
            skipped.append(f"{record.served_as} at {record.concurrency}: {e}")
            logged.append(record)
    if plot is not None and any(r.run_id for r in logged):
        try:
            log_load_curve(registry, logged, plot)
        except RegistryError as e:
            skipped.append(f"the throughput vs p95 plot: {e}")
    return logged, skipped


def results_table(result: LoadResult, records: list[ServingRecord]) -> FittedTable:
    """One row per (model, concurrency); `vs <last model>` is tokens/s over the last --model's at that level."""
    reference = result.spec.models[-1] if len(result.spec.models) > 1 else None
    rates = {(r.served_as, r.concurrency): r.tokens_per_s for r in records}
    columns = [
        Column("model"),
        Column("served", drop=3),
        Column("in flight", "right"),
        Column("requests", "right", drop=4),
        Column("p50 (ms)", "right", drop=2),
        Column("p95 (ms)", "right"),
        Column("p99 (ms)", "right", drop=2),
        Column("TTFB p50 (ms)", "right", drop=1),
        Column("tokens/s", "right"),
        Column("req/s", "right"),
        Column("errors", "right"),
        Column("same as solo", "right"),
    ]
    if reference:
        columns.append(Column(f"tokens/s vs {reference}", "right"))
    title = f"load test: {result.spec.requests} requests per level"
    if result.spec.duration_s:
        title += f" (at most {result.spec.duration_s:g} s each)"
    table = FittedTable(title, columns)
    for r in records:
        served = f"{r.model}/{r.version}" if r.version else r.model
        ttfb = milliseconds(r.ttfb_p50_s) + ("" if r.streamed else " (no stream)")
        same = "solo" if r.concurrency == 1 else percent(r.same_answer_share)
        row = [
            r.served_as,
            served,
            str(r.concurrency),
            str(r.requests),
            milliseconds(r.latency_p50_s),
            milliseconds(r.latency_p95_s),
            milliseconds(r.latency_p99_s),
            ttfb,
            significant(r.tokens_per_s),
            significant(r.requests_per_s),
            f"{round(r.error_rate * r.requests)} ({percent(r.error_rate)})",
            same,
        ]
        if reference:
            base = rates.get((reference, r.concurrency))
            row.append(f"{significant(r.tokens_per_s / base)}x" if r.tokens_per_s is not None and base else NONE)
        table.add_row(*row)
    return table


def register(app: typer.Typer) -> None:
    app.command("loadtest")(loadtest_command)
