"""Multiple choice by likelihood, built from the bundled tasks: the way LLaDA's paper scores MMLU-style tasks.

An `arith` item becomes a question with four answers: the reference response (worked line, `#### c`)
and three that keep the worked line and end in a wrong number (c + 1, c + 10, and c - 1 or c + 2),
in a seeded order. A model picks the answer it finds most likely given the prompt
(`sampler.likelihood.likelihood`: exact for autoregressive models; for masked diffusion the bound's Monte
Carlo estimate, or with `method="left-to-right"` the exact left-to-right log-probability, which is what
lm-evaluation-harness's `acc` reads through `unmask serve` for the same items: docs/serving.md,
"Log-probabilities"; `write_lm_eval_task` writes them as an lm-eval task folder).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from evals.tasks import get_task, make_split
from evals.tasks.base import TaskItem
from sampler.handle import Handle
from sampler.likelihood import DEFAULT_SAMPLES, DEFAULT_SEED, likelihood


@dataclass(frozen=True)
class ChoiceItem:
    """A question: `context` then one of `choices`; `gold` indexes the right one."""

    key: str
    context: str
    choices: list[str]
    gold: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arith_choices(item: TaskItem, rng: random.Random) -> ChoiceItem:
    """The item's reference response and three with the same worked line and a wrong final number."""
    worked, _ = item.answer.rsplit("#### ", 1)
    c = int(item.target)
    wrong = [c + 1, c + 10, c - 1 if c > 0 else c + 2]
    answers = [item.answer] + [f"{worked}#### {w}" for w in wrong]
    order = list(range(len(answers)))
    rng.shuffle(order)
    return ChoiceItem(key=item.key, context=item.prompt, choices=[answers[i] for i in order], gold=order.index(0))


def choice_items(task: str = "arith", split: str = "test", n: int = 10, seed: int = 0) -> list[ChoiceItem]:
    """`n` multiple-choice items of an arith task's `split`, reproducible from `seed`."""
    if not task.startswith("arith"):
        raise ValueError(f"multiple choice is built from the arith tasks; got task {task!r}")
    rng = random.Random(f"choices:{task}:{split}:{seed}")
    return [arith_choices(item, rng) for item in make_split(get_task(task), split, n, seed=seed)]


@dataclass(frozen=True)
class ChoiceResult:
    """Accuracy over items, with each item's pick and the score (and standard error) of every choice."""

    accuracy: float
    picks: list[int]
    scores: list[list[float]]
    stderrs: list[list[float | None]]
    samples: int
    seed: int
    method: str = "elbo"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def likelihood_accuracy(
    handle: Handle,
    items: list[ChoiceItem],
    samples: int = DEFAULT_SAMPLES,
    seed: int = DEFAULT_SEED,
    method: str = "elbo",
) -> ChoiceResult:
    """Pick, per item, the choice of highest log-likelihood given the context (ties: the first); `method` as
    `sampler.likelihood.likelihood` reads it."""
    if not items:
        raise ValueError("likelihood_accuracy: no items")
    picks, scores, stderrs = [], [], []
    for item in items:
        context = handle.encode(item.context)
        found = [
            likelihood(handle, context, handle.encode(choice), samples=samples, seed=seed, method=method)
            for choice in item.choices
        ]
        totals = [f.total for f in found]
        picks.append(totals.index(max(totals)))
        scores.append(totals)
        stderrs.append([f.stderr for f in found])
    right = sum(p == item.gold for p, item in zip(picks, items))
    return ChoiceResult(
        accuracy=right / len(items),
        picks=picks,
        scores=scores,
        stderrs=stderrs,
        samples=samples,
        seed=seed,
        method=method,
    )


def _task_yaml(folder: Path, name: str, rows: list[dict[str, Any]], lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    yaml = folder / f"{name}.yaml"
    yaml.write_text(
        "\n".join(
            [
                f"task: {name}",
                "dataset_path: json",
                f"dataset_kwargs: {{data_files: {{test: {json.dumps(str(data))}}}}}",
                "test_split: test",
                *lines,
                "metadata: {version: 1.0}",
                "",
            ]
        ),
        encoding="utf-8",
    )
    return yaml


def write_lm_eval_tasks(
    folder: Path,
    choices: list[ChoiceItem],
    generations: list[TaskItem],
    prefix: str = "unmask_arith",
    max_gen_toks: int = 32,
) -> dict[str, Path]:
    """lm-evaluation-harness task folders for `choices` (`{prefix}_mc`: multiple_choice, loglikelihood, `acc`)
    and `generations` (`{prefix}_gen`: generate_until, the number after `#### ` against the target,
    `exact_match`); returns {task name: YAML}. The context is sent as it is; each choice follows it directly."""
    mc, gen = f"{prefix}_mc", f"{prefix}_gen"
    return {
        mc: _task_yaml(
            folder,
            mc,
            [c.to_dict() for c in choices],
            [
                "output_type: multiple_choice",
                "doc_to_text: context",
                "doc_to_choice: choices",
                "doc_to_target: gold",
                "target_delimiter: ''",
                "metric_list:",
                "  - metric: acc",
                "    aggregation: mean",
                "    higher_is_better: true",
            ],
        ),
        gen: _task_yaml(
            folder,
            gen,
            [{"prompt": g.prompt, "target": g.target} for g in generations],
            [
                "output_type: generate_until",
                "doc_to_text: prompt",
                "doc_to_target: target",
                "target_delimiter: ''",
                f'generation_kwargs: {{until: ["\\n\\n"], max_gen_toks: {max_gen_toks}, do_sample: false, '
                "temperature: 0}",
                "filter_list:",
                "  - name: strict-match",
                "    filter:",
                "      - function: regex",
                "        regex_pattern: '#### (\\-?[0-9\\.\\,]+)'",
                "      - function: take_first",
                "metric_list:",
                "  - metric: exact_match",
                "    aggregation: mean",
                "    higher_is_better: true",
            ],
        ),
    }
