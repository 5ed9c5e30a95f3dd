"""The system of record: the only code that talks to MLflow (runs, registered models, aliases, approvals, audit).

Write side: `Registry`, `register_evidence`, `log_record`, `approve`, `decline`, `sign_off`, `judge`,
`promote`, `rollback`, `recover`; who acts comes from `registry.identity` (the MLflow user on a basic-auth
server, else the OS user), the approval lifecycle lives in `registry.approvals`. Integrity (registry/integrity.py): evidence hashes checked on every read
(`EvidenceTampered`), stage aliases checked against the audit trail (`AliasDrift`). Read side for
dashboards: `registry.read` (plain dicts and DataFrames).
"""

from registry.approvals import ApprovalRefused, decline
from registry.connection import RegistryError, RegistryUnavailable, resolve_tracking_uri
from registry.identity import Actor, IdentityMismatch, current_actor
from registry.integrity import AliasDrift, EvidenceTampered, alias_drift
from registry.promotion import (
    Move,
    PromotionRefused,
    approve,
    judge,
    promote,
    recover,
    rollback,
    sign_off,
    stage_holder,
)
from registry.store import (ALIASES, CANDIDATE_ALIAS, FALLBACK_ALIAS, STAGE_ALIASES, Registry, latest_registration,
                            registration_alias)
from registry.tracking import (evidence_integrity, load_evidence, log_record, record_gate_report, register_evidence,
                               register_or_reuse)

__all__ = ["ALIASES", "Actor", "AliasDrift", "ApprovalRefused", "CANDIDATE_ALIAS", "EvidenceTampered", "FALLBACK_ALIAS",
           "IdentityMismatch", "STAGE_ALIASES", "Move", "current_actor", "decline",
           "PromotionRefused", "Registry", "RegistryError", "RegistryUnavailable", "alias_drift", "approve",
           "evidence_integrity", "judge", "latest_registration", "load_evidence", "log_record", "promote",
           "record_gate_report", "recover", "register_evidence", "register_or_reuse", "registration_alias",
           "resolve_tracking_uri", "rollback", "sign_off", "stage_holder"]
