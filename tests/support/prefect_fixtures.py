"""Prefect for the flow tests: one `prefect_test_harness` per test session, started on first use.

Imported by tests/conftest.py. Prefect reads its settings when first imported, so its home and
logging level are set here, before any test module imports a flow.
"""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="unmask-test-prefect-home-"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "true")


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect server and database for the whole session; yields its API URL."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # No flow-run heartbeats, as `unmask`'s own local server has none (flows/local_prefect.py): each flow's end
    # joined its heartbeat thread, up to a second a flow run. Set here and, as the harness sets its API URL, as the
    # process-wide settings too: a flow a test runs on a thread of its own reads those.
    with (
        prefect_test_harness(server_startup_timeout=90),
        temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
        prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()),
    ):
        yield PREFECT_API_URL.value()
