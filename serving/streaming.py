"""Streaming (`stream: true`): committed text as server-sent events in OpenAI's chunk format.

The batcher hands a streamed request each run of its tokens that no later step can change
(`sampler.output.FinalPrefix`: a masked-diffusion model's finished blocks, an autoregressive
model's tokens as they come). `CommittedText` turns them into text that the finished answer is
certain to start with: it stops at a stop id or stop sequence exactly where the non-streamed
answer stops, and holds back a tail that could still be the start of a stop sequence. At the end
the finished answer (`serving.decoding.choice_of`, the same as without streaming) supplies what is
left, so the concatenated chunks are the non-streamed text, byte for byte.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sampler.handle import Handle
from serving.batching import Decoded, Scored
from serving.decoding import cut_at_stop
from serving.logprobs import chat_logprobs, completion_logprobs

DONE = b"data: [DONE]\n\n"
Arrival = tuple[list[int], list[Scored] | None]  # a run of final tokens, and their scores when asked


def event(data: dict[str, Any]) -> bytes:
    """One server-sent event carrying `data` as JSON."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def unsafe_tail(text: str, stops: list[str]) -> int:
    """Where the longest tail of `text` that is a proper prefix of a stop sequence starts (len(text): none)."""
    longest = max((len(s) for s in stops), default=1) - 1
    for start in range(max(0, len(text) - longest), len(text)):
        tail = text[start:]
        if any(s.startswith(tail) for s in stops):
            return start
    return len(text)


class CommittedText:
    """The answer's text as its final tokens arrive: only what the finished answer will also start with."""

    def __init__(self, handle: Handle, keep: int, stops: list[str]):
        self.handle, self.keep, self.stops = handle, keep, stops
        self.tokens: list[int] = []
        self.sent = ""
        self.complete = False  # the text is settled: a stop, or `keep` tokens

    def add(self, tokens: list[int]) -> str:
        """The new text that may be sent now that `tokens` (the next final ones) are known; maybe ''."""
        if self.complete:
            return ""
        self.tokens.extend(tokens)
        tokens = self.tokens[: self.keep]
        useful = self.handle.useful_length(tokens)
        text = self.handle.decode(tokens[:useful])
        settled = useful < len(tokens) or len(tokens) >= self.keep  # a stop id, or every token it may keep
        cut, stopped = cut_at_stop(text, self.stops)
        # Unsettled, a stop sequence may yet begin in the unsafe tail, and such a one would cut before
        # a stop found now if it begins earlier; a found stop is final only when no such tail precedes it.
        tail = len(text) if settled else unsafe_tail(text, self.stops)
        self.complete = settled or (stopped and len(cut) <= tail)
        if self.complete:
            text = cut
        else:  # an unfinished multi-byte character decodes to U+FFFD until its last byte comes
            text = text[: min(tail, len(cut))].rstrip("\ufffd")
        if not text.startswith(self.sent):  # a tokenizer whose decode is not prefix-stable here: wait for the end
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def finish(self, text: str) -> str:
        """What is left to send of the finished answer `text`. ValueError if something sent was not in it."""
        if not text.startswith(self.sent):
            raise ValueError(f"streamed {self.sent!r}, which the finished answer {text!r} does not start with")
        delta, self.sent, self.complete = text[len(self.sent) :], text, True
        return delta


class RowFeed:
    """What the batcher tells one streamed request: runs of final tokens (with their scores, when it asked for
    log-probabilities), then its future's outcome."""

    def __init__(self) -> None:
        self.tokens: asyncio.Queue[Arrival] = asyncio.Queue()
        self.future: asyncio.Future[Decoded] | None = None  # set once the row is queued (LocalServing.submit)

    def put(self, tokens: list[int], scored: list[Scored] | None = None) -> None:
        self.tokens.put_nowait((tokens, scored))

    async def next(self) -> Arrival | None:
        """The next run of final tokens and their scores; None once decoding is over (read `future` then)."""
        if not self.tokens.empty():
            return self.tokens.get_nowait()
        assert self.future is not None, "read only once its row is queued, which sets the future"
        if self.future.done():
            return None
        getter = asyncio.ensure_future(self.tokens.get())
        either: set[asyncio.Future[Any]] = {getter, self.future}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        return None if self.tokens.empty() else self.tokens.get_nowait()


class Chunks:
    """The OpenAI chunk bodies of one streamed answer (`text_completion` or `chat.completion.chunk`)."""

    def __init__(self, endpoint: str, request_id: str, created: int, model: str, fingerprint: str):
        self.chat = endpoint == "chat"
        self.head = {
            "id": request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }

    def _choice(
        self,
        text: str | None,
        finish_reason: str | None,
        index: int,
        role: bool = False,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            delta = ({"role": "assistant", "content": ""} if role else {}) | ({"content": text} if text else {})
            return {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        return {"index": index, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}

    def opening(self, index: int = 0) -> dict[str, Any]:
        """Chat: the first delta of a choice, carrying the role. Completions: an empty text."""
        return self.head | {"choices": [self._choice(None, None, index, role=self.chat)]}

    def text(self, text: str, index: int = 0, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.head | {"choices": [self._choice(text, None, index, logprobs=logprobs)]}

    def finish(
        self,
        finish_reason: str,
        extension: dict[str, Any] | None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A choice's last chunk (with the scores no text chunk carried); the request's last one also carries the
        `unmask` object."""
        body = self.head | {"choices": [self._choice(None, finish_reason, index, logprobs=logprobs)]}
        return body | {"unmask": extension} if extension is not None else body

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        """`stream_options.include_usage`: the last chunk, no choices, the request's usage."""
        return self.head | {"choices": [], "usage": usage}


class StreamedScores:
    """The log-probabilities of one streamed choice, each token's sent with the chunk whose text completes it;
    the finished answer's `logprobs` supplies the rest (the stop id, a tail a stop sequence cut), so the chunks'
    logprobs put together are the non-streamed answer's, entry for entry."""

    def __init__(self, handle: Handle, keep: int, chat: bool, top: int):
        self.handle, self.keep, self.chat, self.top = handle, keep, chat, top
        self.tokens: list[int] = []
        self.scored: list[Scored] = []
        self.sent = 0  # tokens whose scores went out
        self.offset = 0  # completions: characters of the answer before the next token's text_offset

    def add(self, tokens: list[int], scored: list[Scored] | None) -> None:
        self.tokens.extend(tokens)
        self.scored.extend(scored or [(None, {})] * len(tokens))

    def covered(self, text: str) -> dict[str, Any] | None:
        """The `logprobs` of the tokens `text` (the answer as sent so far) now spells out whole, not sent yet."""
        tokens = self.tokens[: self.keep]
        useful, end = self.handle.useful_length(tokens), self.sent
        while end < useful and text.startswith(self.handle.decode(tokens[: end + 1])):
            end += 1
        if end == self.sent:
            return None
        start, self.sent = self.sent, end
        if self.chat:
            return chat_logprobs(self.handle, tokens[start:end], self.scored[start:end], end - start, self.top)
        part = completion_logprobs(self.handle, tokens[start:end], self.scored[start:end], end - start, self.top, None)
        part["text_offset"] = [self.offset + at for at in part["text_offset"]]
        self.offset += sum(len(t) for t in part["tokens"])
        return part

    def rest(self, final: dict[str, Any] | None) -> dict[str, Any] | None:
        """What the finished answer's `logprobs` holds beyond the entries already sent (None: nothing)."""
        if final is None:
            return None
        if self.chat:
            left = final["content"][self.sent :]
            return {"content": left, "refusal": None} if left else None
        left_tokens = final["tokens"][self.sent :]
        return {key: values[self.sent :] for key, values in final.items()} if left_tokens else None
