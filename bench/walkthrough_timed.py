"""The newcomer's clock: docs/walkthrough.md's commands, each as its own process in a fresh state folder, with the
wall time of every command and every step (what a person typing them waits for; tests/e2e/test_walkthrough.py runs
the same page in one process and checks what it prints).

    .venv/bin/python bench/walkthrough_timed.py [--steps N] [--json times.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.walkthrough import DOC, VARIABLE, parse  # noqa: E402 - the page's parser: the steps the test runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="Only the first N steps (default: all).")
    parser.add_argument("--json", type=Path, help="Also write the times here.")
    args = parser.parse_args(argv)
    home = tempfile.mkdtemp(prefix="unmask-walkthrough-")
    env = dict(os.environ) | {"UNMASK_HOME": home, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"}
    steps = parse(DOC.read_text())
    steps = steps[: args.steps] if args.steps else steps
    times = []
    for number, step in enumerate(steps, 1):
        for key, value in step.exports.items():  # $NAME expanded as a shell would; the state folder is ours
            env[key] = (
                home if key == "UNMASK_HOME" else VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
            )
        started = time.perf_counter()
        for line, expected in step.commands:
            began = time.perf_counter()
            done = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True)
            took = time.perf_counter() - began
            ok = "ok" if done.returncode == expected else f"exit {done.returncode}, expected {expected}"
            times.append({"step": number, "command": line, "wall_s": round(took, 2), "result": ok})
            print(f"  {took:7.1f} s  {ok:>4}  {line}", flush=True)
        print(f"step {number}: {time.perf_counter() - started:.1f} s", flush=True)
    total = sum(t["wall_s"] for t in times)
    print(f"total: {total:.1f} s over {len(times)} commands (state: {home})")
    if args.json:
        args.json.write_text(json.dumps(times, indent=2) + "\n")
    return 0 if all(t["result"] == "ok" for t in times) else 1


if __name__ == "__main__":
    sys.exit(main())
