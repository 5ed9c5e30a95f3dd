"""`unmask rollout start|resume|abort|status`: a canary rollout of a route's traffic, step by step (docs/rollout.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from flows.commands import options
from flows.commands.table import Column, FittedTable, table_console

console = table_console(200)
rollout_app = typer.Typer(
    help="Move a route's traffic to a candidate in steps, judged live; roll back on a breach.", no_args_is_help=True
)


def _refused(e: Exception) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2) from None


def _drive(rollout_id: str, flush_grace_s: float) -> None:
    from flows.rollout import rollout_flow

    outcome = rollout_flow(rollout_id, flush_grace_s=flush_grace_s)
    typer.echo(outcome["message"])
    if outcome["status"] not in ("completed", "paused", "aborting", "aborted"):  # rolled back, or driven elsewhere
        raise typer.Exit(1)


@rollout_app.command("start")
def start_command(
    model: str = typer.Argument(..., help="Registered model whose `staging` version is rolled out, e.g. tiny-llada."),
    route: str = typer.Option(..., "--route", help="The route (of --routes) whose traffic moves."),
    to: str = typer.Option("production", "--to", help="The stage the version takes once every step passed."),
    routes: Path = typer.Option(
        Path(__file__).resolve().parents[2] / "gates" / "serving.yaml",
        "--routes",
        help="Serving policy with the routes and the `rollout:` steps and analysis.",
    ),
    policy_path: str = typer.Option(None, "--policy", help="Stage policy the promotion applies (default: bundled)."),
    flush_grace_s: float = typer.Option(
        2.5, "--flush-grace", min=0, help="Seconds to let the request log catch up after each interval."
    ),
    server: str = typer.Option(
        "http://127.0.0.1:8000",
        "--server",
        help="The live `unmask serve` that serves the "
        "route: checked to serve both arms before any traffic moves; probes go there.",
    ),
) -> None:
    """Start a rollout (refused unless the version passes the stage's gates and approvals, the canary aside) and
    drive it: it ends completed, rolled back, or paused for `resume` / `abort`."""
    from checklists import STAGES
    from flows.rollout import RolloutRefused, plan_rollout
    from gates import PolicyError, load_policy
    from gates.rollout_policy import RolloutPolicyError, load_rollout_policy
    from gates.serving_policy import ServingPolicyError, load_serving_policy
    from registry import RegistryError

    try:
        if to not in STAGES:
            raise RolloutRefused(f"rollout to {to!r}", [f"--to: expected one of {', '.join(STAGES)}, got {to!r}"])
        load_policy(policy_path)  # every file the rollout reads, refused before the store is opened
        load_serving_policy(routes)
        load_rollout_policy(routes)
        state = plan_rollout(model, route, to, routes, policy_path, server_url=server)
    except (RolloutRefused, PolicyError, RolloutPolicyError, ServingPolicyError, RegistryError) as e:
        _refused(e)
    typer.echo(
        f"rollout {state.id}: {state.model} v{state.version} ({state.candidate}) against {state.baseline} on "
        f"route {route}, steps {state.steps}"
    )
    _drive(state.id, flush_grace_s)


@rollout_app.command("resume")
def resume_command(
    rollout_id: str = typer.Argument(..., help="The rollout's id (`unmask rollout status`).", callback=options.token),
    flush_grace_s: float = typer.Option(2.5, "--flush-grace", min=0, help="As for start."),
) -> None:
    """Continue a paused rollout, or one whose controller stopped, at its recorded step."""
    from flows.rollout import RolloutRefused, prepare_resume
    from flows.rollout_state import RolloutNotFound

    try:
        state = prepare_resume(rollout_id)
    except (RolloutRefused, RolloutNotFound) as e:
        _refused(e)
    if state.status == "completed":
        typer.echo(f"rollout {rollout_id} completed: {state.reason}")
        return
    _drive(rollout_id, flush_grace_s)


@rollout_app.command("abort")
def abort_command(
    rollout_id: str = typer.Argument(..., help="The rollout's id.", callback=options.token),
    comment: str = typer.Option("", "--comment", help="Why (recorded in the audit trail)."),
) -> None:
    """Roll a running or paused rollout back: the candidate's weight to 0, audited by you."""
    from flows.rollout import RolloutRefused, abort_rollout
    from flows.rollout_state import RolloutNotFound

    try:
        result = abort_rollout(rollout_id, comment)
    except (RolloutRefused, RolloutNotFound) as e:
        _refused(e)
    holder = "@".join(result["stage_holder"]) if result["stage_holder"] else "nobody"
    typer.echo(
        f"rollout {rollout_id} aborted: the candidate gets no traffic; the stage stays with {holder} "
        f"(audit run {result['audit_run_id']})"
    )


@rollout_app.command("status")
def status_command(
    rollout_id: str = typer.Argument(None, help="One rollout (default: all).", callback=options.token),
) -> None:
    """The rollouts, their step, weight, status and last analysis."""
    from flows.rollout_state import RolloutNotFound, all_states, load_state

    try:
        states = [load_state(rollout_id)] if rollout_id else all_states()
    except RolloutNotFound as e:
        _refused(e)
    table = FittedTable(
        "Rollouts",
        [
            Column("id"),
            Column("model"),
            Column("route"),
            Column("arms", drop=3),
            Column("step"),
            Column("weight"),
            Column("status"),
            Column("failures", drop=2),
            Column("last analysis", wrap=True, drop=1),
        ],
    )
    for s in states:
        last = s.analyses[-1] if s.analyses else None
        table.add_row(
            s.id,
            f"{s.model} v{s.version}",
            s.route,
            f"{s.candidate} / {s.baseline}",
            f"{s.step_index + 1}/{len(s.steps)}",
            f"{s.live_weight}%" + (f" (was {s.weight}%)" if s.live_weight != s.weight and s.weight else ""),
            s.status,
            str(s.failures),
            f"{last['verdict']}: {last['reason']}" if last else (s.reason or "-"),
        )
    console.print(table)
    if not states:
        console.print("no rollouts yet: unmask rollout start MODEL --route ROUTE --to production")


def register(app: typer.Typer) -> None:
    app.add_typer(rollout_app, name="rollout")
