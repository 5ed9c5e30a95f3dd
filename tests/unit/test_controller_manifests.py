"""The example manifests in docs/controllers/ call the analysis endpoint the way its contract says
(serving/analysis_api.py): paths the router serves, the query it reads, the verdict Argo's conditions test,
Flagger metadata as strings, and a KServe canary percent that is a step of the bundled rollout policy."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import yaml

from gates.rollout_policy import load_rollout_policy
from gates.serving_policy import SERVING_POLICY_PATH
from serving.analysis_api import router
from serving.manifests import analysis_url
from tests.support import REPO

DOCS = REPO / "docs" / "controllers"
PATHS = {route.path for route in router.routes}


def test_the_argo_analysis_template_reads_the_verdict_with_the_documented_conditions():
    template, rollout = yaml.safe_load_all((DOCS / "argo-analysistemplate.yaml").read_text())
    assert template["kind"] == "AnalysisTemplate" and rollout["kind"] == "Rollout"
    [metric] = template["spec"]["metrics"]
    web = metric["provider"]["web"]
    url = urlsplit(web["url"])
    assert url.path in PATHS and url.path == "/v1/unmask/analysis"
    assert set(parse_qs(url.query)) == {"route", "candidate", "baseline", "window_s", "revision"}
    assert web["jsonPath"] == "{$.verdict}"
    assert metric["successCondition"] == 'result == "pass"' and metric["failureCondition"] == 'result == "fail"'
    args = {a["name"]: a for a in template["spec"]["args"]}
    assert set(args) == {"route", "candidate", "baseline", "revision", "analysis-token"}
    steps = [step["analysis"] for step in rollout["spec"]["strategy"]["canary"]["steps"] if "analysis" in step]
    assert steps and all(
        a["args"] == [{"name": "revision", "valueFrom": {"podTemplateHashValue": "Latest"}}] for a in steps
    )
    assert args["analysis-token"]["valueFrom"]["secretKeyRef"] == {"name": "unmask-analysis", "key": "token"}
    assert web["headers"] == [{"key": "Authorization", "value": "Bearer {{args.analysis-token}}"}]
    # the analysis Service `unmask deploy render --target argo-rollouts --namespace llm` writes for the route
    namespace = template["metadata"]["namespace"]
    assert namespace == rollout["metadata"]["namespace"]
    rendered = urlsplit(analysis_url({"route": args["route"]["value"], "namespace": namespace}))
    assert (url.scheme, url.netloc) == (rendered.scheme, rendered.netloc) == ("http", "unmask-default-analysis.llm.svc")


def test_the_flagger_canary_hooks_call_the_gate_and_the_rollback_endpoints():
    canary = yaml.safe_load((DOCS / "flagger-canary.yaml").read_text())
    hooks = {h["type"]: h for h in canary["spec"]["analysis"]["webhooks"]}
    assert set(hooks) == {"rollout", "confirm-promotion", "rollback"}
    assert (
        urlsplit(hooks["rollout"]["url"]).path
        == urlsplit(hooks["confirm-promotion"]["url"]).path
        == "/v1/unmask/analysis/flagger"
    )
    assert urlsplit(hooks["rollback"]["url"]).path == "/v1/unmask/analysis/flagger/rollback"
    for hook in hooks.values():
        assert urlsplit(hook["url"]).path in PATHS
        assert set(parse_qs(urlsplit(hook["url"]).query)) == {"token"}  # the controller's analysis key
        assert hook["metadata"]["route"] and all(isinstance(v, str) for v in hook["metadata"].values())


def test_the_kserve_canary_percent_is_a_step_of_the_rollout_policy():
    service = yaml.safe_load((DOCS / "kserve-inferenceservice.yaml").read_text())
    percent = service["spec"]["predictor"]["canaryTrafficPercent"]
    assert service["kind"] == "InferenceService" and percent in load_rollout_policy(SERVING_POLICY_PATH).steps


def test_every_documented_manifest_passes_the_controllers_own_checks():
    """Issue 49: the documented Rollout had no selector and no template: Argo's validation refuses it ("Rollout has
    missing field '.spec.selector'"). Each documented manifest now passes the checks the rendered ones pass, the
    Rollout also Argo's admission rules (tests/support/manifest_schemas.py, written from its validation.go)."""
    from tests.support.manifest_schemas import check_manifest, rollout_problems

    documents = [d for f in sorted(DOCS.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    assert {d["kind"] for d in documents} >= {"Rollout", "AnalysisTemplate", "InferenceService"}
    for document in documents:
        if document["kind"] == "Canary":  # Flagger's CRD: its hooks are checked above
            continue
        assert check_manifest(document) == [], (document["kind"], check_manifest(document))
    assert rollout_problems({"spec": {"strategy": {"canary": {"steps": [{"setWeight": 5}]}}}}) == [
        "spec.selector: Rollout has missing field '.spec.selector'",
        "spec.template.spec.containers: Required value",
    ]


def test_the_documented_pods_log_the_route_the_analysis_asks_about_with_their_alias_as_the_candidate():
    """A controller's pods without `--route` log no route or arm, and the analysis judges nothing (inconclusive for
    ever): each documented canary container names the route its analysis asks about, and serves the candidate."""
    template, rollout = yaml.safe_load_all((DOCS / "argo-analysistemplate.yaml").read_text())
    service = yaml.safe_load((DOCS / "kserve-inferenceservice.yaml").read_text())
    argo = {a["name"]: a.get("value") for a in template["spec"]["args"]}
    kserve = parse_qs(urlsplit(service_question(DOCS / "kserve-inferenceservice.yaml")).query)  # its header comment
    for pod, route, candidate in (
        (rollout["spec"]["template"]["spec"], argo["route"], argo["candidate"]),
        (service["spec"]["predictor"], kserve["route"][0], kserve["candidate"][0]),
    ):
        [container] = pod["containers"]
        args = container["args"]
        assert (args[args.index("--route") + 1], args[args.index("--alias") + 1]) == (route, candidate)


def service_question(path) -> str:
    """The analysis a documented KServe pipeline asks (the GET its header comment names)."""
    [line] = [line for line in path.read_text().splitlines() if "GET /v1/unmask/analysis?" in line]
    return line.split("GET ", 1)[1].split()[0]
