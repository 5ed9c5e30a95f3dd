"""The serving policy's `arms:` and `health:` sections: named arms beyond the served aliases, and when one is unhealthy.

An arm a route names is a served alias unless `arms:` declares it. A declared arm is either an upstream
OpenAI-compatible endpoint (vLLM, SGLang, a hosted API, another `unmask serve`) or a local alias under
another name, and either may carry drill faults:

```yaml
arms:
  vllm-a: {upstream: "http://127.0.0.1:8001/v1", model: production, api_key_env: UPSTREAM_KEY, timeout_s: 30}
  slow-staging: {alias: staging, faults: {delay_s: 0.5, abort_share: 20, nan_share: 0}}
health: {failures: 3, cooldown_s: 10}
```

Every refusal is a `ServingPolicyError` naming the key (`arms.vllm-a.timeout_s`); this module only parses.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

ARM_KEYS = ("upstream", "model", "api_key_env", "timeout_s", "alias", "faults")
FAULT_KEYS = ("delay_s", "abort_share", "nan_share", "corrupt_share")
HEALTH_KEYS = ("failures", "cooldown_s")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ServingPolicyError(ValueError):
    """A serving policy that cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class FaultSpec:
    """Istio-style drill faults on one arm: a delay before it answers, a share of 500 aborts, a share of NaN answers."""

    delay_s: float = 0.0
    abort_share: int = 0  # percent of the arm's requests answered 500 before it runs
    nan_share: int = 0  # percent of its answers turned into a decode failure (counted as NaN logits)
    corrupt_share: int = 0  # percent of its answers whose text is garbled: fast, status 200, and wrong


@dataclass(frozen=True)
class ArmSpec:
    """A declared arm: `upstream` set means an OpenAI-compatible endpoint, else the local `alias`."""

    name: str
    upstream: str | None = None  # base URL ending in /v1
    model: str | None = None  # the `model` sent upstream
    api_key_env: str | None = None  # the environment variable holding the upstream's key (never the key itself)
    timeout_s: float | None = None  # one attempt's limit; None: the server's request timeout
    alias: str | None = None  # local arms: the served alias that answers
    faults: FaultSpec | None = None

    @property
    def kind(self) -> str:
        return "upstream" if self.upstream else "local"


@dataclass(frozen=True)
class HealthSpec:
    """An arm failing `failures` times in a row is unhealthy; after `cooldown_s` one request probes it."""

    failures: int = 3
    cooldown_s: float = 10.0


def parse_arms(value: Any, where: str) -> dict[str, ArmSpec]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServingPolicyError(f"{where}: expected a mapping of arm name to settings, got {value!r}")
    arms = {}
    for name, spec in value.items():
        at = f"{where}.{name}"
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ServingPolicyError(f"{at}: an arm name is letters, digits, - and _")
        arms[name] = _parse_arm(name, spec, at)
    return arms


def _parse_arm(name: str, spec: Any, where: str) -> ArmSpec:
    if not isinstance(spec, dict):
        raise ServingPolicyError(f"{where}: expected a mapping of settings, got {spec!r}")
    unknown = sorted(set(spec) - set(ARM_KEYS))
    if unknown:
        raise ServingPolicyError(f"{where}.{unknown[0]}: unknown key; expected {', '.join(ARM_KEYS)}")
    if ("upstream" in spec) == ("alias" in spec):
        raise ServingPolicyError(
            f"{where}: expected exactly one of upstream (an OpenAI-compatible base URL) or alias (a served alias)"
        )
    faults = _parse_faults(spec["faults"], f"{where}.faults") if "faults" in spec else None
    timeout = spec.get("timeout_s")
    if timeout is not None and (not _is_number(timeout) or timeout <= 0):
        raise ServingPolicyError(f"{where}.timeout_s: expected a positive number of seconds, got {timeout!r}")
    if "alias" in spec:
        stray = sorted(set(spec) & {"model", "api_key_env"})
        if stray:
            raise ServingPolicyError(f"{where}.{stray[0]}: only an upstream arm has {stray[0]}")
        _name(spec["alias"], f"{where}.alias", "a served alias")
        return ArmSpec(name, timeout_s=timeout, alias=spec["alias"], faults=faults)
    url = spec["upstream"]
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ServingPolicyError(
            f"{where}.upstream: expected an http(s) base URL such as http://127.0.0.1:8001/v1, got {url!r}"
        )
    model = _name(spec.get("model"), f"{where}.model", "the model name the upstream serves")
    key_env = spec.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or not ENV_NAME.fullmatch(key_env)):
        raise ServingPolicyError(f"{where}.api_key_env: expected an environment variable name, got {key_env!r}")
    return ArmSpec(name, upstream=url.rstrip("/"), model=model, api_key_env=key_env, timeout_s=timeout, faults=faults)


def _parse_faults(value: Any, where: str) -> FaultSpec:
    if not isinstance(value, dict):
        raise ServingPolicyError(f"{where}: expected {{{', '.join(FAULT_KEYS)}}}, got {value!r}")
    unknown = sorted(set(value) - set(FAULT_KEYS))
    if unknown:
        raise ServingPolicyError(f"{where}.{unknown[0]}: unknown key; expected {', '.join(FAULT_KEYS)}")
    delay = value.get("delay_s", 0.0)
    if not _is_number(delay) or not 0 <= delay <= 600:
        raise ServingPolicyError(f"{where}.delay_s: expected seconds in 0..600, got {delay!r}")
    shares = {}
    for key in ("abort_share", "nan_share", "corrupt_share"):
        share = value.get(key, 0)
        if not _is_int(share) or not 0 <= share <= 100:
            raise ServingPolicyError(f"{where}.{key}: expected an integer percent in 0..100, got {share!r}")
        shares[key] = share
    return FaultSpec(float(delay), **shares)


def parse_health(value: Any, where: str) -> HealthSpec:
    if value is None:
        return HealthSpec()
    if not isinstance(value, dict):
        raise ServingPolicyError(f"{where}: expected {{failures, cooldown_s}}, got {value!r}")
    unknown = sorted(set(value) - set(HEALTH_KEYS))
    if unknown:
        raise ServingPolicyError(f"{where}.{unknown[0]}: unknown key; expected {', '.join(HEALTH_KEYS)}")
    failures = value.get("failures", HealthSpec.failures)
    if not _is_int(failures) or failures < 1:
        raise ServingPolicyError(f"{where}.failures: expected a positive integer, got {failures!r}")
    cooldown = value.get("cooldown_s", HealthSpec.cooldown_s)
    if not _is_number(cooldown) or cooldown <= 0:
        raise ServingPolicyError(f"{where}.cooldown_s: expected a positive number of seconds, got {cooldown!r}")
    return HealthSpec(failures, float(cooldown))


def _name(value: Any, where: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ServingPolicyError(f"{where}: expected {what}, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
