"""Verification needs only read access and public keys (issue 48, item 4): the store's key ring is an Ed25519 key
whose public half its writers publish beside it (`<ring>.pub`, world-readable), and an account that cannot read the
ring (a second OS account, an auditor's laptop with a copy of the public ring) verifies the chain and the evidence
with it, gets the same answer as the writer, and cannot sign."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from registry import Registry, audit, signing
from registry.audit import AuditEvent
from registry.signing import SigningKeyError
from registry.store import model_tag
from registry.tracking import evidence_integrity
from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import built_registry, fresh_registry, held_at_poc, register_pair, sign_all

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def reg(tmp_path):
    return built_registry(tmp_path, held_at_poc)


def keys_of(reg) -> Path:
    return Path(reg.tracking_uri.removeprefix("sqlite:///")).parent / "keys"


def the_approval(reg):
    return next(e for e in audit.events(reg) if e.event == "approval")


def test_the_ring_is_an_ed25519_key_and_its_public_half_is_published_beside_it(reg):
    ring, public = keys_of(reg) / "signing.keys", keys_of(reg) / "signing.keys.pub"
    assert ring.read_text().startswith("k1 ed25519:") and oct(ring.stat().st_mode)[-3:] == "600"
    assert public.read_text().startswith("k1 ed25519-public:") and oct(public.stat().st_mode)[-3:] == "644"
    assert "ed25519:" not in public.read_text().replace("ed25519-public:", "")  # no private half in it
    head = audit.verify(reg)
    assert head.ok and len(head.anchor.rsplit(":", 1)[1]) == 128  # an Ed25519 signature, not a MAC


def test_an_auditor_with_a_copy_of_the_public_ring_gets_the_writers_answer_and_cannot_sign(reg, tmp_path, monkeypatch):
    db = Path(reg.tracking_uri.removeprefix("sqlite:///"))
    view = tmp_path / "auditor" / "store"  # the store as the auditor reads it: no ring in it
    shutil.copytree(db.parent, view, ignore=shutil.ignore_patterns("signing.keys", "anchor-*"))
    public = tmp_path / "auditor" / "team-signing.pub"  # from the team's repository, say
    shutil.copy(keys_of(reg) / "signing.keys.pub", public)
    (view / "keys" / "signing.keys.pub").unlink()
    monkeypatch.setenv(signing.PUBLIC_ENV, str(public))
    auditor = Registry(f"sqlite:///{view / db.name}")
    writer_says, auditor_says = audit.verify(reg), audit.verify(auditor)
    assert auditor_says.ok and (auditor_says.head_seq, auditor_says.head_sha256) == (
        writer_says.head_seq,
        writer_says.head_sha256,
    )
    assert not (view / "keys" / "signing.keys").exists()  # a reader given the public keys makes no ring
    assert evidence_integrity(auditor, "tiny-llada", "1")["status"] == "verified"
    with pytest.raises(SigningKeyError, match="holds public keys only: this account verifies the store"):
        audit.append(auditor, AuditEvent("signoff", "mallory", "", "poc", "tiny-llada", "1"))
    # a change the writer's verify names, the auditor's names alike
    for r in (reg, auditor):
        r.client.set_tag(the_approval(r).run_id, model_tag("who"), "mallory")
    broken_w, broken_a = audit.verify(reg), audit.verify(auditor)
    assert not broken_a.ok and str(broken_a.first_break) == str(broken_w.first_break)


def test_a_second_os_account_that_cannot_read_the_ring_verifies_with_the_published_public_ring(reg):
    ring = keys_of(reg) / "signing.keys"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNMASK_SIGNING")}
    env |= {"MLFLOW_TRACKING_URI": reg.tracking_uri, "PYTHONPATH": str(ROOT), "COLUMNS": "300"}
    # the second account: this one without the right to read what its mode forbids (root drops it; others have none)
    reader = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    command = [*reader, sys.executable, "-m", "flows.cli", "audit", "--verify"]
    os.chmod(ring, 0)
    try:
        assert subprocess.run([*reader, "cat", str(ring)], capture_output=True).returncode != 0  # it really cannot
        intact = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert intact.returncode == 0 and "audit chain: intact" in intact.stdout, intact.stdout + intact.stderr
        reg.client.set_tag(the_approval(reg).run_id, model_tag("who"), "mallory")
        broken = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert broken.returncode == 1 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    finally:
        os.chmod(ring, 0o600)


def on_a_shared_secret(tmp_path, monkeypatch):
    """A fresh registry whose ring ($UNMASK_SIGNING_KEY_FILE, `tmp_path`/keys/ring) holds a shared HMAC secret, as
    rings made before public keys do."""
    secret = tmp_path / "keys" / "ring"
    secret.parent.mkdir()
    secret.write_text("k1 " + "ab" * 32 + "\n")
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(secret))
    return fresh_registry(tmp_path)


def test_entries_signed_with_a_shared_secret_say_they_verify_only_where_the_ring_is_read(tmp_path, monkeypatch):
    reg = on_a_shared_secret(tmp_path, monkeypatch)
    sign_all(reg, "tiny-llada", register_pair(reg)[1], "poc")
    assert audit.verify(reg).ok  # where the ring is read
    assert (tmp_path / "keys" / "ring.pub").read_text() == "k1 hmac\n"
    monkeypatch.delenv(signing.KEY_FILE_ENV)  # another account: the public ring only
    monkeypatch.setenv(signing.PUBLIC_ENV, str(tmp_path / "keys" / "ring.pub"))
    assert not signing.ring_path(reg.tracking_uri).exists()
    elsewhere = audit.verify(reg)
    assert not elsewhere.ok and "a shared secret that only the ring's holders can check" in elsewhere.summary()


def test_store_rotate_puts_an_ed25519_key_first_and_publishes_it(tmp_path, monkeypatch):
    reg = on_a_shared_secret(tmp_path, monkeypatch)
    secret = tmp_path / "keys" / "ring"
    register_pair(reg)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    done = CliRunner().invoke(cli_app("keys"), ["keys", "store-rotate"], env={"COLUMNS": "300"})
    assert done.exit_code == 0 and f"store signing key k2 (ed25519) signs from now on: {secret}" in done.output
    assert secret.read_text().startswith("k2 ed25519:") and secret.read_text().endswith("k1 " + "ab" * 32 + "\n")
    assert oct(secret.stat().st_mode)[-3:] == "600"
    published = (tmp_path / "keys" / "ring.pub").read_text().splitlines()
    assert published[0].startswith("k2 ed25519-public:") and published[1] == "k1 hmac"
    entry = audit.append(reg, AuditEvent("signoff", "ada", "", "poc", "tiny-llada", "1"))
    key_id, _, signature = reg.client.get_run(entry.run_id).data.tags[audit.SIG].partition(":")
    assert key_id == "k2" and len(signature) == 128  # Ed25519 from here on
    assert audit.verify(reg).ok  # old entries under k1, the new one under k2
