"""Routing `model: auto` requests by the serving policy (`gates/serving.yaml`), with weights changed live.

`RouteTable` holds the policy `unmask serve --routes FILE` was started with and re-reads the file when it
changes (`follow()`, every poll interval): a new version is validated first (its file, and that every
arm is served here); a bad edit keeps the old routes, is logged, and is counted in
`unmask_route_reload_failures`. `decide()` gives a request's route and arm: the route whose matcher
holds (or the one the `model` names), then, within a split, the arm its sticky key hashes to.

An arm is what answers a route's traffic (`serving/arms.py`): a served alias (`LocalArm`) or an arm the
policy declares under `arms:` (an `UpstreamArm`, or a local alias with drill faults). The table also
follows the live weights overlay (`gates/weights.py`, `<state>/rollouts/weights.json`), which replaces
the splits of the routes it names; a bad overlay keeps the weights in force and is counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request

from gates.serving_arms import ServingPolicyError
from gates.serving_policy import AUTO, FALLBACK, RequestFacts, RouteSpec, ServingPolicy, load_serving_policy
from gates.weights import Overlay, apply_overlay
from serving.arms import Arm, LocalArm, UpstreamArm, arm_of
from serving.weights_file import read_weights

log = logging.getLogger("unmask.serve")

__all__ = ["Arm", "Decision", "LocalArm", "RouteTable", "UpstreamArm", "facts_of", "request_key"]


@dataclass(frozen=True)
class Decision:
    route: str
    arm: Arm
    key_source: str  # which request key the split hashed: user, session, client (or "" without a split)
    fallback: Arm | None = None  # what answers when `arm` fails or is unhealthy; None: nothing (it is the fallback)
    shadow: Arm | None = None  # gets a copy of this request (the route's shadow share picked it)


def request_key(user: str | None, request: Request) -> tuple[str, str]:
    """(the sticky key, where it came from): the OpenAI `user`, else the `X-Session` header, else the client."""
    if user:
        return user, "user"
    session = request.headers.get("x-session")
    if session:
        return session, "session"
    return (request.client.host if request.client else "unknown"), "client"


def facts_of(
    request: Request, user: str | None, metadata: dict[str, str] | None, max_tokens: int | None
) -> RequestFacts:
    return RequestFacts(
        path=request.url.path,
        headers={k.lower(): v for k, v in request.headers.items()},
        user=user,
        metadata=dict(metadata or {}),
        max_tokens=max_tokens,
    )


class RouteTable:
    """The serving policy in force (its file, with the weights overlay applied), re-read when either changes."""

    def __init__(self, path: Path, served: list[str], metrics: Any, weights_path: Path | None = None):
        self.path, self.served, self.metrics = Path(path), list(served), metrics
        self.weights_path = Path(weights_path) if weights_path else None
        self.base = self._load()  # a bad file at start is the caller's error (the CLI exits 2)
        self._stamp = self._stat(self.path)
        self.last_error: str | None = None
        self.overlay: Overlay = {}
        self.weights_error: str | None = None
        self.weights_sha256: str | None = None
        self.policy = self.base
        self._weights_stamp: bytes | None = None
        self._refresh_weights()

    def arm(self, name: str) -> Arm:
        return arm_of(name, dict(self.policy.declared))

    def decide(self, model: str, facts: RequestFacts, key: str, key_source: str) -> Decision | None:
        """The route and arm of a request for `model`; None when it is not routed (it names an alias)."""
        policy = self.policy  # one read: a reload (in a worker thread) cannot hand this request two policies
        spec: RouteSpec | None = policy.choose(facts) if model == AUTO else policy.named(model)
        if spec is None:
            return None
        name, source = (spec.split[0][0], "") if len(spec.split) == 1 else (spec.pick(key), key_source)
        fallback = spec.fallback or (FALLBACK if FALLBACK in self.served else None)
        shadow = spec.shadow.arm if spec.shadow and spec.shadow.takes(key, spec.name) else None
        declared = dict(policy.declared)
        return Decision(
            spec.name,
            arm_of(name, declared),
            source,
            arm_of(fallback, declared) if fallback and fallback != name else None,
            arm_of(shadow, declared) if shadow and shadow != name else None,
        )

    def refresh(self) -> bool:
        """Re-read the routes file and the weights overlay if they changed; True when new routes took effect."""
        before = self.policy
        stamp = self._stat(self.path)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                base = self._load()
            except ServingPolicyError as e:
                self.last_error = str(e)
                self.metrics.route_reload_failures.inc()
                log.error("routes not reloaded, the old ones stay: %s", e)
            else:
                self.last_error = None  # the file is good again, even if it is back to the routes in force
                if base.sha256 != self.base.sha256:
                    self.base = base
                    self.metrics.route_reloads.inc()
                    log.info("routes reloaded from %s (%s)", self.path, base.sha256[:12])
                    self.policy = self._applied(self.overlay)
        self._refresh_weights()
        return self.policy != before

    def _refresh_weights(self) -> None:
        if self.weights_path is None:
            return
        stamp = self._stat(self.weights_path)
        if stamp == self._weights_stamp:
            return
        self._weights_stamp = stamp
        try:
            overlay = read_weights(self.weights_path) or {}
            policy = apply_overlay(self.base, overlay, self.known_arms(self.base), str(self.weights_path))
        except ServingPolicyError as e:
            self.weights_error = str(e)
            self.metrics.weights_reload_failures.inc()
            log.error("weights overlay not applied, the weights in force stay: %s", e)
            return
        self.weights_error = None
        if overlay != self.overlay:
            self.metrics.weights_reloads.inc()
            log.info(
                "weights overlay from %s: %s",
                self.weights_path,
                "; ".join(f"{r} {dict(s)}" for r, s in overlay.items()) or "none (the policy's splits)",
            )
        self.overlay, self.policy = overlay, policy
        self.weights_sha256 = hashlib.sha256(stamp).hexdigest() if stamp else None  # of the file in force

    def _applied(self, overlay: Overlay) -> ServingPolicy:
        """The base with `overlay`; an overlay the new base cannot take is dropped (and said)."""
        try:
            return apply_overlay(self.base, overlay, self.known_arms(self.base), str(self.weights_path))
        except ServingPolicyError as e:
            self.weights_error = f"dropped after a routes reload: {e}"
            self.overlay = {}
            return self.base

    def known_arms(self, policy: ServingPolicy) -> set[str]:
        return set(self.served) | set(policy.declared)

    async def follow(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(self.refresh)

    def _load(self) -> ServingPolicy:
        policy = load_serving_policy(self.path)
        missing = [a for a in (*policy.aliases(), *policy.arms()) if a not in self.served and a not in policy.declared]
        if missing:
            raise ServingPolicyError(
                f"{self.path}: arm {missing[0]!r} is not served here; served: {', '.join(self.served)}"
            )
        clash = [n for n in policy.names() if n in self.served]
        if clash:
            raise ServingPolicyError(f"{self.path}: route {clash[0]!r} has the name of a served alias; rename it")
        for name, spec in policy.declared.items():
            if spec.api_key_env and not os.environ.get(spec.api_key_env):
                raise ServingPolicyError(f"{self.path}: arms.{name}.api_key_env: ${spec.api_key_env} is not set")
        return policy

    @staticmethod
    def _stat(path: Path) -> bytes | None:
        """The file's bytes (a few hundred): a same-size edit within one mtime tick still counts as a change."""
        try:
            return path.read_bytes()
        except OSError:
            return None
