"""The rendered fleet, run as pods that share nothing with the machine that rendered it (issue 49, items 1 and 2).

A team `mlflow server` on PostgreSQL with proxied artifacts holds the registry (tiny-ar the fallback, tiny-llada in
production by an audited move, both registered through the server). `unmask deploy render --target k8s` writes the
manifests; each replica of its Deployment runs as a separate process with an empty home, only the rendered env and
args, and the files its volumes mount (the routes ConfigMap, the public signing-key ConfigMap) written where the
mounts say, under a folder of its own: what a kubelet gives a container. The replicas serve, and their answers equal
those of a server started here on the same registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
import yaml
from typer.testing import CliRunner

from registry import Registry, register_evidence, signing
from tests.support.gate_fixtures import evidence, record
from tests.support.postgres_fixtures import database_name
from tests.support.servers import free_port, launch_mlflow_server, stop_group, wait_healthy
from tests.support.serving_fixtures import OPERATING, PROMPTS, digest, running_server, settings_for

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _team_key(team_signing_key):
    """The renderer's store signs with the team's key, whose public half the pods get as the ConfigMap the manifests
    mount."""


@pytest.fixture(scope="module")
def team_registry(postgres, tmp_path_factory):
    """The team's server, with tiny-ar the fallback and tiny-llada in production, registered through it."""
    from registry.promotion import _move

    folder = tmp_path_factory.mktemp("team")
    url, proc = launch_mlflow_server(folder, postgres.create_database(database_name("pods")))
    try:
        reg = Registry(url)
        versions, recs = {}, {}
        for name in ("tiny-ar", "tiny-llada"):
            recs[name] = rec = record(name, "arith", config=OPERATING[name], weights_sha256=digest(name))
            ev = evidence(name, [rec], weights_sha256=digest(name), serving=[], fallback=recs["tiny-ar"])
            versions[name], _ = register_evidence(reg, ev)
        assert reg.client.get_model_version("tiny-llada", versions["tiny-llada"]).source.startswith("mlflow-artifacts:")
        _move(
            reg, "production", None, ("tiny-llada", versions["tiny-llada"]), "pod-test", "pods", {"kind": "promotion"}
        )
        yield url
    finally:
        stop_group(proc)


def rendered(url: str, home: Path) -> list[dict]:
    from flows.cli import _register_all, app

    _register_all()
    result = CliRunner().invoke(
        app,
        ["deploy", "render", "--target", "k8s", "--tracking-uri", url],
        env={"UNMASK_HOME": str(home), "MLFLOW_TRACKING_URI": url, "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    return list(yaml.safe_load_all(result.output))


def start_pod(deployment: dict, configmaps: dict, secrets: dict, root: Path, port: int) -> subprocess.Popen:
    """One replica: the container's args and env, nothing else of this machine's; each volume's files written under
    `root` at its mount path (paths in the args are read there too), the port the container listens on mapped."""
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        files = (
            configmaps[volume["configMap"]["name"]]
            if "configMap" in volume
            else secrets[volume["secret"]["secretName"]]
        )
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        for name, text in files.items():
            (target / name).write_text(text)

    def in_pod(value: str) -> str:
        return str(root / value.lstrip("/")) if value.startswith("/etc/") else value

    args = [in_pod(a) for a in container["args"]]
    args[args.index("--host") + 1], args[args.index("--port") + 1] = "127.0.0.1", str(port)
    home = root / "var" / "lib" / "unmask"  # the image's UNMASK_HOME, empty
    home.mkdir(parents=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "UNMASK_HOME": str(home), "UNMASK_THREADS": "1"}
    env |= {e["name"]: in_pod(e["value"]) for e in container["env"]}
    log = open(root / "pod.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", *args],  # the image's ENTRYPOINT: unmask
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_the_rendered_router_runs_as_pods_sharing_nothing_with_the_renderer(team_registry, tmp_path):
    manifests = rendered(team_registry, tmp_path / "renderer")
    kinds = {m["kind"]: m for m in manifests}
    assert set(kinds) == {"ConfigMap", "Deployment", "Service"}
    text = yaml.safe_dump(manifests)
    assert str(tmp_path) not in text and "sqlite" not in text  # nothing of the rendering machine
    configmaps = {kinds["ConfigMap"]["metadata"]["name"]: kinds["ConfigMap"]["data"]}
    # the public half of the team's ring, as a ConfigMap: the pods verify with it and hold no secret
    configmaps["unmask-signing-public"] = {"signing.keys.pub": signing.key_ring(team_registry).public_text()}
    assert "ed25519:" not in configmaps["unmask-signing-public"]["signing.keys.pub"].replace("ed25519-public:", "")
    pods, ports = [], [free_port(), free_port()]
    try:
        for replica, port in enumerate(ports):
            pods.append(start_pod(kinds["Deployment"], configmaps, {}, tmp_path / f"pod-{replica}", port))
        for replica, (pod, port) in enumerate(zip(pods, ports)):
            wait_healthy(f"http://127.0.0.1:{port}/health", pod, tmp_path / f"pod-{replica}" / "pod.log", timeout_s=300)
        with running_server(settings_for(team_registry)) as here:
            ask = {"model": "auto", "max_tokens": 16, "temperature": 0}
            local = openai.OpenAI(base_url=here.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
            expected = [local.completions.create(prompt=p, **ask | {"model": "production"}) for p in PROMPTS[:4]]
            for port in ports:
                client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
                answers = [client.completions.create(prompt=p, **ask) for p in PROMPTS[:4]]
                assert [a.choices[0].text for a in answers] == [e.choices[0].text for e in expected]
                assert {a.model_extra["unmask"]["model"] for a in answers} == {"tiny-llada"}  # production's holder
    finally:
        for pod in pods:
            stop_group(pod)
