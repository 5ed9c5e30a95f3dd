"""Registry events to configured webhook URLs: HMAC-signed, in chain order, retried with backoff, logged.

The webhooks file (`$UNMASK_WEBHOOKS`, else `<state>/webhooks.yaml`):

    webhooks:
      - name: deploy-pipeline                 # letters, digits, - and _: names its cursor
        url: http://127.0.0.1:9000/unmask     # receives one POST per event, JSON (registry.events.Event)
        secret_env: DEPLOY_HOOK_SECRET        # the variable holding the HMAC secret (required)
        types: [alias.moved, canary.failed]   # optional: only these event types (default: every one)

Each webhook has a cursor (`<state>/events/<name>.json`: the `seq` of the last event its receiver took with a 2xx).
The audit chain is the outbox: a receiver that is down keeps its cursor where it was, and the next delivery starts
there, so every event reaches it, in order, and once it answered 2xx never again. An event answered otherwise is
retried with exponential backoff (`attempts`, `backoff_s`); after the last attempt that webhook stops for this run
(a later event must not overtake it). Every attempt is a line of `<state>/events/deliveries.jsonl`.

Each POST carries `Unmask-Event-Id` (the entry's chain hash: dedupe on it), `Unmask-Event-Type` and
`Unmask-Signature: t=<unix seconds>,sha256=<hex>`, the HMAC-SHA256 of `<t>.<body>` under the secret;
`verify_signature` is the receiver's side.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from models.state import state_dir
from registry.events import TYPES, Event, EventReader
from registry.store import Registry

WEBHOOKS_ENV = "UNMASK_WEBHOOKS"
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SIGNATURE_HEADER = "Unmask-Signature"
TOLERANCE_S = 300  # a receiver refuses a signature older than this (a replayed body)


class WebhookError(ValueError):
    """A webhooks file that cannot be used: names the file, the entry and what is wrong."""


@dataclass(frozen=True)
class Webhook:
    name: str
    url: str
    secret_env: str
    types: tuple[str, ...] = ()  # empty: every type

    def secret(self) -> bytes:
        value = os.environ.get(self.secret_env, "")
        if not value:
            raise WebhookError(f"webhook {self.name}: ${self.secret_env} is not set (it holds the HMAC secret)")
        return value.encode()

    def wants(self, event: Event) -> bool:
        return not self.types or event.type in self.types


def webhooks_path() -> Path:
    return Path(os.environ.get(WEBHOOKS_ENV) or state_dir(create=False) / "webhooks.yaml")


def load_webhooks(path: Path | None = None) -> list[Webhook]:
    """The configured webhooks ([] when the file does not exist); WebhookError names a malformed entry."""
    path = path or webhooks_path()
    if not path.exists():
        return []
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise WebhookError(f"{path}: not YAML ({e})".splitlines()[0]) from None
    entries = data.get("webhooks") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise WebhookError(f"{path}: expected a `webhooks:` list of {{name, url, secret_env}}")
    hooks: list[Webhook] = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: webhook {i}"
        if not isinstance(entry, dict):
            raise WebhookError(f"{where}: expected a mapping with name, url, secret_env")
        name, url, secret = (str(entry.get(k) or "") for k in ("name", "url", "secret_env"))
        if not NAME.match(name):
            raise WebhookError(f"{where}: name {name!r} must be 1-64 letters, digits, - or _")
        if not url.startswith(("http://", "https://")):
            raise WebhookError(f"{where} ({name}): url {url!r} must start with http:// or https://")
        if not secret:
            raise WebhookError(f"{where} ({name}): secret_env names the variable holding its HMAC secret")
        types = entry.get("types") or []
        unknown = [t for t in types if t not in TYPES.values()]
        if not isinstance(types, list) or unknown:
            raise WebhookError(
                f"{where} ({name}): unknown event type {unknown[:1]}; known: {', '.join(TYPES.values())}"
            )
        if any(h.name == name for h in hooks):
            raise WebhookError(f"{where}: name {name!r} is used twice (each webhook keeps its own cursor)")
        hooks.append(Webhook(name, url, secret, tuple(types)))
    return hooks


def sign(secret: bytes, body: bytes, at: int | None = None) -> str:
    """The `Unmask-Signature` header value for `body`: `t=<unix seconds>,sha256=<hex HMAC of "<t>.<body>">`."""
    at = int(time.time()) if at is None else at
    mac = hmac.new(secret, f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},sha256={mac}"


def verify_signature(secret: bytes, header: str, body: bytes, now: float | None = None) -> bool:
    """Whether `header` signs `body` under `secret` within TOLERANCE_S of `now` (the receiver's check)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    if not parts.get("t", "").isdigit() or "sha256" not in parts:
        return False
    at = int(parts["t"])
    if abs((time.time() if now is None else now) - at) > TOLERANCE_S:
        return False
    return hmac.compare_digest(sign(secret, body, at), header)


def events_dir() -> Path:
    folder = state_dir() / "events"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cursor(hook: Webhook) -> int:
    """The seq of the last event `hook`'s receiver took (0: none yet)."""
    path = events_dir() / f"{hook.name}.json"
    if not path.exists():
        return 0
    try:
        return int(json.loads(path.read_text())["seq"])
    except (ValueError, KeyError, TypeError):
        raise WebhookError(
            f"{path}: the cursor of webhook {hook.name} is unreadable; remove it to resend every event"
        ) from None


def _advance(hook: Webhook, event: Event) -> None:
    path = events_dir() / f"{hook.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"seq": event.seq, "id": event.id, "at": datetime.now(UTC).isoformat()}))
    tmp.replace(path)  # whole or not at all: a crash resends the last event (same id), never skips one


def _log(hook: Webhook, event: Event, attempt: int, outcome: str) -> None:
    line = {
        "at": datetime.now(UTC).isoformat(),
        "webhook": hook.name,
        "url": hook.url,
        "seq": event.seq,
        "id": event.id,
        "type": event.type,
        "attempt": attempt,
        "outcome": outcome,
    }
    with (events_dir() / "deliveries.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


@dataclass
class Delivery:
    """What one delivery run did for one webhook."""

    webhook: str
    delivered: int = 0
    skipped: int = 0  # not of the webhook's types (the cursor moves past them)
    failed: str = ""  # the last failure that stopped it ("" when it reached the end of the chain)


def deliver(
    registry: Registry,
    hooks: list[Webhook] | None = None,
    attempts: int = 4,
    backoff_s: float = 0.5,
    timeout_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Delivery]:
    """Send each webhook the events after its cursor, in chain order; see the module's docstring."""
    hooks = load_webhooks() if hooks is None else hooks
    reader = EventReader(registry)
    done = []
    with httpx.Client(timeout=timeout_s) as client:
        for hook in hooks:
            done.append(_deliver_one(client, reader, hook, attempts, backoff_s, sleep))
    return done


def _deliver_one(
    client: httpx.Client,
    reader: EventReader,
    hook: Webhook,
    attempts: int,
    backoff_s: float,
    sleep: Callable[[float], None],
) -> Delivery:
    secret, result = hook.secret(), Delivery(hook.name)
    for event in reader.since(cursor(hook)):
        if not hook.wants(event):
            _advance(hook, event)
            result.skipped += 1
            continue
        if not _post(client, hook, secret, event, attempts, backoff_s, sleep, result):
            return result
        _advance(hook, event)
        result.delivered += 1
    return result


def _post(
    client: httpx.Client,
    hook: Webhook,
    secret: bytes,
    event: Event,
    attempts: int,
    backoff_s: float,
    sleep: Callable[[float], None],
    result: Delivery,
) -> bool:
    body = json.dumps(event.to_dict(), sort_keys=True).encode()
    for attempt in range(1, attempts + 1):
        headers = {
            "Content-Type": "application/json",
            "Unmask-Event-Id": event.id,
            "Unmask-Event-Type": event.type,
            SIGNATURE_HEADER: sign(secret, body),
        }
        try:
            answer = client.post(hook.url, content=body, headers=headers)
            outcome = f"HTTP {answer.status_code}"
            ok = 200 <= answer.status_code < 300
        except httpx.HTTPError as e:
            outcome, ok = f"{type(e).__name__}: {e}"[:300], False
        _log(hook, event, attempt, outcome)
        if ok:
            return True
        result.failed = f"event #{event.seq} ({event.type}): {outcome} after {attempt} attempt(s)"
        if attempt < attempts:
            sleep(backoff_s * 2 ** (attempt - 1))
    return False


def stream(registry: Registry, since: int, follow: bool, poll_s: float, until: float | None) -> Any:
    """Events after `since`, then (with `follow`) each new one as the chain grows, until `until` (monotonic time)
    passes; a generator of Events."""
    reader = EventReader(registry)
    seen = since
    while True:
        for event in reader.since(seen):
            seen = event.seq
            yield event
        if not follow or (until is not None and time.monotonic() >= until):
            return
        time.sleep(poll_s)
