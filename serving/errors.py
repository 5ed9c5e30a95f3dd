"""Every refusal as an OpenAI-style error body naming the field, and the request-size guard.

`{"error": {"message", "type", "param", "code"}}` is what OpenAI clients parse into their
exceptions (`BadRequestError.body`, `.param`). Validation errors name the field by its path in the
body (`unmask.steps`, `messages.0.role`); malformed JSON names `body`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.decoding import RequestError

TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object; also what a stream sends when it fails after its first byte."""
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def server_fault(exc: BaseException) -> JSONResponse:
    """The 500 of our own fault: its type, never its message (which may hold internals)."""
    return error_response(
        500, f"the server failed on this request ({type(exc).__name__}); it keeps serving", None, "server_error"
    )


def field_of(loc: tuple[Any, ...]) -> str:
    """`("body", "unmask", "steps")` -> `unmask.steps`; a union's branch names (`str`, `list[str]`) are dropped."""
    parts = [str(p) for p in loc[1:] if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float")))]
    return ".".join(parts) or "body"


def validation_message(error: dict[str, Any]) -> tuple[str, str]:
    kind, field = error.get("type", ""), field_of(tuple(error.get("loc", ())))
    if kind == "json_invalid":
        loc = tuple(error.get("loc", ()))
        at = f" at character {loc[1]}" if len(loc) > 1 and isinstance(loc[1], int) else ""
        return "body", f"body is not valid JSON: {error.get('ctx', {}).get('error', error.get('msg'))}{at}"
    if kind == "extra_forbidden":
        return field, f"{field}: unknown field (not an accepted parameter of this endpoint)"
    if kind == "missing" and field == "body":
        return "body", "body: a JSON object is required"
    return field, f"{field}: {error.get('msg', 'invalid')} (got {error.get('input')!r:.80})"


def install(app: FastAPI, count: Callable[[str, int, str, str], None]) -> None:
    """Error handlers that answer 4xx with the field named, and 500 only for our own faults.

    `count(path, status, code, message)` hears of each refusal made before a request reached its
    handler (the handler counts and logs its own, with the model it had resolved).
    """

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        param, message = validation_message(errors[0]) if errors else ("body", "invalid request")
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
        count(request.url.path, 400, "invalid_value", message)
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return error_response(exc.status, exc.message, exc.param, exc.code, headers)

    @app.exception_handler(Exception)
    async def fault(request: Request, exc: Exception) -> JSONResponse:
        return server_fault(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and exc.detail == FASTAPI_PARSE_ERROR:  # FastAPI names nothing: say what, where
            message = unparsable(await request.body())
            count(request.url.path, 400, "invalid_json", message)
            return error_response(400, message, "body", "invalid_json")
        count(request.url.path, exc.status_code, "http_error", str(exc.detail))
        return error_response(exc.status_code, str(exc.detail), None, "http_error", getattr(exc, "headers", None))


FASTAPI_PARSE_ERROR = "There was an error parsing the body"  # FastAPI's words for any body its JSON decoding failed on


def unparsable(body: bytes) -> str:
    """Why a body sent as JSON could not be parsed, naming the byte, the depth or the value: the cases FastAPI
    reports only as "an error parsing the body" (bytes that are not UTF-8, nesting past the parser's recursion,
    an integer too long to convert)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"body is not valid UTF-8: byte 0x{body[e.start]:02x} at offset {e.start}"
    try:
        json.loads(text)
    except RecursionError:
        return f"body nests arrays or objects {nesting(text)} levels deep, past what the parser follows"
    except json.JSONDecodeError as e:
        return f"body is not valid JSON: {e}"
    except ValueError as e:  # an integer past Python's digit limit for converting text
        digits = re.search(r"value has (\d+) digits", str(e))
        length = digits.group(1) if digits else "too many"
        return f"body holds an integer of {length} digits, past what the parser converts"
    return "body could not be parsed as JSON"


def nesting(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text (brackets inside strings do not count)."""
    deepest = depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


class BodyLimit:
    """ASGI middleware: a body above `max_bytes` is a 413 before anything parses it (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int, count: Callable[[str, int, str, str], None]):
        self.app, self.max_bytes, self.count = app, max_bytes, count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._too_large(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"body is larger than this server's limit of {self.max_bytes} bytes"
        self.count(scope.get("path", ""), 413, "body_too_large", message)
        response = error_response(413, message, "body", "body_too_large")
        await response(scope, receive, send)


class _TooLarge(Exception):
    pass
