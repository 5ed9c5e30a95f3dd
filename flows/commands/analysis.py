"""`unmask analysis serve`: the canary analysis endpoint alone (serving/analysis_api.py), for a fleet whose own
controller (Argo Rollouts, Flagger, KServe) shifts the traffic and asks unmask for the verdict."""

from __future__ import annotations

from pathlib import Path

import typer

analysis_app = typer.Typer(
    help="The canary analysis for outside controllers (Argo Rollouts, Flagger).", no_args_is_help=True
)


@analysis_app.command("serve")
def serve_command(
    routes: Path = typer.Option(
        ...,
        "--routes",
        exists=True,
        dir_okay=False,
        help="Serving policy whose `rollout:` key holds the analysis (and the routes' splits).",
    ),
    log_dir: Path = typer.Option(
        None,
        "--log-dir",
        help="The server's request log (default: <state>/serving/requests, where `unmask serve` writes it); "
        "with $UNMASK_EVIDENCE_URL set, the evidence is read from that PostgreSQL instead.",
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8010, "--port", min=1, max=65535),
    api_key_file: Path = typer.Option(
        None,
        "--api-key-file",
        dir_okay=False,
        help="API keys (one a line) any of which the analysis accepts, as `unmask serve` takes them; "
        "$UNMASK_API_KEYS adds more, $UNMASK_ANALYSIS_KEYS holds the controllers' own (analysis only).",
    ),
) -> None:
    """Answer GET /v1/unmask/analysis, POST /v1/unmask/analysis/flagger and .../flagger/rollback (docs/rollout.md)."""
    import uvicorn

    from flows.commands.serve import checked_evidence
    from gates.rollout_policy import RolloutPolicyError, load_rollout_policy
    from serving import ApiKeyError, load_analysis_keys, load_api_keys
    from serving.analysis_api import standalone_app

    try:
        load_rollout_policy(routes)  # refuse a bad policy now, not on the first controller's call
        keys, analysis_keys = load_api_keys(api_key_file), load_analysis_keys()
    except (RolloutPolicyError, ApiKeyError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    evidence_url = checked_evidence()  # unreachable or malformed: one line naming host, port, database
    app = standalone_app(routes, log_dir, keys, analysis_keys, evidence_url=evidence_url)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)


def register(app: typer.Typer) -> None:
    app.add_typer(analysis_app, name="analysis")
