"""Checklists: every stage covers the governance topics, items map to frameworks, completion is checked."""

from __future__ import annotations

import copy

import pytest
import yaml

from checklists import ChecklistError, checklist_status, load_checklist, parse_checklist
from checklists.checklist import CHECKLIST_DIR
from gates import evaluate_gates, load_policy
from gates.promotion import check_checklist_against_policy
from tests.support.gate_fixtures import ALL_MANUAL, evidence, record, signoffs

STAGES = ("poc", "staging", "production")
TOPICS = {
    "license-tier",
    "reproducibility",
    "serving-sla",
    "fallback-plan",
    "security-weights",
    "data-provenance",
    "tooling-maturity",
}


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_covers_the_topics_and_names_frameworks(stage):
    checklist = load_checklist(stage)
    ids = {i.id for i in checklist.items}
    assert TOPICS <= ids
    for item in checklist.items:
        assert set(item.frameworks) == {"nist_ai_rmf", "eu_ai_act_annex_iv", "iso_42001"}
        assert item.frameworks["nist_ai_rmf"].split()[0] in {"GOVERN", "MAP", "MEASURE", "MANAGE"}
    assert check_checklist_against_policy(checklist, load_policy()) == []
    kinds = {i.evidence.kind for i in checklist.items}
    assert kinds == {"automatic", "manual"}


def test_production_adds_security_review_and_monitoring():
    assert {"security-review", "monitoring-plan", "model-card"} <= set(load_checklist("production").manual_items())


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["items"].append(copy.deepcopy(d["items"][0])), "duplicate id"),
        (lambda d: d["items"][0]["frameworks"].pop("iso_42001"), "frameworks: expected exactly"),
        (lambda d: d["items"][0]["frameworks"].update(nist_ai_rmf="PLAN 1.1"), "nist_ai_rmf: expected a function"),
        (lambda d: d["items"][0].update(evidence={"kind": "sometimes"}), "evidence.kind: expected"),
        (lambda d: d["items"][0].update(evidence={"kind": "automatic"}), "needs exactly one of gate or record_field"),
        (
            lambda d: d["items"][0].update(evidence={"kind": "automatic", "record_field": "valid"}),
            "needs exactly one of equals or non_empty",
        ),
        (lambda d: d["items"][0].update(owner="me"), "unknown key 'owner'"),
    ],
)
def test_malformed_checklist_names_the_item(edit, message):
    data = yaml.safe_load((CHECKLIST_DIR / "poc.yaml").read_text())
    edit(data)
    with pytest.raises(ChecklistError) as e:
        parse_checklist(data, source="poc.yaml")
    assert message in str(e.value) and str(e.value).startswith("poc.yaml: ")


def test_unknown_stage():
    with pytest.raises(ChecklistError, match="unknown stage 'canary'"):
        load_checklist("canary")


def _status(stage, ev, signed):
    results = evaluate_gates(ev, load_policy(), stage, {"fallback": evidence("tiny-ar"), "production": None}, signed)
    return checklist_status(load_checklist(stage), results, ev.records, signed)


def test_complete_when_gates_pass_fields_hold_and_manual_items_signed():
    status = _status("staging", evidence(), signoffs(*ALL_MANUAL))
    assert status.complete, status.missing()


def test_incomplete_lists_every_missing_item_with_its_reason():
    ev = evidence(records=[record(dataset_hash=""), record(task="sort")], tier="restricted")
    status = _status("poc", ev, signoffs("tooling-maturity"))
    missing = "\n".join(status.missing())
    assert not status.complete
    assert "poc/license-tier: gate license failed" in missing
    assert "poc/data-provenance: dataset_hash not non-empty on 1 record" in missing
    assert "poc/fallback-plan: needs a sign-off" in missing
    assert "tooling-maturity" not in missing


def test_a_signoff_needs_who_when_and_comment():
    signed = {
        "fallback-plan": {"by": "ada", "at": "2026-11-30T11:00:00Z", "comment": ""},
        "tooling-maturity": signoffs("tooling-maturity")["tooling-maturity"],
    }
    status = _status("poc", evidence(), signed)
    assert status.missing() == ["checklist poc/fallback-plan: sign-off lacks comment"]


def test_unvalidated_records_leave_data_validity_open():
    ev = evidence(records=[record(valid=None), record(task="sort")])
    status = _status("poc", ev, signoffs(*ALL_MANUAL))
    assert any("poc/data-validity: valid not == True" in m for m in status.missing())
