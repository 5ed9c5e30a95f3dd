"""`nightly`: re-evaluate production, the fallback and the candidates; compare with the last records;
on a production regression, record a finding and (when told to) roll production back to the fallback.

Thinner evidence is never a regression. The night measures at least the evidence level production
needs: every task of its sweep on at least as many items as production was promoted on, and as the
production policy's `min_items` (the sweep is raised to that, written under the state folder). Should
tonight's production evidence still be thinner (a task file with fewer lines, say), or a production
gate inconclusive, the night is `inconclusive`: recorded in the audit trail, nothing rolled back.
It also verifies the audit trail's hash chain, and records a finding when it is broken.

Schedules need a real Prefect server (see docs/flows.md): `nightly_deployment()` is the deployment
with its cron schedule, served by `unmask nightly serve` or listed in prefect.yaml for a worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from checklists import STAGES
from evals.sweep import default_sweep_path, with_items
from flows.evaluate import EvaluationOptions
from flows.review import gate_review
from gates import load_policy
from gates.evaluate import SIGNED_KINDS
from gates.regression import EvidenceLevel, ProductionVerdict
from registry import (
    EvidenceTampered,
    PromotionRefused,
    Registry,
    RegistryError,
    audit_events,
    judge,
    latest_registration,
    load_evidence,
    rollback,
)
from registry.audit import last_settled_move, verify
from registry.connection import resolve_tracking_uri
from registry.integrity import ChainBroken, alias_drift, chain_broken, record_finding
from registry.state import fallback_holder, stage_holder

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

DEFAULT_CRON = "0 2 * * *"  # 02:00 every night, in the schedule's timezone
NIGHTLY_DEPLOYMENT = "nightly"


@task(name="evidence-level", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def evidence_level(tracking_uri: str, policy_path: str | None = None) -> EvidenceLevel:
    """The items per task production was promoted on (its promotion's evidence run) and the policy asks for."""
    floor = max(
        [
            g.params.get("min_items", 1)
            for g in load_policy(policy_path).stage("production").gates
            if g.kind == "data_validity"
        ]
        or [0]
    )
    registry = Registry(tracking_uri)
    move = last_settled_move(registry, "production")
    run_id = (move.evidence.get("evidence_run") if move else None) or ""
    tasks: dict[str, int] = {}
    if run_id:
        try:
            for r in registry.load_json_artifact(run_id, "evidence/records.json")["records"]:
                tasks[r["task"]] = max(tasks.get(r["task"], 0), int(r["n_items"]))
        except (RegistryError, KeyError, TypeError, ValueError):
            pass  # that evidence is gone or unreadable: the policy's floor still holds
    return EvidenceLevel(floor, tasks)


def nightly_sweep(sweep: str, level: EvidenceLevel) -> str:
    """`sweep` with every task raised to the items production needs (`evals.sweep.with_items`)."""
    return with_items(sweep, level.items)


@task(name="watch-list", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def watch_list(tracking_uri: str) -> dict[str, Any]:
    """Who holds production and fallback, every candidate, where each came from, and its last records."""
    registry = Registry(tracking_uri)
    drift = {}  # stage -> what is wrong: reported, and the rollback below will refuse it
    for stage in STAGES:
        if found := alias_drift(registry, stage):
            record_finding(registry, found, "nightly")
            drift[stage] = str(found)
    holders = {"production": stage_holder(registry, "production"), "fallback": fallback_holder(registry)}
    watched: dict[str, str] = {}  # model -> version whose evidence was last judged
    for model, aliases in registry.all_aliases().items():
        version = aliases.get("production") or latest_registration(aliases)
        if version:
            watched[model] = version
    last: dict[str, list[dict[str, Any]]] = {}
    sources: dict[str, str] = {}
    for model, version in watched.items():
        try:
            evidence = load_evidence(registry, model, version)
        except EvidenceTampered as e:  # a finding; tonight's measurement replaces the forged evidence
            record_finding(registry, e, "nightly")
            sources[model], last[model] = model, []
            continue
        sources[model] = str(evidence.card.get("source") or model)
        last[model] = [r.to_dict() for r in evidence.records]
    return {
        "production": list(holders["production"]) if holders["production"] else None,
        "fallback": list(holders["fallback"]) if holders["fallback"] else None,
        "sources": sources,
        "last": last,
        "drift": drift,
    }


@task(name="compare-with-last", cache_policy=NO_CACHE, persist_result=False)
def compare_with_last(
    last: dict[str, list[dict[str, Any]]], outcomes: list[dict[str, Any]], tracking_uri: str
) -> list[dict[str, Any]]:
    """Per model and config: accuracy and p95 now against the records it was last judged on."""
    registry = Registry(tracking_uri)
    rows = []
    for outcome in outcomes:
        if outcome.get("error"):
            rows.append(
                {
                    "model": outcome["candidate"],
                    "task": "",
                    "config": "",
                    "accuracy_before": None,
                    "accuracy_now": None,
                    "p95_before_s": None,
                    "p95_now_s": None,
                    "note": outcome["error"],
                }
            )
            continue
        before = {(r["task"], r["config_hash"]): r for r in last.get(outcome["candidate"], [])}
        for r in load_evidence(registry, outcome["candidate"], outcome["version"]).records:
            old = before.get((r.task, r.config_hash))
            rows.append(
                {
                    "model": r.candidate,
                    "task": r.task,
                    "config": r.config_hash[:8],
                    "accuracy_before": old["accuracy"] if old else None,
                    "accuracy_now": r.accuracy,
                    "p95_before_s": old["latency_p95_s"] if old else None,
                    "p95_now_s": r.latency_p95_s,
                    "note": "" if old else "new point",
                }
            )
    return rows


@task(name="judge-production", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def judge_production(
    tracking_uri: str, policy_path: str | None = None, level: EvidenceLevel | None = None
) -> ProductionVerdict | None:
    """The production holder against the production gates, on its fresh evidence; None when nobody holds it.
    Evidence thinner than `level` makes the verdict inconclusive (see `ProductionVerdict.thinner`)."""
    registry = Registry(tracking_uri)
    holder = stage_holder(registry, "production")
    if holder is None:
        return None
    policy = load_policy(policy_path)
    decision = judge(registry, *holder, "production", policy, record=True)
    thinner = tuple(level.shortfalls(load_evidence(registry, *holder).records)) if level else ()
    signed = tuple(g.name for g in policy.stage("production").gates if g.kind in SIGNED_KINDS)
    return ProductionVerdict(*holder, decision, thinner, signed)


@task(name="record-inconclusive", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def record_inconclusive(verdict: ProductionVerdict, tracking_uri: str) -> dict[str, Any]:
    """Write to the audit trail that tonight could not judge production, and why; nothing is rolled back."""
    audit_events.record_inconclusive(Registry(tracking_uri), verdict)
    return {"rolled_back": False, "inconclusive": audit_events.inconclusive_words(verdict)}


@task(name="verify-audit-chain", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def verify_audit_chain(tracking_uri: str) -> str | None:
    """The audit chain's break in words (recorded once as a finding), or None when it verifies."""
    registry = Registry(tracking_uri)
    broken = chain_broken(registry)
    if broken is None:
        return None
    record_finding(registry, broken, "nightly")
    return str(broken)


@task(name="signed-chain-head", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def signed_chain_head(tracking_uri: str) -> str:
    """The audit chain's signed head after tonight's writes ("" when the chain is broken or unsigned): kept in the
    nightly's report, outside the store, so `unmask audit --verify --anchor` can check the chain against it."""
    report = verify(Registry(tracking_uri))
    return report.anchor if report.ok else ""


@task(name="record-regression", cache_policy=NO_CACHE, persist_result=False, retries=2, retry_delay_seconds=5)
def record_regression(
    verdict: ProductionVerdict, tracking_uri: str, roll_back: bool, policy_path: str | None = None
) -> dict[str, Any]:
    """Write the finding to the audit trail; roll production back (registry.rollback) when asked."""
    registry = Registry(tracking_uri)
    failed = audit_events.regression_words(verdict)
    audit_events.record_regression(registry, verdict)
    if not roll_back:
        return {"rolled_back": False}
    try:
        move = rollback(
            "production",
            who="nightly",
            comment=f"nightly regression: {failed}",
            registry=registry,
            policy=load_policy(policy_path),
        )
    except PromotionRefused as e:
        return {"rolled_back": False, "refused": e.reasons}
    except ChainBroken as e:  # nothing rolls back on a forged trail: its "previous holder" may never have held it
        return {"rolled_back": False, "refused": [str(e)]}
    return {"rolled_back": True, "move": move.to_dict()}


@flow(name="nightly", flow_run_name="nightly re-evaluation")
def nightly(
    sweep: str = str(default_sweep_path()),
    options: EvaluationOptions = EvaluationOptions(),
    rollback_on_regression: bool = True,
) -> dict[str, Any]:
    """Re-evaluate every registered model, compare with its last records, act on a production regression."""
    tracking_uri = resolve_tracking_uri()
    chain = verify_audit_chain(tracking_uri)
    watched = watch_list(tracking_uri)
    models = list(dict.fromkeys(watched["sources"].values()))
    if not models:
        return {"status": "nothing registered yet; run `unmask run` first", "audit_chain": chain}
    level = evidence_level(tracking_uri, options.policy)
    night_sweep = nightly_sweep(sweep, level)
    review = gate_review(models, night_sweep, options)
    comparison = compare_with_last(watched["last"], review["outcomes"], tracking_uri)
    verdict = judge_production(tracking_uri, options.policy, level)
    finding, status = None, "ok"
    if verdict and verdict.regressed:
        finding, status = record_regression(verdict, tracking_uri, rollback_on_regression, options.policy), "regression"
    elif verdict and verdict.undecided:
        finding, status = record_inconclusive(verdict, tracking_uri), "inconclusive"
    anchor = signed_chain_head(tracking_uri)
    publish_nightly(comparison, verdict, finding, watched["drift"], chain, anchor)
    return {
        "status": status,
        "production": verdict.to_dict() if verdict else None,
        "finding": finding,
        "comparison": comparison,
        "scorecard": review["scorecard"],
        "drift": watched["drift"],
        "sweep": night_sweep,
        "evidence_level": {"min_items": level.min_items, "tasks": level.tasks},
        "audit_chain": chain,
        "chain_anchor": anchor,
    }


def publish_nightly(
    comparison: list[dict[str, Any]],
    verdict: ProductionVerdict | None,
    finding: dict[str, Any] | None,
    drift: dict[str, str] | None = None,
    chain: str | None = None,
    anchor: str = "",
) -> None:
    create_table_artifact(comparison, key="nightly-comparison", description="This night's records against the last")
    if verdict is None:
        text = "Nobody holds production; candidates were re-evaluated."
    elif verdict.undecided:
        lines = [
            f"**Inconclusive**: tonight's evidence cannot judge production ({verdict.model} v{verdict.version});"
            " nothing was rolled back.",
            "",
        ]
        lines += [f"- {why}" for why in verdict.thinner]
        lines += [f"- {r.gate}: {r.reason}" for r in verdict.inconclusive]
        text = "\n".join(lines)
    elif not verdict.failed:
        text = f"Production ({verdict.model} v{verdict.version}) still passes its gates."
        if verdict.unsigned:
            text = (
                f"Production ({verdict.model} v{verdict.version}) still passes its measured gates; to sign off "
                "again on tonight's evidence: " + "; ".join(f"{r.gate}: {r.reason}" for r in verdict.unsigned)
            )
    else:
        moved = finding and finding.get("rolled_back")
        lines = [f"**Regression**: production ({verdict.model} v{verdict.version}) fails its gates:", ""]
        lines += [f"- {r.gate}: {r.reason}" for r in verdict.failed]
        outcome = (
            f"{finding['move']['from']} -> {finding['move']['to']}"
            if finding and moved
            else f"no ({(finding or {}).get('refused') or 'rollback off'})"
        )
        lines += ["", f"Production was rolled back: {outcome}"]
        text = "\n".join(lines)
    text += "".join(f"\n\n**Drift**: {message}" for message in (drift or {}).values())
    text += f"\n\n**Audit chain**: {chain}" if chain else "\n\nAudit chain: verified."
    text += f"\n\nSigned chain head: `{anchor}`" if anchor else ""
    create_markdown_artifact(
        f"# Nightly re-evaluation\n\n{text}\n", key="nightly-report", description="Nightly: production regression check"
    )


def nightly_deployment(
    cron: str = DEFAULT_CRON, timezone: str = "UTC", sweep: str | None = None, rollback_on_regression: bool = True
) -> RunnerDeployment:
    """The nightly flow as a deployment with its cron schedule (serve it, or apply it for a worker)."""
    from prefect.schedules import Cron

    # prefect: to_deployment (async_dispatch) is typed "a deployment or a coroutine of one"; sync code gets one
    return nightly.to_deployment(  # type: ignore[return-value]
        name=NIGHTLY_DEPLOYMENT,
        schedule=Cron(cron, timezone=timezone),
        parameters={"sweep": sweep or str(default_sweep_path()), "rollback_on_regression": rollback_on_regression},
        description="Re-evaluate production, fallback and candidates; roll back production on a regression.",
    )
