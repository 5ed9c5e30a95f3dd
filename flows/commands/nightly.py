"""`unmask nightly`: run the nightly re-evaluation once now, or serve it on its cron schedule.

Serving needs a real Prefect server (`prefect server start`, then PREFECT_API_URL); the embedded
local mode runs flows but does not schedule them. See docs/flows.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
nightly_app = typer.Typer(help="The nightly re-evaluation: run it once, or serve its schedule.", no_args_is_help=True)


@nightly_app.command("run")
def run_once(
    sweep: Path = typer.Option(None, "--sweep", "-s", help="Sweep YAML (default: evals/sweeps/default.yaml)."),
    policy: Path = typer.Option(None, "--policy", help="Stage policy YAML (default: gates/policy.yaml)."),
    no_rollback: bool = typer.Option(False, "--no-rollback", help="Record a regression but leave production."),
) -> None:
    """Re-evaluate every registered model now; on a production regression, roll back to the fallback."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from flows.local_prefect import LocalPrefect, api, stopped_if_refused

    local_prefect = LocalPrefect.boot()  # Prefect's server boots on the other core while this imports and checks
    from evals.sweep import SweepError, default_sweep_path, load_sweep
    from flows.evaluate import EvaluationOptions
    from flows.failures import print_error
    from flows.nightly import nightly
    from gates import load_policy

    with stopped_if_refused(local_prefect):
        try:  # a broken sweep or policy (or checklist) is refused now, not after a night of measuring
            load_sweep(sweep or default_sweep_path())
            load_policy(policy)
        except (SweepError, ValueError) as e:
            print_error(console, e)
            raise typer.Exit(2) from None
    with api(local_prefect, warn=lambda line: console.print(line, highlight=False)):
        result = nightly(
            str(sweep or default_sweep_path()),
            EvaluationOptions(policy=str(policy) if policy else None),
            rollback_on_regression=not no_rollback,
        )
    console.print(f"nightly: {result['status']}", highlight=False)
    if result.get("sweep") and result["sweep"] != str(sweep or default_sweep_path()):
        console.print(f"  measured at production's evidence level: {result['sweep']}", highlight=False)
    if result.get("audit_chain"):
        console.print(f"  [red]{escape(result['audit_chain'])}[/red]", highlight=False)
    finding = result.get("finding")
    if finding and result["status"] == "inconclusive":
        console.print(f"  [yellow]nothing rolled back[/yellow]: {escape(finding['inconclusive'])}", highlight=False)
    elif finding:
        for f in result["production"]["failed"]:
            console.print(f"  [red]{f['gate']}[/red]: {escape(f['reason'])}", highlight=False)
        if finding.get("rolled_back"):
            console.print(
                f"rolled back production: {finding['move']['from']} -> {finding['move']['to']}", highlight=False
            )


@nightly_app.command("serve")
def serve(
    cron: str = typer.Option(None, "--cron", help="Cron schedule (default: 0 2 * * *)."),
    timezone: str = typer.Option("UTC", "--timezone", help="Timezone of the schedule."),
    sweep: Path = typer.Option(None, "--sweep", "-s", help="Sweep YAML (default: evals/sweeps/default.yaml)."),
) -> None:
    """Serve the nightly deployment on its schedule (needs PREFECT_API_URL of a running Prefect server)."""
    from prefect import serve as prefect_serve
    from prefect.settings import PREFECT_API_URL

    from flows.nightly import DEFAULT_CRON, nightly_deployment

    if not PREFECT_API_URL.value():
        console.print(
            "[red]error:[/red] schedules need a Prefect server: run `prefect server start` in another "
            "shell, then `export PREFECT_API_URL=http://127.0.0.1:4200/api` and serve again "
            "(docs/flows.md)",
            highlight=False,
        )
        raise typer.Exit(2)
    deployment = nightly_deployment(cron or DEFAULT_CRON, timezone, str(sweep) if sweep else None)
    prefect_serve(deployment)


def register(app: typer.Typer) -> None:
    app.add_typer(nightly_app, name="nightly")
