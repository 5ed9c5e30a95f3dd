"""The decision lines of the registry (`gates.decision`): every candidate's current version at every stage,
judged afresh on its stored evidence against the AR fallback that holds `fallback` (nothing is recorded).

The scorecard of `unmask run`, the dashboard's Verdict page and page 1 of the dossier lead with these.
"""

from __future__ import annotations

from evals.records import CandidateEvidence
from gates.decision import DecisionLine, decision_line
from gates.evaluate import evaluate_gates
from gates.policy import Policy
from gates.promotion import current_signoffs
from registry.integrity import EvidenceTampered
from registry.state import fallback_holder, stage_holder, version_state
from registry.store import STAGE_ALIASES, Registry, latest_registration, model_tag
from registry.tracking import load_evidence


def decision_lines(
    registry: Registry,
    policy: Policy,
    models: list[str] | None = None,
    stages: tuple[str, ...] = STAGE_ALIASES,
    versions: dict[str, str] | None = None,
) -> list[DecisionLine]:
    """One DecisionLine per (candidate, stage), candidates in registry order, stages poc first. `models`: only
    these (default: every registered model whose role is `candidate`); `versions`: {model: version} instead of
    each one's current registration; tampered evidence gets no line."""
    fallback = fallback_holder(registry)
    fallback_evidence = _evidence(registry, *fallback) if fallback else None
    production = stage_holder(registry, "production")
    baseline = {"fallback": fallback_evidence, "production": _evidence(registry, *production) if production else None}
    if models is None:
        models = [m.name for m in registry.registered_models() if m.tags.get(model_tag("role")) == "candidate"]
    lines = []
    for model in models:
        version = (versions or {}).get(model) or latest_registration(registry.aliases_of(model))
        evidence = _evidence(registry, model, version) if version else None
        if not version or evidence is None:
            continue
        state = version_state(registry, model, version)  # one read of the version for every stage
        for stage in stages:
            signoffs, _ = current_signoffs(state.signoffs(stage), state.evaluated_at)
            results = evaluate_gates(evidence, policy, stage, baseline, signoffs)
            lines.append(
                decision_line(
                    evidence,
                    version,
                    policy.stage(stage),
                    results,
                    fallback_evidence if fallback and fallback[0] != model else None,
                    fallback[1] if fallback else "",
                )
            )
    return lines


def _evidence(registry: Registry, model: str, version: str) -> CandidateEvidence | None:
    try:
        return load_evidence(registry, model, version)
    except EvidenceTampered:  # never judged here; the gate board shows it as tampered
        return None
