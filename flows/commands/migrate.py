"""`unmask migrate`: vouch, signed with your own key, for evidence registered before it could be signed.

Evidence registered before the roles file listed keys (or by a process without one) counts for nothing at staging
and production, and where the roles file lists keys at any stage. A person who has checked it can vouch for it: if
its hashes still verify, their listed key signs its registration and they become its registrant for the four-eyes
rules (so they may not approve it past poc). Audited (`evidence_vouched`, or `vouch_refused` with why). Evidence
with no hashes, or changed since it was registered, cannot be vouched for: measure it again.
"""

from __future__ import annotations

import typer
from rich.console import Console

from flows.failures import print_error

console = Console()


def migrate_command(
    model: str = typer.Argument(..., help="Registered model (candidate id)."),
    comment: str = typer.Option(..., "--comment", "-c", help="What you checked before vouching for it."),
    version: str = typer.Option(None, "--version", help="The version (default: candidate)."),
    by: str = typer.Option(None, "--by", help="Must be you, if given."),
) -> None:
    """Vouch for MODEL's evidence with your key: re-sign a registration no listed key signed (audited)."""
    from gates import RolesError
    from registry import CANDIDATE_ALIAS, ApprovalRefused, Registry, RegistryError, vouch
    from registry.identity import claimed_actor

    try:
        registry = Registry()
        version = version or registry.aliases_of(model).get(CANDIDATE_ALIAS)
        if not version:
            raise RegistryError(f"{model} has no `candidate` version; give --version")
        me = claimed_actor(registry, by, "--by", f"vouching for {model} v{version}", "", model, version)
        key = vouch(registry, model, version, comment, me)
    except ApprovalRefused as e:
        console.print(str(e), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    except (RolesError, RegistryError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    console.print(
        f"evidence of {model} v{version} vouched for by {me.name}, signed with {key}", highlight=False, soft_wrap=True
    )


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate_command)
