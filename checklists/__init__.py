"""Governance checklists per stage (YAML data), their loader, validator and completion check."""

from checklists.checklist import (
    Checklist,
    ChecklistError,
    ChecklistItem,
    ChecklistStatus,
    ItemStatus,
    checklist_status,
    load_checklist,
    parse_checklist,
)

__all__ = ["Checklist", "ChecklistError", "ChecklistItem", "ChecklistStatus", "ItemStatus", "checklist_status",
           "load_checklist", "parse_checklist"]
