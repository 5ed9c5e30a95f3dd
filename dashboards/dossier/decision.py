"""What makes the dossier a document to sign: the recommendation, who holds each stage, the signature block, the
EU AI Act Annex IV outline with the model card, the rollouts (failed and aborted ones too) and the change log.

Read from the registry only, like `content.py`; every entry keeps the MLflow or audit run it came from.
"""

from __future__ import annotations

import re
from typing import Any

import registry.read as read
from gates.decision import Decision, Outcome
from gates.policy import Policy
from gates.roles import Roles, RolesError, load_roles
from registry import audit
from registry.decision import decisions
from registry.demo import is_demo_registry
from registry.history import duration_text, stage_history
from registry.rollouts import RolloutRecord, analyses, rollouts
from registry.store import STAGE_ALIASES, Registry

# The EU AI Act's Annex IV points this dossier answers, in the Annex's order (its numbering kept).
ANNEX_IV = (
    ("annex-1", "Annex IV 1. General description of the AI system"),
    ("annex-2", "Annex IV 2. Detailed description of the elements and of the development process"),
    ("annex-3", "Annex IV 3. Monitoring, functioning and control (human oversight)"),
    ("annex-4", "Annex IV 4. Appropriateness of the performance metrics"),
    ("annex-5", "Annex IV 5. Risk management system"),
    ("annex-6", "Annex IV 6. Changes made through the lifecycle"),
    ("annex-9", "Annex IV 9. Post-market monitoring plan"),
)
# The model card's headings (the Hugging Face / Mitchell et al. outline) as this dossier fills them.
MODEL_CARD = (
    "Intended use",
    "Out-of-scope use",
    "Training data",
    "Evaluation data",
    "Metrics and why they fit",
    "Human oversight",
    "Risk management",
    "Post-market monitoring",
    "Change log",
)
FAILED_ROLLOUTS = ("rolled_back", "aborted")


def decision_part(
    registry: Registry, model: str, version: str, policy: Policy, card_md: str, content: dict[str, Any]
) -> dict[str, Any]:
    """The dossier's decision content for one version (merged into `dossier_content`'s dict)."""
    lines = decisions(registry, policy, [model], versions={model: version})
    try:
        roles = load_roles()
    except RolesError:
        roles = None
    held = read.aliases(registry)
    holders = {
        s: (f"{h['model']} v{h['version']}" if isinstance(h := held.get(s), dict) else "nobody") for s in STAGE_ALIASES
    }
    found = rollouts(registry, model)
    return {
        "demo": demo_marks(registry, policy, roles),
        "decision": [_line(d) for d in lines],
        "holders": holders,
        "recommendation": recommendation(lines, found, version),
        "signatures": signatures(lines, roles),
        "rollouts": [_rollout(registry, r) for r in found],
        "model_card": model_card(card_md, content, lines, policy),
        "changes": change_log(registry, model, version, content),
        "chain_head": "",  # the signed audit chain head (helper `trust` fills it); the signature block shows it
    }


def demo_marks(registry: Registry, policy: Policy, roles: Roles | None) -> list[str]:
    """Why this dossier is a demonstration (empty: it is not)."""
    marks = [f"policy {policy.path or policy.source} is marked demo: true"] if policy.demo else []
    if roles is not None and roles.demo:
        marks.append(f"roles {roles.path} are marked demo: true")
    if is_demo_registry(registry):
        marks.append("the registry is marked as a demo")
    return marks


def _line(d: Decision) -> dict[str, Any]:
    """A decision as the template reads it: its figures, outcome and blockers (rendered, never re-derived)."""
    return d.figures.to_dict() | {
        "stage": d.stage,
        "outcome": d.outcome.value,
        "holds": d.holds,
        "blocks": list(d.blocker_texts()),
        "ranked_only": d.ranked_only,
        "p95_text": d.figures.p95_text(),
        "tokens_per_s_text": d.figures.tokens_per_s_text(),
    }


def recommendation(lines: list[Decision], found: list[Any], version: str) -> dict[str, Any]:
    """The production decision's outcome (adopt, blocked, inconclusive) with its blockers; the rollouts of the
    version are cited, never weighed here (the decision already counts a failed one)."""
    production = next((d for d in lines if d.stage == "production"), None)
    deciding = [production] if production else lines
    mine = [r for r in found if r.version == version]
    if production is None:
        why = "production was not judged"
        return {"verdict": Outcome.BLOCKED.value, "why": why, "deciding": [_line(d) for d in deciding]}
    why = "; ".join(production.blocker_texts()) or (
        "it holds production and passes its gates" if production.holds else "everything production needs is in place"
    )
    completed = sorted({r.route for r in mine if r.status == "completed"})
    if completed:
        why += f" (a staged rollout on {', '.join(completed)} completed)"
    passing = [d.stage for d in lines if d.outcome == Outcome.ADOPT and d.stage != "production"]
    if passing and production.outcome != Outcome.ADOPT:
        why += f" (adopt at {', '.join(passing)})"
    return {"verdict": production.outcome.value, "why": why, "deciding": [_line(d) for d in deciding]}


def signatures(lines: list[Decision], roles: Roles | None) -> list[dict[str, Any]]:
    """Per stage: the approvals the roles require (how many, from whom), the ones that count for the decision in
    their slots, and the recorded ones that do not count apart, each with why (the decision's standings)."""
    out = []
    for d in lines:
        rules = roles.stage(d.stage) if roles is not None else None
        count = rules.approvals_count if rules else 1
        counted: list[dict[str, Any] | None] = [a.to_dict() for a in d.approvals if a.counts]
        out.append(
            {
                "stage": d.stage,
                "required": count,
                "who_may": ", ".join(rules.approve) if rules else "approvers",
                "distinct": bool(rules.approvals_distinct) if rules else True,
                "slots": counted + [None] * max(0, count - len(counted)),
                "void": [a.to_dict() for a in d.approvals if not a.counts],
            }
        )
    return out


def _rollout(registry: Registry, r: RolloutRecord) -> dict[str, Any]:
    steps = analyses(registry, r.id)
    return r.to_dict() | {
        "failed": r.status in FAILED_ROLLOUTS,
        "analyses": len(steps),
        "verdicts": [f"step {a.step} at {a.weight}%: {a.verdict}" for a in steps],
    }


def card_sections(card_md: str) -> dict[str, str]:
    """The model card's `## Heading` sections, by lower-cased heading, text without the YAML header."""
    body = re.sub(r"\A---\n.*?\n---\n", "", card_md, flags=re.S)
    sections: dict[str, str] = {}
    for part in re.split(r"^## ", body, flags=re.M)[1:]:
        heading, _, text = part.partition("\n")
        sections[heading.strip().lower()] = text.strip()
    return sections


def _from_card(sections: dict[str, str], *names: str) -> str:
    return next((sections[n] for n in names if n in sections), "")


def model_card(card_md: str, content: dict[str, Any], lines: list[Decision], policy: Policy) -> dict[str, Any]:
    """The model card's headings (MODEL_CARD), each from the card's own text where it has one, else from the
    registry; "" means neither says (named as a limitation by the template)."""
    sections = card_sections(card_md)
    catalog = content["identity"].get("catalog") or {}
    records = content["evaluation"]["records"]
    tasks = sorted({(r["task"], r["split"], r["n_items"], r["dataset_hash"]) for r in records})
    gate_kinds = {g.kind for s in policy.stages.values() for g in s.gates}
    return {
        "Intended use": _from_card(sections, "intended use", "uses") or (f"{catalog.get('notes', '')}".strip() or ""),
        "Out-of-scope use": _from_card(sections, "out-of-scope use", "out of scope", "limitations") or "",
        "Training data": _from_card(sections, "training data"),
        "Evaluation data": "; ".join(f"{t} ({split}, {n} items, dataset sha256 {h[:12]})" for t, split, n, h in tasks),
        "Metrics and why they fit": (
            "accuracy with a 95% Wilson interval (the answer is right or wrong; the interval says how far the "
            "items measured can be trusted); p95 latency and text tokens/s against the AR fallback at the same "
            "concurrency (what a user waits for, against what production would serve otherwise); peak memory; "
            "tokens per forward and NFE (the diffusion model's parallelism, which decides its cost)"
            + ("; serving p95 and error rate under N users in flight" if "serving" in gate_kinds else "")
            + ("; canary analyses on live traffic" if "canary" in gate_kinds else "")
        ),
        "Human oversight": (
            "every alias move needs the stage's gates, a complete checklist and the approvals the roles file "
            "requires (four eyes past poc; signatures below); on-call may roll back at once, audited; "
            "`unmask audit --verify` proves the trail untouched"
        ),
        "Risk management": "; ".join(f"{x['kind']}: {x['text']}" for x in content["limitations"][:12])
        or "no open risk recorded",
        "Post-market monitoring": (
            "the nightly re-evaluation (`unmask nightly run`) re-judges production and records regressions; "
            "staged rollouts judge each step on the live request log (canary analysis) and roll back on a fail"
        ),
        "lines": [_line(d) for d in lines],
    }


def change_log(registry: Registry, model: str, version: str, content: dict[str, Any]) -> dict[str, Any]:
    """This version against the previous one of the model: what changed, and the audit chain's entries since."""
    versions = registry.versions(model)
    earlier = [v for v in versions if int(v) < int(version)]
    previous = earlier[-1] if earlier else ""
    events = [e for e in audit.events(registry, model=model) if e.version in (version, previous)]
    changes = []
    if previous:
        before, after = registry.version_tags(model, previous), registry.version_tags(model, version)
        for key in sorted(set(before) | set(after)):
            if key.endswith(("weights_sha256", "revision", "evaluated_at", "evidence_run")) and before.get(
                key
            ) != after.get(key):
                changes.append(
                    {"what": key.rsplit(".", 1)[-1], "before": before.get(key, "-"), "after": after.get(key, "-")}
                )
    held = stage_history(registry, model)
    return {
        "previous": previous,
        "changes": changes,
        # the stages this version held and when (`unmask history`): the same tenures the Promotions page draws
        "held": [t.to_dict() | {"held": duration_text(t.held_s())} for t in held.tenures if t.version == version],
        "held_problem": held.problem,
        "events": [
            {
                "when": e.when[:19],
                "event": e.event,
                "who": e.who,
                "stage": e.stage,
                "version": e.version,
                "comment": e.comment[:200],
                "seq": e.seq,
                "audit_run_id": e.run_id,
            }
            for e in events
        ],
    }
