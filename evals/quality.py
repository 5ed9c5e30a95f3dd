"""Decode task items with a model and a SamplerConfig, in batches, and score them."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from evals.tasks import TASKS, TaskItem, score
from evals.tasks.gsm8k import GSM8KTask
from sampler import SamplerConfig
from sampler.decode import decode_prompts


def metrics_of(task: str) -> tuple[str, ...]:
    if task == "gsm8k":
        return GSM8KTask().metrics
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: gsm8k, {', '.join(TASKS)}")
    return TASKS[task].metrics


def metric_means(predictions: list[dict[str, Any]], metrics: Iterable[str]) -> dict[str, float]:
    """Share of `predictions` that score each metric (booleans count 0/1, fractions as they are)."""
    return {m: sum(p[m] for p in predictions) / len(predictions) for m in metrics}


def evaluate_items(loaded: Any, items: list[TaskItem], config: SamplerConfig, batch_size: int = 32) -> dict[str, Any]:
    """Accuracy per metric of one task's `items`.

    Each model decodes by its kind (`sampler.decode.decode`): diffusion models with
    `sampler.generate`, causal ones with a KV-cached AR decoder;
    the mask/EOS/EoT ids are always the model's own. Prompts are sorted by length and left-padded
    within a batch. Returns `{"task", "n", "accuracy": {metric: share}, "nfe", "seconds", "config",
    "predictions": [{"prompt", "response", "target", metric: bool}]}` in the order of `items`.
    """
    if not items:
        raise ValueError("evaluate_items: items is empty")
    tasks = {i.task for i in items}
    if len(tasks) != 1:
        raise ValueError(f"evaluate_items: items must be of one task, got {sorted(tasks)}")
    if batch_size <= 0:
        raise ValueError(f"evaluate_items: batch_size must be positive, got {batch_size}")
    task = tasks.pop()
    metrics = metrics_of(task)
    config = config.with_(**loaded.sampler_ids())
    encoded = [loaded.encode(i.prompt) for i in items]
    order = sorted(range(len(items)), key=lambda j: len(encoded[j]))
    responses: dict[int, str] = {}
    nfe = 0
    start = time.perf_counter()
    for b in range(0, len(order), batch_size):
        chunk = order[b : b + batch_size]
        out = decode_prompts(loaded, [encoded[j] for j in chunk], config)
        nfe += out.nfe
        for j, row in zip(chunk, out.generated.tolist()):
            responses[j] = loaded.response_text(row)
    seconds = time.perf_counter() - start
    predictions = []
    for j, item in enumerate(items):
        row = {"prompt": item.prompt, "response": responses[j], "target": item.target}
        row |= {m: score(m, responses[j], item.target) for m in metrics}
        predictions.append(row)
    accuracy = metric_means(predictions, metrics)
    return {
        "task": task,
        "n": len(items),
        "accuracy": accuracy,
        "nfe": nfe,
        "seconds": seconds,
        "config": config.to_dict(),
        "predictions": predictions,
    }
