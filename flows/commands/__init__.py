"""CLI commands, one module each; flows/cli.py registers them."""

import sys

from rich.console import Console


def table_console(piped_width: int) -> Console:
    """A console for wide tables: the terminal's width, or `piped_width` when output is piped (so columns keep)."""
    return Console() if sys.stdout.isatty() else Console(width=piped_width)
