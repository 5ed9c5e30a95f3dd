"""The `unmask` command line. Each command lives in flows/commands/<name>.py and registers here."""

from __future__ import annotations

import importlib

import typer

from flows.environment import configure_environment

app = typer.Typer(
    name="unmask",
    help="Decide whether a diffusion LLM is ready for production, and roll it out behind gates.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

@app.callback()
def root() -> None:
    """unmask: evidence and gated rollout for diffusion language models."""


# One line per command module; each module defines `register(app)`.
COMMAND_MODULES = [
    "flows.commands.generate",
    "flows.commands.pull",
    "flows.commands.models",
    "flows.commands.train",
    "flows.commands.eval",
    "flows.commands.gates",
    "flows.commands.promote",
    "flows.commands.run",
    "flows.commands.approve",
    "flows.commands.nightly",
    "flows.commands.dashboard",
    "flows.commands.bench",
    "flows.commands.serve",
    "flows.commands.loadtest",
]


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


def main() -> None:
    configure_environment()
    _register_all()
    app()


if __name__ == "__main__":
    main()
