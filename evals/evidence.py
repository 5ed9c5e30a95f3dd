"""After a sweep: plots, license checks and reproducibility verdicts, gathered per candidate for gates."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evals.records import CandidateEvidence, LicenseResult, ReproducibilityResult

PROBE_PROMPTS = 4


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
    from evals.evaluate import load_task
    from evals.license import license_for_model
    from evals.reproducibility import probe_model
    from evals.store import RecordStore
    from models.checkpoint import read_card
    from models.loading import resolve_model_path

    notify = on_result or (lambda kind, value: None)
    store = RecordStore(result.folder)
    evidence = SweepEvidence(candidates=[])
    if plots and result.records:
        from evals.plots import plot_quality_latency

        evidence.plots = plot_quality_latency(result.records, result.folder)
    licenses: list[dict] = []
    verdicts: list[dict] = []
    for ref in dict.fromkeys(p.model for p in result.plan):
        records = [r for r in result.records if r.candidate == Path(ref).name or r.candidate == ref]
        card: dict[str, Any] = {}
        try:
            card = read_card(resolve_model_path(ref))  # the card only: no need to load the weights
        except Exception as e:
            evidence.problems.append(f"{ref}: model card unreadable ({e})")
        license_result: LicenseResult = license_for_model(ref, card or None)
        licenses.append(license_result.to_dict())
        notify("license", license_result)
        verdict: ReproducibilityResult | None = None
        if reproducibility:
            point = next(p for p in result.plan if p.model == ref)
            prompts = [item.prompt for item in load_task(**vars(point.task)).items[:PROBE_PROMPTS]]
            try:
                verdict = probe_model(ref, point.settings, prompts, device=spec.device, dtype=spec.dtype)
                verdicts.append(verdict.to_dict())
                notify("reproducibility", verdict)
            except Exception as e:
                evidence.problems.append(f"{ref}: reproducibility probe could not run ({type(e).__name__}: {e})")
        first = records[0] if records else None
        evidence.candidates.append(CandidateEvidence(
            candidate=first.candidate if first else Path(ref).name,
            role=first.role if first else "candidate",
            kind=first.kind if first else "",
            records=records,
            reproducibility=verdict,
            license=license_result,
            model_revision=first.model_revision if first else "",
            weights_sha256=first.weights_sha256 if first else "",
            card={k: v for k, v in card.items() if k != "text"},
            failures=[f for f in result.failures if f.startswith(f"model {ref}") or f.startswith(f"{ref} ")],
        ))
    store.write_json("license.json", licenses)
    if reproducibility:
        store.write_json("reproducibility.json", verdicts)
    if evidence.problems:
        store.write_json("evidence-problems.json", evidence.problems)
    return evidence
