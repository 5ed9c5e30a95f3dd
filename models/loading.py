"""`load(ref)`: a catalog id, a bundled id or a model folder -> the model handle of its kind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from models.adapters import ADAPTERS, APIAdapter, ModelHandle, NotEvaluable, availability, model_layout
from models.catalog import Catalog, CatalogEntry, CatalogError, load_catalog
from models.checkpoint import CheckpointError, read_config
from models.host_allocator import retain_freed_memory
from models.pull import PullError, entry_path, verify_pins

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

DEVICE_PATTERN = re.compile(r"^(cpu|mps|cuda(:\d+)?)$")  # torch device names unmask runs on (--device, sweeps)
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def catalog_entry(ref: str | Path, catalog: Catalog | None = None) -> CatalogEntry | None:
    """The catalog entry `ref` names, or None for a folder, a bundled id outside the catalog or no catalog."""
    if Path(ref).expanduser().is_dir():
        return None
    try:
        catalog = catalog or load_catalog()
    except CatalogError:
        if catalog is not None:
            raise
        return None
    return catalog.get(str(ref)) if str(ref) in catalog else None


def resolve_model_path(ref: str | Path, *, catalog: Catalog | None = None, store: str | Path | None = None) -> Path:
    """A folder path as given, else a catalog id (its pulled copy or local source), else a bundled id."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    try:
        entry = catalog_entry(ref, catalog)
        if entry is not None:
            return entry_path(entry, store)
    except (CatalogError, PullError) as e:
        raise CheckpointError(str(e)) from None
    bundled = WEIGHTS_DIR / str(ref)
    if bundled.is_dir():
        return bundled
    known = sorted(p.name for p in WEIGHTS_DIR.iterdir() if p.is_dir()) if WEIGHTS_DIR.is_dir() else []
    raise CheckpointError(
        f"model '{ref}': no such folder and no bundled model of that id (bundled: {', '.join(known) or 'none'})"
    )


def model_kind(ref: str | Path) -> str:
    """'masked-diffusion', 'autoregressive' or 'block-diffusion', from config.json alone (no weights read)."""
    path = resolve_model_path(ref)
    layout = model_layout(path)
    if layout == "llada":
        return "autoregressive" if read_config(path)[0].causal else "masked-diffusion"
    if layout == "dream":
        return "masked-diffusion"
    return "block-diffusion" if layout in ("diffusion-gemma", "sdar", "llada2", "nemotron") else "autoregressive"


def catalog_decoding(ref: str | Path) -> dict[str, Any]:
    """The catalog's decoding defaults of `ref` (empty for a folder or an id the catalog lacks)."""
    entry = catalog_entry(ref)
    return dict(entry.decoding) if entry is not None else {}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load(
    ref: str | Path,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    *,
    adapter: str | None = None,
    catalog: Catalog | None = None,
    store: str | Path | None = None,
) -> ModelHandle | APIAdapter:
    """The model handle of a catalog id, bundled id or folder: model, text codec, stop ids, card, weights digest.

    The folder's layout picks the adapter (`adapter` overrides it: 'causal-lm' runs a causal LLaDA
    layout through transformers' Llama); a catalog entry adds its id and decoding defaults. An API
    entry gives its `APIAdapter`; an entry that cannot run here raises `NotEvaluable` saying why.
    """
    dtype = resolve_dtype(dtype)
    retain_freed_memory()  # a batched forward reuses its activation pages instead of faulting them in anew
    entry = catalog_entry(ref, catalog)
    if entry is not None:
        if entry.is_api:
            return APIAdapter(entry)
        ok, reason = availability(entry, store)
        if not ok:
            raise NotEvaluable(f"model '{entry.id}': {reason}")
    path = resolve_model_path(ref, catalog=catalog, store=store)
    if entry is not None:
        verify_pins(entry, path)  # every load, not only `unmask pull`: a pinned file edited since is refused
    model_id = entry.id if entry is not None else (path.name if Path(ref).expanduser().is_dir() else str(ref))
    layout = adapter or model_layout(path)
    if layout not in ADAPTERS:
        raise ValueError(f"adapter {layout!r}; known: {', '.join(ADAPTERS)}")
    defaults = dict(entry.decoding) if entry is not None else {}
    return ADAPTERS[layout].from_folder(path, model_id, device=device, dtype=dtype, defaults=defaults)
