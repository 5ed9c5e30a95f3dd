"""What a model's weights are, as one digest: the identity records, caches and the registry key on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from models.pull import sha256_of

WEIGHT_SUFFIXES = (".safetensors",)


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
    digests = [(path.name, (known or {}).get(path.name) or sha256_of(path)) for path in files]
    if not digests:
        return ""
    if len(digests) == 1:
        return digests[0][1]
    h = hashlib.sha256()
    for name, digest in digests:
        h.update(f"{name}:{digest}\n".encode())
    return h.hexdigest()
