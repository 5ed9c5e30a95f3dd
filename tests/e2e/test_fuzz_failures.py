"""Fail closed, part two: what the store, the server and the files do wrong ends in one line (issue 23).

A locked or read-only SQLite store, an unreachable tracking server and a corrupt store each end in
one `error:` line saying what happened and what to do, the traceback in <state>/logs/errors.log
(shown with --debug). Catalog pins are checked on every load, not only by `unmask pull`. `unmask
train` never writes over a checkpoint unless told to. All real: a real SQLite lock, a file made
immutable, a port nothing listens on.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.support import REPO
from tests.support.fuzz_fixtures import ANSI, refused, row_counts, store_path, unmask_app


def one_line_failure(args, *named, env=None) -> tuple[int, str, str]:
    """Run `unmask ARGS` that must fail: (exit code, its one error line, all output)."""
    result = CliRunner().invoke(unmask_app(), args, env={"COLUMNS": "80", **(env or {})})
    text = ANSI.sub("", result.output)
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit), (result.exception, text)
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text
    for part in named:
        assert part in errors[0], (part, errors[0])
    return result.exit_code, errors[0], text


@pytest.fixture
def registered(tmp_path, monkeypatch):
    from tests.support.gate_fixtures import fresh_registry, register_pair

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    register_pair(fresh_registry(home))
    return home


# slow: MLflow waits out SQLite's busy timeout and its own retries (about 20 s)
def test_a_locked_store_is_one_line_saying_who_to_wait_for(registered):
    db = store_path(registered)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # what a second writer, or an open sqlite3 shell, holds
    try:
        code, line, _ = one_line_failure(
            ["gates", "tiny-llada", "--stage", "poc", "--store"], str(db), "locked", "wait"
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code in (1, 2)


def _immutable(path: Path, on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", str(path)], check=True, capture_output=True)


def test_a_read_only_store_is_one_line_and_the_traceback_goes_to_the_log(registered):
    db = store_path(registered)
    before = row_counts(db)
    _immutable(db, True)  # read-only even for root, as a read-only mount or a locked-down share is
    try:
        code, line, _ = one_line_failure(
            ["gates", "tiny-llada", "--stage", "poc", "--store"], str(db), "read-only", "writable"
        )
    finally:
        _immutable(db, False)
    assert code == 1 and row_counts(db) == before
    log = registered / "logs" / "errors.log"
    assert str(log) in line and "Traceback (most recent call last)" in log.read_text()
    assert "disk I/O error" in log.read_text() or "readonly database" in log.read_text()


def test_a_read_only_state_folder_is_audited_and_verified_and_a_write_is_refused_before_it_runs(registered):
    """Item 51.14: `audit --verify` on a read-only store was refused ("not writable") instead of verifying; an
    auditor with read access reads and verifies it, while a command that writes is refused in one line."""
    db = store_path(registered)
    before = row_counts(db)
    frozen = [registered, db.parent, db]
    for path in frozen:
        _immutable(path, True)
    try:
        env = {"UNMASK_HOME": str(registered), "COLUMNS": "200"}
        verified = CliRunner().invoke(unmask_app(), ["audit", "--verify"], env=env)
        assert verified.exit_code == 0 and "audit chain: intact, 2 entries" in verified.output, verified.output
        shown = CliRunner().invoke(unmask_app(), ["audit"], env=env)
        assert shown.exit_code == 0 and "evidence_registered" in shown.output, shown.output
        one_line_failure(["gates", "tiny-llada"], "$UNMASK_HOME", "not writable", env=env)
    finally:
        for path in frozen:
            _immutable(path, False)
    assert row_counts(db) == before


def test_a_corrupt_store_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    (home / "mlflow").mkdir(parents=True)
    store_path(home).write_bytes(b"this is not an SQLite file " * 200)
    code, line, _ = one_line_failure(["gates", "tiny-llada"], str(store_path(home)), "not a usable SQLite database")
    assert code == 1
    debug = CliRunner().invoke(unmask_app(), ["--debug", "gates", "tiny-llada"])
    assert debug.exception is not None and not isinstance(debug.exception, SystemExit)  # the real error, raised


def test_an_unreachable_tracking_server_is_one_line(tmp_path):
    from tests.support.servers import free_port

    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    one_line_failure(["gates", "tiny-llada"], uri, "unreachable", env={"MLFLOW_TRACKING_URI": uri})
    one_line_failure(["audit"], uri, env={"MLFLOW_TRACKING_URI": uri})


# --- catalog pins, on every load ----------------------------------------------------------------


@pytest.fixture
def pinned_catalog(tmp_path, monkeypatch):
    """A catalog whose local entry pins its weights' and config's sha256, the model inside its folder."""
    from tests.support.eval_fixtures import write_model

    folder = write_model(tmp_path / "weights" / "mine")
    pins = {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in ("model.safetensors", "config.json")
    }
    path = tmp_path / "catalog.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "entries": [
                    {
                        "id": "mine",
                        "family": "llada",
                        "kind": "masked-diffusion",
                        "role": "candidate",
                        "source": "weights/mine",
                        "license": "Apache-2.0",
                        "adapter": "llada",
                        "sha256": pins,
                    }
                ]
            }
        )
    )
    monkeypatch.setenv("UNMASK_CATALOG", str(path))
    return path, folder, pins


def test_a_pinned_file_edited_after_pull_is_refused_on_load(pinned_catalog):
    from models import CheckpointError, load
    from models.state import state_dir

    _, folder, pins = pinned_catalog
    assert load("mine").entry_id == "mine"
    cache = json.loads((state_dir() / "cache" / "sha256.json").read_text())
    assert cache[os.path.realpath(folder / "model.safetensors")]["sha256"] == pins["model.safetensors"]
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, one weight changed: only the hash can tell
    weights.write_bytes(bytes(data))
    actual = hashlib.sha256(bytes(data)).hexdigest()
    with pytest.raises(CheckpointError) as refused_load:
        load("mine")
    message = str(refused_load.value)
    assert str(weights) in message and pins["model.safetensors"] in message and actual in message


def test_generate_refuses_a_pin_mismatch_in_one_line(pinned_catalog):
    _, folder, pins = pinned_catalog
    config = folder / "config.json"
    config.write_text(config.read_text().replace("{", "{ ", 1))
    refused(
        ["generate", "hi", "--model", "mine", "--gen-length", "8", "--block-length", "8"],
        str(config),
        pins["config.json"],
        "sha256 mismatch",
    )


def test_a_missing_pinned_file_is_refused_on_load(pinned_catalog):
    from models import CheckpointError, load

    _, folder, _ = pinned_catalog
    (folder / "config.json").rename(folder / "config.json.bak")
    with pytest.raises(CheckpointError, match=r"config\.json is pinned in the catalog .* but missing"):
        load("mine")


def test_an_unchanged_pinned_file_is_not_hashed_again(pinned_catalog, monkeypatch):
    import models.pull
    from models import load

    load("mine")
    hashed = []
    monkeypatch.setattr(models.pull, "sha256_of", lambda p: hashed.append(p) or "0" * 64)
    load("mine")
    assert hashed == []  # size and mtime unchanged: the cached hash stands


def test_a_source_outside_the_catalog_loads_only_when_allowed(tmp_path):
    from models import load
    from models.catalog import CatalogError, load_catalog
    from tests.support.eval_fixtures import write_model

    outside = write_model(tmp_path / "elsewhere" / "m")
    path = tmp_path / "cat" / "catalog.yaml"
    path.parent.mkdir()
    entry = {
        "id": "far",
        "family": "llada",
        "kind": "masked-diffusion",
        "role": "candidate",
        "source": str(outside),
        "license": "Apache-2.0",
        "adapter": "llada",
    }
    path.write_text(yaml.safe_dump({"entries": [entry]}))
    with pytest.raises(CatalogError, match="outside the catalog's folder"):
        load_catalog(path)
    path.write_text(yaml.safe_dump({"entries": [dict(entry, allow_outside_source=True)]}))
    assert load("far", catalog=load_catalog(path)).entry_id == "far"


# --- unmask train: never over a checkpoint by default ------------------------------------------


def test_train_refuses_to_overwrite_the_bundled_checkpoint_without_force(tmp_path):
    from models.loading import WEIGHTS_DIR

    bundled = WEIGHTS_DIR / "tiny-llada"
    before = {p.name: p.stat().st_mtime_ns for p in bundled.iterdir()}
    refused(
        ["train", "--out", str(bundled), "--state-dir", str(tmp_path / "state"), "--steps", "1"],
        f"--out {bundled}",
        "bundled",
        "--force",
    )
    assert {p.name: p.stat().st_mtime_ns for p in bundled.iterdir()} == before
    assert not (tmp_path / "state").exists()


def test_train_writes_to_the_state_folder_by_default_and_prints_its_threads(tmp_path):
    from models.loading import WEIGHTS_DIR
    from models.state import state_dir

    # the default recipe fine-tunes its base: without one it says how to get one, then from the bundled weights
    base = ["--init-from", str(WEIGHTS_DIR / "tiny-llada")]
    missing = CliRunner().invoke(
        unmask_app(), ["train", "--steps", "2", "--state-dir", str(tmp_path / "s0")], env={"COLUMNS": "200"}
    )
    assert missing.exit_code == 2 and "unmask train --model tiny-llada-base" in missing.output, missing.output
    result = CliRunner().invoke(
        unmask_app(), ["train", "--steps", "2", "--state-dir", str(tmp_path / "s"), *base], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "torch threads: 1 (default" in result.output
    out = state_dir() / "trained" / "tiny-llada"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    again = CliRunner().invoke(unmask_app(), ["train", "--steps", "2", "--state-dir", str(tmp_path / "s2"), *base])
    assert again.exit_code == 2 and "holds a checkpoint already" in again.output
    forced = CliRunner().invoke(
        unmask_app(), ["train", "--steps", "2", "--state-dir", str(tmp_path / "s3"), "--force", *base]
    )
    assert forced.exit_code == 0, forced.output


def test_the_thread_rule_is_one_rule():
    from flows.commands.options import max_threads, threads_rule

    assert threads_rule(3, 2) == (3, "--threads")
    assert threads_rule(None, 2) == (2, "the sweep's threads")
    os.environ["UNMASK_THREADS"] = str(max_threads())  # more than the machine's cores is refused (issue 36)
    try:
        assert threads_rule(None) == (max_threads(), "$UNMASK_THREADS")
    finally:
        del os.environ["UNMASK_THREADS"]
    assert threads_rule(None)[0] == 1
    refused(["bench"], "UNMASK_THREADS", "'many'", env={"UNMASK_THREADS": "many"})


# --- a killed `unmask run` takes Prefect's temporary server with it --------------------------------


def _prefect_servers(parent_pid: int) -> list:
    import psutil

    def is_server(process) -> bool:
        try:
            line = " ".join(process.cmdline())  # the booted server (flows.local_prefect), or Prefect's own
            return "flows.local_prefect:create_app" in line or "prefect.server.api.server:create_app" in line
        except psutil.Error:  # a short-lived child already gone, or a zombie
            return False

    try:
        return [c for c in psutil.Process(parent_pid).children(recursive=True) if is_server(c)]
    except psutil.Error:
        return []


# slow: a real `unmask run` starting Prefect's local-mode server (10-60 s on two busy cores)
def test_sigterm_to_unmask_run_stops_prefects_temporary_server(tmp_path):
    import signal
    import sys
    import time

    import psutil

    from tests.support.flow_fixtures import CANDIDATE, FALLBACK, tiny_models, write_sweep

    models = tiny_models(tmp_path / "models")
    sweep = write_sweep(tmp_path / "tiny.yaml", [models[CANDIDATE], models[FALLBACK]])
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # local mode: Prefect starts its own
    env |= {"UNMASK_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", "run", "--sweep", sweep, "--no-repro"],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    servers: list = []
    try:
        deadline = time.monotonic() + 240
        while not servers and proc.poll() is None and time.monotonic() < deadline:
            servers = _prefect_servers(proc.pid)
            time.sleep(0.2)
        assert servers, (
            f"no Prefect server child appeared (exit {proc.poll()}): {proc.stderr.read() if proc.poll() else ''}"
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        gone, alive = psutil.wait_procs(servers, timeout=30)
        assert not alive, f"Prefect server outlived unmask run: {[p.pid for p in alive]}"
        assert proc.returncode == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        for server in [*servers, *_prefect_servers(proc.pid)]:  # never leave one behind, pass or fail
            if server.is_running():
                server.kill()


# --- Prefect flow failures of `unmask request-promotion` --------------------------------------------


def _one_line_of_the_flow(result) -> str:
    text = ANSI.sub("", result.output)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.exception, text)
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("not promoted:")]
    assert len(lines) == 1, text
    return lines[0]


def test_a_blocked_promotion_flow_is_one_line_without_a_traceback(prefect_harness, registered):
    from registry import stage_holder

    result = CliRunner().invoke(
        unmask_app(), ["request-promotion", "tiny-llada", "poc", "--timeout", "5"], env={"COLUMNS": "80"}
    )
    line = _one_line_of_the_flow(result)
    assert "is blocked" in line and "tooling-maturity" in line and "unmask gates" in line
    assert stage_holder(__import__("registry").Registry(), "poc") is None


def test_an_approval_timeout_is_one_line_without_a_traceback(prefect_harness, registered):
    from registry import Registry, sign_off, stage_holder

    registry = Registry()
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(registry, "tiny-llada", "1", "poc", item, "ada", "checked")
    result = CliRunner().invoke(
        unmask_app(), ["request-promotion", "tiny-llada", "poc", "--timeout", "2"], env={"COLUMNS": "80"}
    )
    line = _one_line_of_the_flow(result)
    assert "approval" in line and "unmask approve" in line
    assert stage_holder(registry, "poc") is None


# --- the real entry point, in a process of its own (the in-process suite covers the rest) -----------


@pytest.mark.parametrize(
    "args, named",
    [
        (["serve", "--port", "99999"], "--port"),
        (["generate", "hi", "--device", "tpu"], "'tpu'"),
        (["gates", "tiny-llada", "--policy", "POLICY"], "stages.poc.gates.quality.threshold"),
    ],
    ids=["port", "device", "nan-policy"],
)
def test_the_unmask_process_prints_one_line_and_exits_2(tmp_path, args, named):
    import sys

    from gates.policy import POLICY_PATH

    data = yaml.safe_load(POLICY_PATH.read_text())
    data["stages"]["poc"]["gates"]["quality"]["threshold"] = float("nan")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    args = [str(tmp_path / "p.yaml") if a == "POLICY" else a for a in args]
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, "-c", "from flows.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, UNMASK_HOME=str(home), COLUMNS="80"),
        cwd=REPO,
    )
    output = ANSI.sub("", done.stdout + done.stderr)
    assert done.returncode == 2, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], output
    assert not store_path(home).exists()
