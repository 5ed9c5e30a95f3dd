"""OpenAI's request surface as unmask's local models answer it: every parameter, what unmask does with it,
and the values a model cannot honour.

`PARAMETERS` is one entry per documented parameter of completions and chat completions (the table in
docs/serving.md is this one, and a test keeps the two and the request schemas in step). A parameter is
honoured, or accepted at its neutral value; `check_surface` (called by `LocalServing.parse`, once the
effective config is known) refuses any other value with a 400 naming the parameter and why. An upstream arm
is not checked here: it gets what the client sent and answers for itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sampler.config import SamplerConfig
from sampler.decode import is_deterministic
from serving.decoding import RequestError
from serving.schemas import ChatCompletionRequest, Sampling


@dataclass(frozen=True)
class Served:
    """What a parameter's check may read: the effective config, the model's kind and its chat template."""

    config: SamplerConfig
    kind: str
    template_reads_tools: bool


# (value, body, served) -> why it cannot be honoured, or None. The body is the endpoint's request model
# (serving.schemas); a check reads the fields of the endpoints its parameter belongs to.
Check = Callable[[Any, Any, Served], "str | None"]


def honoured(value: Any, body: Any, served: Served) -> None:
    return None


def _unset_or(*neutral: object) -> Check:
    def check(value: Any, body: Any, served: Served) -> str | None:
        return None if value is None or value in neutral else "no other value is supported"

    return check


def _top_p(value: Any, body: Any, served: Served) -> str | None:
    if value is None or value == 1.0 or is_deterministic(served.config):
        return None  # temperature 0 takes the argmax, which every nucleus holds
    return "nucleus sampling is not implemented by unmask's sampler; use top_p 1, or temperature 0"


def _penalty(value: Any, body: Any, served: Served) -> str | None:
    return None if not value else "repetition penalties are not implemented by unmask's sampler; use 0"


def _logit_bias(value: Any, body: Any, served: Served) -> str | None:
    return None if not value else "logit bias is not implemented by unmask's sampler; send none"


def _best_of(value: Any, body: Any, served: Served) -> str | None:
    n = body.choices_per_prompt()
    if value is None or value == n:
        return None
    if value < n:
        return f"best_of must be at least n ({n})"
    return "choosing the best of several samples (ranking them by log-likelihood) is not implemented; use n"


def _stream_options(value: Any, body: Any, served: Served) -> str | None:
    return None if value is None or body.stream else "stream_options is only read when stream is true (as OpenAI says)"


def _suffix(value: Any, body: Any, served: Served) -> str | None:
    return None if not value else "insertion after the answer (suffix) is not supported yet"


def _tools(value: Any, body: Any, served: Served) -> str | None:
    if not value:
        return None
    if not served.template_reads_tools:
        return "the model's chat template has no tool support"
    return "tool calls are not parsed from answers yet"


def _tool_choice(value: Any, body: Any, served: Served) -> str | None:
    if value is None or value == "none" or (value == "auto" and not body.tools and not body.functions):
        return None
    return "no tool can be called (see tools)"


def _response_format(value: Any, body: Any, served: Served) -> str | None:
    return None if value is None or value.get("type") == "text" else 'only plain text answers ({"type": "text"})'


def _modalities(value: Any, body: Any, served: Served) -> str | None:
    return None if not value or list(value) == ["text"] else "the models answer text only"


def _store(value: Any, body: Any, served: Served) -> str | None:
    return None if not value else "unmask keeps no completions (its request log holds metadata only)"


def _not_set(why: str) -> Check:
    def check(value: Any, body: Any, served: Served) -> str | None:
        return None if value is None else why

    return check


@dataclass(frozen=True)
class Parameter:
    name: str
    endpoints: tuple[str, ...]
    does: str  # what unmask does with it: the docs table's text
    refuse: Check = honoured


BOTH, COMPLETIONS, CHAT = ("completions", "chat"), ("completions",), ("chat",)

PARAMETERS: tuple[Parameter, ...] = (
    Parameter("model", BOTH, "the served name (an alias, a registered model, or a route)"),
    Parameter(
        "prompt",
        COMPLETIONS,
        "a string, token ids, or a list of either (up to 32): one choice each (times n), decoded as a batch",
    ),
    Parameter(
        "messages",
        CHAT,
        "rendered by the model's chat template; text content parts, roles system, developer "
        "(rendered as system), user, assistant (content may be null), tool, function; what the template leaves "
        "out is named in unmask.chat_dropped",
    ),
    Parameter("max_tokens", BOTH, "answer length, bounded by the model's context (and --max-tokens when set)"),
    Parameter("max_completion_tokens", CHAT, "as max_tokens"),
    Parameter("temperature", BOTH, "sampling temperature; 0 is greedy; unset: the operating point's"),
    Parameter("top_p", BOTH, "1, or any value at temperature 0 (the argmax is in every nucleus); else 400", _top_p),
    Parameter(
        "seed",
        BOTH,
        "seeds each choice's own generator; unset and sampled: a fresh seed from the OS, reported in unmask.seeds",
    ),
    Parameter("n", BOTH, "choices per prompt (up to 16); choice k of seed s decodes with seed s + k"),
    Parameter(
        "best_of", COMPLETIONS, "unset or equal to n; larger: 400 (ranking samples is not implemented)", _best_of
    ),
    Parameter("stop", BOTH, "up to 4 strings of at most 1,000 characters each; the answer ends before the first one"),
    Parameter(
        "stream",
        BOTH,
        "server-sent events of final text only; several choices stream side by side, each chunk naming its index",
    ),
    Parameter(
        "stream_options",
        BOTH,
        "with stream only (as OpenAI); include_usage adds the usage chunk; "
        "include_obfuscation is accepted and no padding is added",
        _stream_options,
    ),
    Parameter(
        "echo",
        COMPLETIONS,
        "the prompt is sent back before the answer; with logprobs its tokens are scored "
        "(max_tokens 0: scored only), see Log-probabilities",
    ),
    Parameter(
        "logprobs",
        BOTH,
        "completions: alternatives per token (0-20); chat: true or false; each token's "
        "log-probability, see Log-probabilities (streamed: each chunk carries its tokens')",
    ),
    Parameter("top_logprobs", CHAT, "alternatives per token (0-20), with logprobs true"),
    Parameter("frequency_penalty", BOTH, "0 or unset; else 400 (no penalties in unmask's sampler)", _penalty),
    Parameter("presence_penalty", BOTH, "0 or unset; else 400", _penalty),
    Parameter("logit_bias", BOTH, "empty or unset; else 400", _logit_bias),
    Parameter("suffix", COMPLETIONS, "empty or unset; else 400 (not supported yet)", _suffix),
    Parameter("user", BOTH, "routes may match it; it keys sticky splits"),
    Parameter("metadata", BOTH, "string tags (up to 16); routes may match them"),
    Parameter("response_format", CHAT, '{"type": "text"} or unset; json_object and json_schema: 400', _response_format),
    Parameter("tools", CHAT, "empty or unset; else 400 naming why (no tool template, or no tool-call parsing)", _tools),
    Parameter("tool_choice", CHAT, "none, or auto without tools; else 400", _tool_choice),
    Parameter("parallel_tool_calls", CHAT, "accepted (no tool is called)"),
    Parameter("functions", CHAT, "as tools", _tools),
    Parameter("function_call", CHAT, "as tool_choice", _tool_choice),
    Parameter("modalities", CHAT, '["text"] or unset; else 400', _modalities),
    Parameter("audio", CHAT, "unset; else 400 (text only)", _not_set("the models answer text only")),
    Parameter("prediction", CHAT, "unset; else 400", _not_set("predicted outputs are not supported")),
    Parameter("web_search_options", CHAT, "unset; else 400", _not_set("unmask's models do not search the web")),
    Parameter("reasoning_effort", CHAT, "unset or none; else 400", _unset_or("none")),
    Parameter("verbosity", CHAT, "unset or medium (the default); else 400", _unset_or("medium")),
    Parameter("moderation", CHAT, "unset; else 400", _not_set("unmask runs no moderation")),
    Parameter("store", CHAT, "false or unset; else 400", _store),
    Parameter("service_tier", CHAT, "accepted; one tier serves every request"),
    Parameter("safety_identifier", CHAT, "accepted; not used"),
    Parameter("prompt_cache_key", CHAT, "accepted; nothing is cached across requests, so answers are the same"),
    Parameter("prompt_cache_retention", CHAT, "accepted, as prompt_cache_key"),
    Parameter("prompt_cache_options", CHAT, "accepted, as prompt_cache_key"),
    Parameter("unmask", BOTH, "unmask's diffusion settings (steps, block_length, parallel, ...), below"),
)


def parameters(endpoint: str) -> dict[str, Parameter]:
    return {p.name: p for p in PARAMETERS if endpoint in p.endpoints}


def check_surface(body: Sampling, endpoint: str, served: Served) -> None:
    """RequestError (400) naming the first parameter whose value the model cannot honour, and why."""
    for name, parameter in parameters(endpoint).items():
        value = getattr(body, name, None)
        why = parameter.refuse(value, body, served)
        if why:
            raise RequestError(name, f"{name}={_short(value)}: {why}", code="unsupported_value")
    if endpoint == "chat":
        assert isinstance(body, ChatCompletionRequest), "the chat endpoint parses a ChatCompletionRequest"
        for i, message in enumerate(body.messages):
            for j, part in enumerate(message.content if isinstance(message.content, list) else []):
                if part.type not in ("text", "refusal"):
                    raise RequestError(
                        f"messages.{i}.content.{j}",
                        f"messages.{i}.content.{j}: {part.type} parts are not supported; the models read text",
                        code="unsupported_value",
                    )


def parameter_table() -> str:
    """The markdown table of docs/serving.md: each parameter, the endpoints that take it, what unmask does."""
    names = {COMPLETIONS: "completions", CHAT: "chat", BOTH: "both"}
    lines = ["| parameter | endpoint | what unmask does |", "|---|---|---|"]
    lines += [f"| `{p.name}` | {names[p.endpoints]} | {p.does} |" for p in PARAMETERS]
    return "\n".join(lines) + "\n"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
