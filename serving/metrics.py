"""The server's Prometheus metrics, on a registry of its own (two apps in one process never collide).

Labels are bounded: `alias` is a served name or `unknown`, `model`/`version` come from the registry,
never from free request text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

SERVED = ("alias", "model", "version")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class ServingMetrics:
    """Requests, errors, queue depth, batch sizes, latency, tokens and NFE, per model and alias."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "unmask_requests", "Requests answered, by outcome", (*SERVED, "endpoint", "status"), registry=r
        )
        self.errors = Counter(
            "unmask_request_errors",
            "Requests answered with an error, by HTTP status and code",
            ("alias", "endpoint", "status", "code"),
            registry=r,
        )
        self.latency = Histogram(
            "unmask_request_latency_seconds",
            "Time from arrival to answer (successful requests)",
            SERVED,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "unmask_ttfb_seconds",
            "Time from arrival to the answer's first byte (non-streamed: the latency), successful requests",
            (*SERVED, "stream"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_block = Histogram(
            "unmask_first_block_seconds",
            "Time from arrival until the answer's first block (autoregressive: first token) was final",
            (*SERVED, "stream"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "unmask_queue_wait_seconds",
            "Time a request waited for its batch to start",
            SERVED,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("unmask_prompt_tokens", "Prompt tokens decoded", SERVED, registry=r)
        self.completion_tokens = Counter(
            "unmask_completion_tokens", "Answer tokens (before the first stop)", SERVED, registry=r
        )
        self.nfe = Counter(
            "unmask_nfe",
            "Model evaluations of the batches that answered requests, counted per request",
            SERVED,
            registry=r,
        )
        self.queue_depth = Gauge("unmask_queue_depth", "Requests waiting for a batch", ("model", "version"), registry=r)
        self.batch_size = Histogram(
            "unmask_batch_size", "Rows per decoded batch", ("model", "version"), buckets=BATCH_BUCKETS, registry=r
        )
        self.batches = Counter("unmask_batches", "Batches decoded", ("model", "version"), registry=r)
        self.served = Gauge(
            "unmask_served_version",
            "1 for the version each served name points at",
            (*SERVED, "weights_sha256"),
            registry=r,
        )
        self.swaps = Counter("unmask_alias_swaps", "Alias moves picked up without a restart", ("alias",), registry=r)
        self.swap_failures = Counter(
            "unmask_alias_swap_failures", "Alias moves that could not be served (kept the old)", ("alias",), registry=r
        )
        # routes (`--routes`): requests and latency per route and arm, and live reloads of the routes file
        self.route_requests = Counter(
            "unmask_route_requests",
            "Routed requests, by route, arm and outcome",
            ("route", "arm", "endpoint", "status"),
            registry=r,
        )
        self.route_latency = Histogram(
            "unmask_route_latency_seconds",
            "Time from arrival to answer of routed requests (successful ones)",
            ("route", "arm"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.route_reloads = Counter("unmask_route_reloads", "Routes files re-read and put in force", registry=r)
        self.route_reload_failures = Counter(
            "unmask_route_reload_failures", "Routes file edits refused (the old routes stay)", registry=r
        )
        # arms: health, retries on the fallback, shadow copies, and the live weights overlay
        self.arm_healthy = Gauge(
            "unmask_arm_healthy",
            "1 while an arm is healthy, 0 while its traffic goes to the fallback",
            ("arm",),
            registry=r,
        )
        self.arm_unhealthy = Gauge(
            "unmask_arm_unhealthy",
            "1 for an unhealthy arm, labelled with the kind of failure that made it so",
            ("arm", "reason"),
            registry=r,
        )
        self.arm_failures = Counter(
            "unmask_arm_failures",
            "Attempts an arm failed (connection, timeout, status_5xx, decode_failure, fault_abort, error)",
            ("arm", "reason"),
            registry=r,
        )
        self.retries = Counter(
            "unmask_retries",
            "Requests whose arm failed and the route's fallback answered instead",
            ("route", "arm", "fallback"),
            registry=r,
        )
        self.shadow_requests = Counter(
            "unmask_shadow_requests",
            "Shadow copies answered, by whether they agreed with the primary (agree, disagree, failed)",
            ("route", "arm", "outcome"),
            registry=r,
        )
        self.shadow_dropped = Counter(
            "unmask_shadow_dropped", "Shadow copies not sent: too many in flight", ("route", "arm"), registry=r
        )
        self.weights_reloads = Counter("unmask_weights_reloads", "Weights overlays put in force", registry=r)
        self.weights_reload_failures = Counter(
            "unmask_weights_reload_failures", "Weights overlay files refused (the weights in force stay)", registry=r
        )
        self.log_dropped = Counter("unmask_request_log_dropped", "Request-log rows dropped (writer behind)", registry=r)

    def expose_gateway_load(self, loads: Callable[[], Iterable[tuple[str, int, int, int]]]) -> None:
        """Also publish the load under vLLM's names (GatewayLoad); `loads()` gives (model, waiting, running, max
        batch)."""
        self.registry.register(GatewayLoad(loads))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class GatewayLoad:
    """The gauges the Kubernetes Gateway API inference extension's endpoint picker (and llm-d's) scrapes from a
    vLLM server, so an unmask server can sit in an InferencePool: `vllm:num_requests_waiting` (queued),
    `vllm:num_requests_running` (in the batch being decoded), and the KV-cache utilisation under its current
    and older names, `vllm:kv_cache_usage_perc` and `vllm:gpu_cache_usage_perc` (0..1). unmask has no paged KV
    cache; what fills up is the batch, so both report running / max batch (docs/serving.md)."""

    def __init__(self, loads: Callable[[], Iterable[tuple[str, int, int, int]]]):
        self.loads = loads

    def collect(self) -> Iterator[Metric]:
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting for a batch", labels=["model_name"])
        running = GaugeMetricFamily(
            "vllm:num_requests_running", "Requests in the batch being decoded", labels=["model_name"]
        )
        usage = [
            GaugeMetricFamily(
                name, "Batch occupancy (running / max batch): unmask's KV-cache stand-in, 0..1", labels=["model_name"]
            )
            for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
        ]
        for model, queued, busy, capacity in self.loads():
            waiting.add_metric([model], queued)
            running.add_metric([model], busy)
            for family in usage:
                family.add_metric([model], busy / capacity if capacity else 0.0)
        yield from (waiting, running, *usage)
