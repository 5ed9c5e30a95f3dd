"""The per-request compute cap (the serving policy's `limits:`, `gates.request_limits.RequestLimits`): what a
request's effective config may cost, checked once the config is known and before it is queued."""

from __future__ import annotations

from gates.request_limits import RequestLimits
from sampler.config import SamplerConfig
from serving.decoding import RequestError


def check_compute(config: SamplerConfig, prompt_tokens: int, kind: str, limits: RequestLimits) -> None:
    """RequestError (400, naming the field) when the decode would cost more than one request may."""
    if kind == "autoregressive":  # one forward a token; max_tokens and the context bound it already
        return
    if config.steps > config.gen_length and kind != "block-diffusion":  # block diffusion re-noises: steps may exceed it
        raise RequestError(
            "unmask.steps",
            f"unmask.steps={config.steps} is above the canvas of {config.gen_length} "
            f"tokens; a step unmasks at least one token",
        )
    if config.steps > limits.max_steps:
        raise RequestError(
            "unmask.steps",
            f"unmask.steps={config.steps} is above this server's limit of {limits.max_steps} steps per request",
        )
    canvas = prompt_tokens + config.gen_length
    if canvas > limits.max_canvas:
        raise RequestError(
            "max_tokens",
            f"{prompt_tokens} prompt tokens + {config.gen_length} to decode make a "
            f"canvas of {canvas}, above this server's limit of {limits.max_canvas}",
        )
    cost = config.steps * canvas
    if cost > limits.max_token_forwards:
        raise RequestError(
            "unmask.steps",
            f"{config.steps} steps over a canvas of {canvas} are {cost} token-forwards, "
            f"above this server's limit of {limits.max_token_forwards} per request",
        )
