"""The one evaluation pipeline, as typed steps: prepare a candidate, plan its points, measure each
point into a validated record, probe, check the license, assemble the evidence, write the files.

`unmask eval` (evals.sweep.run_sweep) and the Prefect flows (flows.tasks, one-line task wrappers
adding retries, caching and serialisation) drive the same steps and write the same files. Each step
takes and returns plain values (pydantic models, records), so a step's result can be cached as JSON.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from evals import step_cache, validation
from evals.evaluate import Candidate, TaskData, evaluate_point, load_task
from evals.fingerprint import package_version
from evals.license import license_for_model
from evals.measure import RequestResult
from evals.paired import host_during, host_sample, measure_paired
from evals.parallelism import parallelism_summary
from evals.plots import plot_quality_latency
from evals.points import build_config, point_problems, valid_points
from evals.records import CandidateEvidence, EvalRecord, LicenseResult, ReproducibilityResult, SpeedComparison
from evals.reproducibility import probe
from evals.store import RecordStore
from evals.validation import TaskDataError, check_task
from models import load
from models.catalog import load_catalog
from models.digest import weight_files
from models.loading import catalog_decoding, catalog_entry, resolve_model_path
from models.pull import pull, pulled_path
from sampler.decode import DecodeError, check_fits, check_prompt_text, decode_prompts
from sampler.effective import config_from_dict, effective_config

if TYPE_CHECKING:
    from models.catalog import CatalogEntry

UNMASK_VERSION = package_version("unmask") or "0+unknown"
PROBE_PROMPTS = 4  # prompts of the first point that the reproducibility probe decodes


class PreparedCandidate(BaseModel):
    """A candidate pulled, verified and loadable: who it is and what its weights are (computed once)."""

    model_config = ConfigDict(frozen=True)

    ref: str  # what the user named: catalog id, bundled id or folder
    candidate: str  # the id records and the registry use
    path: str  # the folder its files are in
    role: str
    kind: str
    revision: str
    weights_sha256: str
    ids: dict[str, int | None]  # mask_id, eos_id, eot_id for SamplerConfig
    card: dict[str, Any] = {}  # the model card's header (its text left out), and `source`: the ref it came from


class SweepPoint(BaseModel):
    """One (candidate, task split, effective config) to measure, with the hashes that key its cache."""

    model_config = ConfigDict(frozen=True)

    ref: str
    candidate: str
    path: str
    role: str
    kind: str
    revision: str
    weights_sha256: str
    task: dict[str, Any]  # evals.sweep.TaskSpec fields
    settings: dict[str, Any]  # the sweep's requested settings of the point (before model ids)
    config: dict[str, Any]  # the effective config that decodes (sampler.effective), as a dict
    config_hash: str  # its hash
    dataset_hash: str
    backend: str
    label: str  # for task run names and progress


class SweepPlan(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    device: str
    dtype: str
    measure: dict[str, int]
    threads: int | None = None  # torch CPU threads while measuring (the sweep's `threads`)
    points: list[SweepPoint]
    skipped: list[str] = []
    task_validation: dict[str, dict[str, Any]] = {}  # file name -> Great Expectations summary of the task data


class MeasuredPoint(BaseModel):
    """A validated record with its Great Expectations result and Data Docs page, ready to be written."""

    record: dict[str, Any]
    validation: dict[str, Any] | None = None
    html: str | None = None


# --- the model handle, loaded once per process --------------------------------------------------

_load_lock = threading.Lock()


def weights_signature(path: Path) -> tuple[tuple[str, int, int], ...]:
    """Names, sizes and mtimes of the weight files: a changed file reloads, without hashing it."""
    files = weight_files(path) if path.is_dir() else []
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.is_file())


@functools.lru_cache(maxsize=2)
def _handle(
    ref: str, device: str, dtype: str, signature: tuple[tuple[str, int, int], ...], decoding: str
) -> Any:  # a ModelHandle
    return load(ref, device=device, dtype=dtype)


def api_entry(ref: str) -> CatalogEntry | None:
    """The catalog entry of `ref` when it is an API model (text in, text out), else None."""
    entry = catalog_entry(ref)
    return entry if entry is not None and entry.is_api else None


def handle_for(ref: str, device: str = "cpu", dtype: str = "float32") -> Any:
    """The loaded model of `ref`; each process keeps its last two (loading is the slow part of a point). A
    ModelHandle, or an APIAdapter for an API entry: callers read the one they asked for."""
    if api_entry(ref) is not None:  # nothing to load: the adapter holds the endpoint
        return load(ref)
    path = resolve_model_path(ref)
    decoding = json.dumps(catalog_decoding(ref), sort_keys=True, default=str)
    with _load_lock:
        return _handle(str(ref), device, dtype, weights_signature(path), decoding)


@functools.lru_cache(maxsize=8)
def _task_data(task_json: str) -> TaskData:
    return load_task(**json.loads(task_json))


def task_data(task_fields: dict[str, Any]) -> TaskData:
    return _task_data(json.dumps(task_fields, sort_keys=True))


# --- the steps ------------------------------------------------------------------------------------


def model_folder(ref: str) -> Path:
    """The model's folder; a catalog entry from the Hub that is not pulled yet is pulled and verified."""
    if not Path(ref).expanduser().is_dir():
        catalog = load_catalog()
        if ref in catalog:
            entry = catalog.get(ref)
            if entry.source.scheme == "hf" and pulled_path(entry.id) is None:
                return pull(entry).path
    return resolve_model_path(ref)


def identity(ref: str, handle: Any) -> tuple[str, str, str]:
    """(role, kind, revision): the catalog's where it knows `ref`, else from the model (AR -> fallback)."""
    kind = handle.kind
    role, revision = ("fallback" if kind == "autoregressive" else "candidate"), ""
    try:
        catalog = load_catalog()
        if ref in catalog:
            entry = catalog.get(ref)
            role, kind, revision = entry.role, entry.kind, entry.revision or ""
    except Exception:  # a broken catalog must not stop an evaluation of a model folder
        pass
    return role, kind, revision or handle.weights_sha256[:12]


def prepare_candidate(ref: str, device: str = "cpu", dtype: str = "float32") -> PreparedCandidate:
    """Pull and verify (when needed), load and identify a candidate; raises if it cannot be loaded.

    A model whose files, catalog entry and this code are unchanged since it was last prepared is answered
    from `evals.step_cache` without loading it."""
    entry = api_entry(ref)
    if entry is not None:
        handle = handle_for(ref)
        handle.status_or_raise()  # NotEvaluable naming the key variable, before anything is planned
        return PreparedCandidate(
            ref=ref,
            candidate=entry.id,
            path=handle.base_url,
            role=entry.role,
            kind="api",
            revision=entry.revision or f"{handle.api_model}@{handle.base_url}",
            weights_sha256="",
            ids={},
            card={
                "source": ref,
                "base_url": handle.base_url,
                "api_model": handle.api_model,
                "api_key_env": entry.api_key_env or "",
            },
        )
    path = model_folder(ref)
    key = step_cache.step_key("prepared", **model_stamp(ref, path), device=device, dtype=dtype)
    known = step_cache.cached(key, PreparedCandidate)
    if known is not None:
        return known
    handle = handle_for(ref, device, dtype)
    role, kind, revision = identity(ref, handle)
    prepared = PreparedCandidate(
        ref=ref,
        candidate=handle.entry_id,
        path=str(path),
        role=role,
        kind=kind,
        revision=revision,
        weights_sha256=handle.weights_sha256,
        ids=handle.sampler_ids(),
        card={k: v for k, v in handle.card.items() if k != "text"} | {"source": ref},
    )
    step_cache.keep(key, prepared)
    return prepared


def model_stamp(ref: str, path: Path) -> dict[str, Any]:
    """What a prepared candidate and its plan are functions of, besides the sweep: the model folder's files
    (by size and mtime), the catalog (its entries name roles, revisions, decoding defaults and pins)."""
    try:
        catalog = sorted(repr(e) for e in load_catalog())
    except Exception:
        catalog = ["<unreadable catalog>"]
    return {
        "ref": str(ref),
        "folder": str(Path(path).resolve()),
        "files": step_cache.files_stamp(Path(path)),
        "catalog": catalog,
        "unmask": UNMASK_VERSION,
    }


def plan_points(prepared: PreparedCandidate, spec: Any) -> SweepPlan:
    """The sweep's valid points for this candidate, each with its effective config and the hashes
    that key its cache; the task data is validated first (TaskDataError says what is wrong)."""
    key = None
    if prepared.kind != "api":
        sweep = {k: v for k, v in asdict(spec).items() if k != "source"}
        data_hashes = [task_data(asdict(t)).hash for t in spec.tasks]
        key = step_cache.step_key(
            "plan",
            **model_stamp(prepared.ref, Path(prepared.path)),
            prepared=prepared.model_dump(),
            sweep=sweep,
            data=data_hashes,
        )
        known = step_cache.cached(key, SweepPlan)
        if known is not None:
            return known
    plan = _plan_points(prepared, spec)
    if key is not None:
        step_cache.keep(key, plan)
    return plan


def _plan_points(prepared: PreparedCandidate, spec: Any) -> SweepPlan:
    handle = handle_for(prepared.ref, spec.device, spec.dtype)
    points, skipped, checked = [], [], {}
    for t in spec.tasks:
        fields = asdict(t)
        data = task_data(fields)
        longest = 0  # the cheap checks first: too long for the model, before the data expectations run
        if handle.kind != "api":
            try:
                for item in data.items:
                    check_prompt_text(handle, item.prompt)
                longest = max((len(handle.encode(item.prompt)) for item in data.items), default=0)
            except DecodeError as e:
                raise TaskDataError(f"{data.source or t.label}: {e}") from None
        configs = []
        for settings in valid_points(spec, t, prepared.kind):
            config, backend = build_config(settings, prepared.ids)
            effective = effective_config(handle, config)
            try:
                check_fits(handle, longest, effective.gen_length)  # a point past the context measures nothing
            except DecodeError as e:
                raise TaskDataError(
                    f"{spec.source or spec.name}: gen_length {effective.gen_length} on {t.label}: {e}"
                ) from None
            configs.append((settings, backend, effective))
        outcome = check_task(data, expected_size=None if t.file else t.n)
        checked[f"task-validation-{t.label}-{t.split}.json"] = outcome.summary()
        for settings, backend, effective in configs:
            label = " ".join(f"{k}={v}" for k, v in settings.items() if k not in ("gen_length",))
            points.append(
                SweepPoint(
                    ref=prepared.ref,
                    candidate=prepared.candidate,
                    path=prepared.path,
                    role=prepared.role,
                    kind=prepared.kind,
                    revision=prepared.revision,
                    weights_sha256=prepared.weights_sha256,
                    task=fields,
                    settings=settings,
                    config=effective.to_dict(),
                    config_hash=effective.hash(),
                    dataset_hash=data.hash,
                    backend=backend,
                    label=f"{prepared.candidate} {data.name} {label}",
                )
            )
        skipped += [f"{prepared.candidate} {t.label} {p}" for p in point_problems(spec, t, prepared.kind)]
    return SweepPlan(
        name=spec.name,
        device=spec.device,
        dtype=spec.dtype,
        measure=dict(spec.measure),
        threads=spec.threads,
        points=points,
        skipped=skipped,
        task_validation=checked,
    )


def measure_point(
    point: SweepPoint,
    plan: SweepPlan,
    html: bool = True,
    on_request: Callable[[RequestResult], None] | None = None,
    on_item: Callable[[int, int], None] | None = None,
) -> MeasuredPoint:
    """Measure, score and validate one point; a validator that breaks marks the record invalid
    instead of losing the measurement.

    on_request hears each timed request's result; on_item hears (done, total) after each of the point's
    items, 1..n for an n-item point (the progress inside a long point)."""
    if plan.threads:  # on a shared CPU, more threads than free cores makes every forward much slower
        import torch

        torch.set_num_threads(plan.threads)
    handle = handle_for(point.ref, plan.device, plan.dtype)
    candidate = Candidate(
        id=point.candidate,
        loaded=handle,
        role=point.role,
        kind=point.kind,
        revision=point.revision,
        weights_sha256=point.weights_sha256,
    )
    m = plan.measure
    data = task_data(point.task)
    done = 0

    def heard(result: RequestResult) -> None:
        nonlocal done
        done += 1
        if on_request is not None:
            on_request(result)
        if on_item is not None:
            on_item(done, len(data.items))

    record = evaluate_point(
        candidate,
        data,
        config_from_dict(point.config),
        backend=point.backend,
        device=plan.device,
        dtype=plan.dtype,
        warmup=m.get("warmup", 1),
        batch_size=m.get("batch_size", 1),
        throughput_items=m.get("throughput_items"),
        sweep=plan.name,
        on_request=heard,
    )
    try:
        outcome = validation.validate_record(record, html=html)  # looked up now: a test breaks the validator
    except Exception as e:
        record.valid = False
        record.validation = {"success": False, "failed": [], "error": f"validation could not run: {e}"}
        return MeasuredPoint(record=record.to_dict())
    return MeasuredPoint(record=record.to_dict(), validation=outcome.result, html=outcome.html)


def probe_point(point: SweepPoint, plan: SweepPlan, fresh_process: bool = True) -> ReproducibilityResult:
    """Same-process, fresh-process and batch-invariance probe of a point (the candidate's first)."""
    handle = handle_for(point.ref, plan.device, plan.dtype)
    prompts = [handle.encode(item.prompt) for item in task_data(point.task).items[:PROBE_PROMPTS]]
    return probe(
        handle,
        config_from_dict(point.config),
        prompts,
        candidate=point.candidate,
        device=plan.device,
        dtype=plan.dtype,
        fresh_process=fresh_process,
    )


PAIRED_ROUNDS = 4  # rounds of a paired speed measurement (evals.paired); each decodes every item on both sides


def measure_speed(
    point: SweepPoint,
    plan: SweepPlan,
    baseline: EvalRecord,
    baseline_ref: str,
    rounds: int = PAIRED_ROUNDS,
    seed: int = 0,
) -> SpeedComparison:
    """The candidate at `point` and the baseline model (`baseline_ref`) at its record's config, timed
    interleaved on the items of `point`'s task (each side's tokenizer encodes the same text), in this process
    at the plan's thread count (evals.paired)."""
    if plan.threads:
        import torch

        torch.set_num_threads(plan.threads)
    warmup = plan.measure.get("warmup", 1)
    sides = []
    items = task_data(point.task).items
    for ref, config in ((point.ref, point.config), (baseline_ref, baseline.config)):
        handle = handle_for(ref, plan.device, plan.dtype)
        prompts = [handle.encode(item.prompt) for item in items]
        sides.append(_decoder(handle, prompts, config_from_dict(config)))
    before = host_sample()
    timings = measure_paired(sides[0], sides[1], len(items), rounds, warmup, seed)
    return SpeedComparison.of(
        timings,
        seed,
        task=point.task["task"],
        gen_length=int(point.config.get("gen_length", baseline.gen_length)),
        config_hash=point.config_hash,
        baseline_model=baseline.candidate,
        baseline_weights_sha256=baseline.weights_sha256,
        baseline_config_hash=baseline.config_hash,
        warmup=warmup,
        host=host_during(before, host_sample()) | {"threads": plan.threads},
        when=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def measure_speeds(
    pairs: list[tuple[EvalRecord, EvalRecord]],
    plan: SweepPlan,
    baseline_ref: str,
    on_pair: Callable[[EvalRecord], None] | None = None,
    rounds: int = PAIRED_ROUNDS,
) -> list[SpeedComparison]:
    """`measure_speed` for each (candidate record, baseline record) of `pairs` (gates.results.speed_points), at
    the point of `plan` that measured the candidate's record; a record no point of the plan made is skipped."""
    found = []
    for mine, theirs in pairs:
        point = next(
            (p for p in plan.points if (p.config_hash, p.dataset_hash) == (mine.config_hash, mine.dataset_hash)), None
        )
        if point is not None:
            if on_pair is not None:
                on_pair(mine)
            found.append(measure_speed(point, plan, theirs, baseline_ref, rounds))
    return found


def _decoder(handle: Any, prompts: list[list[int]], config: Any) -> Callable[[int], int]:
    """Decode prompt i alone; its text tokens (before EOS). A decode error propagates: it ends the measurement."""

    def decode_item(i: int) -> int:
        out = decode_prompts(handle, [prompts[i]], config)
        useful: int = handle.useful_length(out.sequences[0, out.prompt_length :].tolist())
        return useful

    return decode_item


def check_license(prepared: PreparedCandidate) -> LicenseResult:
    """The catalog license checked against the model card (evals.license)."""
    card = {k: v for k, v in prepared.card.items() if k != "source"}
    result = license_for_model(prepared.ref, card or None)
    result.candidate = prepared.candidate
    return result


def assemble_evidence(
    prepared: PreparedCandidate,
    records: list[EvalRecord],
    reproducibility: ReproducibilityResult | None,
    license: LicenseResult,
    failures: list[str],
    speed: list[SpeedComparison] | None = None,
) -> CandidateEvidence:
    """Everything the gates judge of one candidate version."""
    return CandidateEvidence(
        candidate=prepared.candidate,
        role=prepared.role,
        kind=prepared.kind,
        records=records,
        reproducibility=reproducibility,
        license=license,
        model_revision=prepared.revision,
        weights_sha256=prepared.weights_sha256,
        card=dict(prepared.card),
        failures=list(failures),
        speed=list(speed or []),
    )


# --- the files ------------------------------------------------------------------------------------


@dataclass
class EvidenceFiles:
    """What an evaluation leaves in its folder, the same whichever driver ran it."""

    folder: Path
    licenses: list[dict[str, Any]] = field(default_factory=list)
    reproducibility: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def write_plan(self, plans: list[SweepPlan], spec: Any) -> None:
        store = RecordStore(self.folder)
        for plan in plans:
            for name, summary in plan.task_validation.items():
                store.write_json(name, summary)
        skipped = [s for plan in plans for s in plan.skipped]
        store.write_json(
            "sweep.json",
            {
                "name": spec.name,
                "source": spec.source,
                "models": spec.models,
                "grid": spec.grid,
                "base": spec.base,
                "measure": spec.measure,
                "skipped": skipped,
            },
        )

    def write_evidence(
        self, failures: list[str], plots: list[Path] | None = None, records: list[EvalRecord] | None = None
    ) -> None:
        store = RecordStore(self.folder)
        store.write_json("license.json", self.licenses)
        if records:
            store.write_json("parallelism.json", parallelism_summary(records))
        if self.reproducibility:
            store.write_json("reproducibility.json", self.reproducibility)
        if self.problems:
            store.write_json("evidence-problems.json", self.problems)
        if failures:
            store.write_json("failures.json", failures)


def store_measured(store: Any, measured: MeasuredPoint, tables: bool = True) -> EvalRecord:
    """Append one measured point (its record, validation result and Data Docs page) to a RecordStore."""
    record = EvalRecord.from_dict(measured.record)
    store.add(record, measured.validation, measured.html, tables=tables)
    return record


def write_candidate_files(
    folder: str | Path,
    spec: Any,
    plan: SweepPlan,
    measured: list[MeasuredPoint],
    license: LicenseResult,
    reproducibility: ReproducibilityResult | None,
    failures: list[str],
) -> Path:
    """One candidate's evaluation folder, as `unmask eval` leaves it: the plan's task checks and
    sweep.json, records (JSONL, Parquet, CSV) with their validation results and Data Docs pages,
    quality-latency plots, license.json, reproducibility.json and failures.json."""
    store = RecordStore(folder)
    files = EvidenceFiles(
        store.folder,
        licenses=[license.to_dict()],
        reproducibility=[reproducibility.to_dict()] if reproducibility else [],
    )
    files.write_plan([plan], spec)
    for point in measured:
        store_measured(store, point, tables=False)
    if store.records:
        store.write_tables()
        plot_quality_latency(store.records, store.folder)
    files.write_evidence(failures, records=store.records)
    return store.folder
