"""Each person's own signing key: an Ed25519 key pair in the person's configuration folder, never in the store.

The keys folder is `$UNMASK_KEYS_HOME`, else `$XDG_CONFIG_HOME/unmask/keys`, else `~/.config/unmask/keys`. It
holds one folder per person it signs for (`<person>/id_ed25519`, OpenSSH format, mode 0600, and its `.pub`
line) and `identity`, the person this folder acts as by default. `ssh-keygen -y -f <person>/id_ed25519` reads
the private key; `ssh-keygen -l -f <person>/id_ed25519.pub` prints the fingerprint the roles file and the
signed records name. The roles file lists each person's public keys (`gates.signatures`); a rotated key moves
to `<person>/retired/`, and a revoked one is said so in the roles file (`revoked:` time).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gates.signatures import canonical, fingerprint
from registry.connection import RegistryError
from registry.store import now_iso

KEYS_ENV = "UNMASK_KEYS_HOME"
PERSON = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
PRIVATE, PUBLIC, IDENTITY = "id_ed25519", "id_ed25519.pub", "identity"


class PersonalKeyError(RegistryError):
    """A personal key that cannot be made, read or used (named with its path)."""


@dataclass(frozen=True)
class Signer:
    """One person's private key, ready to sign an act's payload."""

    person: str
    key: Ed25519PrivateKey
    path: Path

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.key.public_key())

    @property
    def public_line(self) -> str:
        raw = self.key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        return f"{raw.decode()} {self.person}"

    def sign(self, payload: Mapping[str, Any]) -> tuple[str, str]:
        """(this key's fingerprint, the base64 signature of `payload`'s canonical bytes)."""
        return self.fingerprint, base64.b64encode(self.key.sign(canonical(payload))).decode()


def keys_home() -> Path:
    """The folder of this user's personal keys (see the module's docstring)."""
    given = os.environ.get(KEYS_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip()
    return (Path(config).expanduser() if config else Path.home() / ".config") / "unmask" / "keys"


def _checked(person: str) -> str:
    name = (person or "").strip()
    if not PERSON.match(name):
        raise PersonalKeyError(
            f"{person!r} is not a usable person name for a key (letters, digits, '.', '_', '@' or '-', up to 64)"
        )
    return name


def init(person: str, home: Path | None = None, default: bool = True) -> Signer:
    """Make `person`'s key pair (refused when one exists: rotate it instead); with `default`, this folder then acts
    as `person`."""
    person, home = _checked(person), home or keys_home()
    folder = home / person
    if (folder / PRIVATE).exists():
        raise PersonalKeyError(f"{folder / PRIVATE} exists already; `unmask keys rotate` makes a new one")
    signer = _write(folder, Ed25519PrivateKey.generate(), person)
    if default:
        (home / IDENTITY).write_text(person + "\n")
    return signer


def _write(folder: Path, key: Ed25519PrivateKey, person: str) -> Signer:
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    fd = os.open(folder / PRIVATE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    signer = Signer(person, key, folder / PRIVATE)
    (folder / PUBLIC).write_text(signer.public_line + "\n")
    return signer


def rotate(person: str | None = None, home: Path | None = None) -> tuple[str, Signer]:
    """A new key pair for `person` (default: this folder's identity); the old one moves to `retired/`. Returns the
    old key's fingerprint and the new signer: list the new public key in the roles file, and revoke the old one
    there (signatures made before its `revoked:` time still count)."""
    old, _ = _retire(person, home or keys_home(), "")
    return old.fingerprint, _write(old.path.parent, Ed25519PrivateKey.generate(), old.person)


def revoke(person: str | None = None, home: Path | None = None) -> tuple[Signer, str]:
    """Retire `person`'s key here for good (no new key) and say when: the roles file then gives that key a
    `revoked:` of that time, after which nothing it signs counts."""
    return _retire(person, home or keys_home(), "revoked.")


def _retire(person: str | None, home: Path, label: str) -> tuple[Signer, str]:
    """Move `person`'s key pair into `<person>/retired/`, named by the time (and `label`); the key and that time."""
    old = signer(person, home)
    if old is None:
        raise PersonalKeyError(
            f"no key for {person or 'this folder'} under {home}; `unmask keys init --name NAME` makes one"
        )
    when = now_iso()
    retired = old.path.parent / "retired"
    retired.mkdir(mode=0o700, exist_ok=True)
    stamp = when.replace(":", "").replace("+", "_")
    old.path.rename(retired / f"{stamp}.{label}{PRIVATE}")
    (old.path.parent / PUBLIC).rename(retired / f"{stamp}.{label}{PUBLIC}")
    return old, when


def default_person(home: Path | None = None) -> str | None:
    """Who this keys folder acts as (its `identity` file), or None when it has none."""
    home = home or keys_home()
    try:
        name = (home / IDENTITY).read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PersonalKeyError(f"{home / IDENTITY} cannot be read ({e.strerror or e})") from None
    return _checked(name) if name else None


def signer(person: str | None = None, home: Path | None = None) -> Signer | None:
    """`person`'s signing key from this user's keys folder (default: its identity), or None when it holds none."""
    home = home or keys_home()
    name = person if person is not None else default_person(home)
    if not name or not PERSON.match(name.strip()):
        return None
    path = home / name.strip() / PRIVATE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise PersonalKeyError(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise PersonalKeyError(f"{path}: not an unencrypted OpenSSH private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise PersonalKeyError(f"{path}: not an Ed25519 key")
    return Signer(name.strip(), key, path)
