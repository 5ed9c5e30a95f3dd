"""The canary analysis for outside controllers (Argo Rollouts, Flagger, a KServe pipeline): one `APIRouter`.

`unmask serve` includes it; `unmask analysis serve` runs it alone beside a server's request log. Either way it
judges a route's recent requests (the request log, `<state>/serving/requests/`, and the probe log,
`<state>/serving/probes/`) with `gates.canary.analyse` under the `rollout:` policy of the routes file:

- `GET /v1/unmask/analysis?route=R[&candidate=ARM][&baseline=ARM][&window_s=S][&revision=REV]` answers 200 with
  `{"verdict": "pass"|"fail"|"inconclusive", "route", "candidate", "baseline", "revision", "window_s", "window":
  {"start", "end"}, "look", "confidence", "reason", "metrics": [{"name", "verdict", "value", "lower", "upper",
  "confidence", "n", "reason"}]}`: Argo Rollouts' web provider reads it with `jsonPath: "{$.verdict}"`,
  `successCondition: result == "pass"`, `failureCondition: result == "fail"` (anything else is
  Inconclusive there too). A bad query is a 4xx naming the parameter; so is a route or an arm the server does
  not know (404, 422).
- `POST /v1/unmask/analysis/flagger` takes Flagger's webhook body (`name`, `namespace`, `phase`, `checksum`,
  `metadata` with `route` and optionally `candidate`, `baseline`, `window_s`) and answers 200 on a pass, 412 on a
  fail or an inconclusive (Flagger counts a non-2xx rollout hook as a failed check and holds a confirm-promotion).
- `POST /v1/unmask/analysis/flagger/rollback` is the inverse for Flagger's `rollback` hook type (a 2xx there
  rolls the canary back): 200 on a fail only, 409 otherwise.

A call judges the route's last completed window of `window_s` (an epoch-aligned grid), at the look that window is
of its rollout (serving/looks.py: the rollout is the route, the arms and the revision the controller names, Argo's
pod-template hash or Flagger's checksum; looks are numbered in the evidence store every replica shares: the request
log's folder, or the team PostgreSQL named by `UNMASK_EVIDENCE_URL`, serving/evidence.py; one it cannot reach is a
503 naming its host, port and database).
Look k spends `look_alpha(1 - confidence, k)` (gates/sequential.py). So the verdict depends on the evidence and the
rollout's identity only: two replicas, a restart or repeated calls in one window give the same answer, and calls
spend the error budget by the windows judged, never by their number. Without `candidate`/`baseline` the route's
split in force names them (the smaller live weight is the candidate).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from evals.evidence_store import EvidenceError, EvidenceStore
from gates.canary import Observation, analyse
from gates.rollout_policy import RolloutPolicy, RolloutPolicyError, load_rollout_policy
from gates.serving_policy import load_serving_policy
from gates.verdict import FAIL, PASS
from models.state import state_dir
from registry.clock import SYSTEM_CLOCK, Clock
from registry.store import ALIASES
from serving.access import Access
from serving.evidence import open_evidence
from serving.looks import LooksError, look_of

router = APIRouter(tags=["analysis"])
DEFAULT_WINDOW_S = 60.0


@dataclass
class AnalysisSource:
    """Where the analysis reads: the routes file (its `rollout:` policy and splits) and the evidence (request rows,
    probe results, and each rollout's look numbers for every replica): the team PostgreSQL at `evidence_url`, else
    the request log's folder; `clock` says when it is."""

    routes_path: Path | None = None
    log_dir: Path | None = None
    clock: Clock = SYSTEM_CLOCK
    evidence_url: str | None = None

    @property
    def requests(self) -> Path:
        return self.log_dir or state_dir() / "serving" / "requests"

    @cached_property
    def evidence(self) -> EvidenceStore:
        return open_evidence(self.evidence_url or self.requests)


class AnalysisRefused(ValueError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _source(request: Request) -> AnalysisSource:
    """The app's source: set by `unmask analysis serve`, else made once from `unmask serve`'s own state."""
    state = request.app.state
    source = getattr(state, "analysis_source", None)
    if source is None:
        routes = getattr(state, "routes", None)
        log = getattr(state, "request_log", None)
        source = AnalysisSource(
            Path(routes.path) if routes is not None else None,
            Path(log.folder) if log is not None else None,
            evidence_url=getattr(state, "evidence_url", None),
        )
        state.analysis_source = source
    return source


def _policy(source: AnalysisSource) -> RolloutPolicy:
    if source.routes_path is None:
        raise AnalysisRefused(
            404,
            "this server has no routes file, so no rollout analysis policy (start it with "
            "--routes FILE holding a `rollout:` key)",
        )
    try:
        return load_rollout_policy(source.routes_path)
    except RolloutPolicyError as e:
        raise AnalysisRefused(409, str(e)) from None


def _arms(request: Request, route: str, candidate: str | None, baseline: str | None) -> tuple[str, str]:
    """The candidate and baseline arms: as given, else the route's live split (the smaller weight is the canary).
    A route or an arm this server does not know is refused (a typo must be an error the controller shows, not an
    inconclusive that pauses the rollout)."""
    routes = getattr(request.app.state, "routes", None)
    path = _source(request).routes_path
    policy = routes.policy if routes is not None else (load_serving_policy(path) if path else None)
    spec = policy.named(route) if policy is not None else None
    if policy is not None and spec is None:
        raise AnalysisRefused(404, f"route {route!r}: no such route in {path}; routes: {', '.join(policy.names())}")
    if policy is not None:
        known = {*policy.arms(), *policy.declared, *ALIASES}
        for what, arm in (("candidate", candidate), ("baseline", baseline)):
            if arm and arm not in known:
                raise AnalysisRefused(
                    422, f"{what}={arm!r}: no such arm on this server; arms: {', '.join(sorted(known))}"
                )
    if candidate and baseline:
        return candidate, baseline
    live = [(arm, w) for arm, w in (spec.split if spec else ()) if w > 0 or arm in (candidate, baseline)]
    if len(live) < 2 and not (candidate or baseline):
        raise AnalysisRefused(
            422,
            f"route {route!r}: give candidate=ARM and baseline=ARM (the route's split in "
            f"force names {len(live)} live arm(s), not a canary and its baseline)",
        )
    ordered = [arm for arm, _ in sorted(live, key=lambda aw: aw[1])]
    candidate = candidate or next((a for a in ordered if a != baseline), None)
    baseline = baseline or next((a for a in reversed(ordered) if a != candidate), None)
    if not candidate or not baseline:
        raise AnalysisRefused(422, f"route {route!r}: give both candidate=ARM and baseline=ARM")
    return candidate, baseline


def judge_route(
    request: Request,
    route: str,
    candidate: str | None,
    baseline: str | None,
    window_s: float | None,
    revision: str | None = None,
) -> dict[str, Any]:
    """The analysis of `route`'s last completed `window_s` window (serving/looks.py) as the endpoint's JSON body."""
    source = _source(request)
    policy = _policy(source)
    if not route:
        raise AnalysisRefused(422, "route: required, e.g. ?route=default")
    if window_s is None:
        window_s = policy.interval_s or DEFAULT_WINDOW_S
    candidate, baseline = _arms(request, route, candidate, baseline)
    if candidate == baseline:
        raise AnalysisRefused(422, f"candidate and baseline are both {candidate!r}")
    identity = (route, candidate, baseline, revision or "", float(window_s))
    try:
        # the last completed window whose rows every replica has written (on PostgreSQL, `settle_s` after its end)
        look = look_of(source.evidence, identity, source.clock.now() - timedelta(seconds=source.evidence.settle_s))
        rows = [r for r in source.evidence.read_requests(look.start, look.end) if r.get("route") == route]
        probed = source.evidence.read_probes(route, look.start, look.end)
    except LooksError as e:
        raise AnalysisRefused(409, str(e)) from None
    except EvidenceError as e:  # the store is down or refuses: an Error the controller shows, named
        raise AnalysisRefused(503, str(e)) from None
    observations = [Observation.from_row(r) for r in rows] + [Observation.from_probe(p) for p in probed]
    result = analyse(observations, candidate, baseline, policy, look=look.number)
    return {
        "verdict": result.verdict,
        "route": route,
        "candidate": candidate,
        "baseline": baseline,
        "revision": revision or None,
        "window_s": window_s,
        "window": {"start": look.start.isoformat(), "end": look.end.isoformat()},
        "look": look.number,
        "confidence": result.confidence,
        "reason": result.reason,
        "arms": result.arms,
        "metrics": [
            {
                "name": m.metric,
                "verdict": m.verdict,
                "value": m.value,
                "lower": m.interval[0] if m.interval else None,
                "upper": m.interval[1] if m.interval else None,
                "confidence": m.confidence,
                "n": m.n,
                "reason": m.reason,
            }
            for m in result.metrics
        ],
    }


def _refused(e: AnalysisRefused) -> JSONResponse:
    return JSONResponse({"error": {"message": str(e), "type": "invalid_request_error"}}, status_code=e.status)


@router.get("/v1/unmask/analysis")
def analysis(
    request: Request,
    route: str = Query(..., min_length=1, max_length=200),
    candidate: str | None = Query(None, min_length=1, max_length=200),
    baseline: str | None = Query(None, min_length=1, max_length=200),
    window_s: float | None = Query(None, ge=1, le=86_400),
    revision: str | None = Query(None, min_length=1, max_length=200),
) -> JSONResponse:
    """The three-valued analysis of a route's recent traffic (Argo Rollouts' web metric provider reads it)."""
    try:
        return JSONResponse(judge_route(request, route, candidate, baseline, window_s, revision))
    except AnalysisRefused as e:
        return _refused(e)


class FlaggerWebhook(BaseModel):
    """Flagger's webhook payload (CanaryWebhookPayload): the canary, its phase, the hook's metadata strings."""

    name: str = Field(..., max_length=253)
    namespace: str = Field(..., max_length=253)
    phase: str = Field("", max_length=64)
    checksum: str | None = Field(None, max_length=200)
    metadata: dict[str, str] = Field(default_factory=dict)


def _flagger(request: Request, hook: FlaggerWebhook) -> dict[str, Any]:
    meta = hook.metadata
    if not meta.get("route"):
        raise AnalysisRefused(
            422,
            f"canary {hook.namespace}/{hook.name}: metadata.route: required (the unmask "
            "route this canary's traffic goes through)",
        )
    window = meta.get("window_s")
    try:
        window_s = float(window) if window else None
    except ValueError:
        raise AnalysisRefused(422, f"metadata.window_s: expected seconds, got {window!r}") from None
    if window_s is not None and not 1 <= window_s <= 86_400:
        raise AnalysisRefused(422, f"metadata.window_s: expected seconds in [1, 86400], got {window!r}")
    # the canary's checksum (its revision) is the rollout's identity: a new revision starts again at look 1
    revision = meta.get("revision") or hook.checksum
    body = judge_route(request, meta["route"], meta.get("candidate"), meta.get("baseline"), window_s, revision)
    return body | {"canary": f"{hook.namespace}/{hook.name}", "phase": hook.phase}


@router.post("/v1/unmask/analysis/flagger")
def flagger_gate(request: Request, hook: FlaggerWebhook) -> JSONResponse:
    """Flagger rollout / confirm-promotion hook: 200 on a pass, 412 on a fail or an inconclusive."""
    try:
        body = _flagger(request, hook)
    except AnalysisRefused as e:
        return _refused(e)
    return JSONResponse(body, status_code=200 if body["verdict"] == PASS else 412)


@router.post("/v1/unmask/analysis/flagger/rollback")
def flagger_rollback(request: Request, hook: FlaggerWebhook) -> JSONResponse:
    """Flagger rollback hook (a 2xx rolls the canary back): 200 on a fail only, 409 otherwise."""
    try:
        body = _flagger(request, hook)
    except AnalysisRefused as e:
        return _refused(e)
    return JSONResponse(body, status_code=200 if body["verdict"] == FAIL else 409)


def standalone_app(
    routes_path: Path,
    log_dir: Path | None = None,
    keys: frozenset[str] = frozenset(),
    analysis_keys: frozenset[str] = frozenset(),
    clock: Clock = SYSTEM_CLOCK,
    evidence_url: str | None = None,
) -> FastAPI:
    """`unmask analysis serve`: the router alone, reading a server's routes file and its evidence (the request log's
    folder, or the team PostgreSQL at `evidence_url`); behind the same keys as `unmask serve` (an API key, or a
    controller's analysis key) when any is set."""
    app = FastAPI(title="unmask analysis", version="1")
    app.state.analysis_source = AnalysisSource(
        Path(routes_path), Path(log_dir) if log_dir else None, clock, evidence_url
    )
    app.include_router(router)
    app.add_middleware(Access, keys=keys, count=lambda *_: None, analysis_keys=analysis_keys)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ready", "routes": str(routes_path)}

    return app
