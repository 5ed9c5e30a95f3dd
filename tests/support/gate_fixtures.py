"""Evidence as the evaluation produces it, with realistic values for the bundled tiny models on CPU.

tiny-llada at gen_length 32: exact-match 0.72 on arith, p95 0.18 s; tiny-ar (the AR fallback): 0.70 at
p95 0.09 s. So tiny-llada clears poc and staging but is too slow for production (speedup 0.5x < 1x)
unless a faster SamplerConfig (parallel decoding) is measured.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlflow.tracking._tracking_service import utils as _tracking_utils

from evals.paired import PairedTimings
from evals.records import (
    CandidateEvidence,
    EvalRecord,
    LicenseResult,
    ReproducibilityResult,
    ServingRecord,
    SpeedComparison,
)
from registry import keys

WEIGHTS = {
    "tiny-llada": hashlib.sha256(b"tiny-llada weights").hexdigest(),
    "tiny-ar": hashlib.sha256(b"tiny-ar weights").hexdigest(),
}
DATASETS = {"arith": hashlib.sha256(b"arith test").hexdigest(), "sort": hashlib.sha256(b"sort test").hexdigest()}


def _config_hash(config: dict) -> str:
    return hashlib.sha256(repr(sorted(config.items())).encode()).hexdigest()[:16]


def record(candidate: str = "tiny-llada", task: str = "arith", **overrides) -> EvalRecord:
    """One validated record at gen_length 32; `overrides` change any field (config too)."""
    ar = candidate == "tiny-ar"
    config = (
        {
            "steps": 32,
            "gen_length": 32,
            "block_length": 16,
            "temperature": 0.0,
            "remasking": "low_confidence",
            "seed": 0,
        }
        if not ar
        else {"gen_length": 32, "steps": 32, "block_length": 16, "temperature": 0.0, "seed": 0}
    )
    config.update(overrides.pop("config", {}))
    values = dict(
        candidate=candidate,
        role="fallback" if ar else "candidate",
        kind="autoregressive" if ar else "masked-diffusion",
        task=task,
        split="test",
        config=config,
        config_hash=_config_hash(config),
        gen_length=32,
        n_items=120,
        accuracy=0.70 if ar else 0.72,
        accuracy_strict=None,
        accuracy_flexible=None,
        latency_p50_s=0.075 if ar else 0.15,
        latency_p95_s=0.09 if ar else 0.18,
        latency_p99_s=0.1 if ar else 0.21,
        tokens_per_s=420.0 if ar else 210.0,
        tokens_per_s_with_padding=700.0 if ar else 355.0,
        tokens_per_forward=1.0,
        nfe=32.0,
        peak_mem_mb=395.0 if ar else 430.0,
        errors=0,
        output_hash=hashlib.sha256(f"{candidate}/{task}/{config}".encode()).hexdigest(),
        dataset_hash=DATASETS.get(task, DATASETS["arith"]),
        weights_sha256=WEIGHTS[candidate],
        model_revision="local",
        fingerprint={"python": "3.11.9", "torch": "2.13.0+cpu", "threads": 2},
        valid=True,
        validation={"success": True, "failed": []},
        created_at="2026-11-30T10:00:00Z",
    )
    if task == "sort":
        values.update(accuracy=0.61 if ar else 0.64, latency_p95_s=0.1 if ar else 0.2)
    values.update(overrides)
    return EvalRecord(**values)


def evidence(
    candidate: str = "tiny-llada",
    records: list[EvalRecord] | None = None,
    tier: str = "permitted",
    reproducible: bool = True,
    fallback: EvalRecord | None = None,
    **overrides,
) -> CandidateEvidence:
    """`candidate`'s evidence; a candidate's arith records timed in pairs against `fallback` (default: the
    fixture's tiny-ar record), each pair at the two records' p95 ratio."""
    records = records if records is not None else [record(candidate, "arith"), record(candidate, "sort")]
    first = records[0] if records else record(candidate)
    repro = ReproducibilityResult(
        candidate=candidate,
        reproducible=reproducible,
        same_process=reproducible,
        fresh_process=reproducible,
        batch_invariant=reproducible,
        differences=[] if reproducible else ["fresh process: output hash differs"],
        output_hashes=[first.output_hash] * 3,
        config_hash=first.config_hash,
    )
    lic = LicenseResult(
        candidate=candidate,
        expression="Apache-2.0" if tier == "permitted" else "LicenseRef-custom",
        tier=tier,
        reasons=[] if tier == "permitted" else [f"license tier {tier}"],
    )
    values = dict(
        candidate=candidate,
        role=first.role,
        kind=first.kind,
        records=records,
        reproducibility=repro,
        license=lic,
        model_revision=first.model_revision,
        weights_sha256=first.weights_sha256,
        card={"intended_use": "tests"},
    )
    values.update(overrides)
    values.setdefault("serving", [serving_record(candidate, weights_sha256=values["weights_sha256"])])
    if candidate != "tiny-ar":
        theirs = fallback or record("tiny-ar", "arith")
        values.setdefault("speed", [paired(r, theirs) for r in records if r.task == "arith"])
    return CandidateEvidence(**values)


def paired(
    mine: EvalRecord, theirs: EvalRecord, ratio: float | None = None, items: int = 8, rounds: int = 3, **overrides
) -> SpeedComparison:
    """A paired speed measurement of `mine` against `theirs` whose every pair has the candidate/baseline p95
    ratio of the two records (or `ratio`): a steady host, an interval of zero width."""
    ratio = round(mine.latency_p95_s / theirs.latency_p95_s if ratio is None else ratio, 3)
    # four decimals of a second times three of a ratio: the stored timings (seven decimals) keep every pair's
    # ratio exact, so the interval has zero width as stored
    base = tuple(round(theirs.latency_p95_s * (0.8 + 0.2 * i / (items - 1)), 4) for i in range(items))
    timings = PairedTimings(
        tuple(tuple(round(t * ratio, 7) for t in base) for _ in range(rounds)),
        tuple(base for _ in range(rounds)),
        tuple([24] * items),
        tuple([24] * items),
        tuple(tuple(i % 2 == 0 for i in range(items)) for _ in range(rounds)),
    )
    measured = SpeedComparison.of(
        timings,
        task=mine.task,
        gen_length=mine.gen_length,
        config_hash=mine.config_hash,
        baseline_model=theirs.candidate,
        baseline_weights_sha256=theirs.weights_sha256,
        baseline_config_hash=theirs.config_hash,
        warmup=1,
        when="2026-11-30T10:00:00Z",
    )
    return replace(measured, **overrides)


def block_evidence(
    name: str, config: dict, weights_sha256: str, fallback: EvalRecord | None = None
) -> CandidateEvidence:
    """Evidence of a block-diffusion candidate `name` at its recorded BlockDiffusionConfig `config`: a diffusion
    candidate's arith record and evidence, renamed, with its own weights digest and no serving records."""
    rec = replace(
        record("tiny-llada", "arith"),
        candidate=name,
        kind="block-diffusion",
        config=config,
        weights_sha256=weights_sha256,
    )
    return replace(
        evidence("tiny-llada", [rec], weights_sha256=weights_sha256, serving=[], fallback=fallback),
        candidate=name,
        kind="block-diffusion",
    )


def serving_record(candidate: str = "tiny-llada", concurrency: int = 16, **overrides) -> ServingRecord:
    """What `unmask loadtest` logs for one level: tiny-llada at 16 in flight p95 0.9 s, 1.2x the fallback's tokens/s,
    measured in one paired load test of both (4 rounds of 16 requests, each round's block at the record's
    tokens/s, so the paired ratio is the records' ratio with an interval of zero width)."""
    ar = candidate == "tiny-ar"
    values = dict(
        model=candidate,
        version="1",
        weights_sha256=WEIGHTS[candidate],
        concurrency=concurrency,
        requests=64,
        latency_p50_s=0.5 if ar else 0.7,
        latency_p95_s=0.6 if ar else 0.9,
        latency_p99_s=0.65 if ar else 1.0,
        ttfb_p50_s=0.5 if ar else 0.7,
        tokens_per_s=800.0 if ar else 960.0,
        requests_per_s=30.0 if ar else 20.0,
        error_rate=0.0,
        same_answer_share=1.0,
        served_as="fallback" if ar else "production",
        run_id=f"serving-{candidate}",
        when="2026-11-30T10:30:00Z",
    )
    values.update(overrides)
    tps = values["tokens_per_s"]
    if tps is not None:
        values.setdefault("paired_run", "load-1")
        rounds = [
            {"tokens": tps, "wall_s": 1.0, "answered": 16, "counted": True, "first": i % 2 == 0} for i in range(4)
        ]
        values.setdefault("blocks", rounds)
    return ServingRecord(**values)


def fast_llada() -> CandidateEvidence:
    """tiny-llada measured with parallel decoding: same quality, p95 0.07 s (1.3x faster than tiny-ar)."""
    config = {"steps": 32, "parallel": "threshold", "parallel_threshold": 0.9}
    records = [
        record("tiny-llada", "arith", config=config, latency_p95_s=0.07, nfe=9.0, tokens_per_forward=3.6),
        record("tiny-llada", "sort", config=config, latency_p95_s=0.075, nfe=9.0, tokens_per_forward=3.6),
    ]
    return evidence("tiny-llada", records)


def signoffs(*items: str, by: str = "ada") -> dict[str, dict[str, str]]:
    return {i: {"by": by, "at": "2026-11-30T11:00:00Z", "comment": f"{i} reviewed and accepted"} for i in items}


ALL_MANUAL = ("fallback-plan", "tooling-maturity", "security-review", "monitoring-plan", "model-card")


def with_records(ev: CandidateEvidence, records: list[EvalRecord]) -> CandidateEvidence:
    return replace(ev, records=records)


# A migrated, empty MLflow SQLite store, built once per test process; each test copies it (~0.05 s)
# instead of creating and migrating a database (~2 s, much more on a loaded machine).
@functools.lru_cache(maxsize=1)
def _template_db() -> Path:
    from registry import Registry

    folder = Path(tempfile.mkdtemp(prefix="unmask-mlflow-template-"))
    atexit.register(shutil.rmtree, folder, True)
    Registry(f"sqlite:///{folder / 'mlflow.db'}").model_names()
    return folder / "mlflow.db"


def fresh_registry(folder: Path):
    """An empty registry of its own under `folder` (artifacts beside the database)."""
    from registry import Registry

    (folder / "mlflow").mkdir(parents=True, exist_ok=True)
    db = folder / "mlflow" / "mlflow.db"
    shutil.copy(_template_db(), db)
    return Registry(f"sqlite:///{db}")


# Columns where MLflow keeps a run's, an experiment's or a version's artifacts as an absolute path.
_PATH_COLUMNS = {
    "experiments": ("artifact_location",),
    "runs": ("artifact_uri",),
    "model_versions": ("source", "storage_location"),
}


@functools.cache
def _built(build: Callable[[Any], object]) -> Path:
    """The folder of a registry that `build` filled, built once per test process under a state and keys folder of
    its own (so nothing it writes there leaks into the test that first asked)."""
    root = Path(tempfile.mkdtemp(prefix=f"unmask-built-{build.__name__}-"))
    atexit.register(shutil.rmtree, root, True)
    saved = {name: os.environ.get(name) for name in ("UNMASK_HOME", keys.KEYS_ENV, "MLFLOW_TRACKING_URI")}
    os.environ.update(UNMASK_HOME=str(root / "home"), **{keys.KEYS_ENV: str(root / "keys")})
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        build(fresh_registry(root / "store"))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return root / "store" / "mlflow"


def built_registry(folder: Path, build: Callable[[Any], object]):
    """A registry of its own under `folder` holding what `build(reg)` made: built once per test process and copied
    (its files, and the absolute artifact paths MLflow keeps, moved to `folder`), where a module's tests each
    built it again (moved_twice_and_rolled_back: about 4 s a test on two busy cores)."""
    from registry import Registry

    source = _built(build)
    target = folder / "mlflow"
    shutil.copytree(source, target)
    with sqlite3.connect(target / "mlflow.db") as db:
        for table, columns in _PATH_COLUMNS.items():
            for column in columns:
                db.execute(f"UPDATE {table} SET {column} = REPLACE({column}, ?, ?)", (str(source), str(target)))
    db.close()
    # every copy holds the same run ids, and MLflow keeps each run's artifact repository for the process, by run id
    # (its client's `_artifact_repos_cache`): forget them, or a copy's artifacts are written into an earlier one's
    _tracking_utils._artifact_repos_cache.clear()
    return Registry(f"sqlite:///{target / 'mlflow.db'}")


def register_pair(reg, candidate: CandidateEvidence | None = None) -> tuple[str, str]:
    """Register tiny-ar as the fallback and tiny-llada (or `candidate`) as a candidate: (fallback v, candidate v)."""
    from registry import register_evidence

    v_ar, _ = register_evidence(reg, evidence("tiny-ar"))
    v, _ = register_evidence(reg, candidate or evidence())
    return v_ar, v


def paired_registry(folder: Path):
    """`register_pair` on a registry of its own under `folder` (tiny-ar v1, tiny-llada v1), built once per process."""
    return built_registry(folder, register_pair)


OK = "evidence reviewed, gates and checklist are green"  # the comment of an approval whose reviewer found nothing


def sign_all(reg, model: str, version: str, *stages: str) -> None:
    """ada signs off every manual checklist item of each stage, as the architect of the fixtures."""
    from checklists import load_checklist
    from registry import sign_off

    for stage in stages:
        for item in load_checklist(stage).manual_items():
            sign_off(reg, model, version, stage, item, "ada", f"{item} checked for {stage}")


def act_as(person: str | None) -> None:
    """From here on the CLI and every call that names nobody act as `person`: the test's keys folder (one per test,
    holding every person's key pair) acts as them, as `person`'s own folder would (`unmask keys init --name`).
    None: as this OS account again. The in-process API names its actor instead (`approve(reg, ..., "grace", ...)`),
    and `person`'s key signs for them; where the roles list that key, it is `person` (two listed keys, two people).
    """
    home = keys.keys_home()
    home.mkdir(parents=True, exist_ok=True)
    if person is None:
        (home / keys.IDENTITY).unlink(missing_ok=True)
        return
    keys.signer(person, home) or keys.init(person, home, default=False)
    (home / keys.IDENTITY).write_text(person + "\n")


def approve_as(reg, model: str, version: str, stage: str, comment: str, *people: str) -> None:
    """Each of `people` approves, signing with their own key (listed in the roles: `tests.support.governance`)."""
    from registry import approve

    for person in people:
        approve(reg, model, version, stage, person, comment)


def held_at_poc(reg) -> None:
    """poc held by tiny-llada@1 through a real promotion (requested, approved, moved, consumed)."""
    from registry import promote

    _, v = register_pair(reg)
    sign_all(reg, "tiny-llada", v, "poc")
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)


def moved_twice_and_rolled_back(reg) -> None:
    """poc moved three times: tiny-ar, then tiny-llada, then rolled back to tiny-ar by oncall (the history and
    events tests' chain: sign-offs, approvals, promotions and a rollback)."""
    from registry import promote, rollback

    register_pair(reg)
    sign_all(reg, "tiny-llada", "1", "poc")
    sign_all(reg, "tiny-ar", "1", "poc")
    promote("tiny-ar", "poc", approver="grace", comment=OK, registry=reg)
    promote("tiny-llada", "poc", approver="grace", comment=OK, registry=reg)
    rollback("poc", who="oncall", comment="p95 regression", registry=reg)
