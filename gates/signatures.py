"""Acts signed by the people who made them: Ed25519 public keys (OpenSSH lines) and the check of a signature.

A roles file lists each person's public keys (`keys:` in gates/roles.yaml, the allowed-signers idea of git's
signed commits). An approval or a sign-off counts only if its signature verifies, under a key listed for the
person it names, over its canonical payload (`canonical`): the act, model, version, stage, request, who,
when, what was said and the audit chain head it followed. A copy of a signed act onto another version, an
edited comment or a name swapped after signing no longer verifies. Pure functions: the private keys and
the signing itself live in `registry.keys`.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

DOMAIN = b"unmask-signed-act-v1\n"  # what a signature covers starts here: never valid as another protocol's message
KEY_TYPE = "ssh-ed25519"
SIGNED = "ed25519-key"  # the identity source of a name proved by a key the roles file lists (registry.identity)


class KeyFormatError(ValueError):
    """A public key line that is not an OpenSSH Ed25519 key."""


@dataclass(frozen=True)
class PublicKey:
    """One public key of one person, from when (`added`) and until when (`revoked`, "" while valid)."""

    person: str
    line: str  # "ssh-ed25519 AAAA... comment"
    fingerprint: str  # "SHA256:<base64>", as `ssh-keygen -l` prints it
    added: str = ""  # ISO time; signatures dated before it do not count ("" = always)
    revoked: str = ""  # ISO time; signatures dated at or after it do not count ("" = never)

    def valid_at(self, at: str) -> bool:
        """Whether a signature dated `at` (ISO) is within the key's life; an unreadable time is not."""
        when = _time(at)
        if when is None:
            return False
        added, revoked = _time(self.added), _time(self.revoked)
        return (added is None or when >= added) and (revoked is None or when < revoked)


def _time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def parse_public_key(line: str, where: str) -> tuple[Ed25519PublicKey, str]:
    """The key and its fingerprint from an OpenSSH public key line; a `KeyFormatError` naming `where` else."""
    text = str(line or "").strip()
    if not text.startswith(KEY_TYPE + " "):
        raise KeyFormatError(
            f"{where}: expected an OpenSSH Ed25519 public key ('{KEY_TYPE} AAAA...'), got {text[:40]!r}"
        )
    try:
        key = serialization.load_ssh_public_key(text.encode())
    except (ValueError, TypeError) as e:
        raise KeyFormatError(f"{where}: not a readable {KEY_TYPE} key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFormatError(f"{where}: not an Ed25519 key")
    return key, fingerprint(key)


def fingerprint(key: Ed25519PublicKey) -> str:
    """`SHA256:` and the unpadded base64 of the SHA-256 of the key's OpenSSH wire form (as ssh-keygen shows it)."""
    blob = base64.b64decode(
        key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).split()[1]
    )
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def canonical(payload: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the domain line, then the payload as sorted, compact JSON."""
    return DOMAIN + json.dumps(dict(payload), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def verifies(line: str, payload: Mapping[str, Any], signature: str) -> bool:
    """Whether `signature` (base64) signs `payload` under the public key `line`."""
    try:
        key, _ = parse_public_key(line, "key")
        key.verify(base64.b64decode(signature, validate=True), canonical(payload))
    except (KeyFormatError, InvalidSignature, ValueError):
        return False
    return True


def signature_problem(
    keys: Mapping[str, tuple[PublicKey, ...]],
    what: str,
    person: str,
    payload: Mapping[str, Any],
    key: str,
    signature: str,
    at: str,
) -> str | None:
    """Why the act `what` (named for messages) does not count as `person`'s, or None when a key the roles file
    lists for `person`, valid at `at`, signed it. `key` is the fingerprint the act names, `signature` its base64."""
    if not signature or not key:
        return (
            f"{what} is not signed: only an act signed by a key the roles file lists for {person} counts "
            "(`unmask keys init`, docs/governance.md)"
        )
    theirs = keys.get(person, ())
    listed = next((k for k in theirs if k.fingerprint == key), None)
    if listed is None:
        owner = next((p for p, ks in keys.items() if any(k.fingerprint == key for k in ks)), None)
        whose = f"a key of {owner}" if owner else "a key the roles file does not list"
        return f"{what} is signed with {key}, {whose}, not one of {person}'s; it counts for nothing"
    if not verifies(listed.line, payload, signature):
        return f"{what} does not match its signature by {key}: it was changed after signing; it counts for nothing"
    if not listed.valid_at(at):
        when = (
            f"added at {listed.added}"
            if listed.added and not PublicKey("", "", "", listed.added).valid_at(at)
            else (f"revoked at {listed.revoked}")
        )
        return f"{what} is signed at {at} with {person}'s key {key}, {when}; it counts for nothing"
    return None
