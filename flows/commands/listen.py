"""`unmask listen`: receive an MLflow tracking server's registry webhooks and act on them (flows/receiver.py).

    export UNMASK_LISTEN_SECRET=...            # the HMAC secret MLflow signs each delivery with
    unmask listen --subscribe http://HOST:8790/mlflow
                                               # subscribe the server (MLFLOW_TRACKING_URI) and listen on 8790

A new version made outside unmask starts its evaluation; a stage alias set outside unmask opens a finding.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import typer
from rich.console import Console

from flows.commands import options

console = Console(soft_wrap=True, highlight=False)
SECRET_ENV = "UNMASK_LISTEN_SECRET"


def listen_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8790, "--port", min=1, max=65535, help="Port to listen on."),
    secret_env: str = typer.Option(
        SECRET_ENV, "--secret-env", help="The variable holding the webhook's HMAC secret (required)."
    ),
    subscribe: str = typer.Option(
        None,
        "--subscribe",
        help="First make the tracking server post its registry changes to this URL (this receiver's /mlflow, "
        "as the server reaches it).",
    ),
    sweep: Path = typer.Option(
        None,
        "--sweep",
        "-s",
        exists=True,
        dir_okay=False,
        help="Sweep a new version is evaluated on (default: evals/sweeps/default.yaml).",
    ),
    policy: Path = typer.Option(None, "--policy", exists=True, dir_okay=False, help="Stage policy YAML."),
    reproducibility: bool = typer.Option(True, "--repro/--no-repro", help="Run the reproducibility probe."),
    for_s: float = typer.Option(None, "--for", min=0.0, help="Stop after this many seconds (default: Ctrl-C)."),
) -> None:
    """Act on MLflow's registry webhooks: evaluate new versions, open a finding for an alias moved outside unmask."""
    import uvicorn

    from evals.sweep import default_sweep_path
    from flows.environment import configure_environment
    from flows.evaluate import EvaluationOptions
    from flows.failures import print_error
    from flows.receiver import Inbox, Reactions, Receiver, inbox_path, receiver_app
    from registry import Registry, RegistryError
    from registry.mlflow_hooks import EVENTS
    from registry.mlflow_hooks import subscribe as subscribe_server

    secret = os.environ.get(secret_env, "")
    if not secret:
        raise typer.BadParameter(f"${secret_env} is not set: it holds the HMAC secret MLflow signs deliveries with")
    state = configure_environment()
    options.port_free(host, port)
    try:
        registry = Registry()
        hook, created = subscribe_server(registry, subscribe, secret) if subscribe else ("", False)
    except RegistryError as e:  # an unreachable server, a refused subscription: one line
        print_error(console, str(e))
        raise typer.Exit(2) from None
    if subscribe:
        console.print(
            f"{'subscribed' if created else 're-subscribed'} {subscribe} to {', '.join(EVENTS)} on "
            f"{registry.tracking_uri} (webhook {hook})"
        )
    evaluation = EvaluationOptions(policy=str(policy) if policy else None, reproducibility=reproducibility)
    reactions = Reactions(registry, str(sweep or default_sweep_path()), evaluation, state / "events" / "inbox")
    receiver = Receiver(secret.encode(), Inbox(inbox_path()), reactions, say=lambda line: console.print(line))
    receiver.start()
    server = uvicorn.Server(
        uvicorn.Config(receiver_app(receiver), host=host, port=port, log_level="warning", access_log=False)
    )
    deadline = threading.Timer(for_s or 0.0, lambda: setattr(server, "should_exit", True))
    deadline.daemon = True  # a SIGTERM or Ctrl-C before it fires is not held up by it (it was: --for 600, 600 s)
    if for_s is not None:
        deadline.start()
    console.print(f"unmask listen: http://{host}:{port}/mlflow for {registry.tracking_uri} (journal: {inbox_path()})")
    server.run()
    deadline.cancel()
    receiver.stop()


def register(app: typer.Typer) -> None:
    app.command("listen")(listen_command)
