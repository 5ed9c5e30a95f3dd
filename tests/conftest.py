"""Shared fixtures: tiny random-weight checkpoints in the published LLaDA layout, quiet environment."""

from __future__ import annotations

import os

# One torch thread, here and in the processes tests start: the test models are tiny, and on two cores
# shared with other work a second intra-op thread spin-waits for a busy core (the torch-heavy fast
# tests measured 5x slower with two). Set before torch is imported so children inherit it too;
# OMP_NUM_THREADS in the environment still wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from flows.environment import QUIET_DEFAULTS  # noqa: E402

for _k, _v in QUIET_DEFAULTS.items():
    os.environ.setdefault(_k, _v)

torch.set_num_threads(min(2, int(os.environ["OMP_NUM_THREADS"])))


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    """Every test gets its own state folder, so nothing leaks into the checkout's .unmask/."""
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path_factory.mktemp("unmask_home")))


# --- Prefect flow tests (tests/prefect_fixtures.py): the session's one test harness -------------
from prefect_fixtures import prefect_harness  # noqa: E402,F401
from postgres_fixtures import postgres  # noqa: E402,F401  (the team-registry tests: one PostgreSQL cluster)
