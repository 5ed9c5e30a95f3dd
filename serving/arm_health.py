"""Arm health (a circuit breaker per arm) and the drill faults an arm may be given.

An arm that fails `health.failures` times in a row (connection refused, timeout, 5xx, a decode
failure) is unhealthy: its traffic goes to the route's fallback. Once `cooldown_s` has passed, the
next request for it is let through as a probe (one at a time; its failure is still answered by the
fallback); a probe that succeeds makes it healthy again, one that fails starts a new cooldown.

`FaultDrill` applies an arm's `faults` (Istio-style fault injection, for drills and the rollout's
tests): a delay, a share of aborts, a share of answers turned into decode failures. Shares are exact
and evenly spread, not random: with `abort_share: 20` every fifth request of that arm aborts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gates.serving_arms import HealthSpec


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class _State:
    healthy: bool = True
    failures: int = 0  # in a row
    reason: str | None = None
    reason_kind: str = ""  # the bounded label of the reason, for /metrics
    since: str = field(default_factory=_now_iso)
    retry_at: float = 0.0  # monotonic time after which a probe may go
    probing: bool = False


class ArmHealth:
    """Healthy or not, per arm name; `spec()` gives the thresholds in force (they follow policy reloads)."""

    def __init__(self, spec: Callable[[], HealthSpec], metrics: Any):
        self.spec, self.metrics = spec, metrics
        self.arms: dict[str, _State] = {}

    def _state(self, arm: str) -> _State:
        if arm not in self.arms:
            self.arms[arm] = _State()
            self.metrics.arm_healthy.labels(arm).set(1)
        return self.arms[arm]

    def admits(self, arm: str) -> bool:
        """May a request go to `arm` now? Unhealthy arms admit one probe after their cooldown."""
        state = self._state(arm)
        if state.healthy:
            return True
        if not state.probing and time.monotonic() >= state.retry_at:
            state.probing = True
            return True
        return False

    def succeeded(self, arm: str) -> None:
        state = self._state(arm)
        state.failures, state.probing = 0, False
        if not state.healthy:
            self.metrics.arm_unhealthy.labels(arm, state.reason_kind).set(0)
            state.healthy, state.reason, state.since = True, None, _now_iso()
            self.metrics.arm_healthy.labels(arm).set(1)

    def released(self, arm: str) -> None:
        """An attempt that ended saying nothing about the arm (the request was refused): free the probe slot."""
        self._state(arm).probing = False

    def failed(self, arm: str, reason_kind: str, message: str) -> None:
        state, spec = self._state(arm), self.spec()
        state.failures += 1
        self.metrics.arm_failures.labels(arm, reason_kind).inc()
        if state.probing or (state.healthy and state.failures >= spec.failures):
            if state.healthy:
                state.since = _now_iso()
            else:
                self.metrics.arm_unhealthy.labels(arm, state.reason_kind).set(0)
            state.healthy, state.probing = False, False
            state.reason, state.reason_kind = f"{state.failures} failures in a row, the last: {message}", reason_kind
            state.retry_at = time.monotonic() + spec.cooldown_s
            self.metrics.arm_healthy.labels(arm).set(0)
            self.metrics.arm_unhealthy.labels(arm, reason_kind).set(1)

    def healthy(self, arm: str) -> bool:
        return self._state(arm).healthy

    def report(self, arm: str) -> dict[str, Any]:
        state = self._state(arm)
        return {
            "healthy": state.healthy,
            "reason": state.reason,
            "since": state.since,
            "failures_in_a_row": state.failures,
        }


class FaultDrill:
    """Counts each arm's requests so that a fault share fires on exactly that share of them."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], int] = {}

    def fires(self, arm: str, kind: str, share: int) -> bool:
        n = self._seen.get((arm, kind), 0)
        self._seen[(arm, kind)] = n + 1
        return (n + 1) * share // 100 > n * share // 100
