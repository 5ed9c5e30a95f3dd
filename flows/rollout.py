"""The rollout controller: a Prefect flow that moves a route's traffic to a candidate in steps, judges each
step by a canary analysis of the live request log, and promotes, pauses or rolls back.

A rollout of model M to stage S on route R serves the **candidate arm** (the alias of the stage before S,
`staging` for production: the version that passed it) beside the **baseline arm** (S's alias, or
`fallback` when nobody holds S). Per step the controller writes the weights (candidate w, baseline 100-w)
into the overlay the server follows, waits `interval_s`, reads the interval's rows of route R, analyses
them (gates.canary), logs the analysis to MLflow (registry.rollouts) and decides (gates.rollout_policy):
pass: next step; at 100% the version is promoted to S through `registry.promotion.promote` (every rule
applies; the `canary` gate now has its evidence) and the overlay entry goes; fail: counted, at the
failure limit the candidate's weight goes to 0 first, then the rollback is audited (`rollout_rollback`);
inconclusive: the rollout pauses and the flow ends, naming `unmask rollout resume|abort`.

The state file (flows/rollout_state.py) is rewritten after every change and the controller holds the
rollout's lock file while it drives it, so a killed controller leaves a whole state and a free lock, and
`resume` continues at the recorded step (an interrupted promotion settled by `recover()` first).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from filelock import Timeout
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from evals.evidence_store import EvidenceError
from flows.evaluate import slug
from flows.rollout_preflight import preflight_problems
from flows.rollout_probes import probes_for
from flows.rollout_state import (
    RolloutState,
    all_states,
    evidence,
    load_state,
    rollouts_dir,
    set_route_weights,
)
from gates import load_policy
from gates.canary import Observation, analyse
from gates.promotion import ReasonKind
from gates.rollout_policy import ADVANCE, COMPLETE, PAUSE, REPEAT, RolloutPolicy, decide_step, load_rollout_policy
from gates.serving_policy import load_serving_policy
from gates.stages import previous_stage
from registry import Registry, audit_events, judge, promote, recover, stage_holder
from registry.approvals import approvals_of, close, duties_for, open_request
from registry.clock import SYSTEM_CLOCK, Clock
from registry.connection import resolve_tracking_uri
from registry.identity import actor_for
from registry.promotion import PromotionRefused
from registry.rollouts import log_analysis, set_rollout_status, set_rollout_weight, start_rollout_run
from registry.serving import holder as alias_holder
from registry.store import FALLBACK_ALIAS, model_tag
from serving.evidence import checked_evidence_url

ROLLOUT_FLOW = "rollout"
FLUSH_GRACE_S = 2.5  # the request log flushes every 2 s: rows of an interval's last moments land this late
CLOCK: Clock = SYSTEM_CLOCK  # what the controller's intervals and waits read (a test hands in a SimulatedClock)


class RolloutRefused(RuntimeError):
    """A rollout that may not start, resume or abort; `reasons` as users read them."""

    def __init__(self, action: str, reasons: list[str]):
        self.reasons = list(reasons)
        super().__init__(f"{action} refused: " + "; ".join(self.reasons))


def canary_gates(policy: Any, stage: str) -> set[str]:
    return {g.name for g in policy.stage(stage).gates if g.kind == "canary"}


def start_problems(decision: Any, canary: set[str]) -> list[str]:
    """The reasons a promotion decision gives, less those of the `canary` gates and an earlier failed rollout
    (what a new rollout settles; the approvals it needs anew still count)."""
    return [r.text for r in decision.reasons if r.kind != ReasonKind.ROLLOUT and r.gate not in canary]


# starting -----------------------------------------------------------------------------------------------
def plan_rollout(
    model: str,
    route: str,
    stage: str,
    routes_path: str | Path,
    gates_policy: str | None = None,
    tracking_uri: str | None = None,
    server_url: str | None = None,
) -> RolloutState:
    """Check that `model` may be rolled out to `stage` on `route` and record the rollout (state, MLflow, audit);
    RolloutRefused with every reason otherwise. Nothing is served differently until the flow runs. With
    `server_url` the live server must serve both arms (route, aliases, versions, weights) first, and the
    policy's probes are sent there."""
    action = f"rollout of {model} to {stage} on route {route}"
    serving = load_serving_policy(routes_path)
    rollout_policy = load_rollout_policy(routes_path)
    if serving.named(route) is None:
        raise RolloutRefused(action, [f"{routes_path}: no route {route!r}; routes: {', '.join(serving.names())}"])
    try:
        checked_evidence_url()  # UNMASK_EVIDENCE_URL, when set, reached now rather than at the first analysis
    except EvidenceError as e:
        raise RolloutRefused(action, [str(e)]) from None
    candidate = previous_stage(stage)
    if candidate is None:
        raise RolloutRefused(action, [f"stage {stage!r} has no stage before it whose version could be the candidate"])
    registry = Registry(tracking_uri)
    version = registry.aliases_of(model).get(candidate)
    if not version:
        raise RolloutRefused(action, [f"{model} holds no `{candidate}` version: promote it to {candidate} first"])
    busy = [s for s in all_states() if s.active and s.route == route]
    if busy:
        raise RolloutRefused(
            action,
            [
                f"rollout {busy[0].id} of {busy[0].model} v{busy[0].version} is {busy[0].status} "
                f"on route {route}; one rollout per route (unmask rollout abort {busy[0].id})"
            ],
        )
    holder = stage_holder(registry, stage)
    if holder == (model, version):
        raise RolloutRefused(action, [f"{model} v{version} already holds {stage}"])
    policy = load_policy(gates_policy)
    actor = actor_for(registry.tracking_uri, None)
    # judged as the promotion at 100% will be: with the open request, and whoever starts the rollout as its mover
    duties = duties_for(registry, model, version, stage, open_request(registry, model, version, stage), actor)
    decision = judge(registry, model, version, stage, policy, record=False, duties=duties)
    problems = start_problems(decision, canary_gates(policy, stage))
    if problems:
        raise RolloutRefused(action, problems)
    baseline = stage if holder else FALLBACK_ALIAS
    if server_url:
        problems = preflight_problems(server_url, route, _expected_arms(registry, model, version, candidate, baseline))
        if problems:
            raise RolloutRefused(action, problems)
    if rollout_policy.probes and not server_url:
        raise RolloutRefused(
            action, [f"{routes_path}: rollout.probes needs the server's URL to send them to (--server URL)"]
        )
    rollout_id = f"{slug(route)}-{uuid.uuid4().hex[:8]}"
    run_id = start_rollout_run(
        registry, rollout_id, model, version, route, stage, candidate, baseline, rollout_policy.to_dict()
    )
    state = RolloutState(
        rollout_id,
        model,
        version,
        route,
        stage,
        candidate,
        baseline,
        list(rollout_policy.steps),
        rollout_policy.to_dict(),
        gates_policy=str(Path(gates_policy).resolve()) if gates_policy else "",
        run_id=run_id,
        server_url=server_url or "",
    )
    state.event("started", by=actor.name, baseline_holder="@".join(holder) if holder else "")
    audit_events.record_rollout_start(
        registry,
        actor,
        stage,
        model,
        version,
        rollout_id,
        route,
        candidate,
        baseline,
        rollout_policy.steps,
        rollout_policy.to_dict(),
        run_id,
    )
    return state


def _expected_arms(
    registry: Any, model: str, version: str, candidate: str, baseline: str
) -> dict[str, tuple[str, str, str]]:
    """What each arm must serve: the candidate the rollout's version, the baseline its alias's holder."""

    def weights(m: str, v: str) -> str:
        sha256: str = registry.version_tags(m, v).get(model_tag("weights_sha256"), "")
        return sha256

    expected = {candidate: (model, version, weights(model, version))}
    held = alias_holder(registry, baseline)
    if held:
        expected[baseline] = (*held, weights(*held))
    return expected


# the tasks ----------------------------------------------------------------------------------------------
@task(name="set-weights", cache_policy=NO_CACHE, persist_result=False)
def set_weights(rollout_id: str, weight: int) -> dict[str, int]:
    """Write the step's weights to the overlay the server follows (candidate `weight`, baseline the rest)."""
    state = load_state(rollout_id)
    weights = {state.candidate: weight, state.baseline: 100 - weight}
    set_route_weights(state.route, weights)
    state.weight = weight
    state.event("weights", weights=weights, step=state.step_index)
    return weights


@task(name="wait-interval", cache_policy=NO_CACHE, persist_result=False)
def wait_interval(rollout_id: str, seconds: float) -> None:
    """Let the step serve, the policy's probes mixed into its traffic; wakes early when an abort is asked for."""
    state = load_state(rollout_id)
    with probes_for(state):
        wait_unless(seconds, lambda: abort_requested(rollout_id), CLOCK)


def wait_unless(seconds: float, stop: Callable[[], bool], clock: Clock) -> None:
    """Wait `seconds` on `clock`, looking at `stop` at least every 0.2 s and returning as soon as it says so."""
    end = clock.monotonic() + seconds
    while clock.monotonic() < end and not stop():
        clock.sleep(min(0.2, max(0.0, end - clock.monotonic())))


@task(name="analyse-step", cache_policy=NO_CACHE, persist_result=False)
def analyse_step(rollout_id: str, since: str, until: str, tracking_uri: str) -> dict[str, Any]:
    """The canary analysis of the route's requests in [since, until), logged to MLflow and the state."""
    state = load_state(rollout_id)
    policy = RolloutPolicy.from_dict(state.policy)
    start, end = datetime.fromisoformat(since), datetime.fromisoformat(until)
    with closing(evidence()) as store:  # the servers' request rows and probe results (serving/evidence.py)
        rows = [r for r in store.read_requests(start, end) if r.get("route") == state.route]
        probed = store.read_probes(state.route, start, end + timedelta(seconds=FLUSH_GRACE_S))
    observations = [Observation.from_row(r) for r in rows] + [Observation.from_probe(p) for p in probed]
    analysis = analyse(
        observations, state.candidate, state.baseline, policy, look=len(state.analyses) + 1
    ).to_dict()  # every look of the rollout spends its budget
    registry = Registry(tracking_uri)
    run_id = log_analysis(registry, state.run_id, rollout_id, state.step_index, state.weight, analysis)
    audit_events.record_rollout_step(
        registry,
        actor_for(registry.tracking_uri, None),
        {"id": rollout_id, "stage": state.stage, "model": state.model, "version": state.version, "route": state.route},
        state.step_index,
        state.weight,
        analysis | {"run_id": run_id},
    )
    state.analyses.append(
        {
            "step": state.step_index,
            "weight": state.weight,
            "verdict": analysis["verdict"],
            "reason": analysis["reason"],
            "run_id": run_id,
            "since": since,
            "until": until,
            "arms": analysis["arms"],
            "look": analysis["look"],
            "confidence": analysis["confidence"],
            "metrics": [
                {k: m.get(k) for k in ("metric", "verdict", "value", "reason", "interval", "confidence", "n", "needed")}
                for m in analysis["metrics"]
            ],
        }
    )
    state.event("analysis", step=state.step_index, weight=state.weight, verdict=analysis["verdict"], run_id=run_id)
    create_markdown_artifact(
        _analysis_markdown(state, analysis),
        key=f"rollout-{slug(rollout_id)}",
        description=f"rollout {rollout_id}: step {state.step_index + 1} at {state.weight}%",
    )
    return analysis | {"run_id": run_id}


@task(name="promote-version", cache_policy=NO_CACHE, persist_result=False)
def promote_version(rollout_id: str, tracking_uri: str) -> dict[str, Any]:
    """At 100% and a pass: the version takes the stage through the promotion rules; the overlay entry goes."""
    state = load_state(rollout_id)
    move = promote(
        state.model,
        state.stage,
        version=state.version,
        registry=Registry(tracking_uri),
        policy=load_policy(state.gates_policy or None),
        comment=f"rollout {rollout_id} on route {state.route}: every step passed its canary analysis",
    )
    set_route_weights(state.route, None)  # the stage alias serves the route's split now
    moved: dict[str, Any] = move.to_dict()
    return moved


@task(name="roll-back", cache_policy=NO_CACHE, persist_result=False)
def roll_back(rollout_id: str, reason: str, tracking_uri: str, event: str = "rollout_rollback") -> dict[str, Any]:
    """Candidate weight to 0 first, then the audit entry with the analysis that led here; the stage alias never
    moved (it moves only at the end), so it stays on the last known good version."""
    state = load_state(rollout_id)
    set_route_weights(state.route, {state.candidate: 0, state.baseline: 100})
    registry = Registry(tracking_uri)
    actor = actor_for(registry.tracking_uri, None)
    holder = stage_holder(registry, state.stage)
    last = state.analyses[-1] if state.analyses else {}
    entry = audit_events.record_rollout_end(
        registry,
        event,
        actor,
        state.stage,
        state.model,
        state.version,
        rollout_id,
        state.route,
        reason,
        holder,
        state.run_id,
        state.step_index,
        state.weight,
        last,
    )
    status = "rolled_back" if event == "rollout_rollback" else "aborted"
    _finish(state, status, reason, tracking_uri, audit_run_id=entry.run_id)
    voided = void_approvals(registry, state, status, actor)
    return {"status": status, "audit_run_id": entry.run_id, "stage_holder": holder, "voided_approvals": voided}


def void_approvals(registry: Any, state: RolloutState, status: str, actor: Any) -> list[str]:
    """A failed or aborted rollout is a finding on the version: the open approvals of its stage are void (each
    audited as `approval_void`, citing the rollout), so a new rollout or promotion needs new ones."""
    voided = []
    for approval in approvals_of(registry, state.model, state.version, state.stage):
        if approval.status == "open":
            close(
                registry,
                state.model,
                state.version,
                approval,
                "void",
                actor,
                f"rollout {state.id} was {status}: approvals given before it no longer stand",
            )
            voided.append(approval.id)
    if voided:
        state.event("approvals_voided", approvals=voided)
    return voided


def _finish(state: RolloutState, status: str, reason: str, tracking_uri: str, **details: Any) -> None:
    state.status, state.reason = status, reason
    state.event(status, reason=reason, **details)
    set_rollout_status(Registry(tracking_uri), state.run_id, status, reason)


def _analysis_markdown(state: RolloutState, analysis: dict[str, Any]) -> str:
    lines = [
        f"# Rollout {state.id}: step {state.step_index + 1}/{len(state.steps)} at {state.weight}%",
        "",
        f"{state.model} v{state.version} ({state.candidate}) against {state.baseline} on route {state.route}: "
        f"**{analysis['verdict']}**: {analysis['reason']}",
        "",
        "| metric | verdict | value | reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m['metric']} | {m['verdict']} | {m['value']} | {m['reason']} |" for m in analysis["metrics"]]
    return "\n".join(lines) + "\n"


# aborting ---------------------------------------------------------------------------------------------
def _abort_marker(rollout_id: str) -> Path:
    return rollouts_dir() / f"{rollout_id}.abort"


def abort_requested(rollout_id: str) -> bool:
    return _abort_marker(rollout_id).exists()


# the flow -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    status: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"status": self.status, "message": self.message}


@flow(name=ROLLOUT_FLOW, flow_run_name="rollout {rollout_id}")
def rollout_flow(rollout_id: str, flush_grace_s: float = FLUSH_GRACE_S) -> dict[str, str]:
    """Drive a recorded rollout from its current step until it completes, rolls back, pauses or is aborted."""
    tracking_uri = resolve_tracking_uri()
    state = load_state(rollout_id)
    log = get_run_logger()
    try:
        lock = state.lock()
        lock.acquire()
    except Timeout:
        return Outcome("busy", f"rollout {rollout_id} is being driven by another controller").to_dict()
    try:
        policy = RolloutPolicy.from_dict(state.policy)
        with closing(evidence()) as store:
            settle_s = store.settle_s  # on PostgreSQL, how long after an interval every server's rows are in
        while True:
            state = load_state(rollout_id)
            if abort_requested(rollout_id) or state.status != "running":
                return Outcome(state.status, f"rollout {rollout_id} is {state.status}").to_dict()
            weight = state.steps[state.step_index]
            set_weights(rollout_id, weight)
            set_rollout_weight(Registry(tracking_uri), state.run_id, weight)
            since = CLOCK.now()
            wait_interval(rollout_id, policy.interval_s)
            if abort_requested(rollout_id):
                return Outcome("aborting", f"rollout {rollout_id}: abort asked for").to_dict()
            until = since + timedelta(seconds=policy.interval_s)
            CLOCK.sleep(flush_grace_s + settle_s)  # the interval's last rows reach the log
            analysis = analyse_step(rollout_id, since.isoformat(), until.isoformat(), tracking_uri)
            state = load_state(rollout_id)
            decision = decide_step(analysis["verdict"], state.step_index, state.failures, policy)
            state.failures = decision.failures
            state.save()
            log.info(
                "rollout %s step %d at %d%%: %s (%s) -> %s",
                rollout_id,
                state.step_index + 1,
                weight,
                analysis["verdict"],
                analysis["reason"],
                decision.action,
            )
            if decision.action == ADVANCE:
                state.step_index += 1
                state.event("advance", step=state.step_index)
            elif decision.action == REPEAT:
                state.event("repeat", step=state.step_index, reason=decision.reason)
            elif decision.action == PAUSE:
                message = (
                    f"rollout {rollout_id} paused at step {state.step_index + 1} ({weight}%): "
                    f"{analysis['reason']}; `unmask rollout resume {rollout_id}` continues, "
                    f"`unmask rollout abort {rollout_id}` rolls back"
                )
                _finish(state, "paused", analysis["reason"], tracking_uri)
                return Outcome("paused", message).to_dict()
            elif decision.action == COMPLETE:
                try:
                    move = promote_version(rollout_id, tracking_uri)
                except PromotionRefused as e:
                    message = (
                        f"rollout {rollout_id}: every step passed but the promotion was refused: "
                        f"{'; '.join(e.reasons)}; settle it, then `unmask rollout resume {rollout_id}`"
                    )
                    _finish(load_state(rollout_id), "paused", message, tracking_uri)
                    return Outcome("paused", message).to_dict()
                _finish(
                    load_state(rollout_id),
                    "completed",
                    decision.reason,
                    tracking_uri,
                    audit_run_id=move["audit_run_id"],
                )
                return Outcome(
                    "completed",
                    f"rollout {rollout_id} completed: {state.model} v{state.version} holds "
                    f"{state.stage} (audit run {move['audit_run_id']})",
                ).to_dict()
            else:
                result = roll_back(rollout_id, f"{decision.reason}: {analysis['reason']}", tracking_uri)
                holder = "@".join(result["stage_holder"]) if result["stage_holder"] else "nobody"
                return Outcome(
                    "rolled_back",
                    f"rollout {rollout_id} rolled back at {weight}%: {analysis['reason']}; "
                    f"{state.stage} stays with {holder}",
                ).to_dict()
    finally:
        lock.release()


# resume, abort, status ---------------------------------------------------------------------------------
def prepare_resume(rollout_id: str, tracking_uri: str | None = None) -> RolloutState:
    """Make a paused rollout, or one whose controller died, ready to run again at its recorded step."""
    state = load_state(rollout_id)
    action = f"resume of rollout {rollout_id}"
    if not state.active:
        raise RolloutRefused(action, [f"rollout {rollout_id} is {state.status}; only a running or paused one resumes"])
    lock = state.lock()
    try:
        lock.acquire()
    except Timeout:
        raise RolloutRefused(action, [f"a controller is driving rollout {rollout_id} now"]) from None
    try:
        registry = Registry(tracking_uri)
        settled = recover(registry, state.stage)  # a controller killed inside the promotion: settle that move
        if stage_holder(registry, state.stage) == (state.model, state.version):
            _finish(
                state,
                "completed",
                "the promotion had moved the alias before the controller stopped",
                registry.tracking_uri,
                recovered=settled,
            )
            set_route_weights(state.route, None)
            return state
        state.status, state.reason = "running", ""
        state.event("resumed", step=state.step_index, recovered=settled)

        set_rollout_status(registry, state.run_id, "running", f"resumed at step {state.step_index + 1}")
    finally:
        lock.release()
    return state


def abort_rollout(
    rollout_id: str, comment: str = "", tracking_uri: str | None = None, wait_s: float = 600.0
) -> dict[str, Any]:
    """Roll a running or paused rollout back: weight to 0 at once, audited (`rollout_abort`) by the identity."""
    state = load_state(rollout_id)
    if not state.active:
        raise RolloutRefused(f"abort of rollout {rollout_id}", [f"rollout {rollout_id} is {state.status}"])
    set_route_weights(state.route, {state.candidate: 0, state.baseline: 100})  # before waiting for anyone
    marker = _abort_marker(rollout_id)
    marker.write_text(comment or "aborted")
    lock = state.lock()
    lock.timeout = wait_s  # a controller in its interval sees the marker within a fraction of a second
    try:
        with lock:
            return roll_back.fn(
                rollout_id,
                f"aborted{': ' + comment if comment else ''}",
                resolve_tracking_uri(tracking_uri),
                event="rollout_abort",
            )
    except Timeout:
        raise RolloutRefused(
            f"abort of rollout {rollout_id}",
            [
                f"its controller did not stop within {wait_s:g} s; the candidate's weight is 0 already, run the abort "
                "again to record it"
            ],
        ) from None
    finally:
        marker.unlink(missing_ok=True)
