"""Leaving `unmask` without the interpreter's module teardown (see QuickExit)."""

from __future__ import annotations

import atexit
import os
import sys


class QuickExit:
    """Leave as soon as every atexit hook has run, skipping the interpreter's teardown of its modules.

    That teardown happens after the atexit hooks (Prefect's server stop, MLflow's and logging's flushes), in
    C, and with torch, MLflow, Prefect and pandas loaded it took about 2 s of every command's wall time on two
    cores (`unmask run --demo`, fully cached: 16.9 s at the last hook, 19.0 s at exit). Registered first, so
    that it runs last: this module imports nothing but the standard library, and flows/cli.py imports it before
    anything else. It acts only for the exit code `flows.cli.main` saw leave (else the usual teardown runs), so
    a process that merely imports the CLI (the tests) exits as usual."""

    def __init__(self) -> None:
        self.code: int | None = None
        atexit.register(self)

    def leaving(self, error: SystemExit) -> None:
        self.code = 0 if error.code is None else error.code if isinstance(error.code, int) else None

    def __call__(self) -> None:
        if self.code is None:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing left to say there
                pass
        os._exit(self.code)


QUICK_EXIT = QuickExit()
