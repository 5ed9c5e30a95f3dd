"""Judging a version against a stage on what the registry holds: its evidence, the baselines' evidence, its
sign-offs, approvals and reached stages, each version read once (`registry.state.VersionState`).

Readers (`registry.read`, the dashboard) judge with `record=False`; `promote` and `unmask gates` record the
gate report. Nothing here moves an alias (that is `registry.promotion`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from mlflow.exceptions import MlflowException

from evals.records import CandidateEvidence
from gates.decision import Context, Decision, decide
from gates.next_steps import names_version
from gates.policy import POLICY_PATH, Policy, PolicyError, load_policy
from gates.promotion import Duties
from gates.roles import Roles
from registry.connection import RegistryError
from registry.integrity import VERIFIED
from registry.state import VersionState, fallback_holder, stage_holder, version_state
from registry.store import Registry, model_tag, reads_once
from registry.tracking import checked_evidence, load_gate_report, record_gate_report

log = logging.getLogger("unmask.registry")


@reads_once
def judge(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    policy: Policy | None = None,
    record: bool = True,
    roles: Roles | None = None,
    duties: Duties | None = None,
) -> Decision:
    """Evaluate a version against a stage: gates on its stored evidence, checklist, approvals and the
    separation of duties (`duties`: default, the open request and the version's registrant), stage order."""
    return judge_each(registry, model, version, [stage], policy, record, roles, duties)[stage]


def judge_each(
    registry: Registry,
    model: str,
    version: str,
    stages: Iterable[str],
    policy: Policy | None = None,
    record: bool = True,
    roles: Roles | None = None,
    duties: Duties | None = None,
) -> dict[str, Decision]:
    """`judge` for several stages, on one read of the version, its evidence and the baselines' (no stage
    changes what another reads: each records only its own report)."""
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
    vouching = {
        "evidence_run": vouched["run_id"],
        "evidence_status": vouched["status"],
        "evidence_sha256": vouched["sha256"],
    }
    held = everything.get(model, {})
    context = Context(
        model,
        str(version),
        name_version=names_version(held, str(version)),
        policy_path=policy_flag(policy),
        fallback_version=fallback[1] if fallback else "",
        evidence_status=vouched["status"],
        registration={
            "by": state.tags.get(model_tag("evaluated_by"), ""),
            "at": state.evaluated_at,
            "key": state.tags.get(model_tag("evaluated_key"), ""),
            "signature": state.tags.get(model_tag("evaluated_signature"), ""),
            "run": vouched["run_id"],
            "sha256": vouched["sha256"],
        },
    )
    decisions = {}
    for stage in stages:
        owed = state.duties(stage, state.open_request(stage)) if duties is None else duties
        decision = decide(
            evidence,
            policy,
            stage,
            baseline,
            state.signoffs(stage),
            state.approvals(stage),
            state.reached,
            evaluated_at=state.evaluated_at,
            roles=roles,
            duties=owed,
            context=replace(context, holds=held.get(stage) == str(version)),
        )
        decision = replace(decision, evidence=decision.evidence | vouching)
        if record and decision.gate_results:
            record_gate_report(
                registry,
                model,
                version,
                stage,
                list(decision.gate_results),
                decision.checklist.to_dicts() if decision.checklist else [],
                policy=decision.evidence.get("policy"),
                tags=state.tags,
                decision=decision.to_dict(),
            )
        decisions[stage] = decision
    return decisions


def judge_again(
    registry: Registry, model: str, version: str, stage: str, roles: Roles | None = None
) -> Decision | None:
    """Judge a stage again, under the policy its stored report was judged under, and store the decision if it
    changed: what an act that changes a stage's decision (an approval) does, so that every surface shows the
    decision as it stands from then on. None (nothing judged) when the stage was never judged, its stored report
    cannot be trusted, or the policy file it cites is gone or changed since (the next `unmask gates` judges it)."""
    try:
        stored = load_gate_report(registry, model, version, stage)
    except RegistryError:  # a tampered report: whoever judges next records it
        return None
    cited = (stored or {}).get("policy") or {}
    if not stored or stored.get("integrity") != VERIFIED or not cited.get("sha256"):
        return None
    try:
        policy = load_policy(cited.get("path") or None)
    except PolicyError:
        return None
    if policy.sha256 != cited["sha256"]:
        return None
    try:
        return judge(registry, model, version, stage, policy, roles=roles)
    except (RegistryError, MlflowException, OSError) as e:
        # a baseline's evidence forged since, or an approver the server lets change the model but not the evidence
        # run (403): the act stands, and the next judgement (the promotion's) stores the decision
        log.info("%s v%s %s: the decision is stored by the next judgement (%s)", model, version, stage, e)
        return None


def policy_flag(policy: Policy) -> str | None:
    """The policy file a command must name to judge as `policy` did (None: the bundled one)."""
    return policy.path if policy.path and policy.path != str(POLICY_PATH) else None


def fallback_evidence(registry: Registry) -> CandidateEvidence | None:
    """The checked evidence of the version the fallback alias names; None when no model holds it."""
    holder = fallback_holder(registry)
    return checked_evidence(registry, *holder)[0] if holder else None


def _baseline_evidence(
    registry: Registry, holder: tuple[str, str], model: str, version: str, state: VersionState
) -> Any:
    """A baseline's checked evidence; the judged version's own state when it is the baseline (no second read)."""
    tags = state.tags if holder == (model, version) else version_state(registry, *holder).tags
    return checked_evidence(registry, *holder, tags=tags)[0]
