"""Adapters: one protocol (`models.adapters.base.ModelAdapter`) over every kind of candidate.

`load_adapter("llada-8b-instruct")` resolves a catalog id (or a folder) and returns an adapter;
`sampler.decode.decode(adapter, input_ids, config)` then runs the right decoder for its kind
(masked diffusion, block diffusion, KV-cached autoregressive). `availability(entry)` says, without
loading anything, whether an entry can run now and, if not, why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.adapters.api import APIAdapter
from models.adapters.base import AdapterError, ModelAdapter, NotEvaluable, read_json
from models.adapters.causal_lm import CausalLMAdapter
from models.adapters.diffusion_gemma import DiffusionGemmaAdapter
from models.adapters.llada import LLaDAAdapter
from models.catalog import Catalog, CatalogEntry, load_catalog
from models.loading import folder_layout
from models.pull import PullError, entry_path

__all__ = [
    "APIAdapter", "AdapterError", "CausalLMAdapter", "DiffusionGemmaAdapter", "LLaDAAdapter", "ModelAdapter",
    "NotEvaluable", "availability", "load_adapter",
]


def availability(entry: CatalogEntry, store: str | Path | None = None) -> tuple[bool, str]:
    """(can run now, why or where) for a catalog entry, without loading weights."""
    if entry.is_api:
        return entry.api_status()
    if entry.adapter == "none":
        return False, f"no native adapter: {entry.notes}"
    try:
        path = entry_path(entry, store)
    except PullError as e:
        return False, str(e)
    return True, f"ready: {path}"


def load_adapter(ref: str | Path, *, catalog: Catalog | None = None, store: str | Path | None = None,
                 device: str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """An adapter for a catalog id or a model folder; raises NotEvaluable/AdapterError saying why not."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        return adapter_for_folder(folder, device=device, dtype=dtype)
    entry = (catalog or load_catalog()).get(str(ref))
    if entry.is_api:
        return APIAdapter(entry)
    ok, reason = availability(entry, store)
    if not ok:
        raise NotEvaluable(f"model '{entry.id}': {reason}")
    path = entry_path(entry, store)
    d = entry.decoding
    if entry.adapter == "llada":
        return LLaDAAdapter.from_folder(path, entry.id, device=device, dtype=dtype or torch.float32)
    if entry.adapter == "causal-lm":
        eos = tuple(d[k] for k in ("eos_id", "eot_id") if d.get(k) is not None)
        return CausalLMAdapter.from_folder(path, entry.id, device=device, dtype=dtype or torch.float32, eos_ids=eos)
    if entry.adapter == "diffusion-gemma":
        return DiffusionGemmaAdapter.from_folder(path, entry.id, device=device, dtype=dtype or torch.bfloat16, defaults=d)
    raise AdapterError(f"model '{entry.id}': adapter '{entry.adapter}' is not implemented")


def adapter_for_folder(folder: Path, device: str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """Pick the adapter from config.json: diffusion_gemma, LLaDA (bidirectional or causal), or a causal LM."""
    config = read_json(folder / "config.json")
    layout = folder_layout(config)
    if layout == "diffusion-gemma":
        return DiffusionGemmaAdapter.from_folder(folder, device=device, dtype=dtype or torch.bfloat16)
    if layout == "llada" and not config.get("causal"):
        return LLaDAAdapter.from_folder(folder, device=device, dtype=dtype or torch.float32)
    return CausalLMAdapter.from_folder(folder, device=device, dtype=dtype or torch.float32)
