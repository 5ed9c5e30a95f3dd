"""Diffusion decoding: transfer schedules, remasking policies, block decoding, commit rules (parallel
decoding), KV caches, speculative decoding, early exit and the ONNX Runtime backend."""

from sampler.config import SamplerConfig
from sampler.generate import generate
from sampler.output import CommitTrace, GenerateOutput, StepInfo
from sampler.proposal import NonFiniteLogitsError

__all__ = ["CommitTrace", "GenerateOutput", "NonFiniteLogitsError", "SamplerConfig", "StepInfo", "generate"]
