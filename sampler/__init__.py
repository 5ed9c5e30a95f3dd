"""Diffusion decoding: transfer schedules, remasking policies, block decoding, commit rules (parallel
decoding), KV caches, speculative decoding, early exit and the ONNX Runtime backend."""

from sampler.config import SamplerConfig
from sampler.generate import generate
from sampler.output import CommitTrace, FinalPrefix, GenerateOutput, StepInfo
from sampler.proposal import NonFiniteLogitsError

__all__ = [
    "CommitTrace",
    "FinalPrefix",
    "GenerateOutput",
    "NonFiniteLogitsError",
    "SamplerConfig",
    "StepInfo",
    "generate",
]
