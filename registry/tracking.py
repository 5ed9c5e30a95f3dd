"""Evidence into MLflow and back: one run per EvalRecord, one evidence run and model version per revision.

Layout in the `unmask-evaluations` experiment:
- a record run per `EvalRecord`: SamplerConfig as params, measurements as metrics, model id,
  revision, weights hash, record id and validity as tags, `record.json` plus any extra artifacts
  (curves, GX results);
- an evidence run per registration, parent of its record runs: `evidence/evidence.json` (the
  `CandidateEvidence` without records, plus the record run ids), `evidence/records.json`,
  `evidence/model_card.md`, and later `gates/<stage>.json|md` gate reports. Each evidence artifact's
  sha256 is a tag of the run (`unmask.sha256.<path>`), checked on every read (registry/integrity.py).
The registered model (one per candidate) gets one version per weights hash, created with
`MlflowClient.create_model_version(name, source, run_id)` from the evidence run's artifacts; a
re-evaluation of the same weights re-points the version's `unmask.evidence_run` tag.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from evals.parallelism import parallelism_summary
from evals.records import CandidateEvidence, EvalRecord, LicenseResult, ReproducibilityResult, SpeedComparison
from gates.decision import UNVERIFIED
from gates.evaluate import all_passed, gate_report_markdown
from gates.promotion import EVIDENCE_ARTIFACTS, gate_report_payload, registration_payload
from gates.signatures import signature_problem
from registry import audit, audit_events, keys
from registry.audit import AuditEvent
from registry.connection import EVALUATIONS_EXPERIMENT, RegistryError
from registry.identity import Actor, current_actor
from registry.integrity import (
    DIGEST_PREFIX,
    SIGNATURE_PREFIX,
    TAMPERED,
    VERIFIED,
    EvidenceTampered,
    GateReportTampered,
    digest_tags,
    record_finding,
    recorded_digests,
    sha256_hex,
    verify_artifact,
)
from registry.loadtests import log_serving_record, serving_records
from registry.rollouts import canary_evidence
from registry.store import Registry, model_tag, now_iso, registration_alias, retry_busy

METRICS = (
    "accuracy",
    "accuracy_strict",
    "accuracy_flexible",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "time_to_first_block_s",
    "throughput_items_per_s",
    "tokens_per_s",
    "tokens_per_s_with_padding",
    "tokens_per_forward",
    "nfe",
    "peak_mem_mb",
    "errors",
    "n_items",
    "gen_length",
    "batch_size",
)
MAX_PARAM_CHARS = 6000  # MLflow's limit on a param value


def _identity_tags(model: str, revision: str, weights: str) -> dict[str, str]:
    return {
        model_tag("model"): model,
        model_tag("revision"): revision or "",
        model_tag("weights_sha256"): weights or "",
    }


def log_record(
    registry: Registry,
    record: EvalRecord,
    artifacts: dict[str, str | Path] | None = None,
    parent_run_id: str | None = None,
) -> EvalRecord:
    """Log one record as its own run; returns the record with `run_id` set. `artifacts`: {artifact dir: local path}."""
    client = registry.client
    tags = _identity_tags(record.candidate, record.model_revision, record.weights_sha256) | {
        model_tag("kind"): "record",
        model_tag("record_id"): record.record_id,
        model_tag("task"): record.task,
        model_tag("split"): record.split,
        model_tag("config_hash"): record.config_hash,
        model_tag("backend"): record.backend,
        model_tag("valid"): str(record.valid).lower(),
        model_tag("role"): record.role,
    }
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    run = client.create_run(
        registry.experiment_id(EVALUATIONS_EXPERIMENT),
        tags=tags,
        run_name=f"{record.candidate}/{record.task}/{record.config_hash[:8]}",
    )
    run_id = run.info.run_id
    logged = replace(record, run_id=run_id)
    try:
        params = [
            Param(str(k), json.dumps(v) if not isinstance(v, str) else v) for k, v in sorted(record.config.items())
        ]
        params = [Param(p.key, p.value[:MAX_PARAM_CHARS]) for p in params]
        ms = int(time.time() * 1000)
        metrics = [
            Metric(name, float(getattr(record, name)), ms, 0) for name in METRICS if getattr(record, name) is not None
        ]
        metrics.append(Metric("error_rate", record.errors / max(record.n_items, 1), ms, 0))
        client.log_batch(run_id, metrics=metrics, params=params)
        client.log_dict(run_id, logged.to_dict(), "record.json")
        for folder, path in (artifacts or {}).items():
            path = Path(path)
            if path.is_dir():
                client.log_artifacts(run_id, str(path), folder)
            else:
                client.log_artifact(run_id, str(path), folder)
        client.set_terminated(run_id, "FINISHED")
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    return logged


def register_evidence(
    registry: Registry,
    evidence: CandidateEvidence,
    artifacts: dict[str, dict[str, str | Path]] | None = None,
    model_card_md: str | None = None,
) -> tuple[str, CandidateEvidence]:
    """Log every record and the evidence, register (or re-point) the version for these weights.

    artifacts: {record_id: {artifact dir: local path}} for per-record curves and GX results.
    Returns (version, evidence with run ids filled in). Sets `candidate` (or `fallback` for the AR
    role) on the version.
    """
    client = registry.client
    model = evidence.candidate
    weights = evidence.weights_sha256 or (evidence.records[0].weights_sha256 if evidence.records else "")
    revision = evidence.model_revision or (evidence.records[0].model_revision if evidence.records else "")
    strays = [r for r in evidence.serving if r.weights_sha256 != weights]
    if strays:  # refused before anything is written
        raise RegistryError(
            f"{model}: a serving record measured weights {strays[0].weights_sha256[:12] or 'none'}, "
            f"the evidence is of {weights[:12] or 'none'}; not registered"
        )
    tags = _identity_tags(model, revision, weights) | {model_tag("kind"): "evidence", model_tag("role"): evidence.role}
    run = client.create_run(
        registry.experiment_id(EVALUATIONS_EXPERIMENT), tags=tags, run_name=f"{model}@{revision or 'local'} evidence"
    )
    run_id = run.info.run_id
    try:
        records = [
            log_record(registry, r, (artifacts or {}).get(r.record_id), parent_run_id=run_id) for r in evidence.records
        ]
        logged = replace(evidence, records=records, weights_sha256=weights, model_revision=revision)
        # written as exact bytes, so the sha256 recorded beside them is of what a later read gets back
        contents = {
            "evidence/evidence.json": json.dumps(_evidence_summary(logged), indent=2).encode(),
            "evidence/records.json": json.dumps({"records": [r.to_dict() for r in records]}, indent=2).encode(),
            "evidence/model_card.md": (model_card_md or _model_card(logged)).encode(),
        }
        for path, data in contents.items():
            client.log_text(run_id, data.decode(), path)
        vouching = digest_tags(contents, run_id, registry.tracking_uri)
        for key, digest in vouching.items():
            client.set_tag(run_id, key, digest)
        ms = int(time.time() * 1000)  # AUP per task and length, for MLflow's own charts
        client.log_batch(
            run_id,
            metrics=[
                Metric(f"aup/{c['task']}/{c['gen_length']}", float(c["aup"]), ms, 0)
                for c in parallelism_summary(records)
            ],
        )
        client.set_terminated(run_id, "FINISHED")
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    version, registered = _version_for(registry, logged, run_id, run.info.artifact_uri, recorded_digests(vouching))
    # serving records that came with the evidence (measured before registering) are kept with its version
    logged = replace(
        logged,
        serving=[
            log_serving_record(registry, replace(r, model=model, version=version, run_id=None))
            for r in evidence.serving
        ],
    )
    retry_busy(client.set_registered_model_alias, model, registration_alias(evidence.role), version)
    audit.append(registry, registered)
    return version, logged


def registrant_tags(registrant: Actor, key: str, signature: str) -> dict[str, str]:
    """The version tags that say who registered (or vouched for) its evidence, and their signature over it."""
    return {
        model_tag("evaluated_by"): registrant.name,
        model_tag("evaluated_from"): registrant.host,
        model_tag("evaluated_account"): registrant.account,
        model_tag("evaluated_identity"): registrant.source,
        model_tag("evaluated_key"): key,
        model_tag("evaluated_signature"): signature,
    }


def _version_for(
    registry: Registry, evidence: CandidateEvidence, run_id: str, artifact_uri: str, digests: Mapping[str, str]
) -> tuple[str, AuditEvent]:
    """The version these weights hold (registered now, or re-pointed at this evidence), and the audit entry that
    says so (`evidence_registered`: by whom, the evidence run, the weights and the registrant's signature)."""
    client = registry.client
    model = evidence.candidate
    try:
        client.create_registered_model(
            model,
            tags={model_tag("role"): evidence.role, model_tag("kind"): evidence.kind},
            description=f"unmask candidate {model} ({evidence.kind}, {evidence.role})",
        )
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    registrant = current_actor(registry.tracking_uri)  # who registered this evidence: never its approver (four-eyes)
    at = now_iso()
    signer = keys.signer(registrant.name)  # the registrant's own key signs what was registered (docs/governance.md)
    # a version re-pointed at new evidence keeps no signature of the old
    signed = signer.sign(registration_payload(model, run_id, digests, registrant.name, at)) if signer else ("", "")
    tags = {model_tag("evidence_run"): run_id, model_tag("evaluated_at"): at} | registrant_tags(registrant, *signed)
    existing = registry.version_of_weights(model, evidence.weights_sha256)

    def entry(version: str) -> AuditEvent:
        weights = evidence.weights_sha256[:12] or "none"
        return AuditEvent(
            "evidence_registered",
            registrant.name,
            at,
            registration_alias(evidence.role),
            model,
            version,
            comment=f"{'re-pointed at new' if existing else 'registered with'} evidence: {evidence.kind} "
            f"{evidence.role}, revision {evidence.model_revision or 'local'}, weights {weights}",
            evidence={
                "evidence_run": run_id,
                "weights_sha256": evidence.weights_sha256,
                "revision": evidence.model_revision,
                "digests": dict(digests),
                "key": tags[model_tag("evaluated_key")],
                "signature": tags[model_tag("evaluated_signature")],
            },
        )

    if existing is not None:
        registry.set_version_tags(model, existing, tags)
        return existing, entry(existing)
    created = client.create_model_version(
        model,
        f"{artifact_uri}/evidence",
        run_id=run_id,
        tags=_identity_tags(model, evidence.model_revision, evidence.weights_sha256) | tags,
        description=f"{model} at revision {evidence.model_revision or 'local'}, weights {evidence.weights_sha256[:12]}",
    )
    return str(created.version), entry(str(created.version))


def evidence_identity(evidence: CandidateEvidence) -> str:
    """A hash of the facts gates judge on: record ids, output hashes, validity and item counts, probe and license
    results, failures, role and kind (not run ids, which every logging sets anew)."""
    records = sorted((r.record_id, r.output_hash, r.valid, r.n_items) for r in evidence.records)
    parts = [
        records,
        evidence.reproducibility.to_dict() if evidence.reproducibility else None,
        evidence.license.to_dict() if evidence.license else None,
        sorted(evidence.failures),
        evidence.role,
        evidence.kind,
    ]
    if evidence.speed:  # what was compared, not how it timed: a re-run's timings alone reuse the version
        parts.append(sorted(s.key() for s in evidence.speed))
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def registered_speed(registry: Registry, model: str, weights_sha256: str) -> list[SpeedComparison]:
    """The paired speed measurements the registered version of these weights holds ([] when none is registered
    or its evidence cannot be read untouched)."""
    version = registry.version_of_weights(model, weights_sha256)
    if version is None:
        return []
    try:
        return verified_evidence(registry, model, version)[0].speed
    except RegistryError:
        return []


def registered_unchanged(registry: Registry, evidence: CandidateEvidence) -> str | None:
    """The version of `evidence`'s weights when the evidence it was last judged on is the same, else None."""
    version = registry.version_of_weights(evidence.candidate, evidence.weights_sha256)
    if version is None:
        return None
    try:
        held, vouched = verified_evidence(registry, evidence.candidate, version)
    except RegistryError:  # a version without readable (or untouched) evidence is registered afresh
        return None
    if vouched["status"] == UNVERIFIED:  # registered afresh, so its evidence gets hashes at last
        return None
    return version if evidence_identity(held) == evidence_identity(evidence) else None


def register_or_reuse(registry: Registry, evidence: CandidateEvidence) -> tuple[str, bool]:
    """Register `evidence` unless the registry already holds exactly it; (version, reused).

    Reusing keeps the version's evidence run and `evaluated_at`, so approvals and sign-offs given on
    it still count; as a registration would, it points `candidate` (or `fallback`) at the version.
    """
    version = registered_unchanged(registry, evidence)
    if version is None:
        return register_evidence(registry, evidence)[0], False
    alias = registration_alias(evidence.role)
    if registry.aliases_of(evidence.candidate).get(alias) != version:  # the alias moves back: said in the trail
        retry_busy(registry.client.set_registered_model_alias, evidence.candidate, alias, version)
        tags = registry.version_tags(evidence.candidate, version)
        audit.append(
            registry,
            AuditEvent(
                "evidence_registered",
                current_actor(registry.tracking_uri).name,
                now_iso(),
                alias,
                evidence.candidate,
                version,
                comment=f"re-registered: the same evidence as version {version} holds, {alias} back on it",
                evidence={"evidence_run": tags.get(model_tag("evidence_run"), ""), "reused": True},
            ),
        )
    return version, True


def _evidence_summary(evidence: CandidateEvidence) -> dict[str, Any]:
    return {
        "candidate": evidence.candidate,
        "role": evidence.role,
        "kind": evidence.kind,
        "model_revision": evidence.model_revision,
        "weights_sha256": evidence.weights_sha256,
        "reproducibility": evidence.reproducibility.to_dict() if evidence.reproducibility else None,
        "license": evidence.license.to_dict() if evidence.license else None,
        # a model card's YAML front matter may hold dates; keep the artifact plain JSON
        "card": json.loads(json.dumps(evidence.card, default=str)),
        "failures": evidence.failures,
        "record_run_ids": [r.run_id for r in evidence.records],
        "parallelism": parallelism_summary(evidence.records),
        "speed": [s.to_dict() for s in evidence.speed],
    }


def _model_card(evidence: CandidateEvidence) -> str:
    lines = [
        f"# {evidence.candidate}",
        "",
        f"- kind: {evidence.kind}",
        f"- role: {evidence.role}",
        f"- revision: {evidence.model_revision or 'local'}",
        f"- weights sha256: `{evidence.weights_sha256}`",
    ]
    if evidence.license:
        lines.append(f"- license: {evidence.license.expression} (tier {evidence.license.tier})")
    lines += [f"- {k}: {v}" for k, v in sorted(evidence.card.items())]
    lines += ["", "| task | config | accuracy | p95 s | peak MB | valid |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r.task} | {r.config_hash[:8]} | {r.accuracy:.3f} | {r.latency_p95_s:.3f} | "
        f"{'-' if r.peak_mem_mb is None else f'{r.peak_mem_mb:.0f}'} | {r.valid} |"
        for r in evidence.records
    ]
    return "\n".join(lines) + "\n"


def evidence_run_id(registry: Registry, model: str, version: str, tags: Mapping[str, str] | None = None) -> str:
    """The version's evidence run; `tags`: the version's tags as the caller has just read them."""
    tags = registry.version_tags(model, version) if tags is None else tags
    run_id = tags.get(model_tag("evidence_run"))
    if not run_id:
        raise RegistryError(
            f"{model} version {version} has no {model_tag('evidence_run')} tag; it was not registered by unmask"
        )
    return run_id


def load_evidence(registry: Registry, model: str, version: str) -> CandidateEvidence:
    """The evidence a version was last evaluated on, read back from its evidence run and checked against the
    sha256 recorded at registration (EvidenceTampered on a mismatch)."""
    return verified_evidence(registry, model, version)[0]


def verified_evidence(
    registry: Registry, model: str, version: str, tags: Mapping[str, str] | None = None
) -> tuple[CandidateEvidence, dict[str, Any]]:
    """`load_evidence`, and what vouches for it: {run_id, status (verified / unverified), sha256 {artifact: hex}}.

    `tags`: the version's tags as the caller has just read them (`registry.state.VersionState.tags`)."""
    run_id = evidence_run_id(registry, model, version, tags)
    run_tags = _run_tags(registry, model, version, run_id)
    statuses, loaded = set(), {}
    for path in ("evidence/evidence.json", "evidence/records.json"):
        data = registry.load_artifact_bytes(run_id, path)
        statuses.add(verify_artifact(run_tags, model, version, run_id, path, data, tracking_uri=registry.tracking_uri))
        loaded[path] = json.loads(data)
    summary, records = loaded["evidence/evidence.json"], loaded["evidence/records.json"]["records"]
    status = UNVERIFIED if UNVERIFIED in statuses else VERIFIED
    evidence = _evidence_from(summary, records)
    # what `unmask loadtest` measured of these weights, by concurrency
    evidence = replace(
        evidence,
        serving=serving_records(registry, model, version, evidence.weights_sha256 or None),
        canary=canary_evidence(registry, model, version),
    )  # what its rollouts showed live
    return evidence, {"run_id": run_id, "status": status, "sha256": recorded_digests(run_tags)}


def checked_evidence(
    registry: Registry, model: str, version: str, who: str = "unmask", tags: Mapping[str, str] | None = None
) -> tuple[CandidateEvidence, dict[str, Any]]:
    """`verified_evidence` for a caller about to write on it (judge, promote, approve, decline, sign-off): forged
    evidence is recorded as an integrity finding (once, by `who`), then raised."""
    try:
        return verified_evidence(registry, model, version, tags)
    except EvidenceTampered as e:
        record_finding(registry, e, who)
        raise


def evidence_integrity(registry: Registry, model: str, version: str) -> dict[str, Any]:
    """Whether every evidence artifact of a version still hashes as registered: {status, detail, sha256}.

    status: verified, unverified (registered before hashes were recorded) or tampered (detail names the artifact).
    """
    run_id = evidence_run_id(registry, model, version)
    run_tags = _run_tags(registry, model, version, run_id)
    statuses = set()
    try:
        for path in EVIDENCE_ARTIFACTS:
            statuses.add(
                verify_artifact(
                    run_tags,
                    model,
                    version,
                    run_id,
                    path,
                    registry.load_artifact_bytes(run_id, path),
                    tracking_uri=registry.tracking_uri,
                )
            )
    except EvidenceTampered as e:
        return {"status": TAMPERED, "detail": str(e), "sha256": {e.artifact: e.expected}}
    status = UNVERIFIED if UNVERIFIED in statuses else VERIFIED
    detail = "registered before evidence hashes were recorded" if status == UNVERIFIED else ""
    return {"status": status, "detail": detail, "sha256": recorded_digests(run_tags)}


def _run_tags(registry: Registry, model: str, version: str, run_id: str) -> dict[str, str]:
    try:
        return dict(registry.get_run(run_id).data.tags)
    except MlflowException as e:
        raise RegistryError(f"{model} version {version}: evidence run {run_id} cannot be read: {e.message}") from None


def _evidence_from(summary: dict[str, Any], records: list[dict[str, Any]]) -> CandidateEvidence:
    parsed = [EvalRecord.from_dict(r) for r in records]
    repro, lic = summary.get("reproducibility"), summary.get("license")
    return CandidateEvidence(
        candidate=summary["candidate"],
        role=summary["role"],
        kind=summary["kind"],
        records=parsed,
        reproducibility=ReproducibilityResult(**repro) if repro else None,
        license=LicenseResult(**lic) if lic else None,
        model_revision=summary.get("model_revision", ""),
        weights_sha256=summary.get("weights_sha256", ""),
        card=summary.get("card") or {},
        failures=summary.get("failures") or [],
        speed=[SpeedComparison.from_dict(s) for s in summary.get("speed") or []],
    )


def gate_report_path(stage: str) -> str:
    return f"gates/{stage}.json"


def record_gate_report(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    results: list[Any],
    checklist: list[dict[str, Any]] | None = None,
    policy: dict[str, str] | None = None,
    who: str = "unmask",
    tags: Mapping[str, str] | None = None,
    decision: dict[str, Any] | None = None,
) -> None:
    """Store a stage's gate results (JSON + Markdown) in the version's evidence run and its verdict as tags.

    policy: {path, sha256} of the policy file the gates applied (`Policy.cited()`), kept with the verdict.
    decision: the whole decision (`gates.decision.Decision.to_dict()`, versioned by its `schema`), hashed with
    the report.
    The JSON report's sha256 is kept beside the verdict (`unmask.gates.<stage>.sha256`) and checked on every
    `load_gate_report`; a stored report edited since it was written is recorded as a finding before this one
    replaces it. `tags`: the version's tags as the caller has just read them.
    """
    tags = registry.version_tags(model, version) if tags is None else tags
    stored: dict[str, Any] = {}  # the stage's report as last recorded ({}: never judged, or one not to be trusted)
    try:
        stored = load_gate_report(registry, model, version, stage, tags) or {}
    except GateReportTampered as e:  # re-judging replaces the forged report; the forgery stays on the record
        record_finding(registry, e, who)
    before = str((stored.get("decision") or {}).get("outcome", ""))
    run_id = evidence_run_id(registry, model, version, tags)
    at = now_iso()
    payload = {
        "model": model,
        "version": version,
        "stage": stage,
        "evaluated_at": at,
        "passed": all_passed(results),
        "results": [r.to_dict() for r in results],
        "checklist": checklist or [],
        "policy": policy or {},
    }
    if decision is not None:
        payload["decision"] = decision
    if stored.get("integrity") == VERIFIED and _same_report(stored, payload):
        return  # judged again to the same report: the stored one (and its time) stands, nothing is written
    report = json.dumps(payload, indent=2)  # the exact bytes the sha256 vouches for
    markdown = gate_report_markdown(results, f"{model} v{version}: {stage} gates")
    registry.client.log_text(run_id, report, gate_report_path(stage))
    registry.client.log_text(run_id, markdown, f"gates/{stage}.md")
    failed = [r.gate for r in results if not r.passed]
    signed = digest_tags({gate_report_path(stage): report.encode()}, run_id, registry.tracking_uri)
    judged = _judged_by(registry, model, version, stage, sha256_hex(report.encode()), decision, at, tags)
    registry.set_version_tags(
        model,
        version,
        judged
        | {
            model_tag(f"gates.{stage}"): "passed" if not failed else "failed",
            model_tag(f"gates.{stage}.failed"): ",".join(failed),
            model_tag(f"gates.{stage}.at"): at,
            # of the gates that did not pass, those that lacked the evidence to judge (verdict inconclusive)
            model_tag(f"gates.{stage}.inconclusive"): ",".join(r.gate for r in results if r.inconclusive),
            model_tag(f"gates.{stage}.policy"): (policy or {}).get("path", ""),
            model_tag(f"gates.{stage}.policy_sha256"): (policy or {}).get("sha256", ""),
            model_tag(f"gates.{stage}.sha256"): sha256_hex(report.encode()),
            model_tag(f"gates.{stage}.sig"): signed[SIGNATURE_PREFIX + gate_report_path(stage)],
            model_tag(f"gates.{stage}.md_sha256"): sha256_hex(markdown.encode()),
        },
    )
    if decision is not None and decision["outcome"] != before:  # the verdict a consumer acts on moved
        audit_events.record_decision_change(registry, who, at, before, decision, sha256_hex(report.encode()), run_id)


def _judged_by(
    registry: Registry,
    model: str,
    version: str,
    stage: str,
    sha256: str,
    decision: Mapping[str, Any] | None,
    at: str,
    tags: Mapping[str, str],
) -> dict[str, str]:
    """The tag saying who judged the report stored now, signed with their own key (`gate_report_payload`); an empty
    one where they hold none and an earlier judge's signature would otherwise stand beside this report."""
    key = model_tag(f"gates.{stage}.signed")
    judge = current_actor(registry.tracking_uri)
    signer = keys.signer(judge.name)
    if signer is None:
        return {key: ""} if tags.get(key) else {}
    outcome = str((decision or {}).get("outcome", ""))
    fingerprint, signature = signer.sign(gate_report_payload(model, version, stage, sha256, outcome, judge.name, at))
    signed = {"by": judge.name, "at": at, "outcome": outcome, "key": fingerprint, "signature": signature}
    return {key: json.dumps(signed, sort_keys=True)}


def gate_report_signer(report: Mapping[str, Any], tags: Mapping[str, str], stage: str, roles: Any) -> str:
    """Who judged a stored report, in words: signed by them (checked against the keys `roles` lists, where it lists
    any), or why it does not count as theirs."""
    try:
        signed = json.loads(tags.get(model_tag(f"gates.{stage}.signed")) or "{}")
    except json.JSONDecodeError:
        signed = {}
    if not isinstance(signed, dict) or not signed.get("signature"):
        return "judged by nobody's key (unsigned)"
    by, at, key = str(signed.get("by", "")), str(signed.get("at", "")), str(signed.get("key", ""))
    payload = gate_report_payload(
        str(report.get("model", "")),
        str(report.get("version", "")),
        stage,
        tags.get(model_tag(f"gates.{stage}.sha256"), ""),
        str((report.get("decision") or {}).get("outcome", "")),
        by,
        at,
    )
    if not roles.keys:
        return f"judged by {by}, signed with {key} (no keys listed to check it)"
    problem = signature_problem(
        roles.keys, f"the gate report judged by {by}", by, payload, key, str(signed["signature"]), at
    )
    return problem or f"judged by {by}, signed with {key}"


def _same_report(stored: Mapping[str, Any], payload: Mapping[str, Any]) -> bool:
    """Whether a stored report says what `payload` says, but for when each was judged (the JSON round trip
    made equal: tuples read back as lists)."""
    moment = ("evaluated_at", "integrity")
    fresh = json.loads(json.dumps({k: v for k, v in payload.items() if k not in moment}))
    return bool(fresh == {k: v for k, v in stored.items() if k not in moment})


def load_gate_report(
    registry: Registry, model: str, version: str, stage: str, tags: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The last stored gate report of a stage, or None when the stage was never evaluated.

    Checked against the sha256 recorded when it was written: `integrity` is "verified", or "unverified" for a
    report written before gate reports were hashed; an edited report raises GateReportTampered (naming the file).
    `tags`: the version's tags as the caller has just read them.
    """
    tags = registry.version_tags(model, version) if tags is None else tags
    if model_tag(f"gates.{stage}") not in tags:
        return None
    run_id = evidence_run_id(registry, model, version, tags)
    path = gate_report_path(stage)
    try:
        data = registry.load_artifact_bytes(run_id, path)
    except RegistryError:
        return None
    recorded = tags.get(model_tag(f"gates.{stage}.sha256"))
    vouched = {DIGEST_PREFIX + path: recorded} if recorded is not None else {}
    if model_tag(f"gates.{stage}.sig") in tags:  # its signature: a report rewritten with its hash does not verify
        vouched[SIGNATURE_PREFIX + path] = tags[model_tag(f"gates.{stage}.sig")]
    status = verify_artifact(
        vouched, model, version, run_id, path, data, tampered=GateReportTampered, tracking_uri=registry.tracking_uri
    )
    try:
        report = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # only an unhashed (old) report gets here
        raise RegistryError(f"{model} version {version}: gate report {path} (run {run_id}) is not JSON: {e}") from None
    if not isinstance(report, dict):
        raise RegistryError(f"{model} version {version}: gate report {path} (run {run_id}) is not a JSON object")
    return report | {"integrity": status}
