"""Rollout policy: how a canary moves traffic and what each step's analysis asks (the `rollout:` key of a
serving policy, `gates/serving.yaml`).

```yaml
rollout:
  steps: [5, 25, 50, 100]     # candidate weights, rising, the last 100
  interval_s: 60              # how long each step serves before it is analysed
  min_requests: 20            # per arm per interval before a pass; default: the fewest that can pass at all
  confidence: 0.95            # over the whole rollout: all its looks together pass a breaching candidate <= 5%
  probes: {task: arith, per_s: 1}  # held-out prompts with known answers sent through the route (optional)
  failure_limit: 1            # failed analyses before the automatic rollback
  inconclusive: pause         # pause (wait for `unmask rollout resume|abort`) or fail
  analysis:
    p95_latency_s: {max: 2.0}
    error_rate: {max: 0.05}
```

`load_rollout_policy()` refuses a malformed policy with a `RolloutPolicyError` naming the file and the key
(`rollout.analysis.p95_latency_s.max`). The metrics themselves live in `gates.canary.METRICS`.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checklists.yaml_file import read_yaml_file
from evals.tasks import TASKS
from gates.canary import METRICS, P95, MetricRange
from gates.sequential import (
    DEFAULT_CONFIDENCE,
    MAX_REQUESTS,
    look_alpha,
    requests_for_quantile,
    requests_to_settle_share,
)

INCONCLUSIVE_ACTIONS = ("pause", "fail")
SHARE_METRICS = ("error_rate", "decode_failure_rate", "agreement")  # shares of requests: bounds lie in [0, 1]
MAX_INTERVAL_S = 86_400.0  # one step serving longer than a day is a typo (1e12 s never reaches its analysis)


class RolloutPolicyError(ValueError):
    """A rollout policy that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class RolloutPolicy:
    steps: tuple[int, ...]
    interval_s: float
    min_requests: int
    analysis: tuple[MetricRange, ...]
    failure_limit: int = 1
    inconclusive: str = "pause"
    source: str = "<memory>"
    sha256: str = ""
    confidence: float = DEFAULT_CONFIDENCE
    probes: dict[str, Any] | None = None  # {task, per_s, max_tokens?}: probe prompts mixed into the traffic

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "interval_s": self.interval_s,
            "min_requests": self.min_requests,
            "analysis": [m.to_dict() for m in self.analysis],
            "failure_limit": self.failure_limit,
            "inconclusive": self.inconclusive,
            "source": self.source,
            "sha256": self.sha256,
            "confidence": self.confidence,
            "probes": self.probes,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutPolicy:
        """Back from `to_dict()` (a rollout's state file keeps the policy it started with), validated again."""
        plain = {
            k: data[k]
            for k in ("steps", "interval_s", "min_requests", "failure_limit", "inconclusive", "confidence", "probes")
            if data.get(k) is not None
        }
        plain["analysis"] = {
            m["metric"]: {b: m[b] for b in ("min", "max") if m.get(b) is not None} for m in data["analysis"]
        }
        return parse_rollout_policy(plain, data.get("source", "<memory>"))


def load_rollout_policy(path: str | Path) -> RolloutPolicy:
    """The `rollout:` key of a serving policy file, validated."""
    path = Path(path)
    data, _ = read_yaml_file(path, RolloutPolicyError, "serving policy")
    if not isinstance(data, dict) or "rollout" not in data:
        raise RolloutPolicyError(f"{path}: rollout: missing; a rollout needs steps, interval_s and analysis")
    return parse_rollout_policy(data["rollout"], source=str(path))


def parse_rollout_policy(data: Any, source: str = "<memory>") -> RolloutPolicy:
    """Validate a rollout policy given as plain data (the value of the `rollout` key)."""
    where = f"{source}: rollout"
    if not isinstance(data, dict):
        raise RolloutPolicyError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = {
        "steps",
        "interval_s",
        "min_requests",
        "analysis",
        "failure_limit",
        "inconclusive",
        "confidence",
        "probes",
    }
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise RolloutPolicyError(f"{where}.{unknown[0]}: unknown key; expected {', '.join(sorted(allowed))}")
    for key in ("steps", "interval_s", "analysis"):
        if key not in data:
            raise RolloutPolicyError(f"{where}.{key}: missing")
    steps = data["steps"]
    if not isinstance(steps, list) or not steps or not all(_is_int(s) and 0 < s <= 100 for s in steps):
        raise RolloutPolicyError(f"{where}.steps: expected a list of weights in 1..100, got {steps!r}")
    if any(b <= a for a, b in zip(steps, steps[1:])) or steps[-1] != 100:
        raise RolloutPolicyError(f"{where}.steps: expected rising weights ending at 100, got {steps!r}")
    interval = data["interval_s"]
    if not _is_number(interval) or interval <= 0:
        raise RolloutPolicyError(f"{where}.interval_s: expected a positive number of seconds, got {interval!r}")
    if interval > MAX_INTERVAL_S:
        raise RolloutPolicyError(
            f"{where}.interval_s: expected at most {MAX_INTERVAL_S:g} seconds (a day) per step, got {interval!r}"
        )
    confidence = data.get("confidence", DEFAULT_CONFIDENCE)
    if not _is_number(confidence) or not 0.5 <= confidence < 1:
        raise RolloutPolicyError(f"{where}.confidence: expected a number in [0.5, 1), got {confidence!r}")
    failure_limit = data.get("failure_limit", 1)
    if not _is_int(failure_limit) or failure_limit < 1:
        raise RolloutPolicyError(f"{where}.failure_limit: expected a positive integer, got {failure_limit!r}")
    inconclusive = data.get("inconclusive", "pause")
    if inconclusive not in INCONCLUSIVE_ACTIONS:
        raise RolloutPolicyError(
            f"{where}.inconclusive: expected one of {', '.join(INCONCLUSIVE_ACTIONS)}, got {inconclusive!r}"
        )
    analysis = data["analysis"]
    if not isinstance(analysis, dict) or not analysis:
        raise RolloutPolicyError(
            f"{where}.analysis: expected a mapping of metric to range, e.g. "
            f"{{p95_latency_s: {{max: 2.0}}}}; metrics: {', '.join(METRICS)}"
        )
    ranges = []
    for metric, bounds in analysis.items():
        at = f"{where}.analysis.{metric}"
        if metric not in METRICS:
            raise RolloutPolicyError(f"{at}: unknown metric; expected one of {', '.join(METRICS)}")
        if not isinstance(bounds, dict) or not bounds:
            raise RolloutPolicyError(f"{at}: expected a range {{min: N}} and/or {{max: N}}, got {bounds!r}")
        for key, value in bounds.items():
            if key not in ("min", "max"):
                raise RolloutPolicyError(f"{at}.{key}: unknown key; expected min, max")
            if not _is_number(value):
                raise RolloutPolicyError(f"{at}.{key}: expected a finite number, got {value!r}")
            if metric in SHARE_METRICS and not 0 <= value <= 1:
                raise RolloutPolicyError(
                    f"{at}.{key}: {metric} is a share of requests; expected a number in [0, 1], got {value!r}"
                )
            if value < 0:
                raise RolloutPolicyError(
                    f"{at}.{key}: {metric} is never negative; expected a number >= 0, got {value!r}"
                )
        bound = MetricRange(metric, bounds.get("min"), bounds.get("max"))
        if bound.min is not None and bound.max is not None and bound.min > bound.max:
            raise RolloutPolicyError(f"{at}: min {bound.min!r} is above max {bound.max!r}")
        ranges.append(bound)
    needed = {b.metric: requests_to_pass(b, confidence) for b in ranges}
    never = [b for b in ranges if needed[b.metric] is None]
    if never:
        key = "max" if never[0].max is not None else "min"
        raise RolloutPolicyError(
            f"{where}.analysis.{never[0].metric}.{key}: no number of requests (up to "
            f"{MAX_REQUESTS:,}) can show {key} {getattr(never[0], key)!r} at {confidence:g} "
            "confidence (a share's bound never reaches exactly 0 or 1)"
        )
    fewest = max(n for n in needed.values() if n is not None)  # each is a count past the check above
    min_requests = data.get("min_requests", fewest)
    if not _is_int(min_requests) or min_requests < 1:
        raise RolloutPolicyError(f"{where}.min_requests: expected a positive integer, got {min_requests!r}")
    probes = _parse_probes(data.get("probes"), f"{where}.probes")
    canonical = json.dumps(data, sort_keys=True, default=str).encode()
    return RolloutPolicy(
        tuple(steps),
        float(interval),
        min_requests,
        tuple(ranges),
        failure_limit,
        inconclusive,
        source,
        hashlib.sha256(canonical).hexdigest(),
        float(confidence),
        probes,
    )


def _parse_probes(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RolloutPolicyError(f"{where}: expected {{task, per_s, max_tokens}}, got {value!r}")
    unknown = sorted(set(value) - {"task", "per_s", "max_tokens"})
    if unknown:
        raise RolloutPolicyError(f"{where}.{unknown[0]}: unknown key; expected task, per_s, max_tokens")
    if value.get("task") not in TASKS:
        raise RolloutPolicyError(f"{where}.task: expected one of {', '.join(sorted(TASKS))}, got {value.get('task')!r}")
    per_s = value.get("per_s", 1)
    if not _is_number(per_s) or not 0 < per_s <= 50:
        raise RolloutPolicyError(f"{where}.per_s: expected probe items per second in (0, 50], got {per_s!r}")
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or not 1 <= max_tokens <= 4096):
        raise RolloutPolicyError(f"{where}.max_tokens: expected an integer in 1..4096, got {max_tokens!r}")
    return {"task": value["task"], "per_s": float(per_s), "max_tokens": max_tokens}


def requests_to_pass(bound: MetricRange, confidence: float = DEFAULT_CONFIDENCE) -> int | None:
    """The fewest candidate requests with which a flawless sample passes `bound` at a rollout's first look
    (the derived `min_requests`); None when no count can (a rate's max of 0, a share's min of 1)."""
    alpha = look_alpha(1 - confidence, 1)
    if bound.metric == "p95_latency_s":
        return requests_for_quantile(P95, alpha)
    if bound.metric == "p95_ratio_vs_baseline":
        return requests_for_quantile(P95, alpha / 2)
    return requests_to_settle_share(0, 0, alpha, bound.max, bound.min)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


ADVANCE, COMPLETE, REPEAT, ROLLBACK, PAUSE = "advance", "complete", "repeat", "rollback", "pause"


@dataclass(frozen=True)
class StepDecision:
    """What a rollout does after a step's analysis: advance, complete (promote), repeat the step (a failure
    under the limit), roll back, or pause for a human."""

    action: str
    failures: int  # failed analyses so far, this one included
    reason: str


def decide_step(verdict: str, step_index: int, failures: int, policy: RolloutPolicy) -> StepDecision:
    """The rollout's next move after a step's verdict (pass / fail / inconclusive)."""
    if verdict == "inconclusive" and policy.inconclusive == "fail":
        verdict = "fail"
    elif verdict == "inconclusive":
        return StepDecision(PAUSE, failures, "the analysis is inconclusive: the rollout waits for a human")
    if verdict == "pass":
        last = step_index >= len(policy.steps) - 1
        return StepDecision(
            COMPLETE if last else ADVANCE, failures, "the last step passed" if last else f"step {step_index + 1} passed"
        )
    failures += 1
    if failures >= policy.failure_limit:
        return StepDecision(
            ROLLBACK, failures, f"{failures} failed analyses reach the failure limit {policy.failure_limit}"
        )
    return StepDecision(REPEAT, failures, f"{failures} failed analyses, under the failure limit {policy.failure_limit}")
