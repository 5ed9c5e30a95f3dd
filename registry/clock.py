"""Time as the code that waits reads it: retries against a busy store, the promotion lock's deadline and staleness,
the batcher's windows, a rollout's intervals. Each takes a `Clock`; the system's is the default, and a test hands
in a simulated one that moves only when slept on, so the same waits run in no time and never race the machine."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Protocol


class Clock(Protocol):
    """What waiting code reads and does: a monotonic reading for deadlines, wall time for stamps shared across
    hosts (epoch seconds and an aware datetime), and a sleep."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's clocks: `time.monotonic`, `time.time`, the local aware datetime and `time.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def now(self) -> datetime:
        return datetime.now().astimezone()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class SimulatedClock:
    """A clock that stands still until slept on: `sleep(s)` moves every reading forward by `s` at once and is
    recorded in `sleeps`. `advance(s)` moves it without a sleep (time another party spent)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.start = start or datetime(2026, 1, 1, tzinfo=timezone.utc)
        self.elapsed = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.elapsed

    def time(self) -> float:
        return self.start.timestamp() + self.elapsed

    def now(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.elapsed += max(0.0, seconds)


SYSTEM_CLOCK: Clock = SystemClock()
