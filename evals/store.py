"""Eval records on disk, saved one at a time as they finish, so a crash never loses a finished record.

A folder holds `records.jsonl` (appended and flushed per record: the source of truth),
`records.parquet` and `records.csv` (rewritten atomically after each record) and
`validation/<record_id>.json|html` (each record's Great Expectations result and its Data Docs page).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evals.records import EvalRecord, records_from_frame, records_to_frame


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Write through a temporary file of its own in the same folder, then rename, so readers never see half a
    file and two writers never share a temporary; a failed write leaves the old file and no temporary."""
    with naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(handle)
        try:
            write(Path(tmp))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold the lock file `lock` (created if missing) exclusively: a read, a decision and a write of the file beside
    it happen as one, across threads and processes on this machine. Released when the block ends, or when the process
    dies (the kernel drops the lock with the file)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with naming(lock), open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError inside names `path`: a refused `write()` (a full disk) names no file, and the temporary file a
    write went to is not the one the user knows."""
    try:
        yield
    except OSError as e:
        named = Path(os.fsdecode(e.filename)).name if isinstance(e.filename, (str, bytes)) else None
        if e.errno is None or named is not None and not named.startswith(f".{path.name}."):  # it says what it is
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e  # the same subclass: OSError maps errno to it


def write_json_atomic(path: Path, data: Any, **dumps: Any) -> None:
    """`data` as JSON (indented, keys sorted unless `dumps` says otherwise) written with `write_atomic`."""
    settings: dict[str, Any] = {"indent": 2, "sort_keys": True, "default": str}
    text = json.dumps(data, **(settings | dumps)) + "\n"
    write_atomic(Path(path), lambda p: p.write_text(text, encoding="utf-8"))


class RecordStore:
    """An output folder of eval records; `add` persists each record before returning."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.records: list[EvalRecord] = []

    @property
    def jsonl(self) -> Path:
        return self.folder / "records.jsonl"

    @property
    def parquet(self) -> Path:
        return self.folder / "records.parquet"

    @property
    def csv(self) -> Path:
        return self.folder / "records.csv"

    def add(
        self,
        record: EvalRecord,
        validation_result: dict[str, Any] | None = None,
        html: str | None = None,
        tables: bool = True,
    ) -> None:
        """Append `record`; keep its GX validation result (JSON) and Data Docs page (HTML) beside it.

        tables: rewrite the Parquet and CSV tables now (a caller adding many records at once writes them once,
        `write_tables`, instead of once per record: 36 rewrites of both for a default run's folder)."""
        self.records.append(record)
        with naming(self.jsonl), self.jsonl.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record.to_dict(), sort_keys=True, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if validation_result is not None:
            folder = self.folder / "validation"
            folder.mkdir(exist_ok=True)
            write_atomic(
                folder / f"{record.record_id}.json",
                lambda p: p.write_text(json.dumps(validation_result, indent=1, default=str)),
            )
        if html:
            folder = self.folder / "validation"
            folder.mkdir(exist_ok=True)
            write_atomic(folder / f"{record.record_id}.html", lambda p: p.write_text(html, encoding="utf-8"))
        if tables:
            self.write_tables()

    def write_tables(self) -> None:
        frame = records_to_frame(self.records)
        write_atomic(self.parquet, lambda p: frame.to_parquet(p, index=False))
        write_atomic(self.csv, lambda p: frame.to_csv(p, index=False))

    def write_json(self, name: str, value: Any) -> Path:
        path = self.folder / name
        write_atomic(path, lambda p: p.write_text(json.dumps(value, indent=1, default=str)))
        return path


def load_records(path: str | Path) -> list[EvalRecord]:
    """Records from a store folder, a .parquet, a .csv or a .jsonl file."""
    path = Path(path)
    if path.is_dir():
        path = path / "records.jsonl"
    if path.suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        return [EvalRecord.from_dict(json.loads(line)) for line in lines if line.strip()]
    import pandas as pd

    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    return records_from_frame(frame)
