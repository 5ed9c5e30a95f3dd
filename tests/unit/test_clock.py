"""Waiting code on a simulated clock (registry/clock.py): a rollout's interval wait and the registry's retries
run their real loops in no time, with exact waits, and stop early when told to."""

from __future__ import annotations

import asyncio

import pytest
from mlflow.exceptions import MlflowException

from flows.rollout import wait_unless
from registry.clock import SimulatedClock
from registry.store import retry_busy


def test_an_interval_is_waited_in_steps_of_at_most_a_fifth_of_a_second_and_in_full():
    clock = SimulatedClock()
    wait_unless(1.0, lambda: False, clock)
    assert clock.monotonic() == pytest.approx(1.0)
    assert len(clock.sleeps) == 5 and max(clock.sleeps) <= 0.2 + 1e-9


def test_an_abort_ends_the_interval_wait_at_the_next_look():
    clock = SimulatedClock()
    looks: list[float] = []

    def aborted() -> bool:
        looks.append(clock.monotonic())
        return clock.monotonic() >= 0.5

    wait_unless(60.0, aborted, clock)
    assert clock.monotonic() == pytest.approx(0.6)  # the first look at or past 0.5 s, not the hour's minute
    assert looks[0] == 0.0 and len(looks) == 4


def test_a_busy_store_is_retried_with_growing_pauses_and_its_last_error_raised():
    clock = SimulatedClock()
    calls: list[int] = []

    def busy() -> str:
        calls.append(len(calls))
        if len(calls) < 3:
            raise MlflowException("database is locked")
        return "written"

    assert retry_busy(busy, clock=clock) == "written"
    assert clock.sleeps == pytest.approx([0.1, 0.2])
    with pytest.raises(MlflowException, match="locked"):
        retry_busy(lambda: (_ for _ in ()).throw(MlflowException("database is locked")), attempts=3, clock=clock)
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.1, 0.2])


def test_the_simulated_wait_sees_an_event_set_by_a_ready_task_and_otherwise_times_out_at_once():
    clock = SimulatedClock()

    async def run() -> tuple[bool, bool]:
        event = asyncio.Event()
        asyncio.get_running_loop().call_soon(event.set)
        seen = await clock.wait(event, 5.0)
        missed = await clock.wait(asyncio.Event(), 5.0)
        return seen, missed

    assert asyncio.run(run()) == (True, False)
    assert clock.sleeps == [5.0] and clock.now() > clock.start
