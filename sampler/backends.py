"""What runs the denoiser: the PyTorch module itself, or its ONNX export under ONNX Runtime."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch

from sampler.onnx_backend import onnx_denoiser

if TYPE_CHECKING:  # the config names these backends; the backends only read its fields
    from sampler.config import SamplerConfig

# One compiled wrapper per module, kept while the module lives: compiling costs seconds to minutes.
_COMPILED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def torch_backend(model: Any, config: SamplerConfig) -> tuple[Any, str | None]:
    if not config.compile:
        return model, None
    return compiled(model), None


def compiled(model: Any) -> Any:
    """`torch.compile(model, dynamic=True)`, once per module: canvases change width from block to block,
    so shapes are dynamic. Fused kernels round differently from eager ones (logits agree to ~1e-5)."""
    if not isinstance(model, torch.nn.Module):
        return model  # a plain callable (a test's spy, an instrumented wrapper): nothing to compile
    if model not in _COMPILED:
        _COMPILED[model] = torch.compile(model, dynamic=True)
    return _COMPILED[model]


def onnxruntime_backend(model: Any, config: SamplerConfig) -> tuple[Any, str | None]:
    denoiser = onnx_denoiser(model)
    return denoiser, denoiser.provider  # onnxruntime falls back to the CPU silently: say what ran


BACKENDS = {"torch": torch_backend, "onnxruntime": onnxruntime_backend}


def denoiser_for(model: Any, config: SamplerConfig) -> tuple[Any, str | None]:
    """The callable the sampler calls for `model` under `config.backend`, and the execution provider it runs on
    (None for torch, which runs where the module lives)."""
    return BACKENDS[config.backend](model, config)
