"""A write the disk refused (issue #51, item 6): the error names the file the user knows and the free space left,
and the flows tell it from a candidate's own failure; a refused connection names the server it was (item 5).
A full disk cannot be had on demand, so `write()`'s ENOSPC is raised by the write callback, as the file system
raises it: without a file name."""

from __future__ import annotations

import errno
import os
import re
import sqlite3

import pytest

from evals.store import RecordStore, write_atomic, write_json_atomic
from flows.failures import describe, refused_write

FREE = re.compile(r"\((\d+(?:\.\d)?) (B|KiB|MiB|GiB|TiB) free on (/[^)]*)\)")


def no_space(_path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write() raises it: no file name


def test_a_full_disk_is_one_line_naming_the_file_and_the_free_space_where_it_is_mounted(tmp_path):
    path = tmp_path / "evals" / "not-yet" / "records.json"  # its folder does not exist: the nearest one is measured
    code, line = describe(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)))
    assert code == 1 and "\n" not in line
    assert line.startswith(f"cannot write {path}: No space left on device (")
    free = FREE.search(line)
    assert free, line
    mount = free[3]
    assert os.path.ismount(mount) and str(tmp_path).startswith(mount), line
    assert "is full" in line and "UNMASK_HOME" in line


def test_a_full_sqlite_store_names_the_store_and_its_free_space(tmp_path, monkeypatch):
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    code, line = describe(sqlite3.OperationalError("database or disk is full"))
    assert code == 1 and line.startswith(f"cannot write {tmp_path / 'mlflow' / 'mlflow.db'}: database or disk is full")
    assert FREE.search(line), line


def test_a_refused_atomic_write_names_its_file_and_leaves_the_old_one_and_no_temporary(tmp_path):
    path = tmp_path / "sweep.json"
    write_json_atomic(path, {"kept": True})
    with pytest.raises(OSError) as refused:
        write_atomic(path, no_space)
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(path)
    assert describe(refused.value)[1].startswith(f"cannot write {path}: No space left on device")
    assert path.read_text() == '{\n  "kept": true\n}\n' and sorted(tmp_path.iterdir()) == [path]


def test_a_refused_append_to_the_records_names_the_records_file(tmp_path, monkeypatch):
    from tests.support.gate_fixtures import record

    store = RecordStore(tmp_path / "evals")
    real_open = type(store.jsonl).open

    def full_open(self, *args, **kwargs):
        opened = real_open(self, *args, **kwargs)
        if self == store.jsonl:
            opened.write = no_space  # the append's write() is refused
        return opened

    monkeypatch.setattr(type(store.jsonl), "open", full_open)
    with pytest.raises(OSError) as refused:
        store.add(record(), tables=False)
    assert refused.value.errno == errno.ENOSPC and refused.value.filename == str(store.jsonl)


@pytest.mark.parametrize(
    "error, refused",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
        (OSError(errno.EROFS, "Read-only file system"), True),
        (sqlite3.OperationalError("database or disk is full"), True),
        (RuntimeError("could not log"), False),
        (FileNotFoundError(errno.ENOENT, "No such file or directory"), False),
        (ValueError("NaN logits"), False),
        ("a state message, not an exception", False),
    ],
)
def test_a_refused_write_is_told_from_a_candidates_own_failure(error, refused):
    assert refused_write(error) is refused
    if isinstance(error, BaseException):  # raised from a wrapping error, it is still the machine's
        try:
            raise RuntimeError("the evaluation failed") from error
        except RuntimeError as wrapped:
            assert refused_write(wrapped) is refused


def test_a_refused_connection_with_the_embedded_store_blames_prefects_server_not_a_tracking_server(monkeypatch):
    """What Ctrl-C used to end with, once the Prefect server it also stopped refused the flows' last calls."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    code, line = describe(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    assert code == 1 and line.startswith("the Prefect server this command started cannot be reached"), line
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert describe(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))[1].startswith(
        "the tracking server http://mlflow.internal:5000 cannot be reached"
    )
