"""Routing `model: auto` requests by the serving policy (`gates/serving.yaml`), with weights changed live.

`RouteTable` holds the policy `unmask serve --routes FILE` was started with and re-reads the file when it
changes (`follow()`, every poll interval): a new version is validated first (its file, and that every
arm is served here); a bad edit keeps the old routes, is logged, and is counted in
`unmask_route_reload_failures`. `decide()` gives a request's route and arm: the route whose matcher
holds (or the one the `model` names), then, within a split, the arm its sticky key hashes to.

An arm is what answers a route's traffic. `LocalArm` is an alias served by this process's pool; an
upstream OpenAI-compatible endpoint is a later implementation of the same `Arm` protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fastapi import Request

from gates.serving_policy import (AUTO, RequestFacts, RouteSpec, ServingPolicy, ServingPolicyError, bucket,
                                  load_serving_policy, pick_arm)

log = logging.getLogger("unmask.serve")


class Arm(Protocol):
    """What serves a route's share of traffic; `kind` says where it runs."""

    name: str
    kind: str


@dataclass(frozen=True)
class LocalArm:
    """An alias (or registered model) served by this process's model pool."""

    name: str
    kind: str = "local"


@dataclass(frozen=True)
class Decision:
    route: str
    arm: Arm
    key_source: str  # which request key the split hashed: user, session, client (or "" without a split)


def request_key(user: str | None, request: Request) -> tuple[str, str]:
    """(the sticky key, where it came from): the OpenAI `user`, else the `X-Session` header, else the client."""
    if user:
        return user, "user"
    session = request.headers.get("x-session")
    if session:
        return session, "session"
    return (request.client.host if request.client else "unknown"), "client"


def facts_of(request: Request, user: str | None, metadata: dict[str, str] | None,
             max_tokens: int | None) -> RequestFacts:
    return RequestFacts(path=request.url.path, headers={k.lower(): v for k, v in request.headers.items()},
                        user=user, metadata=dict(metadata or {}), max_tokens=max_tokens)


class RouteTable:
    """The serving policy in force, re-read from its file when the file changes."""

    def __init__(self, path: Path, served: list[str], metrics: Any, weights_path: Path | None = None):
        from models.state import state_dir

        self.path, self.served, self.metrics = Path(path), list(served), metrics
        self.policy = self._load()  # a bad file at start is the caller's error (the CLI exits 2)
        self._stamp = self._stat()
        self.last_error: str | None = None
        # a rollout's live weights (flows/rollout_state.py), used instead of a route's split while present
        self.overlay_path = Path(weights_path or state_dir(create=False) / "rollouts" / "weights.json")
        self.overlay: dict[str, tuple[tuple[str, int], ...]] = {}
        self.refresh_overlay()

    def refresh_overlay(self) -> None:
        """Re-read the weights overlay; an entry that is not whole (weights summing to 100 over served arms) is
        ignored, and the route keeps its split."""
        try:
            routes = json.loads(self.overlay_path.read_text()).get("routes") or {}
        except (OSError, ValueError, AttributeError):
            self.overlay = {}
            return
        overlay = {}
        for route, weights in routes.items():
            split = tuple((str(a), w) for a, w in dict(weights).items()) if isinstance(weights, dict) else ()
            if (split and all(isinstance(w, int) and 0 <= w <= 100 and a in self.served for a, w in split)
                    and sum(w for _, w in split) == 100):
                overlay[route] = split
            else:
                log.error("weights overlay %s: route %s ignored (%r)", self.overlay_path, route, weights)
        self.overlay = overlay

    def decide(self, model: str, facts: RequestFacts, key: str, key_source: str) -> Decision | None:
        """The route and arm of a request for `model`; None when it is not routed (it names an alias)."""
        policy = self.policy  # one read: a reload (in a worker thread) cannot hand this request two policies
        spec: RouteSpec | None = policy.choose(facts) if model == AUTO else policy.named(model)
        if spec is None:
            return None
        live = self.overlay.get(spec.name)
        if live:
            return Decision(spec.name, LocalArm(pick_arm(live, bucket(key, spec.name))), key_source)
        if len(spec.split) == 1:
            return Decision(spec.name, LocalArm(spec.split[0][0]), "")
        return Decision(spec.name, LocalArm(spec.pick(key)), key_source)

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when new routes took effect."""
        self.refresh_overlay()
        stamp = self._stat()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            policy = self._load()
        except ServingPolicyError as e:
            self.last_error = str(e)
            self.metrics.route_reload_failures.inc()
            log.error("routes not reloaded, the old ones stay: %s", e)
            return False
        self.last_error = None  # the file is good again, even if it is back to the routes in force
        if policy.sha256 == self.policy.sha256:
            return False
        self.policy = policy
        self.metrics.route_reloads.inc()
        log.info("routes reloaded from %s (%s)", self.path, policy.sha256[:12])
        return True

    async def follow(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(self.refresh)

    def _load(self) -> ServingPolicy:
        policy = load_serving_policy(self.path)
        missing = [a for a in policy.arms() if a not in self.served]
        if missing:
            raise ServingPolicyError(f"{self.path}: arm {missing[0]!r} is not served here; served: "
                                     f"{', '.join(self.served)}")
        clash = [n for n in policy.names() if n in self.served]
        if clash:
            raise ServingPolicyError(f"{self.path}: route {clash[0]!r} has the name of a served alias; rename it")
        return policy

    def _stat(self) -> bytes | None:
        """The file's bytes (a few hundred): a same-size edit within one mtime tick still counts as a change."""
        try:
            return self.path.read_bytes()
        except OSError:
            return None
