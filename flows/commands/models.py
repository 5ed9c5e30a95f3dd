"""`unmask models`: the catalog as a table (id, kind, role, license, size, pulled or not)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error

console = table_console(200)


def human_count(n: int | None) -> str:
    if not n:
        return "?"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def parameters_on_disk(folder: Path) -> int | None:
    """Count parameters from the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    total = 0
    files = sorted(folder.glob("*.safetensors"))
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                total += n
    return total or None


def models_command(
    catalog: str = typer.Option(None, "--catalog", help="Catalog file (default: $UNMASK_CATALOG or the bundled one)."),
    explain: bool = typer.Option(False, "--explain", help="Add a column saying why an entry cannot run now."),
) -> None:
    """List the candidate catalog."""
    from models.adapters import availability
    from models.catalog import CatalogError, load_catalog
    from models.pull import entry_path, pulled_path, read_findings

    try:
        entries = load_catalog(catalog, tolerant=True)  # one broken entry is marked, the others still listed
    except CatalogError as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    # at 80 columns the size goes first, then `pulled` and the kind (with --explain, the status says them in words)
    columns = [
        Column("id"),
        Column("kind", drop=1),
        Column("role"),
        Column("license", wrap=True),
        Column("size", "right", drop=3),
        Column("pulled", drop=2),
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
        row = [entry.id, entry.kind, entry.role, entry.license_label, human_count(size), state]
        if explain:
            row.append(availability(entry)[1])
        table.add_row(*row)
    for label, _ in entries.broken:
        table.add_row(
            label, "-", "-", "-", "-", "[red]broken[/red]", *(["invalid entry: see the error below"] if explain else [])
        )
    console.print(table)
    for _, error in entries.broken:
        print_error(console, error)
    if entries.broken:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.command("models")(models_command)
