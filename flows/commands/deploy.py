"""`unmask deploy render --target kserve|argo-rollouts|k8s`: manifests for a route's arms (serving/manifests.py)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn
from urllib.parse import urlparse

import typer
import yaml

deploy_app = typer.Typer(help="Manifests for serving fleets (KServe, Argo Rollouts, Kubernetes).", no_args_is_help=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _warn_unfetchable(arm: str, model: str, version: str, tags: dict[str, str]) -> None:
    """On stderr, when no pod can fetch the version's weights: a folder of the registering machine, never pushed."""
    from registry.weights import unreachable_source

    folder = unreachable_source(model, tags)
    if folder is not None:
        typer.echo(
            f"warning: {arm} ({model} version {version}) loads {folder!r}, a folder of the machine that registered "
            "it, and its weights were not pushed to the registry: the pods cannot fetch them. Push them first: "
            f"unmask weights push {model} {version} --from FOLDER",
            err=True,
        )


@deploy_app.command("render")
def render_command(
    target: str = typer.Option(..., "--target", help="kserve, argo-rollouts or k8s."),
    route: str = typer.Option("default", "--route", help="The serving policy's route."),
    routes: Path = typer.Option(None, "--routes", help="Serving policy (default: gates/serving.yaml)."),
    image: str = typer.Option("unmask:0.1.0", "--image", help="The image built from the repo's Dockerfile."),
    cpu: str = typer.Option("2", "--cpu"),
    memory: str = typer.Option("8Gi", "--memory"),
    gpus: int = typer.Option(0, "--gpus", min=0),
    analysis_url: str = typer.Option(
        None,
        "--analysis-url",
        help="Where the controller (kserve, argo-rollouts) asks for the verdict. Default: the analysis Service this "
        "render writes beside the pods (`unmask analysis serve`, http://unmask-ROUTE-analysis.NAMESPACE.svc/...); "
        "given, that Service is not rendered and the URL's server must read the pods' shared evidence.",
    ),
    namespace: str = typer.Option(
        "default", "--namespace", help="The namespace of every manifest, and of the analysis Service in its URL."
    ),
    out: Path = typer.Option(None, "--out", help="Folder for <kind>-<name>.yaml (default: stdout)."),
    request_log_claim: str = typer.Option(
        None,
        "--request-log-claim",
        help="A PersistentVolumeClaim (ReadWriteMany) every unmask pod writes its request log to (the router's "
        "replicas; with kserve and argo-rollouts the stable and the canary revision's pods), so the canary analysis "
        "reading it judges them all.",
    ),
    evidence_secret: str = typer.Option(
        None,
        "--evidence-secret",
        help="A Secret whose key `url` holds the team PostgreSQL's URL: every unmask container gets it as "
        "$UNMASK_EVIDENCE_URL, so replicas on several machines share their canary evidence (docs/rollout.md).",
    ),
    tracking_uri: str = typer.Option(
        None,
        "--tracking-uri",
        help="The team's mlflow server as the pods reach it (default: the registry this command reads). "
        "A local store (sqlite:, file:, a path) is refused: a pod cannot open a file on this machine.",
    ),
) -> None:
    """Write the manifests for one route's arms, from the serving policy and the registry."""
    from flows.rollout_state import all_states
    from gates.rollout_policy import RolloutPolicyError, load_rollout_policy
    from gates.serving_policy import SERVING_POLICY_PATH, ServingPolicyError, load_serving_policy
    from registry import RegistryError
    from registry.connection import resolve_tracking_uri
    from registry.serving import holder
    from registry.store import Registry, model_tag
    from serving.manifests import TARGETS, check_shared_evidence, render

    if target not in TARGETS:
        _fail(f"--target {target!r}: expected one of {', '.join(TARGETS)}")
    try:
        check_shared_evidence(target, request_log_claim, evidence_secret)
    except ValueError as e:
        _fail(str(e))
    pods_uri = tracking_uri or resolve_tracking_uri()
    if urlparse(pods_uri).scheme.split("+")[0] not in ("http", "https", "postgresql", "mysql"):
        _fail(
            f"--tracking-uri {pods_uri!r}: a pod cannot reach a store on this machine; give the URL of the team's "
            "mlflow server (docs/team-setup.md), e.g. --tracking-uri http://mlflow.team:5000"
        )
    path = routes or SERVING_POLICY_PATH
    try:
        policy = load_serving_policy(path)
        rollout = load_rollout_policy(path)
    except (ServingPolicyError, RolloutPolicyError) as e:
        _fail(str(e))
    spec_route = policy.named(route)
    if spec_route is None:
        _fail(f"--route {route!r}: no such route in {path}; routes: {', '.join(policy.names())}")
    active = [s for s in all_states() if s.route == route and s.active]
    if active:
        names, weight = [active[-1].candidate, active[-1].baseline], active[-1].weight
    else:
        names, weight = [max(spec_route.split, key=lambda aw: aw[1])[0]], 100
    registry = Registry()
    arms = []
    for name in names:
        alias = (policy.declared[name].alias if name in policy.declared else None) or name
        try:
            at = holder(registry, alias)
        except RegistryError as e:
            _fail(f"route {route!r} arm {name!r}: {e}")
        if at is None:
            _fail(f"route {route!r} arm {name!r}: no version holds the alias {alias!r}")
        model, version = at
        tags = registry.version_tags(model, version)
        _warn_unfetchable(f"route {route!r} arm {name!r}", model, version, tags)
        source = registry.client.get_model_version(model, version).source
        arms.append(
            {
                "name": name,
                "alias": alias,
                "model": model,
                "version": version,
                "source": source,
                "weights_sha256": tags.get(model_tag("weights_sha256"), ""),
            }
        )
    resources = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
    spec = {
        "route": route,
        "image": image,
        "resources": resources,
        "weight": weight,
        "arms": arms,
        "steps": list(rollout.steps),
        "interval_s": rollout.interval_s,
        "analysis_url": analysis_url,
        "namespace": namespace,
        "routes_text": Path(path).read_text(),
        "tracking_uri": pods_uri,
        "request_log_claim": request_log_claim,
        "evidence_secret": evidence_secret,
    }
    try:
        manifests = render(target, spec)
    except ValueError as e:
        _fail(str(e))
    if out is None:
        typer.echo(yaml.safe_dump_all(manifests, sort_keys=False), nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for m in manifests:
        file = out / f"{m['kind'].lower()}-{m['metadata']['name']}.yaml"
        file.write_text(yaml.safe_dump(m, sort_keys=False))
        typer.echo(str(file))


def register(app: typer.Typer) -> None:
    app.add_typer(deploy_app, name="deploy")
