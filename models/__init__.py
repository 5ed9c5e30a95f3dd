"""Candidate models: the native LLaDA architecture, checkpoint loading, the model handle, bundled tiny models.

The names below load on first use: `models.state` (the state folder rule) is read by the registry and
the CLI, which must not pay for importing torch to find a folder.
"""

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointError": "models.checkpoint",
    "LoadedModel": "models.checkpoint",
    "load_checkpoint": "models.checkpoint",
    "save_checkpoint": "models.checkpoint",
    "LLaDAConfig": "models.llada",
    "LLaDAModelLM": "models.llada",
    "load": "models.loading",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
