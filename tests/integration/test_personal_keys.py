"""Personal signing keys (registry.keys), the check of a signed act (gates.signatures) and `unmask keys` in process:
what a key folder holds, what a signature covers, and one clear line for every bad input."""

from __future__ import annotations

import os
import stat

import pytest
from typer.testing import CliRunner

from gates.signatures import PublicKey, canonical, signature_problem, verifies
from registry import keys
from tests.support.flow_fixtures import cli_app


def test_a_key_pair_is_made_private_to_its_owner_and_reads_back_as_its_person(tmp_path):
    signer = keys.init("ada", tmp_path)
    assert (
        stat.S_IMODE(os.stat(signer.path).st_mode) == 0o600
        and stat.S_IMODE(os.stat(signer.path.parent).st_mode) == 0o700
    )
    assert (tmp_path / "ada" / "id_ed25519.pub").read_text().strip() == signer.public_line
    assert signer.public_line.startswith("ssh-ed25519 AAAA") and signer.public_line.endswith(" ada")
    assert keys.default_person(tmp_path) == "ada" and keys.signer(home=tmp_path).fingerprint == signer.fingerprint
    assert keys.signer("grace", tmp_path) is None  # nobody else's key is here


def test_what_a_signature_covers_and_when_its_key_was_valid(tmp_path):
    signer = keys.init("ada", tmp_path)
    payload = {"act": "approval", "by": "ada", "comment": "ok", "at": "2026-12-05T10:00:00+00:00"}
    fingerprint, signature = signer.sign(payload)
    assert canonical(payload).startswith(b"unmask-signed-act-v1\n") and verifies(signer.public_line, payload, signature)
    assert not verifies(signer.public_line, payload | {"comment": "ok!"}, signature)
    assert not verifies(signer.public_line, payload, "not base64!") and not verifies("ssh-rsa AAAA", payload, signature)
    listed = {
        "ada": (PublicKey("ada", signer.public_line, fingerprint, "2026-12-01T00:00:00Z", "2026-12-06T00:00:00Z"),)
    }
    at = payload["at"]
    assert signature_problem(listed, "it", "ada", payload, fingerprint, signature, at) is None
    early = signature_problem(listed, "it", "ada", payload, fingerprint, signature, "2026-11-30T00:00:00Z")
    assert early and "added at 2026-12-01T00:00:00Z" in early
    late = signature_problem(listed, "it", "ada", payload, fingerprint, signature, "2026-12-07T00:00:00Z")
    assert late and "revoked at 2026-12-06T00:00:00Z" in late
    assert "it counts for nothing" in signature_problem(
        listed, "it", "ada", payload, fingerprint, signature, "yesterday"
    )
    assert "is not signed" in signature_problem(listed, "it", "ada", payload, "", "", at)


@pytest.mark.parametrize(
    "args,code,line",
    [
        (["keys", "init", "--name", "not a name!"], 2, "error: 'not a name!' is not a usable person name for a key"),
        (["keys", "show"], 1, "no key under"),
        (["keys", "rotate"], 2, "error: no key for this folder under"),
        (["keys", "revoke", "--name", "grace"], 2, "error: no key for grace under"),
    ],
)
def test_the_keys_command_refuses_bad_input_with_one_line(tmp_path, args, code, line):
    done = CliRunner().invoke(cli_app("keys"), args, env={"UNMASK_KEYS_HOME": str(tmp_path), "COLUMNS": "300"})
    assert done.exit_code == code and "Traceback" not in done.output, done.output
    assert done.output.startswith(line) and len(done.output.strip().splitlines()) == 1, done.output


def test_a_second_init_is_refused_and_a_damaged_key_file_is_named(tmp_path):
    app, env = cli_app("keys"), {"UNMASK_KEYS_HOME": str(tmp_path), "COLUMNS": "300"}
    assert CliRunner().invoke(app, ["keys", "init", "--name", "ada"], env=env).exit_code == 0
    again = CliRunner().invoke(app, ["keys", "init", "--name", "ada"], env=env)
    assert again.exit_code == 2 and "exists already; `unmask keys rotate` makes a new one" in again.output
    (tmp_path / "ada" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\ngarbage\n")
    damaged = CliRunner().invoke(app, ["keys", "show"], env=env)
    assert damaged.exit_code == 2 and "id_ed25519: not an unencrypted OpenSSH private key" in damaged.output
