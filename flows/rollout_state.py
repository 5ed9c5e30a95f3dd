"""What a rollout keeps on disk: its state file, the live weights overlay the server follows, and the request
log it reads. All under <state folder>/ (models.state.state_dir).

- `<state>/rollouts/<id>.json`: the controller's state (`RolloutState`), rewritten atomically (temporary file,
  then rename) after every change, so a controller killed at any point resumes from a whole file.
- `<state>/rollouts/weights.json`: `{"routes": {"<route>": {"<arm>": <weight>, ...}}}` (weights sum to 100);
  `unmask serve` uses a route's entry instead of the route's split while it is there (gates/weights.py writes it,
  atomically, with its sha256).
- `<state>/serving/requests/`: the request log (serving/request_log.py) and the probe log, read through `evidence()`
  (serving/evidence.py), which is the team PostgreSQL instead when `UNMASK_EVIDENCE_URL` names one.
"""

from __future__ import annotations

import json
from contextlib import closing
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from evals.evidence_store import EvidenceStore
from evals.store import write_json_atomic
from gates.weights import WEIGHTS_FILE
from models.state import check_token, state_dir
from registry.store import now_iso
from serving.evidence import evidence_location, open_evidence
from serving.weights_file import read_weights as read_overlay
from serving.weights_file import write_weights

ACTIVE = ("running", "paused")


def rollouts_dir() -> Path:
    folder = state_dir() / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def requests_dir() -> Path:
    return state_dir() / "serving" / "requests"


# the weights overlay ------------------------------------------------------------------------------------
def weights_path() -> Path:
    return state_dir() / WEIGHTS_FILE


def read_weights() -> dict[str, dict[str, int]]:
    """The overlay's routes as {route: {arm: weight}} ({} without a file)."""
    overlay = read_overlay(weights_path())
    return {route: dict(split) for route, split in (overlay or {}).items()}


def set_route_weights(route: str, weights: dict[str, int] | None) -> None:
    """Put `route`'s live weights in the overlay (None takes the route out: its split applies again)."""
    with FileLock(str(rollouts_dir() / "weights.json.lock"), timeout=30):  # two routes' controllers, one file
        routes = read_weights()
        if weights is None:
            routes.pop(route, None)
        else:
            routes[route] = dict(weights)
        write_weights(weights_path(), routes)


# the request log and the probes ------------------------------------------------------------------------
def evidence() -> EvidenceStore:
    """The canary evidence the servers write: `UNMASK_EVIDENCE_URL`'s PostgreSQL when set, else their state folder's
    request log (EvidenceError naming the variable when it is malformed)."""
    return open_evidence(evidence_location(requests_dir()))


def request_rows(folder: Path | None = None, since: str | None = None) -> list[dict[str, Any]]:
    """Request-log rows (dicts) of the server's log (`folder`, else `evidence()`), those logged at or after `since`
    (ISO time) when given."""
    with closing(open_evidence(folder) if folder else evidence()) as store:
        return store.read_requests(datetime.fromisoformat(since) if since else None)


# the state file -----------------------------------------------------------------------------------------
@dataclass
class RolloutState:
    """A rollout as its controller left it; `status` is running, paused, rolled_back, completed or aborted."""

    id: str
    model: str
    version: str
    route: str
    stage: str
    candidate: str  # arm: the alias of the stage before `stage`
    baseline: str  # arm: `stage`'s alias, or `fallback`
    steps: list[int]
    policy: dict[str, Any]  # RolloutPolicy.to_dict(), fixed at start: a resume judges by the same rules
    gates_policy: str = ""  # the stage policy file the promotion at 100% applies ("" = the bundled one)
    run_id: str = ""  # the rollout's MLflow run
    step_index: int = 0
    weight: int = 0
    status: str = "running"
    failures: int = 0
    reason: str = ""
    analyses: list[dict[str, Any]] = field(default_factory=list)  # {step, weight, verdict, reason, run_id, at}
    events: list[dict[str, Any]] = field(default_factory=list)  # {at, what, ...}
    server_url: str = ""  # the live server the preflight checked and the probes go to ("" : none given)

    def path(self) -> Path:
        return rollouts_dir() / f"{self.id}.json"

    def save(self) -> None:
        write_json_atomic(self.path(), asdict(self))

    def event(self, what: str, **details: Any) -> None:
        self.events.append({"at": now_iso(), "what": what, **details})
        self.save()

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def live_weight(self) -> int:
        """The candidate's share of the route's traffic now: its step's weight while the rollout runs or pauses,
        0 once it is rolled back or aborted (the weight went back to the baseline), 100 once promoted."""
        if self.status in ("rolled_back", "aborted"):
            return 0
        return 100 if self.status == "completed" else self.weight

    def lock(self) -> FileLock:
        """Held by the controller driving this rollout; released by the OS when that process dies."""
        return FileLock(str(rollouts_dir() / f"{self.id}.lock"), timeout=0)


class RolloutNotFound(LookupError):
    pass


def load_state(rollout_id: str) -> RolloutState:
    try:
        check_token(rollout_id, "rollout")
    except ValueError as e:
        raise RolloutNotFound(str(e)) from None
    path = rollouts_dir() / f"{rollout_id}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        known = ", ".join(s.id for s in all_states()) or "none"
        raise RolloutNotFound(
            f"rollout {rollout_id!r}: no such rollout under {rollouts_dir()} (known: {known})"
        ) from None
    except ValueError as e:
        raise RolloutNotFound(f"{path}: not a rollout state file ({e})") from None
    return RolloutState(**data)


def all_states() -> list[RolloutState]:
    states = []
    for path in sorted(rollouts_dir().glob("*.json")):
        if path.name == "weights.json":
            continue
        try:
            states.append(RolloutState(**json.loads(path.read_text())))
        except (ValueError, TypeError):
            continue  # not a state file of ours
    return sorted(states, key=lambda s: (s.events[0]["at"] if s.events else "", s.id))
