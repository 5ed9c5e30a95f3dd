"""The served models' tokenizers over HTTP, as vLLM documents its endpoints: `POST /tokenize`, `POST /detokenize`,
`GET /tokenizer_info` (at the server's root, not under /v1).

A client that probes them (lm-eval's `tokenizer_backend=remote`, or `auto`) then counts, truncates and renders chat
with the server's own tokenizer and chat template, and needs no copy of the model folder. `model` names a served
name (or the registered model one points at); without it, the tokenizer every served model shares, and a 400
naming the served names when they do not share one.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator
from tokenizers import Tokenizer

from serving.chat import ChatTemplateError
from serving.decoding import Limits, RequestError
from serving.local import LocalServing
from serving.pool import Route
from serving.schemas import ChatMessage, Strict

MAX_TOKENS_IN = 100_000  # ids a /detokenize body may carry


class TokenizeRequest(Strict):
    model: StrictStr | None = None
    prompt: StrictStr | None = Field(None, max_length=1_000_000)
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=10_000)
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True  # the chat template's; unmask's templates always add it
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


class DetokenizeRequest(Strict):
    model: StrictStr | None = None
    tokens: list[StrictInt] = Field(max_length=MAX_TOKENS_IN)


class Tokenizers:
    """The served routes' tokenizers, each read from its loaded handle."""

    def __init__(self, local: LocalServing, limits: Limits):
        self.local, self.limits = local, limits
        self._digests: dict[tuple[str, str], str] = {}

    def route(self, name: str | None) -> tuple[Route, Tokenizer]:
        """The route `name` names, or the one whose tokenizer every served route shares; and its tokenizer."""
        if name is not None:
            route = self.local.resolve(name)
            return route, self._tokenizer(route)
        pool = self.local.pool
        routes = [self.local.resolve(served) for served in pool.served()]
        shared = {self._digest(route) for route in routes}
        if len(shared) != 1:
            raise RequestError(
                "model",
                f"the served models do not share one tokenizer; name one in `model`: {', '.join(pool.served())}",
            )
        return routes[0], self._tokenizer(routes[0])

    def tokenize(self, body: TokenizeRequest) -> dict[str, Any]:
        route, tokenizer = self.route(body.model)
        if body.messages is not None:
            try:
                text = route.loaded.chat.render_chat([m.for_template() for m in body.messages]).text
            except ChatTemplateError as e:
                raise RequestError("messages", str(e)) from None
        else:
            text = body.prompt or ""
        if len(text) > self.limits.max_prompt_chars:
            raise RequestError(
                "prompt", f"{len(text)} characters, above this server's limit of {self.limits.max_prompt_chars}"
            )
        ids = tokenizer.encode(text, add_special_tokens=body.add_special_tokens).ids
        return {
            "count": len(ids),
            "max_model_len": route.loaded.context,
            "tokens": ids,
            "token_strs": [tokenizer.id_to_token(i) for i in ids] if body.return_token_strs else None,
        }

    def detokenize(self, body: DetokenizeRequest) -> dict[str, Any]:
        route, tokenizer = self.route(body.model)
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError("tokens", f"token id {bad} is outside the vocabulary of {route.version.model} ({vocab})")
        return {"prompt": route.loaded.handle.decode(list(body.tokens))}

    def info(self, name: str | None) -> dict[str, Any]:
        route, tokenizer = self.route(name)
        handle = route.loaded.handle

        def token(i: int | None) -> str | None:
            return tokenizer.id_to_token(i) if i is not None else None

        return {
            "model": route.name,
            "tokenizer_class": "tokenizers.Tokenizer",  # tokenizer.json, read without remote code
            "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
            "model_max_length": route.loaded.context,
            "max_model_len": route.loaded.context,
            "eos_token": token(handle.eos_id),
            "bos_token": None,  # the served models start a prompt with no BOS of their own
            "pad_token": token(getattr(handle, "pad_id", None)),
            "mask_token": token(getattr(handle, "mask_id", None)),
            "chat_template": route.loaded.chat.text,
            "chat_template_source": route.loaded.chat.source,
        }

    def _tokenizer(self, route: Route) -> Tokenizer:
        tokenizer = getattr(route.loaded.handle, "tokenizer", None)
        if not isinstance(tokenizer, Tokenizer):
            raise RequestError("model", f"{route.name} has no tokenizer this server reads (tokenizer.json)")
        return tokenizer

    def _digest(self, route: Route) -> str:
        """Which tokenizer a route has (its JSON's sha256), worked out once per loaded version."""
        key = route.loaded.key
        if key not in self._digests:
            self._digests[key] = hashlib.sha256(self._tokenizer(route).to_str().encode()).hexdigest()
        return self._digests[key]
