"""The OpenAI-compatible request bodies the server accepts, as strict pydantic models.

Every field a request may carry is listed; anything else is a 400 naming the field (`extra="forbid"`),
and a value of the wrong type or out of range is a 400 naming it too, never a 500. Diffusion settings
travel under the `unmask` extension object, which OpenAI clients send through `extra_body`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, field_validator

from sampler.commit import COMMIT_RULES
from sampler.remasking import REMASKING_POLICIES

MAX_STOP = 4  # OpenAI's own limit on stop sequences


def _int_as_float(value):
    # strict mode refuses an int for a float field, but 0 and 1 are what people type; strings stay refused
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


Real = Annotated[float, BeforeValidator(_int_as_float)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class UnmaskOptions(Strict):
    """Diffusion settings a request may override; the alias's operating point supplies the rest."""

    steps: StrictInt | None = Field(None, ge=1, le=4096)
    block_length: StrictInt | None = Field(None, ge=1, le=4096)
    parallel: str | None = None
    parallel_threshold: Real | None = Field(None, gt=0.0, le=1.0)
    parallel_factor: Real | None = Field(None, gt=0.0, le=100.0)
    remasking: str | None = None
    cfg_scale: Real | None = Field(None, ge=0.0, le=100.0)

    @field_validator("parallel")
    @classmethod
    def _known_rule(cls, value):
        return _known(value, COMMIT_RULES)

    @field_validator("remasking")
    @classmethod
    def _known_policy(cls, value):
        return _known(value, REMASKING_POLICIES)

    def overrides(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class StreamOptions(Strict):
    include_usage: StrictBool = False  # a last chunk, before [DONE], with the usage and no choices


class Sampling(Strict):
    """Fields both endpoints share."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Real | None = Field(None, ge=0.0, le=2.0)
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: StrictInt = Field(1, ge=1, le=1)  # one choice per request: batching is the server's job, not the client's
    stream: StrictBool = False  # server-sent events: committed text as it becomes final (serving/streaming.py)
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = Field(None, max_length=16)  # OpenAI's key/value tags; routes may match them
    unmask: UnmaskOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value, info):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only read when stream is true")
        return value

    def stops(self) -> list[str]:
        return list(self.stop or [])


def _known(value: str | None, known: dict) -> str | None:
    if value is not None and value not in known:
        raise ValueError(f"{value!r} is not one of {', '.join(sorted(known))}")
    return value


class CompletionRequest(Sampling):
    """`POST /v1/completions`: one text prompt (or a list of one)."""

    prompt: str | list[str]
    echo: StrictBool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        prompts = [value] if isinstance(value, str) else value
        if len(prompts) != 1:
            raise ValueError(f"exactly one prompt per request, got {len(prompts)}")
        if not prompts[0].strip():
            raise ValueError("prompt is empty")
        return prompts[0]


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=1_000_000)
    name: str | None = None


class ChatCompletionRequest(Sampling):
    """`POST /v1/chat/completions`: messages rendered to a prompt by the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=64)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)

    @field_validator("messages")
    @classmethod
    def _a_user_turn(cls, value):
        if not any(m.role == "user" and m.content.strip() for m in value):
            raise ValueError("no user message with content")
        return value

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
