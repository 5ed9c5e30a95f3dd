"""Serving policy: the routes `unmask serve --routes` sends traffic by, and each route's sticky traffic split.

`load_serving_policy()` reads `gates/serving.yaml` (or any file) into frozen dataclasses and refuses a
malformed one with a `ServingPolicyError` that names the file and the key (`routes.long.match.header`).

A route has a name, a matcher (one of `MATCHERS`: by request path, header, the OpenAI `user` field or a
`metadata` tag, or request shape) and either the alias (arm) that serves it or a `split` of arms to
weights summing to 100. Routes are tried in file order; unmatched traffic goes to `default`. Within a
split the arm is picked by hashing a request key into 0..99 (`bucket`), so one user always sees one arm.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping, Protocol

from checklists.yaml_file import read_yaml_file

SERVING_POLICY_PATH = Path(__file__).resolve().parent / "serving.yaml"
AUTO = "auto"  # the `model` a client sends to be routed
DEFAULT = "default"


class ServingPolicyError(ValueError):
    """A serving policy that cannot be used; the message names the file and key."""


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
    def parse(cls, value: Any, where: str) -> "Matcher": ...

    def matches(self, facts: RequestFacts) -> bool: ...

    def describe(self) -> str: ...


PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class PathMatcher:
    """`path: /v1/chat/completions`: requests to that endpoint."""

    kind: ClassVar[str] = "path"
    path: str

    @classmethod
    def parse(cls, value: Any, where: str) -> "PathMatcher":
        if value not in PATHS:
            raise ServingPolicyError(f"{where}: expected one of {', '.join(PATHS)}, got {value!r}")
        return cls(value)

    def matches(self, facts: RequestFacts) -> bool:
        return facts.path == self.path

    def describe(self) -> str:
        return f"path {self.path}"


def _name_value(value: Any, where: str, what: str) -> tuple[str, str]:
    if not isinstance(value, dict) or set(value) != {"name", "value"} or not all(
            isinstance(value[k], str) and value[k] for k in ("name", "value")):
        raise ServingPolicyError(f"{where}: expected {{name: <{what}>, value: <str>}}, got {value!r}")
    return value["name"], value["value"]


@dataclass(frozen=True)
class HeaderMatcher:
    """`header: {name: X-Route, value: latency}`: a request header with that value (name case-insensitive)."""

    kind: ClassVar[str] = "header"
    name: str
    value: str

    @classmethod
    def parse(cls, value: Any, where: str) -> "HeaderMatcher":
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
    def parse(cls, value: Any, where: str) -> "UserMatcher":
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
    def parse(cls, value: Any, where: str) -> "MetadataMatcher":
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
    def parse(cls, value: Any, where: str) -> "MaxTokensAboveMatcher":
        if not _is_int(value) or value < 0:
            raise ServingPolicyError(f"{where}: expected a non-negative integer, got {value!r}")
        return cls(value)

    def matches(self, facts: RequestFacts) -> bool:
        return facts.max_tokens is not None and facts.max_tokens > self.bound

    def describe(self) -> str:
        return f"max_tokens > {self.bound}"


MATCHERS: dict[str, type] = {m.kind: m for m in (
    PathMatcher, HeaderMatcher, UserMatcher, MetadataMatcher, MaxTokensAboveMatcher)}


@dataclass(frozen=True)
class RouteSpec:
    """One route: what it matches (None for `default`) and the arms that serve it, with weights summing to 100."""

    name: str
    match: Any  # a Matcher, or None for the default route
    split: tuple[tuple[str, int], ...]  # (arm, weight) in file order; one arm at 100 for a plain `arm:`

    def arms(self) -> tuple[str, ...]:
        return tuple(arm for arm, _ in self.split)

    def pick(self, key: str) -> str:
        """The arm for a request key: sticky (the same key, the same arm while the weights stay)."""
        return pick_arm(self.split, bucket(key, self.name))


@dataclass(frozen=True)
class ServingPolicy:
    routes: tuple[RouteSpec, ...]  # matched in order
    default: RouteSpec
    source: str = "<memory>"
    sha256: str = ""

    def named(self, name: str) -> RouteSpec | None:
        return next((r for r in (*self.routes, self.default) if r.name == name), None)

    def choose(self, facts: RequestFacts) -> RouteSpec:
        return next((r for r in self.routes if r.match.matches(facts)), self.default)

    def arms(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for r in (*self.routes, self.default) for a in r.arms()))

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in (*self.routes, self.default))


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
    unknown = sorted(set(data) - {"routes", DEFAULT, "rollout"})  # rollout: gates/rollout_policy.py reads it
    if unknown:
        raise ServingPolicyError(f"{source}: {unknown[0]}: unknown key; expected routes, default, rollout")
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
    canonical = json.dumps(data, sort_keys=True, default=str).encode()
    return ServingPolicy(tuple(routes), default, source, hashlib.sha256(canonical).hexdigest())


def _parse_route(name: str, spec: Any, where: str, matched: bool) -> RouteSpec:
    if not isinstance(spec, dict):
        raise ServingPolicyError(f"{where}: expected a mapping of settings, got {type(spec).__name__}")
    allowed = {"match", "arm", "split"} if matched else {"arm", "split"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ServingPolicyError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(sorted(allowed))}")
    match = _parse_match(spec.get("match"), f"{where}.match") if matched else None
    if ("arm" in spec) == ("split" in spec):
        raise ServingPolicyError(f"{where}: expected exactly one of arm (one alias) or split (aliases to weights)")
    if "arm" in spec:
        if not isinstance(spec["arm"], str) or not spec["arm"]:
            raise ServingPolicyError(f"{where}.arm: expected an alias name, got {spec['arm']!r}")
        return RouteSpec(name, match, ((spec["arm"], 100),))
    return RouteSpec(name, match, _parse_split(spec["split"], f"{where}.split"))


def _parse_match(value: Any, where: str) -> Any:
    if not isinstance(value, dict) or len(value) != 1:
        raise ServingPolicyError(f"{where}: expected one matcher, {{KIND: SETTINGS}} with KIND one of "
                                 f"{', '.join(MATCHERS)}, got {value!r}")
    (kind, settings), = value.items()
    if kind not in MATCHERS:
        raise ServingPolicyError(f"{where}.{kind}: unknown matcher; expected one of {', '.join(MATCHERS)}")
    return MATCHERS[kind].parse(settings, f"{where}.{kind}")


def _parse_split(value: Any, where: str) -> tuple[tuple[str, int], ...]:
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
