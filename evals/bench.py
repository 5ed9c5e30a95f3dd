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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch

from evals.bench_summary import length_aup, summary_notes, verdicts
from evals.measure import PeakMemory
from evals.paired import round_ratio
from evals.tasks import TaskItem, get_task, make_split, mean_score
from sampler import SamplerConfig
from sampler.decode import decode_prompts
from sampler.effective import effective_config
from sampler.memory import footprint, mib

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
        return (
            self.kind == "diffusion"
            and self.tokens_per_step == 1
            and not any(k in exact and v != exact[k] for k, v in self.settings.items())
        )

    def config(self, loaded: Any, gen_length: int, setup: BenchSetup) -> Any:
        """The config this row decodes with at `gen_length`."""
        return config_for(loaded, self, gen_length, setup)

    def decode(self, loaded: Any, prompts: list[list[int]], config: Any) -> Any:
        """One decode call over `prompts` (token ids, unpadded)."""
        return decode_prompts(loaded, prompts, config)


# The most exact block-diffusion setting: DiffusionGemma's published step budget and entropy bound, and every
# canvas denoised for all its steps (no early stop). The other block rows are measured against it.
BLOCK_EXACT = {"max_denoising_steps": 48, "entropy_bound": 0.1, "confidence_threshold": None}


@dataclass(frozen=True)
class BlockVariant(Variant):
    """A block-diffusion row: `settings` are BlockDiffusionConfig fields over the model's effective config.

    Each row of a decode call draws from its own generator seeded with the bench seed (`row_seeds`), so a
    prompt decodes to the same text at every batch size (what serving does), and batch rows compare speed alone."""

    @property
    def lossless(self) -> bool:
        return self.kind == "diffusion" and self.settings == BLOCK_EXACT

    def config(self, loaded: Any, gen_length: int, setup: BenchSetup) -> Any:
        requested = SamplerConfig(
            steps=gen_length,
            gen_length=gen_length,
            block_length=setup.block_length,
            seed=setup.seed,
            **loaded.sampler_ids(),
        )
        return replace(effective_config(loaded, requested), **self.settings)

    def decode(self, loaded: Any, prompts: list[list[int]], config: Any) -> Any:
        return decode_prompts(loaded, prompts, config, row_seeds=[config.seed] * len(prompts))


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
    Variant(
        "dual+speculative+rows", {"cache": "dual", "speculative_draft": 4, "speculative_rows": True}, default=False
    ),
    # A block-start forward sees the block and W positions after it; the rest of the canvas is never computed
    # (docs/experiments/long-canvas: the settings that beat the AR twin at 256 and 512).
    Variant("dual+parallel+exit+W16", DUAL_PARALLEL | {"early_exit": "eos_decided", "future_window": 16}),
    Variant(
        "dual+parallel0.8+exit+W8",
        DUAL_PARALLEL | {"parallel_threshold": 0.8, "early_exit": "eos_decided", "future_window": 8},
    ),
    # Without a cache a verify call evaluates `draft` whole canvases: fewer sequential calls, more work.
    Variant("speculative (batch 1)", {"speculative_draft": 4}, default=False, batch_size=1),
    Variant("speculative+exit", {"speculative_draft": 4, "early_exit": "eos_decided"}, default=False),
    Variant("onnxruntime:dual+parallel+exit", DUAL_PARALLEL | {"early_exit": "eos_decided", "backend": "onnxruntime"}),
    Variant("tiny-ar", kind="ar"),
)


BLOCK_REFERENCE = "exact-48 (reference)"
BLOCK_VARIANTS: tuple[Variant, ...] = (
    BlockVariant(BLOCK_REFERENCE, BLOCK_EXACT),
    # DiffusionGemma's defaults (early stop once a canvas's argmax is stable and its mean entropy under 0.005),
    # with the step budget cut: the quality/speed curve
    BlockVariant("steps-48", {"max_denoising_steps": 48}),
    BlockVariant("steps-16", {"max_denoising_steps": 16}),
    BlockVariant("steps-8", {"max_denoising_steps": 8}),
    BlockVariant("steps-4", {"max_denoising_steps": 4}),
    BlockVariant("steps-16 no-stop", {"max_denoising_steps": 16, "confidence_threshold": None}),
    # a larger entropy bound accepts more positions per step
    BlockVariant("steps-48 bound-1", {"max_denoising_steps": 48, "entropy_bound": 1.0}),
    BlockVariant("steps-16 bound-1", {"max_denoising_steps": 16, "entropy_bound": 1.0}),
    BlockVariant("steps-16 bound-4", {"max_denoising_steps": 16, "entropy_bound": 4.0}, default=False),
    Variant("tiny-ar", kind="ar"),
)


@dataclass(frozen=True)
class RowSet:
    """The bench rows of one model kind, and the row the others are measured against (speedup, same text)."""

    variants: tuple[Variant, ...]
    reference: str

    def named(self, names: list[str] | None) -> list[Variant]:
        """The variants to run, in the table's order; ValueError names an unknown one."""
        if not names:
            return [v for v in self.variants if v.default]
        known = {v.name: v for v in self.variants}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown bench config {unknown[0]!r}; known: {', '.join(known)}")
        return [v for v in self.variants if v.name in names]

    def fitted(self, loaded: Any, setup: BenchSetup) -> BenchSetup:
        """The setup as this kind decodes it (masked diffusion: as asked)."""
        return setup

    def shape(self, loaded: Any, setup: BenchSetup) -> str:
        return f"block {setup.block_length}"


class BlockRowSet(RowSet):
    """Block diffusion decodes whole canvases of the model's own length: that is the bench's block length."""

    def fitted(self, loaded: Any, setup: BenchSetup) -> BenchSetup:
        canvas = loaded.canvas_length
        for n in setup.gen_lengths:
            if n % canvas:
                raise ValueError(
                    f"bench gen_length {n} must be a multiple of {getattr(loaded, 'entry_id', 'the model')}'s "
                    f"canvas length {canvas} (block diffusion decodes whole canvases)"
                )
        return replace(setup, block_length=canvas)

    def shape(self, loaded: Any, setup: BenchSetup) -> str:
        return f"canvas {loaded.canvas_length}"


# One row set per model kind; a kind not listed (masked diffusion) gets the LLaDA rows.
ROW_SETS: dict[str, RowSet] = {
    "masked-diffusion": RowSet(VARIANTS, "vanilla"),
    "block-diffusion": BlockRowSet(BLOCK_VARIANTS, BLOCK_REFERENCE),
}


def row_set(kind: str) -> RowSet:
    """The bench rows for a model of `kind` (`Handle.kind`)."""
    return ROW_SETS.get(kind, ROW_SETS["masked-diffusion"])


def variants_named(names: list[str] | None, kind: str = "masked-diffusion") -> list[Variant]:
    """The variants of `kind`'s row set to run, in the table's order; ValueError names an unknown one."""
    return row_set(kind).named(names)


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
    memory_budget: int | None = None  # bytes a row's decode may use at its peak (`memory_admission`); None: no check

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
                raise ValueError(
                    f"bench batch {b} is more than the {self.prompts} prompts per task; give --prompts {b} or more"
                )
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError(f"bench batch sizes repeat: {','.join(map(str, self.batch_sizes))}")
        if not 0.0 <= self.tolerance <= 1.0:
            raise ValueError(f"bench tolerance must be between 0 and 100 accuracy points, got {100 * self.tolerance:g}")
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError(f"bench memory budget must be above 0 bytes, got {self.memory_budget}")

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
    computed_peak_mb: float | None = None  # sampler.memory.footprint x batch at the run's longest prompt
    times_s: list[float] = field(default_factory=list)  # each repetition's seconds, in round order
    # the speedup's 95% interval (low, high): a bootstrap over the rounds, each round timing every row once in an
    # order drawn per round (evals.paired.round_ratio); None with the speedup
    speedup_interval: tuple[float, float] | None = None

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
    reference: str = "vanilla"  # the row speedups and same-text shares compare to (RowSet.reference)
    shape: str = ""  # how a canvas is cut: "block 32" (masked diffusion), "canvas 32" (block diffusion)

    @property
    def title(self) -> str:
        s = self.setup
        tasks = ", ".join(f"{t} {bench_metric(t)}" for t in s.tasks)
        shape = self.shape or f"block {s.block_length}"
        return (
            f"unmask bench: {self.model} on {self.device}, {shape}, {s.prompts} held-out prompts "
            f"per task ({tasks}), median of {s.reps} reps after {s.warmup} warm-up, "
            f"torch threads {s.threads}, seed {s.seed}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "model": self.model,
            "device": self.device,
            "setup": asdict(self.setup),
            "reference": self.reference,
            "rows": [r.to_dict() for r in self.rows],
            "notes": self.notes,
            "complete": self.complete,
            "verdicts": self.verdicts,
            "aup": {str(n): a.to_dict() for n, a in self.aup.items()},
        }


@dataclass
class Prompts:
    """One task's held-out items and their token ids (unpadded: `decode_prompts` pads each decode call)."""

    task: str
    items: list[TaskItem]
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
    return SamplerConfig(
        steps=gen_length // variant.tokens_per_step,
        gen_length=gen_length,
        block_length=setup.block_length,
        seed=setup.seed,
        **loaded.sampler_ids(),
        **variant.settings,
    )


class VariantRun:
    """One variant at one generation length: its decoder bound to its config, and what its passes measured."""

    def __init__(
        self,
        loaded: Any,
        variant: Variant,
        gen_length: int,
        batches: list[Prompts],
        setup: BenchSetup,
        batch: int | None = None,
    ):
        self.loaded, self.variant, self.gen_length, self.batches = loaded, variant, gen_length, batches
        self.batch = variant.batch_size or batch or setup.prompts  # prompts per decode call
        self.config = variant.config(loaded, gen_length, setup)
        self.times: list[float] = []
        self.peak_mb = 0.0
        self.outputs: list[list[Any]] = []  # per task, the outputs of its decode calls

    def one_pass(self, rows: slice = slice(None)) -> list[list[Any]]:
        """Per task, the outputs of its prompts decoded `variant.batch_size` at a time (default: all at once)."""
        outputs = []
        for b in self.batches:
            ids, size = b.ids[rows], self.batch
            outputs.append(
                [self.variant.decode(self.loaded, ids[i : i + size], self.config) for i in range(0, len(ids), size)]
            )
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
        loaded, per_task, gen_length = self.loaded, self.outputs, self.gen_length
        seconds = statistics.median(self.times)
        responses, correct, text_tokens = [], {}, 0
        for batch, chunks in zip(self.batches, per_task):
            rows = [row for out in chunks for row in out.generated.tolist()]
            texts = [loaded.response_text(r) for r in rows]
            metric = bench_metric(batch.task)
            correct[batch.task] = mean_score(metric, texts, [i.target for i in batch.items])
            text_tokens += sum(loaded.useful_length(r) for r in rows)
            responses += texts
        n_rows = sum(len(b.items) for b in self.batches)
        outputs = [out for chunks in per_task for out in chunks]  # one per decode call
        calls = [out.sequential_calls for out in outputs]

        def mean(values: list[float | None]) -> float | None:
            given = [v for v in values if v is not None]
            return statistics.fmean(given) if len(given) == len(values) else None

        row = BenchRow(
            config=self.variant.name,
            gen_length=gen_length,
            accuracy=statistics.fmean(correct.values()),
            nfe=statistics.fmean(out.nfe for out in outputs),
            tokens_per_forward=gen_length / statistics.fmean(calls),
            tokens_per_s=n_rows * gen_length / seconds,
            speedup_vs_vanilla=None,
            peak_mem_mb=self.peak_mb,
            accuracy_by_task=correct,
            text_tokens_per_s=text_tokens / seconds,
            sequential_calls=statistics.fmean(calls),
            seconds=seconds,
            acceptance_rate=mean([out.speculative.acceptance_rate if out.speculative else None for out in outputs]),
            nfe_saved=mean([out.early_exit.nfe_saved if out.early_exit else None for out in outputs]),
            provider=outputs[0].provider,
            batch=self.batch,
            kind=self.variant.kind,
            lossless=self.variant.lossless,
            computed_peak_mb=self.computed_peak() / 2**20,
            times_s=[round(t, 7) for t in self.times],
        )
        return row, responses

    def computed_peak(self) -> int:
        """The peak bytes `sampler.memory.footprint` computes for one decode call of this run: its batch of rows
        at the longest prompt of the run."""
        longest = max(len(ids) for b in self.batches for ids in b.ids)
        return footprint(self.loaded, longest, self.config).batch(self.batch)


def bench_report(
    loaded: Any, setup: BenchSetup, rows: list[BenchRow], ar_skipped: bool, complete: bool = True
) -> BenchReport:
    """The report of the rows measured so far (`complete=False` for a partial one): notes, verdicts, AUP."""
    notes = ["tiny-ar row skipped: no AR reference model was given or found"] if ar_skipped else []
    device = str(next(loaded.model.parameters()).device)
    rows_of = row_set(loaded.kind)
    return BenchReport(
        setup=setup,
        model=getattr(loaded, "model_id", "") or str(loaded.path),
        rows=list(rows),
        notes=notes + memory_notes(rows, setup) + summary_notes(rows),
        device=device,
        complete=complete,
        verdicts=verdicts(rows, setup.tolerance, rows_of.reference),
        aup=length_aup(rows),
        reference=rows_of.reference,
        shape=rows_of.shape(loaded, setup),
    )


def memory_notes(rows: list[BenchRow], setup: BenchSetup) -> list[str]:
    """The largest computed peak against the budget it was admitted under, and what the two memory columns are."""
    computed = [r for r in rows if r.computed_peak_mb is not None]
    if not computed:
        return []
    top = max(computed, key=lambda r: r.computed_peak_mb or 0.0)  # never None: computed ones only
    budget = (
        "no memory budget was set"
        if setup.memory_budget is None
        else f"within the memory budget of {mib(setup.memory_budget)}, checked before decoding"
    )
    return [
        f"memory admission: the largest computed peak is {top.computed_peak_mb:.1f} MiB ({top.config} at batch "
        f"{top.batch}, gen length {top.gen_length}), {budget}; computed peak "
        f"= sampler/memory.footprint per row x batch at the longest prompt (the decode's own tensors above the "
        f"resident weights); peak memory = the process's resident set on CPU (weights and runtime included), "
        f"peak allocated on CUDA"
    ]


class MemoryAdmissionError(ValueError):
    """A bench row whose computed peak does not fit the memory budget; the message names the row and both figures."""


def memory_admission(runs: list[VariantRun], budget: int) -> None:
    """Refuse, before anything decodes, the run whose computed peak (`VariantRun.computed_peak`) exceeds `budget`."""
    if not runs:
        return
    worst = max(runs, key=lambda run: run.computed_peak())
    peak = worst.computed_peak()
    if peak > budget:
        raise MemoryAdmissionError(
            f"{worst.variant.name} at batch {worst.batch}, gen length {worst.gen_length} needs {mib(peak)} "
            f"({peak} bytes) "
            f"at its peak ({mib(peak // worst.batch)} a row, sampler/memory.footprint), above the memory budget of "
            f"{mib(budget)} ({budget} bytes); lower --batch or --gen-lengths, or raise --memory-budget"
        )


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


@dataclass
class BenchModels:
    """The diffusion model and the AR twin (None: no AR row), with each one's held-out prompts."""

    loaded: Any
    prompts: list[Prompts]
    ar_loaded: Any = None
    ar_prompts: list[Prompts] | None = None

    def runs(self, variants: list[Variant], gen_length: int, setup: BenchSetup) -> list[list[VariantRun]]:
        """The runs of one generation length, one group per batch size (`row_groups`)."""

        def run(v: Variant, b: int) -> VariantRun:
            if v.kind == "ar":
                assert self.ar_prompts is not None  # an AR row runs only with an AR twin (run_bench)
                return VariantRun(self.ar_loaded, v, gen_length, self.ar_prompts, setup, batch=b)
            return VariantRun(self.loaded, v, gen_length, self.prompts, setup, batch=b)

        return [[run(v, b) for v, b in group] for group in row_groups(variants, setup)]


def compared_rows(group: list[VariantRun], reference: str) -> list[BenchRow]:
    """The rows of one (length, batch) group, each with its speedup over `reference` and its same-text shares."""
    rows: list[BenchRow] = []
    texts_of: dict[str, list[str]] = {}
    reference_times: list[float] | None = None
    for run in group:
        row, texts = run.row()
        if row.config == reference:
            reference_times = row.times_s
        if reference_times is not None:
            speedup = round_ratio(reference_times, row.times_s)
            row.speedup_vs_vanilla = statistics.median(reference_times) / statistics.median(row.times_s)
            row.speedup_interval = (speedup.low, speedup.high) if speedup else None
        row.same_text_as = {name: sum(a == b for a, b in zip(texts, ref)) / len(ref) for name, ref in texts_of.items()}
        row.same_text_as_vanilla = row.same_text_as.get(reference)
        texts_of[row.config] = texts
        rows.append(row)
    return rows


def run_bench(
    loaded: Any,
    setup: BenchSetup,
    variants: list[Variant],
    ar_loaded: Any = None,
    tick: Callable[[str], None] = lambda description: None,
    on_row: Callable[[BenchRow], None] = lambda row: None,
) -> BenchReport:
    """Measure every variant at every generation length and batch size; `tick(description)` after each pass.

    `on_row(row)` gets each finished row as soon as it is final: the rows of one generation length
    finish together, after that length's last repetition (speedups and same-text shares compare
    rows of one length and batch size). Repetitions are interleaved in rounds (rep 1 of every run, then rep 2,
    ...), the runs of a round in an order drawn per round, so that a change in machine load during the run falls
    on every row alike and no row always runs first; each speedup carries its interval over the rounds. With
    `setup.memory_budget`, every run at the longest generation length is admitted (`memory_admission`)
    before anything decodes.
    """
    setup.check()
    torch.manual_seed(setup.seed)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(setup.threads)
    rows: list[BenchRow] = []
    runnable = [v for v in variants if v.kind != "ar" or ar_loaded is not None]
    reference = row_set(loaded.kind).reference
    several = len(setup.batches) > 1
    order = np.random.default_rng(setup.seed)

    def label(run: VariantRun) -> str:
        return f"{run.variant.name} @ {run.gen_length}" + (f" batch {run.batch}" if several else "")

    try:
        models = BenchModels(
            loaded,
            held_out_prompts(loaded, setup),
            ar_loaded,
            held_out_prompts(ar_loaded, setup) if ar_loaded is not None else None,
        )
        if setup.memory_budget is not None:
            longest = models.runs(runnable, max(setup.gen_lengths), setup)
            memory_admission([run for group in longest for run in group], setup.memory_budget)
        for gen_length in setup.gen_lengths:
            groups = models.runs(runnable, gen_length, setup)
            runs = [run for group in groups for run in group]
            for _ in range(setup.warmup):
                for run in runs:
                    run.warm_up()
                    tick(f"warm-up {label(run)}")
            for rep in range(setup.reps):
                for at in order.permutation(len(runs)):  # a round's order drawn per round: no row always goes first
                    run = runs[at]
                    run.timed_pass()
                    tick(f"rep {rep + 1}/{setup.reps} {label(run)}")
            for group in groups:
                for row in compared_rows(group, reference):
                    rows.append(row)
                    on_row(row)
    finally:
        torch.set_num_threads(previous_threads)
    return bench_report(loaded, setup, rows, ar_skipped=len(runnable) < len(variants))


def planned_rows(variants: list[Variant], setup: BenchSetup) -> int:
    """How many rows `run_bench` will report for these (runnable) variants."""
    return len(setup.gen_lengths) * sum(len(g) for g in row_groups(variants, setup))
