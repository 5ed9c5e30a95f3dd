"""The production-regression rule: when tonight's verdict on the production holder is a regression (a measured
gate fails on evidence at least as strong as it was promoted on), when it is undecided (thinner evidence, or an
inconclusive gate), and what a sign-off gate failing means (nothing measured got worse). Pure: the nightly flow
judges, this decides what the verdict means, `registry.audit_events` records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gates.decision import Decision
from gates.results import GateResult
from gates.verdict import Verdict


@dataclass(frozen=True)
class ProductionVerdict:
    """The production holder judged against the production gates on its fresh evidence.

    `thinner`: each task tonight measured on fewer items than production needs (`EvidenceLevel`); then the
    verdict is inconclusive as a whole, whatever the gates say: a regression needs evidence as strong.
    `signed`: the gates a sign-off decides (tooling maturity). Re-registering tonight's evidence makes the
    sign-offs given before it stale, so such a gate fails without anything measured getting worse: it is
    reported (`unsigned`), never a regression.
    """

    model: str
    version: str
    decision: Decision
    thinner: tuple[str, ...] = ()
    signed: tuple[str, ...] = ()

    @property
    def failed(self) -> list[GateResult]:
        """The gates whose measurements failed (inconclusive ones and sign-offs are not failures)."""
        return [r for r in self.decision.gate_results if r.verdict == Verdict.FAIL and r.gate not in self.signed]

    @property
    def unsigned(self) -> list[GateResult]:
        return [r for r in self.decision.gate_results if r.verdict == Verdict.FAIL and r.gate in self.signed]

    @property
    def inconclusive(self) -> list[GateResult]:
        return [r for r in self.decision.gate_results if r.inconclusive]

    @property
    def regressed(self) -> bool:
        """Whether production fails a gate on evidence at least as strong as it was promoted on."""
        return bool(self.failed) and not self.thinner

    @property
    def undecided(self) -> bool:
        """Whether tonight's evidence could not judge production (thinner, or an inconclusive gate)."""
        return not self.regressed and bool(self.thinner or self.inconclusive)

    def to_dict(self) -> dict[str, Any]:
        """As the flow returns it and a finding records it: model, version, failed and inconclusive [{gate,
        reason}], thinner [why]."""
        return {
            "model": self.model,
            "version": self.version,
            "failed": [{"gate": r.gate, "reason": r.reason} for r in self.failed],
            "inconclusive": [{"gate": r.gate, "reason": r.reason} for r in self.inconclusive],
            "unsigned": [{"gate": r.gate, "reason": r.reason} for r in self.unsigned],
            "thinner": list(self.thinner),
        }


@dataclass(frozen=True)
class EvidenceLevel:
    """The items per task production needs: what it was promoted on, and the production policy's min_items."""

    min_items: int = 0  # the production stage's data_validity floor, for every task
    tasks: dict[str, int] = field(default_factory=dict)  # task -> items it was promoted on

    def items(self, task: str) -> int:
        return max(self.min_items, self.tasks.get(task, 0))

    def shortfalls(self, records: list[Any]) -> list[str]:
        """Each task whose freshest records hold fewer items than needed, in words."""
        measured: dict[str, int] = {}
        for r in records:
            measured[r.task] = max(measured.get(r.task, 0), r.n_items)
        needed = set(self.tasks) | set(measured)
        return [
            f"{task} measured on {measured.get(task, 0)} items tonight, production needs {self.items(task)}"
            for task in sorted(needed)
            if measured.get(task, 0) < self.items(task)
        ]
