"""The team registry: a real `mlflow server` on a real PostgreSQL (proxied artifacts), written by four
evaluator processes at once. The audit chain stays one intact chain with every entry, exactly one of two
racing promotions wins, and every evidence run is complete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from registry import Registry, audit, load_evidence, sign_off, stage_holder
from registry.connection import EVALUATIONS_EXPERIMENT
from tests.support import REPO
from tests.support.gate_fixtures import register_pair
from tests.support.postgres_fixtures import database_name
from tests.support.servers import launch_mlflow_server, stop_group
from tests.support.team_writer import APPENDS


@pytest.fixture(scope="module", autouse=True)
def _team_key(team_signing_key):
    """The writers and the server sign with the team's key (tests/support/servers.py) from their first entry."""


@pytest.fixture(scope="module")
def team_server(postgres, tmp_path_factory):
    folder = tmp_path_factory.mktemp("team_server")
    url, proc = launch_mlflow_server(folder, postgres.create_database(database_name("team")))
    try:
        yield url
    finally:
        stop_group(proc)


def test_four_evaluators_writing_one_postgres_server_at_once(team_server, tmp_path):
    reg = Registry(team_server)
    register_pair(reg)
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", "1", "poc", item, "ada", f"{item} checked")
    before = audit.verify(reg)
    start = tmp_path / "start"
    roles = {"ada": "promote", "bob": "promote", "cy": "evidence", "dee": "evidence"}
    # separate state folders: the writers share nothing but the server, as on four hosts
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "tests.support.team_writer", role, team_server, name, str(start)],
            cwd=REPO,
            env=dict(os.environ, UNMASK_HOME=str(tmp_path / name), PYTHONPATH=str(REPO)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, role in roles.items()
    }
    time.sleep(1.0)
    start.touch()
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}: {err[-3000:]}"
        done[name] = json.loads(out.strip().splitlines()[-1])

    moved = [d for d in done.values() if "moved" in d]
    refused = [d for d in done.values() if "refused" in d]
    assert len(moved) == 1 and len(refused) == 1, done
    assert moved[0]["moved"] == "tiny-llada@1" and stage_holder(reg, "poc") == ("tiny-llada", "1")
    assert any("poc" in r for r in refused[0]["refused"]), refused[0]
    moves = audit.events(reg, stage="poc", event="alias_move")
    assert [(m.to_ref, m.status) for m in moves] == [("tiny-llada@1", "FINISHED")]
    assert audit.pending_moves(reg) == []

    report = audit.verify(reg)
    assert report.status == "intact", report.summary()
    assert report.chained == report.entries == report.head_seq  # every entry of this store, one chain from #1
    comments = [e.comment for e in audit.events(reg, model="team-probe")]
    assert sorted(comments) == sorted(f"{n} {i}" for n in roles for i in range(APPENDS))
    assert report.head_seq >= before.head_seq + len(roles) * APPENDS

    for name in ("cy", "dee"):
        model, version = f"team-{name}", done[name]["version"]
        loaded = load_evidence(reg, model, version)  # sha256-checked against what registration recorded
        assert len(loaded.records) == 2 and loaded.candidate == model
    runs = list(reg.search_runs(EVALUATIONS_EXPERIMENT))
    assert runs and {r.info.status for r in runs} == {"FINISHED"}  # no evidence run left half-written
