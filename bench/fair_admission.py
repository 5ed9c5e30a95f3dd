"""Fair admission (issue 51, item 8): one client loops on requests of many choices, another asks once at a time;
how often is each refused (429)?

    PYTHONPATH=. .venv/bin/python bench/fair_admission.py [--light 30] [--heavy-tasks 4] [--unfair]

Serves tiny-llada as `production` on a free 127.0.0.1 port (the bundled test registry), max_pending 64. The
heavy client (`user: heavy`) keeps `--heavy-tasks` requests of 16 choices (the most `n` may be) in flight; the
light client (`user: light`) sends `--light` single requests, one after the other. Prints each client's requests,
429s and the light client's latency percentiles. `--unfair` admits as before issue 51's item 8 (the queue's room
only), for the comparison. Bounded: it stops after the light client's requests or 300 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from serving.batching import Batcher, QueueFull
from serving.schemas import MAX_CHOICES
from tests.support.serving_fixtures import running_server, settings_for, shared_serving_registry

BODY = {"model": "production", "prompt": "A box has 9 coins. Zoe takes 3. How many remain?", "max_tokens": 16}


async def scenario(base: str, light_requests: int, heavy_tasks: int, heavy_n: int) -> dict[str, list]:
    seen: dict[str, list] = {"heavy": [], "light": []}
    stop = asyncio.Event()
    deadline = time.monotonic() + 300

    async with httpx.AsyncClient(base_url=base, timeout=120) as client:

        async def heavy() -> None:
            while not stop.is_set() and time.monotonic() < deadline:
                answer = await client.post("/v1/completions", json=BODY | {"user": "heavy", "n": heavy_n})
                seen["heavy"].append((answer.status_code, 0.0))
                if answer.status_code == 429:
                    await asyncio.sleep(0.05)

        async def light() -> None:
            await asyncio.sleep(1.0)  # the heavy client fills the queue first
            for _ in range(light_requests):
                if time.monotonic() > deadline:
                    break
                started = time.monotonic()
                answer = await client.post("/v1/completions", json=BODY | {"user": "light"})
                seen["light"].append((answer.status_code, time.monotonic() - started))
            stop.set()

        await asyncio.gather(light(), *(heavy() for _ in range(heavy_tasks)))
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--light", type=int, default=30, help="requests of the light client")
    parser.add_argument("--heavy-tasks", type=int, default=4, help="heavy requests in flight at once")
    parser.add_argument("--unfair", action="store_true", help="admit on the queue's room only (as before)")
    args = parser.parse_args()
    if args.unfair:

        def room_only(self: Batcher, client: str, rows: int) -> None:
            if self.load + rows > self.max_pending:
                raise QueueFull(f"{self.load} requests queued or decoding (limit {self.max_pending})")

        Batcher.admit = room_only  # type: ignore[method-assign]
    settings = settings_for(shared_serving_registry().tracking_uri, names=["production"], max_pending=64)
    with running_server(settings) as server:
        seen = asyncio.run(scenario(server.base_url, args.light, args.heavy_tasks, MAX_CHOICES))
    for who, answers in seen.items():
        refused = sum(1 for status, _ in answers if status == 429)
        statuses = {status: sum(1 for s, _ in answers if s == status) for status, _ in answers}
        print(
            f"{who}: {len(answers)} requests, {refused} answered 429 ({100 * refused / max(len(answers), 1):.0f}%); "
            f"by status {dict(sorted(statuses.items()))}"
        )
    latencies = sorted(s for status, s in seen["light"] if status == 200)
    if latencies:
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(f"light latency: median {statistics.median(latencies):.2f} s, p95 {p95:.2f} s (n={len(latencies)})")


if __name__ == "__main__":
    main()
