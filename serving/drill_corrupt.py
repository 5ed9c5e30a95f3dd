"""The `corrupt_share` drill fault: an arm that answers fast, with status 200, and wrong.

What a quality regression looks like from outside: latency and error rate stay fine, only the answers are
bad. The answer's text is garbled so that it can never equal the right one (every digit moved by one, every
letter rotated by 13; a text with neither gets a mark appended), so probe prompts with known answers catch it
(gates/canary.py `probe_accuracy`, `agreement`). Non-streamed answers only: a stream's bytes are out before
the whole text exists.
"""

from __future__ import annotations

import codecs
from typing import Any

MARK = "\u2047"  # ⁇: appended where nothing else could change


def garble(text: str) -> str:
    """`text` made wrong, deterministically: digits d -> (d + 1) % 10, letters rot13."""
    shifted = "".join(str((int(c) + 1) % 10) if c.isdigit() and c.isascii() else c for c in text)
    changed = codecs.encode(shifted, "rot13")
    return changed if changed != text else text + MARK


def corrupt_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A completion or chat completion body with every choice's text garbled (a new dict; the old is kept)."""
    choices = []
    for choice in body.get("choices") or []:
        if not isinstance(choice, dict):
            choices.append(choice)
        elif isinstance(choice.get("message"), dict):
            message = choice["message"]
            choices.append(choice | {"message": message | {"content": garble(message.get("content") or "")}})
        else:
            choices.append(choice | {"text": garble(choice.get("text") or "")})
    return body | {"choices": choices}
