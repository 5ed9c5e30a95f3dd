"""Candidate models: the native LLaDA architecture, checkpoint loading, bundled tiny models."""

from models.checkpoint import CheckpointError, LoadedModel, load_checkpoint, save_checkpoint
from models.llada import LLaDAConfig, LLaDAModelLM
from models.loading import load_model

__all__ = [
    "CheckpointError",
    "LLaDAConfig",
    "LLaDAModelLM",
    "LoadedModel",
    "load_checkpoint",
    "load_model",
    "save_checkpoint",
]
