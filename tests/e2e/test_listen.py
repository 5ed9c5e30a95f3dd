"""Events in: a real `mlflow server` posts its registry webhooks to `unmask listen` (a subprocess), which evaluates a
version registered outside unmask and opens a finding for a stage alias set outside unmask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet
from mlflow import MlflowClient

from registry import Registry
from registry.audit import events
from registry.integrity import FINDING
from registry.mlflow_hooks import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, signature
from tests.support.eval_fixtures import write_model
from tests.support.flow_fixtures import write_policy, write_sweep
from tests.support.servers import free_port, launch_mlflow_server, stop_group, wait_healthy

SECRET = "listen-secret-" + uuid.uuid4().hex


@pytest.fixture(scope="module", autouse=True)
def _team_key(team_signing_key):
    """The receiver's findings are chain entries, signed with the team's key like the server's other writers."""


def settled(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    return [e for e in map(json.loads, journal.read_text().splitlines()) if e["state"] == "settled"]


def wait_for(journal: Path, proc: subprocess.Popen, log: Path, done, timeout_s: float = 240) -> list[dict]:
    """The journal's settled deliveries once `done(them)` holds (the receiver exiting fails the test at once)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        entries = settled(journal)
        if done(entries):
            return entries
        assert proc.poll() is None, f"unmask listen exited with {proc.returncode}:\n{log.read_text()}"
        time.sleep(0.5)
    raise AssertionError(f"not settled after {timeout_s} s: {settled(journal)}\n{log.read_text()}")


@pytest.fixture(scope="module")
def listening(tmp_path_factory):
    """An mlflow server that may post to 127.0.0.1, and `unmask listen` subscribed to it."""
    folder = tmp_path_factory.mktemp("listen")
    server_env = {
        "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
        "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",  # the receiver is on this machine
        "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY": Fernet.generate_key().decode(),
    }
    url, server = launch_mlflow_server(folder, f"sqlite:///{folder}/mlflow.db", env=server_env)
    port, home = free_port(), folder / "home"
    sweep = write_sweep(folder / "sweep.yaml", ["tiny-llada"], steps=(2,), n=2)  # its grid and tasks
    policy = write_policy(folder / "policy.yaml")
    env = dict(os.environ, MLFLOW_TRACKING_URI=url, UNMASK_HOME=str(home), UNMASK_LISTEN_SECRET=SECRET)
    log = folder / "listen.log"
    command = [
        *(str(Path(sys.executable).with_name("unmask")), "listen", "--port", str(port)),
        *("--subscribe", f"http://127.0.0.1:{port}/mlflow", "--sweep", sweep, "--policy", policy),
        *("--no-repro", "--for", "600"),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", proc, log=log, timeout_s=120)
        yield {"url": url, "port": port, "proc": proc, "log": log, "journal": home / "events" / "inbox.jsonl"}
    finally:
        stop_group(proc)
        stop_group(server)


def test_a_version_registered_outside_unmask_starts_its_evaluation(listening, tmp_path):
    client = MlflowClient(listening["url"])
    model = write_model(tmp_path / "weights")  # a checkpoint a team's own pipeline logged and registered
    run = client.create_run(client.create_experiment("team-training"))
    client.log_artifacts(run.info.run_id, str(model), "model")
    client.set_terminated(run.info.run_id)
    client.create_registered_model("dllm")
    created = client.create_model_version("dllm", f"{run.info.artifact_uri}/model", run_id=run.info.run_id)

    journal, proc, log = listening["journal"], listening["proc"], listening["log"]
    entries = wait_for(journal, proc, log, lambda them: any(e["version"] == created.version for e in them))
    first = next(e for e in entries if e["version"] == created.version)
    assert first["event"] == "model_version.created" and first["outcome"] == "evaluated", first
    entries = wait_for(journal, proc, log, lambda them: any(e["version"] == "2" for e in them), timeout_s=60)
    assert "the files of its source" in first["detail"] and "as version 2" in first["detail"], first["detail"]
    # the evaluation registered its evidence, and its own version did not start another evaluation
    tags = client.get_model_version("dllm", "2").tags
    assert tags["unmask.evidence_run"] and tags["unmask.weights_sha256"]
    second = next(e for e in entries if e["version"] == "2")
    assert second["outcome"] == "ignored" and "registered by unmask" in second["detail"]
    assert [e["version"] for e in entries if e["outcome"] == "evaluated"] == ["1"]


def test_a_stage_alias_set_outside_unmask_opens_a_finding(listening):
    client = MlflowClient(listening["url"])
    if "dllm" not in [m.name for m in client.search_registered_models()]:
        client.create_registered_model("dllm")
        client.create_model_version("dllm", "file:///nowhere")
    before = len(settled(listening["journal"]))
    client.set_registered_model_alias("dllm", "production", "1")  # no promotion, no audit entry
    entries = wait_for(
        listening["journal"],
        listening["proc"],
        listening["log"],
        lambda them: any(e["alias"] == "production" for e in them),
    )
    moved = [e for e in entries[before:] if e["alias"] == "production"]
    assert [e["outcome"] for e in moved] == ["finding"], moved
    findings = events(Registry(listening["url"]), stage="production", event=FINDING)
    assert len(findings) == 1 and findings[0].who == "mlflow-webhook", findings
    assert "dllm" in findings[0].comment and "production" in findings[0].comment


def test_a_forged_stale_or_replayed_delivery_is_refused_and_the_receiver_keeps_serving(listening):
    base = f"http://127.0.0.1:{listening['port']}"
    body = json.dumps(
        {"entity": "model_version", "action": "created", "timestamp": "now", "data": {"name": "x", "version": "9"}}
    ).encode()

    def post(secret: str, delivery: str, at: int, payload: bytes = body) -> httpx.Response:
        headers = {
            DELIVERY_HEADER: delivery,
            TIMESTAMP_HEADER: str(at),
            SIGNATURE_HEADER: signature(secret.encode(), delivery, str(at), payload),
            "Content-Type": "application/json",
        }
        return httpx.post(f"{base}/mlflow", content=payload, headers=headers, timeout=10)

    now = int(time.time())
    forged = post("not-the-secret", "d-forged", now)
    assert forged.status_code == 401 and "does not sign" in forged.json()["error"]
    stale = post(SECRET, "d-stale", now - 3600)
    assert stale.status_code == 401 and "replay" in stale.json()["error"]
    unsigned = httpx.post(f"{base}/mlflow", content=body, headers={DELIVERY_HEADER: "d-u", TIMESTAMP_HEADER: "1"})
    assert unsigned.status_code == 401 and "unsigned" in unsigned.json()["error"]
    hostile = post(SECRET, "d-hostile", now, b'{"entity": "model_version", "action": "created", "data": []}')
    assert hostile.status_code == 400 and "data" in hostile.json()["error"]
    huge = httpx.post(f"{base}/mlflow", content=b"x" * (2 << 20), timeout=10)
    assert huge.status_code == 413
    first = post(SECRET, "d-once", now)
    again = post(SECRET, "d-once", now)  # MLflow retries with the same delivery id
    assert (first.status_code, again.status_code) == (202, 200) and again.json()["status"] == "already received"
    entries = wait_for(
        listening["journal"],
        listening["proc"],
        listening["log"],
        lambda them: any(e["delivery"] == "d-once" for e in them),
    )
    once = [e for e in entries if e["delivery"] == "d-once"]
    assert len(once) == 1 and once[0]["outcome"] == "ignored", once  # "x" is neither a checkpoint nor in the catalog
    assert httpx.get(f"{base}/healthz", timeout=10).json()["ok"] is True


def test_sigterm_stops_the_receiver_at_once_whatever_its_deadline(tmp_path):
    """`unmask listen --for 600` ignored SIGTERM (what Kubernetes and systemd send) for the whole 600 s: its deadline
    timer was a non-daemon thread, which the interpreter waits for at exit. The module's teardown paid 30 s of it."""
    import signal

    port, home = free_port(), tmp_path / "home"
    env = dict(os.environ, UNMASK_HOME=str(home), UNMASK_LISTEN_SECRET=SECRET)
    env.pop("MLFLOW_TRACKING_URI", None)
    log = tmp_path / "listen.log"
    command = [str(Path(sys.executable).with_name("unmask")), "listen", "--port", str(port), "--for", "600"]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/healthz", proc, log=log, timeout_s=120)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)  # a bound on the hang, not a timing: it exits in well under a second
        assert proc.returncode == 128 + signal.SIGTERM, log.read_text()
    finally:
        stop_group(proc)
