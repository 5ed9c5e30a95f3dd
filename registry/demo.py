"""Whether a registry is a demonstration: one tag on the audit experiment, `unmask.demo_registry = true`.

`unmask run --demo` sets it on a registry that holds no production alias yet. A policy or roles file marked
`demo: true` (gates/demo-policy.yaml, gates/demo-roles.yaml) may move production only on a registry so marked:
a demo's relaxed thresholds and made-up people never decide a real production.
"""

from __future__ import annotations

from gates.policy import Policy
from gates.roles import Roles
from registry.connection import AUDIT_EXPERIMENT, RegistryError
from registry.store import Registry, model_tag, retry_busy

DEMO_TAG = model_tag("demo_registry")


def is_demo_registry(registry: Registry) -> bool:
    """Whether `unmask run --demo` marked this registry as a demonstration."""
    experiment = registry.client.get_experiment_by_name(AUDIT_EXPERIMENT)  # read-only: never created here
    return experiment is not None and experiment.tags.get(DEMO_TAG, "") == "true"


def mark_demo_registry(registry: Registry) -> None:
    """Mark the registry as a demonstration; refused (RegistryError) once a version holds production on it."""
    if is_demo_registry(registry):
        return
    held = registry.holders("production")
    if held:
        model, version = held[0]
        raise RegistryError(
            f"{registry.tracking_uri}: production is held by {model} v{version}; a registry that "
            "already moved production cannot be marked as a demo (use a fresh $UNMASK_HOME)"
        )
    retry_busy(registry.client.set_experiment_tag, registry.experiment_id(AUDIT_EXPERIMENT), DEMO_TAG, "true")


def demo_refusal(registry: Registry, stage: str, demo_files: list[str]) -> str:
    """Why a move to `stage` under demo policy or roles files is refused here ("" when it is allowed)."""
    if stage != "production" or not demo_files or is_demo_registry(registry):
        return ""
    return (
        f"{' and '.join(demo_files)} {'is' if len(demo_files) == 1 else 'are'} marked `demo: true` and cannot "
        f"move production on {registry.tracking_uri}, which is not a demo registry (`unmask run --demo` marks a "
        "fresh one); judge with a real policy and roles file"
    )


def demo_marks(registry: Registry | None, policy: Policy | None, roles: Roles | None) -> list[str]:
    """What makes a verdict a demonstration, in words: a `demo: true` policy or roles file, a registry marked demo
    (each part None when unknown: not read, or not readable)."""
    marks = []
    if policy is not None and policy.demo:
        marks.append(f"policy {policy.path or policy.source} is marked demo: true")
    if roles is not None and roles.demo:
        marks.append(f"roles {roles.path or roles.source} are marked demo: true")
    if registry is not None and is_demo_registry(registry):
        marks.append(f"the registry {registry.tracking_uri} is marked as a demo")
    return marks
