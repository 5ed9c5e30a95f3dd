"""How many MLflow calls one promotion makes: a poc and a staging promotion of the fixtures' tiny-llada on a fresh
embedded store, every `MlflowClient` method counted while `registry.promote` runs (issue #46 asks for 20 at most).

    PYTHONPATH=. .venv/bin/python bench/promotion_calls.py [--nested] [--judged]

With --judged each stage's gates are judged and stored before its approval, as `unmask run` and `unmask gates` do
on the way to a promotion; without it the promotion stores the first gate report.

Prints the total per promotion and the calls by method. By default only the calls unmask makes are counted; with
--nested, the client calls MLflow's own client methods make inside them too (`MlflowClient`'s tag and alias writes
read the whole registered model first; `registry.store.Client`, which unmask uses, does not).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from registry import approve, promote
from registry.judging import judge
from tests.support.gate_fixtures import OK, act_as, approve_as, fresh_registry, register_pair, sign_all
from tests.support.governance import team_environment
from tests.support.mlflow_calls import Calls, counting


def report(label: str, calls: Calls, act: Callable[[], Any]) -> None:
    with calls.during():
        act()
    top = ", ".join(f"{n} {name}" for name, n in calls.by_method.most_common())
    print(f"{label}: {len(calls.made)} MLflow client calls ({top})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nested", action="store_true", help="also count MLflow's own nested client calls")
    parser.add_argument("--judged", action="store_true", help="judge each stage before its approval")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="unmask-promotion-calls-"))
    os.environ.update(team_environment(root))  # the people's keys, listed in the bundled roles: signed acts count
    reg = fresh_registry(root)
    os.environ["MLFLOW_TRACKING_URI"] = reg.tracking_uri
    _, version = register_pair(reg)
    sign_all(reg, "tiny-llada", version, "poc", "staging")
    with counting(args.nested) as calls:
        act_as("grace")
        if args.judged:
            for stage in ("poc", "staging"):
                judge(reg, "tiny-llada", version, stage)
        report("poc approval", calls, lambda: approve(reg, "tiny-llada", version, "poc", "grace", OK))
        report("poc promotion", calls, lambda: promote("tiny-llada", "poc", registry=reg, actor="grace"))
        approve_as(reg, "tiny-llada", version, "staging", OK + " for staging", "linus")
        act_as("grace")
        report("staging promotion", calls, lambda: promote("tiny-llada", "staging", registry=reg, actor="grace"))


if __name__ == "__main__":
    main()
