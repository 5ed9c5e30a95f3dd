"""Canary evidence shared by replicas on several machines (issue 49, item 3), on a real PostgreSQL: one contract
for both stores (the folder and the team PostgreSQL, serving/evidence.py), three request logs on three machines
read back as their union, a PostgreSQL outage that loses no row, errors that never show the password, and the
analysis endpoint's verdict equal from either store."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml

from evals.evidence_store import EvidenceError, PostgresEvidence
from registry.clock import SimulatedClock
from serving.evidence import FolderEvidence, checked_evidence_url, open_evidence
from serving.request_log import RequestLog, row
from tests.support.postgres_fixtures import database_name, pause_postgres, resume_postgres, start_postgres
from tests.support.postgres_fixtures import stop_postgres as remove_postgres
from tests.support.servers import free_port

pytestmark = pytest.mark.timeout(180)

NOW = datetime(2026, 12, 6, 12, 0, 30, tzinfo=UTC)  # asked now, a 600 s window judges [11:50, 12:00)
IN_WINDOW = datetime(2026, 12, 6, 11, 55, tzinfo=UTC)
SECRET = "s3cret-pw"


def with_password(url: str) -> str:
    """The URL with a password in it (the throwaway cluster trusts loopback, so it connects all the same)."""
    return url.replace("unmask@", f"unmask:{SECRET}@")


@pytest.fixture
def pg_url(postgres) -> str:
    return with_password(postgres.create_database(database_name("evidence")))


@pytest.fixture(params=["folder", "postgres"])
def store_at(request, tmp_path):
    """Open the store of this kind, once per call: two calls are two replicas (two connections, or two objects on
    one folder)."""
    location = tmp_path / "evidence" if request.param == "folder" else request.getfixturevalue("pg_url")
    opened = []

    def store():
        opened.append(open_evidence(location))
        return opened[-1]

    yield store
    for s in opened:
        s.close()


def request_row(at: datetime, **fields) -> dict:
    base = {"endpoint": "completions", "status": 200, "route": "default", "arm": "staging", "latency_s": 0.1}
    return row(**(base | fields)) | {"time": at.isoformat(timespec="milliseconds")}


def stored(url: str) -> list[dict]:
    reader = PostgresEvidence(url)
    try:
        return reader.read_requests()
    finally:
        reader.close()


def test_both_stores_keep_the_same_evidence(store_at):
    writer, reader = store_at(), store_at()
    rows = [request_row(IN_WINDOW + timedelta(seconds=i), request_id=f"r{i}") for i in range(10)]
    writer.append_requests(rows[5:], "host_b-2-x-00001", "host_b")
    writer.append_requests(rows[:5], "host_a-1-x-00001", "host_a")
    writer.append_requests(rows[:5], "host_a-1-x-00001", "host_a")  # retried or adopted again: written once
    window = reader.read_requests(IN_WINDOW + timedelta(seconds=2), IN_WINDOW + timedelta(seconds=7))
    assert [r["request_id"] for r in window] == ["r2", "r3", "r4", "r5", "r6"]  # [since, until), oldest first
    assert sorted(r["request_id"] for r in reader.read_requests()) == sorted(f"r{i}" for i in range(10))
    assert window[0] == rows[2]  # every column as written

    probes = [
        {"time": (IN_WINDOW + timedelta(seconds=i)).isoformat(), "route": "default", "arm": arm, "key": f"k{i}"}
        | {"correct": i % 2 == 0, "agrees": True, "latency_s": 0.2, "status": 200}
        for i, arm in enumerate(["staging", "fallback", "staging"])
    ]
    writer.append_probes("default", probes)
    writer.append_probes("other", probes[:1])
    assert reader.read_probes("default", IN_WINDOW + timedelta(seconds=1)) == probes[1:]
    assert reader.read_probes("default", None, IN_WINDOW + timedelta(seconds=1)) == probes[:1]

    rollout = ("default", "staging", "fallback", "rs-6d9f8c7b", 600.0)
    end = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert writer.look_number(rollout, end) == reader.look_number(rollout, end) == 1  # one window, one number
    assert reader.look_number(rollout, end + timedelta(minutes=10)) == 2  # per window judged, not per call
    assert writer.look_number(rollout, end) == 1 and writer.look_number(rollout, end + timedelta(minutes=10)) == 2
    assert writer.look_number(rollout[:3] + ("rs-0a1b2c3d", 600.0), end + timedelta(minutes=10)) == 1  # new revision

    # retention: a week; the writer removes what is older (request rows by prune, probes as it appends)
    now = datetime.now(UTC)
    old = [request_row(now - timedelta(days=8), request_id="old")]
    writer.append_requests(old, "host_a-1-x-00002", "host_a")
    writer.append_probes("default", [probes[0] | {"time": (now - timedelta(days=8)).isoformat(), "key": "old"}])
    writer.append_requests([request_row(now, request_id="new")], "host_a-1-x-00003", "host_a")
    assert "old" in {r["request_id"] for r in reader.read_requests()}
    writer.prune(now)
    writer.append_probes("default", [probes[0] | {"time": now.isoformat(), "key": "new"}])
    assert {r["request_id"] for r in reader.read_requests()} & {"old", "new"} == {"new"}
    assert {p["key"] for p in reader.read_probes("default")} & {"old", "new"} == {"new"}


def test_three_replicas_on_three_machines_are_read_back_as_their_union(pg_url, tmp_path):
    """Each replica journals to its own machine's folder (no shared volume) and flushes to the one PostgreSQL."""
    logs = [
        RequestLog(tmp_path / f"machine-{i}", flush_s=0.05, store=PostgresEvidence(pg_url), host=f"replica_{i}")
        for i in range(3)
    ]
    for n in range(60):
        logs[n % 3].append(request_row(IN_WINDOW + timedelta(milliseconds=10 * n), request_id=f"q{n}"))
    logs[0].append(request_row(IN_WINDOW + timedelta(minutes=10), request_id="later"))  # outside the window
    for log in logs:
        log.close()
    assert not list(tmp_path.glob("machine-*/journal-*.jsonl"))  # every journal written, then removed
    reader = open_evidence(pg_url)
    try:
        window = reader.read_requests(IN_WINDOW, IN_WINDOW + timedelta(minutes=5))
    finally:
        reader.close()
    assert sorted(r["request_id"] for r in window) == sorted(f"q{n}" for n in range(60))
    with psycopg.connect(pg_url) as connection:
        hosts = connection.execute("SELECT host, count(*) FROM unmask_requests GROUP BY host ORDER BY host").fetchall()
    assert hosts == [("replica_0", 21), ("replica_1", 20), ("replica_2", 20)]


def test_rows_outlive_a_postgres_outage_in_the_journal_and_are_written_once_it_returns(tmp_path, caplog):
    pg = start_postgres()  # its own cluster: this test stops it
    try:
        url = with_password(pg.create_database(database_name("outage")))
        log = RequestLog(tmp_path, flush_s=0.05, store=PostgresEvidence(url, connect_timeout_s=1), host="replica")
        with caplog.at_level(logging.WARNING, logger="unmask.serve"):
            log.append(request_row(IN_WINDOW, request_id="before"))
            wait_for(lambda: len(stored(url)) == 1)  # flushed
            pause_postgres(pg)
            for n in range(20):
                log.append(request_row(IN_WINDOW + timedelta(seconds=n), request_id=f"during{n}"))
                time.sleep(0.02)
            wait_for(lambda: len(log._kept) >= 2)  # rotated journals kept on this machine, retried every cycle
            kept = [r["request_id"] for j in tmp_path.glob("journal-*.jsonl") for r in journal_rows(j)]
            assert sorted(kept) == sorted(f"during{n}" for n in range(20))
            warned = [r.getMessage() for r in caplog.records if "not written to" in r.getMessage()]
            assert len(warned) == 1, warned  # once per outage, naming the server, never the password
            assert f"127.0.0.1:{pg.port}/" in warned[0] and SECRET not in caplog.text
            resume_postgres(pg)
            wait_for(lambda: not log._kept)
            log.append(request_row(IN_WINDOW + timedelta(seconds=30), request_id="after"))
            log.close()
        assert "takes rows again" in caplog.text and SECRET not in caplog.text
        ids = [r["request_id"] for r in stored(url)]
        assert sorted(ids) == sorted(["before", "after", *(f"during{n}" for n in range(20))])  # each once
    finally:
        remove_postgres(pg)


def test_a_bad_or_unreachable_url_is_one_line_naming_the_server_never_the_password(postgres, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from tests.support.fuzz_fixtures import unmask_app

    port = free_port()  # nothing listens there
    cases = {
        f"postgresql://unmask:{SECRET}@127.0.0.1:{port}/evidence": f"127.0.0.1:{port}/evidence (user unmask)",
        f"postgresql://unmask:{SECRET}@127.0.0.1:{postgres.port}/no_such_db": 'database "no_such_db" does not exist',
        f"postgresql://unmask:{SECRET}@db:port/evidence": "postgresql://unmask:***@db:port/evidence' is malformed",
        f"postgresql://unmask:{SECRET}@db.team": "names no database",
        f"mysql://unmask:{SECRET}@db.team/evidence": "UNMASK_EVIDENCE_URL='mysql://unmask:***@db.team/evidence'",
    }
    for url, named in cases.items():
        with pytest.raises(EvidenceError) as refused:
            checked_evidence_url({"UNMASK_EVIDENCE_URL": url})
        message = str(refused.value)
        assert message.startswith("UNMASK_EVIDENCE_URL") and named in message, message
        assert SECRET not in message and "\n" not in message
    assert checked_evidence_url({}) is None  # unset: the folder, as before

    routes = tmp_path / "serving.yaml"
    rollout = {"steps": [50, 100], "interval_s": 60, "analysis": {"error_rate": {"max": 0.2}}}
    split = {"split": {"production": 50, "fallback": 50}}
    routes.write_text(yaml.safe_dump({"routes": {}, "default": split, "rollout": rollout}))
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    env = {"UNMASK_EVIDENCE_URL": f"postgresql://unmask:{SECRET}@127.0.0.1:{port}/evidence"}
    for argv in (["analysis", "serve", "--routes", str(routes)], ["serve", "--routes", str(routes)]):
        result = CliRunner().invoke(unmask_app(), argv, env=env)
        assert result.exit_code == 2, result.output
        [line] = result.output.strip().splitlines()
        assert line.startswith("error: UNMASK_EVIDENCE_URL: PostgreSQL at 127.0.0.1:") and "Traceback" not in line
        assert SECRET not in result.output
    from flows.rollout import RolloutRefused, plan_rollout

    monkeypatch.setenv("UNMASK_EVIDENCE_URL", env["UNMASK_EVIDENCE_URL"])
    with pytest.raises(RolloutRefused, match=f"PostgreSQL at 127.0.0.1:{port}/evidence") as refused:
        plan_rollout("tiny-llada", "default", "production", routes)  # refused before the registry is read
    assert SECRET not in str(refused.value)


def test_the_analysis_gives_the_same_verdict_from_postgres_as_from_a_folder_holding_the_same_rows(pg_url, tmp_path):
    from serving.analysis_api import standalone_app

    routes = tmp_path / "serving.yaml"
    policy = {"steps": [25, 100], "interval_s": 600, "min_requests": 20}
    policy["analysis"] = {"p95_latency_s": {"max": 1.0}, "error_rate": {"max": 0.05}}
    split = {"split": {"staging": 25, "fallback": 75}}
    routes.write_text(yaml.safe_dump({"routes": {}, "default": split, "rollout": policy}))
    rows = [
        request_row(IN_WINDOW + timedelta(milliseconds=n), arm="staging", status=500 if n < 15 else 200)
        for n in range(60)
    ]
    rows += [request_row(IN_WINDOW + timedelta(milliseconds=n), arm="fallback") for n in range(120)]
    folder = tmp_path / "folder"
    for location, store in ((folder, None), (tmp_path / "journals", PostgresEvidence(pg_url))):
        log = RequestLog(location, flush_s=0.05, store=store)
        for r in rows:
            log.append(r)
        log.close()
    probe = {"time": IN_WINDOW.isoformat(), "route": "default", "key": "k", "agrees": True, "status": 200}
    probes = [probe | {"arm": arm, "correct": arm == "fallback"} for arm in ("staging", "fallback")]
    for store in (FolderEvidence(folder), PostgresEvidence(pg_url)):
        store.append_probes("default", probes)
        store.close()

    async def ask(app, revision: str) -> dict:
        query = f"route=default&candidate=staging&baseline=fallback&window_s=600&revision={revision}"
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://analysis") as client:
            answer = await client.get(f"/v1/unmask/analysis?{query}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def judged(app, revision: str = "rs-1") -> dict:
        return asyncio.run(ask(app, revision))

    on_folder = judged(standalone_app(routes, folder, clock=SimulatedClock(NOW)))
    clocks = [SimulatedClock(NOW), SimulatedClock(NOW)]
    replicas = [standalone_app(routes, tmp_path / f"r{i}", clock=clocks[i], evidence_url=pg_url) for i in range(2)]
    on_postgres = [judged(app) for app in replicas]
    assert on_postgres[0] == on_postgres[1] == on_folder and on_folder["look"] == 1
    assert sum(a["requests"] for a in on_folder["arms"].values()) == 180 and on_folder["verdict"] == "fail"
    # asked 2 s after the window's end: a folder's reader reads the journals, so that window is whole; PostgreSQL
    # holds other replicas' last rows only SETTLE_S after it, so until then it judges the window before
    early = datetime(2026, 12, 6, 12, 0, 2, tzinfo=UTC)
    folder_early = judged(standalone_app(routes, folder, clock=SimulatedClock(early)), "rs-early")
    pg_early = judged(
        standalone_app(routes, tmp_path / "r9", clock=SimulatedClock(early), evidence_url=pg_url), "rs-early"
    )
    assert folder_early["window"] == on_folder["window"] and pg_early["window"]["end"] == on_folder["window"]["start"]
    for clock in clocks:  # the next window: look 2 on both analysis replicas; a new revision starts at 1
        clock.advance(600)
    assert judged(replicas[1])["look"] == judged(replicas[0])["look"] == 2
    assert judged(replicas[0], "rs-2")["look"] == 1


def wait_for(done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def journal_rows(path: Path) -> list[dict]:
    from serving.request_log import _journal_rows

    return _journal_rows(path)
