"""Passing an upstream arm's answer on: stamped with the route and arm, streamed or whole; and shadow copies.

An upstream's answer is returned as the upstream gave it, with `unmask.route`, `unmask.arm` and
`unmask.upstream` set (a stream: on its finish chunk). `ShadowCopies` runs shadow requests in the
background, at most `limit` at once; the rest are dropped and counted, so shadows never queue up
behind each other or hold a primary answer back.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from serving import errors
from serving.outcome import Outcome
from serving.streaming import DONE, event

log = logging.getLogger("unmask.serve")


def answer_text(body: dict[str, Any]) -> str | None:
    """The text of a completion or chat completion body's first choice."""
    choices = body.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    if "message" in first:
        return (first.get("message") or {}).get("content")
    return first.get("text")


def upstream_payload(body: BaseModel) -> dict[str, Any]:
    """What an upstream is sent: the fields the client set, `unmask` settings included, and nothing more (the
    arm adds its own `model`); a default the client left out is the upstream's to choose."""
    return body.model_dump(exclude_unset=True, exclude={"model"})


def stamped(body: dict[str, Any], stamp: dict[str, Any]) -> dict[str, Any]:
    return body | {"unmask": (body.get("unmask") or {}) | stamp}


def upstream_facts(body: dict[str, Any]) -> dict[str, Any]:
    """What the log keeps of an upstream answer: its usage, and the version an unmask upstream names."""
    usage = body.get("usage") or {}
    extension = body.get("unmask") or {}
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "nfe": extension.get("nfe"),
        "batch_size": extension.get("batch_size"),
        "queue_s": extension.get("queue_s"),
        "first_block_s": extension.get("first_block_s"),
    }


def relay_stream(
    first: str,
    lines: AsyncIterator[str],
    closing: Callable[[], Awaitable[None]],
    stamp: dict[str, Any],
    outcome: Outcome,
    timeout_s: float,
    on_text: Callable[[str], None] | None = None,
) -> StreamingResponse:
    """An upstream's server-sent events passed on line by line, the finish chunk stamped; the outcome recorded."""
    seen: dict[str, Any] = {"text": [], "usage": {}}

    def restamp(line: str) -> str:
        if not line.startswith("data: ") or line.strip() == "data: [DONE]":
            return line
        try:
            chunk = json.loads(line[6:])
        except json.JSONDecodeError:
            return line
        choices = chunk.get("choices") or []
        if choices and isinstance(choices[0], dict):
            piece = choices[0].get("text") or (choices[0].get("delta") or {}).get("content")
            if piece:
                seen["text"].append(piece)
            if choices[0].get("finish_reason"):
                chunk = stamped(chunk, stamp)
        if chunk.get("usage"):
            seen["usage"] = chunk["usage"]
        return "data: " + json.dumps(chunk, separators=(",", ":"))

    async def events() -> AsyncIterator[bytes]:
        try:
            outcome.first_byte()
            yield (restamp(first) + "\n").encode()
            while True:
                try:
                    line = await asyncio.wait_for(anext(lines), max(timeout_s - outcome.elapsed(), 0.0))
                except StopAsyncIteration:
                    break
                if line.strip() == "data: [DONE]":  # complete: a client that leaves after it is not a 499
                    outcome.answered(upstream_facts({"usage": seen["usage"]}))
                    if on_text:
                        on_text("".join(seen["text"]))
                yield (restamp(line) + "\n").encode()
            if not outcome.recorded:  # an upstream that ends without [DONE]
                outcome.answered(upstream_facts({"usage": seen["usage"]}))
        except Exception as e:
            message = f"upstream stream failed after its first byte ({type(e).__name__})"
            log.error("%s: %s", stamp.get("arm"), message)
            outcome.failed(502, "upstream_error", message)
            yield event(errors.error_body(502, message, None, "upstream_error"))
            yield DONE
        finally:
            await closing()
            if not outcome.recorded:
                outcome.failed(499, "client_closed", "the client closed the connection mid-stream")

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


class ShadowCopies:
    """Background shadow requests, at most `limit` in flight; `start()` returns False when one was dropped."""

    def __init__(self, limit: int):
        self.limit = limit
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, copy: Coroutine[Any, Any, None]) -> bool:
        if len(self.tasks) >= self.limit:
            copy.close()  # never awaited: close the coroutine so it is not reported as forgotten
            return False
        task = asyncio.get_running_loop().create_task(copy)
        self.tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.tasks.discard)
        return True

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
