"""Approvals through a paused Prefect promote flow (the test harness's Prefect server): a name typed into the form or
refused on the command line moves nothing, an identified approval does."""

from __future__ import annotations

import time

import pytest

from registry import (
    stage_holder,
)
from registry.approvals import approvals_of
from tests.support.gate_fixtures import OK
from tests.support.governance import ME, at_poc, governed_registry, refusals, roles_with_me


@pytest.fixture
def reg(tmp_path, monkeypatch):
    return governed_registry(tmp_path, monkeypatch)


def test_cli_approve_refuses_with_its_reason_and_reject_is_final(reg, monkeypatch, tmp_path, prefect_harness):
    from typer.testing import CliRunner

    from tests.support.flow_fixtures import cli_app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    roles_with_me(tmp_path)
    at_poc(reg)
    run = CliRunner().invoke
    env = {"COLUMNS": "200", "LOGNAME": "grace", "USER": "grace"}  # typed into the environment: not an identity
    as_me = run(cli_app("approve"), ["approve", "tiny-llada", "staging", "--comment", OK], env=env)
    assert as_me.exit_code == 1 and f"{ME} registered the evidence of this version" in as_me.output, as_me.output
    claimed = run(cli_app("approve"), ["approve", "tiny-llada", "staging", "--by", "grace", "--comment", OK], env=env)
    assert claimed.exit_code == 2 and f"--by 'grace' is not you: you are '{ME}' (os-user" in claimed.output
    declined = run(
        cli_app("approve"), ["reject", "tiny-llada", "staging", "--comment", "the sort task regressed"], env=env
    )
    assert declined.exit_code == 0 and f"declined by {ME}" in declined.output, declined.output
    again = run(cli_app("approve"), ["approve", "tiny-llada", "staging", "--comment", OK], env=env)
    assert again.exit_code == 1 and "a decline is final until new evidence is registered" in again.output
    assert stage_holder(reg, "staging") is None
    assert refusals(reg, "approval_refused")["who"].tolist() == [ME, ME]
    assert refusals(reg, "identity_refused")["who"].tolist() == [ME]
    assert refusals(reg, "decline")["who"].tolist() == [ME]


def test_a_name_typed_into_the_prefect_form_moves_nothing_an_identified_approval_does(
    reg, monkeypatch, tmp_path, prefect_harness
):
    import threading

    from typer.testing import CliRunner

    from flows.promote import PromotionApproval, promote_flow, resume_with_approval, waiting_promotions
    from tests.support.flow_fixtures import cli_app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    roles_with_me(tmp_path)

    def paused_flow():
        outcome = {}
        thread = threading.Thread(
            target=lambda: outcome.update(
                state=promote_flow("tiny-llada", "poc", timeout_s=120, poll_interval_s=1, return_state=True)
            )
        )
        thread.start()
        deadline = time.monotonic() + 90
        while not waiting_promotions("tiny-llada", "poc") and time.monotonic() < deadline:
            time.sleep(0.5)
        return thread, outcome

    thread, outcome = paused_flow()
    resume_with_approval(
        waiting_promotions("tiny-llada", "poc")[0].id, PromotionApproval(approver="grace", comment=OK)
    )  # what the UI form sends: a typed name
    thread.join(120)
    assert outcome["state"].is_failed() and "carries no identity" in outcome["state"].message
    assert stage_holder(reg, "poc") is None and approvals_of(reg, "tiny-llada", "1", "poc") == []

    thread, outcome = paused_flow()
    approved = CliRunner().invoke(
        cli_app("approve"), ["approve", "tiny-llada", "poc", "--comment", OK], env={"LOGNAME": "grace"}
    )  # not an identity: the OS account approves
    assert approved.exit_code == 0 and f"approved by {ME}" in approved.output, approved.output
    thread.join(120)
    assert outcome["state"].is_completed(), outcome["state"].message
    assert stage_holder(reg, "poc") == ("tiny-llada", "1")
    assert [(a.by, a.status) for a in approvals_of(reg, "tiny-llada", "1", "poc")] == [(ME, "consumed")]
