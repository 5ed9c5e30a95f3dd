"""Stage policies: which gates each stage (poc, staging, production) applies, with what thresholds.

`load_policy()` reads `gates/policy.yaml` (or any file) into frozen dataclasses and refuses a
malformed policy with a `PolicyError` that names the file, the stage, the gate and the key.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from checklists import STAGES, load_checklist
from checklists.yaml_file import read_yaml_file
from evals.tasks import TASKS
from gates.readable import significant

POLICY_PATH = Path(__file__).resolve().parent / "policy.yaml"
LICENSE_TIERS = ("permitted", "caution", "restricted", "unknown")  # best first
BASELINES = ("fallback", "production")
REPRODUCIBILITY_CHECKS = ("same_process", "fresh_process", "batch_invariant")
CRITERIA = ("quality", "latency", "memory", "license")


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the file, stage, gate and key."""


@dataclass(frozen=True)
class MetricThreshold:
    """MLflow `MetricThreshold` semantics, widened so a tolerated regression can be stated.

    `threshold`: value >= threshold (greater_is_better) or <= threshold.
    `min_absolute_change`: value >= baseline + change (or <= baseline - change). MLflow insists on a
    positive number; here a negative one states an allowed regression ("at most 0.05 worse").
    `min_relative_change`: as absolute, scaled by |baseline|; in [-1, 1] for the same reason.
    """

    greater_is_better: bool
    threshold: float | None = None
    min_absolute_change: float | None = None
    min_relative_change: float | None = None

    def failures(
        self, value: float, baseline: float | None = None, fmt: Callable[[float], str] = significant
    ) -> list[str]:
        """Each condition the value misses, in words (numbers through `fmt`, e.g. `gates.readable.percent`);
        empty when it passes."""
        sign = 1.0 if self.greater_is_better else -1.0
        word = ">=" if self.greater_is_better else "<="
        out = []
        if self.threshold is not None and sign * (value - self.threshold) < 0:
            out.append(f"{fmt(value)} is not {word} threshold {fmt(self.threshold)}")
        for change, scale, name in (
            (self.min_absolute_change, 1.0, "absolute"),
            (self.min_relative_change, None, "relative"),
        ):
            if change is None:
                continue
            if baseline is None:
                out.append(f"min {name} change needs a baseline value and there is none")
                continue
            step = change * (abs(baseline) if scale is None else scale)
            bound = baseline + sign * step
            if sign * (value - bound) < 0:
                out.append(
                    f"{fmt(value)} is not {word} baseline {fmt(baseline)} "
                    f"{'+' if sign * step >= 0 else '-'} {fmt(abs(step))} (min {name} change {change:+g})"
                )
        return out

    def describe(self) -> str:
        parts = []
        word = ">=" if self.greater_is_better else "<="
        if self.threshold is not None:
            parts.append(f"{word} {self.threshold:g}")
        if self.min_absolute_change is not None:
            parts.append(f"baseline {self.min_absolute_change:+g}")
        if self.min_relative_change is not None:
            parts.append(f"baseline {self.min_relative_change:+.0%}")
        return ", ".join(parts)


@dataclass(frozen=True)
class GateSpec:
    """One gate of one stage. `kind` picks the check; `params` are its validated settings."""

    name: str
    kind: str
    params: dict[str, Any]
    metric_threshold: MetricThreshold | None = None


@dataclass(frozen=True)
class OperatingPoint:
    """Which records a stage judges: the task and generation length stated for the SLA."""

    task: str
    gen_length: int


@dataclass(frozen=True)
class StagePolicy:
    stage: str
    operating_point: OperatingPoint
    gates: tuple[GateSpec, ...]
    weights: dict[str, float]  # scoring weights per criterion, summing to 1
    approval_min_comment_chars: int = 1
    requires_stage: str | None = None  # a version must have reached this stage first

    def gate(self, name: str) -> GateSpec:
        for spec in self.gates:
            if spec.name == name:
                return spec
        raise KeyError(f"stage {self.stage!r} has no gate {name!r}; gates: {', '.join(g.name for g in self.gates)}")


@dataclass(frozen=True)
class Policy:
    stages: dict[str, StagePolicy]
    source: str = "<memory>"
    path: str = ""  # the file's absolute path; "" for a policy given as data
    sha256: str = ""  # of the file's bytes, else of the data as canonical JSON: which rules a verdict applied
    # `demo: true` at the top of a policy file: thresholds relaxed to show the mechanics (gates/demo-policy.yaml).
    # Every page, CLI verdict and dossier judged under it says DEMO, and it cannot move production on a registry
    # not marked as a demo (`registry.demo`, set by `unmask run --demo`).
    demo: bool = False

    def cited(self) -> dict[str, str]:
        """What a verdict or an alias move records of the policy behind it."""
        return {"path": self.path or self.source, "sha256": self.sha256}

    def stage(self, stage: str) -> StagePolicy:
        if stage not in self.stages:
            raise PolicyError(f"{self.source}: unknown stage {stage!r}; stages: {', '.join(self.stages)}")
        return self.stages[stage]


# kind -> {key: (type(s), required)}; types are checked on load.
_NUM = (int, float)
GATE_KINDS: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "quality": {
        "metric": ((str,), False),
        "task": ((str,), False),
        "relative_to": ((str,), False),
        "threshold": (_NUM, False),
        "min_absolute_change": (_NUM, False),
        "min_relative_change": (_NUM, False),
        "greater_is_better": ((bool,), False),
        "if_no_baseline": ((str,), False),
        "require_settled": ((bool,), False),
    },
    "latency": {"max_p95_s": (_NUM, True)},
    "speedup": {"relative_to": ((str,), False), "min_speedup": (_NUM, True)},
    "memory": {"max_peak_mem_mb": (_NUM, True)},
    "license": {"allowed_tiers": ((list,), True)},
    "reproducibility": {"require": ((list,), True)},
    "data_validity": {"min_items": ((int,), False)},
    "error_rate": {"max_error_rate": (_NUM, True)},
    "tooling_maturity": {"checklist_item": ((str,), True)},
    "license_review": {"checklist_item": ((str,), True)},
    "serving": {
        "concurrency": ((int,), True),
        "p95_s_max": (_NUM, False),
        "error_rate_max": (_NUM, False),
        "throughput_vs_fallback_min": (_NUM, False),
    },
    "canary": {"min_weight": ((int,), True)},
    "parallelism": {"task": ((str,), False), "tpf_at_accuracy": ((dict,), False), "aup_min": (_NUM, False)},
}
# Gate kinds a checklist sign-off decides, not a measurement (each names its manual `checklist_item`).
SIGNED_KINDS = frozenset({"tooling_maturity", "license_review"})
# Kinds the bundled policy leaves to the policies that ask for them (gates/demo-policy.yaml shows each).
OPT_IN_KINDS = frozenset({"parallelism"})
PARALLELISM_MODES = ("tpf_at_accuracy", "aup_min")
SERVING_LIMITS = ("p95_s_max", "error_rate_max", "throughput_vs_fallback_min")
QUALITY_METRICS = ("accuracy", "accuracy_strict", "accuracy_flexible")


def load_policy(path: str | Path | None = None) -> Policy:
    """Read and validate a policy file (default: the bundled `gates/policy.yaml`)."""
    path = Path(path) if path else POLICY_PATH
    data, raw = read_yaml_file(path, PolicyError, "policy")
    parsed = parse_policy(data, source=str(path))
    return replace(parsed, path=str(path.resolve()), sha256=hashlib.sha256(raw).hexdigest())


def parse_policy(data: Any, source: str = "<memory>") -> Policy:
    """Validate a policy given as plain data (what `yaml.safe_load` returns)."""
    if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
        raise PolicyError(f"{source}: expected a mapping with a 'stages' mapping at the top")
    unknown = sorted(set(data["stages"]) - set(STAGES))
    if unknown:
        raise PolicyError(f"{source}: stages.{unknown[0]}: unknown stage; expected one of {', '.join(STAGES)}")
    stages = {}
    for stage in STAGES:
        if stage not in data["stages"]:
            raise PolicyError(f"{source}: stages.{stage}: missing; every stage ({', '.join(STAGES)}) needs gates")
        stages[stage] = _parse_stage(data["stages"][stage], stage, source)
    demo = data.get("demo", False)
    if not isinstance(demo, bool):
        raise PolicyError(f"{source}: demo: expected true or false, got {demo!r}")
    canonical = json.dumps(data, sort_keys=True, default=str).encode()
    return Policy(stages=stages, source=source, sha256=hashlib.sha256(canonical).hexdigest(), demo=demo)


def _parse_stage(data: Any, stage: str, source: str) -> StagePolicy:
    where = f"{source}: stages.{stage}"
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: expected a mapping, got {type(data).__name__}")
    allowed = {"operating_point", "gates", "scoring", "approval", "requires_stage"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r}; expected {', '.join(sorted(allowed))}")
    op = data.get("operating_point")
    if not isinstance(op, dict) or not isinstance(op.get("task"), str) or not _is_int(op.get("gen_length")):
        raise PolicyError(f"{where}.operating_point: expected {{task: <str>, gen_length: <int>}}, got {op!r}")
    _check_task(op["task"], f"{where}.operating_point.task")
    if op["gen_length"] < 1:
        raise PolicyError(f"{where}.operating_point.gen_length: expected a positive integer, got {op['gen_length']!r}")
    gates_data = data.get("gates")
    if not isinstance(gates_data, dict) or not gates_data:
        raise PolicyError(f"{where}.gates: expected a non-empty mapping of gate name to settings")
    gates = tuple(_parse_gate(name, spec, f"{where}.gates.{name}") for name, spec in gates_data.items())
    weights = _parse_weights((data.get("scoring") or {}).get("weights"), f"{where}.scoring.weights")
    approval = data.get("approval") or {}
    min_chars = approval.get("min_comment_chars", 1)
    if not _is_int(min_chars) or min_chars < 0:
        raise PolicyError(f"{where}.approval.min_comment_chars: expected a non-negative integer, got {min_chars!r}")
    requires = data.get("requires_stage")
    if requires is not None and (requires not in STAGES or STAGES.index(requires) >= STAGES.index(stage)):
        raise PolicyError(f"{where}.requires_stage: expected an earlier stage than {stage!r}, got {requires!r}")
    _check_checklist_items(gates, stage, where)
    return StagePolicy(
        stage=stage,
        operating_point=OperatingPoint(op["task"], op["gen_length"]),
        gates=gates,
        weights=weights,
        approval_min_comment_chars=min_chars,
        requires_stage=requires,
    )


def _parse_gate(name: str, spec: Any, where: str) -> GateSpec:
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise PolicyError(f"{where}: expected a mapping of settings, got {type(spec).__name__}")
    spec = dict(spec)
    kind = spec.pop("kind", name)
    if kind not in GATE_KINDS:
        raise PolicyError(f"{where}.kind: unknown gate kind {kind!r}; expected one of {', '.join(GATE_KINDS)}")
    keys = GATE_KINDS[kind]
    for key, value in spec.items():
        if key not in keys:
            raise PolicyError(f"{where}: unknown key {key!r} for a {kind} gate; expected {', '.join(keys)}")
        types, _ = keys[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise PolicyError(f"{where}.{key}: expected {' or '.join(t.__name__ for t in types)}, got {value!r}")
    for key, (_, required) in keys.items():
        if required and key not in spec:
            raise PolicyError(f"{where}: missing required key {key!r}")
    _check_values(spec, where)
    if spec.get("relative_to", "fallback") not in BASELINES:
        raise PolicyError(f"{where}.relative_to: expected one of {', '.join(BASELINES)}, got {spec['relative_to']!r}")
    threshold = None
    if kind == "quality":
        threshold = _quality_threshold(spec, where)
    elif kind == "license":
        bad = [t for t in spec["allowed_tiers"] if t not in LICENSE_TIERS]
        if bad:
            raise PolicyError(f"{where}.allowed_tiers: unknown tier {bad[0]!r}; expected {', '.join(LICENSE_TIERS)}")
    elif kind == "reproducibility":
        bad = [c for c in spec["require"] if c not in REPRODUCIBILITY_CHECKS]
        if bad:
            raise PolicyError(
                f"{where}.require: unknown check {bad[0]!r}; expected {', '.join(REPRODUCIBILITY_CHECKS)}"
            )
    elif kind == "serving":
        if spec["concurrency"] < 1:
            raise PolicyError(f"{where}.concurrency: expected requests in flight (>= 1), got {spec['concurrency']!r}")
        if not any(k in spec for k in SERVING_LIMITS):
            raise PolicyError(f"{where}: a serving gate needs at least one of {', '.join(SERVING_LIMITS)}")
    elif kind == "canary" and not 1 <= spec["min_weight"] <= 100:
        raise PolicyError(f"{where}.min_weight: expected a traffic weight in 1..100, got {spec['min_weight']!r}")
    elif kind == "parallelism":
        _check_parallelism(spec, where)
    for key in ("max_p95_s", "min_speedup", "max_peak_mem_mb", "max_error_rate", "aup_min") + SERVING_LIMITS:
        if key in spec and spec[key] < 0:
            raise PolicyError(f"{where}.{key}: expected a non-negative number, got {spec[key]!r}")
    for key in ("max_error_rate", "error_rate_max"):
        if key in spec and spec[key] > 1:
            raise PolicyError(f"{where}.{key}: a share of requests; expected a number in [0, 1], got {spec[key]!r}")
    return GateSpec(name=name, kind=kind, params=spec, metric_threshold=threshold)


def _check_parallelism(spec: dict[str, Any], where: str) -> None:
    """Exactly one of `tpf_at_accuracy: {min_tpf, accuracy_floor}` or `aup_min`."""
    given = [m for m in PARALLELISM_MODES if m in spec]
    if len(given) != 1:
        raise PolicyError(
            f"{where}: a parallelism gate needs exactly one of {' or '.join(PARALLELISM_MODES)}, "
            f"got {', '.join(given) or 'neither'}"
        )
    if "tpf_at_accuracy" in spec:
        sub, at = spec["tpf_at_accuracy"], f"{where}.tpf_at_accuracy"
        unknown = sorted(set(sub) - {"min_tpf", "accuracy_floor"})
        if unknown:
            raise PolicyError(f"{at}: unknown key {unknown[0]!r}; expected min_tpf, accuracy_floor")
        for key in ("min_tpf", "accuracy_floor"):
            value = sub.get(key)
            if not isinstance(value, _NUM) or isinstance(value, bool) or not math.isfinite(value):
                raise PolicyError(f"{at}.{key}: expected a finite number, got {value!r}")
        if sub["min_tpf"] <= 0:
            raise PolicyError(f"{at}.min_tpf: expected tokens per forward above 0, got {sub['min_tpf']!r}")
        if not 0 <= sub["accuracy_floor"] <= 1:
            raise PolicyError(f"{at}.accuracy_floor: expected a share in [0, 1], got {sub['accuracy_floor']!r}")


def _check_values(spec: dict[str, Any], where: str) -> None:
    """What the types allow but no gate can judge by: NaN or infinite numbers (a NaN threshold compares
    false both ways, so it passed every value), empty lists, a negative item count, an unknown task."""
    for key, value in spec.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise PolicyError(f"{where}.{key}: expected a finite number, got {value!r}")
        if isinstance(value, list) and not value:
            raise PolicyError(f"{where}.{key}: expected a non-empty list, got []")
    if spec.get("min_items", 0) < 0:
        raise PolicyError(f"{where}.min_items: expected a non-negative integer, got {spec['min_items']!r}")
    if "task" in spec:
        _check_task(spec["task"], f"{where}.task")


def _check_task(task: str, where: str) -> None:
    known = [*TASKS, "gsm8k"]
    if task not in known:
        raise PolicyError(f"{where}: unknown task {task!r}; expected one of {', '.join(known)}")


def _check_checklist_items(gates: tuple[GateSpec, ...], stage: str, where: str) -> None:
    """A sign-off gate waits for a sign-off of a manual item of the stage's checklist: one that exists."""
    named = [g for g in gates if g.kind in SIGNED_KINDS]
    if not named:
        return
    manual = load_checklist(stage).manual_items()
    for g in named:
        if g.params["checklist_item"] not in manual:
            raise PolicyError(
                f"{where}.gates.{g.name}.checklist_item: {g.params['checklist_item']!r} is not a manual "
                f"item of the {stage} checklist; expected one of {', '.join(manual) or 'none'}"
            )


def _quality_threshold(spec: dict[str, Any], where: str) -> MetricThreshold:
    metric = spec.get("metric", "accuracy")
    if metric not in QUALITY_METRICS:
        raise PolicyError(f"{where}.metric: expected one of {', '.join(QUALITY_METRICS)}, got {metric!r}")
    if spec.get("if_no_baseline", "fail") not in ("pass", "fail"):
        raise PolicyError(f"{where}.if_no_baseline: expected 'pass' or 'fail', got {spec['if_no_baseline']!r}")
    if all(spec.get(k) is None for k in ("threshold", "min_absolute_change", "min_relative_change")):
        raise PolicyError(f"{where}: a quality gate needs threshold, min_absolute_change or min_relative_change")
    relative = spec.get("min_absolute_change") is not None or spec.get("min_relative_change") is not None
    if relative and "relative_to" not in spec:
        raise PolicyError(f"{where}.relative_to: a min change needs a baseline ({', '.join(BASELINES)})")
    for key, low in (("threshold", 0), ("min_absolute_change", -1)):
        value = spec.get(key)
        if value is not None and not low <= value <= 1:
            raise PolicyError(
                f"{where}.{key}: {metric} is a share of items; expected a number in [{low}, 1], got {value!r}"
            )
    rel = spec.get("min_relative_change")
    if rel is not None and not -1 <= rel <= 1:
        raise PolicyError(f"{where}.min_relative_change: expected a number in [-1, 1], got {rel!r}")
    return MetricThreshold(
        greater_is_better=spec.get("greater_is_better", True),
        threshold=spec.get("threshold"),
        min_absolute_change=spec.get("min_absolute_change"),
        min_relative_change=rel,
    )


def _parse_weights(weights: Any, where: str) -> dict[str, float]:
    if not isinstance(weights, dict):
        raise PolicyError(f"{where}: expected a mapping of {', '.join(CRITERIA)} to weights, got {weights!r}")
    unknown = sorted(set(weights) - set(CRITERIA))
    if unknown:
        raise PolicyError(f"{where}.{unknown[0]}: unknown criterion; expected {', '.join(CRITERIA)}")
    for key, value in weights.items():
        if not isinstance(value, _NUM) or isinstance(value, bool) or not 0 <= value < math.inf:
            raise PolicyError(f"{where}.{key}: expected a finite non-negative number, got {value!r}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise PolicyError(f"{where}: weights must not all be zero")
    return {c: float(weights.get(c, 0.0)) / total for c in CRITERIA}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
