"""Serving policy: the routes `unmask serve --routes` sends traffic by, and each route's sticky traffic split.

`load_serving_policy()` reads `gates/serving.yaml` (or any file) into frozen dataclasses and refuses a
malformed one with a `ServingPolicyError` that names the file and the key (`routes.long.match.header`).

A route has a name, a matcher (one of `MATCHERS`: by request path, header, the OpenAI `user` field or a
`metadata` tag, or request shape) and either the alias (arm) that serves it or a `split` of arms to
weights summing to 100. Routes are tried in file order; unmatched traffic goes to `default`. Within a
split the arm is picked by hashing a request key into 0..99 (`bucket`), so one user always sees one arm.
A route may also name its `fallback` arm (the one that answers when its arm fails or is unhealthy) and a
`shadow` arm that gets a copy of a share of its requests. Arms beyond the served aliases (upstream
endpoints, local aliases with drill faults) and the health thresholds are declared in `arms:` and
`health:` (`gates/serving_arms.py`); a top-level `rollout:` belongs to `gates/rollout_policy.py` and is
left to it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from checklists.yaml_file import read_yaml_file
from gates.request_limits import RequestLimits, parse_request_limits
from gates.serving_arms import ArmSpec, HealthSpec, parse_arms, parse_health
from gates.serving_arms import ServingPolicyError as ServingPolicyError  # re-exported: callers catch it from here

SERVING_POLICY_PATH = Path(__file__).resolve().parent / "serving.yaml"
AUTO = "auto"  # the `model` a client sends to be routed
DEFAULT = "default"
FALLBACK = "fallback"  # the alias that answers for a failed arm when a route names no `fallback`
TOP_KEYS = ("routes", DEFAULT, "arms", "health", "limits", "rollout")  # rollout: gates/rollout_policy.py reads it


@dataclass(frozen=True)
class RequestFacts:
    """What a matcher may look at: never the prompt, only the request's envelope and shape."""

    path: str
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased
    user: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    max_tokens: int | None = None


class Matcher(Protocol):
    """One way to match a request. A new kind: one class + one `MATCHERS` line + a contract-test example."""

    kind: ClassVar[str]

    @classmethod
    def parse(cls, value: Any, where: str) -> Matcher: ...

    def matches(self, facts: RequestFacts) -> bool: ...

    def describe(self) -> str: ...


PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class PathMatcher:
    """`path: /v1/chat/completions`: requests to that endpoint."""

    kind: ClassVar[str] = "path"
    path: str

    @classmethod
    def parse(cls, value: Any, where: str) -> PathMatcher:
        if value not in PATHS:
            raise ServingPolicyError(f"{where}: expected one of {', '.join(PATHS)}, got {value!r}")
        return cls(value)

    def matches(self, facts: RequestFacts) -> bool:
        return facts.path == self.path

    def describe(self) -> str:
        return f"path {self.path}"


def _name_value(value: Any, where: str, what: str) -> tuple[str, str]:
    if (
        not isinstance(value, dict)
        or set(value) != {"name", "value"}
        or not all(isinstance(value[k], str) and value[k] for k in ("name", "value"))
    ):
        raise ServingPolicyError(f"{where}: expected {{name: <{what}>, value: <str>}}, got {value!r}")
    return value["name"], value["value"]


@dataclass(frozen=True)
class HeaderMatcher:
    """`header: {name: X-Route, value: latency}`: a request header with that value (name case-insensitive)."""

    kind: ClassVar[str] = "header"
    name: str
    value: str

    @classmethod
    def parse(cls, value: Any, where: str) -> HeaderMatcher:
        name, wanted = _name_value(value, where, "header name")
        return cls(name.lower(), wanted)

    def matches(self, facts: RequestFacts) -> bool:
        return facts.headers.get(self.name) == self.value

    def describe(self) -> str:
        return f"header {self.name}: {self.value}"


@dataclass(frozen=True)
class UserMatcher:
    """`user: [alice, bob]` (or one name): the OpenAI `user` field is one of them."""

    kind: ClassVar[str] = "user"
    users: tuple[str, ...]

    @classmethod
    def parse(cls, value: Any, where: str) -> UserMatcher:
        users = [value] if isinstance(value, str) else value
        if not isinstance(users, list) or not users or not all(isinstance(u, str) and u for u in users):
            raise ServingPolicyError(f"{where}: expected a user name or a non-empty list of them, got {value!r}")
        return cls(tuple(users))

    def matches(self, facts: RequestFacts) -> bool:
        return facts.user in self.users

    def describe(self) -> str:
        return f"user in {', '.join(self.users)}"


@dataclass(frozen=True)
class MetadataMatcher:
    """`metadata: {name: tier, value: batch}`: the request's OpenAI `metadata` has that tag."""

    kind: ClassVar[str] = "metadata"
    name: str
    value: str

    @classmethod
    def parse(cls, value: Any, where: str) -> MetadataMatcher:
        return cls(*_name_value(value, where, "metadata key"))

    def matches(self, facts: RequestFacts) -> bool:
        return facts.metadata.get(self.name) == self.value

    def describe(self) -> str:
        return f"metadata {self.name}={self.value}"


@dataclass(frozen=True)
class MaxTokensAboveMatcher:
    """`max_tokens_above: 128`: requests asking for more answer tokens than that (long reasoning -> the AR fallback)."""

    kind: ClassVar[str] = "max_tokens_above"
    bound: int

    @classmethod
    def parse(cls, value: Any, where: str) -> MaxTokensAboveMatcher:
        if not _is_int(value) or value < 0:
            raise ServingPolicyError(f"{where}: expected a non-negative integer, got {value!r}")
        return cls(value)

    def matches(self, facts: RequestFacts) -> bool:
        return facts.max_tokens is not None and facts.max_tokens > self.bound

    def describe(self) -> str:
        return f"max_tokens > {self.bound}"


MATCHERS: dict[str, type[Matcher]] = {
    m.kind: m for m in (PathMatcher, HeaderMatcher, UserMatcher, MetadataMatcher, MaxTokensAboveMatcher)
}


@dataclass(frozen=True)
class ShadowSpec:
    """`shadow: {arm: staging, share: 100}`: that share of the route's requests (sticky) is copied to `arm`."""

    arm: str
    share: int = 100

    def takes(self, key: str, route: str) -> bool:
        return bucket(key, f"{route}\x00shadow") < self.share


@dataclass(frozen=True)
class RouteSpec:
    """One route: what it matches (None for `default`) and the arms that serve it, with weights summing to 100."""

    name: str
    match: Any  # a Matcher, or None for the default route
    split: tuple[tuple[str, int], ...]  # (arm, weight) in file order; one arm at 100 for a plain `arm:`
    fallback: str | None = None  # None: the alias `fallback`, when served
    shadow: ShadowSpec | None = None

    def arms(self) -> tuple[str, ...]:
        """Every arm the route may send a request to: its split's, its fallback, its shadow."""
        extra = (self.fallback,) if self.fallback else ()
        return tuple(
            dict.fromkeys((*(arm for arm, _ in self.split), *extra, *((self.shadow.arm,) if self.shadow else ())))
        )

    def pick(self, key: str) -> str:
        """The arm for a request key: sticky (the same key, the same arm while the weights stay)."""
        return pick_arm(self.split, bucket(key, self.name))


@dataclass(frozen=True)
class ServingPolicy:
    routes: tuple[RouteSpec, ...]  # matched in order
    default: RouteSpec
    source: str = "<memory>"
    sha256: str = ""
    declared: Mapping[str, ArmSpec] = field(default_factory=dict)  # `arms:`, by name
    health: HealthSpec = field(default_factory=HealthSpec)
    limits: RequestLimits = field(default_factory=RequestLimits)  # `limits:`, per-request compute caps

    def named(self, name: str) -> RouteSpec | None:
        return next((r for r in (*self.routes, self.default) if r.name == name), None)

    def choose(self, facts: RequestFacts) -> RouteSpec:
        return next((r for r in self.routes if r.match.matches(facts)), self.default)

    def arms(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for r in (*self.routes, self.default) for a in r.arms()))

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in (*self.routes, self.default))

    def aliases(self) -> tuple[str, ...]:
        """The local aliases the routes need served: undeclared arm names, and declared local arms' aliases."""
        named = [a for a in self.arms() if a not in self.declared]
        local = [spec.alias for spec in self.declared.values() if spec.alias]
        return tuple(dict.fromkeys((*named, *local)))


def bucket(key: str, salt: str = "") -> int:
    """A request key's place in 0..99: uniform, and the same on every server and every restart."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


def pick_arm(split: tuple[tuple[str, int], ...], place: int) -> str:
    """The arm whose share of the cumulative weights holds `place` (0..99); zero-weight arms get nothing."""
    edge = 0
    for arm, weight in split:
        edge += weight
        if place < edge:
            return arm
    raise ValueError(f"place {place} beyond the weights {split!r} (they must sum to 100)")


def load_serving_policy(path: str | Path | None = None) -> ServingPolicy:
    """Read and validate a serving policy file (default: the bundled `gates/serving.yaml`)."""
    path = Path(path) if path else SERVING_POLICY_PATH
    data, raw = read_yaml_file(path, ServingPolicyError, "serving policy")
    return replace(parse_serving_policy(data, source=str(path)), sha256=hashlib.sha256(raw).hexdigest())


def parse_serving_policy(data: Any, source: str = "<memory>") -> ServingPolicy:
    """Validate a serving policy given as plain data (what `yaml.safe_load` returns)."""
    if not isinstance(data, dict):
        raise ServingPolicyError(f"{source}: expected a mapping with 'routes' and 'default' at the top")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise ServingPolicyError(f"{source}: {unknown[0]}: unknown key; expected {', '.join(TOP_KEYS)}")
    if DEFAULT not in data:
        raise ServingPolicyError(f"{source}: default: missing; unmatched traffic needs a route")
    routes_data = data.get("routes") or {}
    if not isinstance(routes_data, dict):
        raise ServingPolicyError(f"{source}: routes: expected a mapping of route name to settings")
    routes = []
    for name, spec in routes_data.items():
        where = f"{source}: routes.{name}"
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise ServingPolicyError(f"{where}: a route name is letters, digits, - and _")
        if name in (AUTO, DEFAULT):
            raise ServingPolicyError(f"{where}: {name!r} is reserved (auto: route me; default: the last resort)")
        routes.append(_parse_route(name, spec, where, matched=True))
    default = _parse_route(DEFAULT, data[DEFAULT], f"{source}: {DEFAULT}", matched=False)
    declared = parse_arms(data.get("arms"), f"{source}: arms")
    clash = [a for a in declared if a in (AUTO, DEFAULT) or a in {r.name for r in routes}]
    if clash:
        raise ServingPolicyError(f"{source}: arms.{clash[0]}: an arm may not have a route's name (or auto, default)")
    health = parse_health(data.get("health"), f"{source}: health")
    limits = parse_request_limits(data.get("limits"), f"{source}: limits")
    ours = {k: v for k, v in data.items() if k != "rollout"}  # a rollout edit does not change the routes
    canonical = json.dumps(ours, sort_keys=True, default=str).encode()
    return ServingPolicy(
        tuple(routes), default, source, hashlib.sha256(canonical).hexdigest(), declared, health, limits
    )


def _parse_route(name: str, spec: Any, where: str, matched: bool) -> RouteSpec:
    if not isinstance(spec, dict):
        raise ServingPolicyError(f"{where}: expected a mapping of settings, got {type(spec).__name__}")
    allowed = {"match", "arm", "split", "fallback", "shadow"} - (set() if matched else {"match"})
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ServingPolicyError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(sorted(allowed))}")
    match = _parse_match(spec.get("match"), f"{where}.match") if matched else None
    if ("arm" in spec) == ("split" in spec):
        raise ServingPolicyError(f"{where}: expected exactly one of arm (one alias) or split (aliases to weights)")
    fallback = spec.get("fallback")
    if fallback is not None and (not isinstance(fallback, str) or not fallback):
        raise ServingPolicyError(f"{where}.fallback: expected an arm name, got {fallback!r}")
    shadow = _parse_shadow(spec["shadow"], f"{where}.shadow") if "shadow" in spec else None
    if "arm" in spec:
        if not isinstance(spec["arm"], str) or not spec["arm"]:
            raise ServingPolicyError(f"{where}.arm: expected an alias name, got {spec['arm']!r}")
        return RouteSpec(name, match, ((spec["arm"], 100),), fallback, shadow)
    return RouteSpec(name, match, parse_split(spec["split"], f"{where}.split"), fallback, shadow)


def _parse_shadow(value: Any, where: str) -> ShadowSpec:
    if not isinstance(value, dict) or not isinstance(value.get("arm"), str) or not value["arm"]:
        raise ServingPolicyError(f"{where}: expected {{arm: <arm>, share: <0..100>}}, got {value!r}")
    unknown = sorted(set(value) - {"arm", "share"})
    if unknown:
        raise ServingPolicyError(f"{where}.{unknown[0]}: unknown key; expected arm, share")
    share = value.get("share", 100)
    if not _is_int(share) or not 0 <= share <= 100:
        raise ServingPolicyError(f"{where}.share: expected an integer percent in 0..100, got {share!r}")
    return ShadowSpec(value["arm"], share)


def _parse_match(value: Any, where: str) -> Matcher:
    if not isinstance(value, dict) or len(value) != 1:
        raise ServingPolicyError(
            f"{where}: expected one matcher, {{KIND: SETTINGS}} with KIND one of {', '.join(MATCHERS)}, got {value!r}"
        )
    ((kind, settings),) = value.items()
    if kind not in MATCHERS:
        raise ServingPolicyError(f"{where}.{kind}: unknown matcher; expected one of {', '.join(MATCHERS)}")
    return MATCHERS[kind].parse(settings, f"{where}.{kind}")


def parse_split(value: Any, where: str) -> tuple[tuple[str, int], ...]:
    """Arms to integer weights 0..100 summing to 100, in their given order (the policy's and the overlay's)."""
    if not isinstance(value, dict) or not value:
        raise ServingPolicyError(f"{where}: expected a mapping of alias to weight (summing to 100), got {value!r}")
    for arm, weight in value.items():
        if not isinstance(arm, str) or not arm:
            raise ServingPolicyError(f"{where}: expected alias names as keys, got {arm!r}")
        if not _is_int(weight) or not 0 <= weight <= 100:
            raise ServingPolicyError(f"{where}.{arm}: expected an integer weight in 0..100, got {weight!r}")
    total = sum(value.values())
    if total != 100:
        raise ServingPolicyError(f"{where}: weights sum to {total}; they must sum to 100")
    return tuple(value.items())


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and math.isfinite(value)
