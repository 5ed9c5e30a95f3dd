"""Prefect's local server booted at the start of a command (flows/local_prefect.py): a real uvicorn child over
a real Prefect database, a real flow run against it, and a child that cannot start (a database URL it cannot
open) leaving Prefect's own local mode to start its server."""

from __future__ import annotations

import os
import sys

import pytest

from flows.local_prefect import LocalPrefect, api


@pytest.fixture
def local_mode(tmp_path, monkeypatch):
    """No API URL in the environment, and a fresh Prefect home; the test harness's settings are left alone
    (they live in Prefect's settings context, which `_configured_api` reads once Prefect is imported)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    if LocalPrefect._running is not None:  # an earlier test's command in this process booted one: these check
        LocalPrefect._running.stop()  # a boot of their own (tests share a process under pytest-xdist too)
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        yield tmp_path


def test_a_booted_server_runs_the_flows_and_stops_with_the_command(local_mode):
    from prefect import flow, get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    local = LocalPrefect.boot()
    assert local is not None and LocalPrefect.boot() is local  # one per process
    assert local.log.parent == local_mode / "prefect"

    @flow(name="local-prefect-probe")
    def probe(x: int) -> int:
        return x + 1

    try:
        with api(local):
            assert PREFECT_API_URL.value() == local.api_url
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
            state = probe(41, return_state=True)
            assert state.result() == 42

            async def stored():
                async with get_client() as client:
                    return await client.read_flow_run(state.state_details.flow_run_id)

            import asyncio

            run = asyncio.run(stored())
            assert run.state.is_completed() and run.name  # recorded by the booted server, not an in-memory stand-in
        assert PREFECT_API_URL.value() != local.api_url  # the settings are the command's only
    finally:
        local.stop()
    assert local.child.poll() is not None and LocalPrefect._running is None


def test_a_server_that_cannot_start_leaves_prefect_to_start_its_own(local_mode, monkeypatch):
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", "postgresql+asyncpg://nobody@127.0.0.1:1/none")
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")
    said: list[str] = []
    local = LocalPrefect.boot()
    try:
        with api(local, warn=said.append):
            from prefect.settings import PREFECT_API_URL

            assert PREFECT_API_URL.value() != local.api_url
    finally:
        local.stop()
    assert len(said) == 1 and "local Prefect server" in said[0] and str(local.log) in said[0], said
    assert "Prefect starts its own" in said[0]


def test_with_an_api_url_nothing_is_started(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    before = LocalPrefect._running
    assert LocalPrefect.boot() is None and LocalPrefect._running is before
    with api(None):
        pass


def test_a_run_in_a_fresh_process_boots_before_prefect_is_imported(tmp_path):
    """The point of booting early: the child starts before this process imports Prefect (2 s on two cores)."""
    import subprocess

    code = (
        "import sys; from flows.local_prefect import LocalPrefect; local = LocalPrefect.boot(); "
        "print('prefect' in sys.modules, local is not None); local.stop()"
    )
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "True"]


# RetryLocked: the child's middleware. A locked SQLite write is a race a real server loses only now and then, so
# the fault is injected: an ASGI app that answers 503 (and raises, as Starlette does after its handler) at first.
def _flaky_app(refusals: int, seen: list):
    async def app(scope, receive, send):
        scope["root_path"] = scope.get("root_path", "") + "/api"  # routing writes into the scope it is given
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.append((scope["root_path"], body))
        if len(seen) <= refusals:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b'{"exception_message": "Service Unavailable"}'})
            raise RuntimeError("database is locked")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"made:" + body})

    return app


def _call(app, body_parts: list[bytes]):
    import asyncio

    incoming = [
        {"type": "http.request", "body": part, "more_body": i < len(body_parts) - 1}
        for i, part in enumerate(body_parts)
    ]
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async def run():
        await app({"type": "http", "method": "POST", "path": "/api/task_runs/", "root_path": ""}, receive, send)

    asyncio.run(run())
    return sent


def test_a_locked_request_is_retried_in_the_server_with_its_body_and_scope_as_they_came():
    from flows.local_prefect import RetryLocked

    seen: list = []
    sent = _call(RetryLocked(_flaky_app(2, seen), delays=(0.001, 0.001, 0.001)), [b'{"name": ', b'"x"}'])
    assert seen == [("/api", b'{"name": "x"}')] * 3  # the same request each time, never "/api/api"
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [201]  # no 503 went out
    assert sent[-1]["body"] == b'made:{"name": "x"}'


def test_a_request_still_locked_after_every_retry_goes_out_as_prefect_answered_it():
    from flows.local_prefect import RetryLocked

    seen: list = []
    with pytest.raises(RuntimeError, match="locked"):  # the last try's error reaches uvicorn, as without us
        _call(RetryLocked(_flaky_app(10, seen), delays=(0.001, 0.001)), [b"{}"])
    assert len(seen) == 3  # two retries, then the client's own backoff takes over


def test_what_is_not_a_503_or_not_http_passes_straight_through():
    import asyncio

    from flows.local_prefect import RetryLocked

    seen: list = []
    sent = _call(RetryLocked(_flaky_app(0, seen)), [b"{}"])
    assert len(seen) == 1 and [m.get("status") for m in sent if "status" in m] == [201]
    scopes = []

    async def lifespan(scope, receive, send):
        scopes.append(scope["type"])

    asyncio.run(RetryLocked(lifespan)({"type": "lifespan"}, None, None))
    assert scopes == ["lifespan"]


def test_the_booted_server_serves_prefect_behind_the_retry(local_mode):
    local = LocalPrefect.boot()
    try:
        assert "flows.local_prefect:create_app" in local.child.args and local.wait_ready()
        import urllib.request

        with urllib.request.urlopen(f"{local.api_url}/admin/version", timeout=10) as answer:
            assert answer.status == 200 and answer.read().strip(b'"')[:1].isdigit()
    finally:
        local.stop()
