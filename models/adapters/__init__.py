"""Adapters: one model handle (`models.adapters.base.ModelHandle`) over every kind of candidate.

`models.load(ref)` picks the adapter from the folder layout (`folder_layout`); `availability(entry)`
says, without loading anything, whether a catalog entry can run now and, if not, why.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models.adapters.api import APIAdapter
from models.adapters.base import AdapterError, ModelHandle, NotEvaluable, read_json
from models.adapters.causal_lm import CausalLMAdapter
from models.adapters.diffusion_gemma import DiffusionGemmaAdapter
from models.adapters.dream import DreamAdapter
from models.adapters.llada import LLaDAAdapter
from models.adapters.llada2 import LLaDA2Adapter
from models.adapters.nemotron import NemotronAdapter
from models.adapters.sdar import SDARAdapter
from models.catalog import CatalogEntry
from models.pull import PullError, entry_path

__all__ = [
    "ADAPTERS",
    "APIAdapter",
    "AdapterError",
    "CausalLMAdapter",
    "DiffusionGemmaAdapter",
    "DreamAdapter",
    "LLaDA2Adapter",
    "LLaDAAdapter",
    "ModelHandle",
    "NemotronAdapter",
    "NotEvaluable",
    "SDARAdapter",
    "availability",
    "folder_layout",
    "model_layout",
    "read_json",
]

# folder layout -> the adapter that loads it
ADAPTERS: dict[
    str,
    type[LLaDAAdapter]
    | type[CausalLMAdapter]
    | type[DiffusionGemmaAdapter]
    | type[DreamAdapter]
    | type[SDARAdapter]
    | type[NemotronAdapter],
] = {
    "llada": LLaDAAdapter,
    "causal-lm": CausalLMAdapter,
    "diffusion-gemma": DiffusionGemmaAdapter,
    "dream": DreamAdapter,
    "sdar": SDARAdapter,
    "llada2": LLaDA2Adapter,  # a subclass of SDAR's: the same block loop, LLaDA2's network
    "nemotron": NemotronAdapter,
}


def folder_layout(config: dict[str, Any]) -> str:
    """'llada' (the native layout, bidirectional or causal), 'diffusion-gemma', 'dream', 'sdar', 'llada2',
    'nemotron' or 'causal-lm', from config.json."""
    if config.get("model_type") == "diffusion_gemma":
        return "diffusion-gemma"
    if config.get("model_type") == "Dream":
        return "dream"
    if config.get("model_type") == "sdar":
        return "sdar"
    if config.get("model_type") == "llada2_moe":
        return "llada2"
    if config.get("model_type") == "nemotron_labs_diffusion":
        return "nemotron"
    if config.get("model_type") in (None, "llada") or "d_model" in config:
        return "llada"
    return "causal-lm"


def model_layout(path: Path) -> str:
    """The layout of a model folder; a folder whose config.json is missing or unreadable counts as
    'llada', so the native loader reports what is wrong with it."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return "llada"
    return folder_layout(config) if isinstance(config, dict) else "llada"


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
