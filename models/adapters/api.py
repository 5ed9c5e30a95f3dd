"""Hosted models (Mercury and friends) and other servers: evaluable at the text level once a key is configured.

An API entry is text in, text out, over an OpenAI-compatible `/chat/completions` endpoint (a hosted
Mercury, vLLM or SGLang serving a dLLM, another `unmask serve`). `unmask eval` measures it through
`evals.loadtest` (quality on the task suite, latency, TTFB, errors); token-level metrics (NFE, tokens
per forward) are not applicable and recorded as None. Without the key variable the entry names, the
adapter says so plainly, naming the variable, instead of failing mid-run.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from models.adapters.base import AdapterError, NotEvaluable
from models.catalog import CatalogEntry


class APIAdapter:
    """A hosted OpenAI-compatible model: text in, text out; it has no token ids, weights or sampler."""

    kind = "api"
    path = None
    eos_ids: tuple[int, ...] = ()
    weights_sha256 = ""
    card: dict[str, Any] = {}

    def __init__(self, entry: CatalogEntry, timeout_s: float = 60.0):
        self.entry, self.entry_id, self.timeout_s = entry, entry.id, timeout_s

    def status(self) -> tuple[bool, str]:
        return self.entry.api_status()

    @property
    def base_url(self) -> str:
        return self.entry.source.location

    @property
    def api_model(self) -> str:
        return self.entry.api_model or self.entry_id

    def api_key(self) -> str:
        """The key from the environment variable the entry names; NotEvaluable naming the variable when unset."""
        return self._key()

    def _key(self) -> str:
        evaluable, reason = self.status()
        if not evaluable:
            raise NotEvaluable(f"model '{self.entry_id}' is {reason}")
        assert self.entry.api_key_env is not None, "api_status is evaluable only with a key variable named"
        return os.environ[self.entry.api_key_env]

    def complete(self, prompt: str, max_tokens: int = 256, temperature: float = 0.0) -> str:
        """One chat completion; the reply text."""
        key = self._key()
        body = json.dumps(
            {
                "model": self.entry.api_model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "temperature": temperature,
            }
        ).encode()
        request = urllib.request.Request(
            f"{self.entry.source.location}/chat/completions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read())
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as e:
            raise AdapterError(f"model '{self.entry_id}': {self.entry.source} did not answer ({e})") from None
        try:
            content: str = reply["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise AdapterError(f"model '{self.entry_id}': unexpected reply shape from {self.entry.source}") from None
        return content

    def encode(self, text: str) -> list[int]:
        raise NotEvaluable(f"model '{self.entry_id}' is an API model: it takes text, not token ids; use complete()")

    decode = encode

    def sampler_ids(self) -> dict[str, int | None]:
        raise NotEvaluable(
            f"model '{self.entry_id}' is an API model: unmask's samplers decode token ids, "
            "an API model answers text through complete()"
        )

    def status_or_raise(self) -> None:
        """NotEvaluable, saying why, unless an endpoint and key are configured."""
        self._key()
