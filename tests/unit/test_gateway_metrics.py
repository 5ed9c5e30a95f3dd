"""`/metrics` also speaks vLLM's names for load, which the Kubernetes inference gateway's endpoint picker
(llm-d's EPP) scrapes to pick a pod: waiting, running, and KV-cache usage (unmask: batch occupancy)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from serving.metrics import ServingMetrics


def samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("model_name", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_gateway_gauges_follow_the_pool_at_each_scrape():
    load = {"production": (3, 4, 16), "fallback": (0, 0, 16)}
    metrics = ServingMetrics()
    metrics.expose_gateway_load(lambda: [(name, *values) for name, values in load.items()])
    first = samples(metrics.render().decode())
    assert first[("vllm:num_requests_waiting", "production")] == 3
    assert first[("vllm:num_requests_running", "production")] == 4
    assert (
        first[("vllm:kv_cache_usage_perc", "production")] == first[("vllm:gpu_cache_usage_perc", "production")] == 0.25
    )
    assert first[("vllm:num_requests_running", "fallback")] == 0
    load["production"] = (0, 16, 16)  # read at scrape time, not cached
    assert samples(metrics.render().decode())[("vllm:kv_cache_usage_perc", "production")] == 1.0
