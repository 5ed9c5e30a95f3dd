"""Time as the code that waits reads it: retries against a busy store, the promotion lock's deadline and staleness,
the batcher's windows, a rollout's intervals. Each takes a `Clock`; the system's is the default, and a test hands
in a simulated one that moves only when slept on, so the same waits run in no time and never race the machine."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """What waiting code reads and does: a monotonic reading for deadlines, wall time for stamps shared across
    hosts (epoch seconds and an aware datetime), and a sleep."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """On an event loop: True once `event` is set, False when `timeout` seconds pass first."""
        ...


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

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), max(0.0, timeout))
        except TimeoutError:
            return False
        return True


YIELDS = 8  # turns of the event loop a simulated wait gives ready tasks before its timeout passes


class SimulatedClock:
    """A clock that stands still until slept on: `sleep(s)` moves every reading forward by `s` at once and is
    recorded in `sleeps`. `advance(s)` moves it without a sleep (time another party spent)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.start = start or datetime(2026, 1, 1, tzinfo=UTC)
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

    async def wait(self, event: asyncio.Event, timeout: float) -> bool:
        """Let every task that is ready run first (they may set `event`); if none did, the timeout passes at once."""
        for _ in range(YIELDS):
            if event.is_set():
                return True
            await asyncio.sleep(0)
        if event.is_set():
            return True
        self.sleep(timeout)
        return False

    def advance(self, seconds: float) -> None:
        self.elapsed += max(0.0, seconds)


SYSTEM_CLOCK: Clock = SystemClock()
