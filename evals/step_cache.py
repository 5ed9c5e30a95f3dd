"""What a pipeline step computed from files that have not changed since, kept on disk as JSON.

Preparing a candidate and planning its sweep read the model (its tokenizer, config and card, and loading its
weights to learn them): for tiny-dgemma that is transformers' DiffusionGemma import, some 3 s of a fully
cached `unmask run`. Their results are functions of the model folder's files, the catalog entry, the sweep,
the task data and this code, so they are kept by a key over all of those. Files are kept the same way
(`keep_files`, `copy_kept_files`): a quality-latency plot of the same records.

A file counts as unchanged while its size and modification time (ns) are, the stamp `models.pull.verify_pins`
already trusts for its hashes: an edited or replaced file changes the key, and the step runs again. The code
is part of the key (the sha256 of every module of evals, models and sampler): a changed step never answers
from an older one's cache. A cache file that cannot be read is a miss, never an error.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from evals.store import write_atomic
from models.state import StateFolderError, state_dir

PACKAGES = ("evals", "models", "sampler")  # whose code shapes what the cached steps return
Model = TypeVar("Model", bound=BaseModel)


def files_stamp(folder: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file under `folder`, sorted."""
    found = []
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            try:
                stat = path.stat()
            except OSError:  # a file gone while walking: the stamp simply lacks it
                continue
            found.append((str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns))
    return sorted(found)


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """The sha256 over the source of every module in PACKAGES (read once per process)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def step_key(kind: str, **parts: Any) -> str:
    text = json.dumps(parts | {"code": code_digest()}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def _path(key: str) -> Path:
    return state_dir() / "cache" / "steps" / f"{key}.json"


def cached(key: str, model: type[Model]) -> Model | None:
    """The value kept under `key`, or None (never kept, or unreadable)."""
    try:
        return model.model_validate_json(_path(key).read_bytes())
    except (OSError, ValueError, ValidationError):
        return None


def keep(key: str, value: BaseModel) -> None:
    path = _path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda p: p.write_text(value.model_dump_json(), encoding="utf-8"))


def keep_files(key: str, paths: list[Path]) -> None:
    """Copies of `paths` kept under `key` (by file name), each written whole or not at all. A state folder that
    cannot take them is no error: the next call makes the files again."""
    try:
        folder = _path(key).with_suffix("")
        folder.mkdir(parents=True, exist_ok=True)
        for path in paths:
            write_atomic(folder / path.name, functools.partial(shutil.copyfile, path))
    except (OSError, StateFolderError):
        pass


def copy_kept_files(key: str, names: list[str], folder: Path) -> bool:
    """Copy the files kept under `key` into `folder`; False unless every one was there and copied."""
    try:
        kept = _path(key).with_suffix("")
        if not names or not all((kept / name).is_file() for name in names):
            return False
        for name in names:
            write_atomic(folder / name, functools.partial(shutil.copyfile, kept / name))
    except (OSError, StateFolderError):
        return False
    return True
