"""A failed or aborted rollout is a finding on the version (pure, no I/O).

The version's rollouts (the `canary` evidence, registry/rollouts.py `canary_evidence`) are read in order; when
the last one to a stage was rolled back by its analysis or aborted by a person, that stands against promoting
the version to the stage whatever the stage's gates list: `unmask gates`, the promotion rules and the Verdict
page say so, citing the rollout. It stops standing when a later rollout of the version to that stage is under
way (it needed new approvals: the rollback voided the old ones) or new evidence was registered after it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

FAILED_ROLLOUT = ("rolled_back", "aborted")


def failed_rollout(canary: Sequence[Mapping[str, Any]], stage: str) -> Mapping[str, Any] | None:
    """The version's last rollout to `stage` when it was rolled back or aborted; None otherwise."""
    mine = [r for r in canary if r.get("stage", stage) == stage]
    return mine[-1] if mine and mine[-1].get("status") in FAILED_ROLLOUT else None


def finding_text(rollout: Mapping[str, Any], stage: str) -> str:
    """The finding in words, with what to do next (never "put the previous holder back": nothing moved)."""
    how = "rolled back by its canary analysis" if rollout.get("status") == "rolled_back" else "aborted"
    why = f" ({rollout['reason']})" if rollout.get("reason") else ""
    return (
        f"rollout {rollout.get('id')} of this version to {stage} was {how}{why}; investigate the failed "
        f"analysis, re-evaluate and register new evidence, or start a new rollout with new approvals "
        f"(the rollback voided the old ones)"
    )
