"""`unmask approve` and `unmask reject`: decide on a promotion, as yourself, without the Prefect UI.

The approver is the identity (the MLflow user on a basic-auth server, else the OS user); `--by` may only
repeat it. The approval is recorded in the registry first, on the open promotion request of MODEL's
version and STAGE (refused, and audited, when your role or the separation of duties forbid it); a
paused `promote` flow run for MODEL and STAGE is then resumed with it. `unmask reject` records a decline:
final for that version and stage until new evidence is registered.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

from flows.commands import options
from flows.failures import print_error

console = Console()


def _decide(model: str, stage: str, by: str | None, comment: str, version: str | None, reject: bool) -> None:
    from flows.waiting import may_be_waiting
    from gates import RolesError
    from registry import CANDIDATE_ALIAS, ApprovalRefused, Registry, RegistryError, approve, decline
    from registry.identity import claimed_actor, server_permissions

    verb = "decline" if reject else "approval"
    try:
        registry = Registry()
        version = version or registry.aliases_of(model).get(CANDIDATE_ALIAS)
        if not version:
            raise RegistryError(f"{model} has no `candidate` version; give --version")
        with server_permissions(registry.tracking_uri, model, f"{verb} for {stage}"):
            me = claimed_actor(registry, by, "--by", f"{verb} of {model} v{version} for {stage}", stage, model, version)
            decided = (decline if reject else approve)(registry, model, version, stage, me, comment)
    except ApprovalRefused as e:
        console.print(str(e), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    except (RolesError, RegistryError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    waiting = []
    if may_be_waiting(registry, model, version, stage):  # else no Prefect (and no temporary server) at all
        from flows.local_prefect import booted

        with booted(warn=lambda line: console.print(line, highlight=False)):
            from flows.promote import PromotionApproval, resume_with_approval, waiting_promotions

            waiting = waiting_promotions(model, stage)
            if waiting:
                resume_with_approval(
                    waiting[0].id,
                    PromotionApproval(
                        approver=me.name, comment=comment, approve=not reject, approval_id="" if reject else decided.id
                    ),
                )
    if waiting:
        run = waiting[0]
        console.print(
            f"{'declined' if reject else 'approved'} by {me.name}: promotion of {model} v{version} to "
            f"{stage} (flow run {run.name}, {run.id}); the flow resumes",
            highlight=False,
        )
    elif reject:
        console.print(
            f"declined by {me.name}: {model} v{version} will not go to {stage} until new evidence is registered",
            highlight=False,
        )
    else:
        console.print(
            f"no promotion of {model} to {stage} is waiting; approval by {me.name} recorded on "
            f"{model} v{version} for request {decided.request}",
            highlight=False,
        )


def approve_command(
    model: str = typer.Argument(..., help="Registered model (candidate id)."),
    stage: str = typer.Argument(..., help="poc, staging or production."),
    by: str = typer.Option(None, "--by", help="Must be you, if given: the approver is your identity."),
    comment: str = typer.Option(..., "--comment", "-c", help="Why; the policy sets a minimum length per stage."),
    reject: bool = typer.Option(False, "--reject", help="Decline instead (the same as `unmask reject`)."),
    version: str = typer.Option(None, "--version", help="The version (default: candidate)."),
) -> None:
    """Approve (or --reject) the promotion of MODEL to STAGE, as yourself."""
    _decide(model, stage, by, comment, version, reject)


def reject_command(
    model: str = typer.Argument(..., help="Registered model (candidate id)."),
    stage: str = typer.Argument(..., help="poc, staging or production."),
    comment: str = typer.Option(..., "--comment", "-c", help="Why it may not go."),
    by: str = typer.Option(None, "--by", help="Must be you, if given."),
    version: str = typer.Option(None, "--version", help="The version (default: candidate)."),
) -> None:
    """Decline the promotion of MODEL to STAGE: final for that version until new evidence is registered."""
    _decide(model, stage, by, comment, version, reject=True)


def request_promotion_command(
    model: str = typer.Argument(..., help="Registered model (candidate id)."),
    stage: str = typer.Argument(..., help="poc, staging or production."),
    timeout_s: int = typer.Option(
        24 * 3600, "--timeout", callback=options.positive, help="Seconds to wait for the approval."
    ),
    policy: Path = typer.Option(None, "--policy", help="Stage policy YAML (default: gates/policy.yaml)."),
) -> None:
    """Start the `promote` flow: gates check, then wait for `unmask approve` (or the UI), then move the alias."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from flows.local_prefect import LocalPrefect, api, stopped_if_refused

    local_prefect = LocalPrefect.boot()  # boots while the flow's modules import
    from rich.markup import escape

    from flows.failures import describe, print_error
    from flows.promote import promote_flow
    from gates import load_policy

    with stopped_if_refused(local_prefect):
        try:
            load_policy(policy)  # a broken policy (or checklist) is refused before the flow starts
        except ValueError as e:
            print_error(console, e)
            raise typer.Exit(2) from None

    console.print(
        f"checking the {stage} gates of {model}; once green this waits for an approver to run\n  "
        f'unmask approve {model} {stage} --comment "..."',
        highlight=False,
    )
    with api(local_prefect, warn=lambda line: console.print(line, highlight=False)):
        state = promote_flow(
            model, stage, timeout_s=timeout_s, policy=str(policy) if policy else None, return_state=True
        )
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        line = describe(error)[1] if isinstance(error, BaseException) else " ".join(str(state.message).split())
        console.print(f"[red]not promoted:[/red] {escape(line)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    result = state.result()
    if result["status"] == "promoted":
        console.print(
            f"promoted: {result['move']['to']} holds {stage} (was {result['move']['from'] or 'nobody'})",
            highlight=False,
        )
    else:
        console.print(f"declined by {result['by']}: {result['comment']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("approve")(approve_command)
    app.command("reject")(reject_command)
    app.command("request-promotion")(request_promotion_command)
