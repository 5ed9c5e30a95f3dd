"""What travels with one try of a request on one arm: the `Attempt`.

`Dispatch` builds one per arm it asks (the route's arm, its fallback, a shadow copy); the arm that
answers (`LocalServing` for this server's own models, an upstream over HTTP) reads everything from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from serving.outcome import Outcome
from serving.schemas import Sampling


@dataclass(frozen=True)
class Prompt:
    """What a local arm decodes for a request: its prompts (text, or token ids), and the chat messages
    ({index, role}) that the model's template left out."""

    prompts: list[str | list[int]]
    dropped: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Attempt:
    """One request as one arm sees it: the parsed body, how its prompt reads, its accounting and its clock."""

    request: Request | None  # None: a shadow copy, which has no client to hang up
    endpoint: str  # "completions" or "chat"
    body: Sampling
    prompt_of: Callable[[Any], Prompt]  # the prompts for the route that answers (chat renders its template)
    max_tokens: int | None
    outcome: Outcome | None = None  # this attempt's log row and metrics; set per attempt
    limit_s: float = 0.0  # the arm's timeout within the server's, from the request's arrival
    routed: tuple[str, str] | None = None  # (route, arm) when `--routes` routed it, or `--route` names them
    retry_of: str | None = None  # the arm that failed, when this attempt answers for it
    on_text: Callable[[str], None] | None = None  # a stream: called with its whole text once complete

    def stamp(self) -> dict[str, Any]:
        """What an answer's `unmask` object says of its routing: route, arm, retry_of (empty when not routed)."""
        if self.routed is None:
            return {}
        return {"route": self.routed[0], "arm": self.routed[1], "retry_of": self.retry_of}
