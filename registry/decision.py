"""The decisions of the registry (`gates.decision.Decision`): every candidate's current version at every stage,
judged on its stored evidence (`registry.judging.judge_each`, one read of each version), recorded nowhere.

The decision table of `unmask run`, the dashboard's Verdict page and page 1 of the dossier render these.
"""

from __future__ import annotations

from gates.decision import Decision
from gates.policy import Policy
from registry.integrity import TAMPERED
from registry.judging import judge_each
from registry.state import fallback_holder, stage_holder
from registry.store import STAGE_ALIASES, Registry, latest_registration, model_tag
from registry.tracking import evidence_integrity


def decisions(
    registry: Registry,
    policy: Policy,
    models: list[str] | None = None,
    stages: tuple[str, ...] = STAGE_ALIASES,
    versions: dict[str, str] | None = None,
) -> list[Decision]:
    """One Decision per (candidate, stage), candidates in registry order, stages poc first. `models`: only
    these (default: every registered model whose role is `candidate`); `versions`: {model: version} instead of
    each one's current registration; tampered evidence gets none (the gate board shows it as tampered)."""
    if models is None:
        models = [m.name for m in registry.registered_models() if m.tags.get(model_tag("role")) == "candidate"]
    found = []
    for model in models:
        version = (versions or {}).get(model) or latest_registration(registry.aliases_of(model))
        if not version:
            continue
        judged = decisions_of(registry, model, version, stages, policy)
        found += [judged[stage] for stage in stages] if judged else []
    return found


def decisions_of(
    registry: Registry, model: str, version: str, stages: tuple[str, ...], policy: Policy
) -> dict[str, Decision] | None:
    """A version's decisions as `unmask gates` would make them now, recorded nowhere; None when its evidence (or a
    baseline's) is tampered, which the integrity board shows instead (judging it would write a finding, and a
    read never writes)."""
    judged = [(model, version), fallback_holder(registry), stage_holder(registry, "production")]
    if any(h and evidence_integrity(registry, *h)["status"] == TAMPERED for h in judged):
        return None
    return judge_each(registry, model, version, stages, policy, record=False)
