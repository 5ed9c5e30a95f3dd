"""Signatures a store writer cannot forge: HMAC-SHA256 under a key the MLflow store does not hold.

The audit chain's entries (each one's `seq:sha256`, so the newest one is the signed head) and the sha256
tags of evidence artifacts and gate reports are signed with the signing key. Someone who can write the
store (the MLflow client, the UI, SQL on the database) but not read the key cannot rewrite a hash and its
signature together. Keys (docs/integrity.md):

- `UNMASK_SIGNING_KEY` = `<key id>:<secret>`: the key that signs (and verifies);
- `UNMASK_SIGNING_KEY_FILE`: a key ring, one `<key id> <secret>` a line; the first line signs unless
  `UNMASK_SIGNING_KEY` is set, every line verifies (rotation: put the new key first, keep the old ones);
- neither set: `keys/signing.keys` beside a SQLite store (the state folder's `keys/` for the embedded one;
  every user of the file shares that folder, as with the locks), under the state folder for a tracking
  server; generated (mode 0600) on first use.

A signed head (`Anchor`) kept outside the store — in a dossier, a promotion's audit entry, the nightly's
report, or this machine's `keys/anchor-<store>.json` — lets `verify` notice a truncation or a consistent
rewrite even by someone who holds the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from evals.store import write_json_atomic
from models.state import state_dir
from registry.connection import RegistryError

KEY_ENV, KEY_FILE_ENV = "UNMASK_SIGNING_KEY", "UNMASK_SIGNING_KEY_FILE"
KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,40}$")
STORE_ID = re.compile(r"^[0-9a-f]{32}$")  # a store's identity (registry.audit.store_identity): uuid4 hex
STORE_LINE = re.compile(r"unmask-store:([0-9a-f]{32})")
ANCHOR = re.compile(r"unmask-chain-anchor:(\d+):([0-9a-f]{64}):([A-Za-z0-9._-]{1,40}):([0-9a-f]{64})")


class SigningKeyError(RegistryError):
    """The signing key or key ring cannot be read or is malformed (named with where it came from)."""


@dataclass(frozen=True)
class KeyRing:
    """The key that signs and every key that verifies, by key id."""

    signing_id: str
    keys: dict[str, bytes]
    source: str  # where the signing key came from (an environment variable or a file path)

    def sign(self, message: str) -> str:
        """`<key id>:<hex HMAC-SHA256>` of `message` under the signing key."""
        return f"{self.signing_id}:{_mac(self.keys[self.signing_id], message)}"

    def problem(self, message: str, signature: str) -> str | None:
        """None when `signature` signs `message` under a key of the ring, else why not (one phrase)."""
        key_id, _, mac = signature.partition(":")
        if key_id not in self.keys:
            return f"is by key {key_id or '?'!r}, which is not in the key ring ({self.source})"
        if not hmac.compare_digest(_mac(self.keys[key_id], message), mac):
            return f"does not match under key {key_id!r}"
        return None


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def keys_dir(tracking_uri: str) -> Path:
    """The default keys folder of a store: beside a SQLite file (outside the store itself), else the state
    folder's."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).parent / "keys"
    return state_dir() / "keys"


def ring_path(tracking_uri: str) -> Path:
    """The key ring file in use: $UNMASK_SIGNING_KEY_FILE, else the store's default."""
    file = os.environ.get(KEY_FILE_ENV, "").strip()
    return Path(file).expanduser() if file else keys_dir(tracking_uri) / "signing.keys"


def _parse_ring(text: str, where: str) -> list[tuple[str, bytes]]:
    found: list[tuple[str, bytes]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key_id, _, secret = line.partition(" ")
        secret = secret.strip()
        if not KEY_ID.match(key_id) or len(secret) < 16:
            raise SigningKeyError(
                f"{where} line {number}: expected '<key id> <secret>' (id of letters, digits, '.', '_' "
                "or '-'; a secret of 16 characters or more)"
            )
        if any(key_id == k for k, _ in found):
            raise SigningKeyError(f"{where} line {number}: key id {key_id!r} is given twice")
        found.append((key_id, secret.encode()))
    return found


def _generated(path: Path) -> str:
    """The default key ring's text, creating it with one fresh key (readable by its owner only) on first use."""
    try:
        return path.read_text()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return path.read_text()
    with os.fdopen(fd, "w") as f:
        f.write(f"k1 {secrets.token_hex(32)}\n")
    return path.read_text()


def key_ring(tracking_uri: str) -> KeyRing:
    """The ring from the environment, else the store's default file (generated on first use)."""
    ring: list[tuple[str, bytes]] = []
    source = ""
    given = os.environ.get(KEY_ENV, "").strip()
    if given:
        key_id, _, secret = given.partition(":")
        if not KEY_ID.match(key_id) or len(secret) < 16:
            raise SigningKeyError(f"${KEY_ENV}: expected '<key id>:<secret>' (a secret of 16 characters or more)")
        ring, source = [(key_id, secret.encode())], f"${KEY_ENV}"
    file = os.environ.get(KEY_FILE_ENV, "").strip()
    path = ring_path(tracking_uri)
    if file or not given or path.exists():
        try:
            text = path.read_text() if file or given else _generated(path)
        except OSError as e:
            raise SigningKeyError(
                f"signing key ring {path} ({'$' + KEY_FILE_ENV if file else 'default'}) cannot be read: "
                f"{e.strerror or e}"
            ) from None
        more = [(k, s) for k, s in _parse_ring(text, str(path)) if k not in dict(ring)]
        if not ring and not more:
            raise SigningKeyError(f"signing key ring {path} holds no key")
        ring += more
        source = source or str(path)
    return KeyRing(ring[0][0], dict(ring), source)


# signed messages -----------------------------------------------------------------------------------------
def head_message(seq: int, sha256: str) -> str:
    """What an audit chain entry's signature covers: its place and hash (the newest one is the signed head)."""
    return f"unmask-chain:{seq}:{sha256}"


def artifact_message(run_id: str, path: str, sha256: str) -> str:
    """What an artifact's signature covers: the run it belongs to, its path and its sha256."""
    return f"unmask-artifact:{run_id}:{path}:{sha256}"


@dataclass(frozen=True)
class Anchor:
    """A signed chain head kept outside the store: entry `seq` had hash `sha256`, signed `signature`."""

    seq: int
    sha256: str
    signature: str  # "<key id>:<hex mac>"
    where: str = ""  # where it was read from, for messages
    store: str = ""  # the identity of the store whose head it is (a witness names it; "" where unknown)

    def __str__(self) -> str:
        return f"unmask-chain-anchor:{self.seq}:{self.sha256}:{self.signature}"

    def witness(self, exported_at: str) -> str:
        """The text of a witness file (`unmask audit --export-head`): the store's identity and its signed head."""
        return (
            "# the signed head of an unmask audit chain, kept outside the store; check the store against it with\n"
            "#   unmask audit --verify --witness THIS_FILE\n"
            f"# exported {exported_at}\nunmask-store:{self.store}\n{self}\n"
        )

    @classmethod
    def parse(cls, text: str, where: str = "") -> Anchor | None:
        """The last signed head written in `text` (a dossier, a JSON file, a report, a witness), or None."""
        found = ANCHOR.findall(text)
        if not found:
            return None
        seq, sha, key_id, mac = found[-1]
        stores = STORE_LINE.findall(text)
        return cls(int(seq), sha, f"{key_id}:{mac}", where, stores[-1] if stores else "")


def anchor_from_file(path: str | Path, flag: str = "--anchor") -> Anchor:
    """The signed head in a file (a witness, a dossier's HTML, a nightly report, a saved `unmask audit --verify`
    line); `flag` names the option it came from in messages."""
    file = Path(path)
    try:
        text = file.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise RegistryError(f"{flag} {file}: cannot be read ({e.strerror or e})") from None
    anchor = Anchor.parse(text, str(file))
    if anchor is None:
        raise RegistryError(
            f"{flag} {file}: holds no signed chain head (a line 'unmask-chain-anchor:SEQ:SHA256:"
            "KEY:SIGNATURE', as `unmask audit --export-head`, a dossier or `unmask audit --verify` writes it)"
        )
    return anchor


def local_anchor_path(tracking_uri: str, store: str = "") -> Path:
    """This machine's last signed head of a store (outside the store, beside the key ring): named by the store's
    identity (`registry.audit.STORE`), so the same store under any URI spelling, or copied, finds it; by the
    URI for a store that has no identity yet."""
    name = store if store and STORE_ID.match(store) else hashlib.sha256(tracking_uri.encode()).hexdigest()[:12]
    return ring_path(tracking_uri).parent / f"anchor-{name}.json"


def local_anchor(tracking_uri: str, store: str = "") -> Anchor | None:
    kept = _kept_anchor(tracking_uri, store)
    return kept[0] if kept else None


def remember(tracking_uri: str, anchor: Anchor, store: str = "") -> None:
    """Keep `anchor` as this machine's signed head of the store, unless it already knows a newer one, and the
    first seq it saw signed (`signed_since`), which a newer head never raises."""
    kept = _kept_anchor(tracking_uri, store)
    if kept is not None and kept[0].seq >= anchor.seq:
        return
    write_json_atomic(
        local_anchor_path(tracking_uri, store),
        {
            "seq": anchor.seq,
            "sha256": anchor.sha256,
            "signature": anchor.signature,
            "tracking_uri": tracking_uri,
            "store": store,
            "signed_since": anchor.seq if kept is None else kept[1],
        },
    )


def signed_since(tracking_uri: str, store: str = "") -> int | None:
    """The first chain entry this machine saw signed: every entry from it on must carry a signature, so one
    stripped of it (or every one stripped) is forged, never unsigned. None before this machine saw one."""
    kept = _kept_anchor(tracking_uri, store)
    return kept[1] if kept else None


def _kept_anchor(tracking_uri: str, store: str = "") -> tuple[Anchor, int] | None:
    """This machine's anchor file, read once: the anchor and its `signed_since` (an anchor kept before that field
    existed, or one out of range: its own head). None when there is no file. A store with an identity reads the
    file kept under its URI before it had one, until it keeps its own."""
    path = local_anchor_path(tracking_uri, store)
    if store and not path.exists():
        path = local_anchor_path(tracking_uri)
    try:
        data = json.loads(path.read_text())
        anchor = Anchor(
            int(data["seq"]), str(data["sha256"]), str(data["signature"]), f"{path} (this machine's anchor)"
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RegistryError(
            f"this machine's chain anchor {path} cannot be read ({e}); it is written by unmask only: "
            "see docs/integrity.md"
        ) from None
    since = data.get("signed_since", anchor.seq)
    return anchor, since if isinstance(since, int) and 0 < since <= anchor.seq else anchor.seq
