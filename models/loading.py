"""Resolve a model reference (a folder, or a bundled/catalog id) and load it."""

from __future__ import annotations

from pathlib import Path

import torch

from models.checkpoint import CheckpointError, LoadedModel, load_checkpoint

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_model_path(ref: str | Path) -> Path:
    """A folder path as given, else a catalog id (its pulled copy or local source), else a bundled id."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    from models.catalog import CatalogError, load_catalog
    from models.pull import PullError, entry_path

    try:
        catalog = load_catalog()
        if str(ref) in catalog:
            return entry_path(catalog.get(str(ref)))
    except (CatalogError, PullError) as e:
        raise CheckpointError(str(e)) from None
    bundled = WEIGHTS_DIR / str(ref)
    if bundled.is_dir():
        return bundled
    known = sorted(p.name for p in WEIGHTS_DIR.iterdir() if p.is_dir()) if WEIGHTS_DIR.is_dir() else []
    raise CheckpointError(
        f"model '{ref}': no such folder and no bundled model of that id (bundled: {', '.join(known) or 'none'})"
    )


def load_model(ref: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = torch.float32) -> LoadedModel:
    """Load a model folder or bundled id: returns model, tokenizer, mask/EOS/EoT ids and card."""
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}; known: {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    path = resolve_model_path(ref)
    loaded = load_checkpoint(path, device=device, dtype=dtype)
    loaded.model_id = str(ref) if not Path(ref).is_dir() else path.name
    return loaded
