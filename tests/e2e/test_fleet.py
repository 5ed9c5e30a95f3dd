"""The documented example fleet (docs/fleet.md, docs/examples/fleet.yaml) on loopback: two `unmask serve` upstreams
and one `unmask serve --routes` router, three processes started the way the doc starts them, driven by the real
`openai` client; where each request went is read back from the three request logs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import openai
import pytest
import yaml

from serving.request_log import read_rows
from tests.support import REPO
from tests.support.servers import free_port, stop_group, wait_healthy
from tests.support.serving_fixtures import PROMPTS, ext, serving_registry

pytestmark = pytest.mark.timeout(600)
EXAMPLE = REPO / "docs" / "examples" / "fleet.yaml"


def serve(name: str, home: Path, tracking_uri: str, port: int, *args: str) -> subprocess.Popen:
    """`unmask serve ARGS` as its own process group with its own state folder (so its own request log)."""
    env = dict(os.environ, UNMASK_HOME=str(home), MLFLOW_TRACKING_URI=tracking_uri, UNMASK_THREADS="1")
    log = open(home.parent / f"{name}.log", "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from flows.cli import main; main()",
            "serve",
            "--port",
            str(port),
            "--poll",
            "1",
            *args,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.fixture
def fleet(tmp_path):
    registry = serving_registry(tmp_path / "registry")  # production: tiny-llada; fallback: tiny-ar
    ports = {"a": free_port(), "b": free_port(), "router": free_port()}
    policy = yaml.safe_load(EXAMPLE.read_text())
    for pool in ("a", "b"):
        policy["arms"][f"pool-{pool}"]["upstream"] = f"http://127.0.0.1:{ports[pool]}/v1"
    routes = tmp_path / "fleet.yaml"
    routes.write_text(yaml.safe_dump(policy, sort_keys=False))
    homes = {name: tmp_path / name / "state" for name in ports}
    procs = {}
    try:
        for pool in ("a", "b"):
            homes[pool].mkdir(parents=True)
            procs[pool] = serve(pool, homes[pool], registry.tracking_uri, ports[pool], "--alias", "production")
        homes["router"].mkdir(parents=True)
        procs["router"] = serve(
            "router",
            homes["router"],
            registry.tracking_uri,
            ports["router"],
            "--alias",
            "fallback",
            "--routes",
            str(routes),
        )
        for name, proc in procs.items():
            wait_healthy(f"http://127.0.0.1:{ports[name]}/health", proc, tmp_path / name / f"{name}.log", timeout_s=300)
        yield {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}, procs, homes
    finally:
        for proc in procs.values():
            stop_group(proc)


def test_the_example_fleet_routes_by_header_and_sticky_split_as_its_logs_show(fleet):
    urls, procs, homes = fleet
    client = openai.OpenAI(base_url=urls["router"] + "/v1", api_key="unused", max_retries=0, timeout=120)
    arms = []
    for i in range(3):  # pinned to pool b by the header
        answer = client.completions.create(
            model="auto", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8, extra_headers={"X-Pool": "b"}
        )
        arms.append(("pinned-b", ext(answer)["arm"]))
    users = [f"user-{i}" for i in range(8)]
    by_user = {}
    for user in users + users[:4]:  # the split is sticky: a user's second request goes where the first went
        answer = client.completions.create(model="auto", prompt=PROMPTS[0], max_tokens=8, user=user)
        assert ext(answer)["route"] == "default"
        assert by_user.setdefault(user, ext(answer)["arm"]) == ext(answer)["arm"]
        arms.append(("default", ext(answer)["arm"]))
    assert {arm for route, arm in arms if route == "pinned-b"} == {"pool-b"}
    assert set(by_user.values()) == {"pool-a", "pool-b"}  # eight users: both pools take a share

    for proc in procs.values():  # a stopped server flushes its request log
        stop_group(proc)
    logs = {name: read_rows(home / "serving" / "requests") for name, home in homes.items()}
    router = [(r["route"], r["arm"], r["upstream"]) for r in logs["router"] if r["endpoint"] and r["status"] == 200]
    assert Counter((route, arm) for route, arm, _ in router) == Counter(arms)  # the log says what the answers said
    assert all(upstream == f"{urls[arm[-1]]}/v1" for _, arm, upstream in router)  # pool-a -> a's URL, pool-b -> b's
    for pool in ("a", "b"):  # each upstream logged exactly the requests the router sent it, on its production
        served = [r for r in logs[pool] if r["status"] == 200]
        assert len(served) == sum(arm == f"pool-{pool}" for _, arm in arms)
        assert {(r["alias"], r["model"]) for r in served} == {("production", "tiny-llada")}
