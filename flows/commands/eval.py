"""`unmask eval`: run a sweep (or one GSM8K-format task file) over models; print records, write files."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flows.commands import options
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error
from gates.readable import NONE, milliseconds, percent, significant

if TYPE_CHECKING:
    from evals.pipeline import SweepPlan, SweepPoint
    from evals.records import EvalRecord
    from evals.sweep import SweepResult, SweepSpec

console = table_console(180)


def eval_command(
    model: list[str] = typer.Option(
        None, "--model", "-m", help="Model id or folder; repeat for several (default: the sweep's models)."
    ),
    sweep: Path = typer.Option(None, "--sweep", "-s", help="Sweep YAML (default: evals/sweeps/default.yaml)."),
    tasks: Path = typer.Option(
        None, "--tasks", "-t", help="GSM8K-format JSONL file (question, answer ending in '#### N')."
    ),
    limit: int = typer.Option(None, callback=options.positive, help="Use the first N items of --tasks."),
    steps: int = typer.Option(
        None, callback=options.positive, help="With --tasks and no --sweep: sampling steps (default: gen_length)."
    ),
    gen_length: int = typer.Option(
        None, "--gen-length", callback=options.positive, help="With --tasks and no --sweep: positions to generate."
    ),
    block_length: int = typer.Option(
        None, "--block-length", callback=options.positive, help="With --tasks and no --sweep: block width."
    ),
    batch_size: int = typer.Option(
        None, "--batch-size", callback=options.positive, help="Batch size for the throughput pass."
    ),
    threads: int = typer.Option(
        None,
        "--threads",
        callback=options.threads,
        help="torch CPU threads while measuring (default: the sweep's, else $UNMASK_THREADS, else 1).",
    ),
    out: Path = typer.Option(None, "--out", "-o", help="Output folder (default: <state>/evals/<sweep>-<time>)."),
    repro: bool = typer.Option(True, "--repro/--no-repro", help="Run the reproducibility probe per model."),
    plot: bool = typer.Option(True, "--plot/--no-plot", help="Write quality-vs-latency plots."),
    executor: str = typer.Option(
        "local",
        "--executor",
        callback=options.executor,
        help="Where the sweep's cells run: local (this process), dask (prefect-dask) or ray (prefect-ray).",
    ),
    executor_address: str = typer.Option(
        None,
        "--executor-address",
        help="The cluster: a Dask scheduler "
        "(tcp://host:8786) or a Ray head (host:6379, ray://head:10001); default: a local one.",
    ),
    gpus_per_cell: float = typer.Option(
        0,
        "--gpus-per-cell",
        min=0,
        help="GPUs each cell asks its executor for (Dask worker resource GPU, Ray num_gpus).",
    ),
) -> None:
    """Evaluate models under a sweep of decoding settings; records are validated and saved as they finish."""
    from evals.sweep import (
        SweepError,
        SweepSpec,
        TaskSpec,
        catalog_settings,
        check_model_ref,
        default_sweep_path,
        load_sweep,
        timestamped_folder,
    )
    from evals.validation import TaskDataError
    from models.state import state_dir

    try:
        if sweep is None and tasks is not None:
            given = {
                k: v for k, v in {"steps": steps, "gen_length": gen_length, "block_length": block_length}.items() if v
            }
            settings = catalog_settings(model[0]) if model and len(model) == 1 else {}
            if "gen_length" in given:  # a new length invalidates the catalog's block and steps
                settings = {k: v for k, v in settings.items() if k not in ("gen_length", "block_length", "steps")}
            settings |= given
            if "gen_length" in settings and "block_length" not in settings:
                settings["block_length"] = settings["gen_length"]
            spec = SweepSpec(
                name=tasks.stem, models=list(model or ["tiny-llada"]), tasks=[], base=settings, source=str(tasks)
            )
        else:
            spec = load_sweep(sweep or default_sweep_path())
        if tasks is not None:
            if not tasks.is_file():
                raise SweepError(f"{tasks}: task file not found")
            spec.tasks = [TaskSpec(file=str(tasks), limit=limit)]
        if model:
            spec.models = list(model)
        for ref in model or []:
            check_model_ref(ref, lambda _key, expected: SweepError(f"--model {expected}"))
        if batch_size:
            spec.measure["batch_size"] = batch_size
        spec.threads, threads_from = options.threads_rule(threads, spec.threads)
        measure_cells = None
        if executor not in ("local", "threads"):  # the cells go to a cluster through a Prefect flow
            os.environ.setdefault("PREFECT_LOGGING_LEVEL", "CRITICAL")  # before Prefect is imported
            from flows.cells import fan_out

            measure_cells = fan_out(executor, executor_address, gpus_per_cell)
    except (SweepError, ValueError, typer.BadParameter) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    console.print(f"torch threads: {spec.threads} ({threads_from})", highlight=False)
    if measure_cells is not None:
        console.print(f"cells run on: {executor} ({executor_address or 'a local cluster'})", highlight=False)
    folder = out or timestamped_folder(state_dir() / "evals", spec.name)
    try:
        result = run_with_progress(spec, folder, measure_cells)
    except (SweepError, TaskDataError, ValueError, OSError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    console.print(records_table(result.records))
    for message in result.failures:
        console.print(f"[red]failed:[/red] {message}", markup=True, highlight=False)
    if result.skipped:
        console.print(f"[yellow]skipped {len(result.skipped)} grid point(s) with no valid SamplerConfig[/yellow]")
    finish(spec, result, repro, plot)
    console.print(
        f"records: {folder}/records.parquet, records.csv ({len(result.records)} records, "
        f"{sum(r.valid is False for r in result.records)} invalid)"
    )
    if not result.records:
        raise typer.Exit(1)


def run_with_progress(
    spec: SweepSpec,
    folder: Path,
    measure_cells: Callable[[list[SweepPlan]], Iterable[tuple[SweepPoint, Any]]] | None = None,
) -> SweepResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from evals.sweep import run_sweep

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        bar = progress.add_task("loading", total=None)
        point = [""]  # the point being measured, for the item count inside it

        def on_event(kind: str, info: dict[str, Any]) -> None:
            if kind == "plan":
                progress.update(bar, total=info["items"] * 1, description=f"{spec.name}: {info['total']} points")
            elif kind == "point":
                cfg = " ".join(f"{k}={v}" for k, v in info["settings"].items() if k != "gen_length")
                point[0] = f"{info['model']} {info['task']} {cfg}"
                progress.update(bar, description=point[0])
            elif kind == "request":
                progress.advance(bar)
            elif kind == "item":  # inside the point: which item of how many
                progress.update(bar, description=f"{point[0]}, item {info['done']}/{info['total']}")
            elif kind == "failure":
                progress.console.print(f"[red]failed:[/red] {info['message']}", highlight=False)

        return run_sweep(spec, folder, on_event=on_event, measure_cells=measure_cells)


def finish(spec: SweepSpec, result: SweepResult, repro: bool, plot: bool) -> None:
    """Plots, license checks and reproducibility verdicts (evals.evidence), printed as they come."""
    from evals.evidence import gather_evidence

    def show(kind: str, value: Any) -> None:  # a LicenseResult or a ReproducibilityResult, as `kind` says
        if kind == "license":
            findings = f" (findings: {'; '.join(value.findings)})" if value.findings else ""
            console.print(
                f"license {value.candidate}: {value.tier} [{value.expression}]{findings}", highlight=False, markup=False
            )
        else:
            state = "[green]reproducible[/green]" if value.reproducible else "[red]NOT reproducible[/red]"
            why = f" - {'; '.join(value.differences)}" if value.differences else ""
            console.print(f"reproducibility {value.candidate}: {state}{why}", highlight=False)

    evidence = gather_evidence(spec, result, plots=plot, reproducibility=repro, on_result=show)
    for path in evidence.plots:
        console.print(f"plot: {path}", highlight=False)
    for problem in evidence.problems:
        console.print(f"[yellow]{problem}[/yellow]", highlight=False)


def records_table(records: list[EvalRecord]) -> FittedTable:
    from evals.plots import point_label

    # at 80 columns the rarely read ones go first: first-block latency, the throughput pass, p50
    table = FittedTable(
        "eval records",
        [
            Column("candidate"),
            Column("task"),
            Column("config", wrap=True),
            Column("accuracy", "right"),
            Column("p50 latency (ms)", "right", drop=4),
            Column("p95 latency (ms)", "right"),
            Column("first block (ms)", "right", drop=6),
            Column("items/s", "right", drop=5),
            Column("tokens/s", "right", drop=3),
            Column("tokens per forward", "right", drop=2),
            Column("forward passes", "right", drop=2),
            Column("peak memory (MB)", "right", drop=1),
            Column("errors", "right"),
            Column("valid", "right"),
        ],
    )
    for r in records:
        table.add_row(
            r.candidate,
            r.task,
            point_label(r) or NONE,
            percent(r.accuracy),
            milliseconds(r.latency_p50_s),
            milliseconds(r.latency_p95_s),
            milliseconds(r.time_to_first_block_s),
            significant(r.throughput_items_per_s),
            significant(r.tokens_per_s),
            significant(r.tokens_per_forward),
            significant(r.nfe),
            significant(r.peak_mem_mb),
            str(r.errors),
            {True: "[green]yes[/green]", False: "[red]no[/red]", None: NONE}[r.valid],
        )
    return table


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
