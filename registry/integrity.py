"""Evidence that cannot be edited unnoticed, and stage aliases that cannot move unnoticed.

Evidence: at registration each evidence artifact's sha256 is recorded as a tag of its evidence run
(`unmask.sha256.<artifact path>`), and every read of the artifact checks it; a mismatch is an
`EvidenceTampered` naming model, version, artifact and both hashes. A run registered before hashes
were recorded (no such tag at all) is read as "unverified": it still judges, and says so. Once a run
has any hash tag, an evidence artifact without one was stripped of it, which counts as tampering.

Aliases: the audit trail's last settled move of a stage says who should hold it. A holder that
differs (someone moved the alias with the MLflow client) is an `AliasDrift`; promote and rollback
refuse to act on it until `reconcile` puts the alias back on the audited holder.

The audit trail: `registry.audit.verify` recomputes its hash chain; a break is a `ChainBroken` naming the
first entry edited, removed, reordered or inserted (the nightly records it as a finding).

Write-side callers (judge, promote, rollback) record each problem once as an `integrity_finding`
audit event; read-side callers (dashboard, `registry.read`) only report it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from mlflow.entities import Metric

from gates.decision import UNVERIFIED
from registry import audit, signing
from registry.audit import AuditEvent, parse_ref, ref
from registry.connection import RegistryError
from registry.store import Registry, model_tag, now_iso

DIGEST_PREFIX = model_tag("sha256.")
SIGNATURE_PREFIX = model_tag("sig.")  # "<key id>:<hmac>" of each artifact's sha256 under the signing key
FINDING = "integrity_finding"
VERIFIED, TAMPERED = "verified", "tampered"  # and UNVERIFIED (gates.decision: nothing passes on it)

log = logging.getLogger("unmask.registry")
log.addHandler(logging.NullHandler())  # a library's warning: shown where the app configures logging (serve, Prefect),
# not doubled on the CLI's stderr beside the line the command prints itself
_reported: set[tuple[str, str]] = (
    set()
)  # (store, drift) already logged by this process; a server polling holders logs it once

Holder = tuple[str, str] | None


class EvidenceTampered(RegistryError):
    """An evidence artifact whose content no longer matches the sha256 recorded at registration."""

    def __init__(self, model: str, version: str, artifact: str, expected: str, found: str, run_id: str):
        self.model, self.version, self.artifact = model, version, artifact
        self.expected, self.found, self.run_id = expected, found, run_id
        super().__init__(
            f"{model} version {version}: evidence artifact {artifact} (run {run_id}) was changed after "
            f"registration: recorded sha256 {expected or 'removed'}, found {found}; nothing is judged "
            "or moved on it (re-evaluate the model to register fresh evidence)"
        )

    def finding(self) -> dict[str, Any]:
        return {
            "kind": "tampered",
            "artifact": self.artifact,
            "run_id": self.run_id,
            "expected": self.expected,
            "found": self.found,
        }


class GateReportTampered(EvidenceTampered):
    """A stored gate report (`gates/<stage>.json`) whose content no longer matches the sha256 recorded when it was
    written: a verdict edited by hand (a failed gate flipped to passed, say)."""

    def __init__(self, model: str, version: str, artifact: str, expected: str, found: str, run_id: str):
        self.model, self.version, self.artifact = model, version, artifact
        self.expected, self.found, self.run_id = expected, found, run_id
        RegistryError.__init__(
            self,
            f"{model} version {version}: gate report {artifact} (run {run_id}) was changed "
            f"after it was written: recorded sha256 {expected or 'removed'}, found {found}; no "
            f"verdict is read from it (re-judge with `unmask gates {model} --version {version} --store` "
            "to write a fresh one)",
        )


class ChainBroken(RegistryError):
    """The audit trail's hash chain does not verify; the message names the first entry that was tampered with."""

    def __init__(self, report: audit.ChainReport, action: str = ""):
        self.report = report
        refused = f"{action} refused: nothing acts on an audit trail that does not verify; " if action else ""
        way_out = (
            "; `unmask rollback --stage STAGE --to-fallback` still moves a stage to the fallback"
            if action.startswith("rollback")
            else ""
        )
        super().__init__(
            f"{refused}{report.summary()}; the audit trail was changed outside unmask (see docs/integrity.md){way_out}"
        )

    def finding(self) -> dict[str, Any]:
        found = self.report.first_break
        return {
            "kind": "audit_chain",
            "break": found.kind if found else "",
            "run_id": found.run_id if found else "",
            "seq": found.seq if found else None,
            "position": found.position if found else None,
        }


def chain_broken(registry: Registry) -> ChainBroken | None:
    """The audit chain's first break now, or None when it verifies (or has not started)."""
    report = audit.verify(registry)
    return None if report.ok else ChainBroken(report)


def trusted_chain(registry: Registry, action: str, who: str = "unmask") -> audit.ChainReport:
    """The verified chain before `action` acts on the trail (rollback, promotion, approval, sign-off, recovery);
    a break is recorded once as a finding and raised as one `ChainBroken` line naming the first bad entry."""
    report = audit.verify(registry)
    if not report.ok:
        problem = ChainBroken(report, action)
        record_finding(registry, problem, who)
        raise problem
    return report


class AliasDrift(RegistryError):
    """A stage alias held by someone other than the audit trail's last settled move put there."""

    def __init__(self, alias: str, expected: Holder, found: list[tuple[str, str]]):
        self.alias, self.expected, self.found = alias, expected, found
        shown = ", ".join(ref(*h) for h in found) or "nobody"
        super().__init__(
            f"alias {alias} drifted: the audit trail's last settled move left it on "
            f"{ref(*(expected or (None, None))) or 'nobody'}, the registry has it on {shown} (moved "
            f"outside unmask); promote and rollback refuse it until `unmask rollback --stage {alias} "
            "--reconcile` puts it back"
        )

    def finding(self) -> dict[str, Any]:
        return {
            "kind": "drift",
            "alias": self.alias,
            "expected": ref(*(self.expected or (None, None))),
            "found": [ref(*h) for h in self.found],
        }


# evidence ----------------------------------------------------------------------------------------------
def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_tags(contents: Mapping[str, bytes], run_id: str, tracking_uri: str = "") -> dict[str, str]:
    """The run tags that vouch for artifacts {path: content} of run `run_id` as registered: each sha256, and with
    `tracking_uri` its signature under the store's signing key (which the store does not hold)."""
    ring = signing.key_ring(tracking_uri) if tracking_uri else None
    tags = {}
    for path, data in contents.items():
        digest = sha256_hex(data)
        tags[DIGEST_PREFIX + path] = digest
        if ring is not None:
            tags[SIGNATURE_PREFIX + path] = ring.sign(signing.artifact_message(run_id, path, digest))
    return tags


def seal_run(client: Any, run_id: str, metrics: list[Metric], path: str, data: bytes) -> None:
    """Finish a record run: its metrics, the artifact `path` holding `data`, the tag vouching for it, FINISHED; a
    run that fails on the way is marked FAILED, so no reader takes it for a whole record."""
    try:
        client.log_batch(run_id, metrics=metrics)
        client.log_text(run_id, data.decode(), path)
        for key, digest in digest_tags({path: data}, run_id).items():
            client.set_tag(run_id, key, digest)
        client.set_terminated(run_id, "FINISHED")
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise


def recorded_digests(run_tags: Mapping[str, str]) -> dict[str, str]:
    """{artifact path: sha256} as recorded on an evidence run at registration."""
    return {k.removeprefix(DIGEST_PREFIX): v for k, v in run_tags.items() if k.startswith(DIGEST_PREFIX)}


def verify_artifact(
    run_tags: Mapping[str, str],
    model: str,
    version: str,
    run_id: str,
    path: str,
    data: bytes,
    tampered: type[EvidenceTampered] = EvidenceTampered,
    tracking_uri: str = "",
) -> str:
    """VERIFIED, or UNVERIFIED (registered before hashes, or before their signatures, were recorded); raise
    `tampered` (EvidenceTampered) on a mismatch, or when the sha256 tag's signature does not verify (the
    artifact and its hash rewritten together by someone without the signing key)."""
    expected = run_tags.get(DIGEST_PREFIX + path)
    if expected is None and not any(k.startswith(DIGEST_PREFIX) for k in run_tags):
        return UNVERIFIED
    found = sha256_hex(data)
    if expected != found:
        raise tampered(model, version, path, expected or "", found, run_id)
    signature = run_tags.get(SIGNATURE_PREFIX + path)
    if signature is None:
        if any(k.startswith(SIGNATURE_PREFIX) for k in run_tags):  # the others are signed: this one was stripped
            raise tampered(model, version, path, "unsigned (its signature was removed)", found, run_id)
        return UNVERIFIED
    problem = signing.key_ring(tracking_uri).problem(signing.artifact_message(run_id, path, expected), signature)
    if problem:
        raise tampered(model, version, path, f"{expected[:16]}… whose signature {problem}", found, run_id)
    return VERIFIED


def record_finding(
    registry: Registry, problem: EvidenceTampered | AliasDrift | ChainBroken, who: str = "unmask"
) -> None:
    """Write the problem to the audit trail as a finding, unless the same one is recorded already."""
    detail = problem.finding()
    if isinstance(problem, EvidenceTampered):
        model, version, stage = problem.model, problem.version, ""
    else:
        model, version, stage = "", "", getattr(problem, "alias", "")
    seen = audit.events(registry, model=model or None, stage=stage or None, event=FINDING)
    if stage:  # the same drift again after a move (a reconcile, say) is a new finding
        last = audit.last_settled_move(registry, stage)
        seen = [e for e in seen if not last or e.when > last.when]
    if any(e.evidence == detail for e in seen):
        return
    audit.append(
        registry, AuditEvent(FINDING, who, now_iso(), stage, model, version, comment=str(problem), evidence=detail)
    )


# aliases -------------------------------------------------------------------------------------------------
def alias_drift(
    registry: Registry,
    stage: str,
    holders: list[tuple[str, str]] | None = None,
    pending: list[AuditEvent] | None = None,
) -> AliasDrift | None:
    """The drift of one stage alias now, or None when it is where the audit trail's last settled move left it.

    A move in flight or interrupted (RUNNING) is not drift: `recover` settles it, and readers read through it.
    `holders` and `pending`: what the caller has just read, so as not to read them twice.
    """
    pending = audit.pending_moves(registry, stage) if pending is None else pending
    if pending:
        return None
    last = audit.last_settled_move(registry, stage)
    expected = parse_ref(last.to_ref) if last else None
    found = sorted(registry.holders(stage) if holders is None else holders)
    if found == ([expected] if expected else []):
        return None
    return AliasDrift(stage, expected, found)


def report_drift(drift: AliasDrift | None, where: str = "") -> None:
    """Log a drift once per process and store (`where`: its tracking URI; the same words on two stores are two
    drifts). Readers report; only promote and rollback refuse."""
    if drift is not None and (where, str(drift)) not in _reported:
        _reported.add((where, str(drift)))
        log.warning("%s", drift)
