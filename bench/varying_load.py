"""A load that changes during a run, as a CI runner or a shared workstation has: N processes, each burning one
core for BURN seconds and resting REST seconds, over and over, for at most DURATION seconds (then they stop by
themselves). A steady load moves both sides of a comparison alike and proves little; this one does not.

    .venv/bin/python bench/varying_load.py [--processes 2] [--burn 3] [--rest 3] [--duration 900] &
    unmask run                     # beside it: its speed verdicts and intervals should agree with a quiet run's

The processes start out of phase (each waits `i * (burn + rest) / processes` first), so the number of busy cores
steps between 0 and N.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time


def burn_and_rest(offset: float, burn: float, rest: float, until: float) -> None:
    time.sleep(offset)
    while time.monotonic() < until:
        stop = min(time.monotonic() + burn, until)
        x = 0
        while time.monotonic() < stop:
            x = (x * 31 + 7) % 1_000_003
        time.sleep(max(0.0, min(rest, until - time.monotonic())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--burn", type=float, default=3.0, help="seconds each process burns a core")
    parser.add_argument("--rest", type=float, default=3.0, help="seconds it then rests")
    parser.add_argument("--duration", type=float, default=900.0, help="seconds before every process stops")
    args = parser.parse_args()
    until = time.monotonic() + args.duration
    period = args.burn + args.rest
    workers = [
        multiprocessing.Process(
            target=burn_and_rest, args=(i * period / args.processes, args.burn, args.rest, until), daemon=True
        )
        for i in range(args.processes)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


if __name__ == "__main__":
    main()
