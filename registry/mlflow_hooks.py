"""MLflow's own registry webhooks, received: a delivery verified and read into a typed notice, the subscription
made on a tracking server, and a new version's files fetched.

MLflow 3.x (`mlflow.webhooks.delivery`) posts each registry change as JSON
`{"entity": ..., "action": ..., "timestamp": ..., "data": {...}}` with three headers: `X-MLflow-Delivery-Id`,
`X-MLflow-Timestamp` (Unix seconds) and, when the webhook has a secret, `X-MLflow-Signature: v1,<base64 HMAC-SHA256
of "<delivery id>.<timestamp>.<body>">`. A delivery that is unsigned, signed with another secret, or older than
`TOLERANCE_S` (a replayed body) is refused here, before anything reads its body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlflow.artifacts
from mlflow.entities.webhook import WebhookEvent
from mlflow.exceptions import MlflowException

from registry.connection import RegistryError
from registry.store import Registry, model_tag

SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_HEADER = "X-MLflow-Delivery-Id"
TOLERANCE_S = 300  # a delivery signed longer ago than this (either way) is refused as a replay
VERSION_CREATED = "model_version.created"
ALIAS_CREATED = "model_version_alias.created"
EVENTS = (VERSION_CREATED, ALIAS_CREATED)  # what `subscribe` asks for and the receiver acts on
SUBSCRIPTION = "unmask-listen"  # the MLflow webhook's name: `subscribe` updates it rather than adding another
CHECKPOINT_FILES = ("config.json",)  # with at least one *.safetensors beside it


class DeliveryRefused(ValueError):
    """A delivery that is not acted on; `status` is the HTTP answer (401 unsigned or forged, 400 malformed)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RegistryNotice:
    """One verified MLflow webhook delivery: which registry change, on which model, version and alias."""

    delivery: str
    event: str  # "<entity>.<action>", e.g. model_version.created
    model: str = ""
    version: str = ""
    alias: str = ""
    source: str = ""
    run_id: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    sent_at: str = ""  # the payload's own timestamp (ISO 8601)

    @property
    def registered_by_unmask(self) -> str:
        """The evidence run of a version unmask's own evaluation created ("" for one made outside unmask)."""
        return self.tags.get(model_tag("evidence_run"), "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegistryNotice:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def __str__(self) -> str:
        what = f"{self.model} version {self.version}" if self.version else self.model
        return f"{self.event} {what}" + (f" alias {self.alias}" if self.alias else "")


def signature(secret: bytes, delivery: str, timestamp: str, body: bytes) -> str:
    """The `X-MLflow-Signature` value MLflow sends for this delivery (the sender's side, for tests and tools)."""
    mac = hmac.new(secret, f"{delivery}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify_delivery(secret: bytes, headers: Mapping[str, str], body: bytes, now: float | None = None) -> RegistryNotice:
    """The notice `body` carries, once its signature under `secret` and its age are checked; DeliveryRefused
    names what is wrong. `headers`: case-insensitive (Starlette's) or lower-cased names."""

    def header(name: str) -> str:
        return str(headers.get(name) or headers.get(name.lower()) or "").strip()

    delivery, stamp, signed = header(DELIVERY_HEADER), header(TIMESTAMP_HEADER), header(SIGNATURE_HEADER)
    if not signed:
        raise DeliveryRefused(401, f"unsigned delivery: no {SIGNATURE_HEADER} (give the MLflow webhook a secret)")
    if not delivery or not stamp:
        raise DeliveryRefused(400, f"a signed delivery needs {DELIVERY_HEADER} and {TIMESTAMP_HEADER}")
    if not stamp.isdigit():
        raise DeliveryRefused(400, f"{TIMESTAMP_HEADER} {stamp[:40]!r} is not Unix seconds")
    age = (time.time() if now is None else now) - int(stamp)
    if abs(age) > TOLERANCE_S:
        raise DeliveryRefused(401, f"delivery signed {int(age)} s ago: outside {TOLERANCE_S} s (a replay?)")
    expected = signature(secret, delivery, stamp, body)
    if not any(hmac.compare_digest(expected, given) for given in signed.split()):  # several, while rotating
        raise DeliveryRefused(401, f"{SIGNATURE_HEADER} does not sign this body under the configured secret")
    return read_notice(delivery, body)


def read_notice(delivery: str, body: bytes) -> RegistryNotice:
    """A signed body as a notice; DeliveryRefused (400) names the field that is missing or of the wrong type."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DeliveryRefused(400, f"body is not JSON: {e}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("data"), dict):
        raise DeliveryRefused(400, "body: expected an object with entity, action and an object `data`")
    entity, action, data = payload.get("entity"), payload.get("action"), payload["data"]
    if not isinstance(entity, str) or not isinstance(action, str):
        raise DeliveryRefused(400, "body: entity and action must be strings")
    event = f"{entity}.{action}"
    needed = {VERSION_CREATED: ("name", "version"), ALIAS_CREATED: ("name", "alias", "version")}.get(event, ())
    for key in needed:
        if not isinstance(data.get(key), str) or not data[key]:
            raise DeliveryRefused(400, f"{event}: data.{key} must be a non-empty string")
    tags = data.get("tags") or {}
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise DeliveryRefused(400, f"{event}: data.tags must map strings to strings")

    def text(key: str) -> str:
        value = data.get(key)
        return value if isinstance(value, str) else ""

    return RegistryNotice(
        delivery=delivery,
        event=event,
        model=text("name"),
        version=text("version"),
        alias=text("alias"),
        source=text("source"),
        run_id=text("run_id"),
        tags=dict(tags),
        sent_at=str(payload.get("timestamp") or ""),
    )


def subscribe(registry: Registry, url: str, secret: str) -> tuple[str, bool]:
    """Make the tracking server post EVENTS to `url`, signed with `secret`: (webhook id, whether it was created
    rather than updated). One subscription per server, named SUBSCRIPTION."""
    if not registry.tracking_uri.startswith(("http://", "https://")):
        raise RegistryError(
            f"{registry.tracking_uri}: a local store sends no webhooks; only an `mlflow server` does "
            "(set MLFLOW_TRACKING_URI to its URL)"
        )
    client = registry.direct
    try:
        existing = [w for w in client.list_webhooks(max_results=1000) if w.name == SUBSCRIPTION]
        if existing:
            hook = client.update_webhook(
                existing[0].webhook_id,
                url=url,
                events=_subscribed(),
                secret=secret,
                status="ACTIVE",
            )
            return hook.webhook_id, False
        hook = client.create_webhook(
            SUBSCRIPTION,
            url,
            _subscribed(),
            description="unmask listen: evaluate new versions, audit alias moves",
            secret=secret,
        )
    except MlflowException as e:
        raise RegistryError(
            f"{registry.tracking_uri}: could not subscribe {url} to {', '.join(EVENTS)}: {e.message}"
        ) from None
    return hook.webhook_id, True


def _subscribed() -> list[Any]:  # MLflow types its parameter as an invariant list of a union
    return [WebhookEvent(*name.rsplit(".", 1)) for name in EVENTS]


def fetch_checkpoint(registry: Registry, notice: RegistryNotice, into: Path) -> tuple[Path | None, str]:
    """The new version's files as a model folder named after its registered model (`into/<model>`), when its
    source holds a checkpoint (config.json and safetensors weights): (folder, how), else (None, why not)."""
    if not notice.source:
        return None, "the version names no source"
    scratch = into / ".download"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        got = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=notice.source, dst_path=str(scratch), tracking_uri=registry.tracking_uri
            )
        )
    except (MlflowException, OSError, ValueError) as e:
        shutil.rmtree(scratch, ignore_errors=True)
        return None, f"its source {notice.source} could not be fetched: {str(e).splitlines()[0][:200]}"
    missing = [name for name in CHECKPOINT_FILES if not (got / name).is_file()]
    if not got.is_dir() or missing or not any(got.glob("*.safetensors")):
        shutil.rmtree(scratch, ignore_errors=True)
        return None, f"its source {notice.source} holds no checkpoint (config.json and *.safetensors)"
    folder = into / notice.model
    shutil.rmtree(folder, ignore_errors=True)
    got.rename(folder)
    shutil.rmtree(scratch, ignore_errors=True)
    return folder, f"the files of its source {notice.source}"
