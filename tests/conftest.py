"""The suite's tiers and what every test shares: a state folder of its own, the same terminal, one torch thread.

Tiers are folders, and the folder is the marker (`pytest -m unit`): `unit/` runs in process on values, files and
tiny models; `integration/` adds a real MLflow store, the CLI in process and the app in process; `e2e/` starts what
a user starts (uvicorn, subprocesses, the Prefect server, browsers, clusters, PostgreSQL, rollouts).
`make test-fast` runs unit and integration, `make test` all three, each on every core (pytest-xdist)."""

from __future__ import annotations

import os

# The caller's terminal and locale never reach a test (issue 36): a console made at import time reads COLUMNS
# once and keeps it (`COLUMNS=100 make test` wrapped an asserted line), so these are settled before any unmask
# module is imported, and again around every test. Without COLUMNS a console asks the environment each time it
# prints, so a test's own `env={"COLUMNS": "200"}` (CliRunner) or subprocess `env=` still decides its width.
TERMINAL_CLEARED = (
    "COLUMNS",
    "LINES",
    "NO_COLOR",
    "FORCE_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "TTY_COMPATIBLE",
    "TTY_INTERACTIVE",
    "LANGUAGE",
    "LC_CTYPE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
)
TERMINAL_SET = {"TERM": "xterm-256color", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
for _k in TERMINAL_CLEARED:
    os.environ.pop(_k, None)
os.environ.update(TERMINAL_SET)

# One torch thread, here and in the processes tests start: the test models are tiny, and on two cores
# shared with other work a second intra-op thread spin-waits for a busy core (the torch-heavy fast
# tests measured 5x slower with two). Set before torch is imported (torch reads it when it starts), so children
# inherit it too; OMP_NUM_THREADS in the environment still wins. torch itself is not imported here: a run of
# tests that need no model does not pay for it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import sqlite3

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from flows.environment import QUIET_DEFAULTS

for _k, _v in QUIET_DEFAULTS.items():
    os.environ.setdefault(_k, _v)


@event.listens_for(Engine, "connect")
def _sqlite_commits_without_fsync(dbapi_connection: object, _record: object) -> None:
    """Every SQLite store a test process opens (the MLflow registries) commits without waiting for the disk.

    A registry test commits hundreds of times; with SQLite's default (synchronous=FULL) each commit is an fsync, and
    on a shared disk those fsyncs were up to half of a registry test's time (less when the CPUs are the queue).
    Turning them off changes only what a power cut or OS crash could lose: locking, transactions and what another
    process reads are SQLite's as ever, and a process killed mid-write still leaves the database whole. Servers and
    CLIs that tests start as subprocesses keep SQLite's default.

    A file that is not a database fails the pragma; it is left for the first query to find, as without this hook
    (failing here made MLflow's engine set-up retry for 100 s: the corrupt-store test took 203 s)."""
    if isinstance(dbapi_connection, sqlite3.Connection):
        try:
            dbapi_connection.execute("PRAGMA synchronous=OFF")
        except sqlite3.DatabaseError:
            pass


TIERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Each test carries its folder's tier as a marker; a test outside the three folders is a layout error."""
    for item in items:
        tier = next((part for part in item.path.relative_to(config.rootpath).parts[1:2] if part in TIERS), None)
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid}: a test module lives in tests/unit, tests/integration or "
                f"tests/e2e (its folder is its tier)"
            )
        item.add_marker(tier)


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    """Every test gets its own state folder and personal keys folder (empty), so nothing leaks into the checkout's
    .unmask/ or comes from the user's ~/.config/unmask/keys, and the same terminal
    and locale (TERMINAL_CLEARED, TERMINAL_SET), whatever the one before it set."""
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path_factory.mktemp("unmask_home")))
    monkeypatch.setenv("UNMASK_KEYS_HOME", str(tmp_path_factory.mktemp("keys_home")))  # nobody's own keys sign here
    for name in TERMINAL_CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in TERMINAL_SET.items():
        monkeypatch.setenv(name, value)


# The support modules whose fixtures any tier uses: the session's one Prefect harness, one PostgreSQL cluster, the
# dashboard's filled registry, the team's signing key, the people's keys. Registered once here, so no test module
# imports a fixture by name.
pytest.register_assert_rewrite("tests.support")  # a support module's assert explains itself as a test's does
pytest_plugins = [
    "tests.support.servers",
    "tests.support.prefect_fixtures",
    "tests.support.postgres_fixtures",
    "tests.support.dashboard_fixtures",
    "tests.support.governance",
]
