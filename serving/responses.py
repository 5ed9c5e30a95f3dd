"""The bodies this server answers with, as typed models: a completion, a chat completion, usage, the
`unmask` extension and a `/v1/models` card. Their field order is the JSON's: `model_dump()` gives exactly
the body sent."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Extension(BaseModel):
    """`unmask`: what answered (alias, version, weights, effective config) and what it cost."""

    alias: str
    model: str
    version: str
    weights_sha256: str
    config_hash: str
    config_source: str
    batched: bool
    batch_size: int
    nfe: int
    queue_s: float
    decode_s: float
    ttfb_s: float
    first_block_s: float | None
    stream: bool
    route: str | None
    arm: str | None
    retry_of: str | None = None  # the arm that failed, when the route's fallback answers for it
    seed: int | None = None  # choice 0's seed (None: greedy, nothing drawn); send it back to get that answer again
    seeds: list[int | None] | None = None  # each choice's seed, in choice order
    chat_dropped: list[dict[str, Any]] | None = None  # chat: messages ({index, role}) the template left out
    likelihood: list[dict[str, Any]] | None = None  # echo with logprobs: how each choice's prompt was scored
    ignored: list[str] | None = None  # request settings the model does not read (AR: the `unmask.*` ones)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None  # tokens, token_logprobs, top_logprobs, text_offset (serving/logprobs.py)


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: dict[str, Any] | None = None  # {"content": [...], "refusal": null} (serving/logprobs.py)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    usage: Usage
    unmask: Extension
    choices: list[CompletionChoice]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    usage: Usage
    unmask: Extension
    choices: list[ChatChoice]


class Batching(BaseModel):
    max_batch: int
    window_ms: int | float
    batched: str  # which requests share a batch
    not_batched: str


class TokenLimits(BaseModel):
    max_tokens: int | None  # None: bounded by the model's context only
    max_prompt_tokens: int
    context: int | None  # the model's context, when its config says


class ModelFacts(BaseModel):
    """A `/v1/models` entry's `unmask`: the version a served name points at and how it decodes."""

    model: str
    version: str
    weights_sha256: str
    kind: str
    stage: str
    config: dict[str, Any]
    config_hash: str
    config_source: str
    operating_config_hash: str
    chat_template: str
    streaming: str
    batching: Batching
    limits: TokenLimits


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int  # when the served version was registered (Unix seconds)
    owned_by: str = "unmask"
    unmask: ModelFacts
