"""How a decision's outcome reads in the terminal: one colour per `gates.decision.Outcome`, for every table and line
that shows one. Imported where a decision is printed (never at CLI start-up: it loads the gates package)."""

from __future__ import annotations

from gates.decision import Outcome

OUTCOME_COLOURS = {Outcome.ADOPT: "green", Outcome.BLOCKED: "red", Outcome.INCONCLUSIVE: "yellow"}


def outcome_markup(outcome: Outcome, text: str | None = None) -> str:
    """`text` (default: the outcome's word) in the outcome's colour, as rich markup."""
    return f"[{OUTCOME_COLOURS[outcome]}]{outcome.value if text is None else text}[/]"
