"""`unmask dashboard`: the architects' Streamlit dashboard on the state folder's registry (read-only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from flows.commands import options
from flows.failures import print_error

console = Console()
APP = Path(__file__).resolve().parents[2] / "dashboards" / "app.py"


def streamlit_command(port: int, address: str) -> list[str]:
    """The `streamlit run` command line for the dashboard, headless, usage statistics off."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless",
        "true",
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]


def dashboard_command(
    port: int = typer.Option(8501, "--port", callback=options.port, help="Port to serve on."),
    address: str = typer.Option("127.0.0.1", "--address", help="Address to bind (0.0.0.0 to share on the network)."),
    policy: Path = typer.Option(
        None,
        "--policy",
        help="Stage policy that ranks and marks operating points "
        "(default: $UNMASK_POLICY, else the bundled gates/policy.yaml).",
    ),
) -> None:
    """Serve the gate board, scores, quality-latency curves, candidates and promotions (read-only)."""
    from registry import resolve_tracking_uri

    env = dict(os.environ)
    env["MLFLOW_TRACKING_URI"] = resolve_tracking_uri()  # the state folder's store unless one was set
    if policy is not None:
        if not policy.is_file():
            print_error(console, f"--policy {policy}: file not found")
            raise typer.Exit(2)
        from gates import PolicyError, load_policy

        try:
            load_policy(policy)  # the board would show the error on every page; refuse it here, in one line
        except PolicyError as e:
            print_error(console, f"--policy: {e}")
            raise typer.Exit(2) from None
        env["UNMASK_POLICY"] = str(policy.resolve())
    options.port_free(address, port)  # a busy port is one line here, not streamlit's traceback
    console.print(f"registry: {env['MLFLOW_TRACKING_URI']}\ndashboard: http://{address}:{port}  (Ctrl+C stops it)")
    sys.stdout.flush()
    command = streamlit_command(port, address)
    os.execve(command[0], command, env)  # become the server: one process, one pid to stop


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard_command)
