"""Rendered manifests: core kinds deserialise into the kubernetes client's models; CRDs carry their required fields."""

import json

import pytest
from typer.testing import CliRunner

from serving.manifests import render

ARM = {"name": "staging", "alias": "staging", "model": "m", "version": "2", "source": "models:/m/2",
       "weights_sha256": "ab" * 32}
SPEC = {"route": "default", "image": "unmask:0.1.0", "weight": 25,
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
        "arms": [ARM, {**ARM, "name": "production", "alias": "production", "version": "1"}],
        "steps": [5, 25, 50, 100], "interval_s": 60, "analysis_url": "http://r/v1/unmask/analysis",
        "routes_file": "gates/serving.yaml"}


def test_core_kinds_deserialise_into_kubernetes_models():
    from kubernetes.client import ApiClient

    class Response:
        def __init__(self, obj):
            self.data = json.dumps(obj)

    deployment, service = render("k8s", SPEC)
    d = ApiClient().deserialize(Response(deployment), "V1Deployment")
    assert d.spec.template.spec.containers[0].image == "unmask:0.1.0"
    assert "--routes" in d.spec.template.spec.containers[0].args
    s = ApiClient().deserialize(Response(service), "V1Service")
    assert s.spec.ports[0].target_port == 8000


def test_kserve_canary_percent_from_the_rollout_step():
    (isvc,) = render("kserve", SPEC)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 25
    assert isvc["spec"]["predictor"]["containers"][0]["image"] == "unmask:0.1.0"
    assert isvc["metadata"]["annotations"]["unmask.dev/weights-sha256"] == "ab" * 32


def test_argo_rollout_steps_and_analysis_template():
    rollout, template = render("argo-rollouts", SPEC)
    assert rollout["apiVersion"] == "argoproj.io/v1alpha1" and rollout["kind"] == "Rollout"
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    assert [s["setWeight"] for s in steps if "setWeight" in s] == [5, 25, 50, 100]
    assert all(s["analysis"]["templates"][0]["templateName"] == template["metadata"]["name"]
               for s in steps if "analysis" in s)
    assert rollout["spec"]["selector"]["matchLabels"] == rollout["spec"]["template"]["metadata"]["labels"]
    (metric,) = template["spec"]["metrics"]
    assert metric["provider"]["web"]["jsonPath"] == "{$.verdict}"
    assert "route=default" in metric["provider"]["web"]["url"] and "candidate=staging" in metric["provider"]["web"]["url"]
    assert metric["successCondition"] == 'result == "pass"' and metric["failureCondition"] == 'result == "fail"'


def test_unknown_target_is_refused():
    with pytest.raises(ValueError, match="--target 'helm'"):
        render("helm", SPEC)


def test_cli_bad_route_and_target_are_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    from flows.cli import _register_all, app

    _register_all()
    r = CliRunner().invoke(app, ["deploy", "render", "--target", "helm"])
    assert r.exit_code == 2 and "error: --target 'helm'" in r.output
    r = CliRunner().invoke(app, ["deploy", "render", "--target", "k8s", "--route", "nope"])
    assert r.exit_code == 2 and "error: --route 'nope'" in r.output
