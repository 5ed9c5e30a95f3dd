"""The live weights overlay: the file a rollout controller writes and `unmask serve --routes` follows.

`<state folder>/rollouts/weights.json` (or `unmask serve --weights-file`) replaces the split of the
routes it names, without touching the serving policy file:

```json
{"routes": {"default": {"staging": 25, "production": 75}},
 "sha256": "<sha256 of the routes object as canonical JSON>"}
```

Weights are integers 0..100 summing to 100 per route, in the order given (the sticky hash walks the
cumulative weights in that order, so put the arm that grows first: raising it keeps the users it had).
`sha256` is optional; when present it must match `weights_sha256(routes)`, so a torn or hand-mangled
file is refused. Pure: the file is read and written by `serving.weights_file` (atomically).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gates.serving_policy import RouteSpec, ServingPolicy, ServingPolicyError, parse_split

WEIGHTS_FILE = Path("rollouts") / "weights.json"  # under the state folder (models.state.state_dir())

Overlay = dict[str, tuple[tuple[str, int], ...]]  # route -> (arm, weight) in order


def weights_sha256(routes: Mapping[str, Mapping[str, int]]) -> str:
    """The digest `write_weights` stores: sha256 of the routes object as sorted, compact JSON."""
    return hashlib.sha256(json.dumps(routes, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def parse_overlay(data: Any, source: str) -> Overlay:
    """Validate overlay data ({"routes": {route: {arm: weight}}, "sha256"?}) without knowing the policy."""
    if not isinstance(data, dict) or not isinstance(data.get("routes"), dict):
        raise ServingPolicyError(
            f'{source}: expected {{"routes": {{ROUTE: {{ARM: WEIGHT}}}}}}, got {type(data).__name__}'
        )
    unknown = sorted(set(data) - {"routes", "sha256"})
    if unknown:
        raise ServingPolicyError(f"{source}: {unknown[0]}: unknown key; expected routes, sha256")
    sha = data.get("sha256")
    if sha is not None and sha != weights_sha256(data["routes"]):
        raise ServingPolicyError(f"{source}: sha256: does not match the routes it sits beside (a torn or edited file)")
    return {route: parse_split(split, f"{source}: routes.{route}") for route, split in data["routes"].items()}


def apply_overlay(policy: ServingPolicy, overlay: Overlay, known_arms: set[str], source: str) -> ServingPolicy:
    """`policy` with the overlay's splits in place of its own; every route and arm must exist."""
    names = set(policy.names())
    for route, split in overlay.items():
        if route not in names:
            raise ServingPolicyError(f"{source}: routes.{route}: no such route; routes: {', '.join(policy.names())}")
        missing = [arm for arm, _ in split if arm not in known_arms]
        if missing:
            raise ServingPolicyError(
                f"{source}: routes.{route}.{missing[0]}: not an arm served or declared here; "
                f"arms: {', '.join(sorted(known_arms))}"
            )

    def moved(spec: RouteSpec) -> RouteSpec:
        return (
            RouteSpec(spec.name, spec.match, overlay[spec.name], spec.fallback, spec.shadow)
            if spec.name in overlay
            else spec
        )

    return ServingPolicy(
        tuple(moved(r) for r in policy.routes),
        moved(policy.default),
        policy.source,
        policy.sha256,
        policy.declared,
        policy.health,
    )
