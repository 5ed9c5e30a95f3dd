"""Data validation with Great Expectations 1.x (ephemeral context): task data and eval records.

Task data: unique ids, non-empty questions, parseable answers, the split's size, no held-out item
in training. Eval records: accuracy in [0, 1], positive latencies with p50 <= p95 <= p99, NFE
within the configuration's bounds, item count equal to the task size, no missing fields. A record
that fails is marked `valid=False` with its failed expectations; gates refuse it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from evals.records import EvalRecord, records_to_frame
from evals.store import write_atomic
from models.state import state_dir

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.data_context.data_context.ephemeral_data_context import EphemeralDataContext
    from great_expectations.datasource.fluent.pandas_datasource import PandasDatasource

REQUIRED_RECORD_FIELDS = (
    "candidate",
    "role",
    "kind",
    "task",
    "split",
    "config_hash",
    "backend",
    "device",
    "n_items",
    "accuracy",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "tokens_per_s",
    "tokens_per_forward",
    "nfe",
    "peak_mem_mb",
    "errors",
    "output_hash",
    "dataset_hash",
    "weights_sha256",
    "expected_items",
)
NOT_MEASURED_THROUGH_API = ("tokens_per_forward", "nfe", "peak_mem_mb")
GSM8K_ANSWER = r"#### -?[0-9.,]+"


class TaskDataError(ValueError):
    """Task data that failed its expectations; the message lists them."""


@dataclass
class ValidationOutcome:
    """A validation's verdict, its failed expectations in words, the full GX result and Data Docs HTML."""

    success: bool
    failed: list[dict[str, Any]]
    result: dict[str, Any] = field(default_factory=dict)  # ExpectationSuiteValidationResult.to_json_dict()
    html: str = ""

    def summary(self) -> dict[str, Any]:
        """What is kept on the record itself (EvalRecord.validation)."""
        stats = self.result.get("statistics", {})
        return {
            "success": self.success,
            "suite": self.result.get("suite_name"),
            "failed": self.failed,
            "evaluated": stats.get("evaluated_expectations"),
            "successful": stats.get("successful_expectations"),
            "engine": f"great_expectations {gx_version()}",
        }

    def messages(self) -> list[str]:
        return [
            f"{f['expectation']}({', '.join(f'{k}={v}' for k, v in f['kwargs'].items())})"
            + (f": {f['observed']}" if f.get("observed") else "")
            for f in self.failed
        ]


def gx_version() -> str:
    return metadata.version("great_expectations")  # the installed release, without importing it


@lru_cache(maxsize=1)
def context() -> EphemeralDataContext:
    """One ephemeral GX context per process, progress bars off."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    return ctx


# GX's context is not safe across threads: its suite, asset and batch definition are deleted and added again per
# call, so two threads of one process (a Dask executor's cells) saw each other's half-made suite ("Store already has
# the following key"). One validation at a time per process; it is milliseconds beside the evaluation it follows.
_CONTEXT_IN_USE = threading.Lock()


def run_suite(name: str, frame: pd.DataFrame, expectations: list[Any], html: bool = True) -> ValidationOutcome:
    """Validate a pandas frame against `expectations` in a throwaway suite named `name`."""
    with _CONTEXT_IN_USE:
        return _run_suite(name, frame, expectations, html)


def _run_suite(name: str, frame: pd.DataFrame, expectations: list[Any], html: bool) -> ValidationOutcome:
    import great_expectations as gx

    ctx = context()
    try:
        # a pandas source: add_pandas below made it, on an earlier call in this process
        source = cast("PandasDatasource", ctx.data_sources.get("unmask"))
    except (KeyError, ValueError):
        source = ctx.data_sources.add_pandas("unmask")
    try:
        asset = source.get_asset(name)
    except (LookupError, ValueError):
        asset = source.add_dataframe_asset(name)
    try:
        batch_definition = asset.get_batch_definition("whole")
    except (KeyError, ValueError):
        batch_definition = asset.add_batch_definition_whole_dataframe("whole")
    try:
        ctx.suites.delete(name)
    except Exception:  # no such suite yet
        pass
    suite = ctx.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    result = batch_definition.get_batch(batch_parameters={"dataframe": frame}).validate(suite)
    failed = [describe_failure(r) for r in result.results if not r.success]
    page = ""
    if html:
        # GX re-exports these without __all__, so under no_implicit_reexport they read as private
        from great_expectations.render.renderer import ValidationResultsPageRenderer  # type: ignore[attr-defined]
        from great_expectations.render.view import DefaultJinjaPageView  # type: ignore[attr-defined]

        document = ValidationResultsPageRenderer().render(result)
        page = DefaultJinjaPageView().render(document)  # type: ignore[no-untyped-call]  # GX leaves it unannotated
    return ValidationOutcome(
        success=bool(result.success),
        failed=failed,
        result=json.loads(json.dumps(result.to_json_dict(), default=str)),
        html=page,
    )


def describe_failure(r: Any) -> dict[str, Any]:
    kwargs = {
        k: v for k, v in r.expectation_config.kwargs.items() if k not in ("batch_id", "value_set") and v is not None
    }
    observed = r.result.get("partial_unexpected_list") or r.result.get("observed_value")
    if r.exception_info and r.exception_info.get("raised_exception"):
        observed = r.exception_info.get("exception_message")
    return {
        "expectation": r.expectation_config.type,
        "kwargs": json.loads(json.dumps(kwargs, default=plain)),
        "observed": json.loads(json.dumps(observed, default=plain)) if observed is not None else None,
    }


# --- task data ------------------------------------------------------------------------------


def task_expectations(task: Any, expected_size: int | None = None) -> list[Any]:
    # GX re-exports its expectations without __all__, so under no_implicit_reexport they read as private
    from great_expectations.expectations import (  # type: ignore[attr-defined]
        ExpectColumnValuesToBeInSet,
        ExpectColumnValuesToBeUnique,
        ExpectColumnValuesToMatchRegex,
        ExpectColumnValuesToNotBeInSet,
        ExpectColumnValuesToNotBeNull,
        ExpectTableRowCountToEqual,
    )

    ex: list[Any] = [
        ExpectColumnValuesToBeUnique(column="key"),
        ExpectColumnValuesToNotBeNull(column="prompt"),
        ExpectColumnValuesToMatchRegex(column="prompt", regex=r"\S"),
        ExpectColumnValuesToBeInSet(column="split", value_set=[task.split]),
        ExpectTableRowCountToEqual(value=expected_size if expected_size is not None else len(task.items)),
    ]
    if "strict-match" in task.metrics:  # GSM8K format: the reference ends in `#### N`
        ex.append(ExpectColumnValuesToMatchRegex(column="answer", regex=GSM8K_ANSWER))
    else:
        ex.append(ExpectColumnValuesToMatchRegex(column="target", regex=r"\S"))
    if task.train_keys and task.split != "train":
        ex.append(ExpectColumnValuesToNotBeInSet(column=task.leak_column, value_set=sorted(task.train_keys)))
    return ex


def validate_task(task: Any, expected_size: int | None = None) -> ValidationOutcome:
    """Validate an evals.evaluate.TaskData; see `check_task` for the raising form."""
    import pandas as pd

    frame = pd.DataFrame(
        [i.to_dict() for i in task.items], columns=["task", "prompt", "answer", "target", "key", "split"]
    )
    return run_suite(f"task-data-{task.name}-{task.split}", frame, task_expectations(task, expected_size), html=False)


def task_validation_key(task: Any, expected_size: int | None = None) -> str:
    """What a task split's validation depends on: its items' content hash, the fields its expectations read, the
    expected size, the Great Expectations release and these rules (this file's bytes)."""
    parts = {
        "dataset": task.hash,
        "name": task.name,
        "split": task.split,
        "metrics": list(task.metrics),
        "train_keys": hashlib.sha256("\n".join(sorted(task.train_keys)).encode()).hexdigest(),
        "leak_column": task.leak_column,
        "expected_size": expected_size,
        "great_expectations": metadata.version("great_expectations"),
        "rules": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def validated_task(task: Any, expected_size: int | None = None, cache: Path | None = None) -> ValidationOutcome:
    """`validate_task`, its outcome kept by content (`task_validation_key`) under `<state>/validation/`: the same
    items validated once are not validated again, and a cached run never imports Great Expectations."""
    path = (cache or state_dir() / "validation") / f"task-{task_validation_key(task, expected_size)}.json"
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        return ValidationOutcome(success=kept["success"], failed=kept["failed"], result=kept["result"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: validate again
        pass
    outcome = validate_task(task, expected_size)
    kept = {"success": outcome.success, "failed": outcome.failed, "result": outcome.result}
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(kept, sort_keys=True), encoding="utf-8"))
    return outcome


def check_task(task: Any, expected_size: int | None = None, cache: Path | None = None) -> ValidationOutcome:
    """Raise TaskDataError listing the failed expectations of a task split; else return the outcome (kept by
    content: `validated_task`)."""
    outcome = validated_task(task, expected_size, cache)
    if not outcome.success:
        raise TaskDataError(
            f"task data {task.source or task.name} ({task.split}) failed validation: " + "; ".join(outcome.messages())
        )
    return outcome


# --- eval records ---------------------------------------------------------------------------


def nfe_bound(record: EvalRecord) -> float:
    """Most model calls a request may take: the step budget for diffusion, one per token (+ prefill) for AR."""
    cfg = record.config or {}
    if record.kind == "autoregressive":
        return float(cfg.get("gen_length", record.gen_length) + 1)
    # a block config records its canvas only for the masked loops (SDAR's, Nemotron's; BlockDiffusionConfig.to_dict):
    # each block's steps and the pass caching it; a block per new token at most
    if "canvas" in cfg:
        return float((cfg["max_denoising_steps"] + 1) * (cfg["max_new_tokens"] + 1))
    steps = float(cfg.get("steps", record.gen_length))
    draft = cfg.get("speculative_draft") or 0
    return steps * max(1, int(draft))  # a speculative call evaluates up to `draft` drafted canvases


def record_expectations(kind: str | None = None) -> list[Any]:
    """What a valid record holds; an API model's record has no token-level fields (NFE, tokens per forward)
    and no memory (the provider's), so those are expected absent rather than checked."""
    # GX re-exports its expectations without __all__, so under no_implicit_reexport they read as private
    from great_expectations.expectations import (  # type: ignore[attr-defined]
        ExpectColumnPairValuesAToBeGreaterThanB,
        ExpectColumnPairValuesToBeEqual,
        ExpectColumnToExist,
        ExpectColumnValuesToBeBetween,
        ExpectColumnValuesToBeNull,
        ExpectColumnValuesToNotBeNull,
    )

    api = kind == "api"
    required = [f for f in REQUIRED_RECORD_FIELDS if not (api and f in NOT_MEASURED_THROUGH_API)]
    ex: list[Any] = [ExpectColumnToExist(column=name) for name in REQUIRED_RECORD_FIELDS]
    ex += [ExpectColumnValuesToNotBeNull(column=name) for name in required]
    if api:
        ex += [ExpectColumnValuesToBeNull(column=name) for name in NOT_MEASURED_THROUGH_API]
    ex += [
        ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=1)
        for c in ("accuracy", "accuracy_strict", "accuracy_flexible")
    ]
    ex += [
        ExpectColumnValuesToBeBetween(column=c, min_value=0, strict_min=True)
        for c in ("latency_p50_s", "latency_p95_s", "latency_p99_s")
    ]
    ex += [
        ExpectColumnPairValuesAToBeGreaterThanB(column_A="latency_p95_s", column_B="latency_p50_s", or_equal=True),
        ExpectColumnPairValuesAToBeGreaterThanB(column_A="latency_p99_s", column_B="latency_p95_s", or_equal=True),
        ExpectColumnPairValuesToBeEqual(column_A="n_items", column_B="expected_items"),
        ExpectColumnValuesToBeBetween(column="errors", min_value=0),
    ]
    if not api:
        ex += [
            ExpectColumnValuesToBeBetween(column="nfe", min_value=1),
            ExpectColumnPairValuesAToBeGreaterThanB(column_A="nfe_max", column_B="nfe", or_equal=True),
        ]
    return ex


def validate_record(record: EvalRecord, html: bool = True) -> ValidationOutcome:
    """Validate one record and mark it: `valid` and `validation` (summary with failed expectations) are set."""
    frame = records_to_frame([record])
    frame["nfe_max"] = nfe_bound(record)
    for name in (
        "expected_items",
        "accuracy_strict",
        "accuracy_flexible",
    ) + NOT_MEASURED_THROUGH_API:  # all-None columns need a dtype
        frame[name] = frame[name].astype("float64")
    outcome = run_suite(
        "eval-record-api" if record.kind == "api" else "eval-record", frame, record_expectations(record.kind), html=html
    )
    record.valid = outcome.success
    record.validation = outcome.summary()
    return outcome


def plain(value: Any) -> Any:
    """JSON fallback: numpy scalars as Python numbers, anything else as text."""
    return value.item() if hasattr(value, "item") else str(value)
