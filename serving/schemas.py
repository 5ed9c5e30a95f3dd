"""The OpenAI-compatible request bodies the server accepts, as strict pydantic models.

Every documented parameter of OpenAI's completions and chat completions is listed, with its type; an
unknown field is a 400 naming it (`extra="forbid"`), and a value of the wrong type or out of range is a 400
naming it too, never a 500. Whether a local model honours a parameter's value is decided in one place,
`serving.surface` (called from `LocalServing.parse`), so an upstream arm still receives what the client sent.
Diffusion settings travel under the `unmask` extension object, which OpenAI clients send through `extra_body`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from sampler.commit import COMMIT_RULES
from sampler.remasking import REMASKING_POLICIES

if TYPE_CHECKING:
    from typing_extensions import TypeIs  # in typing from Python 3.13

MAX_STOP = 4  # OpenAI's own limit on stop sequences
MAX_STOP_CHARS = 1000  # per stop sequence: a longer one costs a scan of every decoded text and hardly ever matches
MAX_CHOICES = 16  # n (and best_of): one request may not take over the batcher
MAX_PROMPTS = 32  # prompts in one completions request


def _int_as_float(value: Any) -> Any:
    # strict mode refuses an int for a float field, but 0 and 1 are what people type; strings stay refused
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


Real = Annotated[float, BeforeValidator(_int_as_float)]
Json = dict[str, Any]  # an OpenAI object whose inside only `serving.surface` reads


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class LikelihoodOptions(Strict):
    """How a masked-diffusion model scores an echoed prompt (sampler/likelihood.py); unset: the server's."""

    samples: StrictInt | None = Field(None, ge=1, le=1024)  # Monte Carlo mask samples per estimate
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)  # the samples' generator (default 0)
    estimator: str | None = None  # count (LLaDA's, the default) or ratio
    context_tokens: StrictInt | None = Field(None, ge=1)  # the estimate is of the tokens after these (default 1)


class UnmaskOptions(Strict):
    """Diffusion settings a request may override; the alias's operating point supplies the rest."""

    steps: StrictInt | None = Field(None, ge=1, le=4096)
    block_length: StrictInt | None = Field(None, ge=1, le=4096)
    parallel: str | None = None
    parallel_threshold: Real | None = Field(None, gt=0.0, le=1.0)
    parallel_factor: Real | None = Field(None, gt=0.0, le=100.0)
    remasking: str | None = None
    cfg_scale: Real | None = Field(None, ge=0.0, le=100.0)
    top_k: StrictInt | None = Field(None, ge=0, le=1_000_000)  # only the k likeliest tokens count; 0: all (Dream: 50)
    likelihood: LikelihoodOptions | None = None  # scoring, not decoding: never part of the SamplerConfig

    @field_validator("parallel")
    @classmethod
    def _known_rule(cls, value: str | None) -> str | None:
        return _known(value, COMMIT_RULES)

    @field_validator("remasking")
    @classmethod
    def _known_policy(cls, value: str | None) -> str | None:
        return _known(value, REMASKING_POLICIES)

    def overrides(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump(exclude={"likelihood"}).items() if v is not None}


class StreamOptions(Strict):
    include_usage: StrictBool | None = None  # a last chunk, before [DONE], with the usage and no choices
    include_obfuscation: StrictBool | None = None  # accepted; unmask pads no chunk (see docs/serving.md)


class Sampling(Strict):
    """Fields both endpoints share."""

    model: str = Field(min_length=1, max_length=256)
    max_tokens: StrictInt | None = Field(None, ge=0)  # 0: completions scoring an echoed prompt only
    temperature: Real | None = Field(None, ge=0.0, le=2.0)
    top_p: Real | None = Field(None, ge=0.0, le=1.0)
    seed: StrictInt | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    n: StrictInt | None = Field(None, ge=1, le=MAX_CHOICES)
    frequency_penalty: Real | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: Real | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Real] | None = None
    stream: StrictBool | None = False  # server-sent events: committed text as it becomes final (serving/streaming.py)
    stream_options: StreamOptions | None = None  # read only when streaming, as OpenAI does
    user: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = Field(None, max_length=16)  # OpenAI's key/value tags; routes may match them
    unmask: UnmaskOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        longest = max((len(s) for s in stops), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters, got {longest}")
        return value

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def choices_per_prompt(self) -> int:
        return self.n or 1

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def _known(value: str | None, known: Mapping[str, object]) -> str | None:
    if value is not None and value not in known:
        raise ValueError(f"{value!r} is not one of {', '.join(sorted(known))}")
    return value


TokenIds = list[Annotated[int, Field(ge=0)]]
PromptField = str | TokenIds | list[str] | list[TokenIds]  # what a completions `prompt` may be


class CompletionRequest(Sampling):
    """`POST /v1/completions`: a prompt, or a batch of them (strings or token ids), each answered `n` times."""

    prompt: PromptField
    echo: StrictBool | None = False
    best_of: StrictInt | None = Field(None, ge=1, le=MAX_CHOICES)
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | StrictBool | None = None  # the likelihood work reads it
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: PromptField) -> PromptField:
        prompts = as_prompts(value)
        if not prompts:
            raise ValueError("no prompt")
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(prompts)}")
        for i, p in enumerate(prompts):
            if not (p.strip() if isinstance(p, str) else p):
                raise ValueError("prompt is empty" if len(prompts) == 1 else f"prompt {i} is empty")
        return value

    def prompts(self) -> list[str | list[int]]:
        return as_prompts(self.prompt)


def as_prompts(value: PromptField) -> list[str | list[int]]:
    """A completions `prompt` as a list of prompts: a string, token ids, or a list of either."""
    if isinstance(value, str):
        return [value]
    if _token_ids(value):
        return [list(value)]
    return list(value)


def _token_ids(value: list[int] | list[str] | list[list[int]]) -> TypeIs[list[int]]:
    """Whether a list `prompt` is one prompt of token ids (else it is strings, or lists of ids)."""
    return bool(value) and all(isinstance(v, int) for v in value)


class ContentPart(BaseModel):
    """One part of a message's content: `{"type": "text", "text": ...}`; other types are named and refused."""

    model_config = ConfigDict(extra="allow", strict=True)
    type: StrictStr
    text: str | None = None


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = Field(None, max_length=1_000_000, validate_default=True)
    name: str | None = None
    tool_calls: list[Json] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: the call it answers
    function_call: Json | None = None  # the deprecated form of tool_calls
    refusal: str | None = None
    audio: Json | None = None

    @field_validator("content")
    @classmethod
    def _content_unless_a_call(
        cls, value: str | list[ContentPart] | None, info: ValidationInfo
    ) -> str | list[ContentPart] | None:
        if value is None and info.data.get("role") not in ("assistant", "function"):
            raise ValueError(
                f"content is required in a {info.data.get('role', '')} message (only an assistant's may be null)"
            )
        return value

    def text(self) -> str:
        """The message's text: its string, or its text parts joined (other parts are refused in serving.surface)."""
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as a chat template reads it: role, its text as `content`, and the fields templates know."""
        return {"role": self.role, "content": self.text()} | self.model_dump(
            include={"name", "tool_calls", "tool_call_id"}, exclude_none=True
        )


class ChatCompletionRequest(Sampling):
    """`POST /v1/chat/completions`: messages rendered to a prompt by the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=64)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool | None = None  # the likelihood work reads it
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)
    response_format: Json | None = None
    tools: list[Json] | None = None
    tool_choice: StrictStr | Json | None = None
    parallel_tool_calls: StrictBool | None = None
    functions: list[Json] | None = None
    function_call: StrictStr | Json | None = None
    modalities: list[StrictStr] | None = None
    audio: Json | None = None
    prediction: Json | None = None
    web_search_options: Json | None = None
    reasoning_effort: StrictStr | None = None
    verbosity: StrictStr | None = None
    moderation: Json | None = None
    store: StrictBool | None = None
    service_tier: StrictStr | None = None
    safety_identifier: str | None = Field(None, max_length=256)
    prompt_cache_key: str | None = Field(None, max_length=1024)
    prompt_cache_retention: StrictStr | None = None
    prompt_cache_options: Json | None = None

    @field_validator("messages")
    @classmethod
    def _a_user_turn(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        if not any(m.role == "user" and m.text().strip() for m in value):
            raise ValueError("no user message with content")
        return value

    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
