"""What one request leaves behind: its Prometheus metrics and its request-log row, recorded once.

A request is answered (200), refused (a `RequestError`: 4xx, 503, 504, 499) or failed (500); a
streamed one may also end after its first byte, with an error chunk or a client that hung up. Each
way ends in exactly one of `answered`, `refused`, `failed` (or `close` for whatever ended otherwise).
A routed request whose arm failed leaves two: the failed attempt (`retried`) and the fallback's answer
(`retry_of`). A shadow copy has one of its own (`shadow`), kept out of the route metrics a rollout judges.
"""

from __future__ import annotations

import time
from typing import Any

from serving.decoding import RequestError
from serving.metrics import ServingMetrics
from serving.request_log import RequestLog, row


class Outcome:
    """One request's accounting, from its arrival to the last byte of its answer."""

    def __init__(
        self,
        metrics: ServingMetrics,
        requests_log: RequestLog | None,
        endpoint: str,
        alias: str,
        stream: bool,
        shadow: bool = False,
        request_id: str | None = None,
    ):
        self.metrics, self.requests_log = metrics, requests_log
        self.arrived = time.monotonic()
        self.endpoint, self.stream = endpoint, stream
        self.entry: dict[str, Any] = {
            "endpoint": endpoint,
            "alias": alias,
            "stream": stream,
            "shadow": shadow,
            "retried": False,
            "decode_failure": False,
            "request_id": request_id,
        }
        self.shadow = shadow
        self.alias = "unknown"
        self.labels: tuple[str, str, str] | None = None  # (alias, model, version) once resolved
        self.ttfb_s: float | None = None
        self.recorded = False
        self.route: tuple[str, str] | None = None  # (route, arm) of a routed request, or of any on a `--route` arm

    def elapsed(self) -> float:
        return time.monotonic() - self.arrived

    def resolved(self, route: Any) -> None:
        v = route.version
        self.alias, self.labels = route.name, (route.name, v.model, v.version)
        self.entry |= {"alias": route.name, "model": v.model, "version": v.version, "weights_sha256": v.weights_sha256}

    def routed(self, route: str, arm: str) -> None:
        """The route and arm the canary analysis judges this request under: the router's pick (`--routes`), or a
        `--route` server's own (one arm of a route an outside controller splits); the route metrics take them too."""
        self.route = None if self.shadow else (route, arm)
        self.entry |= {"route": route, "arm": arm}

    def upstream(self, arm: Any) -> None:
        """An upstream arm answers: it is the `alias` of the metrics, its URL is logged."""
        self.alias, self.labels = arm.name, (arm.name, arm.model, "upstream")
        self.entry |= {"alias": arm.name, "model": arm.model, "upstream": arm.upstream}

    def retry_of(self, arm: str) -> None:
        """This attempt answers for `arm`, which failed: the same arrival, so the latency is the client's."""
        self.entry["retry_of"] = arm

    def note(self, **fields: Any) -> None:
        """Facts learnt on the way (an upstream's model and version, a shadow's agreement)."""
        self.entry |= fields

    def first_byte(self) -> float:
        """Note that the answer's first byte goes out now; returns the time to it."""
        self.ttfb_s = self.elapsed()
        return self.ttfb_s

    def answered(self, facts: dict[str, Any]) -> None:
        """A 200 with its facts (queue_s, prompt/completion tokens, nfe, batch_size, first_block_s, ...)."""
        latency = self.elapsed()
        ttfb = self.ttfb_s if self.stream and self.ttfb_s is not None else latency  # non-streamed: all at once
        m, labels, stream = self.metrics, self.labels, str(self.stream).lower()
        assert labels is not None, "an answer comes from a resolved route or an upstream (resolved(), upstream())"
        m.requests.labels(*labels, self.endpoint, "200").inc()
        m.latency.labels(*labels).observe(latency)
        m.ttfb.labels(*labels, stream).observe(ttfb)
        for histogram, key in ((m.queue_wait, "queue_s"), (m.first_block, "first_block_s")):
            if facts.get(key) is not None:  # an upstream does not say
                (histogram.labels(*labels) if key == "queue_s" else histogram.labels(*labels, stream)).observe(
                    facts[key]
                )
        for counter, key in (
            (m.prompt_tokens, "prompt_tokens"),
            (m.completion_tokens, "completion_tokens"),
            (m.nfe, "nfe"),
        ):
            if facts.get(key) is not None:
                counter.labels(*labels).inc(facts[key])
        if self.route:
            m.route_requests.labels(*self.route, self.endpoint, "200").inc()
            m.route_latency.labels(*self.route).observe(latency)
        self._log(facts | {"status": 200, "ttfb_s": ttfb}, latency)

    def refused(self, error: RequestError) -> None:
        self.failed(error.status, error.code, error.message)

    def failed(self, status: int, code: str, message: str, retried: bool = False, decode_failure: bool = False) -> None:
        self.metrics.errors.labels(self.alias, self.endpoint, str(status), code).inc()
        if self.labels:
            self.metrics.requests.labels(*self.labels, self.endpoint, str(status)).inc()
        if self.route:
            self.metrics.route_requests.labels(*self.route, self.endpoint, str(status)).inc()
        self._log(
            {
                "status": status,
                "error": message[:500],
                "ttfb_s": self.ttfb_s,
                "retried": retried,
                "decode_failure": decode_failure,
            },
            self.elapsed(),
        )

    def close(self) -> None:
        """The row of a request that ended in none of the ways above (cancelled under us), if not written yet."""
        if not self.recorded:
            self._log({"ttfb_s": self.ttfb_s}, self.elapsed())

    def _log(self, fields: dict[str, Any], latency: float) -> None:
        if self.recorded:
            return
        self.recorded = True
        if self.requests_log:
            self.requests_log.append(row(**self.entry | fields, latency_s=latency))
