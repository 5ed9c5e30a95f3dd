"""`unmask bench`: every fast-decoding mode side by side on held-out prompts, in one run."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flows.commands import options
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error
from flows.interrupt import INTERRUPT
from gates.readable import NONE, percent, significant

if TYPE_CHECKING:
    from evals.bench import BenchReport, BenchRow, BenchSetup, Variant
    from evals.benchmark import BenchmarkRecord
    from models.adapters import APIAdapter, ModelHandle

console = table_console(220)


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"{option} must be comma-separated integers, got {text!r}") from None


def render(report: BenchReport) -> FittedTable:
    # at 80 columns memory goes first (one model, one size), then what the speedup sums up: the rates, the calls
    several = len({r.batch for r in report.rows}) > 1
    table = FittedTable(
        report.title,
        [
            Column("config"),
            Column("gen length", "right"),
            *([Column("batch", "right")] if several else []),
            *(Column(f"accuracy {t}", "right") for t in report.setup.tasks),
            Column("forward passes", "right", drop=3),
            Column("sequential calls", "right", drop=4),
            Column("tokens per forward", "right", drop=2),
            Column("tokens/s (padded)", "right", drop=6),
            Column("tokens/s (text)", "right", drop=5),
            Column("speedup", "right"),
            Column("speedup 95% interval", "right", drop=9),
            Column("peak memory (MB)", "right", drop=7),
            Column("draft acceptance", "right", drop=1),
            Column("computed peak (MB)", "right", drop=8),
            Column(f"same text as {report.reference}", "right"),
        ],
        title_justify="left",
    )
    for r in report.rows:
        same = None if r.same_text_as_vanilla is None else percent(r.same_text_as_vanilla)
        table.add_row(
            r.config + (f" [{r.provider}]" if r.provider else ""),
            str(r.gen_length),
            *([str(r.batch)] if several else []),
            *(percent(r.accuracy_by_task.get(t, 0.0)) for t in report.setup.tasks),
            significant(r.nfe),
            significant(r.sequential_calls),
            significant(r.tokens_per_forward),
            significant(r.tokens_per_s),
            significant(r.text_tokens_per_s),
            NONE if r.speedup_vs_vanilla is None else f"{significant(r.speedup_vs_vanilla)}x",
            interval_text(r, report.reference),
            significant(r.peak_mem_mb),
            percent(r.acceptance_rate),
            NONE if r.computed_peak_mb is None else significant(r.computed_peak_mb),
            same or NONE,
        )
    return table


def interval_text(row: BenchRow, reference: str) -> str:
    """`2.10–2.50x`: the 95% interval over the rounds of the row's speedup over `reference` (none for itself)."""
    if row.speedup_interval is None or row.config == reference:
        return NONE
    low, high = row.speedup_interval
    return f"{significant(low)}–{significant(high)}x"


def write_json(report: BenchReport, path: Path) -> None:
    """Rewrite `path` whole through a temporary file, so a reader (or a stopped run) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    tmp.replace(path)


def _clock(start: float) -> str:
    elapsed = int(time.monotonic() - start)
    return f"{elapsed // 60}:{elapsed % 60:02d}"


@contextmanager
def progress_reporter(
    total: int, rows: int = 0, reference: str = "vanilla"
) -> Iterator[tuple[Callable[[str], None], Callable[[BenchRow], None]]]:
    """(`tick(label)` per pass, `row_done(row)` per finished row): rich's bar on a terminal; piped, one flushed
    line on stderr per pass and one per finished row (a bar that redraws in place shows nothing in a log, and
    a long run would look hung)."""
    if console.is_terminal:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task("bench", total=total)
            yield (lambda label: progress.update(bar, advance=1, description=label)), (lambda row: None)
        return
    start, done, finished = time.monotonic(), 0, 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        print(f"bench pass {done}/{total} [{_clock(start)}] {label}", file=sys.stderr, flush=True)

    def row_done(row: BenchRow) -> None:
        nonlocal finished
        finished += 1
        speedup = (
            NONE
            if row.speedup_vs_vanilla is None
            else f"{significant(row.speedup_vs_vanilla)}x ({interval_text(row, reference)}) {reference}"
        )
        print(
            f"bench row {finished}/{rows} [{_clock(start)}] {row.config} @ {row.gen_length} batch {row.batch}: "
            f"accuracy {percent(row.accuracy)}, {speedup}, {significant(row.text_tokens_per_s)} text tokens/s, "
            f"{significant(row.tokens_per_forward)} tokens per forward",
            file=sys.stderr,
            flush=True,
        )

    yield tick, row_done


def bench_command(
    model: list[str] = typer.Option(
        None,
        "--model",
        "-m",
        help="Diffusion model folder, or a bundled/catalog id (default tiny-llada); with --concurrency a registered "
        "model or alias to serve, repeatable.",
    ),
    ar_model: str = typer.Option(
        "tiny-ar", "--ar-model", help="AR reference model ('' to skip the AR row); with --concurrency the fallback."
    ),
    concurrency: str = typer.Option(
        None,
        "--concurrency",
        "-c",
        help="The benchmark record instead of the rows: serve --model and --ar-model here and measure them paired "
        "at these requests in flight (comma-separated, e.g. 1,16): accuracy, tokens/s, tokens per forward, TTFT, "
        "p50 and p99, each with its 95% interval, the candidates beside the fallback.",
    ),
    requests: int = typer.Option(
        32, "--requests", "-n", callback=options.positive, help="With --concurrency: requests per model and level."
    ),
    rounds: int = typer.Option(
        4, "--rounds", help="With --concurrency: rounds per level, the models' blocks interleaved (at least 2)."
    ),
    task: str = typer.Option("arith", "--task", help="With --concurrency: the task the prompts and targets come from."),
    gen_lengths: str = typer.Option(
        "64,128", "--gen-lengths", callback=options.positive_ints, help="Comma-separated generation lengths."
    ),
    batch: str = typer.Option(
        None,
        "--batch",
        callback=options.positive_ints,
        help="Comma-separated prompts per decode call, one set of rows each (e.g. 1,16; at most "
        "--prompts); default: each task's prompts in one call.",
    ),
    tolerance: float = typer.Option(
        1.0,
        "--tolerance",
        help="Accuracy points below vanilla a config may lose and still be the verdict's best (0-100).",
    ),
    block_length: int = typer.Option(
        32, "--block-length", callback=options.positive, help="Semi-autoregressive block width."
    ),
    prompts: int = typer.Option(4, "--prompts", callback=options.positive, help="Held-out test prompts per task."),
    reps: int = typer.Option(
        3, "--reps", callback=options.positive, help="Timed repetitions (>= 3); medians are reported."
    ),
    warmup: int = typer.Option(1, "--warmup", callback=options.non_negative, help="Untimed warm-up passes per row."),
    threads: int = typer.Option(
        None,
        "--threads",
        callback=options.threads,
        help="torch (and onnxruntime) threads (default: $UNMASK_THREADS, else 1).",
    ),
    seed: int = typer.Option(0, help="Seed for the prompt draw and the sampler."),
    configs: str = typer.Option("", "--configs", help="Comma-separated subset of rows (default: all)."),
    device: str = typer.Option("cpu", callback=options.device, help="cpu or cuda."),
    json_path: Path = typer.Option(
        None,
        "--json",
        callback=options.output_path,
        help='Also write the rows as JSON here, rewritten after each finished row ("complete": false until the end).',
    ),
    plot: Path = typer.Option(
        None,
        "--plot",
        help="Also draw accuracy vs text tokens/s per config, the AR twin as a "
        "star, one panel per generation length, as a PNG here.",
    ),
    memory_budget: str = typer.Option(
        None,
        "--memory-budget",
        help="Peak bytes a row's decode may use, e.g. 8GiB: a "
        "row whose computed peak (sampler/memory.footprint, its batch at the longest "
        "gen length) exceeds it is refused before anything decodes (default: the "
        "device's free memory once the models are loaded).",
    ),
) -> None:
    """Measure a diffusion model's decoding settings and the AR twin side by side: for masked diffusion (LLaDA)
    vanilla, parallel, cached, speculative, early-exit and ONNX Runtime rows; for block diffusion (DiffusionGemma)
    denoising steps, entropy bound and early stop against the most exact setting."""
    from evals.bench import MemoryAdmissionError, bench_report, planned_rows, row_groups, row_set, run_bench
    from sampler.memory import available_bytes

    names = list(model or ["tiny-llada"])
    if concurrency is not None:
        _benchmark(names, ar_model, concurrency, requests, rounds, task, json_path)
        return
    if len(names) > 1:
        print_error(console, f"--model: {len(names)} given; the rows measure one model (several with --concurrency)")
        raise typer.Exit(2)
    budget = _memory_budget(memory_budget)
    variants, setup, threads_from, loaded = _prepared(
        names[0],
        gen_lengths,
        batch,
        tolerance,
        block_length,
        prompts,
        reps,
        warmup,
        threads,
        seed,
        configs,
        device,
        plot,
    )
    console.print(f"torch threads: {setup.threads} ({threads_from})", highlight=False)
    ar_loaded = _ar_reference(ar_model, variants, device)
    setup = replace(setup, memory_budget=budget if budget is not None else available_bytes(device))  # weights resident
    runnable = [v for v in variants if v.kind != "ar" or ar_loaded is not None]
    runs = sum(len(group) for group in row_groups(runnable, setup))
    passes = len(setup.gen_lengths) * runs * (setup.warmup + setup.reps)
    total_rows = planned_rows(runnable, setup)
    ar_skipped = len(runnable) < len(variants)
    rows: list[BenchRow] = []

    def keeper(row_done: Callable[[BenchRow], None]) -> Callable[[BenchRow], None]:
        def keep(row: BenchRow) -> None:
            rows.append(row)
            if json_path is not None:  # the file first: a line that says a row is done finds it there
                write_json(bench_report(loaded, setup, rows, ar_skipped=ar_skipped, complete=False), json_path)
            row_done(row)

        return keep

    try:
        with progress_reporter(passes, total_rows, row_set(loaded.kind).reference) as (tick, row_done):
            report = run_bench(loaded, setup, variants, ar_loaded=ar_loaded, tick=tick, on_row=keeper(row_done))
    except MemoryAdmissionError as e:  # raised before the first pass: nothing decoded, nothing written
        print_error(console, f"--memory-budget: {e}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        if rows:
            console.print(render(bench_report(loaded, setup, rows, ar_skipped=ar_skipped, complete=False)))
        kept = (
            f'; {json_path} holds them ("complete": false)'
            if json_path is not None and rows
            else "; nothing was written"
            if json_path is not None
            else ""
        )
        INTERRUPT.announce(f"interrupted: {len(rows)} of {total_rows} rows finished{kept}")  # said once
        raise typer.Exit(INTERRUPT.exit_code) from None
    _publish(report, json_path, plot)


def _benchmark(
    names: list[str], fallback: str, concurrency: str, requests: int, rounds: int, task: str, json_path: Path | None
) -> None:
    """The benchmark record: `names` and the `fallback` served here, their requests interleaved round by round at
    each level (a paired load test), every answer scored; one table per level, logged to MLflow as serving records
    against the versions that answered (the Quality vs latency page draws them)."""
    from evals.benchmark import benchmark_records
    from evals.loadtest import LoadSpec, LoadTestError, check_spec, round_sizes
    from flows.commands.loadtest import measure_load, parse_levels, save_results

    try:
        if not fallback:
            raise LoadTestError("--ar-model: the benchmark record sets the candidates beside the AR fallback; name it")
        served = tuple(dict.fromkeys([*names, fallback]))
        if len(served) < 2:
            raise LoadTestError(f"--model: name a candidate other than the fallback {fallback}")
        levels = parse_levels(concurrency)
        spec = LoadSpec(base_url="http://127.0.0.1/v1", models=served, concurrency=levels, requests=requests)
        check_spec(replace(spec, rounds=max(rounds, 1)))
        if rounds < 2:
            raise LoadTestError(f"--rounds {rounds}: the intervals are read from the rounds; give at least 2")
        short = [c for c in levels if len(round_sizes(requests, c, rounds)) < 2]
        if short:
            raise LoadTestError(
                f"--requests {requests}: at {short[0]} in flight that is one round (a round fills every worker); "
                f"give at least {2 * short[0]}"
            )
        measured = measure_load(replace(spec, rounds=rounds), task, here=True, caps=False)
    except LoadTestError as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    logged = save_results(measured.records, None, log=True)
    benchmarks = [b for b in benchmark_records(logged, lambda r: r.served_as == fallback) if b.concurrency in levels]
    for b in benchmarks:
        console.print(benchmark_table(b, requests, rounds))
    for note in measured.result.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)
    for cell in measured.result.cells:
        for message in cell.error_messages():
            console.print(f"[red]errors[/red] {cell.model} at {cell.concurrency}: {message}", highlight=False)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        document = {"benchmarks": [b.to_dict() for b in benchmarks], "notes": measured.result.notes}
        json_path.write_text(json.dumps(document, indent=2))
        console.print(f"wrote {json_path}")


def benchmark_table(benchmark: BenchmarkRecord, requests: int, rounds: int) -> FittedTable:
    """One benchmark record: a row per side, the fallback last (registry.views.benchmark_frame's words)."""
    from evals.loadtest import round_sizes
    from registry.views import BENCHMARK_COLUMNS, benchmark_frame

    frame = benchmark_frame([benchmark])
    shown = [c for c in BENCHMARK_COLUMNS if c not in ("host", "in flight", "task", "when", "paired run")]
    drops = {"TTFT p50 (ms)": 3, "p50 (ms)": 2, "tokens per forward": 1, "vs fallback (pts)": 4, "errors": 5}
    columns = [Column(c, "left" if c in ("model", "role") else "right", drop=drops.get(c, 0)) for c in shown]
    n = len(round_sizes(requests, benchmark.concurrency, rounds))
    title = (
        f"benchmark record: {benchmark.host}, {benchmark.concurrency} in flight, {benchmark.task} "
        f"({benchmark.metric}), {requests} requests per model in {n} interleaved rounds, 95% intervals "
        f"(paired run {benchmark.paired_run})"
    )
    table = FittedTable(title, columns)
    for row in frame[shown].astype(str).values.tolist():
        table.add_row(*row)
    return table


def _prepared(
    model: str,
    gen_lengths: str,
    batch: str | None,
    tolerance: float,
    block_length: int,
    prompts: int,
    reps: int,
    warmup: int,
    threads: int | None,
    seed: int,
    configs: str,
    device: str,
    plot: Path | None,
) -> tuple[list[Variant], BenchSetup, str, ModelHandle | APIAdapter]:
    """The rows asked for, the checked setup, where its thread count came from and the loaded model; exit 2 with
    the reason when any of them is wrong."""
    from evals.bench import BenchSetup, row_set
    from models import CheckpointError, load
    from sampler.decode import check_fits

    try:
        threads, threads_from = options.threads_rule(threads)
        setup = BenchSetup(
            gen_lengths=_ints(gen_lengths, "--gen-lengths"),
            block_length=block_length,
            prompts=prompts,
            reps=reps,
            warmup=warmup,
            threads=threads,
            seed=seed,
            batch_sizes=_ints(batch, "--batch") if batch else (),
            tolerance=tolerance / 100,
        )
        if plot is not None and plot.suffix.lower() != ".png":
            raise ValueError(f"--plot {plot}: the plot is written as PNG; give a path ending in .png")
        loaded = load(model, device=device)
        rows = row_set(loaded.kind)  # the rows of this model's kind, and how it cuts a canvas
        variants = rows.named([c.strip() for c in configs.split(",") if c.strip()] or None)
        setup = rows.fitted(loaded, setup)
        setup.check()
        check_fits(loaded, 0, max(setup.gen_lengths))  # refused now, not after the shorter lengths ran
    except (CheckpointError, ValueError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    return variants, setup, threads_from, loaded


def _memory_budget(memory_budget: str | None) -> int | None:
    """`--memory-budget` in bytes, parsed as `unmask serve` parses it (None: not given); exit 2 naming the flag when
    it is not a size, before any model loads."""
    from sampler.memory import parse_bytes

    try:
        return parse_bytes(memory_budget) if memory_budget is not None else None
    except ValueError as e:
        print_error(console, f"--memory-budget: {e}")
        raise typer.Exit(2) from None


def _ar_reference(ar_model: str, variants: list[Variant], device: str) -> ModelHandle | APIAdapter | None:
    """The AR twin the `ar` row decodes with, or None (not asked for, or it does not load: a note says why)."""
    from models import CheckpointError
    from models.loading import load

    if not ar_model or not any(v.kind == "ar" for v in variants):
        return None
    try:
        return load(ar_model, device=device)
    except (CheckpointError, ValueError) as e:
        console.print(f"[yellow]note:[/yellow] AR row skipped ({e})")
        return None


def _publish(report: BenchReport, json_path: Path | None, plot: Path | None) -> None:
    """The table, the one-line summaries, and the JSON and plot when asked for."""
    from evals.bench_summary import report_lines

    console.print(render(report))
    for line in report_lines(report):  # one line each, however long: a log or a grep reads it whole
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if json_path is not None:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot is not None:
        from evals.plots import plot_bench

        console.print(f"wrote {plot_bench(report, plot)}")


# The help's paragraphs are one line each: rich would keep a docstring's line breaks mid-sentence.
BENCH_HELP = "\n\n".join(
    [
        bench_command.__doc__ or "",
        "The defaults (every default row at gen lengths 64 and 128, 4 prompts per task, 3 reps after 1 warm-up, "
        "1 thread) take a few minutes on two CPU cores (2 min 7 s of CPU, 5 min 3 s of wall clock on a two-core "
        "machine "
        "shared with other jobs); "
        "--gen-lengths 128,256,512 --prompts 32 takes over half an hour.",
        "Under the table, one verdict line per generation length: the fastest config within --tolerance accuracy "
        "points of vanilla, its speedup over vanilla and its text tokens/s against the AR twin at each --batch, and "
        "AUP (accuracy under parallelism over tokens per forward). See docs/bench.md for every column.",
        "Piped, one progress line per pass and one per finished row go to stderr. Ctrl-C keeps the rows finished "
        "so far in --json.",
    ]
)


def register(app: typer.Typer) -> None:
    app.command("bench", help=BENCH_HELP)(bench_command)
