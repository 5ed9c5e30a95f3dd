"""The audit trail as a hash chain (issue 20): every event chained onto the one before, appends that cannot
fork, and `unmask audit --verify` naming the first entry edited, removed, reordered or inserted, whether the
tampering went through the MLflow client or straight into the SQLite store."""

from __future__ import annotations

import sqlite3
import threading
import uuid

import pytest
from typer.testing import CliRunner

import registry.read as read
from registry import audit
from registry.audit import GENESIS, HEAD, PREV, SEQ, SHA, AuditEvent
from registry.connection import AUDIT_EXPERIMENT
from registry.store import Registry, model_tag
from tests.support.gate_fixtures import fresh_registry


@pytest.fixture
def reg(tmp_path):
    return fresh_registry(tmp_path)


def write_trail(reg, n: int = 5) -> list[AuditEvent]:
    """n events as unmask writes them: approvals, sign-offs and a settled alias move among them."""
    written = []
    for i in range(n):
        if i == 2:
            intent = audit.append(
                reg,
                AuditEvent(
                    "alias_move",
                    "ada",
                    "",
                    "poc",
                    "tiny-llada",
                    "1",
                    "",
                    "tiny-llada@1",
                    "promotion",
                    {"kind": "promotion", "evidence_run": "r1"},
                ),
                open_intent=True,
            )
            audit.settle(reg, intent, happened=True)
            written.append(intent)
        else:
            written.append(
                audit.append(
                    reg,
                    AuditEvent(
                        "approval" if i % 2 else "signoff",
                        f"user{i}",
                        "",
                        "poc",
                        "tiny-llada",
                        "1",
                        comment=f"event {i} reviewed",
                        evidence={"item": f"item-{i}"},
                    ),
                )
            )
    return written


def runs_in_order(reg) -> list:
    return sorted(reg.search_runs(AUDIT_EXPERIMENT), key=lambda r: r.info.start_time)


def db(reg) -> sqlite3.Connection:
    return sqlite3.connect(reg.tracking_uri.removeprefix("sqlite:///"))


def verify_cli(reg, monkeypatch):
    from tests.support.flow_fixtures import cli_app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    return CliRunner().invoke(cli_app("promote"), ["audit", "--verify"], env={"COLUMNS": "200"})


def test_each_event_is_chained_onto_the_one_before_and_the_chain_verifies(reg, monkeypatch):
    written = write_trail(reg)
    runs = runs_in_order(reg)
    assert [int(r.data.tags[SEQ]) for r in runs] == [1, 2, 3, 4, 5] == [e.seq for e in written]
    assert runs[0].data.tags[PREV] == GENESIS
    for before, after in zip(runs, runs[1:]):
        assert after.data.tags[PREV] == before.data.tags[SHA] and after.info.start_time > before.info.start_time
        assert (
            audit.entry_sha256(after.data.tags, int(after.data.tags[SEQ]), after.data.tags[PREV])
            == after.data.tags[SHA]
        )
    experiment = reg.client.get_experiment(reg.experiment_id(AUDIT_EXPERIMENT))
    assert experiment.tags[HEAD] == f"5:{runs[-1].data.tags[SHA]}"
    report = audit.verify(reg)
    assert report.status == "intact" and report.ok and (report.entries, report.chained, report.head_seq) == (5, 5, 5)
    assert read.audit_chain(reg)["summary"].startswith("audit chain: intact, 5 entries, head #5")
    events = read.audit_events(registry=reg)
    assert list(events.seq) == [1, 2, 3, 4, 5] and events.sha256.iloc[-1] == report.head_sha256
    result = verify_cli(reg, monkeypatch)
    assert result.exit_code == 0 and "audit chain: intact, 5 entries" in result.output


def test_a_settled_move_keeps_the_chain_and_its_outcome_cannot_be_changed(reg):
    intent = audit.append(reg, AuditEvent("alias_move", "ada", "", "poc", "m", "1", "", "m@1"), open_intent=True)
    assert audit.verify(reg).status == "intact"  # in flight: RUNNING, nothing settled yet
    audit.settle(reg, intent, happened=False)
    assert audit.verify(reg).status == "intact" and reg.client.get_run(intent.run_id).info.status == "FAILED"
    with db(reg) as conn:  # a failed move made to look as if it happened
        conn.execute("UPDATE runs SET status = 'FINISHED' WHERE run_uuid = ?", (intent.run_id,))
    found = audit.verify(reg).first_break
    assert (
        found.kind == "edited" and found.run_id == intent.run_id and "not the outcome that was settled" in found.detail
    )


# tampering through the MLflow client ------------------------------------------------------------------
def test_client_edit_of_a_field_is_named(reg, monkeypatch):
    written = write_trail(reg)
    reg.client.set_tag(written[1].run_id, model_tag("who"), "mallory")
    report = audit.verify(reg)
    assert report.status == "broken" and not report.ok
    assert (report.first_break.kind, report.first_break.run_id, report.first_break.seq) == (
        "edited",
        written[1].run_id,
        2,
    )
    result = verify_cli(reg, monkeypatch)
    assert result.exit_code == 1 and "BROKEN" in result.output and written[1].run_id in result.output
    assert "Traceback" not in result.output


def test_client_removal_of_an_entry_is_named(reg):
    written = write_trail(reg)
    reg.client.delete_run(written[2].run_id)
    found = audit.verify(reg).first_break
    assert found.kind == "removed" and found.run_id == written[3].run_id and "#3 before it is missing" in found.detail


def test_client_swap_of_two_entries_is_named_as_reordered(reg):
    written = write_trail(reg)
    a, b = (reg.client.get_run(e.run_id).data.tags for e in (written[0], written[1]))
    for key in [k for k in a if k.startswith("unmask.")]:
        reg.client.set_tag(written[0].run_id, key, b[key])
        reg.client.set_tag(written[1].run_id, key, a[key])
    found = audit.verify(reg).first_break
    assert found.kind == "reordered" and found.position == 1 and found.seq == 2


def test_client_insertion_between_two_entries_is_named(reg):
    written = write_trail(reg)
    runs = runs_in_order(reg)
    between = (runs[2].info.start_time + runs[3].info.start_time) // 2
    forged = {
        k: v for k, v in runs[1].data.tags.items() if k.startswith("unmask.") and not k.startswith("unmask.chain")
    }
    run = reg.client.create_run(
        reg.experiment_id(AUDIT_EXPERIMENT), start_time=between, tags=forged | {model_tag("who"): "mallory"}
    )
    found = audit.verify(reg).first_break
    assert (found.kind, found.run_id, found.position, found.seq) == ("inserted", run.info.run_id, 4, None)
    reg.client.delete_run(run.info.run_id)
    copy = reg.client.create_run(
        reg.experiment_id(AUDIT_EXPERIMENT),
        start_time=between,
        tags={k: v for k, v in runs[2].data.tags.items() if k.startswith("unmask.")},
    )
    found = audit.verify(reg).first_break  # a replayed entry, chain tags and all
    assert found.kind == "inserted" and found.run_id == copy.info.run_id and "a second entry #3" in found.detail
    assert written  # the genuine entries are still all there


def test_removing_the_newest_entry_shows_against_the_chains_head(reg):
    written = write_trail(reg)
    reg.client.delete_run(written[-1].run_id)
    found = audit.verify(reg).first_break
    assert found.kind == "removed" and found.run_id == written[-2].run_id and "head is #5" in found.detail


# tampering in the SQLite store itself -------------------------------------------------------------------
def test_sqlite_edit_of_a_tag_value_is_named(reg):
    written = write_trail(reg)
    with db(reg) as conn:
        conn.execute(
            "UPDATE tags SET value = 'tiny-ar' WHERE key = ? AND run_uuid = ?", (model_tag("model"), written[3].run_id)
        )
    found = audit.verify(reg).first_break
    assert (found.kind, found.run_id, found.seq) == ("edited", written[3].run_id, 4)


def test_sqlite_deletion_of_a_run_row_is_named(reg):
    written = write_trail(reg)
    with db(reg) as conn:
        conn.execute("DELETE FROM tags WHERE run_uuid = ?", (written[1].run_id,))
        conn.execute("DELETE FROM runs WHERE run_uuid = ?", (written[1].run_id,))
    found = audit.verify(reg).first_break
    assert found.kind == "removed" and found.run_id == written[2].run_id and "#2 before it is missing" in found.detail


def test_sqlite_swap_of_two_rows_is_named_as_reordered(reg):
    written = write_trail(reg)
    with db(reg) as conn:
        times = dict(
            conn.execute(
                "SELECT run_uuid, start_time FROM runs WHERE run_uuid IN (?, ?)", (written[3].run_id, written[4].run_id)
            ).fetchall()
        )
        conn.execute("UPDATE runs SET start_time = ? WHERE run_uuid = ?", (times[written[4].run_id], written[3].run_id))
        conn.execute("UPDATE runs SET start_time = ? WHERE run_uuid = ?", (times[written[3].run_id], written[4].run_id))
    found = audit.verify(reg).first_break
    assert (found.kind, found.run_id, found.position, found.seq) == ("reordered", written[4].run_id, 4, 5)


def test_sqlite_insertion_of_a_row_is_named(reg):
    written = write_trail(reg)
    new_id = uuid.uuid4().hex
    with db(reg) as conn:
        start = conn.execute("SELECT start_time FROM runs WHERE run_uuid = ?", (written[0].run_id,)).fetchone()[0]
        conn.execute(
            "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, status, "
            "start_time, end_time, source_version, lifecycle_stage, artifact_uri, experiment_id) SELECT ?, "
            "name, source_type, source_name, entry_point_name, user_id, status, ?, end_time, source_version, "
            "lifecycle_stage, artifact_uri, experiment_id FROM runs WHERE run_uuid = ?",
            (new_id, start + 1, written[0].run_id),
        )
        conn.execute(
            "INSERT INTO tags (key, value, run_uuid) SELECT key, value, ? FROM tags WHERE run_uuid = ? "
            "AND key NOT LIKE 'unmask.chain.%'",
            (new_id, written[1].run_id),
        )
    found = audit.verify(reg).first_break
    assert (found.kind, found.run_id, found.position) == ("inserted", new_id, 2)


# where the chain starts, and writers at once -------------------------------------------------------------
def test_a_store_with_events_from_before_the_chain_says_where_it_starts_and_seals_them(reg):
    experiment = reg.experiment_id(AUDIT_EXPERIMENT)
    old = []
    for who in ("olde", "older"):  # as the unchained trail wrote them: tags only
        run = reg.client.create_run(
            experiment,
            tags={
                model_tag("event"): "approval",
                model_tag("who"): who,
                model_tag("when"): "2026-11-01T10:00:00+00:00",
            },
        )
        reg.client.set_terminated(run.info.run_id, "FINISHED")
        old.append(run.info.run_id)
    report = audit.verify(reg)
    assert report.status == "unchained" and report.ok and "written before the chain existed" in report.summary()
    write_trail(reg, 2)
    report = audit.verify(reg)
    assert report.status == "intact" and report.legacy == 2 and report.starts_at["position"] == 3
    assert "it starts at entry 3" in report.summary() and "sealing 2 earlier unchained event(s)" in report.summary()
    assert runs_in_order(reg)[2].data.tags[PREV] != GENESIS
    reg.client.set_tag(old[0], model_tag("who"), "mallory")  # an old event edited after the chain sealed it
    found = audit.verify(reg).first_break
    assert found.kind == "edited" and found.position == 3 and "written before the chain began" in found.detail


def test_concurrent_writers_do_not_fork_the_chain(reg):
    def writer(name: str) -> None:
        own = Registry(reg.tracking_uri)  # a client of its own, as another process would have
        for i in range(6):
            audit.append(own, AuditEvent("approval", name, "", "poc", "m", "1", comment=f"{name} {i}"))

    threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    report = audit.verify(reg)
    assert report.status == "intact" and report.chained == 18 and report.head_seq == 18, report.summary()
    assert sorted(e.seq for e in audit.events(reg)) == list(range(1, 19))


def test_the_nightly_records_a_broken_chain_as_a_finding_once(reg):
    from flows.nightly import verify_audit_chain

    written = write_trail(reg)
    assert verify_audit_chain.fn(reg.tracking_uri) is None
    reg.client.set_tag(written[0].run_id, model_tag("comment"), "nothing to see")
    first = verify_audit_chain.fn(reg.tracking_uri)
    assert "BROKEN" in first and written[0].run_id in first
    assert verify_audit_chain.fn(reg.tracking_uri) == first  # the same break: reported, not recorded twice
    recorded = read.audit_events(event="integrity_finding", registry=reg)
    assert len(recorded) == 1 and recorded.evidence.iloc[0] == {
        "kind": "audit_chain",
        "break": "edited",
        "run_id": written[0].run_id,
        "seq": 1,
        "position": 1,
    }
    assert list(recorded.who) == ["nightly"]


def test_a_chain_read_while_another_writer_appends_is_never_broken(reg):
    """verify reads this machine's anchor, then the head tag, then the entries: the reverse of the order append
    writes them, so an append under way is never taken for a removed entry. Read the other way round, 22 of a
    reader's looks during 40 appends said "entry #n after it is missing: the chain's head is #n"."""
    done, breaks = threading.Event(), []

    def reader():
        looking = Registry(reg.tracking_uri)
        while not done.is_set():
            report = audit.verify(looking)
            if not report.ok:
                breaks.append(report.first_break.detail)

    looks = threading.Thread(target=reader)
    looks.start()
    try:
        writing = Registry(reg.tracking_uri)
        for i in range(20):
            audit.append(writing, AuditEvent("promotion_request", "ada", "", "poc", "tiny-llada", "1", comment=f"{i}"))
    finally:
        done.set()
        looks.join(60)
    assert breaks == [] and audit.verify(reg).ok


def test_a_chain_read_in_a_snapshot_before_another_writer_appends_is_not_broken_after_it(reg):
    """An action reads the store once (`Registry.reading`): its chain can be older than this machine's anchor file,
    which another writer moves on every append. The chain it read then ends before the anchor's head, which is no
    truncation; CI once saw a racing approval refused and a false finding recorded for it."""
    write_trail(reg, 3)
    acting = Registry(reg.tracking_uri)
    with acting.reading():
        assert audit.verify(acting).ok  # the snapshot now holds the chain up to #3
        other = Registry(reg.tracking_uri)  # another action, on its own client, appends #4 and moves the anchor
        audit.append(other, AuditEvent("approval", "linus", "", "poc", "tiny-llada", "1", comment="mine"))
        report = audit.verify(acting)
        assert report.ok and report.head_seq == 4, report.summary()  # a break seen on old reads is read again
    reg.client.delete_run(audit.events(reg)[-1].run_id)  # a real truncation still shows, in a snapshot or not
    with acting.reading():
        assert audit.verify(acting).status == "broken"
    assert "entry #4 after it is missing" in audit.verify(acting).summary()
