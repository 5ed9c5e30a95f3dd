"""`unmask gates MODEL [--stage STAGE]`: judge a registered version against each stage and print the gate table."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from checklists import STAGES

console = Console()


def gates_command(
    model: str = typer.Argument(..., help="Registered model (catalog id), e.g. tiny-llada."),
    stage: str = typer.Option(None, "--stage", "-s", help="poc, staging or production (default: all three)."),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
    policy_path: str = typer.Option(None, "--policy", help="Policy YAML (default: the bundled gates/policy.yaml)."),
) -> None:
    """Evaluate MODEL's gates on its stored evidence; the results are kept in MLflow for the dashboard."""
    from gates import PolicyError, ReasonKind, load_policy
    from registry import Registry, RegistryError, judge, latest_registration
    from registry.integrity import alias_drift

    if stage and stage not in STAGES:
        console.print(f"[red]error:[/red] --stage must be one of {', '.join(STAGES)}, got {stage!r}")
        raise typer.Exit(2)
    try:
        policy = load_policy(policy_path)
        reg = Registry()
        held = reg.aliases_of(model)
        version = version or latest_registration(held)
        if not version:
            raise RegistryError(f"{model} has no `candidate` or `fallback` version; register its evidence first")
        for name in [stage] if stage else STAGES:
            if drift := alias_drift(reg, name):
                console.print(f"[yellow]warning:[/yellow] {drift}", highlight=False)
            decision = judge(reg, model, version, name, policy)
            console.print(_table(model, version, name, decision))
            if decision.evidence.get("evidence_status") == "unverified":
                console.print("  [yellow]-[/yellow] evidence unverified: registered before evidence hashes were "
                              "recorded (re-evaluate to record them)", highlight=False)
            for reason in decision.reasons:
                if reason.kind is not ReasonKind.GATE:  # failed gates are the table's rows already
                    console.print(f"  [yellow]-[/yellow] {reason.text}", markup=True, highlight=False)
            verdict = "[green]may be promoted[/green]" if decision.allowed else "[red]not promotable yet[/red]"
            console.print(f"  {model} v{version} -> {name}: {verdict}\n")
    except (PolicyError, RegistryError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _table(model: str, version: str, stage: str, decision) -> Table:
    passed = sum(r.passed for r in decision.gate_results)
    table = Table(title=f"{model} v{version}: {stage} gates ({passed}/{len(decision.gate_results)} passed)")
    for column in ("gate", "passed", "value", "threshold", "reason", "record"):
        table.add_column(column, overflow="fold")
    for r in decision.gate_results:
        table.add_row(r.gate, "[green]yes[/green]" if r.passed else "[red]no[/red]", str(r.value), str(r.threshold),
                      r.reason, str(r.evidence.get("record_id") or ""))
    return table


def register(app: typer.Typer) -> None:
    app.command("gates")(gates_command)
