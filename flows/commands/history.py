"""`unmask history`: which version held each stage when, from the verified audit chain (registry/history.py).

    unmask history tiny-llada                      every tenure of tiny-llada, per stage
    unmask history --stage production              who held production, one row per move
    unmask history --stage production --at 2026-12-05T14:30Z   one line: who held it then
    unmask history --format csv > timeline.csv     the same rows for a spreadsheet or a script

A chain that does not verify is said so on stderr, and the command exits 1 after printing what the trail says:
a script never reads an unverified timeline as evidence.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import TYPE_CHECKING, Any

import typer

from flows.commands import options
from flows.commands.table import Column, FittedTable, table_console

if TYPE_CHECKING:
    from datetime import datetime

    from registry.history import StageHistory

console = table_console(200)
FORMATS = ("table", "csv", "json")
COLUMNS = [
    "kind",
    "stage",
    "model",
    "version",
    "since",
    "until",
    "held_s",
    "moved_by",
    "how",
    "why",
    "previous",
    "approvals",
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    from flows.failures import print_error

    print_error(console, message)
    return typer.Exit(code)


def history_command(
    model: str = typer.Argument(None, help="Only the tenures of this registered model (default: every holder)."),
    stage: str = typer.Option(None, "--stage", callback=options.alias_name, help="Only this stage's alias."),
    at: str = typer.Option(
        None, "--at", metavar="TIME", help="Which version held the stage at TIME (ISO 8601, a date, or now)."
    ),
    output: str = typer.Option("table", "--format", help="table, csv or json."),
) -> None:
    """Which version held each stage alias when: who moved it, from which version, why, and for how long."""
    from gates.roles import RolesError, load_roles
    from registry import Registry, RegistryError
    from registry.history import HistoryError, parse_time, stage_history

    if output not in FORMATS:
        raise _fail(f"--format {output!r}: expected one of {', '.join(FORMATS)}")
    try:
        when = parse_time(at) if at is not None else None
        found = stage_history(Registry(), model, stage, load_roles())
    except (HistoryError, RegistryError, RolesError) as e:
        raise _fail(str(e)) from None
    if when is not None:
        _answer(found, stage, when, model, output)
    elif output == "table":
        _table(found, model, stage)
    else:
        _rows(found, output)
    if not found.verified:
        raise _fail(found.problem, code=1)


def _answer(found: StageHistory, stage: str | None, when: datetime, model: str | None, output: str) -> None:
    """`--at`: one line per stage asked, naming the holder at that time and the move that made it one."""
    from registry.store import STAGE_ALIASES

    names = [stage] if stage else [s for s in STAGE_ALIASES if s in found.stages()] or list(STAGE_ALIASES)
    answers = [(name, found.at(name, when)) for name in names]
    if output != "table":
        rows = [
            {"stage": name, "at": when.isoformat()} | (t.to_dict() if t else {"model": "", "version": ""})
            for name, t in answers
        ]
        _emit(rows, output)
        return
    stamp = when.isoformat(timespec="seconds")
    for name, t in answers:
        if t is None or not t.model:
            who = f" ({model} did not hold it)" if model else ""
            console.print(f"{name} at {stamp}: nobody held it{who}", highlight=False)
            continue
        line = f"{name} at {stamp}: {t.holder}, since {t.since[:19]} ({t.how} by {t.moved_by}"
        line += f", approved by {', '.join(t.approvals)})" if t.approvals else ")"
        console.print(line, highlight=False, soft_wrap=True)


def _table(found: StageHistory, model: str | None, stage: str | None) -> None:
    from registry.history import duration_text

    if not found.tenures:
        what = f"{model} has held no stage" if model else "no stage alias has moved yet"
        console.print(f"{what}{f' ({stage})' if stage else ''}. `unmask promote` moves one.", highlight=False)
    else:
        title = "stage history" + (f" of {model}" if model else "") + (f", {stage}" if stage else "")
        table = FittedTable(
            f"{title} ({'verified audit chain' if found.verified else 'UNVERIFIED audit chain'})",
            [
                Column("stage"),
                Column("holder"),
                Column("since (UTC)", wrap=True),
                Column("until (UTC)", wrap=True, drop=3),
                Column("held", drop=2),
                Column("how"),
                Column("by"),
                Column("from", drop=4),
                Column("why", wrap=True, drop=1),
                Column("signature", wrap=True, drop=5),
            ],
        )
        for t in found.tenures:
            table.add_row(
                t.stage,
                t.holder,
                t.since[:19].replace("T", " "),
                t.until[:19].replace("T", " ") if t.until else "now",
                duration_text(t.held_s()),
                t.how,
                t.moved_by + (f" (approved: {', '.join(t.approvals)})" if t.approvals else ""),
                t.previous or "nobody",
                t.why,
                t.signature,
            )
        console.print(table)
    for c in found.canaries:
        console.print(
            f"{c.how}: {c.stage}, {c.model} v{c.version} at {c.when[:19].replace('T', ' ')} by {c.who}; the alias "
            f"stayed with {c.holder or 'nobody'} ({c.why})",
            highlight=False,
            soft_wrap=True,
        )
    for e in found.pending:
        console.print(
            f"[yellow]in flight or interrupted:[/yellow] {e.stage} to {e.to_ref} by {e.who} at {e.when[:19]} "
            "(not settled: `unmask promote` or `unmask rollback` on that stage recovers it)",
            highlight=False,
        )


def _rows(found: StageHistory, output: str) -> None:
    _emit(found.rows(), output)


def _emit(rows: list[dict[str, Any]], output: str) -> None:
    """JSON (a list) or CSV (COLUMNS first, approvals joined by spaces) on stdout, as it is: for scripts."""
    if output == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    buffer = io.StringIO()
    names = list(dict.fromkeys([*(c for c in COLUMNS if any(c in r for r in rows)), *(k for r in rows for k in r)]))
    writer = csv.DictWriter(buffer, fieldnames=names or COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: " ".join(v) if isinstance(v, list) else v for k, v in r.items()})
    sys.stdout.write(buffer.getvalue())


def register(app: typer.Typer) -> None:
    app.command("history")(history_command)
