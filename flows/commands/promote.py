"""`unmask promote`, `unmask rollback`, `unmask sign-off` and `unmask audit`: move aliases behind gates, and show
who did."""

from __future__ import annotations

from typing import Any, NoReturn

import typer

from flows.commands import options
from flows.commands.banner import print_demo_banner
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error

console = table_console(200)


def _fail(e: Exception) -> NoReturn:
    print_error(console, f"{e}")
    raise typer.Exit(2) from None


def _refused(e: Exception) -> None:
    console.print(str(e), style="red", markup=False, highlight=False)
    raise typer.Exit(1) from None


def promote_command(
    model: str = typer.Argument(..., help="Registered model, e.g. tiny-llada."),
    to: str = typer.Option(..., "--to", help="poc, staging or production."),
    approver: str = typer.Option(
        None,
        "--approver",
        help="Approve in the same call: must be you (your identity); "
        "counts only where the stage allows self-approval (poc).",
    ),
    comment: str = typer.Option("", "--comment", help="Why; the stage's policy sets a minimum length."),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
    policy_path: str = typer.Option(None, "--policy", help="Policy YAML (default: the bundled gates/policy.yaml)."),
) -> None:
    """Request the move of the TO alias to MODEL; it moves when its gates pass, its checklist is complete and the
    stage's approvals (by others than you, for staging and production) are recorded."""
    from checklists import STAGES, ChecklistError
    from gates import PolicyError, RolesError, load_policy
    from gates.promotion import require_checklists_match
    from registry import PromotionRefused, Registry, RegistryError, promote
    from registry.identity import claimed_actor, server_permissions

    try:
        policy = load_policy(policy_path)
        require_checklists_match(policy, [to] if to in STAGES else [])
        reg = Registry()
        print_demo_banner(console, policy, reg)
        with server_permissions(reg.tracking_uri, model, f"promotion to {to}"):
            me = claimed_actor(reg, approver, "--approver", f"promotion of {model} to {to}", to, model)
            move = promote(
                model,
                to,
                approver=me if approver else None,
                comment=comment,
                version=version,
                policy=policy,
                registry=reg,
                actor=me,
            )
    except PromotionRefused as e:
        _refused(e)
    except (PolicyError, RolesError, RegistryError, ChecklistError) as e:
        _fail(e)
    before = "@".join(move.from_holder) if move.from_holder else "nobody"
    approvers = ", ".join(a["by"] for a in move.evidence.get("approvals", [])) or "nobody"
    console.print(
        f"[green]{to}[/green] now points at {model} v{move.to_holder[1]} (was {before}); requested by "
        f"{move.who}, approved by {approvers}. Audit run {move.audit_run_id}.",
        highlight=False,
    )
    _notify()


def _notify() -> None:
    """Send the configured webhooks the move (and whatever they have not taken before it): a receiver that is
    down is said in one line and retried by the next delivery (`unmask events --deliver`), never an error here."""
    from flows.webhooks import WebhookError, deliver, load_webhooks
    from registry import Registry, RegistryError

    try:
        hooks = load_webhooks()
        delivered = deliver(Registry(), hooks, attempts=2, backoff_s=0.2) if hooks else []
    except (WebhookError, RegistryError) as e:
        console.print(f"[yellow]webhooks:[/yellow] {e}", highlight=False)
        return
    for d in delivered:
        left = f"; not delivered: {d.failed} (`unmask events --deliver` retries)" if d.failed else ""
        console.print(f"webhook {d.webhook}: {d.delivered} event(s) delivered{left}", highlight=False)


def rollback_command(
    stage: str = typer.Option(..., "--stage", help="poc, staging or production."),
    by: str = typer.Option(None, "--by", help="Must be you, if given (the identity is recorded)."),
    comment: str = typer.Option("", "--comment", help="Why."),
    reconcile: bool = typer.Option(
        False, "--reconcile", help="Put an alias moved outside unmask back where the audit trail left it."
    ),
    to_fallback: bool = typer.Option(
        False,
        "--to-fallback",
        help="Straight to the `fallback` model: needs nothing from the audit trail, so it works on a broken chain.",
    ),
) -> None:
    """Re-point STAGE to the version that held it before, or to the `fallback` model (emergency role, audited)."""
    from gates import RolesError
    from registry import PromotionRefused, Registry, RegistryError, rollback
    from registry.identity import claimed_actor, server_permissions

    try:
        reg = Registry()
        with server_permissions(reg.tracking_uri, "", f"rollback of {stage}"):
            me = claimed_actor(reg, by, "--by", f"rollback of {stage}", stage)
            move = rollback(stage, who=me, comment=comment, reconcile=reconcile, registry=reg, to_fallback=to_fallback)
    except PromotionRefused as e:
        _refused(e)
    except (RolesError, RegistryError) as e:
        _fail(e)
    if reconcile:
        console.print(
            f"[yellow]{stage}[/yellow] reconciled: back on {'@'.join(move.to_holder or ()) or 'nobody'} "
            f"(found on {', '.join(move.evidence['drift']['found']) or 'nobody'}).",
            highlight=False,
        )
        _notify()
        return
    console.print(
        f"[yellow]{stage}[/yellow] rolled back from {'@'.join(move.from_holder)} to "
        f"{'@'.join(move.to_holder)} ({move.evidence.get('target')}) by {move.who}; an emergency_rollback "
        "finding is open for review.",
        highlight=False,
    )
    _notify()


def sign_off_command(
    model: str = typer.Argument(..., help="Registered model."),
    stage: str = typer.Option(..., "--stage", help="poc, staging or production."),
    item: str = typer.Option(..., "--item", help="A manual checklist item id, e.g. fallback-plan."),
    by: str = typer.Option(None, "--by", help="Must be you, if given (the identity is recorded)."),
    comment: str = typer.Option(..., "--comment", help="What was checked."),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
) -> None:
    """Sign off a manual checklist item for a version (who, host, when, comment), if your role allows it."""
    from checklists import ChecklistError, load_checklist
    from gates import RolesError
    from registry import ApprovalRefused, Registry, RegistryError, latest_registration, sign_off
    from registry.identity import claimed_actor, server_permissions

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
        with server_permissions(reg.tracking_uri, model, f"sign-off of {stage}/{item}"):
            me = claimed_actor(reg, by, "--by", f"sign-off of {stage}/{item}", stage, model, version)
            done = sign_off(reg, model, version, stage, item, me, comment)
    except ApprovalRefused as e:
        _refused(e)
    except (RolesError, RegistryError) as e:
        _fail(e)
    console.print(f"{stage}/{item} signed off for {model} v{version} by {done['by']} at {done['at']}.", highlight=False)


def _export_head(chain: dict[str, Any], path: str) -> None:
    """Write the verified chain's signed head and the store's identity to `path` (`unmask audit --export-head`)."""
    from pathlib import Path

    from registry import RegistryError
    from registry.signing import Anchor
    from registry.store import now_iso

    head = Anchor.parse(chain.get("anchor") or "")
    if head is None or not chain.get("store"):
        _fail(
            RegistryError(f"--export-head {path}: the chain has no signed head yet (no audit event); nothing to export")
        )
    try:
        Path(path).write_text(Anchor(head.seq, head.sha256, head.signature, store=chain["store"]).witness(now_iso()))
    except OSError as e:
        _fail(RegistryError(f"--export-head {path}: cannot be written ({e.strerror or e})"))
    console.print(f"witness written: {path} (store {chain['store']}, head #{head.seq})", highlight=False)


def _verify_chain(verify: bool, anchor: str | None, witness: str | None, export_head: str | None) -> None:
    """`unmask audit --verify [--anchor FILE | --witness FILE]` and `--export-head FILE`."""
    from registry import RegistryError
    from registry.read import audit_chain
    from registry.signing import anchor_from_file

    if (anchor is not None or witness is not None) and not verify:
        flag = "--anchor" if anchor is not None else "--witness"
        _fail(RegistryError(f"{flag} checks the chain: give it with --verify"))
    if anchor is not None and witness is not None:
        _fail(RegistryError("give --anchor or --witness, not both"))
    try:
        given = anchor_from_file(anchor) if anchor is not None else None
        given = anchor_from_file(witness, "--witness") if witness is not None else given
        chain = audit_chain(anchor=given)
    except RegistryError as e:
        _fail(e)
    console.print(chain["summary"], style=None if chain["ok"] else "red", markup=False, highlight=False, soft_wrap=True)
    if chain["ok"] and chain.get("anchor"):  # keep it outside the store: `--anchor` checks against it later
        console.print(f"signed head: {chain['anchor']}", markup=False, highlight=False, soft_wrap=True)
    if not chain["ok"]:
        raise typer.Exit(1)
    if export_head:
        _export_head(chain, export_head)


def _repair_chain(comment: str, witness: str | None, by: str | None) -> None:
    """`unmask audit --repair --comment TEXT [--witness FILE]`: the on-call person's signed repair of a broken
    chain (registry/repair.py)."""
    from gates import RolesError
    from registry import Registry, RegistryError, RepairRefused, repair_chain
    from registry.identity import claimed_actor, server_permissions
    from registry.signing import anchor_from_file

    action = "repair of the audit chain"
    try:
        reg = Registry()
        given = anchor_from_file(witness, "--witness") if witness is not None else None
        with server_permissions(reg.tracking_uri, "", action):
            me = claimed_actor(reg, by, "--by", action)
            done = repair_chain(reg, me, comment, given)
    except RepairRefused as e:
        _refused(e)
    except (RolesError, RegistryError) as e:
        _fail(e)
    aside = len(done.set_aside)
    console.print(
        f"audit chain repaired by {done.entry.who} as entry #{done.entry.seq}: {aside} entr"
        f"{'y' if aside == 1 else 'ies'} set aside, {len(done.restored)} status(es) put back, "
        f"{len(done.acknowledged)} signed head(s) acknowledged as lost"
        + (f", the store's identity put back ({done.identity})" if done.identity else ""),
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"it repaired: {done.found}", markup=False, highlight=False, soft_wrap=True)
    for entry in done.set_aside:
        console.print(
            f"  set aside: #{entry['seq'] or '-'} {entry['event'] or '?'} at {entry['when'] or '?'} "
            f"(audit run {entry['run_id']}): {entry['why']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for stage in sorted({e["stage"] for e in done.moves_set_aside if e["stage"]}):
        console.print(
            f"  an alias move of {stage} was set aside: if the alias has drifted, `unmask rollback --stage "
            f"{stage} --reconcile` puts it where the trail says",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if witness:
        console.print(f"export a new witness: unmask audit --export-head {witness}", markup=False, highlight=False)


def audit_command(
    model: str = typer.Option(None, "--model", help="Only events of this model."),
    stage: str = typer.Option(None, "--stage", callback=options.alias_name, help="Only events of this stage."),
    limit: int = typer.Option(50, "--limit", callback=options.positive, help="Show the last N events."),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Recompute the audit trail's hash chain and name the first "
        "entry edited, removed, reordered or inserted (exit 1 if so).",
    ),
    anchor: str = typer.Option(
        None,
        "--anchor",
        metavar="FILE|DOSSIER",
        help="With --verify: also check the chain against the signed head kept in FILE (a "
        "dossier, a nightly report, a saved verify line): a truncation or consistent "
        "rewrite after it is named.",
    ),
    witness: str = typer.Option(
        None,
        "--witness",
        metavar="FILE",
        help="With --verify: check the chain against a witness `--export-head` wrote (kept outside the store: "
        "a git repository, another host); a chain that lost or rewrote entries since is named, another store's "
        "witness is said to be one. With --repair: the heads it holds that are lost are acknowledged.",
    ),
    export_head: str = typer.Option(
        None,
        "--export-head",
        metavar="FILE",
        help="Verify the chain, then write its signed head and the store's identity to FILE, a witness to keep "
        "outside the store.",
    ),
    repair: bool = typer.Option(
        False,
        "--repair",
        help="Repair a broken chain (the on-call person, signed by their key; needs --comment): entries that do "
        "not verify are set aside, and one signed entry seals the rest (docs/integrity.md).",
    ),
    comment: str = typer.Option("", "--comment", help="With --repair: what you checked, recorded and signed."),
    by: str = typer.Option(None, "--by", help="With --repair: must be you, if given (the identity is recorded)."),
) -> None:
    """Show the audit trail: alias moves, approvals, sign-offs and refusals, oldest first."""
    from registry import RegistryError
    from registry.read import audit_events

    if repair:
        if verify or anchor is not None or export_head:
            _fail(RegistryError("--repair verifies the chain itself: give it alone (with --witness, --comment)"))
        _repair_chain(comment, witness, by)
        return
    if verify or export_head:
        _verify_chain(verify, anchor, witness, export_head)
        return
    try:
        events = audit_events(model=model, stage=stage)
    except RegistryError as e:
        _fail(e)
    _print_trail(events, limit)


def _print_trail(events: Any, limit: int) -> None:
    """The last `limit` audit events as a table that fits the terminal."""
    if events.empty:
        console.print("No audit events yet. Register evidence (`unmask run`), then `unmask promote`.")
        return
    # at 80 columns the run status, the alias move's ends and then the stage go first; who, what and why stay
    table = FittedTable(
        f"audit trail ({len(events)} events)",
        [
            Column("when (UTC)", wrap=True),
            Column("event"),
            Column("who"),
            Column("stage", drop=2),
            Column("model", wrap=True),
            Column("from", drop=3),
            Column("to", drop=4),
            Column("status", drop=5),
            Column("comment", wrap=True, drop=1),
        ],
    )
    for _, event in events.tail(limit).iterrows():
        table.add_row(
            event["when"][:19].replace("T", " "),
            event["event"],
            event["who"],
            event["stage"],
            f"{event['model']} v{event['version']}" if event["version"] else event["model"],
            event["from"],
            event["to"],
            event["status"],
            event["comment"],
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("promote")(promote_command)
    app.command("rollback")(rollback_command)
    app.command("sign-off")(sign_off_command)
    app.command("audit")(audit_command)
