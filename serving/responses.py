"""The bodies this server answers with, as typed models: a completion, a chat completion, usage and the
`unmask` extension. Their field order is the JSON's: `model_dump()` gives exactly the body sent."""

from __future__ import annotations

from typing import Literal

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


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str
    logprobs: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str
    logprobs: None = None


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
