"""Memory fit before a pull: whether a catalog entry's weights, KV cache and logits temporaries fit a budget.

Asked before anything is downloaded, so it reads only what is known without the network: the catalog's
`parameters` (weights = total parameters x dtype bytes; a mixture of experts keeps every expert resident, so
`active_parameters` does not shrink it) and the layers, key/value heads, head size and vocabulary: from the
entry's config.json where its files are already here (a pulled copy or a local source), else from the catalog's
`architecture` (its published config.json's numbers, stated before a pull). When both are at hand the files win,
and a disagreement is said in the terms' basis. The KV cache and the logits temporaries are sampler/memory.py's
formulas (`kv_cache_bytes`, `canvas_logits_bytes`) at the canvas a request may ask for: `positions` (prompt +
generated tokens, the serving limit `max_canvas` or the entry's gen_length if larger) and the entry's block. A
term that cannot be known is "unknown", never guessed; the verdict is "does not fit" only when the known terms
alone exceed the budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.catalog import Architecture, CatalogEntry
from sampler.memory import canvas_logits_bytes, kv_cache_bytes

FITS, DOES_NOT_FIT, UNKNOWN = "fits", "does not fit", "unknown"


@dataclass(frozen=True)
class Term:
    """One part of what a decode needs resident: bytes (None: unknown) and how it was computed, in words."""

    name: str
    bytes: int | None
    basis: str


Shape = Architecture  # what the KV cache and the logits depend on, read from a config.json or stated in the catalog


@dataclass(frozen=True)
class MemoryFit:
    """Need (per term) against have, for one entry on one device."""

    entry_id: str
    device: str
    have: int
    have_basis: str  # "MemAvailable of this host" or "stated --memory"
    terms: tuple[Term, ...]
    positions: int
    rows: int

    @property
    def need_known(self) -> int:
        return sum(t.bytes for t in self.terms if t.bytes is not None)

    @property
    def unknown(self) -> list[str]:
        return [t.name for t in self.terms if t.bytes is None]

    @property
    def verdict(self) -> str:
        if self.need_known > self.have:
            return DOES_NOT_FIT
        return UNKNOWN if self.unknown else FITS

    def summary(self) -> str:
        """One line: the verdict with need against have."""
        need = gib(self.need_known) + (" + unknown" if self.unknown else "")
        return f"{self.verdict}: needs {need} of {gib(self.have)} ({self.have_basis}, {self.device})"

    def lines(self) -> list[str]:
        """Need against have, term by term."""
        out = [f"{t.name}: {gib(t.bytes) if t.bytes is not None else 'unknown'} ({t.basis})" for t in self.terms]
        out.append(
            f"need: {gib(self.need_known)}" + (f" + unknown ({', '.join(self.unknown)})" if self.unknown else "")
        )
        out.append(f"have: {gib(self.have)} ({self.have_basis}, {self.device})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "device": self.device,
            "have": self.have,
            "have_basis": self.have_basis,
            "need_known": self.need_known,
            "positions": self.positions,
            "rows": self.rows,
            "terms": {t.name: {"bytes": t.bytes, "basis": t.basis} for t in self.terms},
        }


def gib(n: int | None) -> str:
    """Bytes in GiB, or MiB (KiB) below one of them, so a small model does not read as 0.00 GiB."""
    if n is None:
        return "unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size or unit == "MiB" and n >= 2**10:
            return f"{n / size:.2f} {unit}"
    return f"{n / 2**10:.2f} KiB"


def config_shape(config: dict[str, Any]) -> Shape | None:
    """Layers, key/value heads, head size and vocabulary from a Hugging Face config.json (the text part of a
    multimodal one) or the native LLaDA layout's names; None when any is missing."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config

    def first(*keys: str) -> Any:
        return next((text[k] for k in keys if isinstance(text.get(k), int) and text[k] > 0), None)

    layers = first("num_hidden_layers", "n_layers")
    heads = first("num_attention_heads", "n_heads")
    kv_heads = first("num_key_value_heads", "n_kv_heads") or heads
    hidden = first("hidden_size", "d_model")
    head_dim = first("head_dim") or (hidden // heads if hidden and heads else None)
    vocab = first("vocab_size", "embedding_size")
    if not (layers and kv_heads and head_dim and vocab):
        return None
    return Shape(layers, kv_heads, head_dim, vocab)


def shape_source(files: Shape | None, catalog: Architecture | None) -> tuple[Shape | None, str]:
    """The shape the fit uses and where it came from, in words: the files' config.json wins over the catalog's
    `architecture`, and a disagreement between them is said."""
    if files is None:
        return catalog, "from the catalog's architecture (config.json not here yet)"
    if catalog is None or catalog == files:
        return files, "from config.json" + (" (the catalog's architecture agrees)" if catalog else "")
    return files, f"from config.json; the catalog's architecture ({catalog}) disagrees and is not used"


def read_shape(folder: Path | None) -> Shape | None:
    """The shape of the config.json in `folder`, if there is one that says it."""
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config_shape(config) if isinstance(config, dict) else None


def parameters_on_disk(folder: Path) -> int | None:
    """Count parameters from the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                total += n
    return total or None


def memory_fit(
    entry: CatalogEntry,
    *,
    device: str,
    dtype_bytes: int,
    have: int,
    have_basis: str,
    max_canvas: int,
    shape: Shape | None = None,
    counted: int | None = None,
    rows: int = 1,
) -> MemoryFit:
    """Weights, KV cache and logits temporaries of `rows` requests of `entry` at its widest canvas, against
    `have` bytes. `shape` and `counted` (parameters, where the catalog gives none): from the entry's files
    where they are here (`read_shape`, `parameters_on_disk`), else None; without `shape`, the catalog's
    `architecture` gives the KV cache and logits terms."""
    gen = int(entry.decoding.get("gen_length") or 0)
    positions = max(max_canvas, gen)  # the widest forward a request may ask for: prompt + generated tokens
    block = int(entry.decoding.get("block_length") or gen or positions)
    width = f"{dtype_bytes}-byte dtype"
    if entry.parameters is None and counted:
        weights = Term("weights", counted * dtype_bytes, f"{counted:,} parameters counted on disk x {width}")
    elif entry.parameters is None:
        weights = Term("weights", None, "parameters not stated in the catalog")
    else:
        active = entry.active_parameters
        moe = f"; every expert resident, {active:,} active per token" if active else ""
        weights = Term("weights", entry.parameters * dtype_bytes, f"{entry.parameters:,} parameters x {width}{moe}")
    used, source = shape_source(shape, entry.architecture)
    if used is None:
        why = "needs config.json or the catalog's architecture: known once the entry is pulled"
        kv, logits = Term("kv_cache", None, why), Term("logits", None, why)
    else:
        kv_bytes = rows * kv_cache_bytes(used.layers, used.kv_heads, used.head_dim, positions, dtype_bytes)
        kv = Term(
            "kv_cache",
            kv_bytes,
            f"{rows} x 2 x {used.layers} layers x {used.kv_heads} kv heads x {used.head_dim} x {positions} "
            f"positions x {width}; {source}",
        )
        canvas = block if entry.kind == "block-diffusion" else positions
        logits = Term(
            "logits",
            rows * canvas_logits_bytes(entry.kind, positions, canvas, used.vocab, dtype_bytes),
            f"{rows} x {entry.kind} temporaries over canvas {canvas} x vocabulary {used.vocab:,}; {source}",
        )
    return MemoryFit(entry.id, device, have, have_basis, (weights, kv, logits), positions, rows)
