"""Issue 36's named cases, each refused up front in one line through the real `unmask` CLI (fuzz_fixtures.refused:
exit 2, one `error:` line naming what and where, no traceback, the store unchanged), and the store faults a disk
gives (full, read-only) reported as such, with nothing moved aside."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.support import REPO
from tests.support.fuzz_fixtures import ANSI, refused, row_counts, store_path, unmask_app


def _policy(tmp_path: Path, stage: str, gate: str, key: str, value) -> Path:
    data = yaml.safe_load((REPO / "gates" / "policy.yaml").read_text())
    data["stages"][stage]["gates"][gate][key] = value
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "gate, key, value",
    [
        ("quality", "threshold", 1.5),
        ("quality", "threshold", -0.1),
        ("quality_vs_fallback", "min_absolute_change", 2),
        ("error_rate", "max_error_rate", 5),
    ],
)
def test_a_share_outside_0_1_in_a_gate_policy_is_refused(tmp_path, gate, key, value):
    path = _policy(tmp_path, "poc", gate, key, value)
    refused(["gates", "tiny-llada", "--policy", str(path)], str(path), f"gates.{gate}.{key}", repr(value))


def _checklists(tmp_path: Path, evidence: dict) -> Path:
    folder = tmp_path / "checklists"
    shutil.copytree(REPO / "checklists", folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    data = yaml.safe_load((folder / "poc.yaml").read_text())
    data["items"][0]["evidence"] = evidence
    (folder / "poc.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


@pytest.mark.parametrize(
    "command",
    [["gates", "tiny-llada", "--stage", "poc"], ["promote", "tiny-llada", "--to", "poc", "--comment", "c" * 30]],
)
@pytest.mark.parametrize(
    "evidence, named",
    [
        ({"kind": "automatic", "gate": "no-such-gate"}, "'no-such-gate'"),
        ({"kind": "automatic", "gate": ["license", "licence"]}, "'licence'"),
        ({"kind": "automatic", "record_field": "no_such_field", "equals": 1}, "'no_such_field'"),
    ],
)
def test_a_checklist_item_naming_an_unknown_gate_or_field_is_refused(tmp_path, command, evidence, named):
    folder = _checklists(tmp_path, evidence)
    refused(command, str(folder / "poc.yaml"), "license-tier", named, env={"UNMASK_CHECKLISTS": str(folder)})


def _sweep(tmp_path: Path, **changes) -> Path:
    data = {
        "name": "t",
        "models": ["tiny-llada"],
        "tasks": [{"task": "arith", "n": 2}],
        "base": {"gen_length": 16, "block_length": 16, "steps": 8},
    } | changes
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "changes, key, shown",
    [
        ({"base": {"gen_length": 16, "block_length": 16, "steps": 64}}, "base.steps", "64"),
        ({"grid": {"steps": [8, 32]}}, "grid.steps", "32"),
        ({"grid": [{"steps": [8]}, {"steps": [48], "gen_length": [32]}]}, "grid[1].steps", "48"),
        ({"models": ["no-such-model"]}, "models[0]", "'no-such-model'"),
        ({"models": ["../../../../etc/passwd"]}, "models[0]", "../../../../etc/passwd"),
        ({"models": ["tiny-llada", "tiny/../../x"]}, "models[1]", "tiny/../../x"),
        ({"device": "tpu"}, "device", "'tpu'"),
        ({"dtype": "int8"}, "dtype", "'int8'"),
    ],
)
def test_a_sweep_that_cannot_measure_is_refused_before_any_work(tmp_path, changes, key, shown):
    path = _sweep(tmp_path, **changes)
    refused(["eval", "--sweep", str(path)], str(path), key, shown)
    refused(["run", "--sweep", str(path)], str(path), key, shown)
    assert not (tmp_path / "home").exists() or not list((tmp_path / "home").rglob("records.parquet"))


def test_a_folder_that_is_not_a_model_is_refused_as_a_sweep_model(tmp_path):
    (tmp_path / "empty").mkdir()
    path = _sweep(tmp_path, models=[str(tmp_path / "empty")])
    refused(["eval", "--sweep", str(path)], "models[0]", "without config.json")


@pytest.mark.parametrize(
    "args, named",
    [
        (["bench", "--threads", "10000"], ("--threads", "10000", "cores")),
        (["eval", "--threads", "10000"], ("--threads", "10000")),
        (["serve", "--threads", "4096"], ("--threads", "4096")),
        (["audit", "--stage", "canary"], ("--stage", "'canary'")),
        (["audit", "--stage", "prod"], ("--stage", "'prod'")),
        (["eval", "--model", "../../x"], ("--model", "../../x")),
        (["run", "--model", "nope"], ("--model", "'nope'")),
    ],
)
def test_an_option_out_of_range_is_refused_up_front(args, named):
    refused(args, *named)


def test_report_out_under_a_file_names_out(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    refused(["report", "tiny-llada", "--out", str(blocker / "dossier")], "--out", str(blocker), "is a file")


def test_bench_json_under_a_file_names_json(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    refused(["bench", "--json", str(blocker / "rows.json")], "--json", str(blocker))


def test_a_checkpoint_whose_mask_id_is_out_of_the_vocabulary_is_named(tmp_path):
    folder = tmp_path / "bad-mask"
    shutil.copytree(REPO / "models" / "weights" / "tiny-llada", folder)
    config = json.loads((folder / "config.json").read_text())
    config["mask_token_id"] = config["vocab_size"] + 100
    (folder / "config.json").write_text(json.dumps(config))
    refused(
        ["generate", "hi", "--model", str(folder)],
        str(folder / "config.json"),
        "mask_token_id",
        str(config["vocab_size"] + 100),
        "outside the vocabulary",
    )


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", ["serve", "dashboard"])
def test_a_server_on_a_busy_port_is_one_line(command, busy_port):
    refused([command, "--port", str(busy_port)], "--port", f"127.0.0.1:{busy_port}", "cannot be bound")


# --- disk full and read-only stores: a fault a real store cannot produce on demand, injected at the SQL driver ------
@pytest.fixture
def registered_store(tmp_path, monkeypatch):
    from tests.support.gate_fixtures import fresh_registry, register_pair

    home = tmp_path / "home"
    monkeypatch.setenv("UNMASK_HOME", str(home))
    register_pair(fresh_registry(home))
    return store_path(home)


# SQLite's own words for a write the file system refused: ENOSPC gives SQLITE_FULL, a read-only mount SQLITE_READONLY
SQLITE_FAULTS = {
    "disk full": ("database or disk is full", "is full"),
    "read-only": ("attempt to write a readonly database", "read-only"),
}


@pytest.mark.parametrize("fault", SQLITE_FAULTS)
def test_a_full_or_read_only_store_is_reported_as_such_and_nothing_is_moved_aside(registered_store, fault):
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    message, named = SQLITE_FAULTS[fault]

    def refuse_writes(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
            raise sqlite3.OperationalError(message)

    before = row_counts(registered_store)
    event.listen(Engine, "before_cursor_execute", refuse_writes)
    try:
        result = CliRunner().invoke(
            unmask_app(),
            ["sign-off", "tiny-llada", "--stage", "poc", "--item", "fallback-plan", "--comment", "checked"],
        )
    finally:
        event.remove(Engine, "before_cursor_execute", refuse_writes)
    text = ANSI.sub("", result.output)
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert result.exit_code == 1 and len(errors) == 1, text
    assert named in errors[0] and "aside" not in errors[0] and "not a usable" not in errors[0], errors[0]
    assert "Traceback" not in text
    assert registered_store.is_file() and row_counts(registered_store) == before  # nothing moved, nothing lost
    assert sorted(p.name for p in registered_store.parent.iterdir()) == sorted(
        p.name for p in registered_store.parent.iterdir() if not p.name.endswith((".bak", ".corrupt", ".old"))
    )


@pytest.mark.parametrize("code, named", [("ENOSPC", "is full"), ("EROFS", "read-only file system")])
def test_an_os_level_full_or_read_only_disk_is_named_as_such(code, named):
    import errno

    from flows.failures import describe

    exit_code, line = describe(OSError(getattr(errno, code), "refused", "/state/evals/records.json"))
    assert exit_code == 1 and named in line and "/state/evals/records.json" in line and "aside" not in line


# slow: starts `unmask serve` in a subprocess: about 10 s
def test_serve_with_nothing_to_serve_is_one_line(tmp_path):
    import os
    import subprocess
    import sys

    from tests.support.servers import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "serve", "--model", "no-such-model", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, UNMASK_HOME=str(tmp_path / "home")),
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "no-such-model" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


# slow: loads the two tiny models behind a local server: a few seconds
def test_loadtest_max_tokens_beyond_the_served_context_is_refused_before_a_request_is_sent():
    from evals.loadtest import LoadTestError
    from flows.commands.loadtest import local_server
    from tests.support.serving_fixtures import shared_serving_registry

    registry = shared_serving_registry()
    with pytest.raises(LoadTestError) as e:
        with local_server(["production", "fallback"], registry.tracking_uri, max_tokens=100_000, asked_tokens=100_000):
            raise AssertionError("the load would have started")
    assert "--max-tokens 100000" in str(e.value) and "context of" in str(e.value) and "\n" not in str(e.value)
