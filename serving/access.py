"""Who may call the API and what each call is named: API keys and request ids, as ASGI middleware.

Keys come from a file (`--api-key-file`: one key a line, `#` comments and blank lines skipped) and/or
`$UNMASK_API_KEYS` (comma-separated). When any is configured, every `/v1/...` request needs
`Authorization: Bearer <key>` (else 401, OpenAI's `invalid_api_key`); `/health` and `/metrics` stay open
for probes and scrapers. A key is compared in constant time and never logged or echoed.

Controllers get keys of their own, `$UNMASK_ANALYSIS_KEYS` (comma-separated, 8 characters or more): valid only
on the canary analysis (`/v1/unmask/analysis...`), sent as `Authorization: Bearer <key>` (Argo Rollouts' web
provider, its `headers` read from a Secret) or as `?token=<key>` on the URL (Flagger's webhooks have no
headers). With analysis keys set the analysis needs one (or an API key) even where the rest of the API is open.
The server logs no URL, so a token in one is written nowhere.

`X-Request-Id` is accepted (printable, up to 128 characters), else one is made; it is echoed on the
response and written to the request log row.
"""

from __future__ import annotations

import hmac
import os
import re
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving import errors

KEYS_ENV = "UNMASK_API_KEYS"
ANALYSIS_KEYS_ENV = "UNMASK_ANALYSIS_KEYS"
ANALYSIS_PATH = "/v1/unmask/analysis"
REQUEST_ID = b"x-request-id"
_GOOD_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


class ApiKeyError(ValueError):
    """Keys that cannot be read; the message names the file or variable, never a key."""


def _listed(name: str, environ: Mapping[str, str] | None) -> frozenset[str]:
    """The comma-separated keys of the variable `name`."""
    environ = os.environ if environ is None else environ
    return frozenset(k.strip() for k in environ.get(name, "").split(",") if k.strip())


def load_api_keys(path: Path | None, environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The configured keys: those in `path` and in $UNMASK_API_KEYS; empty: the API is open."""
    keys = set(_listed(KEYS_ENV, environ))
    if path is not None:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as e:
            raise ApiKeyError(f"--api-key-file {path}: cannot be read ({e.strerror or type(e).__name__})") from None
        found = {line.strip() for line in lines if line.strip() and not line.strip().startswith("#")}
        if not found:
            raise ApiKeyError(f"--api-key-file {path}: no key in it (one key a line)")
        keys |= found
    if any(len(k) < 8 or any(c.isspace() for c in k) for k in keys):
        raise ApiKeyError(f"an API key (from {path or KEYS_ENV}) is shorter than 8 characters or holds whitespace")
    return frozenset(keys)


def load_analysis_keys(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The controllers' keys, $UNMASK_ANALYSIS_KEYS; empty: the analysis is open as the rest of the API is."""
    keys = _listed(ANALYSIS_KEYS_ENV, environ)
    if any(len(k) < 8 or any(c.isspace() or c in "&#%" for c in k) for k in keys):
        raise ApiKeyError(f"a key in {ANALYSIS_KEYS_ENV} is shorter than 8 characters or holds whitespace, & # or %")
    return frozenset(keys)


def request_id_of(request: Request | None) -> str | None:
    """The id the middleware gave this request (None for a shadow copy, which has no request)."""
    rid: str | None = None if request is None else request.scope.get("state", {}).get("request_id")
    return rid


class Access:
    """ASGI middleware: the request id on every HTTP request; with keys configured, a key on every /v1/ path."""

    def __init__(
        self,
        app: ASGIApp,
        keys: frozenset[str],
        count: Callable[[str, int, str, str], None],
        analysis_keys: frozenset[str] = frozenset(),
    ):
        self.app, self.keys, self.count = app, [k.encode() for k in keys], count
        self.analysis_keys = [k.encode() for k in analysis_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = headers.get(REQUEST_ID, b"").decode("latin-1")
        rid = given if _GOOD_ID.match(given) else f"req-{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = rid

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REQUEST_ID, rid.encode())]}
            await send(message)

        if not self._admitted(scope.get("path", ""), headers, scope.get("query_string", b"")):
            message = "a valid API key is required: send Authorization: Bearer <key>"
            self.count(scope.get("path", ""), 401, "invalid_api_key", message)
            response = errors.error_response(
                401, message, None, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
            return await response(scope, receive, named)
        await self.app(scope, receive, named)

    def _admitted(self, path: str, headers: dict[bytes, bytes], query: bytes) -> bool:
        """Whether the request may pass: open paths, else an API key, else (analysis only) an analysis key."""
        analysis = path.startswith(ANALYSIS_PATH)
        if not path.startswith("/v1/") or not (self.keys or (analysis and self.analysis_keys)):
            return True
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        bearer = key.strip() if scheme.lower() == b"bearer" else b""
        controllers = self.analysis_keys if analysis else []
        # the URL is read for a token only on the analysis, where a controller may send one there
        token = (
            next((v for k, _, v in (p.partition(b"=") for p in query.split(b"&")) if k == b"token"), b"")
            if analysis
            else b""
        )
        # every key compared: no early exit on a match
        matches = [hmac.compare_digest(bearer, k) for k in (*self.keys, *controllers)]
        return any([*matches, *(hmac.compare_digest(token, k) for k in controllers)])
