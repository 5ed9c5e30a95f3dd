"""Fast decoding measured side by side: quality, calls, throughput, speedup and memory per mode.

Every variant decodes the same held-out prompts (arith, and the long task sort) at each
generation length, in one process, with one thread count and fixed seeds. A variant is a name
and the SamplerConfig settings it changes; the AR reference decodes with its KV cache. Timings
are medians over repetitions after warm-up (the warm-up also pays one-off costs such as the
ONNX export). Accuracy comes from the same decoded outputs (decoding is deterministic).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from evals.bench_summary import length_aup, summary_notes, verdicts
from evals.measure import PeakMemory
from evals.tasks import get_task, make_split, mean_score
from sampler import SamplerConfig
from sampler.decode import decode_prompts

BENCH_TASKS = ("arith", "sort")  # the short task and the long one
# The metric reported per task: graded where the task has a graded one, so a small loss shows.
BENCH_METRICS = {"arith": "strict-match", "sort": "char-accuracy"}


def bench_metric(task: str) -> str:
    metrics = get_task(task).metrics
    return BENCH_METRICS[task] if BENCH_METRICS.get(task) in metrics else metrics[0]


@dataclass(frozen=True)
class Variant:
    """One bench row: `settings` applied on top of the one-token-per-step vanilla config."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    kind: str = "diffusion"  # or "ar": the autoregressive reference model
    default: bool = True  # run without --configs (off for rows that cost a multiple of vanilla)
    batch_size: int | None = None  # prompts per decode call; None = each task's prompts at once
    tokens_per_step: int = 1  # steps = gen_length / this: a fixed parallelism that needs no confident model

    @property
    def lossless(self) -> bool:
        """Whether the variant's text equals vanilla's by construction (not only measured)."""
        exact = {"parallel": "top_k", "cache": "none", "future_window": 0, "eot_predict": "none"}  # lossy otherwise
        return self.kind == "diffusion" and self.tokens_per_step == 1 and not any(
            k in exact and v != exact[k] for k, v in self.settings.items())


DUAL_PARALLEL = {"cache": "dual", "parallel": "threshold", "parallel_threshold": 0.9}
VARIANTS: tuple[Variant, ...] = (
    Variant("vanilla"),
    Variant("parallel-threshold-0.9", {"parallel": "threshold", "parallel_threshold": 0.9}),
    Variant("parallel-factor-1.0", {"parallel": "factor", "parallel_factor": 1.0}),
    Variant("prefix-cache", {"cache": "prefix"}),
    Variant("dual-cache", {"cache": "dual"}),
    Variant("dual+parallel", DUAL_PARALLEL),
    Variant("dual+parallel+speculative", DUAL_PARALLEL | {"speculative_draft": 4}),
    Variant("dual+parallel+speculative+exit", DUAL_PARALLEL | {"speculative_draft": 4, "early_exit": "eos_decided"}),
    Variant("dual+parallel+exit", DUAL_PARALLEL | {"early_exit": "eos_decided"}),
    # A verify round advances only as far as every row's drafts agree, so speculation pays per prompt.
    Variant("dual+speculative (batch 1)", {"cache": "dual", "speculative_draft": 4}, batch_size=1),
    Variant("early-exit", {"early_exit": "eos_decided"}),
    # Batched speculation, the old rule (a round advances as far as every row agrees) and per-row rounds (each row
    # keeps its own verified prefix): acceptance against the per-prompt rows above.
    Variant("dual+speculative", {"cache": "dual", "speculative_draft": 4}, default=False),
    Variant("dual+speculative+rows", {"cache": "dual", "speculative_draft": 4, "speculative_rows": True},
            default=False),
    # A block-start forward sees the block and W positions after it; the rest of the canvas is never computed
    # (docs/experiments/long-canvas: the settings that beat the AR twin at 256 and 512).
    Variant("dual+parallel+exit+W16", DUAL_PARALLEL | {"early_exit": "eos_decided", "future_window": 16}),
    Variant("dual+parallel0.8+exit+W8", DUAL_PARALLEL | {"parallel_threshold": 0.8, "early_exit": "eos_decided",
                                                         "future_window": 8}),
    # Without a cache a verify call evaluates `draft` whole canvases: fewer sequential calls, more work.
    Variant("speculative (batch 1)", {"speculative_draft": 4}, default=False, batch_size=1),
    Variant("speculative+exit", {"speculative_draft": 4, "early_exit": "eos_decided"}, default=False),
    Variant("onnxruntime:dual+parallel+exit", DUAL_PARALLEL | {"early_exit": "eos_decided", "backend": "onnxruntime"}),
    Variant("tiny-ar", kind="ar"),
)


def variants_named(names: list[str] | None) -> list[Variant]:
    """The variants to run, in the table's order; ValueError names an unknown one."""
    if not names:
        return [v for v in VARIANTS if v.default]
    known = {v.name: v for v in VARIANTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown bench config {unknown[0]!r}; known: {', '.join(known)}")
    return [v for v in VARIANTS if v.name in names]


@dataclass
class BenchSetup:
    # The defaults (those of `unmask bench` too) finish in a few minutes on two CPU cores; the
    # long lengths (256, 512) are where caches and early exit pay most, and cost a multiple.
    gen_lengths: tuple[int, ...] = (64, 128)
    block_length: int = 32
    prompts: int = 4  # held-out test items per task
    reps: int = 3  # timed repetitions; the median is reported
    warmup: int = 1  # untimed passes on the first two prompts of each task (pays exports, allocations)
    threads: int = 1
    seed: int = 0
    tasks: tuple[str, ...] = BENCH_TASKS
    # prompts per decode call, one set of rows each; empty: each task's prompts in one call
    batch_sizes: tuple[int, ...] = ()
    tolerance: float = 0.01  # the verdict's "within the accuracy tolerance of vanilla", as a share

    def check(self) -> None:
        for name in ("prompts", "reps", "threads", "block_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"bench {name} must be >= 1, got {getattr(self, name)}")
        if self.reps < 3:
            raise ValueError(f"bench reps must be >= 3 (medians of at least three), got {self.reps}")
        for n in self.gen_lengths:
            if n % self.block_length:
                raise ValueError(f"bench gen_length {n} must be a multiple of block_length {self.block_length}")
        for b in self.batch_sizes:
            if b < 1:
                raise ValueError(f"bench batch {b} must be >= 1")
            if b > self.prompts:
                raise ValueError(f"bench batch {b} is more than the {self.prompts} prompts per task; "
                                 f"give --prompts {b} or more")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"bench batch sizes repeat: {','.join(map(str, self.batch_sizes))}")
        if not 0.0 <= self.tolerance <= 1.0:
            raise ValueError(f"bench tolerance must be between 0 and 100 accuracy points, got {100 * self.tolerance:g}")

    @property
    def batches(self) -> tuple[int, ...]:
        """The prompts per decode call of each set of rows (a task's whole batch when none was asked)."""
        return self.batch_sizes or (self.prompts,)


@dataclass
class BenchRow:
    """One (variant, gen_length) measurement; the first eight fields are the `--json` contract."""

    config: str
    gen_length: int
    accuracy: float  # mean over the tasks of each task's bench metric (BENCH_METRICS)
    nfe: float  # model evaluations of a canvas per prompt batch (verified drafts count each)
    tokens_per_forward: float  # canvas positions settled per sequential model call
    tokens_per_s: float  # generated positions per second, EOS padding included
    speedup_vs_vanilla: float | None  # vanilla's median seconds / this row's, same gen_length
    peak_mem_mb: float
    accuracy_by_task: dict[str, float] = field(default_factory=dict)
    text_tokens_per_s: float = 0.0  # tokens before the first EOS/EoT per second
    sequential_calls: float = 0.0
    seconds: float = 0.0  # median wall-clock of one repetition (every task's batch)
    acceptance_rate: float | None = None
    nfe_saved: float | None = None
    provider: str | None = None
    same_text_as_vanilla: float | None = None  # share of prompts whose response equals vanilla's
    same_text_as: dict[str, float] = field(default_factory=dict)  # the same against each earlier row
    batch: int = 0  # prompts per decode call (the variant's own size where it has one)
    kind: str = "diffusion"  # or "ar": the AR twin's row
    lossless: bool = False  # the text equals vanilla's by construction (Variant.lossless)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BenchReport:
    setup: BenchSetup
    model: str
    rows: list[BenchRow]
    notes: list[str]
    device: str = "cpu"
    complete: bool = True  # False while rows are still being measured, or when the run was stopped
    verdicts: list[str] = field(default_factory=list)  # one line per generation length (evals.bench_summary)
    aup: dict[int, Any] = field(default_factory=dict)  # gen_length -> evals.parallelism.AUPResult

    @property
    def title(self) -> str:
        s = self.setup
        tasks = ", ".join(f"{t} {bench_metric(t)}" for t in s.tasks)
        return (f"unmask bench: {self.model} on {self.device}, block {s.block_length}, {s.prompts} held-out prompts "
                f"per task ({tasks}), median of {s.reps} reps after {s.warmup} warm-up, "
                f"torch threads {s.threads}, seed {s.seed}")

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "model": self.model, "device": self.device, "setup": asdict(self.setup),
                "rows": [r.to_dict() for r in self.rows], "notes": self.notes, "complete": self.complete,
                "verdicts": self.verdicts, "aup": {str(n): a.to_dict() for n, a in self.aup.items()}}


@dataclass
class Prompts:
    """One task's held-out items and their token ids (unpadded: `decode_prompts` pads each decode call)."""

    task: str
    items: list
    ids: list[list[int]]


def held_out_prompts(loaded: Any, setup: BenchSetup) -> list[Prompts]:
    """`setup.prompts` test-split items of each task, the same for every variant."""
    batches = []
    for task in setup.tasks:
        items = make_split(get_task(task), "test", setup.prompts, seed=setup.seed)
        batches.append(Prompts(task, items, [loaded.encode(i.prompt) for i in items]))
    return batches


def config_for(loaded: Any, variant: Variant, gen_length: int, setup: BenchSetup) -> SamplerConfig:
    """`variant.tokens_per_step` tokens per step (steps = gen_length / it), the model's own special ids, then the
    variant's settings."""
    return SamplerConfig(steps=gen_length // variant.tokens_per_step, gen_length=gen_length,
                         block_length=setup.block_length, seed=setup.seed, **loaded.sampler_ids(), **variant.settings)


class VariantRun:
    """One variant at one generation length: its decoder bound to its config, and what its passes measured."""

    def __init__(self, loaded: Any, variant: Variant, gen_length: int, batches: list[Prompts], setup: BenchSetup,
                 batch: int | None = None):
        self.loaded, self.variant, self.gen_length, self.batches = loaded, variant, gen_length, batches
        self.batch = variant.batch_size or batch or setup.prompts  # prompts per decode call
        self.config = config_for(loaded, variant, gen_length, setup)
        self.times: list[float] = []
        self.peak_mb = 0.0
        self.outputs: list = []

    def one_pass(self, rows: slice = slice(None)) -> list[list]:
        """Per task, the outputs of its prompts decoded `variant.batch_size` at a time (default: all at once)."""
        outputs = []
        for b in self.batches:
            ids, size = b.ids[rows], self.batch
            outputs.append([decode_prompts(self.loaded, ids[i : i + size], self.config)
                            for i in range(0, len(ids), size)])
        return outputs

    def warm_up(self) -> None:
        self.one_pass(slice(0, 2))

    def timed_pass(self) -> None:
        device = next(self.loaded.model.parameters()).device
        with PeakMemory(device) as memory:
            start = time.perf_counter()
            self.outputs = self.one_pass()
            if device.type == "cuda":  # the clock stops when the device is done, not when the last kernel is queued
                torch.cuda.synchronize(device)
            self.times.append(time.perf_counter() - start)
        self.peak_mb = max(self.peak_mb, memory.peak_mb)

    def row(self) -> tuple[BenchRow, list[str]]:
        """The median timing and the scores of the (deterministic) responses."""
        loaded, outputs, gen_length = self.loaded, self.outputs, self.gen_length
        seconds = statistics.median(self.times)
        responses, correct, text_tokens = [], {}, 0
        for batch, chunks in zip(self.batches, outputs):
            rows = [row for out in chunks for row in out.generated.tolist()]
            texts = [loaded.response_text(r) for r in rows]
            metric = bench_metric(batch.task)
            correct[batch.task] = mean_score(metric, texts, [i.target for i in batch.items])
            text_tokens += sum(loaded.useful_length(r) for r in rows)
            responses += texts
        n_rows = sum(len(b.items) for b in self.batches)
        outputs = [out for chunks in outputs for out in chunks]  # one per decode call
        calls = [out.sequential_calls for out in outputs]
        mean = lambda values: statistics.fmean(values) if all(v is not None for v in values) else None  # noqa: E731
        row = BenchRow(
            config=self.variant.name, gen_length=gen_length,
            accuracy=statistics.fmean(correct.values()),
            nfe=statistics.fmean(out.nfe for out in outputs),
            tokens_per_forward=gen_length / statistics.fmean(calls),
            tokens_per_s=n_rows * gen_length / seconds,
            speedup_vs_vanilla=None, peak_mem_mb=self.peak_mb,
            accuracy_by_task=correct, text_tokens_per_s=text_tokens / seconds,
            sequential_calls=statistics.fmean(calls), seconds=seconds,
            acceptance_rate=mean([out.speculative.acceptance_rate if out.speculative else None for out in outputs]),
            nfe_saved=mean([out.early_exit.nfe_saved if out.early_exit else None for out in outputs]),
            provider=outputs[0].provider, batch=self.batch, kind=self.variant.kind, lossless=self.variant.lossless,
        )
        return row, responses


def bench_report(loaded: Any, setup: BenchSetup, rows: list[BenchRow], ar_skipped: bool,
                 complete: bool = True) -> BenchReport:
    """The report of the rows measured so far (`complete=False` for a partial one): notes, verdicts, AUP."""
    notes = ["tiny-ar row skipped: no AR reference model was given or found"] if ar_skipped else []
    device = str(next(loaded.model.parameters()).device)
    return BenchReport(setup=setup, model=getattr(loaded, "model_id", "") or str(loaded.path), rows=list(rows),
                       notes=notes + summary_notes(rows), device=device, complete=complete,
                       verdicts=verdicts(rows, setup.tolerance), aup=length_aup(rows))


def row_groups(variants: list[Variant], setup: BenchSetup) -> list[list[tuple[Variant, int]]]:
    """The (variant, batch) runs of one generation length, one group per batch size; speedups compare within a group.

    A variant with its own batch size (the per-prompt speculative rows) runs once, in the group of that size
    when there is one, else in the first."""
    groups: list[list[tuple[Variant, int]]] = [[] for _ in setup.batches]
    for v in variants:
        if v.batch_size is None:
            for group, b in zip(groups, setup.batches):
                group.append((v, b))
        else:
            at = setup.batches.index(v.batch_size) if v.batch_size in setup.batches else 0
            groups[at].append((v, v.batch_size))
    return [g for g in groups if g]


def run_bench(loaded: Any, setup: BenchSetup, variants: list[Variant], ar_loaded: Any = None,
              tick: Callable[[str], None] = lambda description: None,
              on_row: Callable[[BenchRow], None] = lambda row: None) -> BenchReport:
    """Measure every variant at every generation length and batch size; `tick(description)` after each pass.

    `on_row(row)` gets each finished row as soon as it is final: the rows of one generation length
    finish together, after that length's last repetition (speedups and same-text shares compare
    rows of one length and batch size). Repetitions are interleaved (rep 1 of every run, then rep 2,
    ...) so that a change in machine load during the run falls on every row alike.
    """
    setup.check()
    torch.manual_seed(setup.seed)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(setup.threads)
    rows: list[BenchRow] = []
    runnable = [v for v in variants if v.kind != "ar" or ar_loaded is not None]
    several = len(setup.batches) > 1

    def label(run: VariantRun) -> str:
        return f"{run.variant.name} @ {run.gen_length}" + (f" batch {run.batch}" if several else "")

    try:
        diffusion_batches = held_out_prompts(loaded, setup)
        ar_batches = held_out_prompts(ar_loaded, setup) if ar_loaded is not None else None
        for gen_length in setup.gen_lengths:
            groups = [[VariantRun(*((ar_loaded, v, gen_length, ar_batches) if v.kind == "ar" else
                                    (loaded, v, gen_length, diffusion_batches)), setup, batch=b) for v, b in group]
                      for group in row_groups(runnable, setup)]
            runs = [run for group in groups for run in group]
            for _ in range(setup.warmup):
                for run in runs:
                    run.warm_up()
                    tick(f"warm-up {label(run)}")
            for rep in range(setup.reps):
                for run in runs:
                    run.timed_pass()
                    tick(f"rep {rep + 1}/{setup.reps} {label(run)}")
            for group in groups:
                texts_of: dict[str, list[str]] = {}
                vanilla_seconds = None
                for run in group:
                    row, texts = run.row()
                    if row.config == "vanilla":
                        vanilla_seconds = row.seconds
                    if vanilla_seconds is not None:
                        row.speedup_vs_vanilla = vanilla_seconds / row.seconds
                    row.same_text_as = {name: sum(a == b for a, b in zip(texts, ref)) / len(ref)
                                        for name, ref in texts_of.items()}
                    row.same_text_as_vanilla = row.same_text_as.get("vanilla")
                    texts_of[row.config] = texts
                    rows.append(row)
                    on_row(row)
    finally:
        torch.set_num_threads(previous_threads)
    return bench_report(loaded, setup, rows, ar_skipped=len(runnable) < len(variants))


def planned_rows(variants: list[Variant], setup: BenchSetup) -> int:
    """How many rows `run_bench` will report for these (runnable) variants."""
    return len(setup.gen_lengths) * sum(len(g) for g in row_groups(variants, setup))
