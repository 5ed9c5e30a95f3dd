"""What Ctrl-C or SIGTERM does to a command: it stops within seconds, exits 128 + the signal's number (130, 143) with
one line, and half-records nothing.

The first SIGINT or SIGTERM (what Kubernetes and systemd send) raises KeyboardInterrupt in the main thread, as
Python's own SIGINT handler does, unless the main thread
is inside `shielded()` (a registry write: an evidence run and the version it backs, an audit entry), where it is
held until the section ends. A worker thread measuring a sweep point stops at its next item (`stop_if_interrupted`):
its point is left unrecorded, every finished point stays in the result storage for the next run to reuse. Should the
process still be exiting GRACE_S later (a decode stuck in one long forward, an exit hook that waits on a network), it
leaves at once, as a second Ctrl-C makes it; either waits for a shielded section in progress, at most WRITE_WAIT_S.
That deadline also covers an exception the interpreter drops: a signal handled while the main thread runs a finalizer
or an atexit hook raises there, and Python prints "Exception ignored" and goes on (`unmask run` once exited 0 after
a SIGTERM that way). A process that ends by itself after the signal still exits with the signal's code (`exit_code`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType

from flows.local_prefect import LocalPrefect

SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRACE_S = 10.0
WRITE_WAIT_S = 20.0


class Interrupt:
    """The process's Ctrl-C or SIGTERM: whether it came, the registry writes it must not cut, and how the process
    leaves."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self._writes = threading.Condition()
        self._writing = 0  # shielded sections in progress, in any thread
        self._main_depth = 0  # those of the main thread, where the signal handler runs
        self._held = False  # a KeyboardInterrupt owed to the main thread when its section ends
        self._leave_after = False  # a second Ctrl-C during a section: leave when it ends
        self._said = False
        self.signum = int(signal.SIGINT)  # the first signal that came

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process that signal ended (Ctrl-C: 130, SIGTERM: 143)."""
        return 128 + self.signum

    def install(self) -> None:
        """Take over SIGINT and SIGTERM (the main thread only can), each unless the process was started with it
        ignored (SIGINT in a job started with `&` by a non-interactive shell): Python keeps that, and so does unmask."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.requested.is_set():  # the second signal: now
            if self._main_depth:
                self._leave_after = True
                return
            self.leave()
        self.signum = signum
        self.requested.set()
        deadline = threading.Timer(GRACE_S, self.leave)
        deadline.daemon = True  # an exit that finishes in time is not held up by it
        deadline.start()
        if self._main_depth:
            self._held = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """A write that must land whole or not at all: Ctrl-C waits for it to end."""
        main = threading.current_thread() is threading.main_thread()
        with self._writes:
            self._writing += 1
            if main:
                self._main_depth += 1
        try:
            yield
        finally:
            with self._writes:
                if main:
                    self._main_depth -= 1
                self._writing -= 1
                self._writes.notify_all()
        if main and not self._main_depth:
            if self._leave_after:
                self.leave()
            if self._held:
                self._held = False
                raise KeyboardInterrupt

    def stop_if_interrupted(self) -> None:
        """In a worker thread: end the work it is doing once Ctrl-C came (the main thread has its KeyboardInterrupt)."""
        if self.requested.is_set() and threading.current_thread() is not threading.main_thread():
            raise KeyboardInterrupt

    def announce(self, line: str = "") -> None:
        """The command's one line about it, `line` or the signal's word (`leave` says it only if nothing did)."""
        self._said = True
        word = "interrupted" if self.signum == signal.SIGINT else "terminated"
        print(line or word, file=sys.stderr, flush=True)

    def settled(self, code: object) -> object:
        """The exit code of a command that ended by itself: `code`, unless a signal came and the command ended as if
        none had (its exception dropped, see the module's doc): then the signal's, said in one line."""
        if not self.requested.is_set() or code not in (None, 0):
            return code
        if not self._said:
            self.announce()
        return self.exit_code

    def leave(self) -> None:
        """Exit now with `exit_code`, once no shielded write is in progress (at most WRITE_WAIT_S), stopping the local
        Prefect server on the way (it would notice its parent gone, a moment later)."""
        with self._writes:
            self._writes.wait_for(lambda: self._writing == 0, timeout=WRITE_WAIT_S)
        server = LocalPrefect._running
        if server is not None and server.child.poll() is None:
            server.child.terminate()
        if not self._said:
            self.announce()
        os._exit(self.exit_code)


INTERRUPT = Interrupt()


# Flows and tasks use the process's Interrupt through these module functions: a task shipped to a Dask or Ray
# worker (and the flow it runs in, which Prefect's context carries along) is pickled by value, and refers to a
# module function by name, where the Interrupt itself (its locks) cannot be pickled.


def stop_if_interrupted() -> None:
    """`INTERRUPT.stop_if_interrupted()`."""
    INTERRUPT.stop_if_interrupted()


def shielded() -> AbstractContextManager[None]:
    """`INTERRUPT.shielded()`."""
    return INTERRUPT.shielded()
