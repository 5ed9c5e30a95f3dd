"""After a sweep: plots, license checks and reproducibility verdicts, gathered per candidate for gates.

The same pipeline steps (evals.pipeline) the flows run: `check_license`, `probe_point` on each
candidate's first point, `assemble_evidence`; the files land beside the records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.pipeline import EvidenceFiles, assemble_evidence, check_license, probe_point
from evals.plots import plot_quality_latency
from evals.records import CandidateEvidence


@dataclass
class SweepEvidence:
    candidates: list[CandidateEvidence]
    plots: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # a probe or check that could not run, in words


def gather_evidence(
    spec: Any,
    result: Any,
    *,
    plots: bool = True,
    reproducibility: bool = True,
    on_result: Callable[[str, Any], None] | None = None,
) -> SweepEvidence:
    """Plots, license and reproducibility per model of a finished sweep; files land beside the records.

    spec, result: evals.sweep.SweepSpec and SweepResult. on_result(kind, value) is told each
    LicenseResult ("license") and ReproducibilityResult ("reproducibility") as it is made.
    """
    notify = on_result or (lambda kind, value: None)
    files = EvidenceFiles(Path(result.folder))
    evidence = SweepEvidence(candidates=[])
    if plots and result.records:
        evidence.plots = plot_quality_latency(result.records, result.folder)
    for prepared in result.candidates:
        plan = result.plans[prepared.candidate]
        license_result = check_license(prepared)
        files.licenses.append(license_result.to_dict())
        notify("license", license_result)
        verdict = None
        if reproducibility and plan.points and prepared.kind == "api":
            files.problems.append(
                f"{prepared.ref}: no reproducibility probe for an API model (it needs token ids and "
                "a local decoder); the reproducibility gate has no result for it"
            )
        elif reproducibility and plan.points:
            try:
                verdict = probe_point(plan.points[0], plan)
                files.reproducibility.append(verdict.to_dict())
                notify("reproducibility", verdict)
            except Exception as e:
                files.problems.append(f"{prepared.ref}: reproducibility probe could not run ({type(e).__name__}: {e})")
        records = [r for r in result.records if r.candidate == prepared.candidate]
        evidence.candidates.append(
            assemble_evidence(
                prepared, records, verdict, license_result, result.failures_of.get(prepared.candidate, [])
            )
        )
    files.write_evidence(result.failures, records=result.records)
    evidence.problems = files.problems
    return evidence
