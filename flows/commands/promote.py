"""`unmask promote`, `unmask rollback`, `unmask sign-off` and `unmask audit`: move aliases behind gates, and show who did."""

from __future__ import annotations

import typer

from flows.commands import options
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error

console = table_console(200)


def _fail(e: Exception) -> None:
    print_error(console, f"{e}")
    raise typer.Exit(2) from None


def _refused(e: Exception) -> None:
    console.print(str(e), style="red", markup=False, highlight=False)
    raise typer.Exit(1) from None


def promote_command(
    model: str = typer.Argument(..., help="Registered model, e.g. tiny-llada."),
    to: str = typer.Option(..., "--to", help="poc, staging or production."),
    approver: str = typer.Option(None, "--approver", help="Who approves (recorded on the version and in the audit)."),
    comment: str = typer.Option("", "--comment", help="Why; the stage's policy sets a minimum length."),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
    policy_path: str = typer.Option(None, "--policy", help="Policy YAML (default: the bundled gates/policy.yaml)."),
) -> None:
    """Move the TO alias to MODEL when its gates pass, its checklist is complete and an approval is recorded."""
    from gates import PolicyError, load_policy
    from registry import PromotionRefused, RegistryError, promote

    try:
        move = promote(model, to, approver=approver, comment=comment, version=version, policy=load_policy(policy_path))
    except PromotionRefused as e:
        _refused(e)
    except (PolicyError, RegistryError) as e:
        _fail(e)
    before = "@".join(move.from_holder) if move.from_holder else "nobody"
    console.print(f"[green]{to}[/green] now points at {model} v{move.to_holder[1]} (was {before}); "
                  f"approved by {move.who}. Audit run {move.audit_run_id}.", highlight=False)


def rollback_command(
    stage: str = typer.Option(..., "--stage", help="poc, staging or production."),
    by: str = typer.Option(None, "--by", help="Who rolls back (default: the OS user)."),
    comment: str = typer.Option("", "--comment", help="Why."),
    reconcile: bool = typer.Option(False, "--reconcile",
                                   help="Put an alias moved outside unmask back where the audit trail left it."),
) -> None:
    """Re-point STAGE to the version that held it before, or to the `fallback` model."""
    from registry import PromotionRefused, RegistryError, rollback

    try:
        move = rollback(stage, who=by, comment=comment, reconcile=reconcile)
    except PromotionRefused as e:
        _refused(e)
    except RegistryError as e:
        _fail(e)
    if reconcile:
        console.print(f"[yellow]{stage}[/yellow] reconciled: back on {'@'.join(move.to_holder or ()) or 'nobody'} "
                      f"(found on {', '.join(move.evidence['drift']['found']) or 'nobody'}).", highlight=False)
        return
    console.print(f"[yellow]{stage}[/yellow] rolled back from {'@'.join(move.from_holder)} to "
                  f"{'@'.join(move.to_holder)} ({move.evidence.get('target')}).", highlight=False)


def sign_off_command(
    model: str = typer.Argument(..., help="Registered model."),
    stage: str = typer.Option(..., "--stage", help="poc, staging or production."),
    item: str = typer.Option(..., "--item", help="A manual checklist item id, e.g. fallback-plan."),
    by: str = typer.Option(..., "--by", help="Who signs off."),
    comment: str = typer.Option(..., "--comment", help="What was checked."),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
) -> None:
    """Sign off a manual checklist item for a version (who, when, comment)."""
    from checklists import ChecklistError, load_checklist
    from registry import Registry, RegistryError, latest_registration, sign_off

    try:
        load_checklist(stage)  # a broken checklist (or stage) is refused before the store is opened
    except ChecklistError as e:
        _fail(e)
    try:
        reg = Registry()
        held = reg.aliases_of(model)
        version = version or latest_registration(held)
        if not version:
            raise RegistryError(f"{model} has no `candidate` or `fallback` version")
        done = sign_off(reg, model, version, stage, item, by, comment)
    except RegistryError as e:
        _fail(e)
    console.print(f"{stage}/{item} signed off for {model} v{version} by {done['by']} at {done['at']}.", highlight=False)


def audit_command(
    model: str = typer.Option(None, "--model", help="Only events of this model."),
    stage: str = typer.Option(None, "--stage", help="Only events of this stage."),
    limit: int = typer.Option(50, "--limit", callback=options.positive, help="Show the last N events."),
    verify: bool = typer.Option(False, "--verify", help="Recompute the audit trail's hash chain and name the first "
                                                        "entry edited, removed, reordered or inserted (exit 1 if so)."),
) -> None:
    """Show the audit trail: alias moves, approvals, sign-offs and refusals, oldest first."""
    from registry import RegistryError
    from registry.read import audit_chain, audit_events

    if verify:
        try:
            chain = audit_chain()
        except RegistryError as e:
            _fail(e)
        console.print(chain["summary"], style=None if chain["ok"] else "red", markup=False, highlight=False,
                      soft_wrap=True)
        if not chain["ok"]:
            raise typer.Exit(1)
        return
    try:
        events = audit_events(model=model, stage=stage)
    except RegistryError as e:
        _fail(e)
    if events.empty:
        console.print("No audit events yet. Register evidence (`unmask run`), then `unmask promote`.")
        return
    # at 80 columns the run status and the alias move's ends go first; who, what and why stay
    table = FittedTable(f"audit trail ({len(events)} events)", [
        Column("when (UTC)", wrap=True), Column("event"), Column("who"), Column("stage"), Column("model", wrap=True),
        Column("from", drop=2), Column("to", drop=3), Column("status", drop=4), Column("comment", wrap=True, drop=1)])
    for _, e in events.tail(limit).iterrows():
        table.add_row(e["when"][:19].replace("T", " "), e["event"], e["who"], e["stage"],
                      f"{e['model']} v{e['version']}" if e["version"] else e["model"], e["from"], e["to"], e["status"],
                      e["comment"])
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("promote")(promote_command)
    app.command("rollback")(rollback_command)
    app.command("sign-off")(sign_off_command)
    app.command("audit")(audit_command)
