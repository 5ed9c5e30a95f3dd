"""Governance checklists per stage (YAML data), their loader, validator and completion check."""

from checklists.checklist import (
    STAGES,
    Checklist,
    ChecklistError,
    ChecklistItem,
    ChecklistStatus,
    ItemStatus,
    checklist_status,
    load_checklist,
    parse_checklist,
)

__all__ = [
    "STAGES",
    "Checklist",
    "ChecklistError",
    "ChecklistItem",
    "ChecklistStatus",
    "ItemStatus",
    "checklist_status",
    "load_checklist",
    "parse_checklist",
]
