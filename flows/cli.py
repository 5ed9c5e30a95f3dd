"""The `unmask` command line. Each command lives in flows/commands/<name>.py and registers here."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from flows.commands.options import check_environment
from flows.environment import configure_environment
from flows.failures import DEBUG_ENV, describe, log_traceback, quiet_store_tracebacks
from flows.interrupt import INTERRUPT
from flows.quick_exit import QUICK_EXIT  # first: its exit hook must be the first one registered (it runs last)

if TYPE_CHECKING:
    from typer._click.core import Context  # typer's vendored click: the context a command is invoked with
    from typer.models import CommandInfo, TyperInfo


class UnmaskGroup(TyperGroup):
    """Every failure ends in one line: a bad option names itself and its value (exit 2); an exception a
    command let escape is described by `flows.failures` (exit 2 for input, 1 otherwise), its traceback
    kept in the state folder's log, or shown with --debug."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        plain_help_types(self)
        if not standalone_mode:
            return super().main(
                args, prog_name, complete_var, standalone_mode=False, windows_expand_args=windows_expand_args, **extra
            )
        try:
            code = super().main(
                args, prog_name, complete_var, standalone_mode=False, windows_expand_args=windows_expand_args, **extra
            )
        except TyperException as e:  # typer's click: usage errors (a bad option or value) and help without args
            ctx: Any = getattr(e, "ctx", None)  # a usage error's context (NoArgsIsHelpError always has one)
            if type(e).__name__ == "NoArgsIsHelpError":
                typer.echo(ctx.get_help())
                sys.exit(0)
            if not hasattr(e, "format_message"):
                raise
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            typer.echo(f"error: {e.format_message()}{given_value(e, args)}{hint}", err=True)
            sys.exit(getattr(e, "exit_code", 2))
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: Context) -> Any:
        if os.environ.get(DEBUG_ENV, "").strip() in ("", "0") and not ctx.params.get("debug"):
            quiet_store_tracebacks()
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):
            raise
        except KeyboardInterrupt:
            INTERRUPT.announce()
            raise typer.Exit(INTERRUPT.exit_code) from None
        except Exception as e:
            if ctx.meta.get("unmask.debug") or os.environ.get(DEBUG_ENV, "").strip() not in ("", "0"):
                raise
            code, line = describe(e)
            log = log_traceback(e, " ".join(sys.argv[1:]) or ctx.invoked_subcommand or "")
            where = f" (traceback: {log}; or rerun with --debug)" if log and code != 2 else ""
            typer.echo(f"error: {line}{where}", err=True)
            raise typer.Exit(code) from None


def given_value(error: TyperException, args: Sequence[str] | None) -> str:
    """`, got 'ten'` when a usage error does not quote the value typed (typer's int parsing does not)."""
    opts = getattr(getattr(error, "param", None), "opts", None) or []
    args = list(sys.argv[1:] if args is None else args)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if name in opts:
            value = inline if eq else (args[i + 1] if i + 1 < len(args) else None)
            if value is not None and repr(value) not in error.format_message() and value not in error.format_message():
                return f", got {value!r}"
    return ""


app = typer.Typer(
    name="unmask",
    help="Decide whether a diffusion LLM is ready for production, and roll it out behind gates.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    cls=UnmaskGroup,
)


@app.callback()
def root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of a failure instead of one line."),
) -> None:
    """unmask: evidence and gated rollout for diffusion language models."""
    ctx.meta["unmask.debug"] = debug
    check_environment(command=ctx.invoked_subcommand)  # a variable naming nothing usable: one line, before any command


# One line per command module; each module defines `register(app)`.
COMMAND_MODULES = [
    "flows.commands.generate",
    "flows.commands.pull",
    "flows.commands.models",
    "flows.commands.train",
    "flows.commands.eval",
    "flows.commands.gates",
    "flows.commands.promote",
    "flows.commands.run",
    "flows.commands.approve",
    "flows.commands.nightly",
    "flows.commands.dashboard",
    "flows.commands.bench",
    "flows.commands.serve",
    "flows.commands.loadtest",
    "flows.commands.report",
    "flows.commands.rollout",
    "flows.commands.analysis",
    "flows.commands.deploy",
    "flows.commands.keys",
    "flows.commands.weights",
    "flows.commands.migrate",
    "flows.commands.history",
    "flows.commands.events",
    "flows.commands.listen",
]


# `unmask --help` groups the commands by task, in the order a newcomer meets them.
HELP_PANELS = {
    "evaluate": ["run", "eval", "bench", "generate", "models", "pull", "train"],
    "decide": ["gates", "dashboard", "report", "sign-off", "approve", "reject", "promote", "request-promotion"],
    "serve": ["serve", "loadtest", "weights"],
    "roll out": ["rollback", "rollout"],  # typer lists a panel's commands before its groups (rollout, nightly)
    "audit": ["audit", "history", "events", "migrate", "nightly", "keys"],
}
PANEL_OF = {name: panel for panel, names in HELP_PANELS.items() for name in names}
ORDER = [name for names in HELP_PANELS.values() for name in names]


def _register_all() -> None:
    if app.registered_commands:  # once per process (tests call it from several modules)
        return
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)
    infos: list[CommandInfo | TyperInfo] = [*app.registered_commands, *app.registered_groups]
    for info in infos:
        name = info.name or str(getattr(info.callback, "__name__", ""))
        info.rich_help_panel = PANEL_OF.get(name, "more")
    app.registered_commands.sort(key=lambda i: ORDER.index(i.name) if i.name in ORDER else len(ORDER))


PLAIN_TYPES = {
    "str": "TEXT",
    "list[str]": "TEXT",
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "NUMBER",
    "float range": "NUMBER",
    "path": "PATH",
    "list[path]": "PATH",
    "file": "FILE",
    "directory": "DIR",
}


def plain_help_types(command: Any) -> None:
    """Help shows a flag with no type and a value as TEXT / INTEGER / PATH (typer writes `<bool>`, `<str>`); only
    the help column changes, so usage errors still name the option itself."""
    if not getattr(command, "_plain_help", False) and hasattr(command, "get_help_option"):
        made = command.get_help_option

        def help_option(ctx: Any, made: Callable[[Any], Any] = made) -> Any:
            option = made(ctx)
            if option is not None:
                option.display_type_rich = lambda ctx: None  # --help is a flag
            return option

        command.get_help_option = help_option
        command._plain_help = True
    for param in getattr(command, "params", []):
        shown = getattr(param, "display_type_rich", None)
        if shown is None or getattr(param, "_plain_help", False):
            continue

        def plain(ctx: Any, param: Any = param, shown: Callable[[Any], Any] = shown) -> Any:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                return None
            label = shown(ctx)
            bare = (label or "").strip("<>").removesuffix("...")
            return PLAIN_TYPES.get(bare, bare.upper() if bare.isidentifier() else bare) if label else label

        param.display_type_rich = plain
        param._plain_help = True
    for sub in getattr(command, "commands", {}).values():
        plain_help_types(sub)


def main() -> None:
    INTERRUPT.install()  # Ctrl-C and SIGTERM: out within seconds, never through a registry write (flows.interrupt)
    try:
        configure_environment()
    except ValueError as e:  # $UNMASK_HOME that cannot be a folder: models.state says which and why
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    _register_all()
    try:
        app(prog_name="unmask")
    except SystemExit as e:
        e = SystemExit(INTERRUPT.settled(e.code))
        QUICK_EXIT.leaving(e)
        raise e from None


if __name__ == "__main__":
    main()
