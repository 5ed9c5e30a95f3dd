"""Rendered manifests: core kinds validate strictly against the kubernetes client's models, the CRDs against our
reading of their published schemas (tests/support/manifest_schemas.py); each target's own contract besides."""

import copy
import json

import pytest
from typer.testing import CliRunner

from serving.manifests import TARGETS, render
from tests.support.manifest_schemas import check_manifest

ARM = {
    "name": "staging",
    "alias": "staging",
    "model": "m",
    "version": "2",
    "source": "models:/m/2",
    "weights_sha256": "ab" * 32,
}
SPEC = {
    "route": "default",
    "image": "unmask:0.1.0",
    "weight": 25,
    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}},
    "arms": [ARM, {**ARM, "name": "production", "alias": "production", "version": "1"}],
    "steps": [5, 25, 50, 100],
    "interval_s": 60,
    "routes_text": "default: {arm: production}\n",
    "tracking_uri": "http://mlflow.team:5000",
    "request_log_claim": "unmask-requests",  # a controller's split is rendered only with shared evidence
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("arms", [1, 2], ids=["serving", "rollout"])
def test_every_rendered_manifest_validates(target, arms):
    gpu = copy.deepcopy(SPEC) | {"arms": SPEC["arms"][:arms]}
    gpu["resources"]["limits"]["nvidia.com/gpu"] = "1"
    for manifest in render(target, gpu):
        assert check_manifest(manifest) == [], manifest


@pytest.mark.parametrize(
    "kind, edit, problem",
    [
        (
            "Deployment",
            lambda m: m["spec"].update(replica=2),
            "Deployment.spec.replica: not a field of V1DeploymentSpec",
        ),
        ("Deployment", lambda m: m["spec"].update(replicas="2"), "Deployment.spec.replicas: expected int, got str '2'"),
        ("Deployment", lambda m: m["spec"]["template"]["spec"]["containers"][0].pop("name"), "must not be `None`"),
        ("Service", lambda m: m["spec"]["ports"][0].update(port="80"), "Service.spec.ports[0].port: expected int"),
        (
            "Rollout",
            lambda m: m["spec"]["strategy"]["canary"]["steps"][0].update(setWeight="5"),
            "Rollout.spec.strategy.canary.steps[0].setWeight: expected integer, got str '5'",
        ),
        (
            "Rollout",
            lambda m: m["spec"]["strategy"]["canary"].update(stepz=[]),
            "Rollout.spec.strategy.canary.stepz: not a field",
        ),
        (
            "Rollout",
            lambda m: m["spec"]["template"]["spec"]["containers"][0].update(imag="x"),
            "Rollout.spec.template.spec.containers[0].imag: not a field of V1Container",
        ),
        (
            "Rollout",
            lambda m: m["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(cpu="two"),
            "not a resource quantity: 'two'",
        ),
        (
            "AnalysisTemplate",
            lambda m: m["spec"]["metrics"][0].pop("provider"),
            "AnalysisTemplate.spec.metrics[0].provider: required",
        ),
        ("AnalysisTemplate", lambda m: m["spec"]["metrics"][0]["provider"]["web"].pop("url"), "web.url: required"),
        ("InferenceService", lambda m: m["spec"].pop("predictor"), "InferenceService.spec.predictor: required"),
        (
            "InferenceService",
            lambda m: m["spec"]["predictor"].update(canaryTrafficPercent=25.0),
            "canaryTrafficPercent: expected integer, got float",
        ),
        (
            "InferenceService",
            lambda m: m["spec"]["predictor"]["containers"][0]["ports"][0].update(containerPort="8000"),
            "containers[0].ports[0].container_port".replace("container_port", "containerPort") + ": expected int",
        ),
    ],
)
def test_the_checks_refuse_an_unknown_field_a_wrong_type_and_a_missing_required_one(kind, edit, problem):
    manifests = {m["kind"]: m for target in TARGETS for m in render(target, copy.deepcopy(SPEC))}
    manifest = copy.deepcopy(manifests[kind])
    assert check_manifest(manifest) == []
    edit(manifest)
    problems = check_manifest(manifest)
    assert any(problem in p for p in problems), problems


def test_core_kinds_deserialise_into_kubernetes_models():
    from kubernetes.client import ApiClient

    class Response:
        def __init__(self, obj):
            self.data = json.dumps(obj)

    routes, deployment, service = render("k8s", SPEC | {"request_log_claim": None})
    d = ApiClient().deserialize(Response(deployment), "V1Deployment")
    [container] = d.spec.template.spec.containers
    assert container.image == "unmask:0.1.0" and container.env[0].value == "http://mlflow.team:5000"
    # the routes file travels as a ConfigMap the pod mounts, read where the args say (issue 49: it named a host path)
    args = container.args
    [keys, mount], [public, volume] = container.volume_mounts, d.spec.template.spec.volumes
    assert args[args.index("--routes") + 1] == f"{mount.mount_path}/serving.yaml" and mount.name == volume.name
    # the public half of the store's key ring from a ConfigMap: the server verifies the audit chain before it follows
    # a stage alias, and holds no secret that could sign one (no Secret is mounted at all)
    assert (keys.name, public.config_map.name) == ("signing-keys", "unmask-signing-public") and public.secret is None
    assert (container.env[1].name, container.env[1].value) == (
        "UNMASK_SIGNING_PUBLIC_KEYS",
        f"{keys.mount_path}/signing.keys.pub",
    )
    assert "UNMASK_SIGNING_KEY_FILE" not in {e.name for e in container.env}
    c = ApiClient().deserialize(Response(routes), "V1ConfigMap")
    assert volume.config_map.name == c.metadata.name and c.data == {"serving.yaml": SPEC["routes_text"]}
    s = ApiClient().deserialize(Response(service), "V1Service")
    assert s.spec.ports[0].target_port == 8000


def test_the_analysis_template_always_names_both_arms():
    """Issue 49, item 6: with no rollout in flight the URL named neither arm, and at a 100/0 split (the default
    route, every last step) the analysis answers 422: five Errors and Argo aborts the rollout."""
    from urllib.parse import parse_qs, urlsplit

    def arms_named(spec) -> tuple[str, str]:
        template = render("argo-rollouts", spec)[1]
        query = parse_qs(urlsplit(template["spec"]["metrics"][0]["provider"]["web"]["url"]).query)
        return query["candidate"][0], query["baseline"][0]

    assert arms_named(SPEC) == ("staging", "production")  # a rollout in flight: its candidate and baseline
    assert arms_named(SPEC | {"arms": SPEC["arms"][1:]}) == ("candidate", "production")  # none: the next candidate
    alone = SPEC["arms"][0] | {"name": "candidate", "alias": "candidate"}
    assert arms_named(SPEC | {"arms": [alone]}) == ("candidate", "fallback")


def analysis_asked(target: str, spec: dict) -> dict[str, str]:
    """The analysis a controller target's render asks: Argo's AnalysisTemplate URL, KServe's pipeline annotation."""
    from urllib.parse import parse_qs, urlsplit

    if target == "argo-rollouts":
        url = render(target, spec)[1]["spec"]["metrics"][0]["provider"]["web"]["url"]
    else:
        url = render(target, spec)[0]["metadata"]["annotations"]["unmask.dev/analysis"]
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def serve_args(target: str, spec: dict) -> list[str]:
    [container] = [c for m in render(target, spec) for c in containers(m) if c["args"][0] == "serve"]
    return container["args"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("target", ["kserve", "argo-rollouts"])
def test_a_controller_s_pods_log_the_route_and_arms_the_analysis_asks_about(target):
    """A controller splits the traffic between revisions, each `unmask serve --alias A`: without `--route` their rows
    named no route or arm, and the analysis judged nothing (inconclusive for ever). Each revision's pods now log
    the rendered route with their alias as the arm, and the analysis names that route, the canary's alias as the
    candidate and the stable revision's (what the render before the rollout served) as the baseline; by alias, not
    by the routes file's arm name, which a pod never sees."""
    declared = copy.deepcopy(SPEC)
    declared["arms"][0]["name"] = "canary-drill"  # a declared arm of the routes file, serving the alias staging
    stable, canary = serve_args(target, declared | {"arms": declared["arms"][1:]}), serve_args(target, declared)
    asked = analysis_asked(target, declared)
    assert flag(stable, "--route") == flag(canary, "--route") == asked["route"] == "default"
    assert (asked["candidate"], asked["baseline"]) == (flag(canary, "--alias"), flag(stable, "--alias"))
    assert (asked["candidate"], asked["baseline"]) == ("staging", "production")
    for manifest in render(target, declared):
        assert check_manifest(manifest) == [], manifest


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_s_pods_can_share_one_request_log_volume(target):
    """Issue 49, item 3: with a claim, every pod logs to one volume (`--request-log-dir` on it): the router's
    replicas, and a controller's stable and canary revisions, so the analysis reading it judges all of them
    (tests/e2e/test_replicas.py runs that with three processes; tests/integration/test_controller_split.py with a
    stable and a canary server); the rendered analysis reads that volume (`--log-dir`)."""
    if target == "k8s":  # the router alone may log to its own folder; a controller's split is refused so
        assert "--request-log-dir" not in serve_args(target, SPEC | {"request_log_claim": None})
    rendered = render(target, SPEC)
    assert len([c for m in rendered for c in containers(m)]) == (1 if target == "k8s" else 2)
    for manifest in rendered:
        assert check_manifest(manifest) == [], manifest
        for container in containers(manifest):
            pod = pod_of(manifest)
            [mount] = [m for m in container["volumeMounts"] if m["name"] == "requests"]
            logs = "--log-dir" if container["args"][0] == "analysis" else "--request-log-dir"
            assert flag(container["args"], logs) == mount["mountPath"]
            assert {"name": "requests", "persistentVolumeClaim": {"claimName": "unmask-requests"}} in pod["volumes"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_unmask_container_reads_the_evidence_url_from_a_secret(target):
    """Replicas on several machines share their canary evidence through the team PostgreSQL: its URL (password
    included) comes from a Secret as UNMASK_EVIDENCE_URL, never a literal in the manifest or the args."""
    plain = [c for m in render(target, SPEC) for c in containers(m)]
    assert plain and all("UNMASK_EVIDENCE_URL" not in {e["name"] for e in c["env"]} for c in plain)
    secret_only = SPEC | {"request_log_claim": None, "evidence_secret": "unmask-evidence"}
    for manifest in render(target, secret_only):
        assert check_manifest(manifest) == [], manifest
        for c in containers(manifest):  # the serving pods and the analysis alike
            assert "--log-dir" not in c["args"] and "--request-log-dir" not in c["args"]
            [env] = [e for e in c["env"] if e["name"] == "UNMASK_EVIDENCE_URL"]
            assert env == {
                "name": "UNMASK_EVIDENCE_URL",
                "valueFrom": {"secretKeyRef": {"name": "unmask-evidence", "key": "url"}},
            }


@pytest.mark.parametrize("target", TARGETS)
def test_every_unmask_container_is_ready_only_when_its_health_answers(target):
    """A server listens before its models are loaded and answers 503 on /health until then: every unmask container
    (the served arms, the router, the analysis) is probed there on the port it listens on, so no Service or
    controller sends it traffic before it can answer (tests/e2e/test_pod.py waits on the probe's path). Readiness
    only: a liveness probe would restart a pod still loading."""
    served = [c for m in render(target, SPEC) for c in containers(m)]
    assert served
    for container in served:
        probe = container["readinessProbe"]
        assert probe["httpGet"] == {"path": "/health", "port": int(flag(container["args"], "--port"))}
        assert probe["httpGet"]["port"] in {p["containerPort"] for p in container["ports"]}
        assert "livenessProbe" not in container


def by_kind_and_name(manifests: list[dict]) -> dict[tuple[str, str], dict]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def volume_files(pod: dict, container: dict, configmaps: dict[str, dict]) -> dict[str, str]:
    """Each file a container reads from a mounted ConfigMap, by its path in the pod."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {
        f"{mount['mountPath']}/{file}": text
        for mount in container["volumeMounts"]
        if "configMap" in volumes[mount["name"]]
        for file, text in configmaps.get(volumes[mount["name"]]["configMap"]["name"], {}).items()
    }


@pytest.mark.parametrize("target", ["kserve", "argo-rollouts"])
@pytest.mark.parametrize(
    "shared",
    [{}, {"request_log_claim": None, "evidence_secret": "unmask-evidence"}, {"evidence_secret": "unmask-evidence"}],
    ids=["claim", "postgres", "both"],
)
def test_a_controller_s_analysis_is_rendered_where_its_url_points_reading_the_pods_evidence(target, shared):
    """Issue 49: with KServe or Argo alone no router answered the analysis the controller asks (the default URL named
    the k8s target's router), so nothing judged the rollout. The render now writes `unmask analysis serve` beside the
    pods: its routes file (the rollout policy) as a ConfigMap, a Deployment reading the evidence the serving pods
    write (the same claim, the same Secret), behind the controllers' key, and the Service the URL names."""
    from urllib.parse import urlsplit

    spec = SPEC | shared | {"namespace": "llm"}
    spec["resources"] = copy.deepcopy(SPEC["resources"])
    spec["resources"]["limits"]["nvidia.com/gpu"] = "1"
    rendered = render(target, spec)
    for manifest in rendered:
        assert check_manifest(manifest) == [], manifest
        assert manifest["metadata"]["namespace"] == "llm"
    found = by_kind_and_name(rendered)
    deployment, service = found["Deployment", "unmask-default-analysis"], found["Service", "unmask-default-analysis"]
    pod = deployment["spec"]["template"]["spec"]
    [analysis] = pod["containers"]
    served_pod = pod_of(rendered[0])  # the InferenceService's predictor, the Rollout's pod template
    [served] = served_pod["containers"]

    # the URL the controller calls is the Service's, in-cluster and namespaced (Argo calls from its own namespace)
    url = urlsplit(analysis_asked_url(target, spec))
    assert url.netloc == "unmask-default-analysis.llm.svc" and url.path == "/v1/unmask/analysis"
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    [port] = service["spec"]["ports"]
    assert port["port"] == 80 and port["targetPort"] == analysis["ports"][0]["containerPort"]
    assert flag(analysis["args"], "--port") == str(port["targetPort"]) and flag(analysis["args"], "--host") == "0.0.0.0"
    assert analysis["readinessProbe"]["httpGet"] == {"path": "/health", "port": port["targetPort"]}

    # `unmask analysis serve` with the routes file the render read, mounted where its args say
    assert analysis["args"][:2] == ["analysis", "serve"] and "command" not in analysis
    configmaps = {m["metadata"]["name"]: m["data"] for m in rendered if m["kind"] == "ConfigMap"}
    assert volume_files(pod, analysis, configmaps)[flag(analysis["args"], "--routes")] == SPEC["routes_text"]

    # the evidence the serving pods write: the same volume (its folder as --log-dir), the same Secret's URL
    def evidence(container: dict, pod: dict, logs: str) -> tuple:
        volumes = {v["name"]: v for v in pod["volumes"]}
        claims = [
            (volumes[m["name"]]["persistentVolumeClaim"]["claimName"], m["mountPath"], flag(container["args"], logs))
            for m in container["volumeMounts"]
            if "persistentVolumeClaim" in volumes[m["name"]]
        ]
        return claims, [e for e in container["env"] if e["name"] == "UNMASK_EVIDENCE_URL"]

    assert evidence(analysis, pod, "--log-dir") == evidence(served, served_pod, "--request-log-dir")
    claims, urls = evidence(analysis, pod, "--log-dir")
    assert bool(claims) == bool(spec.get("request_log_claim")) and bool(urls) == bool(spec.get("evidence_secret"))

    # the controllers' key: the Secret Argo's template sends as a bearer token is the one the analysis accepts
    [keys] = [e for e in analysis["env"] if e["name"] == "UNMASK_ANALYSIS_KEYS"]
    assert keys["valueFrom"]["secretKeyRef"] == {"name": "unmask-analysis", "key": "token"}
    if target == "argo-rollouts":
        template = found["AnalysisTemplate", "unmask-default-analysis"]
        [token] = [a for a in template["spec"]["args"] if a["name"] == "analysis-token"]
        assert token["valueFrom"] == keys["valueFrom"]

    # it reads no registry and loads no model: no tracking server, no key ring, no GPU
    assert {e["name"] for e in analysis["env"]} <= {"UNMASK_ANALYSIS_KEYS", "UNMASK_EVIDENCE_URL"}
    assert "nvidia.com/gpu" not in analysis["resources"]["limits"]
    assert analysis["resources"]["requests"] == analysis["resources"]["limits"]  # as the serving pods: Guaranteed


def analysis_asked_url(target: str, spec: dict) -> str:
    found = render(target, spec)
    if target == "argo-rollouts":
        return found[1]["spec"]["metrics"][0]["provider"]["web"]["url"]
    return found[0]["metadata"]["annotations"]["unmask.dev/analysis"]


@pytest.mark.parametrize("target", ["kserve", "argo-rollouts"])
def test_an_explicit_analysis_url_is_asked_and_no_analysis_is_rendered(target):
    """Given `--analysis-url`, the team runs the analysis (a router, an `unmask analysis serve` of its own): the
    controller asks that URL and the render adds no second analysis."""
    spec = SPEC | {"analysis_url": "http://unmask-analysis.llm.svc:8010/v1/unmask/analysis"}
    assert analysis_asked_url(target, spec).startswith(spec["analysis_url"] + "?route=default&")
    kinds = [m["kind"] for m in render(target, spec)]
    assert kinds == (["InferenceService"] if target == "kserve" else ["Rollout", "AnalysisTemplate"])


@pytest.mark.parametrize("target", ["kserve", "argo-rollouts"])
def test_a_controller_s_split_without_shared_evidence_is_refused(target):
    """Without a shared volume or the team PostgreSQL each revision's pods log to their own folder: no analysis can
    see both, so it would answer inconclusive for ever. The render refuses, naming both ways to share."""
    with pytest.raises(ValueError, match=f"--target {target}: .* --request-log-claim CLAIM .* --evidence-secret"):
        render(target, SPEC | {"request_log_claim": None})
    assert render("k8s", SPEC | {"request_log_claim": None})  # the router answers the analysis of its own rows


def test_a_bad_namespace_is_refused():
    with pytest.raises(ValueError, match="--namespace 'LLM'"):
        render("k8s", SPEC | {"namespace": "LLM"})


def pod_of(manifest: dict) -> dict:
    """The pod a manifest runs: a KServe predictor, a Rollout's or Deployment's template; {} for the rest."""
    spec = manifest.get("spec", {})
    return spec.get("predictor") or spec.get("template", {}).get("spec", {})


def containers(manifest: dict) -> list[dict]:
    return pod_of(manifest).get("containers", [])


def test_kserve_canary_percent_from_the_rollout_step():
    isvc = render("kserve", SPEC)[0]
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert isvc["spec"]["predictor"]["canaryTrafficPercent"] == 25
    assert isvc["spec"]["predictor"]["containers"][0]["image"] == "unmask:0.1.0"
    assert isvc["metadata"]["annotations"]["unmask.dev/weights-sha256"] == "ab" * 32


def test_argo_rollout_steps_and_analysis_template():
    rollout, template, *_ = render("argo-rollouts", SPEC)
    assert rollout["apiVersion"] == "argoproj.io/v1alpha1" and rollout["kind"] == "Rollout"
    steps = rollout["spec"]["strategy"]["canary"]["steps"]
    assert [s["setWeight"] for s in steps if "setWeight" in s] == [5, 25, 50, 100]
    assert all(
        s["analysis"]["templates"][0]["templateName"] == template["metadata"]["name"] for s in steps if "analysis" in s
    )
    assert rollout["spec"]["selector"]["matchLabels"] == rollout["spec"]["template"]["metadata"]["labels"]
    (metric,) = template["spec"]["metrics"]
    assert metric["provider"]["web"]["jsonPath"] == "{$.verdict}"
    assert (
        "route=default" in metric["provider"]["web"]["url"] and "candidate=staging" in metric["provider"]["web"]["url"]
    )
    assert metric["successCondition"] == 'result == "pass"' and metric["failureCondition"] == 'result == "fail"'
    # each analysis names the canary's revision (the rollout's looks are counted per revision: serving/looks.py)
    assert metric["provider"]["web"]["url"].endswith("&revision={{args.revision}}")
    assert {"name": "revision"} in template["spec"]["args"]
    for step in (s for s in steps if "analysis" in s):
        assert step["analysis"]["args"] == [{"name": "revision", "valueFrom": {"podTemplateHashValue": "Latest"}}]


def test_unknown_target_is_refused():
    with pytest.raises(ValueError, match="--target 'helm'"):
        render("helm", SPEC)


def test_cli_bad_route_and_target_are_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    from flows.cli import _register_all, app

    _register_all()
    r = CliRunner().invoke(app, ["deploy", "render", "--target", "helm"])
    assert r.exit_code == 2 and "error: --target 'helm'" in r.output
    team = ["--tracking-uri", "http://mlflow.team:5000"]
    r = CliRunner().invoke(app, ["deploy", "render", "--target", "k8s", "--route", "nope", *team])
    assert r.exit_code == 2 and "error: --route 'nope'" in r.output
    # a pod cannot open the renderer's store file: the tracking URI the pods get must be a server (issue 49)
    for local in ([], ["--tracking-uri", "sqlite:////srv/mlflow.db"], ["--tracking-uri", "./mlruns"]):
        r = CliRunner().invoke(app, ["deploy", "render", "--target", "k8s", *local])
        assert r.exit_code == 2 and "a pod cannot reach a store on this machine" in r.output, r.output
    # a controller's split with no shared evidence: refused before the registry is read, in one line
    for target in ("kserve", "argo-rollouts"):
        r = CliRunner().invoke(app, ["deploy", "render", "--target", target, *team])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert r.output.startswith(f"error: --target {target}: the stable and the canary pods must log where")


# slow: a real MLflow SQLite registry with two registered versions and an audited alias move
def test_render_reads_the_promoted_version_its_source_and_weights_digest_from_the_registry(tmp_path, monkeypatch):
    import yaml

    from flows.cli import _register_all, app
    from registry.store import Registry
    from tests.support.serving_fixtures import digest, serving_registry

    served = serving_registry(tmp_path / "registry")  # tiny-llada holds production, as a promotion leaves it
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", served.tracking_uri)
    version = served.versions["tiny-llada"]
    source = Registry(served.tracking_uri).client.get_model_version("tiny-llada", version).source
    assert not source.startswith("models:/")  # the version's own source: where it was registered from
    _register_all()
    team = ["--tracking-uri", "http://mlflow.team:5000"]
    for target in TARGETS:
        shared = ["--request-log-claim", "unmask-requests"]
        r = CliRunner().invoke(app, ["deploy", "render", "--target", target, "--gpus", "1", *team, *shared])
        assert r.exit_code == 0, r.output
        manifests = list(yaml.safe_load_all(r.output))
        assert manifests and all(check_manifest(m) == [] for m in manifests), manifests
        annotated = [
            {
                k: v
                for k, v in (
                    m["metadata"].get("annotations") or m["spec"]["template"]["metadata"]["annotations"]
                ).items()
                if k != "unmask.dev/analysis"  # KServe's pipeline question (test_a_controller_s_pods_log_...)
            }
            for m in manifests
            if m["kind"] in ("InferenceService", "Rollout", "Deployment")
            and not m["metadata"]["name"].endswith("-analysis")  # serves no model (test_a_controller_s_analysis_...)
        ]
        assert annotated == [
            {
                "unmask.dev/model": "tiny-llada",
                "unmask.dev/version": version,
                "unmask.dev/source": f"models:/tiny-llada/{version}",  # not `source`: no pod can read it
                "unmask.dev/weights-sha256": digest("tiny-llada"),
            }
        ]
