"""Gate evaluation: pure functions from evidence, baselines and a stage policy to `GateResult`s.

Only records validated by the evaluation (`record.valid is True`) count as evidence. A verdict is
one of three: `pass`, `fail`, or `inconclusive` when the evidence is not enough to judge (no
validated record at the operating point, fewer items than `data_validity` asks, a quality interval
that spans the bound when the gate asks for a settled result). An inconclusive gate does not pass,
so nothing is promoted on it, and it says what would settle it (`GateResult.settle`). Reasons word
their numbers as people read them (`gates.readable`: 3 significant digits, ms, %). Each stage judges one
operating point: the candidate's records at the policy's task and generation length, for the SamplerConfig
with the best quality
there (ties: lower p95), unless the evidence's card names `operating_config_hash`. Every result's
`evidence` names the record id, MLflow run id and hashes it was computed from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evals.records import CandidateEvidence, EvalRecord
from gates.checks import GATE_CHECKS, GateContext
from gates.policy import SIGNED_KINDS as SIGNED_KINDS  # re-exported: where sign-off gates were always read
from gates.policy import Policy
from gates.results import Baseline, GateResult, as_evidence, operating_records, primary_record
from gates.verdict import FAIL, INCONCLUSIVE, PASS, Verdict


def evaluate_gates(
    evidence_or_records: CandidateEvidence | list[EvalRecord],
    policy: Policy,
    stage: str,
    baseline: Baseline | CandidateEvidence | None = None,
    signoffs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[GateResult]:
    """Judge one candidate version against every gate of `stage`, in policy order.

    baseline: {"fallback": evidence, "production": evidence or None}; a bare evidence is the fallback.
    signoffs: manual checklist sign-offs {item_id: {"by", "at", "comment"}} (the tooling gate reads one).
    """
    evidence = as_evidence(evidence_or_records)
    stage_policy = policy.stage(stage)
    if isinstance(baseline, CandidateEvidence):
        baseline = {"fallback": baseline}
    baselines = {}
    for name, base in (baseline or {}).items():
        base_records = operating_records(base, stage_policy)
        baselines[name] = (base, primary_record(base_records, stage_policy))
    records = operating_records(evidence, stage_policy)
    ctx = GateContext(evidence, stage_policy, records, primary_record(records, stage_policy), baselines, signoffs or {})
    return [GATE_CHECKS[spec.kind].check(ctx, spec) for spec in stage_policy.gates]


def all_passed(results: list[GateResult]) -> bool:
    return bool(results) and all(r.passed for r in results)


def stage_verdict(results: list[GateResult]) -> Verdict:
    """A stage's verdict from its gates: fail if any gate failed (or none was judged), else inconclusive if any
    is, else pass."""
    return Verdict.combine(r.verdict for r in results)


def gate_report_markdown(results: list[GateResult], title: str = "") -> str:
    """The gate table as Markdown, for MLflow artifacts and flow summaries."""
    lines = [f"# {title}" if title else "# Gate report", ""]
    if results:
        verdict = {PASS: "PASSED", FAIL: "FAILED", INCONCLUSIVE: "INCONCLUSIVE"}[stage_verdict(results)]
        open_ = sum(r.inconclusive for r in results)
        lines += [
            f"Stage **{results[0].stage}**: {verdict} "
            f"({sum(r.passed for r in results)}/{len(results)} gates"
            + (f", {open_} inconclusive" if open_ else "")
            + ")",
            "",
        ]
    lines += ["| gate | passed | value | threshold | reason | record | run |", "|---|---|---|---|---|---|---|"]
    for r in results:
        word = {PASS: "yes", FAIL: "**no**", INCONCLUSIVE: "*inconclusive*"}[Verdict(r.verdict)]
        cells = [
            r.gate,
            word,
            _cell(r.value),
            _cell(r.threshold),
            _cell(r.reason),
            str(r.evidence.get("record_id") or ""),
            str(r.evidence.get("run_id") or ""),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
