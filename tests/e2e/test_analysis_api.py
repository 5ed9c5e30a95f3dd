"""The analysis endpoint for outside controllers (serving/analysis_api.py) over real HTTP: `unmask analysis serve`'s
app on uvicorn (127.0.0.1), a request log written by the server's own writer, and requests shaped exactly as
Argo Rollouts' web metric provider and Flagger's webhooks send them (their documented contracts:
argoproj.github.io/argo-rollouts/analysis/web, docs.flagger.app/usage/webhooks)."""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from registry.clock import SimulatedClock
from tests.support.servers import free_port, wait_healthy

pytestmark = pytest.mark.timeout(120)

POLICY = {
    "steps": [25, 100],
    "interval_s": 30,
    "min_requests": 20,
    "analysis": {"p95_latency_s": {"max": 1.0}, "error_rate": {"max": 0.05}},
}


def write_log(folder: Path, rows: list[dict]) -> None:
    from serving.request_log import RequestLog, row

    log = RequestLog(folder, flush_s=0.05)
    for r in rows:
        log.append(row(**r))
    log.close()


# The analysis judges the last completed window of an epoch-aligned grid (serving/looks.py): asked at NOW with
# window_s=600, the window [11:50, 12:00), where the traffic below is timed.
NOW = datetime(2026, 12, 6, 12, 0, 30, tzinfo=UTC)
IN_WINDOW = datetime(2026, 12, 6, 11, 55, tzinfo=UTC)


@contextmanager
def analysis_server(
    tmp_path: Path, rows: list[dict], keys=frozenset(), analysis_keys=frozenset(), clock=None, log_dir=None
):
    import uvicorn

    from serving.analysis_api import standalone_app

    tmp_path.mkdir(parents=True, exist_ok=True)
    routes = tmp_path / "serving.yaml"
    routes.write_text(
        yaml.safe_dump({"routes": {}, "default": {"split": {"staging": 25, "fallback": 75}}, "rollout": POLICY})
    )
    log_dir = log_dir or tmp_path / "requests"
    if rows:
        write_log(log_dir, rows)
    clock = clock or SimulatedClock(NOW)
    port = free_port()
    app = standalone_app(routes, log_dir, keys, analysis_keys, clock)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base + "/health", timeout_s=30)
        yield base
    finally:
        server.should_exit = True
        thread.join(10)


def traffic(arm: str, n: int, latency: float = 0.1, status: int = 200, at: datetime = IN_WINDOW) -> list[dict]:
    return [
        {
            "route": "default",
            "arm": arm,
            "status": status,
            "latency_s": latency + i * 1e-4,
            "endpoint": "completions",
            "time": (at + timedelta(milliseconds=i)).isoformat(timespec="milliseconds"),
        }
        for i in range(n)
    ]


def argo_measure(base: str, query: str) -> tuple[str, dict]:
    """What Argo's web provider does: GET the url (headers from the template), JSON body, jsonPath `{$.verdict}`,
    then successCondition `result == "pass"` / failureCondition `result == "fail"`, else Inconclusive."""
    response = httpx.get(
        f"{base}/v1/unmask/analysis?{query}",
        headers={"Accept": "application/json", "Authorization": "Bearer unused"},
        timeout=10,
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    body = response.json()
    result = body["verdict"]  # jsonPath: "{$.verdict}"
    phase = "Successful" if result == "pass" else "Failed" if result == "fail" else "Inconclusive"
    return phase, body


def flagger_hook(base: str, path: str, metadata: dict[str, str], phase: str = "Progressing") -> httpx.Response:
    """Flagger's webhook call: POST, JSON CanaryWebhookPayload {name, namespace, phase, checksum, metadata}."""
    return httpx.post(
        f"{base}{path}",
        json={"name": "tiny-llada", "namespace": "test", "phase": phase, "checksum": "6d9f8c7b", "metadata": metadata},
        headers={"Content-Type": "application/json"},
        timeout=10,
    )


def test_argo_web_provider_reads_pass_fail_and_inconclusive(tmp_path):
    healthy = traffic("staging", 150) + traffic("fallback", 300)
    with analysis_server(tmp_path / "healthy", healthy) as base:
        phase, body = argo_measure(base, "route=default&candidate=staging&baseline=fallback&window_s=600")
        assert phase == "Successful", body
        assert set(body) >= {"verdict", "route", "candidate", "baseline", "window_s", "metrics"}
        assert (body["route"], body["candidate"], body["baseline"], body["window_s"]) == (
            "default",
            "staging",
            "fallback",
            600,
        )
        for m in body["metrics"]:
            assert set(m) >= {"name", "verdict", "value", "lower", "upper", "confidence", "n", "reason"}
            assert m["verdict"] == "pass" and m["n"] == 150 and 0.95 < m["confidence"] < 1
        assert body["window"] == {"start": "2026-12-06T11:50:00+00:00", "end": "2026-12-06T12:00:00+00:00"}
        # no candidate/baseline: the split in force names them (the smaller weight is the canary)
        phase, again = argo_measure(base, "route=default&window_s=600")
        assert (again["candidate"], again["baseline"]) == ("staging", "fallback")
        assert again == body and body["look"] == 1  # the same window asked again: the same look, the same answer
        # a bad query is a 4xx naming the parameter, and the server keeps serving
        assert httpx.get(f"{base}/v1/unmask/analysis?window_s=10").status_code == 422
        assert httpx.get(f"{base}/v1/unmask/analysis?route=default&window_s=-1").status_code == 422
        assert argo_measure(base, "route=default&window_s=600")[0] == "Successful"
        # a typo is an error the controller shows (Argo: Error; five in a row abort), never a 200 inconclusive
        typo = httpx.get(f"{base}/v1/unmask/analysis?route=defualt&candidate=staging&baseline=fallback")
        assert typo.status_code == 404 and "route 'defualt': no such route" in typo.json()["error"]["message"]
        arm = httpx.get(f"{base}/v1/unmask/analysis?route=default&candidate=stagign&baseline=fallback")
        assert arm.status_code == 422 and "candidate='stagign': no such arm" in arm.json()["error"]["message"]
        assert argo_measure(base, "route=default&window_s=600")[0] == "Successful"
    with analysis_server(tmp_path / "broken", traffic("staging", 30, status=500) + traffic("fallback", 90)) as base:
        phase, body = argo_measure(base, "route=default&candidate=staging&baseline=fallback&window_s=600")
        assert phase == "Failed" and "error_rate" in body["reason"]
        assert next(m for m in body["metrics"] if m["name"] == "error_rate")["lower"] > 0.05
    with analysis_server(tmp_path / "few", traffic("staging", 8) + traffic("fallback", 90)) as base:
        phase, body = argo_measure(base, "route=default&candidate=staging&baseline=fallback&window_s=600")
        assert phase == "Inconclusive" and body["verdict"] == "inconclusive"  # 8 requests: never a pass
        p95 = next(m for m in body["metrics"] if m["name"] == "p95_latency_s")
        assert p95["upper"] is None and "more requests needed" in p95["reason"]


def test_flagger_webhooks_answer_2xx_on_pass_and_non_2xx_otherwise(tmp_path):
    meta = {"route": "default", "candidate": "staging", "baseline": "fallback", "window_s": "600"}
    with analysis_server(tmp_path / "healthy", traffic("staging", 150) + traffic("fallback", 300)) as base:
        gate = flagger_hook(base, "/v1/unmask/analysis/flagger", meta)
        assert gate.status_code == 200 and gate.json()["verdict"] == "pass"
        assert gate.json()["canary"] == "test/tiny-llada"
        promote = flagger_hook(base, "/v1/unmask/analysis/flagger", meta, phase="WaitingPromotion")
        assert promote.status_code == 200  # confirm-promotion: promoted
        assert flagger_hook(base, "/v1/unmask/analysis/flagger/rollback", meta).status_code == 409  # no rollback
        missing = flagger_hook(base, "/v1/unmask/analysis/flagger", {"candidate": "staging"})
        assert missing.status_code == 422 and "metadata.route" in missing.json()["error"]["message"]
        bad = flagger_hook(base, "/v1/unmask/analysis/flagger", meta | {"window_s": "soon"})
        assert bad.status_code == 422 and "metadata.window_s" in bad.text
        typo = flagger_hook(base, "/v1/unmask/analysis/flagger", meta | {"baseline": "fallbak"})
        assert typo.status_code == 422 and "baseline='fallbak': no such arm" in typo.text  # not a 412 "inconclusive"
    with analysis_server(tmp_path / "broken", traffic("staging", 30, status=500) + traffic("fallback", 90)) as base:
        gate = flagger_hook(base, "/v1/unmask/analysis/flagger", meta)
        assert gate.status_code == 412 and gate.json()["verdict"] == "fail"  # a failed check for Flagger
        assert flagger_hook(base, "/v1/unmask/analysis/flagger/rollback", meta).status_code == 200  # roll back
    with analysis_server(tmp_path / "few", traffic("staging", 8) + traffic("fallback", 90)) as base:
        assert flagger_hook(base, "/v1/unmask/analysis/flagger", meta).status_code == 412  # inconclusive: held
        assert flagger_hook(base, "/v1/unmask/analysis/flagger/rollback", meta).status_code == 409


def test_unmask_analysis_serve_refuses_a_bad_policy_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from tests.support.fuzz_fixtures import unmask_app

    routes = tmp_path / "serving.yaml"
    routes.write_text(
        yaml.safe_dump({"default": {"split": {"fallback": 100}}, "rollout": POLICY | {"analysis": {"p99": {"max": 1}}}})
    )
    result = CliRunner().invoke(unmask_app(), ["analysis", "serve", "--routes", str(routes)])
    assert result.exit_code == 2 and "rollout.analysis.p99: unknown metric" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_controllers_authenticate_with_analysis_keys_argo_by_header_flagger_by_url(tmp_path):
    """Issue 49, item 5: with API keys set the analysis answered 401 to every controller (Flagger's webhook has no
    headers field). A controller's analysis key opens the analysis only: Argo sends it as a Bearer header (from a
    Secret, as the rendered AnalysisTemplate does), Flagger as ?token= on its URL."""
    from serving.access import load_analysis_keys

    api, controller = "api-key-0123456789", "argo-token-0123456789"
    analysis_keys = load_analysis_keys({"UNMASK_ANALYSIS_KEYS": f"{controller}, flagger-token-0123456789"})
    rows = traffic("staging", 150) + traffic("fallback", 300)
    query = "route=default&candidate=staging&baseline=fallback&window_s=600"
    meta = {"route": "default", "candidate": "staging", "baseline": "fallback", "window_s": "600"}
    with analysis_server(tmp_path / "keyed", rows, frozenset({api}), analysis_keys) as base:
        url = f"{base}/v1/unmask/analysis?{query}"
        assert httpx.get(url, timeout=10).status_code == 401  # no key
        assert httpx.get(url, headers={"Authorization": "Bearer wrong-0123456789"}, timeout=10).status_code == 401
        for key in (controller, api):  # the controller's key, and an API key, as a Bearer header
            answer = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert answer.status_code == 200 and answer.json()["verdict"] == "pass"
        flagger = f"{base}/v1/unmask/analysis/flagger?token=flagger-token-0123456789"
        body = {"name": "tiny-llada", "namespace": "test", "phase": "Progressing", "metadata": meta}
        assert httpx.post(flagger, json=body, timeout=10).status_code == 200
        assert httpx.post(flagger.replace("flagger-token", "other-token"), json=body, timeout=10).status_code == 401
        assert httpx.get(f"{url}&token={api}", timeout=10).status_code == 401  # an API key never travels in a URL
    with analysis_server(tmp_path / "open-api", rows, analysis_keys=analysis_keys) as base:
        assert httpx.get(f"{base}/v1/unmask/analysis?{query}", timeout=10).status_code == 401  # analysis needs one
        assert httpx.get(f"{base}/v1/unmask/analysis?{query}&token={controller}", timeout=10).status_code == 200


def test_an_analysis_key_opens_nothing_but_the_analysis_on_unmask_serve():
    from fastapi.testclient import TestClient

    from serving.app import create_app
    from tests.support.serving_fixtures import settings_for, shared_serving_registry

    settings = settings_for(shared_serving_registry().tracking_uri)
    settings.api_keys, settings.analysis_keys = frozenset({"api-key-0123456789"}), frozenset({"argo-token-0123456789"})
    with TestClient(create_app(settings)) as client:
        body = {"model": "production", "prompt": "hi", "max_tokens": 1}
        refused = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer argo-token-0123456789"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/v1/models", params={"token": "argo-token-0123456789"}).status_code == 401
        analysis = client.get(
            "/v1/unmask/analysis?route=default", headers={"Authorization": "Bearer argo-token-0123456789"}
        )
        assert analysis.status_code != 401  # past the key (this server has no routes file: a 404 naming that)
        assert "no routes file" in analysis.json()["error"]["message"]


def test_the_verdict_depends_on_the_evidence_and_the_rollout_only_not_on_a_process(tmp_path):
    """Issue 49, item 4: looks were counted per process (never reset between rollouts, reset by a restart, pushed
    up by anyone's calls: 500 anonymous calls made look 504), so two replicas gave two answers. Looks now number the
    windows a rollout was judged in, kept beside the request log that every replica reads."""
    log_dir = tmp_path / "requests"
    write_log(log_dir, traffic("staging", 150) + traffic("fallback", 300))
    query = "route=default&candidate=staging&baseline=fallback&window_s=600&revision=rs-6d9f8c7b"
    clocks = [SimulatedClock(NOW), SimulatedClock(NOW)]
    with analysis_server(tmp_path / "a", [], clock=clocks[0], log_dir=log_dir) as a:
        with analysis_server(tmp_path / "b", [], clock=clocks[1], log_dir=log_dir) as b:
            first, other = argo_measure(a, query)[1], argo_measure(b, query)[1]
            assert first == other and first["look"] == 1 and first["verdict"] == "pass"
            assert first["revision"] == "rs-6d9f8c7b"
            for _ in range(50):  # anyone's calls within the window spend nothing
                httpx.get(f"{a}/v1/unmask/analysis?{query}", timeout=10)
            assert argo_measure(b, query)[1] == first
            for clock in clocks:  # the next window: the next look, on both replicas, of rows it no longer holds
                clock.advance(600)
            later = argo_measure(b, query)[1]
            assert later["look"] == 2 and later["verdict"] == "inconclusive" and argo_measure(a, query)[1] == later
            new = argo_measure(a, query.replace("rs-6d9f8c7b", "rs-0a1b2c3d"))[1]
            assert new["look"] == 1  # a new revision is a new rollout: its budget starts whole
    with analysis_server(tmp_path / "c", [], clock=SimulatedClock(NOW), log_dir=log_dir) as restarted:
        assert argo_measure(restarted, query)[1] == first  # after a restart: the same window, the same look
    [record] = [f for f in (log_dir / "looks").glob("*.json") if "rs-6d9f8c7b" in f.read_text()]
    record.write_text("{not json")  # edited by hand: refused naming the file, never a guessed look
    with analysis_server(tmp_path / "d", [], clock=SimulatedClock(NOW), log_dir=log_dir) as edited:
        refused = httpx.get(f"{edited}/v1/unmask/analysis?{query}", timeout=10)
        assert refused.status_code == 409 and str(record) in refused.json()["error"]["message"]
