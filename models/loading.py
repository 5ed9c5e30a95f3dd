"""Resolve a model reference (a folder, or a bundled/catalog id) and load it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from models.checkpoint import CheckpointError, load_checkpoint, read_config

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


def folder_layout(config: dict[str, Any]) -> str:
    """'llada' (the native layout, bidirectional or causal), 'diffusion-gemma' or 'causal-lm', from config.json."""
    if config.get("model_type") == "diffusion_gemma":
        return "diffusion-gemma"
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


def model_kind(ref: str | Path) -> str:
    """'masked-diffusion', 'autoregressive' or 'block-diffusion', from config.json alone (no weights read)."""
    path = resolve_model_path(ref)
    layout = model_layout(path)
    if layout == "llada":
        return "autoregressive" if read_config(path)[0].causal else "masked-diffusion"
    return "block-diffusion" if layout == "diffusion-gemma" else "autoregressive"


def catalog_decoding(ref: str | Path) -> dict[str, Any]:
    """The catalog's decoding defaults of `ref` (empty for a folder or an id the catalog lacks)."""
    if Path(ref).expanduser().is_dir():
        return {}
    from models.catalog import CatalogError, load_catalog

    try:
        catalog = load_catalog()
    except CatalogError:
        return {}
    return dict(catalog.get(str(ref)).decoding) if str(ref) in catalog else {}


def load_model(ref: str | Path, device: str | torch.device = "cpu", dtype: str | torch.dtype = torch.float32) -> Any:
    """Load a model folder or bundled id for evaluation: model, tokenizer, mask/EOS/EoT ids and card.

    A LLaDA-layout folder gives a `LoadedModel`. A Hugging Face causal LM (Llama, Qwen: the real AR
    fallbacks) gives a `models.adapters.CausalLMAdapter`, and a DiffusionGemma folder a
    `DiffusionGemmaAdapter` (with the catalog's decoding defaults): both carry the same surface.
    """
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}; known: {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    path = resolve_model_path(ref)
    model_id = str(ref) if not Path(ref).is_dir() else path.name
    layout = model_layout(path)
    if layout != "llada":
        from models.adapters import AdapterError, CausalLMAdapter, DiffusionGemmaAdapter

        decoding = catalog_decoding(ref)
        try:
            if layout == "diffusion-gemma":
                return DiffusionGemmaAdapter.from_folder(path, model_id, device=device, dtype=dtype, defaults=decoding)
            eos = tuple(decoding[k] for k in ("eos_id", "eot_id") if decoding.get(k) is not None)
            return CausalLMAdapter.from_folder(path, model_id, device=device, dtype=dtype, eos_ids=eos)
        except AdapterError as e:
            raise CheckpointError(str(e)) from None
    loaded = load_checkpoint(path, device=device, dtype=dtype)
    loaded.model_id = model_id
    return loaded
