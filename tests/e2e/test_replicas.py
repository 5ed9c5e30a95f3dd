"""Canary evidence every replica shares (issue 49, item 3): three `unmask serve --routes` replicas behind one
address, each a process of its own with its own state folder, log to one store: a request-log folder they all
mount (one machine, or a volume every pod mounts), or the team PostgreSQL (`UNMASK_EVIDENCE_URL`: replicas on
several machines, each with only its own folder for its journals). The analysis any of them answers judges the
union of the three replicas' requests: its verdict and its per-arm counts are those of `gates.canary.analyse`
over every row the three wrote in the window.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml

from evals.evidence_store import EVIDENCE_URL, SETTLE_S
from gates.canary import Observation, analyse
from gates.rollout_policy import load_rollout_policy
from serving.evidence import open_evidence
from serving.request_log import JOURNAL, PARQUET
from tests.support.postgres_fixtures import database_name
from tests.support.servers import free_port, stop_group, wait_healthy
from tests.support.serving_fixtures import PROMPTS, serving_registry

pytestmark = pytest.mark.timeout(600)
WINDOW_S = 15  # the analysis grid: the load goes into one window, then that window is judged


def writer(name: str) -> str:
    """The process that wrote a log file: its segment is `<host>-<pid>-...`."""
    named = PARQUET.match(name) or JOURNAL.match(name)
    assert named, name
    return named.group(named.re.groups).split("-")[1]


def replica(home: Path, tracking_uri: str, port: int, routes: Path, log_dir: Path, url: str) -> subprocess.Popen:
    home.mkdir(parents=True)
    env = dict(os.environ, UNMASK_HOME=str(home), MLFLOW_TRACKING_URI=tracking_uri, UNMASK_THREADS="1")
    env |= {EVIDENCE_URL: url} if url else {}
    argv = ["serve", "--port", str(port), "--routes", str(routes), "--request-log-dir", str(log_dir), "--poll", "5"]
    log = open(home.parent / f"{home.name}.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", *argv],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def writers_of(url: str, shared: Path) -> set[str]:
    """The processes whose rows the store holds: the folder's file names, or the segments PostgreSQL was sent."""
    if not url:
        return {writer(p.name) for p in shared.rglob("*") if p.suffix in (".parquet", ".jsonl")}
    with psycopg.connect(url) as db:
        return {segment.split("-")[1] for (segment,) in db.execute("SELECT segment FROM unmask_request_segments")}


@pytest.mark.parametrize("kept", ["folder", "postgres"])
def test_three_replicas_share_their_evidence_and_the_analysis_judges_the_union(tmp_path, request, kept):
    url = request.getfixturevalue("postgres").create_database(database_name("replicas")) if kept == "postgres" else ""
    registry = serving_registry(tmp_path / "registry")  # production: tiny-llada; fallback: tiny-ar
    routes = tmp_path / "serving.yaml"
    rollout = {"steps": [50, 100], "interval_s": WINDOW_S, "min_requests": 5, "analysis": {"error_rate": {"max": 0.2}}}
    routes.write_text(
        yaml.safe_dump({"routes": {}, "default": {"split": {"production": 50, "fallback": 50}}, "rollout": rollout})
    )
    shared, ports = tmp_path / "requests", [free_port() for _ in range(3)]
    procs = []
    try:
        for i, port in enumerate(ports):
            own = shared if not url else tmp_path / f"replica-{i}-journals"  # PostgreSQL: nothing on a shared disk
            procs.append(replica(tmp_path / f"replica-{i}", registry.tracking_uri, port, routes, own, url))
        for i, (proc, port) in enumerate(zip(procs, ports)):
            wait_healthy(f"http://127.0.0.1:{port}/health", proc, tmp_path / f"replica-{i}.log", timeout_s=300)
        with httpx.Client(timeout=60) as http:
            for _ in range(3):  # a load that spills into the next window proves nothing: it goes again, in the next
                time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.5)  # the start of a window: the load lands inside it
                window_end = time.time() - time.time() % WINDOW_S + WINDOW_S
                answered = 0
                for n in range(48):  # round-robin over the replicas, as a Service spreads its connections
                    body = {"model": "auto", "prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": 4, "user": f"u{n}"}
                    answer = http.post(f"http://127.0.0.1:{ports[n % 3]}/v1/completions", json=body)
                    answered += answer.status_code == 200
                if time.time() < window_end - 1:
                    break
            else:
                pytest.fail(f"three loads of 48 requests each spilled out of their {WINDOW_S} s window")
            # that window is now the last completed one (on PostgreSQL, judged once SETTLE_S have passed since its end,
            # when every replica's writer has sent its rows)
            time.sleep(WINDOW_S - time.time() % WINDOW_S + (SETTLE_S if url else 0) + 0.5)
            query = {"route": "default", "candidate": "production", "baseline": "fallback", "window_s": WINDOW_S}
            verdicts = [http.get(f"http://127.0.0.1:{p}/v1/unmask/analysis", params=query).json() for p in ports]
    finally:
        for proc in procs:
            stop_group(proc)
    assert answered == 48
    assert len({(v["verdict"], v["look"], str(v["metrics"]), str(v["arms"])) for v in verdicts}) == 1, verdicts
    judged = verdicts[0]
    # the union: every row of the window, whichever replica wrote it (each wrote its own files, or segments)
    start, stop = (datetime.fromisoformat(judged["window"][k]) for k in ("start", "end"))
    store = open_evidence(url or shared)
    try:
        rows = [r for r in store.read_requests(start, stop) if r["route"] == "default"]
        writers = writers_of(url, shared)
    finally:
        store.close()
    assert len(rows) == 48 and len(writers) == 3, (len(rows), writers)  # every replica's rows, in one store
    union = analyse([Observation.from_row(r) for r in rows], "production", "fallback", load_rollout_policy(routes))
    assert judged["verdict"] == union.verdict and judged["arms"] == union.arms
    assert sum(a["requests"] for a in judged["arms"].values()) == 48
