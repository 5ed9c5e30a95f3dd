"""Which version held each stage when (issue 53): the stage aliases' timeline from the verified audit chain, the
one-line answer for a time, CSV and JSON for scripts, and a chain that does not verify said so with exit 1."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from registry.history import HistoryError, parse_time, stage_history
from registry.store import model_tag
from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import built_registry, moved_twice_and_rolled_back


@pytest.fixture
def moved(tmp_path):
    """poc moved three times: tiny-ar, then tiny-llada, then rolled back to tiny-ar."""
    return built_registry(tmp_path, moved_twice_and_rolled_back)


def _cli(reg, *args):
    return CliRunner().invoke(
        cli_app("history"), ["history", *args], env={"MLFLOW_TRACKING_URI": reg.tracking_uri, "COLUMNS": "200"}
    )


def test_each_move_starts_a_tenure_that_the_next_move_of_the_stage_ends(moved):
    found = stage_history(moved)
    assert found.verified and not found.pending
    first, second, third = found.tenures
    assert [(t.stage, t.holder, t.how) for t in found.tenures] == [
        ("poc", "tiny-ar v1", "promotion"),
        ("poc", "tiny-llada v1", "promotion"),
        ("poc", "tiny-ar v1", "rollback"),
    ]
    assert (first.until, second.until, third.until) == (second.since, third.since, "")  # no gap, no overlap
    assert second.previous == "tiny-ar@1" and second.approvals == ("grace",)
    assert third.moved_by == "oncall" and third.why == "p95 regression" and third.seq > second.seq > first.seq
    # one model's tenures: the stage's next move still ends them
    [llada] = stage_history(moved, "tiny-llada").tenures
    assert llada == second
    assert stage_history(moved, stage="production").tenures == ()


def test_at_names_the_holder_then(moved):
    found = stage_history(moved)
    first, second, third = found.tenures
    since = datetime.fromisoformat(second.since)
    assert found.at("poc", since) == second  # the moment of the move belongs to the new holder
    assert found.at("poc", since - timedelta(microseconds=1)) == first
    assert found.at("poc", datetime.fromisoformat(first.since) - timedelta(days=1)) is None  # before any move
    assert found.at("poc", datetime.now(UTC) + timedelta(days=365)) == third
    result = _cli(moved, "--stage", "poc", "--at", second.since)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        f"poc at {since.isoformat(timespec='seconds')}: tiny-llada v1, since {second.since[:19]} "
        f"(promotion by {second.moved_by}, approved by grace)"
    )
    before = _cli(moved, "--stage", "production", "--at", "now")
    assert before.exit_code == 0 and "production at " in before.output and "nobody held it" in before.output


def test_the_table_and_the_script_formats_carry_the_same_rows(moved):
    table = _cli(moved, "tiny-ar")
    assert table.exit_code == 0, table.output
    assert "stage history of tiny-ar (verified audit chain)" in table.output
    assert table.output.count("tiny-ar v1") == 2 and "rollback" in table.output and "now" in table.output
    rows = list(csv.DictReader(io.StringIO(_cli(moved, "--format", "csv").output)))
    assert [(r["model"], r["how"]) for r in rows] == [
        ("tiny-ar", "promotion"),
        ("tiny-llada", "promotion"),
        ("tiny-ar", "rollback"),
    ]
    held = datetime.fromisoformat(rows[0]["until"]) - datetime.fromisoformat(rows[0]["since"])
    assert rows[1]["approvals"] == "grace" and float(rows[0]["held_s"]) == round(held.total_seconds(), 3)
    data = json.loads(_cli(moved, "--format", "json").output)
    assert [d["sha256"] for d in data] == [t.sha256 for t in stage_history(moved).tenures]
    at = json.loads(_cli(moved, "--stage", "poc", "--at", "now", "--format", "json").output)
    assert at[0]["model"] == "tiny-ar" and at[0]["how"] == "rollback"


def test_a_chain_that_does_not_verify_is_said_so_and_exits_1(moved):
    found = stage_history(moved)
    forged = found.tenures[1]
    moved.client.set_tag(forged.audit_run_id, model_tag("who"), "mallory")  # the mover rewritten in the store
    result = _cli(moved)
    assert result.exit_code == 1
    assert "UNVERIFIED audit chain" in result.output
    assert "the audit chain does not verify, so this timeline is not evidence: audit chain: BROKEN" in result.output
    assert not stage_history(moved).verified


@pytest.mark.parametrize(
    "args, message",
    [
        (["--at", "yesterday"], "--at 'yesterday': not a time; give ISO 8601"),
        (["--stage", "prod"], "prod"),
        (["--format", "xml"], "--format 'xml': expected one of table, csv, json"),
    ],
)
def test_a_question_that_cannot_be_asked_is_refused_in_one_line(moved, args, message):
    result = _cli(moved, *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output


def test_times_read_as_a_person_writes_them():
    assert parse_time("2026-12-05") == datetime(2026, 12, 5, tzinfo=UTC)
    assert parse_time("2026-12-05T14:30Z") == datetime(2026, 12, 5, 14, 30, tzinfo=UTC)
    assert parse_time("2026-12-05T14:30+01:00") == datetime(2026, 12, 5, 13, 30, tzinfo=UTC)
    with pytest.raises(HistoryError, match="--at 'soon'"):
        parse_time("soon")


def test_the_promotions_page_draws_the_same_timeline(moved, monkeypatch):

    from tests.support.dashboard_pages import app_test

    monkeypatch.setenv("MLFLOW_TRACKING_URI", moved.tracking_uri)
    at = app_test()
    at.run()
    at.switch_page("views/promotions.py").run()
    assert not at.exception, at.exception
    assert "Which version held each stage when" in [s.value for s in at.subheader]
    [table] = [d.value for d in at.dataframe if "held" in d.value.columns and "holder" in d.value.columns]
    expected = [(t.stage, t.holder, t.how, t.since) for t in reversed(stage_history(moved).tenures)]
    assert list(zip(table.stage, table.holder, table.how, table.since)) == expected
    assert table.held.iloc[0].endswith("(holds it)") and not at.error


def test_the_dossier_s_change_log_lists_the_stages_the_version_held(moved):
    import re

    from dashboards.dossier.content import dossier_content
    from dashboards.dossier.render import render_html

    html = render_html(dossier_content(moved, "tiny-ar", "1"))
    held = re.search(r'<table id="stages-held">(.*?)</table>', html, re.S).group(1)
    rows = re.findall(r'<tr class="tenure" data-stage="(\w+)">(.*?)</tr>', held, re.S)
    ar = [t for t in stage_history(moved, "tiny-ar").tenures]
    assert [stage for stage, _ in rows] == [t.stage for t in ar] == ["poc", "poc"]
    assert ar[0].since[:19] in rows[0][1] and "promotion" in rows[0][1] and "holds it" in rows[1][1]
    assert "rollback" in rows[1][1] and "tiny-llada@1" in rows[1][1]


def test_a_canary_rollback_is_on_the_timeline_and_moves_nothing(moved):
    from registry.audit_events import record_rollout_end
    from registry.identity import actor_for

    actor = actor_for(moved.tracking_uri, "oncall")
    record_rollout_end(
        moved,
        "rollout_rollback",
        actor,
        "poc",
        "tiny-llada",
        "1",
        "r-1",
        "default",
        "p95 over the bound",
        ("tiny-ar", "1"),
        "run-1",
        2,
        25,
        {"verdict": "fail"},
    )
    found = stage_history(moved)
    [canary] = found.canaries
    assert (canary.how, canary.stage, canary.model, canary.holder) == (
        "canary rollback",
        "poc",
        "tiny-llada",
        "tiny-ar@1",
    )
    assert len(found.tenures) == 3 and found.tenures[-1].until == ""  # the alias did not move
    assert found.at("poc", datetime.now(UTC)).holder == "tiny-ar v1"
    kinds = [r["kind"] for r in json.loads(_cli(moved, "--format", "json").output)]
    assert kinds == ["tenure", "tenure", "tenure", "canary rollback"]
    table = _cli(moved, "tiny-llada")
    assert table.exit_code == 0, table.output
    assert "canary rollback: poc, tiny-llada v1" in table.output and "stayed with tiny-ar@1" in table.output
