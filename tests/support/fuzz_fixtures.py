"""The fuzz suites' one assertion: a bad input is refused the way `unmask` promises (issue 23).

Exit code 2, exactly one `error:` line that names the file or argument and the key or value, no
traceback anywhere, and nothing written to the MLflow store (not created, or every table's row
count unchanged). The CLI runs in-process through typer's CliRunner on the real `unmask` app.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path

from typer.testing import CliRunner

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def unmask_app():
    from flows import cli

    cli._register_all()
    return cli.app


def store_path(home: Path | None = None) -> Path:
    return Path(home or os.environ["UNMASK_HOME"]) / "mlflow" / "mlflow.db"


def row_counts(db: Path) -> dict[str, int] | None:
    """Every table's row count of the SQLite store; None when there is no store."""
    if not db.is_file():
        return None
    with sqlite3.connect(db) as con:
        tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        return {t: con.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables}


def refused(args: list[str], *named: str, env: dict[str, str] | None = None, db: Path | None = None) -> str:
    """Run `unmask ARGS`; assert the refusal; return its error line."""
    db = db or store_path()
    before = row_counts(db)
    result = CliRunner().invoke(unmask_app(), args, env={"COLUMNS": "80", **(env or {})})
    text = ANSI.sub("", result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"uncaught {type(result.exception).__name__}: {result.exception}\n{text}"
    )
    assert result.exit_code == 2, f"exit {result.exit_code} for {args}:\n{text}"
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one error line for {args}, got {len(errors)}:\n{text}"
    for part in named:
        assert str(part) in errors[0], f"{part!r} not named in: {errors[0]}"
    assert row_counts(db) == before, f"{args} changed the store"
    return errors[0]
