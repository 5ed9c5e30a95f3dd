"""`unmask models`: the catalog as a table (id, kind, role, license and its class, size, pulled or not, memory fit)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from flows.commands.pull import DEVICE_HELP, DTYPE_HELP, MEMORY_HELP, entry_fit
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error

if TYPE_CHECKING:
    from sampler.fit import MemoryFit

console = table_console(200)


def human_count(n: int | None) -> str:
    if not n:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def fit_cell(fit: MemoryFit | None) -> str:
    """The fit column: verdict, then need (known terms; `+?` for unknown ones) against have, in GiB."""
    from sampler.fit import DOES_NOT_FIT, FITS

    if fit is None:
        return "api"
    need = f"{fit.need_known / 2**30:.1f}" + ("+?" if fit.unknown else "")
    have = f"{fit.have / 2**30:.1f} GiB"
    if fit.verdict == DOES_NOT_FIT:
        return f"[red]no[/red] {need} > {have}"
    return f"[green]fits[/green] {need}/{have}" if fit.verdict == FITS else f"? {need}/{have}"


def models_command(
    catalog: str = typer.Option(None, "--catalog", help="Catalog file (default: $UNMASK_CATALOG or the bundled one)."),
    explain: bool = typer.Option(False, "--explain", help="Add a column saying why an entry cannot run now."),
    device: str = typer.Option("cpu", "--device", help=DEVICE_HELP),
    memory: str = typer.Option(None, "--memory", help=MEMORY_HELP),
    dtype: str = typer.Option(None, "--dtype", help=DTYPE_HELP),
) -> None:
    """List the candidate catalog, with each entry's license class and memory fit."""
    from models.adapters import availability
    from models.catalog import CatalogError, load_catalog
    from models.pull import entry_path, pulled_path, read_findings
    from sampler.fit import parameters_on_disk

    try:
        entries = load_catalog(catalog, tolerant=True)  # one broken entry is marked, the others still listed
        fits = {entry.id: entry_fit(entry, device, memory, dtype) for entry in entries}
    except (CatalogError, ValueError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    # at 80 columns the size goes first, then `pulled` and the kind (with --explain, the status says them in words)
    columns = [
        Column("id"),
        Column("kind", drop=1),
        Column("role"),
        Column("license", wrap=True),
        Column("class", drop=4),
        Column("size", "right", drop=3),
        Column("pulled", drop=2),
        Column("fit", drop=5),
    ]
    table = FittedTable(
        f"candidate catalog ({entries.path})", columns + ([Column("status", wrap=True)] if explain else [])
    )
    for entry in entries:
        pulled = pulled_path(entry.id)
        if entry.is_api:
            state = "api"
        elif pulled is not None:
            state = "[green]pulled[/green]" + (" [red](findings)[/red]" if read_findings(pulled) else "")
        elif entry.source.scheme == "local" and availability(entry)[0]:
            state = "[green]local[/green]"
        else:
            state = "no"
        size = entry.parameters
        if size is None and state != "no" and not entry.is_api:
            size = parameters_on_disk(entry_path(entry))
        row = [entry.id, entry.kind, entry.role, entry.license_label, entry.license_class, human_count(size), state]
        row.append(fit_cell(fits[entry.id]))
        if explain:
            row.append(availability(entry)[1])
        table.add_row(*row)
    for label, _ in entries.broken:
        table.add_row(
            label,
            "-",
            "-",
            "-",
            "-",
            "-",
            "[red]broken[/red]",
            "-",
            *(["invalid entry: see the error below"] if explain else []),
        )
    console.print(table)
    for _, error in entries.broken:
        print_error(console, error)
    if entries.broken:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
