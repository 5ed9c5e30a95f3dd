"""The analysis a controller target renders (`unmask deploy render --target argo-rollouts`), run as a pod that shares
nothing with the renderer (issue 49): an empty home, only the rendered env and args, its routes ConfigMap written
where the mount says, the controllers' key from the Secret, and the request-log claim as a folder the serving pods
also write. Asked what Argo asks, with the key Argo sends, it judges the rows on that volume."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from serving.manifests import render
from serving.request_log import ParquetRows, row
from tests.support import REPO
from tests.support.pods import start_pod
from tests.support.servers import free_port, stop_group, wait_healthy

pytestmark = pytest.mark.timeout(120)

TOKEN = "argo-analysis-key-0123"
ARM = {"name": "staging", "alias": "staging", "model": "m", "version": "2", "source": "s", "weights_sha256": "ab"}
SPEC = {
    "route": "default",
    "image": "unmask:0.1.0",
    "weight": 25,
    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
    "arms": [ARM, ARM | {"name": "production", "alias": "production", "version": "1"}],
    "steps": [5, 25, 50, 100],
    "interval_s": 60,
    "routes_text": (REPO / "gates" / "serving.yaml").read_text(),
    "tracking_uri": "http://mlflow.team:5000",
    "request_log_claim": "unmask-requests",
}


def last_window(now: datetime) -> tuple[int, datetime]:
    """A window width of the epoch-aligned grid whose next boundary is over a minute away, and the middle of the last
    window completed (the one an analysis asked now judges)."""
    for width in (3600, 3599):  # two grids: no moment is within a minute of a boundary of both
        start = math.floor(now.timestamp() / width) * width - width
        if now.timestamp() < start + 2 * width - 60:
            return width, datetime.fromtimestamp(start + width / 2, UTC)
    raise AssertionError(f"{now} is within a minute of a boundary of both grids")


def ask(port: int, query: str, token: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/unmask/analysis?{query}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_rendered_analysis_runs_as_a_pod_and_judges_the_serving_pods_rows(tmp_path: Path):
    manifests = render("argo-rollouts", SPEC)
    [deployment] = [m for m in manifests if m["kind"] == "Deployment"]
    configmaps = {m["metadata"]["name"]: m["data"] for m in manifests if m["kind"] == "ConfigMap"}
    [template] = [m for m in manifests if m["kind"] == "AnalysisTemplate"]
    url = template["spec"]["metrics"][0]["provider"]["web"]["url"]
    asked = url.split("?", 1)[1].replace("{{args.revision}}", "rev-1")  # what Argo sends, the hash filled in
    width, middle = last_window(datetime.now(UTC))
    asked = asked.replace("window_s=60", f"window_s={width}")

    claim = tmp_path / "claim"  # the volume the stable and the canary pods log to
    rows = [
        row(time=(middle + timedelta(seconds=i)).isoformat(), route="default", arm=arm, alias=arm, status=200)
        for i, arm in enumerate(["staging"] * 3 + ["production"] * 2)
    ]
    ParquetRows(claim).append_requests([r | {"latency_s": 0.1} for r in rows], "serving-pods", "test")

    port = free_port()
    pod = start_pod(
        deployment,
        configmaps,
        {"unmask-analysis": {"token": TOKEN}},
        tmp_path / "pod",
        port,
        {"unmask-requests": claim},
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", pod, tmp_path / "pod" / "pod.log", timeout_s=60)
        assert ask(port, asked, None)[0] == 401  # the controllers' key is required, the one Argo reads too
        status, body = ask(port, asked, TOKEN)
        assert status == 200, body
        assert (body["route"], body["candidate"], body["baseline"]) == ("default", "staging", "production")
        assert body["arms"]["staging"]["requests"] == 3 and body["arms"]["production"]["requests"] == 2
        assert body["verdict"] == "inconclusive" and body["look"] == 1  # five rows: too few to judge
        assert list((claim / "looks").iterdir())  # the look is numbered on the shared volume, for every replica
    finally:
        stop_group(pod)
