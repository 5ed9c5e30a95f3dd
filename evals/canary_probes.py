"""Probe prompts with known answers, mixed into a route's live traffic during a rollout, and their log.

A rollout's analysis sees latency and errors in the request log; a candidate that answers fast and wrong
passes those. Probes give it the quality side: items of a task's `validation` split (held out from the
sweep, which measures `test`, and from training) are sent through the route under user keys the sticky
split places on each arm, so the candidate arm answers with its live settings and faults, and each item's
two answers are graded exact-match against the known answer and compared with each other (agreement).

Each graded answer is a line of `<requests>/probes/<route>/<YYYYMMDDTHH>.jsonl`, the hour of its time, inside the
request log's folder (`<state>/serving/requests`, or the folder every replica mounts):
`{"time", "route", "arm", "key", "correct", "agrees", "latency_s", "status"}`. The rollout's analysis and the
analysis endpoint read them (`read_probe_results`) beside the request rows, from the same folder, so every replica
judges the same probes; a read for a window opens only the hours it covers (its cost follows the window, not the
log's history), and the writer removes the hours older than `RETENTION_H`. `ProbeFolder` is that log behind the
`ProbeLog` protocol of evals/evidence_store.py, whose `PostgresEvidence` keeps the same lines in the team PostgreSQL
for replicas on several machines (`UNMASK_EVIDENCE_URL`); `ProbeSender` writes to either.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from evals.evidence_store import RETENTION_H, EvidenceError, ProbeLog
from evals.tasks import TaskItem, get_task, make_split, score

log = logging.getLogger("unmask.probes")

PROBE_SPLIT = "validation"  # held out: the sweep measures `test`, training never sees either


@dataclass(frozen=True)
class ProbeResult:
    """One arm's graded answer to one probe item."""

    time: str
    route: str
    arm: str  # the arm that answered (from the answer's `unmask.arm`)
    key: str  # the item's problem key
    correct: bool | None  # exact match with the known answer; None when the arm gave no answer
    agrees: bool | None = None  # equal to the other arm's answer to the same item (None: not compared)
    latency_s: float | None = None
    status: int = 200

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def probe_items(task: str, n: int, seed: int = 0) -> list[TaskItem]:
    """`n` held-out items of `task` to probe with."""
    return make_split(get_task(task), PROBE_SPLIT, n, seed=seed)


def grade(task: str, text: str | None, item: TaskItem) -> bool | None:
    """Exact match of an answer with the item's known answer, by the task's first metric."""
    if text is None:
        return None
    return bool(score(get_task(task).metrics[0], text, item.target))


PROBES = "probes"  # the probe log's folder, inside the request log's (whose reader skips it)
HOUR = "%Y%m%dT%H"  # one file per route and hour


def probe_folder(requests: Path) -> Path:
    """Where the probes of the request log in `requests` go."""
    return requests / PROBES


def _hour(when: datetime) -> str:
    return when.astimezone(UTC).strftime(HOUR)


def _hours(folder: Path, route: str) -> list[tuple[Path, datetime]]:
    """(file, its hour) of every hour file of `route`'s log."""
    found = []
    for path in (folder / route).glob("*.jsonl"):
        try:
            found.append((path, datetime.strptime(path.stem, HOUR).replace(tzinfo=UTC)))
        except ValueError:
            continue
    return sorted(found, key=lambda f: f[1])


def append_probe_results(
    folder: Path, route: str, results: list[ProbeResult], retention_h: float = RETENTION_H
) -> None:
    """Each result as a line of its hour's file (one write per file), then the hours past the retention removed."""
    by_hour: dict[str, list[str]] = {}
    for r in results:
        by_hour.setdefault(_hour(datetime.fromisoformat(r.time)), []).append(json.dumps(r.to_dict()) + "\n")
    (folder / route).mkdir(parents=True, exist_ok=True)
    for name, lines in by_hour.items():
        with (folder / route / f"{name}.jsonl").open("a") as f:
            f.write("".join(lines))
    expired = datetime.now(UTC) - timedelta(hours=retention_h)
    for path, hour in _hours(folder, route):
        if hour + timedelta(hours=1) < expired:
            path.unlink(missing_ok=True)


def read_probe_results(
    folder: Path, route: str, since: datetime | None = None, until: datetime | None = None
) -> list[dict[str, Any]]:
    """The probe log's lines of `route` logged in [since, until), from the hour files that can hold them (a torn
    last line is skipped)."""
    rows = []
    for path, hour in _hours(folder, route):
        if (since is not None and hour + timedelta(hours=1) <= since) or (until is not None and hour >= until):
            continue
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
                when = datetime.fromisoformat(row["time"])
            except (ValueError, KeyError, TypeError):
                continue
            if (since is None or when >= since) and (until is None or when < until):
                rows.append(row)
    return rows


class ProbeFolder:
    """The probe log of a folder (`probe_folder` of a request log): hour files per route, the hours past the
    retention removed by each append."""

    def __init__(self, folder: Path, retention_h: float = RETENTION_H):
        self.folder, self.retention_h = Path(folder), retention_h

    def append_probes(self, route: str, rows: list[dict[str, Any]]) -> None:
        append_probe_results(self.folder, route, [ProbeResult(**r) for r in rows], self.retention_h)

    def read_probes(
        self, route: str, since: datetime | None = None, until: datetime | None = None
    ) -> list[dict[str, Any]]:
        return read_probe_results(self.folder, route, since, until)


def ask(
    client: httpx.Client,
    base_url: str,
    route: str,
    item: TaskItem,
    user: str,
    max_tokens: int,
    direct: str | None = None,
) -> tuple[str | None, str, float, int]:
    """(answer text, answering arm, latency, status) of one probe request through `route` (or straight to the
    alias `direct`)."""
    started = time.monotonic()
    try:
        response = client.post(
            f"{base_url.rstrip('/')}/v1/completions",
            json={"model": direct or route, "prompt": item.prompt, "max_tokens": max_tokens, "user": user},
        )
    except httpx.HTTPError:
        return None, direct or "", time.monotonic() - started, 599
    elapsed = time.monotonic() - started
    if response.status_code != 200:
        return None, direct or "", elapsed, response.status_code
    body = response.json()
    arm = (body.get("unmask") or {}).get("arm") or direct or ""
    choices = body.get("choices") or [{}]
    return choices[0].get("text"), arm, elapsed, 200


class ProbeSender:
    """Sends probe items at `per_s` through a route until stopped: each item once under a key placed on each
    arm (`key_for(arm, i)`, or None: that arm gets it straight by its alias), graded and logged."""

    def __init__(
        self,
        base_url: str,
        route: str,
        task: str,
        arms: tuple[str, str],
        per_s: float,
        key_for: Callable[[str, int], str | None],
        probe_log: ProbeLog | Path,
        max_tokens: int | None = None,
        seed: int = 0,
        timeout_s: float = 60.0,
    ):
        self.base_url, self.route, self.task, self.arms, self.per_s = base_url, route, task, arms, per_s
        # where the graded answers go: the evidence store the analyses read (a folder: `probe_folder` of the log's)
        self.probe_log = ProbeFolder(probe_log) if isinstance(probe_log, Path) else probe_log
        self.key_for, self.seed, self.timeout_s = key_for, seed, timeout_s
        self.max_tokens = max_tokens or get_task(task).gen_length
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"probes-{route}")

    def probe(self, client: httpx.Client, item: TaskItem, i: int) -> list[ProbeResult]:
        """One item to both arms: two graded results, each marked whether it agrees with the other."""
        answers = []
        for arm in self.arms:
            key = self.key_for(arm, i)
            text, answered_by, latency, status = ask(
                client, self.base_url, self.route, item, key or f"probe-{i}", self.max_tokens, None if key else arm
            )
            answers.append((arm if not answered_by else answered_by, text, latency, status))
        (arm_a, text_a, lat_a, st_a), (arm_b, text_b, lat_b, st_b) = answers
        agrees = None if text_a is None or text_b is None else text_a == text_b
        now = datetime.now(UTC).isoformat()
        return [
            ProbeResult(now, self.route, arm_a, item.key, grade(self.task, text_a, item), agrees, lat_a, st_a),
            ProbeResult(now, self.route, arm_b, item.key, grade(self.task, text_b, item), agrees, lat_b, st_b),
        ]

    def _run(self) -> None:
        items = probe_items(self.task, 200, self.seed)
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                item = items[self.sent % len(items)]
                results = [r.to_dict() for r in self.probe(client, item, self.sent)]
                try:
                    self.probe_log.append_probes(self.route, results)
                except EvidenceError as e:  # this item's answers are lost; the probes go on
                    log.warning("probes of route %s: %d results not logged: %s", self.route, len(results), e)
                self.sent += 1
                self.stop.wait(max(0.0, 1.0 / self.per_s - (time.monotonic() - started)))

    def __enter__(self) -> ProbeSender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(self.timeout_s * 2 + 5)
