"""`unmask listen`: MLflow's registry webhooks acted on (events in), where `unmask events` sends unmask's own out.

A tracking server posts each subscribed change (registry/mlflow_hooks.py: `model_version.created`,
`model_version_alias.created`). The receiver verifies the delivery's signature, journals it, answers 202 at once
(MLflow waits 30 s at most and retries a 5xx), and one worker thread acts on the deliveries in the order received:

- **a new version made outside unmask** starts the `evaluate-candidate` flow: on the version's own files when its
  source holds a checkpoint (fetched into `<state>/events/inbox/`), else on the catalog entry of the same name
  (the catalog pins its weights). A version unmask's evaluation registered (it carries `unmask.evidence_run`) is
  its own evaluation's result, and is left alone, so the flow does not start itself again.
- **a stage alias set** (poc, staging, production) is checked against the audit trail's last move
  (`registry.integrity.alias_drift`); one set outside unmask opens a finding in the trail, which `unmask events`
  then sends on like any other. A move unmask makes is in the trail before the alias is set, so it is never one.

The journal (`<state>/events/inbox.jsonl`) holds each delivery when received and what came of it. A delivery id
seen before is answered 200 and not acted on twice (MLflow retries with the same id); deliveries received but not
settled when the receiver stopped are acted on when it starts again.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from checklists import STAGES
from flows.evaluate import EvaluationOptions, evaluate_candidate
from flows.outcome import CandidateOutcome
from flows.webhooks import events_dir
from models.catalog import load_catalog
from registry import Registry
from registry.integrity import alias_drift, record_finding
from registry.mlflow_hooks import (
    ALIAS_CREATED,
    VERSION_CREATED,
    DeliveryRefused,
    RegistryNotice,
    fetch_checkpoint,
    verify_delivery,
)

log = logging.getLogger(__name__)
MAX_BODY = 1 << 20  # bytes: an MLflow registry payload is a few hundred
ACTOR = "mlflow-webhook"  # who a finding the receiver opens is recorded as


@dataclass(frozen=True)
class Reaction:
    """What came of one delivery: evaluated, checked, finding, ignored or failed, and why, in a line."""

    outcome: str
    detail: str


class Inbox:
    """The receiver's journal: one JSON line per delivery received and one per delivery settled."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._open: dict[str, RegistryNotice] = {}
        text = path.read_text() if path.exists() else ""
        if text and not text.endswith("\n"):  # a crash tore the last line: the next one starts on a line of its own
            with path.open("a") as f:
                f.write("\n")
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = json.loads(line)
                delivery = entry["delivery"]
            except (ValueError, KeyError, TypeError):  # a line torn by a crash: the rest still counts
                log.warning("%s:%d: not a journal line; skipped", path, number)
                continue
            self._seen.add(delivery)
            if entry.get("state") == "received":
                self._open[delivery] = RegistryNotice.from_dict(entry.get("notice") or {"delivery": delivery})
            else:
                self._open.pop(delivery, None)

    def receive(self, notice: RegistryNotice) -> bool:
        """Journal a delivery; False when its id was received before (a retry: not acted on again)."""
        with self._lock:
            if notice.delivery in self._seen:
                return False
            self._seen.add(notice.delivery)
            self._open[notice.delivery] = notice
            self._write({"state": "received", "delivery": notice.delivery, "notice": notice.to_dict()})
            return True

    def settle(self, notice: RegistryNotice, reaction: Reaction) -> None:
        with self._lock:
            self._open.pop(notice.delivery, None)
            line = {"state": "settled", "delivery": notice.delivery, "event": notice.event, "model": notice.model}
            line |= {"version": notice.version, "alias": notice.alias}
            self._write(line | {"outcome": reaction.outcome, "detail": reaction.detail})

    def unsettled(self) -> list[RegistryNotice]:
        with self._lock:
            return list(self._open.values())

    def _write(self, entry: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps({"at": datetime.now(UTC).isoformat()} | entry, sort_keys=True) + "\n")


@dataclass(frozen=True)
class Reactions:
    """How the receiver acts: the registry it checks and the evaluation a new version gets."""

    registry: Registry
    sweep: str
    options: EvaluationOptions
    downloads: Path

    def __call__(self, notice: RegistryNotice) -> Reaction:
        if notice.event == VERSION_CREATED:
            return self.version_created(notice)
        if notice.event == ALIAS_CREATED:
            return self.alias_set(notice)
        return Reaction("ignored", f"{notice.event} is not an event unmask acts on")

    def version_created(self, notice: RegistryNotice) -> Reaction:
        if notice.registered_by_unmask:
            return Reaction(
                "ignored", f"registered by unmask's evaluation (evidence run {notice.registered_by_unmask})"
            )
        folder, how = fetch_checkpoint(self.registry, notice, self.downloads / notice.delivery)
        ref = str(folder) if folder else notice.model
        if folder is None:
            if notice.model not in load_catalog(tolerant=True):
                return Reaction("ignored", f"{how}, and {notice.model} is not in the catalog: nothing to evaluate")
            how = f"the catalog's pinned {notice.model} ({how})"
        outcome = CandidateOutcome.of(evaluate_candidate(ref, self.sweep, self.options))
        if outcome.error:
            return Reaction("failed", f"evaluating {how}: {outcome.error}")
        where = (
            f"into version {notice.version}"
            if outcome.version == notice.version
            else f"as version {outcome.version}; version {notice.version} itself holds no evidence unmask made, "
            "so no gate passes it"
        )
        qualified = f"qualifies for {outcome.qualified}" if outcome.qualified else "qualifies for no stage"
        return Reaction("evaluated", f"evaluated {how}: registered {where}; {qualified}")

    def alias_set(self, notice: RegistryNotice) -> Reaction:
        if notice.alias not in STAGES:
            return Reaction("ignored", f"alias {notice.alias} is not a stage alias ({', '.join(STAGES)})")
        drift = alias_drift(self.registry, notice.alias)
        if drift is None:
            return Reaction("checked", f"{notice.alias} is where the audit trail's last move put it")
        record_finding(self.registry, drift, ACTOR)
        return Reaction("finding", str(drift))


class Receiver:
    """Verifies and journals deliveries; one worker thread acts on them in the order received."""

    def __init__(
        self,
        secret: bytes,
        inbox: Inbox,
        act: Callable[[RegistryNotice], Reaction],
        say: Callable[[str], None] = print,
    ):
        self.secret, self.inbox, self.act, self.say = secret, inbox, act, say
        self._queue: queue.Queue[RegistryNotice | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="unmask-listen", daemon=True)

    def start(self) -> None:
        for notice in self.inbox.unsettled():  # received before a stop, not acted on yet
            self._queue.put(notice)
        self._worker.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._worker.join(timeout_s)

    def accept(self, headers: Any, body: bytes) -> tuple[int, dict[str, Any]]:
        """The HTTP answer to one delivery: 202 queued, 200 a retry already received, 4xx refused."""
        try:
            notice = verify_delivery(self.secret, headers, body)
        except DeliveryRefused as e:
            self.say(f"refused ({e.status}): {e}")
            return e.status, {"error": str(e)}
        if not self.inbox.receive(notice):
            return 200, {"delivery": notice.delivery, "status": "already received"}
        self._queue.put(notice)
        return 202, {"delivery": notice.delivery, "status": "queued", "event": notice.event}

    def pending(self) -> int:
        return len(self.inbox.unsettled())

    def _work(self) -> None:
        while (notice := self._queue.get()) is not None:
            self.say(f"acting on {notice} (delivery {notice.delivery})")
            try:
                reaction = self.act(notice)
            except Exception as e:  # one delivery's failure is journaled; the next is still acted on
                log.exception("acting on %s", notice)
                reaction = Reaction("failed", f"{type(e).__name__}: {e}"[:500])
            self.inbox.settle(notice, reaction)
            self.say(f"{notice}: {reaction.outcome}: {reaction.detail}")


def inbox_path() -> Path:
    return events_dir() / "inbox.jsonl"


def receiver_app(receiver: Receiver) -> Starlette:
    """POST /mlflow takes MLflow's deliveries; GET /healthz says how many are not settled yet."""

    async def delivery(request: Request) -> JSONResponse:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return JSONResponse({"error": f"body over {MAX_BODY} bytes"}, status_code=413)
        status, answer = receiver.accept(request.headers, body)
        return JSONResponse(answer, status_code=status)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "unsettled": receiver.pending()})

    return Starlette(routes=[Route("/mlflow", delivery, methods=["POST"]), Route("/healthz", healthz)])
