"""Strict checks of rendered manifests, with no cluster: core kinds against the `kubernetes` client's models,
the CRDs against our own reading of their published OpenAPI schemas.

Core kinds: every key must be a field of the model (`attribute_map`), every value of the model's type
(`openapi_types`), and the whole must deserialise (the models refuse a missing required field).

CRDs: written here, by hand, from the `openAPIV3Schema` of the published definitions (read, not copied):
argo-rollouts `manifests/crds/rollout-crd.yaml` and `analysis-template-crd.yaml` (v1alpha1, commit 9f8d111),
kserve `config/crd/full/serving.kserve.io_inferenceservices.yaml` (v1beta1, commit aaac4e2). Only the paths
unmask renders are listed, with their types and the fields required beside them; a rendered field that is not
listed is refused, so a new field means reading its schema first. Where a CRD embeds a core type (a pod
template's containers) the core check takes over.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def check_core(value: Any, type_name: str, path: str = "") -> list[str]:
    """Problems of `value` as the kubernetes model `type_name` (e.g. "V1Deployment"), each naming its path."""
    problems = _core_fields(value, type_name, path)
    if not problems:

        class Response:
            data = json.dumps(value)

        try:
            k8s.ApiClient().deserialize(Response(), type_name)
        except ValueError as e:  # a required field missing, an enum value unknown
            problems.append(f"{path or type_name}: {e}")
    return problems


def _core_fields(value: Any, type_name: str, path: str) -> list[str]:
    list_of = re.fullmatch(r"list\[(.+)\]", type_name)
    dict_of = re.fullmatch(r"dict\[str, (.+)\]", type_name)
    if list_of:
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        return [p for i, item in enumerate(value) for p in _core_fields(item, list_of[1], f"{path}[{i}]")]
    if dict_of:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        return [p for k, item in value.items() for p in _core_fields(item, dict_of[1], f"{path}.{k}")]
    simple = {
        "str": str,
        "int": int,
        "bool": bool,
        "float": (int, float),
        "datetime": str,
        "object": (int, str, dict, list),
    }
    if type_name in simple:
        ok = isinstance(value, simple[type_name]) and not (type_name == "int" and isinstance(value, bool))
        return [] if ok else [f"{path}: expected {type_name}, got {type(value).__name__} {value!r}"]
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected a {type_name} mapping, got {type(value).__name__}"]
    attribute = {key: attr for attr, key in model.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in attribute:
            problems.append(f"{path}.{key}: not a field of {type_name}")
        else:
            problems += _core_fields(item, model.openapi_types[attribute[key]], f"{path}.{key}")
    return problems


@dataclass(frozen=True)
class Obj:
    """An object: its listed fields (each a schema) and those required; anything else is refused."""

    fields: dict[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Arr:
    item: Any


@dataclass(frozen=True)
class Map:
    """A map of free keys (labels, annotations, resource quantities), each value of one schema."""

    value: Any


@dataclass(frozen=True)
class Core:
    """A core Kubernetes type embedded in a CRD: checked by `check_core`."""

    type_name: str


def check_crd(value: Any, schema: Any, path: str = "") -> list[str]:
    """Problems of `value` against one of the schemas below, each naming its path."""
    if isinstance(schema, Core):
        return _core_fields(value, schema.type_name, path)
    if isinstance(schema, Obj):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        problems = [f"{path}.{key}: required" for key in schema.required if key not in value]
        for key, item in value.items():
            if key not in schema.fields:
                problems.append(f"{path}.{key}: not a field unmask's reading of the schema knows")
            else:
                problems += check_crd(item, schema.fields[key], f"{path}.{key}")
        return problems
    if isinstance(schema, Arr):
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {type(value).__name__}"]
        return [p for i, item in enumerate(value) for p in check_crd(item, schema.item, f"{path}[{i}]")]
    if isinstance(schema, Map):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {type(value).__name__}"]
        return [p for key, item in value.items() for p in check_crd(item, schema.value, f"{path}.{key}")]
    ok = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "int-or-string": lambda v: isinstance(v, (int, str)) and not isinstance(v, bool),
        "quantity": lambda v: isinstance(v, (int, str)) and not isinstance(v, bool) and bool(QUANTITY.match(str(v))),
    }[schema](value)
    return [] if ok else [f"{path}: expected {schema}, got {type(value).__name__} {value!r}"]


# The object metadata a CRD leaves to the API server (ObjectMeta): the fields unmask writes.
METADATA = Obj(
    {"name": "string", "namespace": "string", "labels": Map("string"), "annotations": Map("string")},
    required=("name",),
)
POD_TEMPLATE = Obj(
    {"metadata": Obj({"labels": Map("string"), "annotations": Map("string")}), "spec": Core("V1PodSpec")}
)

ROLLOUT = Obj(
    {
        "apiVersion": "string",
        "kind": "string",
        "metadata": METADATA,
        "spec": Obj(
            {
                "replicas": "integer",
                "selector": Obj({"matchLabels": Map("string")}),
                "template": POD_TEMPLATE,
                "strategy": Obj(
                    {
                        "canary": Obj(
                            {
                                "steps": Arr(
                                    Obj(
                                        {
                                            "setWeight": "integer",
                                            "pause": Obj({"duration": "int-or-string"}),
                                            "analysis": Obj(
                                                {
                                                    "templates": Arr(Obj({"templateName": "string"})),
                                                    "args": Arr(
                                                        Obj(
                                                            {
                                                                "name": "string",
                                                                "value": "string",
                                                                "valueFrom": Obj({"podTemplateHashValue": "string"}),
                                                            },
                                                            required=("name",),
                                                        )
                                                    ),
                                                }
                                            ),
                                        }
                                    )
                                )
                            }
                        )
                    }
                ),
            }
        ),
    },
    required=("spec",),
)

ANALYSIS_TEMPLATE = Obj(
    {
        "apiVersion": "string",
        "kind": "string",
        "metadata": METADATA,
        "spec": Obj(
            {
                # args: a name, and a value or where to read it (a Secret's key here); required ones lack both
                "args": Arr(
                    Obj(
                        {
                            "name": "string",
                            "value": "string",
                            "valueFrom": Obj(
                                {"secretKeyRef": Obj({"name": "string", "key": "string"}, required=("name", "key"))}
                            ),
                        },
                        required=("name",),
                    )
                ),
                "metrics": Arr(
                    Obj(
                        {
                            "name": "string",
                            "count": "int-or-string",
                            "interval": "string",
                            "failureLimit": "int-or-string",
                            "inconclusiveLimit": "int-or-string",
                            "successCondition": "string",
                            "failureCondition": "string",
                            "provider": Obj(
                                {
                                    "web": Obj(
                                        {
                                            "url": "string",
                                            "jsonPath": "string",
                                            "timeoutSeconds": "integer",
                                            "headers": Arr(
                                                Obj({"key": "string", "value": "string"}, required=("key", "value"))
                                            ),
                                        },
                                        required=("url",),
                                    )
                                }
                            ),
                        },
                        required=("name", "provider"),
                    )
                ),
            }
        ),
    },
    required=("spec",),
)

INFERENCE_SERVICE = Obj(
    {
        "apiVersion": "string",
        "kind": "string",
        "metadata": METADATA,
        "spec": Obj(
            {
                "predictor": Obj(
                    {
                        "canaryTrafficPercent": "integer",
                        "containers": Arr(Core("V1Container")),
                        "volumes": Arr(Core("V1Volume")),
                    }
                )
            },
            required=("predictor",),
        ),
    },
    required=("spec",),
)

# apiVersion and kind -> how to check it
KINDS = {
    ("apps/v1", "Deployment"): Core("V1Deployment"),
    ("v1", "Service"): Core("V1Service"),
    ("v1", "ConfigMap"): Core("V1ConfigMap"),
    ("argoproj.io/v1alpha1", "Rollout"): ROLLOUT,
    ("argoproj.io/v1alpha1", "AnalysisTemplate"): ANALYSIS_TEMPLATE,
    ("serving.kserve.io/v1beta1", "InferenceService"): INFERENCE_SERVICE,
}


def rollout_problems(rollout: dict[str, Any]) -> list[str]:
    """What Argo Rollouts' admission refuses in a Rollout, for the fields unmask writes: the rules of
    argo-rollouts' pkg/apis/rollouts/validation/validation.go (ValidateRolloutSpec, ValidateRolloutStrategy,
    ValidateRolloutStrategyCanary, hasMultipleStepsType; read at commit 9f8d111d8), in its words where it has them."""
    spec, problems = rollout.get("spec") or {}, []
    selector, template = spec.get("selector"), spec.get("template") or {}
    if spec.get("workloadRef") is None:
        if selector is None:
            problems.append("spec.selector: Rollout has missing field '.spec.selector'")
        elif not (selector.get("matchLabels") or selector.get("matchExpressions")):
            problems.append("spec.selector: empty selector is invalid for deployment")
        labels = (template.get("metadata") or {}).get("labels") or {}
        if selector and any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
            problems.append("spec.template.metadata.labels: `selector` does not match template `labels`")
        if not ((template.get("spec") or {}).get("containers")):
            problems.append("spec.template.spec.containers: Required value")
    elif template:
        problems.append("spec.template: template must be empty for workload reference rollout")
    for name in ("replicas", "minReadySeconds", "revisionHistoryLimit", "progressDeadlineSeconds"):
        if isinstance(spec.get(name), int) and spec[name] < 0:
            problems.append(f"spec.{name}: must be greater than or equal to 0")
    deadline, ready = spec.get("progressDeadlineSeconds", 600), spec.get("minReadySeconds", 0)
    if isinstance(deadline, int) and isinstance(ready, int) and deadline <= ready:
        problems.append("spec.progressDeadlineSeconds: must be greater than minReadySeconds")
    strategy = spec.get("strategy") or {}
    if ("canary" in strategy) == ("blueGreen" in strategy):
        problems.append("spec.strategy: exactly one of .spec.strategy.canary or .spec.strategy.blueGreen")
    kinds = ("setWeight", "pause", "experiment", "analysis", "setCanaryScale", "setHeaderRoute", "setMirrorRoute")
    for i, step in enumerate((strategy.get("canary") or {}).get("steps") or []):
        where = f"spec.strategy.canary.steps[{i}]"
        if sum(k in step for k in ("setWeight", "pause", "experiment", "analysis")) > 1 or not any(
            k in step for k in (*kinds, "plugin")
        ):
            problems.append(f"{where}: Step must have one of the following set: experiment, setWeight, ...")
        weight = step.get("setWeight")
        if isinstance(weight, int) and not 0 <= weight <= 100:  # a wrong type is the schema check's finding
            problems.append(f"{where}.setWeight: SetWeight needs to be between 0 and 100")
    return problems


def check_manifest(manifest: dict[str, Any]) -> list[str]:
    """Problems of one rendered manifest, whatever its kind; an unknown apiVersion/kind is one. A Rollout is also
    held to Argo's own admission rules (`rollout_problems`)."""
    schema = KINDS.get((manifest.get("apiVersion"), manifest.get("kind")))
    if schema is None:
        return [f"{manifest.get('apiVersion')}/{manifest.get('kind')}: not a kind these checks know"]
    kind = manifest["kind"]
    problems = (
        check_core(manifest, schema.type_name, kind) if isinstance(schema, Core) else check_crd(manifest, schema, kind)
    )
    if kind == "Rollout":
        problems += rollout_problems(manifest)
    for path, value in _quantities(manifest, kind):  # every container's limits/requests are quantities
        if not QUANTITY.match(str(value)):
            problems.append(f"{path}: not a resource quantity: {value!r}")
    return problems


def _quantities(value: Any, path: str):
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("limits", "requests") and isinstance(item, dict) and path.endswith("resources"):
                yield from ((f"{path}.{key}.{k}", v) for k, v in item.items())
            else:
                yield from _quantities(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _quantities(item, f"{path}[{i}]")
