"""`unmask report MODEL [--version V] [--stage S] --out DIR`: the adoption dossier of a version (HTML + PDF),
built from the registry only and logged as artifacts of the version's evidence run."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from checklists import STAGES
from flows.commands import options
from flows.failures import print_error

console = Console()


def report_command(
    model: str = typer.Argument(..., help="Registered model, e.g. tiny-llada."),
    out: Path = typer.Option(
        ..., "--out", callback=options.output_folder, help="Folder to write the HTML and PDF into (created if missing)."
    ),
    version: str = typer.Option(None, "--version", help="Model version (default: its `candidate` version)."),
    stage: str = typer.Option(None, "--stage", "-s", help="Only this stage's gates and checklist (default: all)."),
    pdf: bool = typer.Option(True, "--pdf/--no-pdf", help="Print the PDF with headless Chromium (default: yes)."),
) -> None:
    """Write MODEL's adoption dossier for a review board: identity, evaluation, gates, checklists, decisions, risks."""
    from flows.dossier import DossierFailed, report
    from registry import RegistryError
    from registry.dossiers import dossier_location

    if stage and stage not in STAGES:
        print_error(console, f"--stage must be one of {', '.join(STAGES)}, got {stage!r}")
        raise typer.Exit(2)
    if out.exists() and not out.is_dir():
        print_error(console, f"--out {out}: exists and is not a folder")
        raise typer.Exit(2)
    try:
        built, ref = report(model, out, version, stage, pdf=pdf)
    except (DossierFailed, RegistryError) as e:
        print_error(console, e)
        raise typer.Exit(2) from None
    from registry import Registry

    reg = Registry()
    console.print(
        f"dossier of {model} v{built['version']}: {built['html']}"
        + (f"\n  pdf: {built['pdf']}" if built["pdf"] else "")
        + f"\n  sha256 {built['sha256']}\n  logged on evidence run {ref.run_id}: "
        f"{dossier_location(reg, ref)}",
        highlight=False,
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
