"""Chat messages to a prompt: the model's own `chat_template` (tokenizer_config.json), rendered in a sandbox.

The template is Jinja, as Hugging Face tokenizers carry it, rendered with Jinja's immutable sandbox
(a template is data from a model folder, not code we trust). A model without one has no chat: its
`ChatTemplate` refuses to render with a 400 (a guessed prompt format would answer something else than
the client asked). A template may leave messages out (unmask's tiny models read only the last user
turn): `Rendered.dropped` names each message whose text is not in the prompt, and the answer says so.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

NO_TEMPLATE = "none"  # a model folder without a chat template


class ChatTemplateError(ValueError):
    """A template that cannot be read or rendered, or a model without one; the message names the file."""


@dataclass(frozen=True)
class Rendered:
    """A chat rendered to a prompt, and the messages (index, role) the template left out of it."""

    text: str
    dropped: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # "tokenizer_config.json" of the model folder, or "none"
    text: str | None

    @property
    def reads_tools(self) -> bool:
        """Whether the template does anything with `tools` (Hugging Face templates that support tools read it)."""
        return bool(self.text and "tools" in self.text)

    def render(self, messages: list[dict[str, Any]]) -> str:
        if self.text is None:
            raise ChatTemplateError(
                "this model has no chat template (tokenizer_config.json has no chat_template); "
                "use /v1/completions with a prompt"
            )
        try:
            return _compiled(self.text).render(messages=messages, add_generation_prompt=True)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template of {self.source} failed: {e}") from None

    def render_chat(self, messages: list[dict[str, Any]]) -> Rendered:
        """The prompt of `messages` (OpenAI's `developer` role reaches the template as `system`), and what it
        dropped."""
        shown = [m | {"role": "system"} if m["role"] == "developer" else m for m in messages]
        text = self.render(shown)
        dropped = [
            {"index": i, "role": m["role"]}
            for i, m in enumerate(messages)
            if (m.get("content") or "").strip() and m["content"].strip() not in text
        ]
        return Rendered(text, dropped)


@functools.lru_cache(maxsize=32)
def _compiled(text: str) -> Template:
    """Compile once per template, not once per request."""
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)


def chat_template(folder: Path | None) -> ChatTemplate:
    """The folder's `chat_template` (a string, or the "default" or first of a list of named ones), else none."""
    path = folder / "tokenizer_config.json" if folder is not None else None
    if path is None or not path.is_file():
        return ChatTemplate(NO_TEMPLATE, None)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ChatTemplateError(f"{path}: unreadable ({e})") from None
    template = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(template, list):  # [{name, template}, ...]: "default" first, else the first one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None:
        return ChatTemplate(NO_TEMPLATE, None)
    if not isinstance(template, str):
        raise ChatTemplateError(f"{path}: chat_template must be a string or a list of {{name, template}}")
    return ChatTemplate(path.name, template)  # the file's name, not its path: /v1/models shows no local paths
