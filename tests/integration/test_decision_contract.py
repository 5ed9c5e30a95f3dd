"""One decision, every surface: through a version's life (fresh, signed off, approved, canary failed, re-approved,
declined, promoted, and under the demo policy) the CLI (`unmask gates` text, exit code and `next:` line), the
Verdict page (AppTest) and the dossier (its decision table, recommendation and signature block) all state the
decision's outcome and first blocker. Each surface is parsed from what it renders; the expected outcome of each
state is written here by hand, and the `Decision` value must agree with it too."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser

import pytest
import streamlit as st
from typer.testing import CliRunner

from dashboards.dossier.content import dossier_content
from dashboards.dossier.render import render_html
from gates.decision import Outcome
from gates.policy import load_policy
from gates.rollout_policy import parse_rollout_policy
from registry import approve, decline, promote
from registry.approvals import approvals_of, close
from registry.read import promotion_decision
from registry.rollouts import set_rollout_status, start_rollout_run
from tests.support import REPO
from tests.support.dashboard_pages import page
from tests.support.flow_fixtures import cli_app
from tests.support.gate_fixtures import OK, act_as, fresh_registry, register_pair, sign_all

EXIT = {"adopt": 0, "blocked": 1, "inconclusive": 3}
ROLLOUT = parse_rollout_policy(
    {"steps": [5, 100], "interval_s": 2, "min_requests": 5, "analysis": {"error_rate": {"max": 0.05}}}
)


class Cells(HTMLParser):
    """The dossier's page-1 decision table (stage -> [cells]), its recommendation and its signature lines."""

    def __init__(self, html: str):
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.signed: list[tuple[str, str]] = []  # (stage, yes/no) per signature line
        self.void: list[str] = []  # stages of approvals listed as not counting
        self._table = ""
        self._row: str | None = None
        self._cell: list[str] | None = None
        self.feed(html)
        self.recommendation = html.split('id="recommendation-verdict">', 1)[1].split("<", 1)[0]

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or ""
        if tag == "tr" and self._table == "decision-line" and a.get("data-stage"):
            self._row = a["data-stage"]
            self.rows[self._row] = []
        if tag == "tr" and "signature-line" in (a.get("class") or ""):
            self.signed.append((a["data-stage"], a["data-signed"]))
        if tag == "tr" and "void-approval" in (a.get("class") or ""):
            self.void.append(a["data-stage"])
        if tag == "td" and self._row:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._row and self._cell is not None:
            self.rows[self._row].append(" ".join("".join(self._cell).split()))
            self._cell = None
        if tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture
def life(tmp_path, monkeypatch, team_keys):  # the people's keys listed: declines and stages past poc count signed acts
    reg = fresh_registry(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", reg.tracking_uri)
    monkeypatch.setenv("COLUMNS", "200")
    _, version = register_pair(reg)
    return reg, version


def surfaces(reg, version: str, stage: str) -> dict:
    """What each surface says about tiny-llada `version` at `stage`, parsed from what it renders."""
    policy = ["--policy", os.environ["UNMASK_POLICY"]] if os.environ.get("UNMASK_POLICY") else []
    # --store: the dossier needs a stored report, and judges under the policy it names (the page: UNMASK_POLICY)
    shown = CliRunner().invoke(cli_app("gates"), ["gates", "tiny-llada", "--stage", stage, "--store", *policy])
    said = re.search(rf"decision: tiny-llada v{version} -> {stage}: (\w+)", shown.output)
    steps = [line.strip() for line in shown.output.splitlines() if line.strip().startswith("next:")]
    st.cache_data.clear()  # the page reads the registry afresh, as its Refresh button does
    at = page()
    table = at.dataframe[0].value
    row = table[(table.candidate == f"tiny-llada v{version}") & (table.stage == stage)].iloc[0]
    cells = Cells(render_html(dossier_content(reg, "tiny-llada", version)))
    return {
        "exit": shown.exit_code,
        "cli": said.group(1) if said else shown.output,
        "next": steps[0].removeprefix("next: ") if steps else "",
        "page": row["decision"].split(" ")[0],
        "page_blocks": row["what blocks it"],
        "dossier": cells.rows[stage][5].split(" ")[0],
        "dossier_blocks": cells.rows[stage][6],
        "recommendation": cells.recommendation,
        "signed": [s for s, yes in cells.signed if yes == "yes"],
        "void": cells.void,
    }


def agree(reg, version: str, stage: str, expected: Outcome, first: str = "") -> dict:
    """Every surface states `expected` and the same first blocker (containing `first`) and next step."""
    policy = load_policy(os.environ.get("UNMASK_POLICY") or None)
    decision = promotion_decision("tiny-llada", version, stage, registry=reg, policy=policy)
    assert decision is not None and decision.outcome == expected, decision and decision.blocker_texts()
    seen = surfaces(reg, version, stage)
    assert seen["exit"] == EXIT[expected], seen
    assert seen["cli"] == seen["page"] == seen["dossier"] == expected.value, seen
    blockers = decision.blocker_texts()
    if blockers:
        assert first in blockers[0], blockers
        assert seen["page_blocks"].startswith(blockers[0]) and seen["dossier_blocks"].startswith(blockers[0]), seen
    else:
        assert seen["page_blocks"].startswith("nothing") and seen["dossier_blocks"].startswith("nothing"), seen
    assert seen["next"] == (decision.steps[0].command if decision.steps else ""), seen
    production = promotion_decision("tiny-llada", version, "production", registry=reg, policy=policy)
    assert seen["recommendation"] == production.outcome.value  # page 1 leads with the production decision
    return seen


def test_every_surface_states_the_one_decision_through_a_versions_life(life, monkeypatch):
    reg, v = life
    fresh = agree(reg, v, "poc", Outcome.BLOCKED, "gate tooling_maturity failed")
    assert fresh["next"].startswith("unmask sign-off tiny-llada --stage poc")

    sign_all(reg, "tiny-llada", v, "poc")
    signed = agree(reg, v, "poc", Outcome.BLOCKED, "no approval recorded for poc")
    assert signed["next"].startswith("unmask approve tiny-llada poc") and "poc" not in signed["signed"]

    act_as("grace")
    approve(reg, "tiny-llada", v, "poc", "grace", OK)
    approved = agree(reg, v, "poc", Outcome.ADOPT)
    assert approved["next"] == "unmask promote tiny-llada --to poc" and "poc" in approved["signed"]

    # a rollout of the version to poc, rolled back by its analysis: it stands against the version whatever is approved
    run = start_rollout_run(reg, "default-1", "tiny-llada", v, "default", "poc", "poc", "fallback", ROLLOUT.to_dict())
    set_rollout_status(reg, run, "rolled_back", "p95_latency_s breached")
    for a in approvals_of(reg, "tiny-llada", v, "poc"):  # as the rollout controller does on a rollback
        close(
            reg,
            "tiny-llada",
            v,
            a,
            "void",
            "oncall",
            "rollout default-1 was rolled_back: approvals given before it no longer stand",
        )
    failed = agree(reg, v, "poc", Outcome.BLOCKED, "rollout default-1 of this version to poc was rolled back")
    assert failed["next"] == "unmask run --model tiny-llada"  # new evidence lifts it, never a promote
    assert failed["void"] == ["poc"] and "poc" not in failed["signed"]  # the voided approval, apart
    approve(reg, "tiny-llada", v, "poc", "grace", OK + ", again after the canary")
    reapproved = agree(reg, v, "poc", Outcome.BLOCKED, "was rolled back")
    assert reapproved["next"] == "unmask run --model tiny-llada"
    assert reapproved["signed"] == ["poc"] and reapproved["void"] == ["poc"]  # the new one counts, the old is void
    refused = CliRunner().invoke(cli_app("promote"), ["promote", "tiny-llada", "--to", "poc"])
    assert refused.exit_code == 1 and "rolled back" in refused.output  # what the next line never suggests

    act_as("ada")
    decline(reg, "tiny-llada", v, "staging", "ada", "not before the canary is understood")
    agree(reg, v, "staging", Outcome.BLOCKED, "ada declined staging")


def test_a_holder_adopts_its_stage_and_the_signature_block_counts_the_approval_its_move_used(life, monkeypatch):
    reg, v = life
    sign_all(reg, "tiny-llada", v, "poc")
    act_as("grace")
    approve(reg, "tiny-llada", v, "poc", "grace", OK)
    promote("tiny-llada", "poc", registry=reg, actor="grace")
    held = agree(reg, v, "poc", Outcome.ADOPT)
    assert held["next"] == "" and held["signed"].count("poc") == 1 and "poc" not in held["void"]
    assert held["page_blocks"] == "nothing: it holds the stage"
    # a second approval given after the move does not count for it: listed apart, with why
    approve(reg, "tiny-llada", v, "poc", "grace", OK + ", a second time")
    again = agree(reg, v, "poc", Outcome.ADOPT)
    assert again["signed"].count("poc") == 1 and again["void"].count("poc") == 1


def test_under_the_demo_policy_every_surface_states_the_demo_decision(life, monkeypatch):
    """The demo policy relaxes thresholds: the CLI (told --policy), the page (UNMASK_POLICY) and the dossier (the
    policy of the stored report) judge under it alike."""
    reg, v = life
    monkeypatch.setenv("UNMASK_POLICY", str(REPO / "gates" / "demo-policy.yaml"))
    fresh = agree(reg, v, "poc", Outcome.BLOCKED, "gate tooling_maturity failed")
    assert fresh["next"].startswith("unmask sign-off tiny-llada --stage poc")
    sign_all(reg, "tiny-llada", v, "poc")
    act_as("grace")
    approve(reg, "tiny-llada", v, "poc", "grace", OK)
    approved = agree(reg, v, "poc", Outcome.ADOPT)
    assert approved["next"].startswith("unmask promote tiny-llada --to poc --policy ")  # judged under the demo policy
