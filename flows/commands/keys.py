"""`unmask keys`: your own Ed25519 signing key (init, show, rotate, revoke), kept in your configuration folder; and
`store-rotate`, a new Ed25519 key for the store's signing ring.

Where the roles file lists public keys, an approval or sign-off counts only when a key listed for its signer
signed it (docs/governance.md). The private key never leaves `$UNMASK_KEYS_HOME` (default
~/.config/unmask/keys); what these commands print is the public line a roles file lists.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
keys_app = typer.Typer(help="Your personal signing key: make, show, rotate or revoke it.", no_args_is_help=True)


def _listed(fingerprint: str) -> str:
    """Whether the roles file in use lists this key, and for whom, in words."""
    from gates.roles import RolesError, load_roles

    try:
        roles = load_roles()
    except RolesError as e:
        return f"the roles file cannot be read: {e}"
    owner = next((p for p, ks in roles.keys.items() if any(k.fingerprint == fingerprint for k in ks)), None)
    if owner:
        return f"listed for {owner} in {roles.path or roles.source}"
    return f"not listed in {roles.path or roles.source}: add it under keys: for the acts you sign to count"


def _fail(e: Exception) -> NoReturn:
    from flows.failures import print_error

    print_error(console, e)
    raise typer.Exit(2) from None


@keys_app.command("init")
def init(
    name: str = typer.Option(..., "--name", help="Who you are, as the roles file names you (ada, grace, ...)."),
) -> None:
    """Make your key pair; print the public line for the roles file."""
    from registry import keys

    try:
        signer = keys.init(name)
    except keys.PersonalKeyError as e:
        _fail(e)
    console.print(f"key of {signer.person}: {signer.path} (private, mode 0600)", highlight=False)
    console.print(f"fingerprint: {signer.fingerprint}", highlight=False)
    console.print("add to the roles file, under keys:", highlight=False)
    console.print(f"  {signer.person}: [{escape(repr(signer.public_line))}]", highlight=False, soft_wrap=True)


@keys_app.command("show")
def show(name: str = typer.Option(None, "--name", help="Whose key (default: who this keys folder acts as).")) -> None:
    """Show who you sign as, your key's fingerprint and public line, and whether the roles file lists it."""
    from registry import keys

    try:
        signer = keys.signer(name)
    except keys.PersonalKeyError as e:
        _fail(e)
    if signer is None:
        whose = f" for {name}" if name else ""
        console.print(f"no key{whose} under {keys.keys_home()}; `unmask keys init --name NAME` makes one")
        raise typer.Exit(1)
    console.print(f"signs as: {signer.person}", highlight=False)
    console.print(f"fingerprint: {signer.fingerprint}", highlight=False)
    console.print(f"public key: {signer.public_line}", highlight=False, soft_wrap=True)
    console.print(_listed(signer.fingerprint), highlight=False)


@keys_app.command("rotate")
def rotate(name: str = typer.Option(None, "--name", help="Whose key (default: who this keys folder acts as).")) -> None:
    """Make a new key pair; the old one is retired. List the new key, then revoke the old one in the roles file."""
    from registry import keys

    try:
        old, signer = keys.rotate(name)
    except keys.PersonalKeyError as e:
        _fail(e)
    console.print(f"new key of {signer.person}: {signer.fingerprint} (retired {old})", highlight=False)
    console.print(f"add to the roles file: {signer.public_line}", highlight=False, soft_wrap=True)
    console.print(f"and give the old key {old} a revoked: time there once the new one is listed", highlight=False)


@keys_app.command("revoke")
def revoke(name: str = typer.Option(None, "--name", help="Whose key (default: who this keys folder acts as).")) -> None:
    """Retire your key for good and print the revoked: entry for the roles file."""
    from registry import keys

    try:
        old, when = keys.revoke(name)
    except keys.PersonalKeyError as e:
        _fail(e)
    console.print(f"revoked {old.fingerprint} of {old.person} at {when}; in the roles file, under keys:")
    console.print(f"  {old.person}: [{{key: {old.public_line!r}, revoked: {when!r}}}]", highlight=False, soft_wrap=True)
    console.print("signatures it made before that time still count; none after it do", highlight=False)


@keys_app.command("store-rotate")
def store_rotate() -> None:
    """Put a new Ed25519 key first in the store's signing ring (not a personal key): it signs from now on, the older
    keys still verify, and its public half is published beside the ring for accounts that only verify."""
    from registry import Registry, RegistryError, signing

    try:
        reg = Registry()
        key_id, path = signing.rotate_ring(reg.tracking_uri)
    except RegistryError as e:
        _fail(e)
    console.print(f"store signing key {key_id} (ed25519) signs from now on: {path}", highlight=False)
    console.print(
        f"public ring: {signing.public_ring_path(reg.tracking_uri)} (readable by every account)", highlight=False
    )
    console.print(
        "the older keys still verify what they signed; copy the new ring to every host that writes", highlight=False
    )


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
