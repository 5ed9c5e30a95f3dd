"""What a bench run says, in lines: the verdict per generation length, AUP, the speculative and AR notes.

The verdict of one generation length names the fastest config whose accuracy stays within the
tolerance of vanilla's (the same batch size: speedups compare rows decoded alike), its speedup over
vanilla and its text tokens/s against the AR twin at each batch size measured, and the length's AUP
(evals.parallelism) over the diffusion rows of the first batch size.
"""

from __future__ import annotations

from typing import Any

from evals.parallelism import AUPResult, aup

BenchRow = Any  # evals.bench.BenchRow: this module reads rows only, so evals.bench can import it
# Each speculative row and the one-call-per-step row whose tokens it must reproduce.
SPECULATIVE_PAIRS = {
    "speculative (batch 1)": "vanilla",
    "dual+speculative (batch 1)": "dual-cache",
    "dual+parallel+speculative": "dual+parallel",
    "dual+speculative": "dual-cache",
    "dual+speculative+rows": "dual-cache",
}


def by_length(rows: list[BenchRow]) -> dict[int, list[BenchRow]]:
    out: dict[int, list[BenchRow]] = {}
    for r in rows:
        out.setdefault(r.gen_length, []).append(r)
    return dict(sorted(out.items()))


def batch_groups(group: list[BenchRow]) -> dict[int, list[BenchRow]]:
    """The rows of one length by batch size, in the order measured (the first is the verdict's primary one)."""
    out: dict[int, list[BenchRow]] = {}
    for r in group:
        out.setdefault(r.batch, []).append(r)
    return out


def _primary(group: list[BenchRow], reference: str = "vanilla") -> list[BenchRow]:
    """The rows of the first batch size that has a `reference` row (else of the first batch size)."""
    groups = batch_groups(group)
    return next((g for g in groups.values() if any(r.config == reference for r in g)), next(iter(groups.values()), []))


def length_aup(rows: list[BenchRow]) -> dict[int, AUPResult]:
    """{gen_length: AUP} over the diffusion rows of each length's primary batch size (TPF does not depend on the
    machine, so one batch size is enough); y_max is the best accuracy among them."""
    out = {}
    for n, group in by_length(rows).items():
        diffusion = [r for r in _primary(group) if r.kind != "ar" and r.tokens_per_forward > 0]
        if diffusion:
            out[n] = aup([(r.tokens_per_forward, r.accuracy) for r in diffusion], labels=[r.config for r in diffusion])
    return out


def _points(share: float) -> str:
    value = 100 * share
    return f"{value:g} point" + ("" if value == 1 else "s")


def verdicts(rows: list[BenchRow], tolerance: float = 0.01, reference: str = "vanilla") -> list[str]:
    """One line per generation length that has a `reference` row (vanilla for masked diffusion): the best config
    within `tolerance` of its accuracy, its speedup and its text tokens/s ratio to the AR twin per batch size, and
    the length's AUP."""
    lines = []
    aups = length_aup(rows)
    for n, group in by_length(rows).items():
        primary = _primary(group, reference)
        vanilla = next((r for r in primary if r.config == reference), None)
        if vanilla is None:
            continue
        within = [
            r
            for r in primary
            if r.kind != "ar"
            and r.config != reference
            and r.speedup_vs_vanilla
            and r.accuracy >= vanilla.accuracy - tolerance - 1e-12
        ]
        head = f"gen {n}: "
        if not within:
            line = head + f"no config within {_points(tolerance)} of {reference} ({100 * vanilla.accuracy:.1f}%)"
        else:
            best = max(within, key=lambda r: r.speedup_vs_vanilla)
            speedups, ratios = [], []
            for b, rows_b in batch_groups(group).items():
                mine = next((r for r in rows_b if r.config == best.config), None)
                ar = next((r for r in rows_b if r.kind == "ar"), None)
                if mine is None:
                    continue
                if mine.speedup_vs_vanilla:
                    speedups.append(f"{mine.speedup_vs_vanilla:.1f}x at batch {b}")
                if ar is not None and ar.text_tokens_per_s:
                    ratios.append(f"{mine.text_tokens_per_s / ar.text_tokens_per_s:.2f}x at batch {b}")
            line = (
                head + f"best within {_points(tolerance)} of {reference} ({100 * vanilla.accuracy:.1f}%): "
                f"{best.config} ({100 * best.accuracy:.1f}%), {', '.join(speedups)} vs {reference}; text tokens/s "
                f"vs AR twin: " + (", ".join(ratios) or "no AR row")
            )
        if n in aups:
            line += (
                f"; AUP {aups[n].aup:.1f} over {len(aups[n].points)} configs ({reference} alone "
                f"{100 * vanilla.accuracy:.1f})"
            )
        lines.append(line)
    return lines


def _pair(group: list[BenchRow], name: str, batch: int) -> BenchRow | None:
    """The row `name` of one length decoded at `batch` prompts a call if there is one, else its first row."""
    named = [r for r in group if r.config == name]
    return next((r for r in named if r.batch == batch), named[0] if named else None)


def summary_notes(rows: list[BenchRow]) -> list[str]:
    """The speculative call cut against the row it must reproduce, and the best lossless diffusion vs the AR twin."""
    notes = []
    for n, group in by_length(rows).items():
        for spec_name, plain_name in SPECULATIVE_PAIRS.items():
            for spec in (r for r in group if r.config == spec_name):
                plain = _pair(group, plain_name, spec.batch)
                if plain is None:
                    continue
                same = spec.same_text_as.get(plain_name)
                notes.append(
                    f"gen {n}: {spec_name}: {plain.sequential_calls / spec.sequential_calls:.2f}x fewer "
                    f"sequential calls than {plain_name}, acceptance {spec.acceptance_rate or 0:.2f}, same text "
                    f"as {plain_name} on " + ("-" if same is None else f"{100 * same:.0f}%") + " of prompts"
                )
        for b, rows_b in batch_groups(group).items():
            ar = next((r for r in rows_b if r.kind == "ar"), None)
            best = max((r for r in rows_b if r.lossless), key=lambda r: r.text_tokens_per_s, default=None)
            if ar is not None and best is not None and ar.text_tokens_per_s:
                notes.append(
                    f"gen {n}, batch {b}: best lossless diffusion ({best.config}) vs AR twin text tokens/s: "
                    f"{best.text_tokens_per_s / ar.text_tokens_per_s:.2f}x"
                )
    return notes


def report_lines(report: Any) -> list[str]:
    """The lines printed under the table: the verdicts first, then the notes."""
    return [f"verdict {v}" for v in report.verdicts] + [f"- {note}" for note in report.notes]
