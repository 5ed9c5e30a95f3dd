"""CLI commands, one module each; flows/cli.py registers them. Tables print through flows/commands/table.py."""

from flows.commands.table import table_console

__all__ = ["table_console"]
