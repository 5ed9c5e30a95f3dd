"""Golden gate reports: the exact gate results, Markdown tables, stage verdicts and stored reports that fixed
records give, so a refactoring of gates/ or registry/ that changes a byte of what users read fails here.

Regenerate (only when a change of wording is intended):
UNMASK_WRITE_GOLDEN=1 pytest tests/integration/test_golden_reports.py
"""

from __future__ import annotations

import copy
import json
import os
import re

import yaml

from gates.evaluate import evaluate_gates, gate_report_markdown, stage_verdict
from gates.policy import parse_policy
from registry import judge
from registry.approvals import sign_off
from registry.identity import os_account
from registry.tracking import load_gate_report
from tests.support import REPO
from tests.support.gate_fixtures import (
    ALL_MANUAL,
    evidence,
    fast_llada,
    fresh_registry,
    record,
    register_pair,
    serving_record,
    signoffs,
)

GOLDEN = REPO / "tests" / "golden"
POLICY_PATH = REPO / "gates" / "policy.yaml"
STEPS = [
    {"weight": 5, "verdict": "pass", "run_id": "a"},
    {"weight": 50, "verdict": "inconclusive", "run_id": "b"},
    {"weight": 100, "verdict": "pass", "run_id": "c"},
]


def _policy():
    """The bundled policy with every gate kind: a parallelism and a canary gate added at each stage."""
    data = copy.deepcopy(yaml.safe_load(POLICY_PATH.read_text()))
    for stage, gates in (
        ("poc", {"parallel": {"kind": "parallelism", "aup_min": 30}}),
        (
            "staging",
            {
                "parallel": {"kind": "parallelism", "tpf_at_accuracy": {"min_tpf": 2, "accuracy_floor": 0.7}},
                "canary": {"min_weight": 50},
            },
        ),
        ("production", {"canary": {"min_weight": 100}}),
    ):
        data["stages"][stage]["gates"].update(gates)
    return parse_policy(data, source="policy.yaml")


CASES = {
    "default": lambda: evidence(),
    "fast": fast_llada,
    "restricted_unreproducible": lambda: evidence(tier="restricted", reproducible=False),
    "few_items": lambda: evidence(records=[record(n_items=20), record(task="sort", n_items=20)]),
    "unvalidated": lambda: evidence(records=[record(valid=None), record(task="sort", valid=False)]),
    "no_license_no_repro": lambda: evidence(license=None, reproducibility=None),
    "load_failure_errors": lambda: evidence(
        records=[record(errors=3), record(task="sort")], failures=["decode failed on item 3"]
    ),
    "no_serving": lambda: evidence(serving=[]),
    "slow_serving": lambda: evidence(serving=[serving_record(latency_p95_s=6.0, error_rate=0.2, tokens_per_s=40.0)]),
    "no_memory_no_tpf": lambda: evidence(
        records=[
            record(peak_mem_mb=None, tokens_per_forward=None),
            record(task="sort", peak_mem_mb=None, tokens_per_forward=None),
        ]
    ),
    "low_quality": lambda: evidence(records=[record(accuracy=0.41), record(task="sort", accuracy=0.3)]),
    "canary_passed": lambda: evidence(canary=[{"id": "r1", "status": "running", "analyses": STEPS}]),
    "canary_paused": lambda: evidence(canary=[{"id": "r2", "status": "paused", "analyses": STEPS[:2]}]),
    "canary_rolled_back": lambda: evidence(
        canary=[{"id": "r3", "status": "rolled_back", "analyses": [{"weight": 5, "verdict": "fail", "run_id": "x"}]}]
    ),
}


def _gate_reports() -> dict:
    policy, out = _policy(), {}
    baselines = {
        "none": {},
        "fallback": {"fallback": evidence("tiny-ar")},
        "production": {"fallback": evidence("tiny-ar"), "production": evidence()},
    }
    combos = [("fallback", ALL_MANUAL)] + [("none", ()), ("production", ALL_MANUAL)]
    for name, build in CASES.items():
        for stage in ("poc", "staging", "production"):
            for base_name, signed in combos if name in ("default", "fast") else combos[:1]:
                results = evaluate_gates(build(), policy, stage, baselines[base_name], signoffs(*signed))
                out[f"{name}/{stage}/{base_name}/{'signed' if signed else 'unsigned'}"] = {
                    "results": [r.to_dict() for r in results],
                    "verdict": stage_verdict(results),
                    "markdown": gate_report_markdown(results, f"{name}: {stage}"),
                }
    return out


_IDS = re.compile(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{12}\b")
_HEADS = re.compile(r'"head": "\d+:[0-9a-f]*"')  # the audit chain head an act followed: its hash covers clock times
_TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")


def _normalised(value):
    """MLflow run ids, request ids, clock times and the OS account that runs the test vary from run to run and
    machine to machine; everything else must not."""
    text = json.dumps(value, sort_keys=True, default=str).replace(str(REPO), "<repo>")  # the checkout's folder
    text = text.replace(f'"account": {json.dumps(os_account())}', '"account": "<account>"')
    return json.loads(_TIMES.sub("<time>", _IDS.sub("<id>", _HEADS.sub('"head": "<head>"', text))))


DECISION_PARTS = ("schema", "outcome", "holds", "blockers", "approvals", "signoffs", "rollouts", "steps", "figures")


def _judged(tmp_path) -> dict:
    reg = fresh_registry(tmp_path)
    _, v = register_pair(reg, evidence(records=[record(n_items=60), record(task="sort", n_items=60)]))
    for item in ("fallback-plan", "tooling-maturity"):
        sign_off(reg, "tiny-llada", v, "poc", item, "ada", f"{item} checked for poc")
    out = {}
    for stage in ("poc", "staging", "production"):
        decision = judge(reg, "tiny-llada", v, stage)
        stored = load_gate_report(reg, "tiny-llada", v, stage)
        if stored and "decision" in stored:  # the sha256 of evidence files that hold run ids varies from run to run
            stored["decision"]["evidence"].pop("evidence_sha256", None)
        out[stage] = {
            "allowed": decision.allowed,
            "reasons": [[str(r.kind.value), r.text] for r in decision.reasons],
            "gates": [r.to_dict() for r in decision.gate_results],
            "checklist": decision.checklist.to_dicts() if decision.checklist else [],
            "evidence_keys": sorted(decision.evidence),
            "decision": {  # the decision's own parts besides the above: outcome, standings, rollouts, steps, figures
                k: v for k, v in decision.to_dict().items() if k in DECISION_PARTS
            },
            "stored": stored,
            "tags": {
                k: t
                for k, t in reg.version_tags("tiny-llada", v).items()
                if k.startswith(f"unmask.gates.{stage}") and not k.endswith(("sha256", ".sig"))
            },
        }  # digest, signature vary
    return _normalised(out)


def _check(name: str, found: dict) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(found, indent=1, sort_keys=True, default=str) + "\n"
    if os.environ.get("UNMASK_WRITE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert json.loads(text) == expected
    assert text == path.read_text(encoding="utf-8")  # byte for byte, key order and float spelling too


def test_gate_results_markdown_and_verdicts_are_the_golden_ones():
    _check("gate_reports", _gate_reports())


# slow: registers two versions and judges three stages on a real SQLite store (~8 s on 2 cores)
def test_judge_decisions_and_stored_reports_are_the_golden_ones(tmp_path):
    _check("judged", _judged(tmp_path))
