"""One eval record: a loaded model, one SamplerConfig and one task split -> a validated EvalRecord."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

from evals import tasks as t
from evals.fingerprint import dataset_hash, environment_fingerprint
from evals.measure import RequestResult, measure, measure_endpoint
from evals.records import EvalRecord
from evals.tasks import mean_score


@dataclass
class TaskData:
    """The items of one task split, with what scoring and validation need."""

    name: str
    split: str
    items: list[Any]  # evals.tasks.TaskItem
    metrics: tuple[str, ...]
    gen_length: int
    train_keys: set[str] = field(default_factory=set)  # problem keys of the training split, for the leak check
    source: str = ""  # the file, or the generator and seed
    leak_column: str = "key"  # the item field compared against `train_keys`

    @property
    def hash(self) -> str:
        return dataset_hash(self.items)


def load_task(
    task: str | None = None,
    split: str = "test",
    n: int = 16,
    seed: int = 0,
    file: str | None = None,
    limit: int | None = None,
    train_file: str | None = None,
    train_sample: int = 2000,
) -> TaskData:
    """A generated task split, or a GSM8K-format JSONL file (ValueError names the file and line)."""
    if file:
        items = t.load_gsm8k(file, split=split, limit=limit)
        if not items:
            raise ValueError(f"{file}: no items")
        # file items are keyed by line number, so the leak check compares the questions themselves
        train = {i.prompt for i in t.load_gsm8k(train_file, split="train")} if train_file else set()
        return TaskData(
            "gsm8k",
            split,
            items,
            t.GSM8KTask().metrics,
            t.GSM8KTask().gen_length,
            train,
            str(file),
            leak_column="prompt",
        )
    if task is None:  # neither a task nor a file: the error get_task gives an unknown name
        raise ValueError(f"unknown task {task!r}; known: {', '.join(t.TASKS)}")
    spec = t.get_task(task)
    items = t.make_split(spec, split, n, seed=seed)
    train = (
        {i.key for i in t.make_split(spec, "train", train_sample, seed=seed, unique=False)}
        if split != "train"
        else set()
    )
    return TaskData(spec.name, split, items, spec.metrics, spec.gen_length, train, f"{spec.name}:{split}:seed={seed}")


class AccuracyFields(TypedDict):
    """The EvalRecord fields `accuracy_fields` fills."""

    accuracy: float
    accuracy_strict: float | None
    accuracy_flexible: float | None


def accuracy_fields(metrics: tuple[str, ...], responses: list[str | None], targets: list[str]) -> AccuracyFields:
    """accuracy (the first metric), and strict / flexible for GSM8K-format tasks; a failed item is wrong."""
    out: AccuracyFields = {
        "accuracy": mean_score(metrics[0], responses, targets),
        "accuracy_strict": None,
        "accuracy_flexible": None,
    }
    if "strict-match" in metrics:
        out["accuracy_strict"] = mean_score("strict-match", responses, targets)
    if "flexible-extract" in metrics:
        out["accuracy_flexible"] = mean_score("flexible-extract", responses, targets)
    return out


@dataclass
class Candidate:
    """A loaded model with its catalog identity."""

    id: str
    loaded: Any  # the model handle (models.load)
    role: str
    kind: str
    revision: str = ""
    weights_sha256: str = ""


def evaluate_point(
    candidate: Candidate,
    task: TaskData,
    config: Any,
    *,
    backend: str = "torch",
    device: str = "cpu",
    dtype: str = "float32",
    warmup: int = 1,
    batch_size: int = 1,
    throughput_items: int | None = None,
    sweep: str = "",
    on_request: Callable[[RequestResult], None] | None = None,
) -> EvalRecord:
    """Measure and score one point under its effective config; the record is not yet validated
    (see evals.validation)."""
    loaded = candidate.loaded
    if loaded.kind == "api":  # text in, text out, through the endpoint: no token ids, no local decoder

        def heard(answer: Any) -> None:
            if on_request is not None:
                on_request(RequestResult(index=answer.prompt, latency_s=answer.latency_s, error=answer.error))

        responses, measured = measure_endpoint(loaded, [item.prompt for item in task.items], config, heard)
        where, n_requests = loaded.base_url, len(responses)
    else:
        prompts = [loaded.encode(item.prompt) for item in task.items]
        m = measure(
            loaded,
            prompts,
            config,
            warmup=warmup,
            batch_size=batch_size,
            throughput_items=throughput_items,
            device=device,
            on_request=on_request,
        )
        responses = [loaded.response_text(r.tokens) if r.ok else None for r in m.requests]
        measured, where, n_requests = m.record_fields(), str(loaded.path), len(m.requests)
    quality = accuracy_fields(task.metrics, responses, [item.target for item in task.items])
    fingerprint = environment_fingerprint(
        device,
        dtype,
        weights_sha256=candidate.weights_sha256,
        dataset_hash=task.hash,
        config_hash=config.hash(),
        model_path=where,
        task_source=task.source,
    )
    return EvalRecord(
        candidate=candidate.id,
        role=candidate.role,
        kind=candidate.kind,
        task=task.name,
        split=task.split,
        config=config.to_dict(),
        config_hash=config.hash(),
        backend=backend,
        device=device,
        gen_length=config.gen_length,
        n_items=n_requests,
        expected_items=len(task.items),
        **quality,
        **measured,
        dataset_hash=task.hash,
        weights_sha256=candidate.weights_sha256,
        model_revision=candidate.revision,
        fingerprint=fingerprint,
        sweep=sweep,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
