"""`unmask pull MODEL_ID`: fetch a catalog entry at its pinned revision, verify it, install it atomically."""

from __future__ import annotations

import typer
from rich.console import Console

from flows.failures import print_error

console = Console()


def pull_command(
    model_id: str = typer.Argument(..., help="Catalog id (see `unmask models`)."),
    catalog: str = typer.Option(None, "--catalog", help="Catalog file (default: $UNMASK_CATALOG or the bundled one)."),
    offline: bool = typer.Option(
        None, "--offline/--online", help="Use only the Hugging Face cache (default: $HF_HUB_OFFLINE)."
    ),
) -> None:
    """Pull MODEL_ID into the local model store (<state>/models/MODEL_ID)."""
    from models.catalog import CatalogError, load_catalog
    from models.pull import PullError, pull

    try:
        result = pull(model_id, catalog=load_catalog(catalog), offline=offline)
    except (CatalogError, PullError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    console.print(f"pulled [bold]{result.entry_id}[/bold] -> {result.path}", highlight=False)
    console.print(f"  {len(result.files)} files verified" + (f", commit {result.commit}" if result.commit else ""))
    for finding in result.findings:
        colour = "red" if finding["severity"] == "error" else "yellow"
        console.print(f"  [{colour}]{finding['check']} finding:[/{colour}] {finding['message']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("pull")(pull_command)
