"""The rendered fleet, run as pods that share nothing with the machine that rendered it (issue 49, items 1 and 2).

A team `mlflow server` on PostgreSQL with proxied artifacts holds the registry (tiny-ar the fallback, and in
production by an audited move a model registered from a folder only the renderer has: tiny-llada's weights under
the name tiny-llada-tuned, which no bundled or catalog id names; both registered through the server). The renderer
pushes that folder's weights through the server (`unmask weights push`), then the folder goes. `unmask deploy render
--target k8s` writes the manifests; each replica of its Deployment runs as a separate process with an empty home,
only the rendered env and args, and the files its volumes mount (the routes ConfigMap, the public signing-key
ConfigMap) written where the mounts say, under a folder of its own: what a kubelet gives a container. The replicas
fetch the pushed weights through the server, verified by sha256, serve, and their answers equal those of a server
started here on the same registry over the bundled tiny-llada folder (the same weights, by their digest).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import openai
import pytest
import yaml
from typer.testing import CliRunner

from registry import Registry, register_evidence, signing
from tests.support.gate_fixtures import evidence, record
from tests.support.pods import start_pod
from tests.support.postgres_fixtures import database_name
from tests.support.servers import free_port, launch_mlflow_server, stop_group, wait_healthy
from tests.support.serving_fixtures import OPERATING, PROMPTS, digest, running_server, settings_for

pytestmark = pytest.mark.timeout(600)

NAME = "tiny-llada-tuned"  # production's model: its weights are in the renderer's folder, and pushed


@pytest.fixture(scope="module", autouse=True)
def _team_key(team_signing_key):
    """The renderer's store signs with the team's key, whose public half the pods get as the ConfigMap the manifests
    mount."""


@pytest.fixture(scope="module")
def team_registry(postgres, tmp_path_factory):
    """The team's server, with tiny-ar the fallback and NAME in production, registered through it from NAME's folder
    on the renderer: (the server's url, NAME's version, that folder)."""
    from models.loading import resolve_model_path
    from registry.promotion import _move

    folder = tmp_path_factory.mktemp("team")
    weights = Path(shutil.copytree(resolve_model_path("tiny-llada"), tmp_path_factory.mktemp("renderer-work") / NAME))
    url, proc = launch_mlflow_server(folder, postgres.create_database(database_name("pods")))
    try:
        reg = Registry(url)
        fallback = record("tiny-ar", "arith", config=OPERATING["tiny-ar"], weights_sha256=digest("tiny-ar"))
        register_evidence(reg, evidence("tiny-ar", [fallback], weights_sha256=digest("tiny-ar"), serving=[]))
        sha = digest("tiny-llada")  # the copy's digest: the same weights under another name
        rec = replace(record("tiny-llada", "arith", config=OPERATING["tiny-llada"], weights_sha256=sha), candidate=NAME)
        ev = evidence("tiny-llada", [rec], weights_sha256=sha, serving=[], fallback=fallback)
        version, _ = register_evidence(reg, replace(ev, candidate=NAME))
        assert reg.client.get_model_version(NAME, version).source.startswith("mlflow-artifacts:")
        _move(reg, "production", None, (NAME, version), "pod-test", "pods", {"kind": "promotion"})
        yield url, version, weights
    finally:
        stop_group(proc)


def unmask(url: str, home: Path, *args: str):
    """An `unmask` command on the renderer, against the team's server."""
    from flows.cli import _register_all, app

    _register_all()
    result = CliRunner().invoke(
        app, list(args), env={"UNMASK_HOME": str(home), "MLFLOW_TRACKING_URI": url, "COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    return result


def rendered(url: str, home: Path) -> tuple[list[dict], str]:
    """The manifests `unmask deploy render --target k8s` writes, and what it warned of."""
    result = unmask(url, home, "deploy", "render", "--target", "k8s", "--tracking-uri", url)
    return list(yaml.safe_load_all(result.stdout)), " ".join(result.stderr.split())


def test_the_rendered_router_runs_as_pods_sharing_nothing_with_the_renderer(team_registry, tmp_path):
    from models.loading import resolve_model_path

    url, version, weights = team_registry
    renderer = tmp_path / "renderer"
    _, warned = rendered(url, renderer)  # before the push: the pods could not fetch production's weights
    assert f"unmask weights push {NAME} {version} --from FOLDER" in warned, warned
    pushed = unmask(url, renderer, "weights", "push", NAME, version, "--from", str(weights))
    assert f"pushed 5 files of {NAME} version {version}" in pushed.output, pushed.output
    shutil.rmtree(weights)  # the registering machine's folder: no pod has it, and now nor does the renderer
    manifests, warned = rendered(url, renderer)
    assert warned == ""
    kinds = {m["kind"]: m for m in manifests}
    assert set(kinds) == {"ConfigMap", "Deployment", "Service"}
    text = yaml.safe_dump(manifests)
    assert str(tmp_path) not in text and "sqlite" not in text  # nothing of the rendering machine
    configmaps = {kinds["ConfigMap"]["metadata"]["name"]: kinds["ConfigMap"]["data"]}
    # the public half of the team's ring, as a ConfigMap: the pods verify with it and hold no secret
    configmaps["unmask-signing-public"] = {"signing.keys.pub": signing.key_ring(url).public_text()}
    assert "ed25519:" not in configmaps["unmask-signing-public"]["signing.keys.pub"].replace("ed25519-public:", "")
    pods, ports = [], [free_port(), free_port()]
    try:
        for replica, port in enumerate(ports):
            pods.append(start_pod(kinds["Deployment"], configmaps, {}, tmp_path / f"pod-{replica}", port))
        for replica, (pod, port) in enumerate(zip(pods, ports)):
            probe = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
            ready = f"http://127.0.0.1:{port}{probe['path']}"  # ready as the kubelet's probe says, on the mapped port
            wait_healthy(ready, pod, tmp_path / f"pod-{replica}" / "pod.log", timeout_s=300)
            fetched = tmp_path / f"pod-{replica}" / "var" / "lib" / "unmask" / "weights" / digest("tiny-llada")
            assert (fetched / "model.safetensors").is_file()  # each pod fetched production's weights into its home
        # here, production's weights are the bundled tiny-llada folder, which hashes to the digest registered
        bundled = {NAME: str(resolve_model_path("tiny-llada"))}
        with running_server(settings_for(url, sources=bundled)) as here:
            ask = {"model": "auto", "max_tokens": 16, "temperature": 0}
            local = openai.OpenAI(base_url=here.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
            expected = [local.completions.create(prompt=p, **ask | {"model": "production"}) for p in PROMPTS[:4]]
            for port in ports:
                client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
                answers = [client.completions.create(prompt=p, **ask) for p in PROMPTS[:4]]
                assert [a.choices[0].text for a in answers] == [e.choices[0].text for e in expected]
                assert {a.model_extra["unmask"]["model"] for a in answers} == {NAME}  # production's holder
    finally:
        for pod in pods:
            stop_group(pod)
