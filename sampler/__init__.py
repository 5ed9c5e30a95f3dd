"""Diffusion decoding: transfer schedules, remasking policies, block decoding."""

from sampler.config import SamplerConfig
from sampler.generate import GenerateOutput, generate
from sampler.proposal import NonFiniteLogitsError

__all__ = ["GenerateOutput", "NonFiniteLogitsError", "SamplerConfig", "generate"]
