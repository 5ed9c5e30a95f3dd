"""`unmask approve`: answer a promotion waiting in the `promote` flow, without the Prefect UI.

With a paused `promote` run for MODEL and STAGE, it resumes that run with the typed approval the
flow waits for (the flow then moves the alias). With none waiting, it records the approval in the
registry, where the next promotion of that version (flow or `unmask promote`) finds it.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

import typer
from rich.console import Console

from flows.commands import options
from flows.failures import print_error

console = Console()


def approve_command(
    model: str = typer.Argument(..., help="Registered model (candidate id)."),
    stage: str = typer.Argument(..., help="poc, staging or production."),
    by: str = typer.Option(None, "--by", help="Approver (default: your user name)."),
    comment: str = typer.Option(..., "--comment", "-c", help="Why; the policy sets a minimum length per stage."),
    reject: bool = typer.Option(False, "--reject", help="Decline the waiting promotion instead."),
    version: str = typer.Option(None, "--version", help="With no promotion waiting: the version (default: candidate)."),
) -> None:
    """Approve (or --reject) the promotion of MODEL to STAGE."""
    from flows.promote import PromotionApproval, resume_with_approval, waiting_promotions

    approver = by or getpass.getuser()
    waiting = waiting_promotions(model, stage)
    if waiting:
        run = waiting[0]
        resume_with_approval(run.id, PromotionApproval(approver=approver, comment=comment, approve=not reject))
        verb = "declined" if reject else "approved"
        console.print(f"{verb}: promotion of {model} to {stage} (flow run {run.name}, {run.id}); the flow resumes",
                      highlight=False)
        return
    if reject:
        console.print(f"[yellow]no promotion of {model} to {stage} is waiting; nothing to decline[/yellow]")
        raise typer.Exit(1)
    from registry import CANDIDATE_ALIAS, Registry, RegistryError, approve

    try:
        registry = Registry()
        version = version or registry.aliases_of(model).get(CANDIDATE_ALIAS)
        if not version:
            raise RegistryError(f"{model} has no `candidate` version; give --version")
        approval = approve(registry, model, version, stage, approver, comment)
    except RegistryError as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    console.print(f"no promotion of {model} to {stage} is waiting; approval by {approval.by} recorded on "
                  f"{model} v{version} for the next promotion", highlight=False)


def request_promotion_command(
    model: str = typer.Argument(..., help="Registered model (candidate id)."),
    stage: str = typer.Argument(..., help="poc, staging or production."),
    timeout_s: int = typer.Option(24 * 3600, "--timeout", callback=options.positive, help="Seconds to wait for the approval."),
    policy: Path = typer.Option(None, "--policy", help="Stage policy YAML (default: gates/policy.yaml)."),
) -> None:
    """Start the `promote` flow: gates check, then wait for `unmask approve` (or the UI), then move the alias."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from rich.markup import escape

    from flows.failures import describe, print_error
    from flows.promote import promote_flow
    from gates import load_policy

    try:
        load_policy(policy)  # a broken policy (or checklist) is refused before the flow starts
    except ValueError as e:
        print_error(console, e)
        raise typer.Exit(2) from None

    console.print(f"checking the {stage} gates of {model}; once green this waits for\n  unmask approve {model} {stage} "
                  "--by NAME --comment \"...\"", highlight=False)
    state = promote_flow(model, stage, timeout_s=timeout_s, policy=str(policy) if policy else None, return_state=True)
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        line = describe(error)[1] if isinstance(error, BaseException) else " ".join(str(state.message).split())
        console.print(f"[red]not promoted:[/red] {escape(line)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    result = state.result()
    if result["status"] == "promoted":
        console.print(f"promoted: {result['move']['to']} holds {stage} (was {result['move']['from'] or 'nobody'})",
                      highlight=False)
    else:
        console.print(f"declined by {result['by']}: {result['comment']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("approve")(approve_command)
    app.command("request-promotion")(request_promotion_command)
