"""MLflow client calls counted where they are made: every public `MlflowClient` method wrapped while a
`Calls` block is open, with the arguments of each call kept (the promotion call-count test and
bench/promotion_calls.py read the same numbers)."""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from mlflow.tracking import MlflowClient


class Calls:
    """The calls made through any `MlflowClient` while `counting()` is open: `made` in order as (method, args);
    `nested`: also the calls MLflow's own client methods make inside them."""

    def __init__(self, nested: bool = False) -> None:
        self.made: list[tuple[str, tuple[Any, ...]]] = []
        self.nested, self._depth, self.on = nested, 0, False

    @property
    def by_method(self) -> collections.Counter[str]:
        return collections.Counter(name for name, _ in self.made)

    def of(self, method: str, *args: Any) -> int:
        """How many calls of `method` began with `args`."""
        return sum(1 for name, given in self.made if name == method and given[: len(args)] == args)

    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counted(client: Any, *args: Any, **kwargs: Any) -> Any:
            if self.on and (self.nested or not self._depth):
                self.made.append((name, args))
            self._depth += 1
            try:
                return method(client, *args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    @contextmanager
    def during(self) -> Iterator[Calls]:
        """Count only inside this block (set-up calls before it are not counted)."""
        self.made.clear()
        self.on = True
        try:
            yield self
        finally:
            self.on = False


@contextmanager
def counting(nested: bool = False) -> Iterator[Calls]:
    """Wrap every public `MlflowClient` method for the block's length (restored after); count inside `during()`."""
    calls = Calls(nested)
    originals = {
        name: method for name, method in vars(MlflowClient).items() if not name.startswith("_") and callable(method)
    }
    for name, method in originals.items():
        setattr(MlflowClient, name, calls.wrap(name, method))
    try:
        yield calls
    finally:
        for name, method in originals.items():
            setattr(MlflowClient, name, method)
