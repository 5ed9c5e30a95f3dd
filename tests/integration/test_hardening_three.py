"""Hardening, round three (issue 51): each test reproduces a defect a user met, then holds the fix."""

from __future__ import annotations

import configparser
import re

import pytest
from typer.testing import CliRunner

from tests.support import REPO


def _every_command(group, path=()):
    """(argv, command) of every command and sub-command the CLI registers, groups included."""
    import typer.main

    click_group = typer.main.get_command(group) if not hasattr(group, "commands") else group
    for name, command in sorted(click_group.commands.items()):
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _every_command(command, (*path, name))


def test_every_command_s_help_renders(monkeypatch):
    """Item 12: `unmask analysis --help` crashed on a docstring read as markup ([/rollback]); every help renders."""
    from flows.cli import _register_all, app

    _register_all()
    monkeypatch.setenv("COLUMNS", "120")
    commands = list(_every_command(app))
    assert len(commands) > 30 and ("analysis", "serve") in [argv for argv, _ in commands]
    for argv, _ in commands:
        result = CliRunner().invoke(app, [*argv, "--help"])
        assert result.exit_code == 0, (argv, result.output)
        assert "Usage:" in result.output and "error:" not in result.output, (argv, result.output)


def test_the_team_setup_s_basic_auth_file_is_one_mlflow_server_accepts():
    """Item 13: the documented `admin_password = CHANGE-ME` made `mlflow server` exit (12 characters at least)."""
    from mlflow.utils.validation import _validate_password

    text = (REPO / "docs" / "team-setup.md").read_text()
    block = re.search(r"```\n(\[mlflow\]\n.*?)```", text, re.S).group(1)
    config = configparser.ConfigParser()
    config.read_string(block)
    _validate_password(config["mlflow"]["admin_password"])  # MLflow's own rule; raises below 12 characters
    with pytest.raises(Exception, match="at least 12"):
        _validate_password("CHANGE-ME")


def test_a_missing_load_test_record_weakens_the_evidence_and_serve_still_starts(tmp_path):
    """Item 9: `serve` did not start when one load-test artifact was missing; the record is left out instead."""
    from dataclasses import replace
    from pathlib import Path
    from urllib.parse import urlparse

    from registry import Registry
    from registry.loadtests import ARTIFACT, log_serving_record, serving_records
    from registry.serving import served_version
    from registry.store import model_tag
    from tests.support.gate_fixtures import serving_record
    from tests.support.serving_fixtures import serving_registry

    registry = serving_registry(tmp_path / "registry")
    reg = Registry(registry.tracking_uri)
    version = registry.versions["tiny-llada"]
    weights = reg.version_tags("tiny-llada", version)[model_tag("weights_sha256")]
    kept, lost = (
        log_serving_record(reg, replace(serving_record(concurrency=c), version=version, weights_sha256=weights))
        for c in (4, 16)
    )
    artifact = Path(urlparse(reg.client.get_run(lost.run_id).info.artifact_uri).path) / ARTIFACT
    artifact.unlink()
    assert [r.concurrency for r in serving_records(reg, "tiny-llada", version)] == [kept.concurrency]
    served = served_version(reg, "production")
    assert (served.model, served.version) == ("tiny-llada", version)


@pytest.mark.parametrize(
    "status, shown", [("running", 25), ("paused", 25), ("rolled_back", 0), ("aborted", 0), ("completed", 100)]
)
def test_a_rollout_s_weight_is_the_candidate_s_share_of_traffic_now(status, shown):
    """Item 15: `rollout status` said `weight 25%` for rolled-back and aborted rollouts, whose candidate gets 0."""
    from flows.rollout_state import RolloutState

    state = RolloutState("r", "tiny-llada", "2", "default", "production", "staging", "production", [25, 100], {})
    state.weight, state.status = 25, status
    assert state.live_weight == shown


@pytest.fixture(scope="module")
def app_client():
    """The serving app in process (its refusals come before any model is needed)."""
    from fastapi.testclient import TestClient

    from serving.app import create_app
    from tests.support.serving_fixtures import settings_for, shared_serving_registry

    settings = settings_for(shared_serving_registry().tracking_uri)
    settings.max_body_bytes = 1_000_000  # the default: 4 stop strings of 200k characters fit under it
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"model": "production", "prompt": "hi\xff"}', "body is not valid UTF-8: byte 0xff at offset 37"),
        (b"[" * 3000 + b"]" * 3000, "body nests arrays or objects 3000 levels deep, past what the parser follows"),
        (b'{"model": "production", "max_tokens": ' + b"9" * 5000 + b"}", "an integer of 5000 digits"),
    ],
)
def test_a_body_that_cannot_be_parsed_says_why_and_where(app_client, body, says):
    """What FastAPI reported only as "There was an error parsing the body" (a JSON syntax error it reports
    itself, as `body is not valid JSON: ...`)."""
    for path in ("/v1/completions", "/v1/chat/completions"):
        answer = app_client.post(path, content=body, headers={"content-type": "application/json"})
        error = answer.json()["error"]
        assert answer.status_code == 400 and says in error["message"], error
        assert (error["param"], error["code"]) == ("body", "invalid_json")
    assert app_client.get("/health").status_code in (200, 503)  # still serving


def test_a_json_syntax_error_names_the_character_where_parsing_stopped(app_client):
    answer = app_client.post(
        "/v1/completions", content=b'{"model": "production", "prompt": }', headers={"content-type": "application/json"}
    )
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "body", error
    assert error["message"] == "body is not valid JSON: Expecting value at character 34"


def test_a_stop_sequence_longer_than_the_limit_is_refused_naming_it(app_client):
    from serving.schemas import MAX_STOP_CHARS

    long = {"model": "production", "prompt": "hi", "stop": ["x" * 200_000] * 4}
    answer = app_client.post("/v1/completions", json=long)
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == "stop", error
    assert f"at most {MAX_STOP_CHARS} characters, got 200000" in error["message"]
    fits = app_client.post("/v1/completions", json=long | {"stop": ["x" * MAX_STOP_CHARS]})
    assert fits.status_code != 400  # at the limit: not refused for its length (503 while the models load)


def test_serve_does_not_follow_a_hand_moved_fallback_alias(tmp_path, caplog):
    """Item 7: the fallback, which the default route sends all its traffic to, is held to the stage aliases' rule:
    the registry's word alone (an alias set with the MLflow client) does not move what serves."""
    from registry import audit, register_or_reuse
    from registry.serving import holder
    from tests.support.gate_fixtures import evidence, fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    register_pair(reg)
    assert holder(reg, "fallback") == ("tiny-ar", "1")
    v1 = reg.client.get_model_version("tiny-ar", "1")
    reg.client.create_model_version("tiny-ar", v1.source, run_id=v1.run_id)  # v2, by hand: no evidence of its own
    reg.client.set_registered_model_alias("tiny-ar", "fallback", "2")
    with caplog.at_level("ERROR", logger="registry.integrity"):
        assert holder(reg, "fallback") == ("tiny-ar", "1")  # what the registration put there keeps serving
    assert "alias fallback drifted" in caplog.text and "tiny-ar@2" in caplog.text
    # unmask putting it back (a re-run reusing the same evidence) is in the trail, so it is followed
    reg.client.set_registered_model_alias("tiny-ar", "fallback", "1")
    reg.client.set_registered_model_alias("tiny-ar", "fallback", "2")
    assert register_or_reuse(reg, evidence("tiny-ar")) == ("1", True)
    assert reg.aliases_of("tiny-ar")["fallback"] == "1" and holder(reg, "fallback") == ("tiny-ar", "1")
    reused = audit.events(reg, model="tiny-ar", event="evidence_registered")[-1]
    assert reused.stage == "fallback" and reused.evidence["reused"] is True


def test_a_store_from_before_registrations_were_audited_serves_its_fallback_as_registered(tmp_path, monkeypatch):
    from registry import audit
    from registry.serving import holder
    from tests.support.gate_fixtures import fresh_registry, register_pair

    reg = fresh_registry(tmp_path)
    with monkeypatch.context() as older:
        older.setattr(audit, "append", lambda registry, event, open_intent=False: event)
        register_pair(reg)
    assert holder(reg, "fallback") == ("tiny-ar", "1")  # no registration in the trail: the registry's word
