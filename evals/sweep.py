"""Sweeps: a YAML grid of decoding settings run over models and tasks, one EvalRecord per point.

A sweep file::

    name: default
    models: [tiny-llada, tiny-ar]            # bundled ids, catalog ids or model folders
    tasks:
      - {task: arith, split: test, n: 16}    # a generated task split
      - {file: data/gsm8k.jsonl, limit: 50}  # a GSM8K-format JSONL file
    base: {gen_length: 32, block_length: 32, steps: 32}   # SamplerConfig settings of every point
    grid: {steps: [8, 16, 32], block_length: [8, 32]}     # the product of these is the curve
    # or a list of such mappings: the union of their products, e.g.
    # grid: [{steps: [8, 16, 32]}, {parallel: [threshold], parallel_threshold: [0.7, 0.9], cache: [none, dual]}]
    measure: {warmup: 1, batch_size: 4, throughput_items: 8}

Grid and base keys are SamplerConfig fields (plus `backend`). Autoregressive models only take the
keys that mean something to them (AR_KEYS); their points collapse to one per distinct value.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, fields as dc_fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import yaml

from evals.records import EvalRecord

TOP_KEYS = {"name", "models", "tasks", "base", "grid", "measure", "device", "dtype", "threads", "description"}
TASK_KEYS = {"task", "split", "n", "seed", "file", "limit", "train_file"}
MEASURE_KEYS = {"warmup": int, "batch_size": int, "throughput_items": int}
AR_KEYS = {"gen_length", "temperature", "seed"}  # settings sampler.autoregressive reads (it always caches)
# what sampler.decode.block_config_for reads; the catalog's decoding defaults give the rest
BLOCK_KEYS = {"gen_length", "steps", "seed"}
DEFAULT_BACKEND = "torch"


class SweepError(ValueError):
    """A sweep file that cannot be run; the message names the file and the key."""


@dataclass
class TaskSpec:
    """A generated task split (`task`, `split`, `n`, `seed`) or a GSM8K JSONL `file`."""

    task: str | None = None
    split: str = "test"
    n: int = 16
    seed: int = 0
    file: str | None = None
    limit: int | None = None
    train_file: str | None = None

    @property
    def label(self) -> str:
        return self.task or Path(self.file or "").stem


@dataclass
class SweepSpec:
    name: str
    models: list[str]
    tasks: list[TaskSpec]
    base: dict[str, Any] = field(default_factory=dict)
    grid: list[dict[str, list[Any]]] = field(default_factory=list)  # each part a product; the sweep is their union
    measure: dict[str, int] = field(default_factory=lambda: {"warmup": 1, "batch_size": 4})
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None  # torch CPU threads while measuring (None: torch's default); recorded in the fingerprint
    source: str = "<inline>"  # the file it came from, for error messages


def sampler_keys() -> set[str]:
    """Settings a sweep may set: the SamplerConfig fields of this checkout, plus `backend`."""
    from sampler import SamplerConfig

    return {f.name for f in dc_fields(SamplerConfig)} | {"backend"}


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; SweepError names the file and the offending key."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: sweep file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML ({e})") from e
    return parse_sweep(data, source=str(path))


def parse_sweep(data: Any, source: str = "<inline>") -> SweepSpec:
    def fail(key: str, expected: str) -> SweepError:
        return SweepError(f"{source}: key '{key}' {expected}")

    if not isinstance(data, dict):
        raise SweepError(f"{source}: expected a mapping with keys {', '.join(sorted(TOP_KEYS))}")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise fail(unknown[0], f"is not a sweep key; known: {', '.join(sorted(TOP_KEYS))}")
    models = data.get("models")
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
        raise fail("models", f"must be a non-empty list of model ids or folders, got {models!r}")
    tasks = [parse_task(t, i, fail) for i, t in enumerate(expect_list(data.get("tasks"), "tasks", fail))]
    known = sampler_keys()
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise fail("base", f"must be a mapping of SamplerConfig settings, got {type(base).__name__}")
    for key in base:
        if key not in known:
            raise fail(f"base.{key}", f"is not a SamplerConfig setting; known: {', '.join(sorted(known))}")
    grid = data.get("grid") or {}
    grids = grid if isinstance(grid, list) else [grid]
    for i, part in enumerate(grids):
        where = "grid" if isinstance(grid, dict) else f"grid[{i}]"
        if not isinstance(part, dict):
            raise fail(where, f"must be a mapping of setting -> list of values, got {type(part).__name__}")
        for key, values in part.items():
            if key not in known:
                raise fail(f"{where}.{key}", f"is not a SamplerConfig setting; known: {', '.join(sorted(known))}")
            if not isinstance(values, list) or not values:
                raise fail(f"{where}.{key}", f"must be a non-empty list of values, got {values!r}")
    measure = {"warmup": 1, "batch_size": 4} | (data.get("measure") or {})
    for key, value in measure.items():
        if key not in MEASURE_KEYS:
            raise fail(f"measure.{key}", f"is not a measure setting; known: {', '.join(MEASURE_KEYS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "warmup" else 1):
            raise fail(f"measure.{key}", f"must be a {'non-negative' if key == 'warmup' else 'positive'} integer, got {value!r}")
    threads = data.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise fail("threads", f"must be a positive integer, got {threads!r}")
    name = data.get("name") or Path(source).stem
    if not isinstance(name, str):
        raise fail("name", f"must be a string, got {name!r}")
    spec = SweepSpec(name=name, models=models, tasks=tasks, base=dict(base), grid=grids, measure=measure,
                     device=str(data.get("device", "cpu")), dtype=str(data.get("dtype", "float32")), threads=threads,
                     source=source)
    if not valid_points(spec, tasks[0]):
        raise SweepError(f"{source}: no grid point gives a valid SamplerConfig (see 'base' and 'grid'); "
                         f"first problem: {point_problems(spec, tasks[0])[0]}")
    return spec


def expect_list(value: Any, key: str, fail) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise fail(key, f"must be a non-empty list, got {value!r}")
    return value


def parse_task(raw: Any, index: int, fail) -> TaskSpec:
    where = f"tasks[{index}]"
    if isinstance(raw, str):
        raw = {"task": raw}
    if not isinstance(raw, dict):
        raise fail(where, f"must be a mapping like {{task: arith, split: test, n: 16}}, got {raw!r}")
    unknown = sorted(set(raw) - TASK_KEYS)
    if unknown:
        raise fail(f"{where}.{unknown[0]}", f"is not a task key; known: {', '.join(sorted(TASK_KEYS))}")
    if bool(raw.get("task")) == bool(raw.get("file")):
        raise fail(where, "needs exactly one of 'task' (a generated task) or 'file' (a GSM8K JSONL file)")
    for key in ("n", "seed", "limit"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "seed" else 1)):
            raise fail(f"{where}.{key}", f"must be a positive integer, got {value!r}")
    if raw.get("task"):
        from evals.tasks import SPLITS, TASKS

        if raw["task"] not in TASKS:
            raise fail(f"{where}.task", f"is {raw['task']!r}; known tasks: {', '.join(TASKS)}")
        if raw.get("split", "test") not in SPLITS:
            raise fail(f"{where}.split", f"is {raw['split']!r}; expected one of {', '.join(SPLITS)}")
    return TaskSpec(**raw)


# --- points ---------------------------------------------------------------------------------


def grid_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of each grid part's values, parts and values in file order."""
    points = []
    for part in spec.grid or [{}]:
        keys = list(part)
        points += [dict(zip(keys, values)) for values in itertools.product(*(part[k] for k in keys))]
    return points


def settings_for(spec: SweepSpec, point: dict[str, Any], gen_length: int, kind: str = "masked-diffusion") -> dict[str, Any]:
    """The full settings of a point: base, then the point; AR models keep only AR_KEYS, block-diffusion
    models only BLOCK_KEYS (their block is the model's canvas)."""
    settings = {"gen_length": gen_length} | spec.base | point
    if kind == "autoregressive":
        settings = {k: v for k, v in settings.items() if k in AR_KEYS}
        n = settings["gen_length"]
        settings |= {"steps": n, "block_length": min(spec.base.get("block_length", n), n)}
        if n % settings["block_length"]:
            settings["block_length"] = n
    elif kind == "block-diffusion":
        settings = {k: v for k, v in settings.items() if k in BLOCK_KEYS}
        settings.setdefault("steps", settings["gen_length"])
        settings["block_length"] = settings["gen_length"]
    else:
        settings.setdefault("steps", settings["gen_length"])
    return settings


def build_config(settings: dict[str, Any], ids: dict[str, Any] | None = None):
    """(SamplerConfig, backend) from point settings; ValueError says which setting is wrong."""
    from sampler import SamplerConfig

    settings = dict(settings)
    backend = settings.get("backend", DEFAULT_BACKEND)
    if "backend" not in {f.name for f in dc_fields(SamplerConfig)}:
        settings.pop("backend", None)
        if backend != DEFAULT_BACKEND:
            raise ValueError(f"backend {backend!r} is not available in this sampler (only '{DEFAULT_BACKEND}')")
    return SamplerConfig.from_dict(settings | (ids or {})), backend


def point_problems(spec: SweepSpec, task: TaskSpec, kind: str = "masked-diffusion") -> list[str]:
    problems = []
    for point in grid_points(spec):
        try:
            build_config(settings_for(spec, point, task_gen_length(task), kind))
        except (ValueError, TypeError) as e:
            problems.append(f"{point}: {e}")
    return problems


def valid_points(spec: SweepSpec, task: TaskSpec, kind: str = "masked-diffusion") -> list[dict[str, Any]]:
    """The grid points that give a valid SamplerConfig for a model of `kind` (deduplicated where the
    kind ignores settings: AR and block-diffusion models)."""
    seen, points = set(), []
    for point in grid_points(spec):
        settings = settings_for(spec, point, task_gen_length(task), kind)
        try:
            build_config(settings)
        except (ValueError, TypeError):
            continue
        key = repr(sorted(settings.items()))
        if key not in seen:
            seen.add(key)
            points.append(settings)
    return points


def task_gen_length(task: TaskSpec) -> int:
    if task.file:
        from evals.tasks import GSM8KTask

        return GSM8KTask().gen_length
    from evals.tasks import get_task

    return get_task(task.task).gen_length


# --- running --------------------------------------------------------------------------------


@dataclass
class PlannedPoint:
    model: str
    task: TaskSpec
    settings: dict[str, Any]


@dataclass
class SweepResult:
    records: list[EvalRecord]
    failures: list[str]  # models or points that could not run, in words
    skipped: list[str]  # grid points that give no valid SamplerConfig
    folder: Path
    plan: list[PlannedPoint] = field(default_factory=list)


def model_kind(ref: str) -> str:
    """'masked-diffusion', 'autoregressive' or 'block-diffusion', from its config.json (no weights read)."""
    from models.loading import model_kind as kind_of

    return kind_of(ref)


def model_is_causal(ref: str) -> bool:
    """Whether a model is the autoregressive kind, from its config.json (no weights read)."""
    return model_kind(ref) == "autoregressive"


def plan_sweep(spec: SweepSpec, failures: list[str] | None = None) -> tuple[list[PlannedPoint], list[str]]:
    """(points to run, skipped grid points); a model that cannot be resolved goes to `failures`."""
    plan, skipped = [], []
    for model in spec.models:
        try:
            kind = model_kind(model)
        except Exception as e:  # unknown id, broken config: the other models still run
            if failures is not None:
                failures.append(f"model {model}: {e}")
            continue
        for task in spec.tasks:
            plan += [PlannedPoint(model, task, s) for s in valid_points(spec, task, kind)]
            skipped += [f"{model} {task.label} {p}" for p in point_problems(spec, task, kind)]
    return plan, skipped


def run_sweep(
    spec: SweepSpec,
    folder: str | Path,
    *,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    validate: bool = True,
) -> SweepResult:
    """Run every point; each record is validated and saved to `folder` as soon as it is finished.

    on_event(kind, info) is told: "plan" (total), "point" (start of one), "request" (one prompt
    done), "record" (a saved record), "failure" (a model or point that could not run).
    """
    from evals.evaluate import candidate_from, load_task
    from evals.store import RecordStore
    from evals.validation import check_task, validate_record
    from models import load_model
    from sampler.decode import sampler_ids

    notify = on_event or (lambda kind, info: None)
    if spec.threads:  # on a shared CPU, more threads than free cores makes every forward much slower
        import torch

        torch.set_num_threads(spec.threads)
    store = RecordStore(folder)
    failures: list[str] = []
    tasks = {id(t): load_task(**vars(t)) for t in spec.tasks}
    if validate:
        for t in spec.tasks:
            outcome = check_task(tasks[id(t)], expected_size=None if t.file else t.n)
            store.write_json(f"task-validation-{t.label}-{t.split}.json", outcome.summary())
    plan, skipped = plan_sweep(spec, failures)
    for message in failures:
        notify("failure", {"message": message})
    notify("plan", {"total": len(plan), "items": sum(len(tasks[id(p.task)].items) for p in plan), "skipped": skipped})
    store.write_json("sweep.json", {"name": spec.name, "source": spec.source, "models": spec.models,
                                    "grid": spec.grid, "base": spec.base, "measure": spec.measure, "skipped": skipped})
    loaded_model = None
    for model in dict.fromkeys(p.model for p in plan):
        try:
            loaded_model = load_model(model, device=spec.device, dtype=spec.dtype)
            candidate = candidate_from(model, loaded_model)
        except Exception as e:
            failures.append(f"model {model}: could not load ({e})")
            notify("failure", {"message": failures[-1]})
            continue
        ids = sampler_ids(loaded_model)
        for point in (p for p in plan if p.model == model):
            task = tasks[id(point.task)]
            notify("point", {"model": model, "task": task.name, "settings": point.settings})
            try:
                config, backend = build_config(point.settings, ids)
                record = measure_point(candidate, task, config, backend, spec, notify)
            except Exception as e:  # this point is lost, the finished ones are already on disk
                failures.append(f"{model} {task.name} {point.settings}: {type(e).__name__}: {e}")
                notify("failure", {"message": failures[-1]})
                continue
            outcome = None
            if validate:
                try:
                    outcome = validate_record(record)
                except Exception as e:  # a validator that breaks must not cost the measurement
                    record.valid = False
                    record.validation = {"success": False, "failed": [], "error": f"validation could not run: {e}"}
            store.add(record, outcome.result if outcome else None, outcome.html if outcome else None)
            notify("record", {"record": record})
        del loaded_model
    if failures:
        store.write_json("failures.json", failures)
    return SweepResult(records=store.records, failures=failures, skipped=skipped, folder=store.folder, plan=plan)


def measure_point(candidate, task, config, backend, spec: SweepSpec, notify) -> EvalRecord:
    from evals.evaluate import evaluate_point

    return evaluate_point(
        candidate, task, config, backend=backend, device=spec.device, dtype=spec.dtype,
        warmup=spec.measure.get("warmup", 1), batch_size=spec.measure.get("batch_size", 1),
        throughput_items=spec.measure.get("throughput_items"), sweep=spec.name,
        on_request=lambda r: notify("request", {"ok": r.ok}),
    )


def catalog_settings(ref: str) -> dict[str, Any]:
    """The catalog's decoding defaults of `ref` that are SamplerConfig settings (empty outside the catalog)."""
    try:
        from models.catalog import load_catalog

        catalog = load_catalog()
    except Exception:  # no usable catalog: no defaults
        return {}
    if ref not in catalog:
        return {}
    known = sampler_keys() - {"mask_id", "eos_id", "eot_id"}  # the loaded model's own ids always win
    return {k: v for k, v in catalog.get(ref).decoding.items() if k in known and v is not None}


def default_sweep_path() -> Path:
    return Path(__file__).resolve().parent / "sweeps" / "default.yaml"


def timestamped_folder(root: Path, name: str) -> Path:
    return root / f"{name}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{time.perf_counter_ns() % 10000:04d}"


diffusion_points = valid_points  # the first name of valid_points; flows code may still use it
