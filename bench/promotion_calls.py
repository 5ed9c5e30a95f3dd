"""How many MLflow calls one promotion makes: a poc and a staging promotion of the fixtures' tiny-llada on a fresh
embedded store, every `MlflowClient` method counted while `registry.promote` runs (issue #46 asks for 20 at most).

    PYTHONPATH=. .venv/bin/python bench/promotion_calls.py [--nested]

Prints the total per promotion and the calls by method. By default only the calls unmask makes are counted; with
--nested, the client calls MLflow's own client methods make inside them too (a `set_model_version_tag` reads the
registered model first).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from registry import approve, promote
from tests.support.gate_fixtures import OK, approve_as, fresh_registry, login, register_pair, sign_all


class Counter:
    """Counts MlflowClient method calls while `on`; nested ones only when `nested`."""

    def __init__(self, nested: bool) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.on, self.nested, self.depth = False, nested, 0
        for name in dir(MlflowClient):
            method = getattr(MlflowClient, name)
            if not name.startswith("_") and callable(method):
                setattr(MlflowClient, name, self._wrap(name, method))

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.on and (self.nested or not self.depth):
                self.calls[name] += 1
            self.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self.depth -= 1

        return counted

    def during(self, label: str, act: Callable[[], Any]) -> None:
        self.calls.clear()
        self.on = True
        try:
            act()
        finally:
            self.on = False
        top = ", ".join(f"{n} {name}" for name, n in self.calls.most_common())
        print(f"{label}: {sum(self.calls.values())} MLflow client calls ({top})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nested", action="store_true", help="also count MLflow's own nested client calls")
    counter = Counter(parser.parse_args().nested)
    reg = fresh_registry(Path(tempfile.mkdtemp(prefix="unmask-promotion-calls-")))
    os.environ["MLFLOW_TRACKING_URI"] = reg.tracking_uri
    _, version = register_pair(reg)
    sign_all(reg, "tiny-llada", version, "poc", "staging")
    with pytest.MonkeyPatch.context() as mp:
        login(mp, "grace")
        approve(reg, "tiny-llada", version, "poc", "grace", OK)
        counter.during("poc promotion", lambda: promote("tiny-llada", "poc", registry=reg, actor="grace"))
        approve_as(reg, "tiny-llada", version, "staging", OK + " for staging", "linus")
        login(mp, "grace")
        counter.during("staging promotion", lambda: promote("tiny-llada", "staging", registry=reg, actor="grace"))


if __name__ == "__main__":
    main()
