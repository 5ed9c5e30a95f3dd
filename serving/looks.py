"""Which look of a rollout a canary analysis is, kept where every analysis replica reads it, never in a process.

A look judges one completed window of a grid aligned to the epoch (`window_s` wide): asked at time t, the window
[E - window_s, E) with E the last grid point at or before t. Its number is the order in which the rollout's windows
were first judged: the first window any replica judged for a rollout identity is look 1, the next distinct one
look 2, and so on; a window keeps its number for good. So the same question asked of two replicas, or after a
restart, or a hundred times in one window, judges the same rows at the same look and gets the same answer, and
the error budget a rollout spends grows with the windows it was judged in, never with the number of calls.

The identity is what the controller names: (route, candidate, baseline, revision, window_s), the revision being
Argo's pod-template hash or Flagger's canary checksum; a new revision starts again at look 1. Numbers are kept as
one small JSON file per identity under `<request log>/looks/`, replaced whole under an exclusive file lock
(`LookBook`), or, for replicas on several machines, in the team PostgreSQL (evals/evidence_store.py, the same rules
under an advisory lock); `look_of` asks either.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from evals.evidence_store import Identity
from evals.store import exclusive


class LooksError(RuntimeError):
    """A rollout's look record that cannot be read: named with its file."""


@dataclass(frozen=True)
class Look:
    """One look: its number for the identity, and the window it judges, [start, end)."""

    number: int
    start: datetime
    end: datetime


def window_at(now: datetime, window_s: float) -> tuple[datetime, datetime]:
    """The last completed window of the epoch-aligned grid of `window_s` at `now`."""
    end = math.floor(now.timestamp() / window_s) * window_s
    return datetime.fromtimestamp(end - window_s, UTC), datetime.fromtimestamp(end, UTC)


class Numbering(Protocol):
    def look_number(self, identity: Identity, window_end: datetime) -> int: ...


def look_of(looks: Numbering, identity: Identity, now: datetime) -> Look:
    """The look that judges the last completed window at `now` for `identity`; numbered on first sight."""
    start, end = window_at(now, identity[-1])
    return Look(looks.look_number(identity, end), start, end)


class LookBook:
    """The looks of every rollout identity judged against one request log (shared by the replicas reading it)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def look(self, identity: Identity, now: datetime) -> Look:
        return look_of(self, identity, now)

    def look_number(self, identity: Identity, window_end: datetime) -> int:
        """The number of the window ending at `window_end` for `identity`. LooksError when the identity's record
        cannot be read (edited by hand): a look is never guessed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        name = hashlib.sha256(json.dumps(list(identity)).encode()).hexdigest()[:32]
        record, key = self.folder / f"{name}.json", window_end.astimezone(UTC).isoformat()
        with exclusive(self.folder / f"{name}.lock"):
            try:
                known = json.loads(record.read_text())["windows"] if record.exists() else {}
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise LooksError(f"{record}: the looks of {identity} cannot be read ({e})") from None
            if key not in known:
                known[key] = max(known.values(), default=0) + 1
                partial = record.with_suffix(".partial")
                partial.write_text(json.dumps({"identity": list(identity), "windows": known}))
                partial.replace(record)  # whole or not at all
        return int(known[key])
