"""What runs the denoiser: the PyTorch module itself, or its ONNX export under ONNX Runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config names these backends; the backends only read its fields
    from sampler.config import SamplerConfig


def torch_backend(model: Any, config: SamplerConfig) -> tuple[Any, str | None]:
    return model, None


def onnxruntime_backend(model: Any, config: SamplerConfig) -> tuple[Any, str | None]:
    from sampler.onnx_backend import onnx_denoiser

    denoiser = onnx_denoiser(model)
    return denoiser, denoiser.provider  # onnxruntime falls back to the CPU silently: say what ran


BACKENDS = {"torch": torch_backend, "onnxruntime": onnxruntime_backend}


def denoiser_for(model: Any, config: SamplerConfig) -> tuple[Any, str | None]:
    """The callable the sampler calls for `model` under `config.backend`, and the execution provider it runs on
    (None for torch, which runs where the module lives)."""
    return BACKENDS[config.backend](model, config)
