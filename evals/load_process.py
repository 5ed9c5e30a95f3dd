"""A load test's client in a process of its own, so that it does not share a local server's interpreter.

`unmask loadtest` without `--url` serves the registry in its own process (uvicorn in a thread, the pool's
compute thread). A client in that process too holds the same interpreter lock for every request it builds
and every response it parses (the `openai` client and httpx: a few milliseconds a request on the bundled
tiny models, as much as a batched decode of one row), so the server is measured slower than it is.
`run_load_apart` runs `evals.loadtest.run_load` in a child Python (`python -m evals.load_process`): the
spec and the prompts go in as one JSON document on stdin, each progress event comes back as one JSON line,
and the result as the last (`LoadResult.to_dict`); no pickle crosses the boundary. A LoadTestError in the
child is raised again here with its message; a child that dies says how, with the end of its stderr. SIGINT or
SIGTERM here is passed on to the child, which stops early and still sends what it measured (evals.loadtest).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evals.loadtest import STOP_SIGNALS, Answer, Event, LoadResult, LoadSpec, LoadTestError, run_load

ROOT = Path(__file__).resolve().parents[1]  # the project, importable in the child however unmask was installed
STDERR_TAIL = 2_000  # characters of a failed child's stderr kept in the error


def run_load_apart(spec: LoadSpec, prompts: list[str], on_event: Event | None = None) -> LoadResult:
    """`run_load(spec, prompts, on_event)`, measured from a child process; returns when the child is done."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    request = json.dumps({"spec": dataclasses.asdict(spec), "prompts": prompts})
    # stderr into a file, not a pipe: a child that logs more than a pipe holds would block while this reads stdout
    errors = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen(
        [sys.executable, "-m", "evals.load_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None  # both piped above
    with _passed_on(child):
        return _result_of(child, request, errors, on_event)


@contextmanager
def _passed_on(child: subprocess.Popen[str]) -> Iterator[None]:
    """While it runs (from the main thread), SIGINT and SIGTERM here stop the child's load instead of this process:
    the child answers them with the result so far."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {received: signal.getsignal(received) for received in STOP_SIGNALS}

    def pass_on(received: int, frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)

    for received in STOP_SIGNALS:
        signal.signal(received, pass_on)
    try:
        yield
    finally:
        for received, handler in kept.items():
            signal.signal(received, handler)


def _result_of(child: subprocess.Popen[str], request: str, errors: Any, on_event: Event | None) -> LoadResult:
    """Send the request, relay the events, and read the result (or the error) of a started child."""
    assert child.stdin is not None and child.stdout is not None  # both piped by run_load_apart
    try:
        try:
            child.stdin.write(request)
            child.stdin.close()
        except BrokenPipeError:  # the child is gone already: its exit status and stderr say why, below
            pass
        outcome = None
        for line in child.stdout:
            message = json.loads(line)
            if "event" in message:
                info = message["info"]
                if "answer" in info:  # an event's answer is an Answer, as in-process
                    info["answer"] = Answer(**info["answer"])
                if on_event is not None:
                    on_event(message["event"], info)
            else:
                outcome = message
        child.wait()
        errors.seek(0)
        stderr = errors.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        errors.close()
    if outcome is None:
        raise RuntimeError(
            f"the load test's client process exited with {child.returncode} without a result; "
            f"its stderr ends: {stderr[-STDERR_TAIL:]}"
        )
    if "error" in outcome:
        raise LoadTestError(outcome["error"])
    return LoadResult.from_dict(outcome["result"])


def plain(info: dict[str, Any]) -> dict[str, Any]:
    """An event's info in JSON types (its Answer as a dict; `run_load_apart` makes it an Answer again)."""
    return {key: dataclasses.asdict(value) if isinstance(value, Answer) else value for key, value in info.items()}


def main() -> None:
    """The child: read the request on stdin, write events and then the result (or the error) as JSON lines."""
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever else prints must not land among the JSON lines

    def emit(message: dict[str, Any]) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    request = json.load(sys.stdin)
    spec = LoadSpec.from_dict(request["spec"])
    try:
        result = run_load(
            spec, request["prompts"], on_event=lambda kind, info: emit({"event": kind, "info": plain(info)})
        )
    except LoadTestError as e:
        emit({"error": str(e)})
        return
    emit({"result": result.to_dict()})


if __name__ == "__main__":
    main()
