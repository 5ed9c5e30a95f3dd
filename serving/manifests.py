"""Manifests for serving fleets, rendered from a route's arms: KServe, Argo Rollouts, plain Kubernetes.

Pure: `render(target, spec)` takes a plain `spec` dict and returns a list of manifest dicts; no I/O. `spec`:
route, image, resources ({requests, limits}), weight (the candidate's % at the current rollout step),
steps (the rollout policy's), interval_s, routes_text (the routes file, mounted from a ConfigMap), tracking_uri (the
team's mlflow server, as the pods reach it), namespace (optional, default `default`: every manifest's, and the
analysis Service's in its URL), analysis_url (optional: a /v1/unmask/analysis some other server answers),
request_log_claim (optional: a PersistentVolumeClaim every unmask pod logs to), evidence_secret (optional: a
Secret whose key `url` is the team PostgreSQL's URL, given to every unmask container as UNMASK_EVIDENCE_URL), and
arms: [{name, alias, model, version, source, weights_sha256}] with the candidate first and the baseline second
when a rollout is in flight (else the route's one serving arm).

Where the controller splits the traffic (kserve, argo-rollouts), each revision's pods serve one alias with
`--route R`, so their request rows name route R and their alias as the arm: the analysis the render asks about
names the same route, and the aliases the canary and the stable pods serve. Those pods hold no routes file, so no
rollout policy: unless `analysis_url` names another server, the render adds the analysis itself (`unmask analysis
serve` as a Deployment, its routes ConfigMap and a Service, which the controller's URL names). The evidence reaches
the analysis only when shared (the claim's volume or the evidence secret), so these targets refuse to render
without either: each pod on its own folder leaves the analysis inconclusive for ever.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from serving.access import ANALYSIS_KEYS_ENV, ANALYSIS_PATH

TARGETS = ("kserve", "argo-rollouts", "k8s")
SPLIT_TARGETS = ("kserve", "argo-rollouts")  # the controller splits the traffic; unmask only judges it
NAMESPACE = "default"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # what Kubernetes accepts as a namespace
PORT = 8000
ROUTES_MOUNT, ROUTES_FILE = "/etc/unmask/routes", "serving.yaml"  # where the router's pod reads its routes
REQUESTS_MOUNT = "/var/lib/unmask/shared/requests"  # the request log on a volume every replica mounts
# the public half of the store's key ring (UNMASK_SIGNING_PUBLIC_KEYS): a serving pod verifies, it never signs, so it
# holds no secret: kubectl create configmap unmask-signing-public --from-file=signing.keys.pub=<the ring's .pub>
KEYS_MOUNT, KEYS_FILE, KEYS_CONFIGMAP = "/etc/unmask/keys", "signing.keys.pub", "unmask-signing-public"
# kubectl create secret generic unmask-analysis --from-literal=token=<key>: Argo sends it, the analysis accepts it
ANALYSIS_SECRET, ANALYSIS_TOKEN = "unmask-analysis", "token"
# canary evidence shared by replicas on several machines: kubectl create secret generic unmask-evidence
# --from-literal=url=postgresql://USER:PASSWORD@HOST:5432/DATABASE (the password stays in the Secret, never in args)
EVIDENCE_ENV, EVIDENCE_KEY = "UNMASK_EVIDENCE_URL", "url"
ANALYSIS_ANNOTATION = "unmask.dev/analysis"  # KServe: the analysis the pipeline asks between canary steps
# `unmask analysis serve` reads the routes file and the evidence, never the registry: no model, no GPU, no key ring
# (idle about 0.5 GiB resident; a call reads one window of rows)
ANALYSIS_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}


def _name(route: str) -> str:
    return f"unmask-{route}".lower().replace("_", "-")


def _annotations(arm: dict[str, Any]) -> dict[str, str]:
    """What a pod serves, as the registry names it: `models:/M/V` resolves through the tracking server from any
    pod (the version's own source is a path on the machine that registered it)."""
    return {
        "unmask.dev/model": str(arm["model"]),
        "unmask.dev/version": str(arm["version"]),
        "unmask.dev/source": f"models:/{arm['model']}/{arm['version']}",
        "unmask.dev/weights-sha256": str(arm["weights_sha256"]),
    }


def _container(spec: dict[str, Any], args: list[str], name: str = "unmask") -> dict[str, Any]:
    """One serving container: the team's tracking server, and the public half of the store's signing key ring from a
    ConfigMap (a server verifies the audit chain before it follows a stage alias, and signs nothing: a pod holds no
    key that could forge an entry; docs/integrity.md)."""
    env: list[dict[str, Any]] = [
        {"name": "MLFLOW_TRACKING_URI", "value": spec["tracking_uri"]},
        {"name": "UNMASK_SIGNING_PUBLIC_KEYS", "value": f"{KEYS_MOUNT}/{KEYS_FILE}"},
    ]
    return {
        "name": name,
        "image": spec["image"],
        "args": args,
        "ports": [{"containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": [{"name": "signing-keys", "mountPath": KEYS_MOUNT, "readOnly": True}],
        "resources": spec["resources"],
        "readinessProbe": _readiness(),
    }


def _readiness() -> dict[str, Any]:
    """Ready once `/health` answers 200: a server loads its models after it starts listening and answers 503 until then
    (or when the load failed), so no traffic reaches a pod that cannot answer yet. Readiness only: a liveness probe on
    the same path would restart a pod still loading a large checkpoint."""
    return {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10}


def _volumes() -> list[dict[str, Any]]:
    return [{"name": "signing-keys", "configMap": {"name": KEYS_CONFIGMAP}}]


def _serve_args(alias: str, route: str) -> list[str]:
    """One arm of a controller's split: the alias it serves, logged as the arm of `route` (`--route`). The image's
    ENTRYPOINT is `unmask` (Dockerfile), so the args start at the sub-command."""
    return ["serve", "--alias", alias, "--route", route, "--host", "0.0.0.0", "--port", str(PORT)]


def _shared_evidence(
    spec: dict[str, Any], container: dict[str, Any], volumes: list[dict[str, Any]], flag: str = "--request-log-dir"
) -> None:
    """The evidence every unmask pod shares, so the analysis judges every replica and revision together: with a claim,
    one volume every pod mounts (a server logs there, `--request-log-dir`; the analysis reads it, `--log-dir`); with
    `evidence_secret`, the team PostgreSQL's URL from that Secret."""
    if spec.get("request_log_claim"):
        container["args"] += [flag, REQUESTS_MOUNT]
        container["volumeMounts"].append({"name": "requests", "mountPath": REQUESTS_MOUNT})
        volumes.append({"name": "requests", "persistentVolumeClaim": {"claimName": spec["request_log_claim"]}})
    if spec.get("evidence_secret"):
        secret = {"name": spec["evidence_secret"], "key": EVIDENCE_KEY}
        container["env"].append({"name": EVIDENCE_ENV, "valueFrom": {"secretKeyRef": secret}})


def check_shared_evidence(target: str, request_log_claim: str | None, evidence_secret: str | None) -> None:
    """A controller's split needs evidence the analysis shares: raise ValueError naming the two ways to give it."""
    if target in SPLIT_TARGETS and not (request_log_claim or evidence_secret):
        raise ValueError(
            f"--target {target}: the stable and the canary pods must log where the analysis reads: give "
            "--request-log-claim CLAIM (a ReadWriteMany volume every pod mounts) or --evidence-secret SECRET (the "
            "team PostgreSQL's URL); each pod on its own folder leaves the analysis inconclusive for ever"
        )


def kserve(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One InferenceService: the predictor serves the candidate; KServe keeps the last revision for the rest. The
    annotation `unmask.dev/analysis` is the question the pipeline asks between steps (it adds `&revision=`)."""
    arm = spec["arms"][0]
    container, volumes = _container(spec, _serve_args(arm["alias"], spec["route"]), "kserve-container"), _volumes()
    _shared_evidence(spec, container, volumes)
    predictor: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if len(spec["arms"]) > 1:
        predictor["canaryTrafficPercent"] = int(spec["weight"])
    annotations = _annotations(arm) | {ANALYSIS_ANNOTATION: _analysis_query(spec)}
    return [
        {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": _name(spec["route"]), "annotations": annotations},
            "spec": {"predictor": predictor},
        },
        *_analysis_service(spec),
    ]


def _analysis_query(spec: dict[str, Any]) -> str:
    """The analysis of a controller's split, always naming both arms as the pods log them (`--route`: the alias
    each revision serves): a rollout's candidate and baseline; with none in flight, the `candidate` alias (what the
    next revision is to serve) against the alias the pods serve now. Left to the route's split, a 100/0 step names
    one live arm and the analysis answers 422: an Error at every last step."""
    if len(spec["arms"]) > 1:
        candidate, baseline = spec["arms"][0]["alias"], spec["arms"][1]["alias"]
    else:
        serving = spec["arms"][0]["alias"]
        candidate, baseline = "candidate", serving if serving != "candidate" else "fallback"
    query = {"route": spec["route"], "candidate": candidate, "baseline": baseline}
    query["window_s"] = str(int(spec["interval_s"]))
    return f"{analysis_url(spec)}?{urlencode(query)}"


def analysis_url(spec: dict[str, Any]) -> str:
    """Where the controller asks: the given `analysis_url`, else the rendered analysis Service, by its in-cluster name
    (Argo's web provider calls from the controller's own namespace, so a bare Service name would not resolve)."""
    namespace = spec.get("namespace") or NAMESPACE
    return spec.get("analysis_url") or f"http://{_name(spec['route'])}-analysis.{namespace}.svc{ANALYSIS_PATH}"


def _analysis_url(spec: dict[str, Any]) -> str:
    """The Rollout's analysis, with the rollout's identity for its looks (serving/looks.py): the canary's
    pod-template hash, an argument of the analysis step, substituted by Argo (so written out, not URL-encoded)."""
    return f"{_analysis_query(spec)}&revision={{{{args.revision}}}}"


def argo_rollouts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A Rollout stepping through the policy's weights, each step judged by unmask's analysis endpoint."""
    name, arm = _name(spec["route"]), spec["arms"][0]
    container, volumes = _container(spec, _serve_args(arm["alias"], spec["route"])), _volumes()
    _shared_evidence(spec, container, volumes)
    steps: list[dict[str, Any]] = []
    for weight in spec["steps"]:
        steps.append({"setWeight": int(weight)})
        steps.append({"pause": {"duration": f"{int(spec['interval_s'])}s"}})
        revision = {"name": "revision", "valueFrom": {"podTemplateHashValue": "Latest"}}
        steps.append({"analysis": {"templates": [{"templateName": f"{name}-analysis"}], "args": [revision]}})
    rollout = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name, "annotations": _annotations(arm)},
        "spec": {
            "replicas": int(spec.get("replicas", 1)),
            "selector": {"matchLabels": _labels(name)},
            "template": {
                "metadata": {"labels": _labels(name)},
                "spec": {"containers": [container], "volumes": volumes},
            },
            "strategy": {"canary": {"steps": steps}},
        },
    }
    # the controller's analysis key (serving/access.py), read from a Secret the team creates, sent as a header
    token = {"name": "analysis-token", "valueFrom": {"secretKeyRef": {"name": ANALYSIS_SECRET, "key": ANALYSIS_TOKEN}}}
    web = {
        "url": _analysis_url(spec),
        "headers": [{"key": "Authorization", "value": "Bearer {{args.analysis-token}}"}],
        "jsonPath": "{$.verdict}",
    }
    template = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisTemplate",
        "metadata": {"name": f"{name}-analysis"},
        "spec": {
            "args": [{"name": "revision"}, token],  # revision: required, given by each analysis step
            "metrics": [
                {
                    "name": "unmask-verdict",
                    "count": 1,
                    "successCondition": 'result == "pass"',
                    "failureCondition": 'result == "fail"',
                    "provider": {"web": web},
                }
            ],
        },
    }
    return [rollout, template, *_analysis_service(spec)]


def _analysis_service(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """`unmask analysis serve` for a controller's split: the routes file (the rollout policy it judges by) as a
    ConfigMap, a Deployment reading the evidence the serving pods share, behind the controllers' keys
    ($UNMASK_ANALYSIS_KEYS from the Secret Argo's template also reads), and the Service `analysis_url` names. None
    when `analysis_url` names another server."""
    if spec.get("analysis_url"):
        return []
    name = _name(spec["route"]) + "-analysis"
    routes, volume, mount = _routes(name, spec)
    args = ["analysis", "serve", "--routes", f"{ROUTES_MOUNT}/{ROUTES_FILE}", "--host", "0.0.0.0", "--port", str(PORT)]
    keys = {"name": ANALYSIS_KEYS_ENV, "valueFrom": {"secretKeyRef": {"name": ANALYSIS_SECRET, "key": ANALYSIS_TOKEN}}}
    container = {
        "name": "unmask-analysis",
        "image": spec["image"],
        "args": args,
        "ports": [{"containerPort": PORT, "protocol": "TCP"}],
        "env": [keys],
        "volumeMounts": [mount],
        "resources": {need: dict(amounts) for need, amounts in ANALYSIS_RESOURCES.items()},
        "readinessProbe": _readiness(),
    }
    volumes = [volume]
    _shared_evidence(spec, container, volumes, flag="--log-dir")
    return [routes, _deployment(name, 1, {"containers": [container], "volumes": volumes}), _service(name)]


def _routes(name: str, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The routes file as a ConfigMap, the pod's volume of it and the container's mount (at ROUTES_MOUNT): the
    renderer's path means nothing in a pod."""
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-routes", "labels": _labels(name)},
        "data": {ROUTES_FILE: spec["routes_text"]},
    }
    volume = {"name": "routes", "configMap": {"name": f"{name}-routes"}}
    return configmap, volume, {"name": "routes", "mountPath": ROUTES_MOUNT, "readOnly": True}


def _deployment(
    name: str, replicas: int, pod: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"labels": _labels(name)}, "spec": pod}
    if annotations:
        template["metadata"]["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {"replicas": replicas, "selector": {"matchLabels": _labels(name)}, "template": template},
    }


def _service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(name)},
        "spec": {"selector": _labels(name), "ports": [{"name": "http", "port": 80, "targetPort": PORT}]},
    }


def _labels(name: str) -> dict[str, str]:
    """A fresh mapping each time: one object shared in a manifest is dumped as a YAML anchor and alias."""
    return {"app": name}


def k8s(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The unmask router (`unmask serve --routes`) as a Deployment and a Service, its routes file a ConfigMap the
    pod mounts; the router answers the analysis itself."""
    name = _name(spec["route"]) + "-router"
    routes, volume, mount = _routes(name, spec)
    args = ["serve", "--routes", f"{ROUTES_MOUNT}/{ROUTES_FILE}", "--host", "0.0.0.0", "--port", str(PORT)]
    volumes = [*_volumes(), volume]
    container = _container(spec, args)
    container["volumeMounts"].append(mount)
    _shared_evidence(spec, container, volumes)
    pod = {"containers": [container], "volumes": volumes}
    deployment = _deployment(name, int(spec.get("replicas", 1)), pod, _annotations(spec["arms"][0]))
    return [routes, deployment, _service(name)]


RENDERERS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "kserve": kserve,
    "argo-rollouts": argo_rollouts,
    "k8s": k8s,
}


def render(target: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifests of `target` for `spec`, each in `spec`'s namespace; ValueError naming the flag that is wrong."""
    if target not in RENDERERS:
        raise ValueError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    check_shared_evidence(target, spec.get("request_log_claim"), spec.get("evidence_secret"))
    namespace = spec.get("namespace") or NAMESPACE
    if not _DNS_LABEL.fullmatch(namespace):
        raise ValueError(f"--namespace {namespace!r}: expected a DNS label (lower-case letters, digits, '-')")
    manifests = RENDERERS[target](spec)
    for manifest in manifests:  # the namespace the analysis URL names, right after each manifest's name
        meta = manifest["metadata"]
        manifest["metadata"] = {"name": meta["name"], "namespace": namespace} | meta
    return manifests
