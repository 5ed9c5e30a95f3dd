"""What an adoption dossier says, gathered from the registry only (never re-measured): one plain dict.

Sections: identity, evaluation, operating point, reproducibility, gates, checklists, decisions,
limitations. Every number keeps the MLflow run it came from beside it (`run_id`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import registry.read as read
from checklists import STAGES, ChecklistError, load_checklist
from dashboards.dossier.decision import decision_part
from evals.intervals import wilson_interval
from evals.plots import point_label
from evals.records import CandidateEvidence, EvalRecord, ServingRecord
from gates.policy import Policy, PolicyError, load_policy
from gates.readable import gate_threshold, gate_value
from gates.results import GateResult
from gates.verdict import Verdict
from models.catalog import CatalogError, load_catalog
from registry import audit
from registry.connection import RegistryError
from registry.links import run_url_base
from registry.state import fallback_holder
from registry.store import Registry, latest_registration, model_tag
from registry.tracking import evidence_integrity, evidence_run_id, load_evidence, load_gate_report

SECTIONS = (
    "recommendation",
    "identity",
    "evaluation",
    "operating-point",
    "reproducibility",
    "gates",
    "checklists",
    "decisions",
    "rollouts",
    "limitations",
    "annex-iv",
    "signatures",
)
WEAK_BELOW = 0.5  # a task whose best measured (or card-reported) score is below this is called weak
LONG_CONTEXT = 1024  # generation lengths from here on count as long context
DECISION_EVENTS = ("approval", "signoff", "alias_move", "promotion_refused", "rollback_refused", "integrity_finding")


class DossierError(ValueError):
    """A dossier that cannot be built; the message names the model, version and what is missing."""


def resolve_version(registry: Registry, model: str, version: str | None) -> str:
    """The version asked for, else the model's `candidate` (or `fallback`) version."""
    held = registry.aliases_of(model)  # RegistryError names an unknown model
    if version is None:
        version = latest_registration(held)
        if not version:
            raise DossierError(f"{model} has no `candidate` or `fallback` version; name one with --version")
    elif version not in registry.versions(model):
        raise DossierError(f"{model} has no version {version!r} (versions: {', '.join(registry.versions(model))})")
    return version


def dossier_content(
    registry: Registry, model: str, version: str | None = None, stage: str | None = None
) -> dict[str, Any]:
    """Everything the dossier shows for one version, or DossierError naming what the registry lacks."""
    if stage is not None and stage not in STAGES:
        raise DossierError(f"--stage must be one of {', '.join(STAGES)}, got {stage!r}")
    version = resolve_version(registry, model, version)
    tags = registry.version_tags(model, version)
    if not tags.get(model_tag("evidence_run")):
        raise DossierError(
            f"{model} version {version} has no evaluation yet: no evidence run "
            f"({model_tag('evidence_run')} tag), so there are no records, gates or checklists to "
            f"report; evaluate it first (unmask run, or unmask eval --model {model})"
        )
    chain = audit.verify(registry)  # a dossier is decision material: never built on a trail that does not verify
    if not chain.ok:
        raise DossierError(
            f"{model} version {version}: no dossier is built on an audit trail that does not verify: {chain.summary()}"
        )
    evidence = load_evidence(registry, model, version)  # EvidenceTampered (a RegistryError) on forged evidence
    if not evidence.records:
        raise DossierError(
            f"{model} version {version} has no evaluation records in its evidence run "
            f"{tags[model_tag('evidence_run')]}; evaluate it first (unmask run)"
        )
    stages = [stage] if stage else list(STAGES)
    reports = {s: load_gate_report(registry, model, version, s) for s in stages}
    if not any(reports.values()):
        which = f"stage {stage}" if stage else "any stage"
        raise DossierError(
            f"{model} version {version} has evaluation records but no gate report for {which}; "
            f"judge it first (unmask gates {model} --version {version} --store"
            + (f" --stage {stage})" if stage else ")")
        )
    fallback = _fallback(registry, model)
    gates = {s: _gates(r) for s, r in reports.items() if r}
    content: dict[str, Any] = {
        "model": model,
        "version": version,
        "stages": stages,
        "tracking_uri": registry.tracking_uri,
        "run_url": run_url_base(registry.tracking_uri),
        "evidence_run_id": tags[model_tag("evidence_run")],
        "evaluated_at": tags.get(model_tag("evaluated_at"), ""),
        "aliases": sorted(a for a, v in registry.aliases_of(model).items() if v == version),
        "identity": _identity(registry, evidence, model, version),
        "evaluation": _evaluation(evidence, fallback),
        "operating_point": {s: _operating_point(evidence, g) for s, g in gates.items()},
        "reproducibility": _reproducibility(evidence),
        "gates": gates,
        "not_judged": [s for s, r in reports.items() if not r],
        "checklists": {s: _checklist(registry, model, version, s, r) for s, r in reports.items() if r},
        "decisions": _decisions(registry, model, version, chain),
    }
    content["limitations"] = _limitations(content, evidence)
    judged = next((pol for r in reports.values() if r and (pol := _judged_policy(r)[0]) is not None), None)
    content.update(
        decision_part(
            registry, model, version, judged or load_policy(), _card_markdown(registry, model, version), content
        )
    )
    for name in [n for n, text in content["model_card"].items() if text == ""]:
        content["limitations"].append(
            {
                "kind": "model card",
                "text": f"{name}: not stated in the model card",
                "run_id": content["evidence_run_id"],
            }
        )
    return content


# identity ------------------------------------------------------------------------------------------------
def _identity(registry: Registry, evidence: CandidateEvidence, model: str, version: str) -> dict[str, Any]:
    card = dict(evidence.card)
    entry = _catalog_entry(model)
    card_md = _card_markdown(registry, model, version)
    return {
        "role": evidence.role,
        "kind": evidence.kind,
        "revision": evidence.model_revision or "local",
        "weights_sha256": evidence.weights_sha256,
        "files": dict(sorted((card.get("sha256") or {}).items())),
        "parameters": card.get("parameters") or (entry or {}).get("parameters"),
        "license": evidence.license.to_dict() if evidence.license else None,
        "catalog": entry,
        "card": {k: v for k, v in card.items() if k not in ("sha256", "heldout_test")},
        "heldout_test": card.get("heldout_test") or {},
        "card_excerpt": _excerpt(card_md),
        "failures": list(evidence.failures),
        "integrity": evidence_integrity(registry, model, version),
    }


def _card_markdown(registry: Registry, model: str, version: str) -> str:
    """The model card logged with the evidence ("" when none was)."""
    try:
        return registry.load_artifact_bytes(
            evidence_run_id(registry, model, version), "evidence/model_card.md"
        ).decode()
    except RegistryError:
        return ""


def _catalog_entry(model: str) -> dict[str, Any] | None:
    """The catalog entry of this id at this commit (models/catalog.yaml), or None for a model not in it."""
    try:
        catalog = load_catalog()
    except CatalogError:
        return None
    if model not in catalog:
        return None
    e = catalog.get(model)
    return {
        "id": e.id,
        "family": e.family,
        "kind": e.kind,
        "role": e.role,
        "source": str(e.source),
        "revision": e.revision or "",
        "pinned": e.pinned,
        "sha256": dict(e.sha256),
        "license": e.license_label,
        "license_link": e.license_link or "",
        "parameters": e.parameters,
        "adapter": e.adapter,
        "notes": e.notes,
    }


def _excerpt(markdown: str, lines: int = 14) -> str:
    kept = [line for line in markdown.splitlines() if line.strip()][:lines]
    return "\n".join(kept) + ("\n…" if len(markdown.splitlines()) > lines else "")


# evaluation ----------------------------------------------------------------------------------------------
def _record_row(r: EvalRecord) -> dict[str, Any]:
    lo, hi = wilson_interval(r.accuracy, r.n_items)
    return {
        "record_id": r.record_id,
        "run_id": r.run_id or "",
        "candidate": r.candidate,
        "role": r.role,
        "task": r.task,
        "split": r.split,
        "config_hash": r.config_hash,
        "label": point_label(r) or "vanilla",
        "gen_length": r.gen_length,
        "n_items": r.n_items,
        "accuracy": r.accuracy,
        "ci95": [lo, hi],
        "latency_p50_s": r.latency_p50_s,
        "latency_p95_s": r.latency_p95_s,
        "tokens_per_forward": r.tokens_per_forward,
        "nfe": r.nfe,
        "peak_mem_mb": r.peak_mem_mb,
        "tokens_per_s": r.tokens_per_s,
        "device": r.device,
        "backend": r.backend,
        "valid": r.valid,
        "errors": r.errors,
        "output_hash": r.output_hash,
        "dataset_hash": r.dataset_hash,
        "sweep": r.sweep,
    }


def _serving_row(r: ServingRecord) -> dict[str, Any]:
    return {
        "concurrency": r.concurrency,
        "requests": r.requests,
        "served_as": r.served_as,
        "latency_p50_s": r.latency_p50_s,
        "latency_p95_s": r.latency_p95_s,
        "latency_p99_s": r.latency_p99_s,
        "ttfb_p50_s": r.ttfb_p50_s,
        "streamed": r.streamed,
        "tokens_per_s": r.tokens_per_s,
        "requests_per_s": r.requests_per_s,
        "error_rate": r.error_rate,
        "same_answer_share": r.same_answer_share,
        "when": r.when,
        "run_id": r.run_id or "",
    }


def _evaluation(evidence: CandidateEvidence, fallback: CandidateEvidence | None) -> dict[str, Any]:
    mine = list(evidence.records)
    configs: dict[str, dict[str, Any]] = {}
    for r in mine:
        seen = configs.setdefault(
            r.config_hash,
            {
                "config_hash": r.config_hash,
                "label": point_label(r) or "vanilla",
                "config": r.config,
                "tasks": [],
                "run_ids": [],
            },
        )
        seen["tasks"].append(r.task)
        seen["run_ids"].append(r.run_id or "")
    others = list(fallback.records) if fallback else []
    return {
        "sweeps": sorted({r.sweep for r in mine if r.sweep}),
        "configs": list(configs.values()),
        "records": [_record_row(r) for r in mine],
        "records_objects": mine,
        "fallback": {
            "model": fallback.candidate,
            "records": [_record_row(r) for r in others],
            "records_objects": others,
        }
        if fallback
        else None,
        "loadtest": [_serving_row(r) for r in sorted(evidence.serving, key=lambda r: r.concurrency)],
        "fallback_loadtest": [_serving_row(r) for r in sorted(fallback.serving, key=lambda r: r.concurrency)]
        if fallback
        else [],
    }


def _fallback(registry: Registry, model: str) -> CandidateEvidence | None:
    holder = fallback_holder(registry)
    if holder is None or holder[0] == model:
        return None
    try:
        return load_evidence(registry, *holder)
    except RegistryError:
        return None


# operating point, reproducibility -------------------------------------------------------------------------
def _operating_point(evidence: CandidateEvidence, gates: dict[str, Any]) -> dict[str, Any]:
    """The config the stage's gates judged (the one their evidence cites) and why it was the one."""
    cited = next((g for g in gates["results"] if g["config_hash"]), None)
    if cited is None:
        return {
            "config_hash": "",
            "why": "no gate of this stage cites a record (no validated record at the policy's operating point)",
            "records": [],
        }
    chosen = cited["config_hash"]
    records = [r for r in evidence.records if r.config_hash == chosen]
    primary = next((r for r in records if r.record_id == cited["record_id"]), records[0] if records else None)
    if evidence.card.get("operating_config_hash") == chosen:
        why = "named by the model card's operating_config_hash"
    elif primary is not None:
        rivals = [
            r
            for r in evidence.records
            if r.valid is True and r.task == primary.task and r.gen_length == primary.gen_length
        ]
        rank = sorted(rivals, key=lambda r: (r.accuracy, -r.latency_p95_s, r.config_hash), reverse=True)
        best = bool(rank) and rank[0].config_hash == chosen
        why = (
            f"the best accuracy on {primary.task} at gen_length {primary.gen_length} among {len(rivals)} "
            f"validated settings (ties broken by the lower p95 latency)"
            if best
            else f"cited by the gates; not the best of the {len(rivals)} validated settings on {primary.task} "
            f"at gen_length {primary.gen_length} in this evidence"
        )
    else:
        why = "cited by the gates"
    return {
        "config_hash": chosen,
        "label": point_label(primary) if primary else "",
        "why": why,
        "task": primary.task if primary else "",
        "gen_length": primary.gen_length if primary else None,
        "config": primary.config if primary else {},
        "records": [_record_row(r) for r in records],
    }


def _reproducibility(evidence: CandidateEvidence) -> dict[str, Any]:
    probe = evidence.reproducibility.to_dict() if evidence.reproducibility else None
    fingerprint = (probe or {}).get("fingerprint") or (evidence.records[0].fingerprint if evidence.records else {})
    return {
        "probe": probe,
        "fingerprint": fingerprint,
        "fingerprint_source": "reproducibility probe"
        if probe and probe.get("fingerprint")
        else f"record {evidence.records[0].record_id} (run {evidence.records[0].run_id})"
        if evidence.records
        else "",
    }


# gates and checklists ------------------------------------------------------------------------------------
def _judged_policy(report: dict[str, Any]) -> tuple[Policy | None, str]:
    """The policy a report was judged under, when its file still hashes as cited (for readable thresholds)."""
    cited = report.get("policy") or {}
    path = cited.get("path")
    if not path or not Path(path).is_file():
        return None, f"policy file {path or '(not recorded)'} not at hand"
    if cited.get("sha256") and hashlib.sha256(Path(path).read_bytes()).hexdigest() != cited["sha256"]:
        return None, f"policy file {path} changed since it judged"
    try:
        return load_policy(path), ""
    except PolicyError as e:
        return None, str(e)


def _gates(report: dict[str, Any]) -> dict[str, Any]:
    policy, note = _judged_policy(report)
    specs = {}
    if policy is not None and report["stage"] in policy.stages:
        specs = {g.name: g for g in policy.stage(report["stage"]).gates}
    results = []
    for r in report.get("results", []):
        ev = r.get("evidence") or {}
        spec = specs.get(r["gate"])
        verdict = GateResult.from_dict(r).verdict
        results.append(
            {
                "gate": r["gate"],
                "verdict": verdict,
                "passed": r["passed"],
                "value": r["value"],
                "threshold": r["threshold"],
                "value_text": gate_value(getattr(spec, "kind", None), r["value"]),
                "threshold_text": gate_threshold(spec, r["threshold"]) if spec else str(r["threshold"]),
                "reason": r["reason"],
                "record_id": ev.get("record_id") or "",
                "run_id": ev.get("run_id") or "",
                "config_hash": ev.get("config_hash") or "",
                "baseline_run_id": ev.get("baseline_run_id") or "",
                "settled": ev.get("settled"),
            }
        )
    overall = Verdict.combine(g["verdict"] for g in results).value  # the stored gates' verdict, not the decision
    return {
        "evaluated_at": report.get("evaluated_at", ""),
        "policy": report.get("policy") or {},
        "policy_note": note,
        "verdict": overall,
        "results": results,
        "integrity": report.get("integrity", "verified"),
    }


def _checklist(registry: Registry, model: str, version: str, stage: str, report: dict[str, Any]) -> dict[str, Any]:
    try:
        frameworks = {i.id: i.frameworks for i in load_checklist(stage).items}
    except ChecklistError:
        frameworks = {}
    status = read.version_status(model, version, registry)
    signoffs = status["signoffs"].get(stage, {})
    items = []
    for item in report.get("checklist", []):
        signoff = signoffs.get(item["item"])
        items.append(
            {
                "item": item["item"],
                "text": item["text"],
                "kind": item["kind"],
                "done": bool(item["done"]),
                "reason": item["reason"],
                "frameworks": frameworks.get(item["item"], {}),
                "signoff": signoff,
                "missing": "" if item["done"] else item["reason"],
            }
        )
    return {"items": items, "approval": status["approvals"].get(stage), "complete": all(i["done"] for i in items)}


# decisions -----------------------------------------------------------------------------------------------
def _decisions(registry: Registry, model: str, version: str, chain: audit.ChainReport) -> dict[str, Any]:
    events = [e for e in audit.events(registry, model=model) if e.event in DECISION_EVENTS]
    verification = {
        "status": chain.status,
        "detail": chain.summary(),
        # the signed chain head this dossier was built on: `unmask audit --verify --anchor DOSSIER`
        "anchor": chain.anchor,
    }
    return {
        "events": [
            e.to_dict()
            | {
                "this_version": e.version == version
                or e.to_ref == f"{model}@{version}"
                or e.from_ref == f"{model}@{version}"
            }
            for e in events
        ],
        "verification": verification,
    }


# limitations ---------------------------------------------------------------------------------------------
def _limitations(content: dict[str, Any], evidence: CandidateEvidence) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []

    def add(kind: str, text: str, run_id: str = "") -> None:
        out.append({"kind": kind, "text": text, "run_id": run_id})

    for stage, gates in content["gates"].items():
        for g in gates["results"]:
            if g["verdict"] != "pass":
                add(f"{g['verdict']} gate", f"{stage} / {g['gate']}: {g['reason']}", g["run_id"])
    for stage, gates in content["gates"].items():
        if gates["integrity"] != "verified":
            add(
                "gate report integrity",
                f"the {stage} gate report is {gates['integrity']}: written before gate "
                "reports were hashed (re-judge to hash it)",
            )
    for stage in content["not_judged"]:
        add("not judged", f"stage {stage} was never judged for this version")
    identity = content["identity"]
    entry = identity["catalog"]
    if entry is None:
        add("unverified catalog field", f"{content['model']} is not in models/catalog.yaml at this commit")
    else:
        if not entry["pinned"]:
            add(
                "unverified catalog field",
                f"revision {entry['revision'] or '(none)'} is not pinned to a checked commit (pinned: false)",
            )
        if not entry["sha256"]:
            add(
                "unverified catalog field",
                "the catalog lists no sha256 for the files; the hashes shown were "
                "recorded at evaluation, not checked against a published list",
            )
        if entry["parameters"] is None:
            add("unverified catalog field", "parameters: null in the catalog (the count shown comes from the card)")
    for finding in (identity["license"] or {}).get("findings", []):
        add("license finding", finding)
    if identity["integrity"]["status"] != "verified":
        add("evidence integrity", f"evidence {identity['integrity']['status']}: {identity['integrity']['detail']}")
    best: dict[str, tuple[float, str]] = {}
    for r in content["evaluation"]["records"]:
        if r["valid"] is True and r["accuracy"] >= best.get(r["task"], (-1.0, ""))[0]:
            best[r["task"]] = (r["accuracy"], r["run_id"])
    for task, (score, run_id) in sorted(best.items()):
        if score < WEAK_BELOW:
            add("weak task", f"{task}: best measured accuracy {score:.1%} (below {WEAK_BELOW:.0%})", run_id)
    for task, metrics in sorted(identity["heldout_test"].items()):
        top = max((v for v in metrics.values() if isinstance(v, (int, float))), default=None)
        if top is not None and top < WEAK_BELOW and task not in best:
            add(
                "weak task",
                f"{task}: the model card reports held-out scores of at most {top:.1%} "
                f"({', '.join(f'{k} {v:.1%}' for k, v in metrics.items())}); not measured in this sweep",
            )
    records = evidence.records
    if not any(str(r.device).startswith("cuda") for r in records):
        add("not measured", "GPU: every record was measured on " + ", ".join(sorted({r.device for r in records})))
    longest = max(r.gen_length for r in records)
    if longest < LONG_CONTEXT:
        add("not measured", f"long context: the longest generation measured is {longest} tokens")
    if not content["evaluation"]["loadtest"]:
        add("not measured", "serving under load: no load-test records (unmask loadtest) in this version's evidence")
    probe = content["reproducibility"]["probe"]
    if probe is None:
        add("not measured", "reproducibility: no probe was recorded")
    else:
        for check in ("same_process", "fresh_process", "batch_invariant"):
            if not probe.get(check):
                add("reproducibility", f"{check.replace('_', ' ')}: not shown by the probe")
    if content["decisions"]["verification"]["status"] != "intact":
        add(
            "audit trail",
            f"audit trail {content['decisions']['verification']['status']}: "
            f"{content['decisions']['verification']['detail']}",
        )
    return out
