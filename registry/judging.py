"""Judging a version against a stage on what the registry holds: its evidence, the baselines' evidence, its
sign-offs, approvals and reached stages, each version read once (`registry.state.VersionState`).

Readers (`registry.read`, the dashboard) judge with `record=False`; `promote` and `unmask gates` record the
gate report. Nothing here moves an alias (that is `registry.promotion`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gates.policy import Policy, load_policy
from gates.promotion import Duties, PromotionDecision, decide_promotion
from gates.roles import Roles
from registry.state import VersionState, fallback_holder, stage_holder, version_state
from registry.store import Registry
from registry.tracking import checked_evidence, record_gate_report


def judge(registry: Registry, model: str, version: str, stage: str, policy: Policy | None = None,
          record: bool = True, roles: Roles | None = None, duties: Duties | None = None) -> PromotionDecision:
    """Evaluate a version against a stage: gates on its stored evidence, checklist, approvals and the
    separation of duties (`duties`: default, the open request and the version's registrant), stage order."""
    policy = policy or load_policy()
    state = version_state(registry, model, version)
    evidence, vouched = checked_evidence(registry, model, version, tags=state.tags)
    baseline: dict[str, Any] = {"fallback": None, "production": None}
    everything = registry.all_aliases()
    fallback = fallback_holder(registry, everything)
    if fallback:  # a forged baseline would forge the speedup and relative-quality gates: checked alike
        baseline["fallback"] = _baseline_evidence(registry, fallback, model, version, state)
    production = stage_holder(registry, "production", everything)
    if production and production != (model, version):
        baseline["production"] = _baseline_evidence(registry, production, model, version, state)
    if duties is None:
        duties = state.duties(stage, state.open_request(stage))
    decision = decide_promotion(evidence, policy, stage, baseline, state.signoffs(stage), state.approvals(stage),
                                state.reached, evaluated_at=state.evaluated_at, roles=roles, duties=duties)
    decision = replace(decision, evidence=decision.evidence | {"evidence_run": vouched["run_id"],
                                                               "evidence_status": vouched["status"],
                                                               "evidence_sha256": vouched["sha256"]})
    if record and decision.gate_results:
        record_gate_report(registry, model, version, stage, list(decision.gate_results),
                           decision.checklist.to_dicts() if decision.checklist else [],
                           policy=decision.evidence.get("policy"), tags=state.tags)
    return decision


def _baseline_evidence(registry: Registry, holder: tuple[str, str], model: str, version: str,
                       state: VersionState) -> Any:
    """A baseline's checked evidence; the judged version's own state when it is the baseline (no second read)."""
    tags = state.tags if holder == (model, version) else version_state(registry, *holder).tags
    return checked_evidence(registry, *holder, tags=tags)[0]
