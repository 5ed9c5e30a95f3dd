"""Chat messages to a prompt: the model's own `chat_template` (tokenizer_config.json), rendered in a sandbox.

The template is Jinja, as Hugging Face tokenizers carry it, rendered with Jinja's immutable sandbox
(a template is data from a model folder, not code we trust). A model without one gets
`DEFAULT_TEMPLATE`: the last user message as the prompt, which is what single-turn models read.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_TEMPLATE = (
    "{%- for message in messages if message.role == 'user' -%}"
    "{%- if loop.last %}{{ message.content }}{% endif -%}"
    "{%- endfor -%}"
)


class ChatTemplateError(ValueError):
    """A template that cannot be read or rendered; the message names the file."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # "<folder>/tokenizer_config.json" or "default"
    text: str

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return _compiled(self.text).render(messages=messages, add_generation_prompt=True)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template of {self.source} failed: {e}") from None


@functools.lru_cache(maxsize=32)
def _compiled(text: str):
    """Compile once per template, not once per request."""
    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(text)


def chat_template(folder: Path | None) -> ChatTemplate:
    """The folder's `chat_template` (a string, or the first of a list of named ones), else the default."""
    path = folder / "tokenizer_config.json" if folder is not None else None
    if path is None or not path.is_file():
        return ChatTemplate("default", DEFAULT_TEMPLATE)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ChatTemplateError(f"{path}: unreadable ({e})") from None
    template = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(template, list):  # [{name, template}, ...]: "default" first, else the first one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if template is None:
        return ChatTemplate("default", DEFAULT_TEMPLATE)
    if not isinstance(template, str):
        raise ChatTemplateError(f"{path}: chat_template must be a string or a list of {{name, template}}")
    return ChatTemplate(str(path), template)
