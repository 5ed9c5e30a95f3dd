"""`unmask weights push MODEL VERSION [--from FOLDER]`: a registered version's weights into the registry's artifact
store, where a serving host without the folder (a pod) fetches them, checked by sha256 (registry/weights.py)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from flows.failures import print_error

console = Console()
weights_app = typer.Typer(
    help="A registered version's weights in the registry, for serving hosts that lack its folder.", no_args_is_help=True
)


@weights_app.command("push")
def push_command(
    model: str = typer.Argument(..., help="The registered model."),
    version: str = typer.Argument(..., help="Its version."),
    folder: Path = typer.Option(
        None, "--from", help="The folder that was evaluated (default: where the version's source resolves here)."
    ),
) -> None:
    """Upload a version's weights folder as artifacts of its evidence run, refused unless it hashes to the weights
    sha256 recorded for the version; `unmask serve` on a host without the folder then fetches them."""
    from registry import Registry, RegistryError
    from registry.weights import ARTIFACT_TAG, push_weights

    try:
        registry = Registry()
        pushed = push_weights(registry, model, version, folder)
    except RegistryError as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    console.print(
        f"pushed {len(pushed.artifact.files)} files of {model} version {version} from {pushed.folder} to "
        f"{pushed.artifact} in {registry.tracking_uri}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"  weights sha256 {pushed.weights_sha256}; where they are: the version's tag {ARTIFACT_TAG}")
    for name, why in pushed.left_out.items():
        console.print(f"  left out {name}: {why}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(weights_app, name="weights")
