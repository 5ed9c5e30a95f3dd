"""Arms: what answers a route's traffic. A local alias of this server's pool, or an upstream OpenAI-compatible endpoint.

`LocalArm` decodes in process (serving/app.py). `UpstreamArm` forwards the request over httpx to
`<upstream>/completions` or `/chat/completions` with its own `model`, its key read from the
environment variable the policy names (never logged), under its `timeout_s`. A failure worth answering
on the fallback (connection refused, timeout, 5xx, a decode failure) is an `ArmFailure`; an upstream's
4xx is the client's error and is passed back as it is (`UpstreamRefused`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gates.serving_arms import ArmSpec, FaultSpec

PATHS = {"completions": "/completions", "chat": "/chat/completions"}  # endpoint -> path under the base URL


class Arm(Protocol):
    """What serves a route's share of traffic; `kind` says where it runs ("local" or "upstream").
    Read-only members: the arms are frozen dataclasses."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def timeout_s(self) -> float | None: ...

    @property
    def faults(self) -> FaultSpec | None: ...


@dataclass(frozen=True)
class LocalArm:
    """An alias (or registered model) served by this process's model pool, maybe under another arm name."""

    name: str
    kind: str = "local"
    alias: str = ""  # the served name that answers; "" means `name`
    timeout_s: float | None = None
    faults: FaultSpec | None = None

    @property
    def served(self) -> str:
        return self.alias or self.name


class ArmFailure(Exception):
    """An attempt that failed in a way the route's fallback may answer instead. `reason` is a bounded label."""

    def __init__(
        self, status: int, code: str, message: str, reason: str, decode_failure: bool = False, public: str | None = None
    ):
        super().__init__(message)
        self.status, self.code, self.message, self.reason = status, code, message, reason
        self.decode_failure = decode_failure
        self.public = public or message  # what the client is told (never an exception's internals)


class UpstreamRefused(Exception):
    """The upstream answered 4xx: the request's own fault, passed back to the client unchanged."""

    def __init__(self, status: int, body: Any):
        super().__init__(f"upstream answered {status}")
        self.status, self.body = status, body


@dataclass(frozen=True)
class UpstreamArm:
    """An OpenAI-compatible endpoint (vLLM, SGLang, a hosted API, another `unmask serve`)."""

    name: str
    upstream: str  # base URL, e.g. http://127.0.0.1:8001/v1
    model: str
    api_key_env: str | None = None
    timeout_s: float | None = None
    faults: FaultSpec | None = None
    kind: str = "upstream"

    def _request(
        self, client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any], stream: bool, timeout_s: float
    ) -> httpx.Request:
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = payload | {"model": self.model} | ({"stream": True} if stream else {})  # nothing the client did not ask
        return client.build_request(
            "POST", self.upstream + PATHS[endpoint], json=body, headers=headers, timeout=httpx.Timeout(timeout_s)
        )

    async def complete(
        self, client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        """The upstream's JSON answer; ArmFailure or UpstreamRefused otherwise. Bounded by `timeout_s` in all."""
        response = await self._send(client, self._request(client, endpoint, payload, False, timeout_s), timeout_s)
        try:
            answer: dict[str, Any] = response.json()  # an OpenAI-compatible answer is a JSON object
            return answer
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ArmFailure(
                502, "upstream_error", f"{self.name}: the upstream's answer is not JSON", "bad_answer"
            ) from None

    async def open_stream(
        self, client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any], timeout_s: float
    ) -> tuple[str, AsyncIterator[str], httpx.Response]:
        """(the first line, the rest, the response to close) of a streamed answer; before the first line
        arrives every failure is an ArmFailure, so the request can still go to the fallback."""
        request = self._request(client, endpoint, payload, True, timeout_s)
        response = await self._send(client, request, timeout_s, stream=True)
        lines = response.aiter_lines()
        try:
            first = await asyncio.wait_for(anext(lines), timeout_s)
        except (TimeoutError, StopAsyncIteration, httpx.HTTPError) as e:
            await response.aclose()
            raise ArmFailure(
                504 if isinstance(e, asyncio.TimeoutError) else 502,
                "upstream_error",
                f"{self.name}: the upstream stream ended before its first byte ({type(e).__name__})",
                "timeout" if isinstance(e, asyncio.TimeoutError) else "connection",
            ) from None
        return first, lines, response

    async def _send(
        self, client: httpx.AsyncClient, request: httpx.Request, timeout_s: float, stream: bool = False
    ) -> httpx.Response:
        try:
            response = await asyncio.wait_for(client.send(request, stream=stream), timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            raise ArmFailure(
                504, "timeout", f"{self.name}: no answer from {self.upstream} within {timeout_s:g} s", "timeout"
            ) from None
        except httpx.TransportError as e:
            raise ArmFailure(
                502,
                "upstream_unreachable",
                f"{self.name}: cannot reach {self.upstream} ({type(e).__name__})",
                "connection",
            ) from None
        if response.status_code < 400:
            return response
        body = await response.aread()
        await response.aclose()
        if response.status_code >= 500:
            raise ArmFailure(
                502, "upstream_error", f"{self.name}: {self.upstream} answered {response.status_code}", "status_5xx"
            )
        try:
            parsed = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = {"error": {"message": body[:500].decode(errors="replace"), "type": "upstream_error"}}
        raise UpstreamRefused(response.status_code, parsed)


def arm_of(name: str, declared: dict[str, ArmSpec]) -> LocalArm | UpstreamArm:
    """The arm a route names: a declared one, else the served alias of that name."""
    spec = declared.get(name)
    if spec is None:
        return LocalArm(name)
    if spec.upstream:
        assert spec.model is not None, "gates.serving_arms gives every upstream arm its model"
        return UpstreamArm(name, spec.upstream, spec.model, spec.api_key_env, spec.timeout_s, spec.faults)
    assert spec.alias is not None, "gates.serving_arms gives every arm without an upstream its alias"
    return LocalArm(name, alias=spec.alias, timeout_s=spec.timeout_s, faults=spec.faults)
