"""What runs the denoiser: the PyTorch module itself, or its ONNX export under ONNX Runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the config names these backends; the backends only read its fields
    from sampler.config import SamplerConfig


def torch_backend(model: Any, config: SamplerConfig) -> tuple[Any, dict[str, Any]]:
    return model, {}


def onnxruntime_backend(model: Any, config: SamplerConfig) -> tuple[Any, dict[str, Any]]:
    from sampler.onnx_backend import onnx_denoiser

    denoiser = onnx_denoiser(model)
    return denoiser, {"provider": denoiser.provider}


BACKENDS = {"torch": torch_backend, "onnxruntime": onnxruntime_backend}


def denoiser_for(model: Any, config: SamplerConfig) -> tuple[Any, dict[str, Any]]:
    """The callable the sampler calls for `model` under `config.backend`, and what to report about it."""
    return BACKENDS[config.backend](model, config)
