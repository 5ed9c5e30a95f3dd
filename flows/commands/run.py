"""`unmask run`: the main job. The gate review flow over the bundled models, then a scorecard.

Everything is embedded: MLflow on SQLite under the state folder, Prefect in local mode (its temporary
server booted as the command starts, `flows.local_prefect`; nothing to start by hand). A second run
reuses every measured point, and loads no model (`evals.step_cache`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from flows.commands.banner import print_demo_banner
from flows.commands.options import threads as threads_option
from flows.commands.options import threads_rule
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

    from evals.sweep import SweepSpec
    from flows.evaluate import EvaluationOptions
    from gates.decision import Decision

console = table_console(160)


def run_command(
    sweep: Path = typer.Option(None, "--sweep", "-s", help="Sweep YAML (default: evals/sweeps/default.yaml)."),
    model: list[str] = typer.Option(None, "--model", "-m", help="Model id or folder; repeat (default: the sweep's)."),
    task_runner: str = typer.Option(
        "threads",
        "--executor",
        "--task-runner",
        help="Where sweep cells run: local (threads), dask (prefect-dask) or ray (prefect-ray).",
    ),
    dask_address: str = typer.Option(
        None,
        "--executor-address",
        "--dask-address",
        help="The cluster: a Dask scheduler (tcp://host:8786) or Ray (ray://head:10001); default: a local one.",
    ),
    gpus_per_cell: float = typer.Option(
        0, "--gpus-per-cell", min=0, help="GPUs each cell asks for (Dask worker resource GPU, Ray num_gpus)."
    ),
    policy: Path = typer.Option(None, "--policy", help="Stage policy YAML (default: gates/policy.yaml)."),
    reproducibility: bool = typer.Option(True, "--repro/--no-repro", help="Run the reproducibility probe."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure every point again; ignore cached records."),
    speed_rounds: int = typer.Option(
        4,
        "--speed-rounds",
        min=2,
        help="Rounds of the paired speed measurement against the fallback (what settles an inconclusive speedup "
        "gate: it names the rounds needed).",
    ),
    items: int = typer.Option(
        None,
        "--items",
        min=1,
        help="Measure every task on at least N items (the sweep's "
        "`n` raised; what settles an inconclusive data_validity gate).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show Prefect's own log lines."),
    threads: int = typer.Option(
        None,
        "--threads",
        callback=threads_option,
        help="torch CPU threads while measuring (default: the sweep's, else $UNMASK_THREADS, else 1).",
    ),
    demo: bool = typer.Option(
        False,
        "--demo",
        help="A demonstration: the demo sweep and policy (unless given) and "
        "the registry marked as a demo, so the demo policy may move its production.",
    ),
) -> None:
    """Evaluate the candidates and the AR fallback, judge every stage's gates, print the scorecard."""
    # Prefect reads its settings on import: quiet it unless asked, before anything imports it.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "CRITICAL")
    from evals.sweep import default_sweep_path
    from flows.local_prefect import LocalPrefect, api, stopped_if_refused
    from models.state import state_dir

    if demo:
        sweep = sweep or default_sweep_path().with_name("demo.yaml")
        policy = policy or Path(__file__).resolve().parents[2] / "gates" / "demo-policy.yaml"
    local_prefect = LocalPrefect.boot()  # Prefect's server boots on the other core while the options are checked
    with stopped_if_refused(local_prefect):
        spec, sweep_path, options, threads_from = _checked_options(
            sweep or default_sweep_path(),
            model,
            task_runner,
            dask_address,
            gpus_per_cell,
            policy,
            reproducibility,
            remeasure,
            items,
            threads,
            speed_rounds,
        )
    models = list(model or spec.models)
    console.print(
        f"unmask run: {', '.join(models)} under sweep [bold]{spec.name}[/bold] "
        f"(state: {state_dir()}, task runner: {options.task_runner}, torch threads: {options.threads} "
        f"from {threads_from})",
        highlight=False,
    )
    if items:
        console.print(f"every task on at least {items} items (sweep: {sweep_path})", highlight=False)
    if demo:
        mark_demo(console)
    started = time.perf_counter()
    _while_prefect_boots()
    with api(local_prefect, warn=lambda line: console.print(line, highlight=False)):
        result = review_with_progress(models, str(sweep_path), options)
    _print_summary(result, options, models, time.perf_counter() - started)


def _while_prefect_boots() -> None:
    """What the flows need first, done while the local Prefect server boots on the other core instead of after
    it answers: the review flow's imports (scoring's among them), and the embedded SQLite store opened once
    (MLflow keeps the engine and its mapped tables for the process; 0.7 s on two cores). A store that cannot be
    opened is left for the flows to report, as they do (the run keeps its records in the outbox)."""
    import flows.review  # noqa: F401
    from registry.connection import resolve_tracking_uri

    tracking_uri = resolve_tracking_uri()
    if tracking_uri.startswith("sqlite:///"):
        from mlflow.exceptions import MlflowException

        from registry import Registry

        try:
            Registry(tracking_uri).client.search_registered_models(max_results=1)
        except (MlflowException, OSError):
            pass


def _checked_options(
    sweep_path: str | Path,
    model: list[str] | None,
    task_runner: str,
    dask_address: str | None,
    gpus_per_cell: float,
    policy: Path | None,
    reproducibility: bool,
    remeasure: bool,
    items: int | None,
    threads: int | None,
    speed_rounds: int = 4,
) -> tuple[SweepSpec, str | Path, EvaluationOptions, str]:
    """The sweep, its path (with `items`, a copy with `n` raised), the evaluation options and where the thread
    count came from; exit 2 naming what is wrong, before anything is measured."""
    from evals.sweep import SweepError, check_model_ref, load_sweep, with_items
    from flows.evaluate import EvaluationOptions
    from flows.runners import EXECUTORS, make_task_runner
    from gates import load_policy

    try:
        if task_runner not in EXECUTORS:
            raise ValueError(f"--executor is {task_runner!r}; expected one of {', '.join(EXECUTORS)}")
        runner = EXECUTORS[task_runner]
        spec = load_sweep(sweep_path)
        for ref in model or []:
            check_model_ref(ref, lambda _key, expected: SweepError(f"--model {expected}"))
        load_policy(policy)  # a broken policy (or checklist) is refused now, not after the measuring
        threads, threads_from = threads_rule(threads, spec.threads)
        if items:
            sweep_path = with_items(sweep_path, lambda _task: items)
        options = EvaluationOptions(
            reproducibility=reproducibility,
            policy=str(policy) if policy else None,
            task_runner=runner,
            dask_address=dask_address,
            remeasure=remeasure,
            threads=threads,
            speed_rounds=speed_rounds,
            gpus_per_cell=gpus_per_cell,
        )
        make_task_runner(options.task_runner, options.dask_address)  # an unknown runner or a missing extra, now
    except (SweepError, ValueError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    return spec, sweep_path, options, threads_from


def _print_summary(result: dict[str, Any], options: EvaluationOptions, models: list[str], elapsed: float) -> None:
    """The decision, the scorecard, what was reused and what to do next; exit 1 when nothing was measured or
    every candidate failed."""
    from models.state import state_dir
    from registry.links import mlflow_ui_command

    rows = result["scorecard"]
    print_demo_banner(console, options.policy)
    print_decision(result["outcomes"])
    console.print(scorecard_table(rows, result["score_stage"]))
    points = sum(o.get("points", 0) for o in result["outcomes"])
    cached = sum(o.get("cached", 0) for o in result["outcomes"])
    console.print(
        f"done in {elapsed:.1f} s; {cached} of {points} sweep points reused from cache ({state_dir() / 'results'})",
        highlight=False,
    )
    for line in result.get("flushed") or []:
        console.print(f"logged evidence kept from an earlier run: {line}", highlight=False)
    print_next_steps(result["outcomes"])
    console.print(
        "see: [bold]unmask dashboard[/bold] (gates and scores), "
        f"[bold]{mlflow_ui_command(result['tracking_uri'])}[/bold] (runs, registry, audit)",
        highlight=False,
    )
    if not points:
        print_error(console, f"nothing was measured: no sweep point of {', '.join(models)} could run (see above)")
        raise typer.Exit(1)
    if rows and all(r["qualifies"] == "failed" for r in rows):
        raise typer.Exit(1)


def review_with_progress(models: list[str], sweep: str, options: EvaluationOptions) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows.progress import set_reporter
    from flows.review import gate_review

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bars: dict[str, TaskID] = {}
        bar = progress.add_task("starting Prefect (local mode) and MLflow (SQLite)", total=None)

        def on_event(kind: str, info: dict[str, Any]) -> None:
            name = info.get("candidate", "")
            if kind == "candidate":
                progress.update(bar, description=f"loading {name}")
            elif kind == "plan":
                bars[name] = progress.add_task(f"{name}: measuring", total=info["total"])
            elif kind == "item" and name in bars:
                setting = info["label"].split(" ", 1)[-1]
                progress.update(
                    bars[name], description=f"{name}: measuring {setting}, item {info['done']}/{info['total']}"
                )
            elif kind == "point" and name in bars:
                how = "cached" if info["cached"] else "measured"
                progress.update(bars[name], advance=1, description=f"{name}: {how} {info['label'].split(' ', 1)[-1]}")
            elif kind == "stage" and name in bars:
                progress.update(bars[name], description=f"{name}: {info['step']}")
            elif kind == "failure":
                progress.console.print(f"[red]failed:[/red] {info['message']}", highlight=False, markup=True)

        set_reporter(on_event)
        if os.environ.get("PREFECT_LOGGING_LEVEL", "").upper() != "INFO":
            # GX sets this logger to INFO when imported; a filter outlives that, and its lines break the bars
            for name in ("great_expectations.data_context.types.base", "mlflow.store.db.utils"):
                logging.getLogger(name).addFilter(lambda record: record.levelno >= logging.WARNING)
        try:
            result = gate_review(models, sweep, options)
        finally:
            set_reporter(None)
        progress.update(bar, description="review finished", total=1, completed=1)
        for name, task_id in bars.items():
            progress.update(task_id, description=f"{name}: done")
    return result


def scorecard_table(rows: list[dict[str, Any]], score_stage: str) -> FittedTable:
    from rich.markup import escape

    table = FittedTable(
        "scorecard",
        [
            Column("candidate"),
            Column("qualifies for"),
            Column("gates passed", "right", wrap=True),
            Column("failed gates: reasons", wrap=True),
            Column(f"score ({score_stage})", "right", wrap=True),
        ],
        caption=f"scores rank the models that pass every measured {score_stage} gate (ranked on evidence; an open "
        "sign-off keeps a model from promotion, not from the ranking)",
        show_lines=True,
    )
    for r in rows:
        stage = {"none": "[yellow]none yet[/yellow]", "failed": "[red]failed[/red]"}.get(
            r["qualifies"], f"[green]{r['qualifies']}[/green]"
        )
        total = r["passed"] + r["failed"] + r.get("open", 0)
        gates = f"{r['passed']}/{total} at {r['judged_at']}" if r["judged_at"] else "-"
        if r.get("open"):
            gates += f", [yellow]{r['open']} inconclusive[/yellow]"
        score = f"{r['score']:.3f} (#{r['rank']})" if r["score"] is not None else "[dim]filtered by gates[/dim]"
        if r["score"] is not None and r["qualifies"] != score_stage and r["judged_at"] == score_stage:
            score += "\n[yellow]not yet promotable[/yellow]"
        name = f"{r['candidate']}\n[dim]{r['role']}[/dim]" if r["role"] else r["candidate"]
        undecided = [f"[yellow]inconclusive[/yellow] {escape(why)}" for why in r.get("inconclusive", [])]
        table.add_row(name, stage, gates, "\n".join([escape(x) for x in r["reasons"]] + undecided) or "-", score)
    return table


def mark_demo(out: Console) -> None:
    """Mark the registry `unmask run --demo` evaluates into as a demonstration (refused once production moved)."""
    from registry import Registry, RegistryError
    from registry.demo import mark_demo_registry

    try:
        mark_demo_registry(Registry())
    except RegistryError as e:
        print_error(out, f"--demo: {e}")
        raise typer.Exit(2) from None
    out.print(
        "[bold red]DEMO[/bold red]: this registry is marked as a demo (demo sweep and policy; never a real decision)",
        highlight=False,
    )


def decision_table(decisions: list[Decision]) -> FittedTable:
    """The decision per candidate and stage: accuracy with interval, p95 and text tokens/s against the AR
    fallback at the same concurrency, the decision's outcome and what blocks it (its blockers in a few words each,
    in order; `unmask gates` says each in full)."""
    from rich.markup import escape

    from flows.commands.outcomes import outcome_markup
    from gates.readable import percent

    table = FittedTable(
        "decision",
        [
            Column("candidate, stage", wrap=True),
            Column("accuracy (95% CI)", wrap=True),
            Column("p95 vs AR", "right", wrap=True, drop=1),
            Column("tokens/s vs AR", "right", wrap=True, drop=2),
            Column("decision", wrap=True),
            Column("what blocks it", wrap=True),
        ],
        caption="vs the AR fallback at the same concurrency, 95% intervals (docs/speed-evidence.md); "
        "`unmask gates MODEL --stage S` says each blocker in full",
        whole_words=True,
    )
    for d in decisions:
        f = d.figures
        if f.accuracy is None:
            accuracy = "—"
        else:
            assert f.accuracy_interval is not None  # set with the accuracy (gates.decision)
            low, high = f.accuracy_interval
            accuracy = f"{percent(f.accuracy)} ({percent(low)}–{percent(high)}, n={f.n_items})"
        shown = outcome_markup(d.outcome)
        if d.ranked_only:
            shown += "\n[dim](ranked on evidence)[/dim]"
        blocks = [label.replace("_", " ") for label in d.blocker_labels()]  # gate names break at words
        if len(blocks) > 2:  # the first ones, and how many more `unmask gates` lists
            blocks = [*blocks[:2], f"+{len(blocks) - 2} more"]
        table.add_row(
            f"{d.model} v{d.version}\n[bold]{d.stage}[/bold]",
            accuracy,
            f.p95_text(),
            f.tokens_per_s_text(),
            shown,
            escape(", ".join(blocks)) or ("nothing: holds it" if d.holds else "nothing"),
        )
    return table


def print_decision(outcomes: list[dict[str, Any]]) -> None:
    """The decision table of the run's candidates, as the flow judged them (each once), first thing under the
    progress bars."""
    from flows.outcome import CandidateOutcome

    decisions = [d for o in map(CandidateOutcome.of, outcomes) if o.role == "candidate" for d in o.decisions()]
    if decisions:
        console.print(decision_table(decisions))


def print_next_steps(outcomes: list[dict[str, Any]]) -> None:
    """For each reviewed candidate, the commands that clear what blocks its next promotion: the steps of the
    decision the flow made for the first stage it does not hold."""
    from flows.outcome import CandidateOutcome

    for outcome in map(CandidateOutcome.of, outcomes):
        if outcome.error or outcome.role == "fallback":
            continue
        upcoming = next((d for d in outcome.decisions() if not d.holds), None)
        if upcoming is None:
            console.print(f"{outcome.candidate} v{outcome.version} holds every stage", highlight=False)
            continue
        console.print(f"next for {outcome.candidate} v{outcome.version} -> {upcoming.stage}:", highlight=False)
        for step in upcoming.steps:
            console.print(f"  {step.command}", highlight=False, markup=False, soft_wrap=True)
            console.print(f"    {step.why}", style="dim", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)
