"""Stage policies, gate evaluation, multi-criteria scoring and promotion rules; pure functions, no I/O but reading
policy YAML."""

from checklists import STAGES
from gates.decision import Decision, Outcome, decide
from gates.evaluate import all_passed, evaluate_gates, gate_report_markdown
from gates.policy import MetricThreshold, Policy, PolicyError, load_policy, parse_policy
from gates.promotion import Approval, PromotionReason, ReasonKind
from gates.results import GateResult, operating_records
from gates.roles import Roles, RolesError, load_roles, parse_roles

__all__ = [
    "STAGES",
    "Approval",
    "GateResult",
    "MetricThreshold",
    "Policy",
    "PolicyError",
    "Decision",
    "Outcome",
    "PromotionReason",
    "ReasonKind",
    "all_passed",
    "decide",
    "evaluate_gates",
    "gate_report_markdown",
    "load_policy",
    "load_roles",
    "operating_records",
    "parse_policy",
    "parse_roles",
    "Roles",
    "RolesError",
]
