"""What a server's cold start spends importing the serving app, in two checkouts, paired and interleaved.

    .venv/bin/python docs/experiments/cold-start/serving_import.py BEFORE_CHECKOUT AFTER_CHECKOUT [ROUNDS]

Each round starts one process per checkout (the order alternates by round) that imports what `unmask serve` imports
before it loads a model, and reads the process's CPU time (user + system) from the kernel's accounting of finished
children. CPU time, not wall: on a shared host the wall clock measures the neighbours too. Prints each checkout's
median and the median of the per-round ratios AFTER/BEFORE with a 95 % bootstrap interval.

Measured 2026-12-07 on the 2-core host, with the test suite running beside it, 12 rounds: 4c48b71 (scipy.stats and
pymcdm imported with gates) 6.73 CPU-s, the lazy imports 4.71 CPU-s, ratio 0.731 (0.693 to 0.775).
"""

import random
import resource
import statistics
import subprocess
import sys
from pathlib import Path

PROBE = (
    "import uvicorn\nfrom flows.environment import configure_environment\nfrom gates.serving_policy import "
    "ServingPolicyError\nfrom serving import Limits, PoolSettings, ServeSettings, create_app\nfrom serving.app import "
    "routed_as\n"
)


def cpu_of_one_import(checkout: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", PROBE], cwd=checkout, env={"PYTHONPATH": str(checkout)}, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    before, after = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    cpu = {before: [], after: []}
    for i in range(rounds):
        for checkout in (before, after) if i % 2 == 0 else (after, before):
            cpu[checkout].append(cpu_of_one_import(checkout))
    ratios = [a / b for a, b in zip(cpu[after], cpu[before])]
    rng = random.Random(0)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    print(f"before: median {statistics.median(cpu[before]):.2f} CPU-s over {rounds} imports ({before})")
    print(f"after:  median {statistics.median(cpu[after]):.2f} CPU-s over {rounds} imports ({after})")
    print(f"after/before: {statistics.median(ratios):.3f} (95% bootstrap interval {boot[49]:.3f} to {boot[1949]:.3f})")


if __name__ == "__main__":
    main()
