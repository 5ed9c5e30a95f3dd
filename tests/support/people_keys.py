"""Per-person keys for the signed-acts tests: each person's key pair in the test's keys folder (as each person's
own folder would hold theirs) and a roles file listing their public keys."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from registry import keys
from tests.support.governance import ME, PEOPLE, roles_data


def keyed_roles(tmp_path: Path, monkeypatch, people=PEOPLE, revoked: dict[str, str] | None = None, **stages):
    """A key pair for each of `people` and for this OS account (`ME`, who registers the evidence and requests) in
    $UNMASK_KEYS_HOME, and roles_data() listing their public keys (a key in `revoked` gets that `revoked:` time)
    as $UNMASK_ROLES. Returns {person: Signer}."""
    home = Path(os.environ[keys.KEYS_ENV])
    signers = {p: keys.init(p, home, default=False) for p in [*people, ME] if not (home / p).exists()}
    data = roles_data(**stages)
    data["users"] = [*data["users"], ME]
    data["keys"] = {
        p: [{"key": s.public_line, "revoked": (revoked or {}).get(p, "")} if p in (revoked or {}) else s.public_line]
        for p, s in signers.items()
    }
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("UNMASK_ROLES", str(path))
    return signers
