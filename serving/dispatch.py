"""Which arm answers a routed request, and what happens when it fails: health, retry, faults, shadows, upstreams.

`Dispatch.answer()` takes a request the app has parsed: its route's arm answers unless that arm is
unhealthy (then the fallback does); an attempt that fails in a way the fallback may answer
(`ArmFailure`: raised, timed out, NaN logits, an upstream unreachable or 5xx) is answered by the
route's fallback, leaving both rows in the request log; drill faults strike around the attempt; the
route's shadow arm gets a copy in the background. A local arm is answered by this server's own models
(`LocalDecoder`, serving/local.py's `LocalServing`); an upstream arm is asked over httpx. Each try
travels as an `Attempt` (serving/attempt.py). An unrouted request is one local attempt with no retry; on a
server that is one arm of a route an outside controller splits (`--route`, `routed_as`), it is logged as that
route's arm, as if a router had sent it there, and `model: auto` or the route's name asks for that arm.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

import httpx
from fastapi import Response
from fastapi.responses import JSONResponse, StreamingResponse

from gates.serving_policy import AUTO
from serving import errors
from serving.access import request_id_of
from serving.arm_health import ArmHealth, FaultDrill
from serving.arms import Arm, ArmFailure, LocalArm, UpstreamArm, UpstreamRefused
from serving.attempt import Attempt
from serving.decoding import RequestError
from serving.drill_corrupt import corrupt_answer
from serving.metrics import ServingMetrics
from serving.outcome import Outcome
from serving.relay import ShadowCopies, answer_text, relay_stream, stamped, upstream_facts, upstream_payload
from serving.request_log import RequestLog
from serving.routing import Decision, RouteTable, facts_of, request_key

log = logging.getLogger("unmask.serve")


class LocalDecoder(Protocol):
    """This server's own models, as Dispatch asks them (serving.local.LocalServing)."""

    async def answer(self, arm: LocalArm, attempt: Attempt) -> tuple[Any, dict[str, Any] | None]:
        """(the answer body, or a StreamingResponse that records its own outcome; facts for the log).
        ArmFailure: a failure the fallback may answer; RequestError: the request's own fault."""


class Dispatch:
    """The arm-level half of answering: one per app."""

    def __init__(
        self,
        timeout_s: Callable[[], float],
        max_shadows: int,
        metrics: ServingMetrics,
        requests_log: RequestLog | None,
        routes: RouteTable | None,
        local: LocalDecoder,
        routed_as: tuple[str, str] | None = None,
    ):
        self.timeout_s = timeout_s  # the server's request timeout, read per request (it may change)
        self.metrics, self.requests_log, self.routes = metrics, requests_log, routes
        self.local = local
        # (route, arm) of every request, when an outside controller splits the route and this server is one arm
        self.routed_as = routed_as
        self.health = ArmHealth(lambda: routes.policy.health, metrics) if routes else None
        self.drill, self.shadows = FaultDrill(), ShadowCopies(max_shadows)
        self.client: httpx.AsyncClient | None = None  # one connection pool for every upstream arm

    async def start(self) -> None:
        self.client = httpx.AsyncClient(limits=httpx.Limits(max_connections=64))

    async def close(self) -> None:
        await self.shadows.close()
        if self.client:
            await self.client.aclose()

    @property
    def arm_health(self) -> ArmHealth:
        """The arms' health, which only a routed request (or the routes' view) reads."""
        assert self.health is not None, "only a server with --routes has arms (and their health)"
        return self.health

    def arm_names(self) -> list[str]:
        assert self.routes is not None, "only a server with --routes has arms"
        return sorted({*self.routes.policy.arms(), *self.routes.policy.declared, *self.arm_health.arms})

    def view(self) -> dict[str, Any]:
        """`/v1/unmask/routes`: the routes with their live weights (the overlay's where it names them), arms, health."""
        assert self.routes is not None, "the app answers 404 without --routes"
        routes, policy = self.routes, self.routes.policy
        listed = [
            {
                "name": spec.name,
                "match": spec.match.describe() if spec.match else None,
                "split": dict(spec.split),
                "weights_from": "overlay" if spec.name in routes.overlay else "policy",
                "fallback": spec.fallback,
                "shadow": {"arm": spec.shadow.arm, "share": spec.shadow.share} if spec.shadow else None,
            }
            for spec in (*policy.routes, policy.default)
        ]
        arms = {}
        for name in self.arm_names():
            arm = routes.arm(name)
            arms[name] = {
                "kind": arm.kind,
                "upstream": getattr(arm, "upstream", None),
                "alias": arm.served if isinstance(arm, LocalArm) else None,
                "timeout_s": arm.timeout_s,
                "faults": vars(arm.faults) if arm.faults else None,
                **self.arm_health.report(name),
            }
        return {
            "file": str(routes.path),
            "sha256": policy.sha256,
            "routes": listed,
            "arms": arms,
            "weights_file": str(routes.weights_path),
            "weights_sha256": routes.weights_sha256,
            "weights_error": routes.weights_error,
            "last_error": routes.last_error,
            "health": {"failures": policy.health.failures, "cooldown_s": policy.health.cooldown_s},
        }

    async def answer(self, asked: Attempt) -> Response:
        """The request's arm answers; if it fails, its route's fallback does (two log rows); a shadow gets a copy.

        `asked` is the request as parsed (request, endpoint, body, prompt_of, max_tokens); each arm tried gets
        its own copy with its outcome, routing and clock."""
        request, endpoint, body = asked.request, asked.endpoint, asked.body
        assert request is not None, "a client's request (only a shadow copy has none, and it is not answered here)"
        rid = request_id_of(request)
        decision = (
            self.routes.decide(
                body.model,
                facts_of(request, body.user, body.metadata, asked.max_tokens),
                *request_key(body.user, request),
            )
            if self.routes
            else None
        )
        arm, fallback = (decision.arm, decision.fallback) if decision else (self.unrouted(body.model), None)
        failed: ArmFailure | None = None
        attempts = (arm, fallback)
        first_arrival = 0.0  # the retry's outcome keeps the first attempt's arrival
        shadowed = decision if decision is not None and decision.shadow is not None else None  # a copy goes there
        if decision and fallback and not self.arm_health.admits(arm.name):
            # unhealthy: its traffic goes to the fallback until a probe succeeds. The split chose this arm, so the
            # log says it could not serve (a rollout's analysis counts that against it), then the fallback answers.
            failed = ArmFailure(
                503,
                "arm_unhealthy",
                f"{arm.name} is unhealthy "
                f"({self.arm_health.report(arm.name)['reason']}); the fallback {fallback.name} answers",
                "unhealthy",
            )
            skipped = Outcome(self.metrics, self.requests_log, endpoint, body.model, bool(body.stream), request_id=rid)
            skipped.routed(decision.route, arm.name)
            skipped.failed(failed.status, failed.code, failed.message, retried=True)
            skipped.close()
            first_arrival, attempts = skipped.arrived, (fallback, None)
        for current in attempts:
            if current is None:
                break
            outcome = Outcome(self.metrics, self.requests_log, endpoint, body.model, bool(body.stream), request_id=rid)
            if decision:
                outcome.routed(decision.route, current.name)
            elif self.routed_as:
                outcome.routed(*self.routed_as)
            if failed:
                outcome.retry_of(arm.name)
                outcome.arrived = first_arrival
            first_arrival, streaming = outcome.arrived, False
            then = (
                (lambda text: self.shadow(shadowed, asked, text)) if shadowed and body.stream else None
            )  # a stream's text is known at its end
            try:
                answered, facts, text = await self.attempt(
                    current,
                    replace(asked, outcome=outcome, retry_of=arm.name if failed else None, on_text=then),
                    decision,
                )
                if decision:
                    self.arm_health.succeeded(current.name)
                if failed:
                    assert decision is not None, "only a routed request has a fallback to retry on"
                    self.metrics.retries.labels(decision.route, arm.name, current.name).inc()
                if shadowed and not body.stream:
                    self.shadow(shadowed, asked, text)
                if isinstance(answered, StreamingResponse):
                    streaming = True  # the stream records its own outcome when it ends
                    return answered
                assert facts is not None, "a whole answer comes with its facts (only a stream records its own)"
                outcome.answered(facts)
                return JSONResponse(answered)
            except ArmFailure as e:
                if decision:
                    self.arm_health.failed(current.name, e.reason, e.message)
                last = current is fallback or fallback is None
                outcome.failed(e.status, e.code, e.message, retried=not last, decode_failure=e.decode_failure)
                then_says = "" if last or fallback is None else f"; the fallback {fallback.name} answers"
                log.log(
                    logging.ERROR if last else logging.WARNING,
                    "%s request failed on %s: %s%s",
                    endpoint,
                    current.name,
                    e.message,
                    then_says,
                )
                failed = e
                if last:
                    return errors.error_response(e.status, e.public, None, e.code)
            except RequestError as e:
                if decision:
                    self.arm_health.released(current.name)
                outcome.refused(e)
                raise
            except UpstreamRefused as e:  # only an upstream arm refuses, and only a routed request has one
                self.arm_health.released(current.name)
                outcome.failed(e.status, "upstream_refused", json.dumps(e.body)[:500])
                return JSONResponse(e.body, status_code=e.status)
            except Exception as e:
                outcome.failed(500, "server_error", f"{type(e).__name__}: {e}")
                log.exception("%s request failed", endpoint)
                # answered here, not raised: an exception that reaches uvicorn closes the client's keep-alive
                return errors.server_fault(e)
            finally:
                if not streaming:
                    outcome.close()
        raise AssertionError("unreachable: the last attempt returns or raises")

    def unrouted(self, model: str) -> LocalArm:
        """The arm of a request no route decided: the name it asks for; on one arm of a controller's split, that arm
        (logged under its name whatever the request named), which `auto` and the route's name ask for too."""
        if self.routed_as is None:
            return LocalArm(model)
        route, arm = self.routed_as
        return LocalArm(arm, alias="" if model in (AUTO, route) else model)

    async def attempt(
        self, arm: Arm, attempt: Attempt, decision: Decision | None
    ) -> tuple[Any, dict[str, Any] | None, str | None]:
        """(the answer body, or a StreamingResponse; facts for the log; its text) from one arm, faults applied.
        ArmFailure: a failure the fallback may answer. RequestError / UpstreamRefused: the request's own fault."""
        outcome, body = attempt.outcome, attempt.body
        assert outcome is not None, "answer() and shadow_copy() give each attempt its outcome"
        limit = min(arm.timeout_s or self.timeout_s(), self.timeout_s())
        faults = arm.faults
        if faults and faults.delay_s:
            left = limit - outcome.elapsed()
            await asyncio.sleep(max(min(faults.delay_s, left), 0.0))
            if faults.delay_s >= left:
                raise ArmFailure(
                    504,
                    "timeout",
                    f"{arm.name}: no answer within {limit:g} s (injected delay {faults.delay_s:g} s)",
                    "timeout",
                )
        if faults and self.drill.fires(arm.name, "abort", faults.abort_share):
            raise ArmFailure(500, "fault_abort", f"{arm.name}: injected fault: abort", "fault_abort")
        nan = faults is not None and self.drill.fires(arm.name, "nan", faults.nan_share)
        if nan and body.stream:  # a stream's bytes go out as they come: the fault strikes before the first
            raise ArmFailure(500, "decode_failure", f"{arm.name}: injected fault: NaN logits", "decode_failure", True)
        attempt = replace(attempt, limit_s=limit, routed=(decision.route, arm.name) if decision else self.routed_as)
        if isinstance(arm, UpstreamArm):
            answered, facts = await self.ask_upstream(arm, attempt)
        else:
            assert isinstance(arm, LocalArm), f"an arm is local or upstream (serving.arms.arm_of), not {arm.kind}"
            answered, facts = await self.local.answer(arm, attempt)
        if nan and not isinstance(answered, StreamingResponse):
            raise ArmFailure(500, "decode_failure", f"{arm.name}: injected fault: NaN logits", "decode_failure", True)
        if (
            faults
            and not isinstance(answered, StreamingResponse)
            and self.drill.fires(arm.name, "corrupt", faults.corrupt_share)
        ):
            answered = corrupt_answer(answered)  # the drill `corrupt_share`: fast, 200, and wrong
        return answered, facts, None if isinstance(answered, StreamingResponse) else answer_text(answered)

    async def ask_upstream(self, arm: UpstreamArm, attempt: Attempt) -> tuple[Any, dict[str, Any] | None]:
        outcome, body, limit = attempt.outcome, attempt.body, attempt.limit_s
        assert outcome is not None, "attempt() is given one with its outcome"
        assert self.client is not None, "start() opens the client before the app takes requests"
        outcome.upstream(arm)
        payload = upstream_payload(body)
        stamp = attempt.stamp() | {"upstream": arm.upstream}
        left = max(limit - outcome.elapsed(), 0.001)
        if body.stream:
            first, lines, response = await arm.open_stream(self.client, attempt.endpoint, payload, left)
            return relay_stream(first, lines, response.aclose, stamp, outcome, limit, attempt.on_text), None
        answer_body = await arm.complete(self.client, attempt.endpoint, payload, left)
        extension = answer_body.get("unmask") or {}
        outcome.note(
            model=answer_body.get("model") or arm.model,
            version=extension.get("version"),
            weights_sha256=extension.get("weights_sha256"),
            config_hash=extension.get("config_hash"),
        )
        return stamped(answer_body, stamp), upstream_facts(answer_body)

    def shadow(self, decision: Decision, asked: Attempt, primary: str | None) -> None:
        """Send a copy to the route's shadow arm in the background, unless `max_shadows` are in flight."""
        assert decision.shadow is not None, "called only for a decision with a shadow arm"
        if not self.shadows.start(self.shadow_copy(decision, asked, primary)):
            self.metrics.shadow_dropped.labels(decision.route, decision.shadow.name).inc()

    async def shadow_copy(self, decision: Decision, asked: Attempt, primary: str | None) -> None:
        arm, body = decision.shadow, asked.body
        assert arm is not None, "shadow() sends a copy only for a decision with a shadow arm"
        copy = body.model_copy(update={"stream": False, "stream_options": None})
        outcome = Outcome(self.metrics, self.requests_log, asked.endpoint, body.model, False, shadow=True)
        outcome.routed(decision.route, arm.name)
        verdict = "failed"
        try:
            answered, facts, text = await self.attempt(
                arm, replace(asked, request=None, body=copy, outcome=outcome, retry_of=None, on_text=None), decision
            )
            self.arm_health.succeeded(arm.name)
            agrees = None if primary is None else text == primary  # None: the primary gave no text to compare
            verdict = {True: "agree", False: "disagree", None: "answered"}[agrees]
            outcome.note(agrees=agrees)
            assert facts is not None, "a shadow copy is never streamed, and a whole answer comes with its facts"
            outcome.answered(facts)
        except ArmFailure as e:
            self.arm_health.failed(arm.name, e.reason, e.message)
            outcome.failed(e.status, e.code, e.message, decode_failure=e.decode_failure)
        except (RequestError, UpstreamRefused) as e:
            self.arm_health.released(arm.name)
            outcome.failed(getattr(e, "status", 400), "refused", str(e))
        except Exception as e:
            log.exception("shadow copy to %s failed", arm.name)
            outcome.failed(500, "server_error", f"{type(e).__name__}: {e}")
        finally:
            outcome.close()
            self.metrics.shadow_requests.labels(decision.route, arm.name, verdict).inc()
