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

Grid and base keys are SamplerConfig fields (plus `backend`). Autoregressive and block-diffusion
models only take the keys they read (sampler.effective); their points collapse to one per distinct value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from dataclasses import fields as dc_fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from evals.pipeline import (
    EvidenceFiles,
    PreparedCandidate,
    SweepPlan,
    SweepPoint,
    measure_point,
    plan_points,
    prepare_candidate,
    store_measured,
    task_data,
)
from evals.points import point_problems, valid_points
from evals.records import EvalRecord
from evals.store import RecordStore
from evals.tasks import SPLITS, TASKS
from models.catalog import CatalogError, load_catalog
from models.loading import DEVICE_PATTERN, DTYPES, WEIGHTS_DIR, model_kind
from models.state import TOKEN, state_dir
from models.unique_keys import DuplicateKeyError, load_yaml
from sampler.config import SamplerConfig

TOP_KEYS = {"name", "models", "tasks", "base", "grid", "measure", "device", "dtype", "threads", "description"}
TASK_KEYS = {"task", "split", "n", "seed", "file", "limit", "train_file"}
MEASURE_KEYS = {"warmup": int, "batch_size": int, "throughput_items": int}


class SweepError(ValueError):
    """A sweep file that cannot be run; the message names the file and the key."""


Fail = Callable[[str, str], SweepError]  # (key, what was expected) -> the error naming the file and that key


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
    return {f.name for f in dc_fields(SamplerConfig)} | {"backend"}


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file; SweepError names the file and the offending key."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: sweep file not found")
    try:
        data = load_yaml(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise SweepError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except DuplicateKeyError as e:
        raise SweepError(f"{path}: {e}; each key once") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    spec = parse_sweep(data, source=str(path))
    for i, ref in enumerate(spec.models):  # last: a file's keys are named first, then what its models point at
        check_model_ref(ref, lambda key, expected: SweepError(f"{path}: key '{key}' {expected}"), f"models[{i}]")
    return spec


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
    _check_steps_within_canvas(base, grids, grid, fail)
    measure = {"warmup": 1, "batch_size": 4} | (data.get("measure") or {})
    for key, value in measure.items():
        if key not in MEASURE_KEYS:
            raise fail(f"measure.{key}", f"is not a measure setting; known: {', '.join(MEASURE_KEYS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "warmup" else 1):
            raise fail(
                f"measure.{key}",
                f"must be a {'non-negative' if key == 'warmup' else 'positive'} integer, got {value!r}",
            )
    device, dtype = str(data.get("device", "cpu")), str(data.get("dtype", "float32"))
    if not DEVICE_PATTERN.match(device):
        raise fail("device", f"must be cpu, cuda, cuda:N or mps, got {data['device']!r}")
    if dtype not in DTYPES:
        raise fail("dtype", f"must be one of {', '.join(DTYPES)}, got {data['dtype']!r}")
    threads = data.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise fail("threads", f"must be a positive integer, got {threads!r}")
    name = data.get("name") or Path(source).stem
    if not isinstance(name, str):
        raise fail("name", f"must be a string, got {name!r}")
    spec = SweepSpec(
        name=name,
        models=models,
        tasks=tasks,
        base=dict(base),
        grid=grids,
        measure=measure,
        device=device,
        dtype=dtype,
        threads=threads,
        source=source,
    )
    if not valid_points(spec, tasks[0]):
        raise SweepError(
            f"{source}: no grid point gives a valid SamplerConfig (see 'base' and 'grid'); "
            f"first problem: {point_problems(spec, tasks[0])[0]}"
        )
    return spec


def check_model_ref(ref: str, fail: Fail, key: str = "model") -> None:
    """A model folder (with its config.json), a bundled id or a catalog id; never a path that leads elsewhere."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise fail(key, f"is {ref!r}, a folder without config.json: not a model folder")
        return
    if not TOKEN.fullmatch(ref):
        raise fail(key, f"is {ref!r}: neither a model folder nor a model id (an id is letters, digits, '.', '_', '-')")
    if (WEIGHTS_DIR / ref).is_dir():
        return
    try:
        known = ref in load_catalog()
    except CatalogError:
        known = False
    if not known:
        bundled = sorted(p.name for p in WEIGHTS_DIR.iterdir() if p.is_dir())
        raise fail(key, f"is {ref!r}: no such folder, bundled model ({', '.join(bundled)}) or catalog id")


def _check_steps_within_canvas(base: dict[str, Any], grids: list[dict[str, Any]], grid: Any, fail: Fail) -> None:
    """`steps` above `gen_length` asks for more model calls than there are tokens to unmask: refused by key."""
    for i, part in enumerate(grids or [{}]):
        where = "grid" if isinstance(grid, dict) else f"grid[{i}]"
        steps = (
            [(f"{where}.steps", s) for s in part["steps"]] if "steps" in part else [("base.steps", base.get("steps"))]
        )
        lengths = part.get("gen_length") or [base.get("gen_length", SamplerConfig.gen_length)]
        longest = max((g for g in lengths if isinstance(g, int) and not isinstance(g, bool)), default=None)
        for key, value in steps:
            if isinstance(value, int) and not isinstance(value, bool) and longest is not None and value > longest:
                raise fail(key, f"is {value}, above gen_length {longest}: a step unmasks at least one token")


def expect_list(value: Any, key: str, fail: Fail) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise fail(key, f"must be a non-empty list, got {value!r}")
    return value


def parse_task(raw: Any, index: int, fail: Fail) -> TaskSpec:
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
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < (0 if key == "seed" else 1)
        ):
            raise fail(f"{where}.{key}", f"must be a positive integer, got {value!r}")
    if raw.get("task"):
        if raw["task"] not in TASKS:
            raise fail(f"{where}.task", f"is {raw['task']!r}; known tasks: {', '.join(TASKS)}")
        if raw.get("split", "test") not in SPLITS:
            raise fail(f"{where}.split", f"is {raw['split']!r}; expected one of {', '.join(SPLITS)}")
    return TaskSpec(**raw)


# --- running --------------------------------------------------------------------------------


@dataclass
class SweepResult:
    records: list[EvalRecord]
    failures: list[str]  # models or points that could not run, in words
    skipped: list[str]  # grid points that give no valid SamplerConfig
    folder: Path
    plan: list[SweepPoint] = field(default_factory=list)  # every planned point, all models
    candidates: list[PreparedCandidate] = field(default_factory=list)  # the models that loaded
    plans: dict[str, SweepPlan] = field(default_factory=dict)  # candidate id -> its plan
    failures_of: dict[str, list[str]] = field(default_factory=dict)  # candidate id -> its failures


def model_is_causal(ref: str) -> bool:
    """Whether a model is the autoregressive kind, from its config.json (no weights read)."""
    return model_kind(ref) == "autoregressive"


def run_sweep(
    spec: SweepSpec,
    folder: str | Path,
    *,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    measure_cells: Callable[[list[SweepPlan]], Iterable[tuple[SweepPoint, Any]]] | None = None,
) -> SweepResult:
    """Run every point through the pipeline (evals.pipeline); each record is validated and saved to
    `folder` as soon as it is finished.

    on_event(kind, info) is told: "plan" (total), "point" (start of one), "request" (one prompt
    done), "item" (done and total items inside the point), "record" (a saved record), "failure" (a model or
    point that could not run).

    measure_cells(plans), when given, measures the planned cells elsewhere (a cluster: flows.cells.fan_out) and
    yields (point, MeasuredPoint or the error in words) per cell; each is validated and saved here as it comes.
    """
    notify = on_event or (lambda kind, info: None)
    store = RecordStore(folder)
    result = SweepResult(records=store.records, failures=[], skipped=[], folder=store.folder)

    def fail(message: str, candidate: str | None = None) -> None:
        result.failures.append(message)
        if candidate is not None:
            result.failures_of.setdefault(candidate, []).append(message)
        notify("failure", {"message": message})

    for ref in spec.models:
        try:
            prepared = prepare_candidate(ref, spec.device, spec.dtype)
        except Exception as e:  # unknown id, broken checkpoint: the other models still run
            fail(f"model {ref}: could not load ({e})")
            continue
        plan = plan_points(prepared, spec)  # bad task data raises TaskDataError: nothing can be measured
        result.candidates.append(prepared)
        result.plans[prepared.candidate] = plan
        result.plan += plan.points
        result.skipped += plan.skipped
    notify(
        "plan",
        {
            "total": len(result.plan),
            "skipped": result.skipped,
            "items": sum(len(task_data(p.task).items) for p in result.plan),
        },
    )
    files = EvidenceFiles(store.folder)
    files.write_plan(list(result.plans.values()), spec)
    if measure_cells is not None:
        for point, measured in measure_cells(list(result.plans.values())):
            if isinstance(measured, str):
                fail(f"{point.ref} {task_data(point.task).name} {point.settings}: {measured}", point.candidate)
            else:
                notify("record", {"record": store_measured(store, measured)})
    else:
        for point in result.plan:
            plan = result.plans[point.candidate]
            notify("point", {"model": point.ref, "task": task_data(point.task).name, "settings": point.settings})
            try:
                measured = measure_point(
                    point,
                    plan,
                    on_request=lambda r: notify("request", {"ok": r.ok}),
                    on_item=lambda done, total: notify("item", {"done": done, "total": total}),
                )
            except Exception as e:  # this point is lost, the finished ones are already on disk
                fail(
                    f"{point.ref} {task_data(point.task).name} {point.settings}: {type(e).__name__}: {e}",
                    point.candidate,
                )
                continue
            notify("record", {"record": store_measured(store, measured)})
    if result.failures:
        store.write_json("failures.json", result.failures)
    return result


def catalog_settings(ref: str) -> dict[str, Any]:
    """The catalog's decoding defaults of `ref` that are SamplerConfig settings (empty outside the catalog)."""
    try:
        catalog = load_catalog()
    except Exception:  # no usable catalog: no defaults
        return {}
    if ref not in catalog:
        return {}
    known = sampler_keys() - {"mask_id", "eos_id", "eot_id"}  # the loaded model's own ids always win
    return {k: v for k, v in catalog.get(ref).decoding.items() if k in known and v is not None}


def with_items(sweep: str | Path, items: Callable[[str], int]) -> str:
    """`sweep` with each task measured on at least `items(task label)` items (`n` of a generated split, `limit`
    of a task file that has one); the file itself when it asks enough already. A raised copy is written to
    `<state>/sweeps/<name>-<sha>.yaml` (its own sweep, so its points are cached apart)."""
    import hashlib

    load_sweep(sweep)  # a broken sweep is named as the file it is, not as the copy
    data = load_yaml(Path(sweep).read_text(encoding="utf-8"))
    changed = False
    data["tasks"] = [{"task": t} if isinstance(t, str) else t for t in data["tasks"]]
    for spec in data["tasks"]:
        label = spec.get("task") or Path(spec.get("file") or "").stem
        key = "limit" if spec.get("file") else "n"
        have = spec.get(key, TaskSpec.n if key == "n" else None)
        if have is not None and have < items(label):
            spec[key], changed = items(label), True
    if not changed:
        return str(sweep)
    text = yaml.safe_dump(data, sort_keys=False)
    folder = state_dir() / "sweeps"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{data.get('name', 'sweep')}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    path.write_text(f"# {sweep}, each task on more items\n{text}", encoding="utf-8")
    return str(path)


def default_sweep_path() -> Path:
    return Path(__file__).resolve().parent / "sweeps" / "default.yaml"


def timestamped_folder(root: Path, name: str) -> Path:
    return root / f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{time.perf_counter_ns() % 10000:04d}"
