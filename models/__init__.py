"""Candidate models: the native LLaDA architecture, checkpoint loading, the model handle, bundled tiny models."""

from models.checkpoint import CheckpointError, LoadedModel, load_checkpoint, save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM
from models.loading import load

__all__ = [
    "CheckpointError",
    "LLaDAConfig",
    "LLaDAModelLM",
    "LoadedModel",
    "load",
    "load_checkpoint",
    "save_checkpoint",
]
