"""The system of record: the only code that talks to MLflow (runs, registered models, aliases, approvals, audit).

Write side: `Registry`, `register_evidence`, `log_record`, `approve`, `decline`, `sign_off`, `promote`,
`rollback`, `recover` (`registry.promotion` is the only code that moves an alias); who acts comes from
`registry.identity` (the MLflow user on a basic-auth server, else the OS user), the approval lifecycle lives in
`registry.approvals`. Integrity (registry/integrity.py): evidence hashes checked on every read
(`EvidenceTampered`), stage aliases checked against the audit trail (`AliasDrift`). Read side: `registry.state`
(one version read once, who holds a stage), `registry.judging` (`judge`), and for dashboards `registry.read`
(plain dicts and DataFrames), none of which imports the write side.

The names below are loaded on first use, so importing a reader does not load the writer.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "registry.approvals": ("ApprovalRefused", "decline", "approve", "sign_off", "vouch"),
    "registry.connection": ("RegistryError", "RegistryUnavailable", "resolve_tracking_uri"),
    "registry.identity": ("Actor", "IdentityMismatch", "current_actor"),
    "registry.integrity": ("AliasDrift", "EvidenceTampered", "alias_drift"),
    "registry.judging": ("judge", "judge_each"),
    "registry.promotion": ("Move", "PromotionRefused", "promote", "recover", "rollback"),
    "registry.repair": ("RepairRefused", "repair_chain"),
    "registry.state": ("stage_holder",),
    "registry.store": (
        "ALIASES",
        "CANDIDATE_ALIAS",
        "FALLBACK_ALIAS",
        "STAGE_ALIASES",
        "Registry",
        "latest_registration",
        "registration_alias",
    ),
    "registry.tracking": (
        "evidence_integrity",
        "load_evidence",
        "log_record",
        "record_gate_report",
        "register_evidence",
        "register_or_reuse",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module 'registry' has no attribute {name!r}")
    value = getattr(import_module(_HOME_OF[name]), name)
    globals()[name] = value
    return value
