"""The order of the stages (`checklists.STAGES`: poc, staging, production), in one place: what comes before and
after a stage, the next one a version has to reach, and the highest one it qualifies for."""

from __future__ import annotations

from collections.abc import Mapping

from checklists import STAGES
from gates.decision import Decision


def next_stage(stage: str | None) -> str | None:
    """The stage after `stage` (the first one after None); None after the last."""
    if stage is None:
        return STAGES[0]
    index = STAGES.index(stage) + 1
    return STAGES[index] if index < len(STAGES) else None


def previous_stage(stage: str) -> str | None:
    """The stage before `stage`; None for the first (or a name that is no stage)."""
    i = STAGES.index(stage) if stage in STAGES else -1
    return STAGES[i - 1] if i > 0 else None


def next_stage_for(held: Mapping[str, str], version: str) -> str | None:
    """The first stage this version does not hold yet (its next promotion); None once it holds them all."""
    return next((stage for stage in STAGES if held.get(stage) != version), None)


def qualified_stage(verdicts: Mapping[str, Decision]) -> str | None:
    """The highest stage whose gates all passed, every stage below it passed too."""
    reached = None
    for stage in STAGES:
        if stage not in verdicts or not verdicts[stage].gates_passed:
            break
        reached = stage
    return reached
