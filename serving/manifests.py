"""Manifests for serving fleets, rendered from a route's arms: KServe, Argo Rollouts, plain Kubernetes.

Pure: `render(target, spec)` takes a plain `spec` dict and returns a list of manifest dicts; no I/O. `spec`:
route, image, resources ({requests, limits}), weight (the candidate's % at the current rollout step),
steps (the rollout policy's), interval_s, analysis_url (unmask's /v1/unmask/analysis), routes_text (the
routes file, mounted from a ConfigMap), tracking_uri (the team's mlflow server, as the pods reach it),
request_log_claim (optional: a PersistentVolumeClaim every unmask pod logs to), evidence_secret (optional: a
Secret whose key `url` is the team PostgreSQL's URL, given to every unmask container as UNMASK_EVIDENCE_URL), and
arms: [{name, alias, model, version, source, weights_sha256}] with the candidate first and the baseline second
when a rollout is in flight (else the route's one serving arm).

Where the controller splits the traffic (kserve, argo-rollouts), each revision's pods serve one alias with
`--route R`, so their request rows name route R and their alias as the arm: the analysis the render asks about
names the same route, and the aliases the canary and the stable pods serve. The evidence reaches one analysis
only when shared: the claim's volume or the evidence secret, for every target alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

TARGETS = ("kserve", "argo-rollouts", "k8s")
PORT = 8000
ROUTES_MOUNT, ROUTES_FILE = "/etc/unmask/routes", "serving.yaml"  # where the router's pod reads its routes
REQUESTS_MOUNT = "/var/lib/unmask/shared/requests"  # the request log on a volume every replica mounts
# the public half of the store's key ring (UNMASK_SIGNING_PUBLIC_KEYS): a serving pod verifies, it never signs, so it
# holds no secret: kubectl create configmap unmask-signing-public --from-file=signing.keys.pub=<the ring's .pub>
KEYS_MOUNT, KEYS_FILE, KEYS_CONFIGMAP = "/etc/unmask/keys", "signing.keys.pub", "unmask-signing-public"
ANALYSIS_SECRET = "unmask-analysis"  # kubectl create secret generic unmask-analysis --from-literal=token=<key>
# canary evidence shared by replicas on several machines: kubectl create secret generic unmask-evidence
# --from-literal=url=postgresql://USER:PASSWORD@HOST:5432/DATABASE (the password stays in the Secret, never in args)
EVIDENCE_ENV, EVIDENCE_KEY = "UNMASK_EVIDENCE_URL", "url"
ANALYSIS_ANNOTATION = "unmask.dev/analysis"  # KServe: the analysis the pipeline asks between canary steps


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
    """One unmask container: the team's tracking server, and the public half of the store's signing key ring from a
    ConfigMap (a server verifies the audit chain before it follows a stage alias, and signs nothing: a pod holds no
    key that could forge an entry; docs/integrity.md); with `evidence_secret`, the evidence store's URL from it."""
    env: list[dict[str, Any]] = [
        {"name": "MLFLOW_TRACKING_URI", "value": spec["tracking_uri"]},
        {"name": "UNMASK_SIGNING_PUBLIC_KEYS", "value": f"{KEYS_MOUNT}/{KEYS_FILE}"},
    ]
    if spec.get("evidence_secret"):
        secret = {"name": spec["evidence_secret"], "key": EVIDENCE_KEY}
        env.append({"name": EVIDENCE_ENV, "valueFrom": {"secretKeyRef": secret}})
    return {
        "name": name,
        "image": spec["image"],
        "args": args,
        "ports": [{"containerPort": PORT, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": [{"name": "signing-keys", "mountPath": KEYS_MOUNT, "readOnly": True}],
        "resources": spec["resources"],
    }


def _volumes() -> list[dict[str, Any]]:
    return [{"name": "signing-keys", "configMap": {"name": KEYS_CONFIGMAP}}]


def _serve_args(alias: str, route: str) -> list[str]:
    """One arm of a controller's split: the alias it serves, logged as the arm of `route` (`--route`). The image's
    ENTRYPOINT is `unmask` (Dockerfile), so the args start at the sub-command."""
    return ["serve", "--alias", alias, "--route", route, "--host", "0.0.0.0", "--port", str(PORT)]


def _shared_requests(spec: dict[str, Any], container: dict[str, Any], volumes: list[dict[str, Any]]) -> None:
    """With a claim, the pod logs to one volume every pod mounts (`--request-log-dir` on it), so the analysis judges
    the requests of every replica and revision together."""
    if spec.get("request_log_claim"):
        container["args"] += ["--request-log-dir", REQUESTS_MOUNT]
        container["volumeMounts"].append({"name": "requests", "mountPath": REQUESTS_MOUNT})
        volumes.append({"name": "requests", "persistentVolumeClaim": {"claimName": spec["request_log_claim"]}})


def kserve(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One InferenceService: the predictor serves the candidate; KServe keeps the last revision for the rest. The
    annotation `unmask.dev/analysis` is the question the pipeline asks between steps (it adds `&revision=`)."""
    arm = spec["arms"][0]
    container, volumes = _container(spec, _serve_args(arm["alias"], spec["route"]), "kserve-container"), _volumes()
    _shared_requests(spec, container, volumes)
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
        }
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
    return f"{spec['analysis_url']}?{urlencode(query)}"


def _analysis_url(spec: dict[str, Any]) -> str:
    """The Rollout's analysis, with the rollout's identity for its looks (serving/looks.py): the canary's
    pod-template hash, an argument of the analysis step, substituted by Argo (so written out, not URL-encoded)."""
    return f"{_analysis_query(spec)}&revision={{{{args.revision}}}}"


def argo_rollouts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A Rollout stepping through the policy's weights, each step judged by unmask's analysis endpoint."""
    name, arm = _name(spec["route"]), spec["arms"][0]
    container, volumes = _container(spec, _serve_args(arm["alias"], spec["route"])), _volumes()
    _shared_requests(spec, container, volumes)
    labels = {"app": name}
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
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [container], "volumes": volumes},
            },
            "strategy": {"canary": {"steps": steps}},
        },
    }
    # the controller's analysis key (serving/access.py), read from a Secret the team creates, sent as a header
    token = {"name": "analysis-token", "valueFrom": {"secretKeyRef": {"name": ANALYSIS_SECRET, "key": "token"}}}
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
    return [rollout, template]


def k8s(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The unmask router (`unmask serve --routes`) as a Deployment and a Service, its routes file a ConfigMap the
    pod mounts (the renderer's path means nothing in a pod)."""
    name = _name(spec["route"]) + "-router"
    labels = {"app": name}
    routes = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-routes", "labels": labels},
        "data": {ROUTES_FILE: spec["routes_text"]},
    }
    args = ["serve", "--routes", f"{ROUTES_MOUNT}/{ROUTES_FILE}", "--host", "0.0.0.0", "--port", str(PORT)]
    volumes = [*_volumes(), {"name": "routes", "configMap": {"name": f"{name}-routes"}}]
    container = _container(spec, args)
    container["volumeMounts"].append({"name": "routes", "mountPath": ROUTES_MOUNT, "readOnly": True})
    _shared_requests(spec, container, volumes)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": int(spec.get("replicas", 1)),
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": _annotations(spec["arms"][0])},
                "spec": {
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": PORT}]},
    }
    return [routes, deployment, service]


RENDERERS: dict[str, Callable[[dict[str, Any]], list[dict[str, Any]]]] = {
    "kserve": kserve,
    "argo-rollouts": argo_rollouts,
    "k8s": k8s,
}


def render(target: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    if target not in RENDERERS:
        raise ValueError(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    return RENDERERS[target](spec)
