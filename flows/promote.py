"""`promote`: check the gates, wait for an architect's typed approval, then move the alias in the registry.

The flow pauses with `pause_flow_run(wait_for_input=PromotionApproval)`; the approval comes from the
Prefect UI's form or from `unmask approve MODEL STAGE` (which resumes the paused run with the same
input). Nothing moves without it: `registry.promote` checks gates, checklist and approvals again. An
approval counts only once recorded in the registry under the approver's identity (`unmask approve` does
that, then resumes the run with the approval's id); a name typed into the UI form carries no identity,
so the flow refuses it and nothing moves.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from pydantic import Field

from flows.dossier import attach_to_move, dossier_for_approval
from flows.evaluate import slug
from flows.waiting import mark_waiting
from gates import load_policy
from gates.promotion import SETTLED_BY_AN_APPROVER
from registry import CANDIDATE_ALIAS, Registry, judge
from registry.approvals import approval_of
from registry.connection import resolve_tracking_uri
from registry.promotion import promote

PROMOTE_FLOW = "promote"


class PromotionApproval(RunInput):
    """An architect's decision on a promotion waiting in the `promote` flow."""

    approver: str = Field(description="Who approves (recorded in the registry and the audit trail).")
    comment: str = Field(description="Why: the policy sets a minimum length per stage.")
    approve: bool = Field(True, description="Untick to decline; the promotion then ends without a move.")
    approval_id: str = Field("", description="The approval `unmask approve` recorded (leave empty in the UI).")


class ApprovalTimeout(RuntimeError):
    """Nobody answered the promotion in time; nothing moved."""


class PromotionBlocked(RuntimeError):
    """Gates or checklist fail: the promotion does not even wait for an approval."""


class ApprovalUnverified(RuntimeError):
    """An approval typed into the Prefect form: no identity stands behind the name, so nothing moves."""


@task(name="check-promotion", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=2)
def check_promotion(
    model_id: str, stage: str, version: str | None, tracking_uri: str, policy_path: str | None = None
) -> dict[str, Any]:
    """Judge the version against the stage (gates, checklist, stage order); approval is what remains."""
    registry = Registry(tracking_uri)
    version = version or registry.aliases_of(model_id).get(CANDIDATE_ALIAS)
    if not version:
        raise PromotionBlocked(f"{model_id} has no `candidate` version; evaluate it first (unmask run)")
    policy = load_policy(policy_path)
    decision = judge(registry, model_id, version, stage, policy, record=True)
    approval = approval_of(registry, model_id, version, stage)
    approval_counts = not any(r.kind in SETTLED_BY_AN_APPROVER for r in decision.reasons)
    return {
        "version": version,
        "blocking": [r.text for r in decision.reasons if r.blocking],
        "approved_by": approval.by if approval and approval_counts else None,
        "min_comment_chars": policy.stage(stage).approval_min_comment_chars,
    }


@task(name="move-alias", cache_policy=NO_CACHE, persist_result=False)
def move_alias(
    model_id: str, stage: str, version: str, comment: str, tracking_uri: str, policy_path: str | None = None
) -> dict[str, Any]:
    """registry.promote: judges again (the recorded approvals) under the stage lock, moves the alias."""
    move = promote(
        model_id,
        stage,
        comment=comment,
        version=version,
        registry=Registry(tracking_uri),
        policy=load_policy(policy_path),
    )
    return move.to_dict()


@task(name="prepare-dossier", cache_policy=NO_CACHE, persist_result=False)
def prepare_dossier(model_id: str, stage: str, version: str, tracking_uri: str) -> dict[str, Any]:
    """The adoption dossier the approver is shown, built and logged on the version (flows/dossier.py)."""
    dossier = dossier_for_approval(model_id, version, stage, tracking_uri)
    if "error" in dossier:
        get_run_logger().warning("no dossier for %s v%s: %s", model_id, version, dossier["error"])
    return dossier


@task(name="attach-dossier", cache_policy=NO_CACHE, persist_result=False)
def attach_dossier(move: dict[str, Any], dossier: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """Archive that dossier with the decision: copied into the move's audit run."""
    return attach_to_move(move["audit_run_id"], dossier, tracking_uri)


@flow(name=PROMOTE_FLOW, flow_run_name="promote {model_id} to {stage}")
def promote_flow(
    model_id: str,
    stage: str,
    version: str | None = None,
    timeout_s: int = 24 * 3600,
    poll_interval_s: int = 5,
    policy: str | None = None,
) -> dict[str, Any]:
    """Gates check, then wait (up to `timeout_s`) for a typed approval, then the registry moves the alias."""
    tracking_uri = resolve_tracking_uri()
    check = check_promotion(model_id, stage, version, tracking_uri, policy)
    if check["blocking"]:
        raise PromotionBlocked(
            f"promotion of {model_id} v{check['version']} to {stage} is blocked:\n"
            + "\n".join(f"  - {r}" for r in check["blocking"])
        )
    dossier = prepare_dossier(model_id, stage, check["version"], tracking_uri)
    if check["approved_by"]:
        get_run_logger().info("approval already recorded by %s; not waiting", check["approved_by"])
        move = move_alias(model_id, stage, check["version"], "", tracking_uri, policy)
        return {"status": "promoted", "move": move, "dossier": attach_dossier(move, dossier, tracking_uri)}
    create_markdown_artifact(
        f"# {model_id} v{check['version']} to {stage}: waiting for approval\n\nGates and checklist are green. "
        f"An approver (not you, for staging and production) runs\n\n`unmask approve {model_id} {stage} "
        f'--comment "at least {check["min_comment_chars"]} characters"`\n\nA name typed into this run\'s form '
        "carries no identity and does not count.\n"
        + (f"\nAdoption dossier: {dossier['location']}\n" if "location" in dossier else ""),
        key=f"promotion-{slug(model_id)}-{stage}",
        description="A promotion waiting for its approval",
    )
    try:
        mark_waiting(tracking_uri, model_id, check["version"], stage, str(flow_run.id))
        try:
            decision = pause_flow_run(
                wait_for_input=PromotionApproval.with_initial_data(
                    description=f"Approve promoting {model_id} v{check['version']} to {stage}?", approve=True
                ),
                timeout=timeout_s,
                poll_interval=poll_interval_s,
                key=f"approval-{stage}",
            )
        finally:
            mark_waiting(tracking_uri, model_id, check["version"], stage, "")
    except Exception as e:  # Prefect fails the run with its own words ("never resumed"); leave ours beside it
        message = f"no approval for {model_id} v{check['version']} to {stage} within {timeout_s} s; nothing moved"
        create_markdown_artifact(
            f"# {model_id} v{check['version']} to {stage}: {message}\n",
            key=f"promotion-{slug(model_id)}-{stage}",
            description="A promotion that timed out",
        )
        raise ApprovalTimeout(f"{message} ({type(e).__name__})") from None
    if not decision.approve:
        return {"status": "declined", "by": decision.approver, "comment": decision.comment}
    if not decision.approval_id:
        raise ApprovalUnverified(
            f"the approval typed into the form by {decision.approver!r} carries no identity; "
            f"approve with `unmask approve {model_id} {stage} --comment ...`; nothing moved"
        )
    move = move_alias(model_id, stage, check["version"], decision.comment, tracking_uri, policy)
    return {"status": "promoted", "move": move, "dossier": attach_dossier(move, dossier, tracking_uri)}


def waiting_promotions(model_id: str | None = None, stage: str | None = None) -> list[Any]:
    """Paused `promote` flow runs, optionally for one model and stage, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[PROMOTE_FLOW])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))
            ),
        )
    runs = [
        r
        for r in runs
        if (model_id is None or r.parameters.get("model_id") == model_id)
        and (stage is None or r.parameters.get("stage") == stage)
    ]
    return sorted(runs, key=lambda r: r.start_time or r.created)


def resume_with_approval(flow_run_id: Any, approval: PromotionApproval) -> None:
    """Answer a paused promotion with the same typed input its form would send."""
    from prefect.flow_runs import resume_flow_run

    resume_flow_run(flow_run_id, run_input=approval.model_dump())
