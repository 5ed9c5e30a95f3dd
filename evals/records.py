"""Evaluation records: the evidence gates read. One `EvalRecord` per (candidate, SamplerConfig, task, split).

These types are the contract between `evals/` (which produces them), `gates/` (which judges them)
and `registry/` (which stores them). Every field is a plain JSON value so a record round-trips
through Parquet, CSV, MLflow params/metrics and JSON artifacts unchanged.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from evals.paired import (
    PairedTimings,
    RatioEstimate,
    block_ratio,
    is_steady,
    paired_ratios,
    round_spread,
    rounds_percentile_ratio,
)
from models.licenses import review_class

if TYPE_CHECKING:
    import pandas as pd
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


def _from_fields(cls: type[R], data: dict[str, Any]) -> R:
    """A record dataclass from a dict: unknown keys dropped (written by a newer unmask), a missing required
    field named."""
    names = {f.name for f in fields(cls)}
    missing = [
        f.name for f in fields(cls) if f.name not in data and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ValueError(f"{cls.__name__}: missing field '{missing[0]}'")
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class EvalRecord:
    """One measurement of a candidate under one decoding configuration on one task split."""

    candidate: str  # catalog id, e.g. "tiny-llada"
    role: str  # "candidate" or "fallback"
    kind: str  # "masked-diffusion", "block-diffusion", "autoregressive", "api"
    task: str  # "arith", "arith-ko", "sort", "infill", "gsm8k", ...
    split: str  # "test", "validation", ...
    config: dict[str, Any]  # the SamplerConfig (or AR decoding settings) as a dict
    config_hash: str  # SamplerConfig.hash()
    backend: str = "torch"  # "torch" or "onnxruntime"
    device: str = "cpu"
    gen_length: int = 0
    n_items: int = 0
    # quality, in [0, 1]
    accuracy: float = 0.0  # the primary metric (strict-match for GSM8K-format tasks, else exact match)
    accuracy_strict: float | None = None
    accuracy_flexible: float | None = None
    # latency at batch 1 after warm-up, seconds per request
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    latency_p99_s: float = 0.0
    time_to_first_block_s: float | None = None  # what a chat UI can show first
    throughput_items_per_s: float | None = None  # at `batch_size`
    batch_size: int = 1
    tokens_per_s: float = 0.0  # generated tokens before the first EOS, per second
    tokens_per_s_with_padding: float = 0.0  # every generated position, EOS padding included
    tokens_per_forward: float | None = 0.0  # committed positions per model call; None: not applicable (API model)
    nfe: float | None = 0.0  # mean model calls per request; None: not applicable (an API model shows no calls)
    peak_mem_mb: float | None = 0.0  # RSS on CPU, max allocated on CUDA; None: not measurable (an API model)
    errors: int = 0  # NaN/inf logits and exceptions, counted per item
    output_hash: str = ""  # sha256 over the generated token ids of all items, in order
    dataset_hash: str = ""
    weights_sha256: str = ""
    model_revision: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)  # environment (python, torch, threads, git...)
    valid: bool | None = None  # None until validated (Great Expectations); gates refuse anything but True
    validation: dict[str, Any] = field(default_factory=dict)  # failed expectations and the GX result summary
    run_id: str | None = None  # MLflow run holding this record, once logged
    created_at: str = ""  # ISO 8601 UTC
    # added after the first contract; all optional
    error_messages: list[str] = field(default_factory=list)  # the first few errors, in words
    expected_items: int | None = None  # the task split's size; validation checks n_items against it
    warmup: int = 0  # requests run and discarded before latency was measured
    sweep: str = ""  # name of the sweep that produced the record, if any

    @property
    def record_id(self) -> str:
        """Identity of what was measured (not when): candidate, weights, config, task, split, backend."""
        key = json.dumps(
            [
                self.candidate,
                self.weights_sha256,
                self.config_hash,
                self.task,
                self.split,
                self.backend,
                self.dataset_hash,
            ],
            separators=(",", ":"),
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"record_id": self.record_id}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalRecord:
        return _from_fields(cls, data)


@dataclass
class ReproducibilityResult:
    """Evidence for the reproducibility gate."""

    candidate: str
    reproducible: bool
    same_process: bool  # two runs in one process gave identical output hashes
    fresh_process: bool  # a run in a fresh process gave the same hash
    batch_invariant: bool  # each prompt's output alone equals its output in a batch
    differences: list[str] = field(default_factory=list)  # what differed, in words
    output_hashes: list[str] = field(default_factory=list)
    config_hash: str = ""
    fingerprint: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LicenseResult:
    """Evidence for the license gate."""

    candidate: str
    expression: str  # the SPDX expression (or "other")
    tier: str  # "permitted", "caution", "restricted", "unknown"
    reasons: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)  # e.g. catalog and model card disagree
    # models/licenses.py: "permissive" passes the license review, "sign-off" waits for a named person's
    license_class: str = ""

    def __post_init__(self) -> None:
        if not self.license_class:  # evidence stored before license classes: classed from its expression
            self.license_class = review_class(self.expression)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CandidateEvidence:
    """Everything gates need to judge one candidate version."""

    candidate: str
    role: str
    kind: str
    records: list[EvalRecord]
    reproducibility: ReproducibilityResult | None = None
    license: LicenseResult | None = None
    model_revision: str = ""
    weights_sha256: str = ""
    card: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # a model that failed to load or decode, in words
    # measured through a server (`unmask loadtest`), logged against this version; the serving gate reads them
    serving: list[ServingRecord] = field(default_factory=list)
    # the version's rollouts (registry.rollouts.canary_evidence): {id, status, analyses: [{weight, verdict}]}; the
    # canary gate reads them
    canary: list[dict[str, Any]] = field(default_factory=list)
    # candidate vs baseline timed interleaved on the same prompts (evals.paired); the speed gates read them
    speed: list[SpeedComparison] = field(default_factory=list)

    def speed_against(
        self, baseline: CandidateEvidence | None, task: str, gen_length: int, config_hash: str
    ) -> SpeedComparison | None:
        """The latest paired comparison of `config_hash` on `task` at `gen_length` against exactly `baseline`'s
        weights, else None."""
        if baseline is None:
            return None
        found = [
            s
            for s in self.speed
            if (s.task, s.gen_length, s.config_hash) == (task, gen_length, config_hash)
            and s.baseline_model == baseline.candidate
            and s.baseline_weights_sha256 == baseline.weights_sha256
        ]
        return max(found, key=lambda s: s.when) if found else None


@dataclass(frozen=True)
class SpeedComparison:
    """A candidate's decoding config and a baseline model's, timed interleaved on the same prompts of one task
    (evals.paired): the raw timings, each ratio with its 95% interval, how steady the host was."""

    task: str
    gen_length: int
    config_hash: str  # the candidate's effective config that decoded
    baseline_model: str  # registered name of the model compared against (the fallback's)
    baseline_weights_sha256: str
    baseline_config_hash: str
    items: int
    rounds: int
    warmup: int
    timings: dict[str, Any]  # evals.paired.PairedTimings.to_dict(): seconds [round][item] per side, tokens, order
    ratios: dict[str, dict[str, float] | None]  # p50, p95, tokens_per_s: {estimate, low, high}, candidate/baseline
    spread: float  # evals.paired.round_spread: 1.0 when each item's paired ratio repeats exactly
    steady: bool  # spread within evals.paired.UNSTEADY_SPREAD
    concurrency: int = 1
    seed: int = 0
    host: dict[str, Any] = field(default_factory=dict)  # load average, busy and steal shares during the run
    when: str = ""  # ISO 8601 UTC

    @classmethod
    def of(cls, timings: PairedTimings, seed: int = 0, **identity: Any) -> SpeedComparison:
        """A comparison from its raw timings: the ratios with their intervals, the spread and whether the host was
        steady follow from them (evals.paired); `identity` names what was compared and how (task, configs, ...)."""
        kept = timings.to_dict()
        timings = PairedTimings.from_dict(kept)  # figures from the stored (rounded) timings: a reviewer recomputes them
        spread = round(round_spread(timings), 4)
        return cls(
            **identity,
            items=timings.items,
            rounds=timings.rounds,
            timings=kept,
            ratios={k: v.to_dict() if v else None for k, v in paired_ratios(timings, seed=seed).items()},
            spread=spread,
            steady=is_steady(spread),
            seed=seed,
        )

    def ratio(self, name: str) -> RatioEstimate | None:
        value = self.ratios.get(name)
        return RatioEstimate.from_dict(value) if value else None

    def key(self) -> tuple[Any, ...]:
        """What was compared (not how it timed): evidence that holds the same key judges alike."""
        return (
            self.task,
            self.gen_length,
            self.config_hash,
            self.baseline_model,
            self.baseline_weights_sha256,
            self.baseline_config_hash,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeedComparison:
        return _from_fields(cls, data)


INTERVAL_FIGURES = ("latency_p50_s", "latency_p99_s", "ttfb_p50_s", "tokens_per_s", "accuracy")


@dataclass(frozen=True)
class ServingRecord:
    """One (served version, concurrency) measurement of `unmask loadtest`: what N users in flight see."""

    model: str  # registered model (or the endpoint's model name)
    version: str  # registered version ("" for an endpoint outside the registry)
    weights_sha256: str  # of the weights that answered, as the server named them ("" when it does not)
    concurrency: int  # requests in flight
    requests: int  # requests sent (answered + failed)
    latency_p50_s: float | None
    latency_p95_s: float | None
    latency_p99_s: float | None
    ttfb_p50_s: float | None  # time to first byte; equals latency when the server does not stream
    tokens_per_s: float | None  # generated text tokens (usage.completion_tokens, no EOS padding) per wall second
    requests_per_s: float
    error_rate: float  # failed / sent
    same_answer_share: float | None  # answers byte-identical to the solo (concurrency 1) answer of the same prompt
    streamed: bool = False  # whether TTFB was measured on a stream
    served_as: str = ""  # the name the requests used (an alias such as production)
    base_url: str = ""
    when: str = ""  # ISO 8601 UTC
    environment: dict[str, Any] = field(default_factory=dict)  # evals.fingerprint.environment_fingerprint
    run_id: str | None = None  # MLflow run holding it, once logged
    # a paired load test (several models, their blocks interleaved round by round, evals.loadtest): the id its
    # records share, and this model's block per round ({"tokens", "wall_s", "answered", "counted", "first"})
    paired_run: str = ""
    blocks: list[dict[str, Any]] = field(default_factory=list)
    # answers scored against their prompts' targets: the task's metric, the mean score (a failed request 0)
    metric: str = ""
    accuracy: float | None = None
    tokens_per_forward: float | None = None  # text tokens per model call of the decode that made them (unmask.nfe)
    # 95% intervals, each {"estimate", "low", "high"}, of INTERVAL_FIGURES (evals.loadtest.figure_intervals)
    intervals: dict[str, dict[str, float]] = field(default_factory=dict)
    # per request, in the order sent: latency_s, ttfb_s, tokens, score (None where failed): every figure and
    # interval above recomputes from these and `blocks`
    per_request: dict[str, list[Any]] = field(default_factory=dict)
    host: str = ""  # the machine the load test ran on (its network name)

    def interval(self, figure: str) -> RatioEstimate | None:
        """The 95% interval of `figure` (one of INTERVAL_FIGURES), or None where it was not measured."""
        data = self.intervals.get(figure)
        return RatioEstimate.from_dict(data) if data else None

    def tokens_per_s_against(self, other: ServingRecord) -> RatioEstimate | None:
        """Text tokens/s of this record over `other`'s with a 95% interval, when both come from one paired load
        test with the same rounds (a bootstrap over rounds, evals.paired.block_ratio); else None."""
        if not self.paired_run or self.paired_run != other.paired_run or len(self.blocks) != len(other.blocks):
            return None
        return block_ratio(self.blocks, other.blocks)

    def latencies_by_round(self) -> list[list[float]] | None:
        """Each round's answered request latencies, in round order (the requests were kept in the order sent, block
        by block); None when the record does not keep them (older records, or a load test run as one block)."""
        latencies = self.per_request.get("latency_s")
        sent = [b.get("sent") for b in self.blocks]
        sizes = [n for n in sent if isinstance(n, int)]
        if not latencies or not sizes or len(sizes) != len(sent) or sum(sizes) != len(latencies):
            return None
        out, at = [], 0
        for n in sizes:
            out.append([float(t) for t in latencies[at : at + n] if t is not None])
            at += n
        return out

    def latency_against(self, other: ServingRecord, q: float = 95) -> RatioEstimate | None:
        """The `q`-th percentile latency of this record over `other`'s with a 95% interval, when both come from one
        paired load test with the same rounds and keep their requests (a bootstrap over rounds); else None."""
        mine, theirs = self.latencies_by_round(), other.latencies_by_round()
        if not self.paired_run or self.paired_run != other.paired_run or mine is None or theirs is None:
            return None
        return rounds_percentile_ratio(mine, theirs, q)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingRecord:
        return _from_fields(cls, data)


# Fields holding dicts or lists travel as JSON text in tables (Parquet, CSV), so every column is flat.
JSON_FIELDS = ("config", "fingerprint", "validation", "error_messages")


def records_to_frame(records: list[EvalRecord]) -> pd.DataFrame:
    """A pandas DataFrame, one row per record, with `record_id` and the JSON_FIELDS as JSON text."""
    import pandas as pd

    rows = []
    for record in records:
        row = record.to_dict()
        for name in JSON_FIELDS:
            row[name] = json.dumps(row[name], sort_keys=True, default=str)
        rows.append(row)
    columns = [f.name for f in fields(EvalRecord)] + ["record_id"]
    return pd.DataFrame(rows, columns=columns)


def records_from_frame(frame: pd.DataFrame) -> list[EvalRecord]:
    """The inverse of `records_to_frame` (NaN cells of optional columns become None)."""
    import math

    records = []
    for row in frame.to_dict(orient="records"):
        row = {k: v.item() if hasattr(v, "item") else v for k, v in row.items()}  # numpy scalars -> Python
        row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        for name in JSON_FIELDS:
            if isinstance(row.get(name), str):
                row[name] = json.loads(row[name])
        for f in fields(EvalRecord):  # CSV reads an empty string back as NaN
            if isinstance(f.default, str) and row.get(f.name) is None:
                row[f.name] = f.default
        records.append(EvalRecord.from_dict(row))
    return records
