"""Nothing acts on untrusted history or evidence (issue 36, items 5 and 7): each forgery a store writer can make
without the signing key is caught, and neither rollback, promotion, approval, the gates, the dossier nor the
server acts on it; a signed head kept outside the store catches a truncation or a consistent rewrite."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from registry import EvidenceTampered, PromotionRefused, Registry, approve, audit, judge, promote, rollback, signing
from registry.audit import HEAD, PREV, SETTLED, SETTLED_SHA, SHA, SIG, AuditEvent, entry_sha256, settle_sha256
from registry.connection import AUDIT_EXPERIMENT
from registry.integrity import DIGEST_PREFIX, ChainBroken, GateReportTampered
from registry.store import model_tag
from registry.tracking import load_gate_report
from tests.support.flow_fixtures import cli_app
from tests.support.forgery import artifact_file, flip_gate_report, forge_records
from tests.support.gate_fixtures import OK, built_registry, fresh_registry, held_at_poc, register_pair, sign_all


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


@pytest.fixture
def poc_held(tmp_path):
    return built_registry(tmp_path, held_at_poc)


def chain(reg) -> list:
    return sorted(reg.search_runs(AUDIT_EXPERIMENT), key=lambda r: r.info.start_time)


def the_move(reg):
    return next(r for r in chain(reg) if r.data.tags[model_tag("event")] == "alias_move")


def set_head(reg, run) -> None:
    tags = reg.client.get_run(run.info.run_id).data.tags
    reg.client.set_experiment_tag(
        reg.experiment_id(AUDIT_EXPERIMENT), HEAD, f"{tags[model_tag('chain.seq')]}:{tags[SHA]}"
    )


def rehash_from(reg, first) -> None:
    """Recompute every hash from entry `first` on, as a forger who knows the scheme (not the key) would."""
    runs = chain(reg)
    prev = runs[first - 1].data.tags[SHA] if first else audit.GENESIS
    for run in runs[first:]:
        tags = reg.client.get_run(run.info.run_id).data.tags
        sha = entry_sha256(tags, int(tags[model_tag("chain.seq")]), prev)
        reg.client.set_tag(run.info.run_id, PREV, prev)
        reg.client.set_tag(run.info.run_id, SHA, sha)
        if SETTLED in tags:
            reg.client.set_tag(run.info.run_id, SETTLED_SHA, settle_sha256(sha, tags[SETTLED]))
        prev = sha
    set_head(reg, runs[-1])


def mallory_ring(tmp_path):
    """The key ring of a store writer who does not hold ours: one key under the same id, another secret."""
    ring = tmp_path / "mallory" / "signing.keys"
    ring.parent.mkdir()
    ring.write_text(f"k1 {secrets.token_hex(32)}\n")
    return ring


def refuses_to_act(reg, kind: str) -> None:
    """Rollback, promotion and approval all refuse, naming the first bad entry; poc stays where it is."""
    before = reg.holders("poc")
    report = audit.verify(reg)
    assert not report.ok and report.first_break.kind == kind, report.summary()
    with pytest.raises(
        ChainBroken, match=f"rollback of poc refused: .*BROKEN at entry {report.first_break.position} .*was {kind}"
    ):
        rollback("poc", who="oncall", registry=reg)
    with pytest.raises(ChainBroken, match="promotion of tiny-ar v1 to poc refused"):
        promote("tiny-ar", "poc", approver="grace", comment=OK, version="1", registry=reg)
    with pytest.raises(ChainBroken, match="approval of tiny-ar v1 for poc refused"):
        approve(reg, "tiny-ar", "1", "poc", "grace", OK)
    assert reg.holders("poc") == before
    assert "\n" not in str(ChainBroken(report, "x"))  # one line


# the audit trail ------------------------------------------------------------------------------------------------
def test_entries_are_signed_and_the_verified_head_is_kept_outside_the_store(poc_held):
    reg = poc_held
    report = audit.verify(reg)
    assert report.ok and report.anchor.startswith(f"unmask-chain-anchor:{report.head_seq}:{report.head_sha256}:k1:")
    ring = signing.key_ring(reg.tracking_uri)
    assert (
        ring.source == str(signing.keys_dir(reg.tracking_uri) / "signing.keys")
        and oct(os.stat(ring.source).st_mode)[-3:] == "600"
    )
    assert all(
        ring.problem(signing.head_message(int(r.data.tags[model_tag("chain.seq")]), r.data.tags[SHA]), r.data.tags[SIG])
        is None
        for r in chain(reg)
    )
    kept = signing.local_anchor(reg.tracking_uri, report.store)  # found by the store's identity, not its URI
    assert (kept.seq, kept.sha256) == (report.head_seq, report.head_sha256)
    move = audit.events(reg, event="alias_move")[-1]
    assert move.evidence["chain_head"].startswith("unmask-chain-anchor:")  # the signed head it was judged on


def test_an_edited_entry_is_caught_and_nothing_acts_on_it(poc_held):
    poc_held.client.set_tag(the_move(poc_held).info.run_id, model_tag("from"), "tiny-ar@1")
    refuses_to_act(poc_held, "edited")


def test_a_consistent_rewrite_with_the_head_tag_is_caught_by_its_signatures(poc_held):
    reg = poc_held
    runs = chain(reg)
    at = runs.index(next(r for r in runs if r.info.run_id == the_move(reg).info.run_id))
    reg.client.set_tag(runs[at].info.run_id, model_tag("from"), "tiny-ar@1")
    rehash_from(reg, at)
    refuses_to_act(reg, "forged")
    assert audit.verify(reg).first_break.run_id == runs[at].info.run_id


@pytest.mark.parametrize("stripped", ["one entry", "every entry"])
def test_a_signature_stripped_once_entries_are_signed_is_tampering_not_unverified(poc_held, monkeypatch, stripped):
    """With a signing key configured, an entry without its signature after signed ones is forged: `audit --verify`
    says BROKEN (exit 1) and nothing acts on it. Stripping every signature is caught at the signed head this
    machine kept outside the store."""
    reg = poc_held
    move = the_move(reg)
    for run in [move] if stripped == "one entry" else chain(reg):
        reg.client.delete_tag(run.info.run_id, SIG)
    report = audit.verify(reg)
    assert not report.ok and report.first_break.kind == "forged" and "carries no signature" in report.summary()
    if stripped == "one entry":
        assert report.first_break.run_id == move.info.run_id
    refuses_to_act(reg, "forged")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    done = CliRunner().invoke(cli_app("promote"), ["audit", "--verify"], env={"COLUMNS": "400"})
    assert done.exit_code == 1 and "BROKEN" in done.output and "carries no signature" in done.output, done.output
    assert "unverified" not in done.output


def test_an_entry_appended_with_unmasks_own_append_by_a_writer_without_the_key_is_caught(
    poc_held, monkeypatch, tmp_path
):
    reg = poc_held
    monkeypatch.setenv("UNMASK_SIGNING_KEY_FILE", str(mallory_ring(tmp_path)))  # a key of its own, not ours
    forged = audit.append(
        reg,
        AuditEvent(
            "alias_move",
            "oncall",
            "",
            "poc",
            "tiny-llada",
            "1",
            "tiny-ar@1",
            "tiny-llada@1",
            "promotion",
            {"kind": "promotion"},
        ),
        open_intent=True,
    )
    audit.settle(reg, forged, happened=True)
    monkeypatch.delenv("UNMASK_SIGNING_KEY_FILE")
    refuses_to_act(reg, "forged")
    report = audit.verify(reg)
    assert report.first_break.run_id == forged.run_id and "signature does not match under key 'k1'" in report.summary()


def test_a_truncation_with_the_head_reset_is_caught_against_the_signed_head_kept_outside(poc_held):
    reg = poc_held
    runs = chain(reg)
    for run in runs[-2:]:
        reg.client.delete_run(run.info.run_id)
    set_head(reg, runs[-3])
    refuses_to_act(reg, "truncated")


def test_audit_verify_anchor_catches_a_rewrite_and_a_truncation_even_by_a_key_holder(poc_held, monkeypatch, tmp_path):
    reg = poc_held
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = cli_app("promote")
    done = CliRunner().invoke(app, ["audit", "--verify"], env={"COLUMNS": "400"})
    assert done.exit_code == 0 and "signed head: unmask-chain-anchor:" in done.output, done.output
    saved = tmp_path / "anchor.txt"
    saved.write_text(done.output)
    # someone who holds the key and the state folder rewrites the trail and re-signs it: only the anchor knows
    ring = signing.key_ring(reg.tracking_uri)
    runs = chain(reg)
    reg.client.set_tag(runs[0].info.run_id, model_tag("comment"), "rewritten")
    rehash_from(reg, 0)
    for run in chain(reg):
        tags = reg.client.get_run(run.info.run_id).data.tags
        reg.client.set_tag(
            run.info.run_id, SIG, ring.sign(signing.head_message(int(tags[model_tag("chain.seq")]), tags[SHA]))
        )
    signing.local_anchor_path(reg.tracking_uri, audit.verify(reg).store).unlink()  # this machine's anchor, gone
    assert CliRunner().invoke(app, ["audit", "--verify"], env={"COLUMNS": "400"}).exit_code == 0
    done = CliRunner().invoke(app, ["audit", "--verify", "--anchor", str(saved)], env={"COLUMNS": "400"})
    assert done.exit_code == 1 and "was rewritten" in done.output and str(saved) in done.output, done.output
    missing = CliRunner().invoke(app, ["audit", "--verify", "--anchor", str(tmp_path / "nope")], env={"COLUMNS": "400"})
    assert missing.exit_code == 2 and missing.output.startswith("error: --anchor"), missing.output
    # entries after a kept head removed (and the head tag reset): the anchor names the missing entry
    later = audit.verify(reg).head_seq + 5
    kept = signing.Anchor(later, "a" * 64, ring.sign(signing.head_message(later, "a" * 64)), "a dossier")
    report = audit.verify(reg, kept)
    assert report.first_break.kind == "truncated" and f"signed head in a dossier is #{later}" in report.summary()
    unsigned = signing.Anchor(later, "a" * 64, "k1:" + "0" * 64, "a dossier")
    with pytest.raises(Exception, match="not signed by the key ring"):
        audit.verify(reg, unsigned)


def test_the_nightly_keeps_the_signed_head_and_its_rollback_refuses_a_broken_chain(poc_held):
    from flows.nightly import record_regression, signed_chain_head

    reg = poc_held
    assert signed_chain_head.fn(reg.tracking_uri) == audit.verify(reg).anchor != ""
    reg.client.set_tag(the_move(reg).info.run_id, model_tag("from"), "tiny-ar@1")
    assert signed_chain_head.fn(reg.tracking_uri) == ""

    class Verdict:  # what record_regression reads of a production verdict
        model, version, failed = "tiny-llada", "1", []
        decision = type("D", (), {"evidence": {}})()

        def to_dict(self):
            return {"failed": []}

    done = record_regression.fn(Verdict(), reg.tracking_uri, roll_back=True)
    assert not done["rolled_back"] and "refused: nothing acts on an audit trail" in done["refused"][0]


# evidence -------------------------------------------------------------------------------------------------------
def test_evidence_rewritten_with_its_sha256_tag_is_caught_by_its_signature_and_moves_nothing(reg, monkeypatch):
    _, v = register_pair(reg)
    run_id = reg.version_tags("tiny-llada", v)["unmask.evidence_run"]
    _, forged = forge_records(reg)
    reg.client.set_tag(run_id, DIGEST_PREFIX + "evidence/records.json", forged)  # the hash rewritten to match
    with pytest.raises(EvidenceTampered, match="evidence/records.json .*whose signature does not match"):
        judge(reg, "tiny-llada", v, "poc")
    with pytest.raises(EvidenceTampered):
        approve(reg, "tiny-llada", v, "poc", "grace", OK)
    with pytest.raises(EvidenceTampered):
        promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    assert reg.holders("poc") == []
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    done = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada"], env={"COLUMNS": "400"})
    assert done.exit_code == 2 and "whose signature does not match" in done.output and "100%" not in done.output


def test_a_gate_report_rewritten_with_its_sha256_tag_is_caught_and_no_dossier_is_built_on_it(reg):
    from dashboards.dossier.content import DossierError, dossier_content

    _, v = register_pair(reg)
    judge(reg, "tiny-llada", v, "staging")
    assert load_gate_report(reg, "tiny-llada", v, "staging")["integrity"] == "verified"
    flip_gate_report(reg)
    data = artifact_file(reg, "tiny-llada", v, "gates/staging.json").read_bytes()
    reg.client.set_model_version_tag(
        "tiny-llada", v, model_tag("gates.staging.sha256"), hashlib.sha256(data).hexdigest()
    )
    with pytest.raises(GateReportTampered, match="gates/staging.json .*whose signature does not match"):
        load_gate_report(reg, "tiny-llada", v, "staging")
    with pytest.raises(GateReportTampered):
        dossier_content(reg, "tiny-llada", v)
    judge(reg, "tiny-llada", v, "poc")
    audit.append(reg, AuditEvent("signoff", "ada", "", "poc", "tiny-llada", v, comment="ok"))
    first = chain(reg)[0]
    reg.client.set_tag(first.info.run_id, model_tag("comment"), "edited")
    with pytest.raises(DossierError, match="no dossier is built on an audit trail that does not verify"):
        dossier_content(reg, "tiny-llada", v, stage="poc")


# the server -----------------------------------------------------------------------------------------------------
def test_the_server_does_not_follow_a_drifted_alias_and_alerts_once(poc_held, caplog):
    from registry import serving

    reg = poc_held
    assert serving.holders(reg, ["poc"]) == {"poc": ("tiny-llada", "1")}
    reg.client.set_registered_model_alias("tiny-ar", "poc", "1")  # behind unmask's back: no recorded move
    reg.client.delete_registered_model_alias("tiny-llada", "poc")
    with caplog.at_level(logging.ERROR, logger="unmask.registry"):
        assert serving.holders(reg, ["poc"]) == {"poc": ("tiny-llada", "1")}  # the verified holder keeps serving
        assert serving.holders(reg, ["poc"]) == {"poc": ("tiny-llada", "1")}
    alerts = [r for r in caplog.records if r.levelno == logging.ERROR and "alert: alias poc drifted" in r.message]
    assert len(alerts) == 1 and "keeps serving tiny-llada/1" in alerts[0].message


def test_the_server_and_recovery_do_not_follow_a_forged_move_intent(poc_held, monkeypatch, tmp_path):
    from registry import recover, serving

    reg = poc_held
    monkeypatch.setenv("UNMASK_SIGNING_KEY_FILE", str(mallory_ring(tmp_path)))  # a key of its own, not ours
    audit.append(
        reg,
        AuditEvent(
            "alias_move",
            "oncall",
            "",
            "poc",
            "tiny-ar",
            "1",
            "tiny-llada@1",
            "tiny-ar@1",
            "promotion",
            {"kind": "promotion"},
        ),
        open_intent=True,
    )
    reg.client.set_registered_model_alias("tiny-ar", "poc", "1")  # the alias moved to match the forged intent
    monkeypatch.delenv("UNMASK_SIGNING_KEY_FILE")
    with pytest.raises(ChainBroken, match="following the registry's aliases refused: .*was forged"):
        serving.holders(reg, ["poc"])
    with pytest.raises(ChainBroken, match="recovery of poc refused"):
        recover(reg, "poc")
    assert [e.status for e in audit.events(reg, event="alias_move")][-1] == "RUNNING"  # not settled as a promotion
    with pytest.raises((ChainBroken, PromotionRefused)):
        rollback("poc", who="oncall", registry=reg)


# the store's identity, and a witness kept outside it (issue 48) ---------------------------------------------------
def test_the_same_store_under_another_uri_spelling_or_copied_keeps_its_anchor(poc_held, tmp_path, monkeypatch):
    reg = poc_held
    store = audit.verify(reg).store
    assert len(store) == 32 and signing.local_anchor_path(reg.tracking_uri, store).name == f"anchor-{store}.json"
    db = Path(reg.tracking_uri.removeprefix("sqlite:///"))
    runs = chain(reg)
    for run in runs[-2:]:  # truncated, and the head tag reset: only the anchor this machine kept knows
        reg.client.delete_run(run.info.run_id)
    set_head(reg, runs[-3])
    monkeypatch.chdir(db.parent.parent)
    relative = Registry(f"sqlite:///{db.parent.name}/{db.name}")  # the same file, spelled relative
    assert relative.tracking_uri != reg.tracking_uri
    report = audit.verify(relative)
    assert report.store == store and report.first_break.kind == "truncated", report.summary()
    # a copy of the store (database and its keys folder, as a backup holds them) is the same store: same verdict
    copy = tmp_path / "copy"
    shutil.copytree(db.parent, copy)
    copied = Registry(f"sqlite:///{copy / db.name}")
    signing.remember(copied.tracking_uri, signing.local_anchor(reg.tracking_uri, store), store)  # this machine's
    assert audit.verify(copied).first_break.kind == "truncated"
    # removing the identity tag to lose the anchor is itself named
    experiment = reg.experiment_id(AUDIT_EXPERIMENT)
    reg.client.delete_experiment_tag(experiment, audit.STORE)
    gone = audit.verify(reg)
    assert not gone.ok and "but the store's identity tag is gone: it was changed" in gone.summary()


def test_two_remembering_at_once_keep_the_newer_head_whichever_writes_last(tmp_path, monkeypatch):
    """Two processes of one machine verify the chain at once (a nightly and a server) and remember heads 7 and 6. Each
    read what was kept before either wrote, and the older head wrote last: the kept anchor went back to 6, and a
    truncation by one entry would pass against it. The read, the comparison and the write now hold one lock, so the
    second reads the first's head. The hooks below order the two the bad way whenever they can: each read waits for
    the other's, and 6's write waits for 7's (each for at most half a second: under the lock they never come)."""
    import threading

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    both_read, seven_written, reads = threading.Event(), threading.Event(), []
    real_kept, real_write = signing._kept_anchor, signing.write_json_atomic

    def kept(*args, **kwargs):
        found = real_kept(*args, **kwargs)
        reads.append(found)
        if len(reads) == 2:
            both_read.set()
        both_read.wait(0.5)
        return found

    def write(path, data, **kwargs):
        if data["seq"] == 6:
            seven_written.wait(0.5)
        real_write(path, data, **kwargs)
        if data["seq"] == 7:
            seven_written.set()

    monkeypatch.setattr(signing, "_kept_anchor", kept)
    monkeypatch.setattr(signing, "write_json_atomic", write)
    heads = [signing.Anchor(seq, str(seq) * 64, f"k1:{seq}", "a verify") for seq in (7, 6)]
    threads = [threading.Thread(target=signing.remember, args=(uri, head)) for head in heads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    monkeypatch.undo()
    assert signing.local_anchor(uri).seq == 7
    assert signing.signed_since(uri) in (6, 7)  # 6 when it came first: the first head seen, which 7 never raises


def test_a_witness_exported_outside_the_store_catches_a_later_truncation_and_names_a_foreign_one(
    poc_held, tmp_path, monkeypatch
):
    reg = poc_held
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    app = cli_app("promote")
    witness = tmp_path / "team-repo" / "unmask-head.txt"
    witness.parent.mkdir()
    done = CliRunner().invoke(app, ["audit", "--export-head", str(witness)], env={"COLUMNS": "400"})
    assert done.exit_code == 0 and f"witness written: {witness}" in done.output, done.output
    text = witness.read_text()
    assert f"unmask-store:{audit.verify(reg).store}" in text and "unmask-chain-anchor:" in text
    ok = CliRunner().invoke(app, ["audit", "--verify", "--witness", str(witness)], env={"COLUMNS": "400"})
    assert ok.exit_code == 0 and "audit chain: intact" in ok.output, ok.output
    # the tail removed, the head tag reset, and this machine's own anchor deleted: the witness still knows
    runs = chain(reg)
    reg.client.delete_run(runs[-1].info.run_id)
    set_head(reg, runs[-2])
    signing.local_anchor_path(reg.tracking_uri, audit.verify(reg, None).store).unlink(missing_ok=True)
    cut = CliRunner().invoke(app, ["audit", "--verify", "--witness", str(witness)], env={"COLUMNS": "400"})
    assert cut.exit_code == 1 and "truncated" in cut.output.lower() and str(witness) in cut.output, cut.output
    # another store's witness is named as such, not as a truncation of this one
    other = fresh_registry(tmp_path / "other")
    sign_all(other, "tiny-llada", register_pair(other)[1], "poc")  # a chain of its own
    foreign = tmp_path / "other-head.txt"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other.tracking_uri)
    assert CliRunner().invoke(app, ["audit", "--export-head", str(foreign)]).exit_code == 0
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    named = CliRunner().invoke(app, ["audit", "--verify", "--witness", str(foreign)], env={"COLUMNS": "400"})
    assert named.exit_code == 2 and "another store's witness" in named.output, named.output
    assert "truncated" not in named.output


def test_a_store_restored_without_its_keys_folder_says_to_restore_it_and_with_it_verifies(poc_held, tmp_path):
    reg = poc_held
    db = Path(reg.tracking_uri.removeprefix("sqlite:///"))
    restored = tmp_path / "restored"
    shutil.copytree(db.parent, restored, ignore=shutil.ignore_patterns("keys"))  # database and artifacts only
    bare = audit.verify(Registry(f"sqlite:///{restored / db.name}"))
    assert bare.first_break.kind == "forged", bare.summary()
    assert "a key ring made after it was signed: if the store was restored or copied, restore its keys/ folder" in (
        bare.summary()
    )
    shutil.rmtree(restored / "keys")
    shutil.copytree(db.parent / "keys", restored / "keys")  # the backup as docs/team-setup.md says to take it
    assert audit.verify(Registry(f"sqlite:///{restored / db.name}")).ok


def test_an_emergency_rollback_to_the_fallback_works_on_a_broken_chain_and_names_the_break(poc_held, monkeypatch):
    reg = poc_held
    reg.client.set_tag(the_move(reg).info.run_id, model_tag("comment"), "edited")  # the chain no longer verifies
    with pytest.raises(ChainBroken, match="--to-fallback` still moves a stage to the fallback"):
        rollback("poc", who="oncall", registry=reg)
    assert reg.holders("poc") == [("tiny-llada", "1")]
    move = rollback("poc", who="oncall", comment="the trail is broken; AR takes poc", registry=reg, to_fallback=True)
    assert move.to_holder == ("tiny-ar", "1") and reg.holders("poc") == [("tiny-ar", "1")]
    assert "BROKEN at entry" in move.evidence["broken_chain"] and move.evidence["target"] == "fallback"
    assert not audit.verify(reg).ok  # still broken: the move is recorded, nothing is repaired by it
    # the CLI: the same flag, one line
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    done = CliRunner().invoke(
        cli_app("promote"), ["rollback", "--stage", "poc", "--to-fallback"], env={"COLUMNS": "300"}
    )
    assert done.exit_code != 0 and "Traceback" not in done.output  # tiny-ar already holds poc: nothing to roll back
