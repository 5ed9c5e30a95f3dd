"""`unmask gates MODEL [--stage STAGE]`: the decision on a registered version at each stage, with its gate table;
the exit code is the decision (`EXIT_CODES`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from checklists import STAGES, ChecklistError, load_checklist
from flows.commands.banner import print_demo_banner
from flows.commands.outcomes import outcome_markup
from flows.commands.table import Column, FittedTable, table_console
from flows.failures import print_error
from gates.decision import Decision, Outcome
from gates.readable import gate_threshold, gate_value
from gates.stages import next_stage_for

if TYPE_CHECKING:
    from gates.policy import Policy, StagePolicy
    from gates.results import GateResult
    from registry.store import Registry

console = table_console(160)
EXIT_CODES = {Outcome.ADOPT: 0, Outcome.BLOCKED: 1, Outcome.INCONCLUSIVE: 3}  # 2: the command itself was wrong
VERDICT_WORDS = {"pass": "[green]yes[/green]", "fail": "[red]no[/red]", "inconclusive": "[yellow]inconclusive[/yellow]"}


def gates_command(
    model: str = typer.Argument(..., help="Registered model (catalog id), e.g. tiny-llada."),
    stage: str = typer.Option(None, "--stage", "-s", help="poc, staging or production (default: all three)."),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
    policy_path: str = typer.Option(None, "--policy", help="Policy YAML (default: the bundled gates/policy.yaml)."),
    stored: bool = typer.Option(
        False,
        "--stored",
        help="Show the gate reports last stored, without re-judging "
        "(each checked against the sha256 recorded with it).",
    ),
    store: bool = typer.Option(
        False,
        "--store",
        help="Record the verdicts in MLflow, replacing the stored ones "
        "the dashboard and the dossier show (default: only print).",
    ),
) -> None:
    """Decide MODEL at each stage afresh on its stored evidence and print the decision with its gates; --store
    records the gate reports for the dashboard. Exit 0 only when the decision (at --stage, else at the next stage
    the version does not hold) is adopt; 1 when blocked, 3 when inconclusive, 2 when the command is wrong."""
    from gates import PolicyError, ReasonKind, load_policy
    from gates.promotion import require_checklists_match
    from registry import Registry, RegistryError, judge, latest_registration
    from registry.integrity import alias_drift

    if stage and stage not in STAGES:
        print_error(console, f"--stage must be one of {', '.join(STAGES)}, got {stage!r}")
        raise typer.Exit(2)
    try:
        policy = load_policy(policy_path)
        for name in [stage] if stage else STAGES:  # a broken checklist is refused before the store is opened
            load_checklist(name)
        require_checklists_match(policy, [stage] if stage else STAGES)
        reg = Registry()
        held = reg.aliases_of(model)
        version = version or latest_registration(held)
        if not version:
            raise RegistryError(f"{model} has no `candidate` or `fallback` version; register its evidence first")
        print_demo_banner(console, policy, reg)
        if stored:
            _show_stored(reg, model, version, [stage] if stage else list(STAGES), policy)
            return
        upcoming = next_stage_for(held, version) or STAGES[-1]
        deciding = None
        for name in [stage] if stage else STAGES:
            if drift := alias_drift(reg, name):
                console.print(f"[yellow]warning:[/yellow] {drift}", highlight=False)
            decision = judge(reg, model, version, name, policy, record=store)
            console.print(_table(decision, policy.stage(name)))
            if decision.evidence.get("evidence_status") == "unverified":
                console.print(
                    "  [yellow]-[/yellow] evidence unverified: registered before evidence hashes were "
                    "recorded (re-evaluate to record them)",
                    highlight=False,
                )
            for r in decision.gate_results:  # the table's row says why; this says what would settle it
                if r.inconclusive:
                    console.print(f"  [yellow]inconclusive[/yellow] {r.gate}: {escape(r.settle)}", highlight=False)
            for reason in decision.blockers:
                if reason.kind not in (ReasonKind.GATE, ReasonKind.INCONCLUSIVE):  # gates are the table's rows
                    console.print(f"  [yellow]-[/yellow] {escape(reason.text)}", highlight=False)
            console.print(f"  decision: {_headline(decision)}", highlight=False)
            if name == (stage or upcoming):  # the steps of the promotion asked about, or else of the next one
                deciding = decision
                for n, step in enumerate(decision.steps):  # the reasons above say why; these say what to run
                    console.print(
                        f"  {'then' if n else 'next'}: {step.command}", highlight=False, markup=False, soft_wrap=True
                    )
            console.print()
        if not store:
            console.print(
                f"judged afresh, recorded nowhere (the stored verdicts stand; `unmask gates {model} "
                "--store` records these)",
                style="dim",
                highlight=False,
                markup=False,
            )
    except (PolicyError, ChecklistError, RegistryError) as e:
        print_error(console, f"{e}")
        raise typer.Exit(2) from None
    if deciding is not None and deciding.outcome != Outcome.ADOPT:  # the exit code is the decision: 0 only to adopt
        raise typer.Exit(EXIT_CODES[deciding.outcome])


def _show_stored(reg: Registry, model: str, version: str, stages: list[str], policy: Policy) -> None:
    """The stored gate reports as they are (a forged one is refused, and recorded as a finding)."""
    from gates.results import GateResult
    from gates.roles import load_roles
    from registry.integrity import GateReportTampered, record_finding
    from registry.tracking import gate_report_signer, load_gate_report

    roles = load_roles()

    for name in stages:
        try:
            report = load_gate_report(reg, model, version, name)
        except GateReportTampered as e:
            record_finding(reg, e)
            raise
        if report is None:
            console.print(
                f"{model} v{version}: no stored {name} gate report (judge it: unmask gates {model} "
                f"--version {version} --stage {name})\n",
                highlight=False,
            )
            continue
        results = [GateResult.from_dict(r) for r in report.get("results", [])]
        passed = sum(r.passed for r in results)
        console.print(
            _gate_table(
                f"{model} v{version}: {name} gates as stored {report['evaluated_at']} ({passed}/{len(results)} "
                "passed; the stored gates, not the decision)",
                results,
                policy.stage(name),
            )
        )
        if report["integrity"] == "unverified":
            console.print(
                "  [yellow]-[/yellow] gate report unverified: written before gate reports were hashed "
                "(re-judge to hash it)",
                highlight=False,
            )
        word = "[green]passed[/green]" if report.get("passed") else "[red]did not pass[/red]"
        console.print(f"  {model} v{version} -> {name}: the gates {word} when judged", highlight=False)
        signer = gate_report_signer(report, reg.version_tags(model, version), name, roles)
        console.print(f"  {escape(signer)}", highlight=False)
        if report.get("decision"):  # the decision stored with them (hashed alike), as it was then
            try:
                console.print(f"  decision when judged: {_headline(Decision.from_dict(report['decision']))}")
            except (ValueError, KeyError, TypeError) as e:
                console.print(f"  [yellow]-[/yellow] the stored decision cannot be read: {escape(str(e))}")
        console.print()


def _headline(decision: Decision) -> str:
    return outcome_markup(decision.outcome, escape(decision.headline()))


def _table(decision: Decision, stage_policy: StagePolicy) -> FittedTable:
    """The gate table of a decision, titled with the decision itself (gates passing is not the decision)."""
    results = decision.gate_results
    passed = sum(r.passed for r in results)
    undecided = sum(r.inconclusive for r in results)
    more = f", {undecided} inconclusive" if undecided else ""
    return _gate_table(
        f"{decision.model} v{decision.version} -> {decision.stage}: {decision.outcome.value} "
        f"({passed}/{len(results)} gates passed{more})",
        results,
        stage_policy,
    )


def _gate_table(title: str, results: Sequence[GateResult], stage_policy: StagePolicy) -> FittedTable:
    table = FittedTable(
        title,
        [
            Column("gate"),
            Column("passed"),
            Column("measured", wrap=True),
            Column("required", wrap=True),
            Column("why", wrap=True, drop=1),
            Column("record", drop=2),
        ],
    )
    specs = {g.name: g for g in stage_policy.gates}
    for r in results:
        spec = specs.get(r.gate)
        table.add_row(
            r.gate,
            VERDICT_WORDS[r.verdict],
            gate_value(getattr(spec, "kind", None), r.value),
            gate_threshold(spec, r.threshold),
            r.reason,
            str(r.evidence.get("record_id") or ""),
        )
    return table


def register(app: typer.Typer) -> None:
    app.command("gates")(gates_command)
