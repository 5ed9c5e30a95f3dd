"""`unmask events`: the registry's changes as a stream of events, printed or sent to the configured webhooks.

    unmask events                          every event so far, one line each
    unmask events --since 41 --format json one JSON object a line, after chain entry #41 (for a script)
    unmask events --follow                 and then each new one as it happens (Ctrl-C stops)
    unmask events --deliver                send the configured webhooks what they have not taken yet

`unmask promote` and `unmask rollback` deliver by themselves after a move, where webhooks are configured
(flows/webhooks.py, docs/events.md).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from flows.interrupt import INTERRUPT

if TYPE_CHECKING:
    from registry import Registry

console = Console(soft_wrap=True)


def events_command(
    since: int = typer.Option(0, "--since", min=0, help="Only events after this chain entry (its seq)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep going: each new event as it happens."),
    for_s: float = typer.Option(
        None, "--for", min=0.0, help="With --follow: stop after this many seconds (default: until Ctrl-C)."
    ),
    poll_s: float = typer.Option(1.0, "--poll", min=0.05, help="With --follow: seconds between reads of the chain."),
    output: str = typer.Option("text", "--format", help="text (a line each) or json (an object a line)."),
    deliver: bool = typer.Option(
        False, "--deliver", help="Send the configured webhooks the events they have not taken yet, instead."
    ),
) -> None:
    """The registry's changes (moves, approvals, declines, canaries, findings) as events, oldest first."""
    from flows.failures import print_error
    from flows.webhooks import WebhookError, stream
    from registry import Registry, RegistryError

    if output not in ("text", "json"):
        print_error(console, f"--format {output!r}: expected text or json")
        raise typer.Exit(2)
    try:
        registry = Registry()
        if deliver:
            _deliver(registry, follow, for_s, poll_s)
            return
        until = time.monotonic() + for_s if for_s is not None else None
        for event in stream(registry, since, follow, poll_s, until):
            if output == "json":
                typer.echo(json.dumps(event.to_dict(), sort_keys=True))
            else:
                mark = " [deployable]" if event.deployable else ""
                line = f"#{event.seq} {event.at[:19]} {event.type}{mark}: {event.summary}"
                console.print(line, highlight=False, markup=False)
    except (RegistryError, WebhookError) as e:
        print_error(console, str(e))
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPT.exit_code) from None


def _deliver(registry: Registry, follow: bool, for_s: float | None, poll_s: float) -> None:
    from flows.webhooks import deliver, load_webhooks, webhooks_path

    hooks = load_webhooks()
    if not hooks:
        console.print(f"no webhooks configured ({webhooks_path()} does not exist; see docs/events.md)")
        return
    until = time.monotonic() + for_s if for_s is not None else None
    while True:
        for d in deliver(registry, hooks):
            failed = f"; stopped at {d.failed} (the next delivery retries it)" if d.failed else ""
            if d.delivered or d.failed or not follow:
                console.print(
                    f"{d.webhook}: {d.delivered} delivered, {d.skipped} not its types{failed}", highlight=False
                )
        if not follow or (until is not None and time.monotonic() >= until):
            return
        time.sleep(poll_s)


def register(app: typer.Typer) -> None:
    app.command("events")(events_command)
