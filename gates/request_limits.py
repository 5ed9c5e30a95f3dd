"""The serving policy's `limits:` section: how much compute one request may ask for, so one client cannot
starve the others (a request for `unmask.steps: 4096` once held a worker for a minute).

```yaml
limits: {max_steps: 256, max_canvas: 1024, max_token_forwards: 65536, time_budget_s: 60}
```

- `max_steps`: model calls one request may ask for (`unmask.steps`); never more than its canvas
  (`gen_length`) either, since a step unmasks at least one token.
- `max_canvas`: prompt tokens plus masked positions, the width of every forward.
- `max_token_forwards`: steps x canvas, the request's whole compute in token-forwards.
- `time_budget_s`: the most seconds one request may take; a decode past it is stopped and answered 504.

This module only parses (a `ServingPolicyError` names the key); `serving/limits.py` applies it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gates.serving_arms import ServingPolicyError

LIMIT_KEYS = ("max_steps", "max_canvas", "max_token_forwards", "time_budget_s")
MAX_TIME_BUDGET_S = 3600.0


@dataclass(frozen=True)
class RequestLimits:
    """Per-request compute caps (defaults: a 256-token answer at one step a token fits, a 4096-step one does not)."""

    max_steps: int = 256
    max_canvas: int = 1024
    max_token_forwards: int = 262_144  # 256 steps over a 1024-wide canvas
    time_budget_s: float = 120.0


def parse_request_limits(value: Any, where: str) -> RequestLimits:
    """`limits:` of a serving policy (absent: the defaults), each key checked and named."""
    if value is None:
        return RequestLimits()
    if not isinstance(value, dict):
        raise ServingPolicyError(f"{where}: expected a mapping of {', '.join(LIMIT_KEYS)}, got {value!r}")
    unknown = sorted(set(value) - set(LIMIT_KEYS))
    if unknown:
        raise ServingPolicyError(f"{where}.{unknown[0]}: unknown key; expected {', '.join(LIMIT_KEYS)}")
    out = {}
    for key in LIMIT_KEYS[:3]:
        number = value.get(key, getattr(RequestLimits, key))
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 2**31:
            raise ServingPolicyError(f"{where}.{key}: expected a positive integer, got {number!r}")
        out[key] = number
    budget = value.get("time_budget_s", RequestLimits.time_budget_s)
    if (
        not isinstance(budget, (int, float))
        or isinstance(budget, bool)
        or not math.isfinite(budget)
        or not 0 < budget <= MAX_TIME_BUDGET_S
    ):
        raise ServingPolicyError(
            f"{where}.time_budget_s: expected seconds in (0, {MAX_TIME_BUDGET_S:g}], got {budget!r}"
        )
    return RequestLimits(**out, time_budget_s=float(budget))
