"""A broken audit chain is repaired by the on-call person, signed by their key, and audited (issue 48, item 6):
what does not verify on its own is set aside, a run status changed is put back, lost signed heads are
acknowledged, and one signed entry seals the rest; a repair by anyone else, unsigned, forged, or one whose seal
is broken later counts for nothing, and the actions a broken chain stopped work again after it."""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gates.roles import ROLES_PATH
from registry import Registry, audit, keys, repair_chain
from registry.audit import HEAD, SHA, AuditEvent
from registry.connection import AUDIT_EXPERIMENT
from registry.integrity import ChainBroken, trusted_chain
from registry.repair import RepairRefused
from registry.store import model_tag
from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import act_as, built_registry, held_at_poc
from tests.support.governance import keyed_roles

CHECKED = "checked the forged entries against the nightly's dossier; nothing real was lost"


@pytest.fixture
def reg(tmp_path, monkeypatch):
    """poc held by tiny-llada@1, under roles that list everyone's keys (olga is on call, bob approves)."""
    built = built_registry(tmp_path, held_at_poc)
    keyed_roles(tmp_path, monkeypatch)
    return built


def chain(reg) -> list:
    return sorted(reg.search_runs(AUDIT_EXPERIMENT), key=lambda r: (r.info.start_time, r.info.run_id))


def forged_move(reg, tmp_path, monkeypatch) -> AuditEvent:
    """A settled move of poc to tiny-ar@1 appended with unmask's own append by a writer without the store's key."""
    ring = tmp_path / "mallory" / "signing.keys"
    ring.parent.mkdir()
    ring.write_text(f"k1 {secrets.token_hex(32)}\n")
    monkeypatch.setenv("UNMASK_SIGNING_KEY_FILE", str(ring))
    move = AuditEvent(
        "alias_move", "mallory", "", "poc", "tiny-ar", "1", "tiny-llada@1", "tiny-ar@1", "", {"kind": "promotion"}
    )
    forged = audit.append(reg, move, open_intent=True)
    audit.settle(reg, forged, happened=True)
    monkeypatch.delenv("UNMASK_SIGNING_KEY_FILE")
    return forged


def test_a_forged_move_is_set_aside_by_the_on_call_persons_signed_repair_and_actions_work_again(
    reg, tmp_path, monkeypatch
):
    approval = next(r for r in chain(reg) if r.data.tags[model_tag("event")] == "approval")
    reg.client.set_tag(approval.info.run_id, model_tag("who"), "mallory")  # an approval edited
    forged = forged_move(reg, tmp_path, monkeypatch)
    broken = audit.verify(reg)
    assert not broken.ok and broken.first_break.run_id == approval.info.run_id, broken.summary()
    with pytest.raises(ChainBroken):
        trusted_chain(reg, "a promotion")
    # bob approves but is not on call; olga without a comment; nobody without a key: refused, audited, nothing changed
    with pytest.raises(RepairRefused, match="bob holds no emergency_rollback role at poc, staging, production"):
        repair_chain(reg, "bob", CHECKED)
    with pytest.raises(RepairRefused, match="a repair needs a comment"):
        repair_chain(reg, "olga", "  ")
    refused = audit.events(reg, event="chain_repair_refused")
    assert [e.who for e in refused] == ["bob", "olga"] and "only the on-call person" in refused[0].comment
    assert reg.client.get_run(forged.run_id).info.lifecycle_stage == "active" and not audit.verify(reg).ok

    done = repair_chain(reg, "olga", CHECKED)
    aside = {e["run_id"]: e for e in done.set_aside}
    assert set(aside) == {approval.info.run_id, forged.run_id}, done.set_aside
    assert "no longer matches its sha256" in aside[approval.info.run_id]["why"]
    assert "signature does not match under key 'k1'" in aside[forged.run_id]["why"]
    assert [e["stage"] for e in done.moves_set_aside] == ["poc"]
    assert reg.client.get_run(forged.run_id).info.lifecycle_stage == "deleted"  # kept by MLflow, read by no one
    report = audit.verify(reg)
    assert report.ok, report.summary()
    assert f"repaired at #{done.entry.seq} by olga" in report.summary() and "2 entries set aside" in report.summary()
    assert report.repair["break"] == str(broken.first_break)[:600] and "not checked" not in report.summary()
    # where the roles file lists no keys (a serving pod's bundled one) the repair holds on its entry's ring signature
    # and its seal, and the report says the person's signature was not checked
    monkeypatch.setenv("UNMASK_ROLES", str(ROLES_PATH))
    unchecked = audit.verify(reg)
    assert unchecked.ok and "(the repairer's signature not checked: no keys listed here)" in unchecked.summary()
    keyed_roles(tmp_path, monkeypatch)
    # the forged move counts for nothing: poc is where the real promotion put it, and nothing drifted
    assert audit.last_settled_move(reg, "poc").to_ref == "tiny-llada@1" and reg.holders("poc") == [("tiny-llada", "1")]
    assert forged.run_id not in {e.run_id for e in audit.events(reg)}
    trusted_chain(reg, "a promotion")  # the actions a broken chain stopped act again
    entry = audit.events(reg, event="chain_repair")[-1]
    assert entry.evidence["signed"]["key"] and entry.evidence["repair"]["set_aside"]["count"] == 2
    # the entries it sealed cannot come back or change unnoticed
    reg.client.restore_run(forged.run_id)
    back = audit.verify(reg)
    assert not back.ok and "which it sealed, were changed, removed or added to since" in back.summary()
    assert back.first_break.run_id == done.entry.run_id


def test_a_moves_status_changed_is_put_back_without_setting_the_move_aside(reg):
    move = next(r for r in chain(reg) if r.data.tags[model_tag("event")] == "alias_move")
    reg.client.set_terminated(move.info.run_id, "FAILED")  # the move said not to have happened
    assert audit.verify(reg).first_break.kind == "edited"
    done = repair_chain(reg, "olga", CHECKED)
    assert done.set_aside == [] and [e["run_id"] for e in done.restored] == [move.info.run_id]
    assert done.restored[0]["why"] == "status put back to FINISHED"
    assert reg.client.get_run(move.info.run_id).info.status == "FINISHED" and audit.verify(reg).ok
    # after the repair a sealed move's status is still checked
    reg.client.set_terminated(move.info.run_id, "FAILED")
    changed = audit.verify(reg)
    assert not changed.ok and "after the repair at" in changed.summary(), changed.summary()


def test_a_truncation_is_acknowledged_and_the_repair_numbers_past_every_lost_entry(reg, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = cli_app("promote")
    witness = tmp_path / "team-repo" / "unmask-head.txt"
    witness.parent.mkdir()
    assert CliRunner().invoke(app, ["audit", "--export-head", str(witness)]).exit_code == 0
    head = audit.verify(reg)
    runs = chain(reg)
    for run in runs[-2:]:
        reg.client.delete_run(run.info.run_id)
    tags = runs[-3].data.tags
    reg.client.set_experiment_tag(reg.experiment_id(AUDIT_EXPERIMENT), HEAD, f"{tags[audit.SEQ]}:{tags[SHA]}")
    assert audit.verify(reg).first_break.kind == "truncated"
    act_as("olga")
    done = CliRunner().invoke(
        app, ["audit", "--repair", "--witness", str(witness), "--comment", CHECKED], env={"COLUMNS": "400"}
    )
    assert done.exit_code == 0, done.output
    assert "audit chain repaired by olga as entry #" in done.output and "1 signed head(s) acknowledged" in done.output
    assert f"export a new witness: unmask audit --export-head {witness}" in done.output
    entry = audit.events(reg, event="chain_repair")[-1]
    assert entry.seq == head.head_seq + 1  # past the lost #N-1 and #N: no number means two entries
    assert entry.evidence["repair"]["acknowledged"][0]["seq"] == head.head_seq
    verified = CliRunner().invoke(app, ["audit", "--verify", "--witness", str(witness)], env={"COLUMNS": "400"})
    assert verified.exit_code == 0 and "repaired at" in verified.output, verified.output
    # nothing to repair on an intact chain: said, and nothing written
    again = CliRunner().invoke(app, ["audit", "--repair", "--comment", CHECKED], env={"COLUMNS": "400"})
    assert again.exit_code == 2 and "nothing to repair: audit chain: intact" in again.output, again.output
    assert len(audit.events(reg, event="chain_repair")) == 1


def test_a_repair_the_on_call_person_did_not_sign_counts_for_nothing(reg, tmp_path, monkeypatch):
    forged_move(reg, tmp_path, monkeypatch)
    # mallory holds the store's key ring (a store writer), not olga's key: her "repair" is one more forgery
    record = {"store": audit.verify(reg).store, "sealed": "0" * 64, "seq": 99, "set_aside": {"count": 0}}
    fingerprint, signature = keys.signer("mallory").sign(audit.repair_payload(record, "olga", CHECKED))
    fake = audit.append(
        reg,
        AuditEvent(
            "chain_repair",
            "olga",
            "",
            comment=CHECKED,
            evidence={"repair": record, "signed": {"key": fingerprint, "signature": signature}},
        ),
    )
    report = audit.verify(reg)
    assert not report.ok and report.first_break.run_id == fake.run_id, report.summary()
    assert "this repair does not count" in report.summary()
    # a revoked key repairs nothing either
    keyed_roles(tmp_path, monkeypatch, revoked={"olga": "2026-01-01T00:00:00Z"})
    with pytest.raises(RepairRefused, match="olga's key .*, revoked at 2026-01-01"):
        repair_chain(reg, "olga", CHECKED)


def test_a_store_restored_without_its_keys_folder_is_not_repaired_into_an_empty_trail(reg, tmp_path):
    db = Path(reg.tracking_uri.removeprefix("sqlite:///"))
    restored = tmp_path / "restored"
    shutil.copytree(db.parent, restored, ignore=shutil.ignore_patterns("keys"))  # database and artifacts only
    bare = Registry(f"sqlite:///{restored / db.name}")
    assert audit.verify(bare).first_break.kind == "forged"
    with pytest.raises(RepairRefused, match="restore the store's keys folder"):
        repair_chain(bare, "olga", CHECKED)
    assert len(chain(bare)) == len(chain(reg))  # nothing set aside


def test_a_removed_store_identity_is_put_back_and_entries_written_under_a_new_one_set_aside(reg):
    store = audit.verify(reg).store
    reg.client.delete_experiment_tag(reg.experiment_id(AUDIT_EXPERIMENT), audit.STORE)
    audit.forget_identity(reg)
    stray = audit.append(reg, AuditEvent("signoff", "ada", "", "poc", "tiny-llada", "1", comment="after the loss"))
    assert not audit.verify(reg).ok
    done = repair_chain(reg, "olga", CHECKED)
    assert done.identity == store and [e["run_id"] for e in done.set_aside] == [stray.run_id]
    report = audit.verify(reg)
    assert report.ok and report.store == store, report.summary()
