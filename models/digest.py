"""What a model's weights are, as one digest: the identity records, caches and the registry key on."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

from models.pull import sha256_of

WEIGHT_SUFFIXES = (".safetensors",)
SETTLED_S = 2.0  # a file written longer ago than this has a digest worth keeping for the process
_DIGESTS: dict[tuple[int, int, int, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """`sha256_of(path)`, read once per process while the file stays as it was: a serving host checks a folder's
    weights before loading and the loaded handle checks them again: the second full read of a large checkpoint is
    skipped.

    Kept by the file's device, inode, size, mtime and ctime, not by its path: a write changes ctime even when it puts
    mtime back, and a replaced file is another inode, while a file reached under another name (a folder renamed into
    place, as fetched weights are, or a link) is the same file. A file whose mtime or ctime is within SETTLED_S of now
    is hashed every time (a timestamp ticks coarser than a write can follow another, so a stamp that recent may not
    have moved)."""
    stat = os.stat(path)
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if key in _DIGESTS:
        return _DIGESTS[key]
    digest = sha256_of(path)
    if time.time() - max(stat.st_mtime, stat.st_ctime) > SETTLED_S:
        _DIGESTS[key] = digest
    return digest


def weight_files(folder: Path) -> list[Path]:
    """The model's safetensors: the index's shards, else model.safetensors, else every *.safetensors
    (an optimizer state saved beside the weights is not part of the model)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            return sorted({folder / name for name in json.loads(index.read_text())["weight_map"].values()})
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    return sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and not p.name.startswith("optimizer"))


def weights_sha256(folder: str | Path, known: Mapping[str, str] | None = None) -> str:
    """One digest of a model folder's weights: the file's sha256, or over `name:sha256` lines for shards.

    `known`: {file name: sha256} of files already hashed (a push hashes every file once), not read again."""
    folder = Path(folder)
    files = weight_files(folder) if folder.is_dir() else []
    digests = [(path.name, (known or {}).get(path.name) or file_sha256(path)) for path in files]
    if not digests:
        return ""
    if len(digests) == 1:
        return digests[0][1]
    h = hashlib.sha256()
    for name, digest in digests:
        h.update(f"{name}:{digest}\n".encode())
    return h.hexdigest()
