"""Reading and writing the live weights overlay file (`gates.weights` validates what is in it).

The rollout controller writes it (`flows.rollout_state`), `unmask serve --routes` follows it (`serving.routing`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from evals.store import write_json_atomic
from gates.serving_arms import ServingPolicyError
from gates.weights import Overlay, parse_overlay, weights_sha256


def write_weights(path: str | Path, routes: Mapping[str, Mapping[str, int]]) -> Path:
    """Write the overlay for `routes` ({route: {arm: weight}}) atomically; ServingPolicyError if a split is bad."""
    path = Path(path)
    plain = {route: dict(split) for route, split in routes.items()}
    parse_overlay({"routes": plain}, str(path))  # refuse what the server would refuse, before it is written
    write_json_atomic(path, {"routes": plain, "sha256": weights_sha256(plain)}, sort_keys=False)
    return path


def read_weights(path: str | Path) -> Overlay | None:
    """The overlay in `path`; None when there is no file. ServingPolicyError names the file and key otherwise."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ServingPolicyError(f"{path}: weights file unreadable ({e.strerror or e})") from None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServingPolicyError(f"{path}: not valid JSON ({e})") from None
    return parse_overlay(data, str(path))
