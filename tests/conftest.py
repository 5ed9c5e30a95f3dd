"""Shared fixtures: tiny random-weight checkpoints in the published LLaDA layout, quiet environment."""

from __future__ import annotations

import os

import pytest
import torch

from flows.environment import QUIET_DEFAULTS

for _k, _v in QUIET_DEFAULTS.items():
    os.environ.setdefault(_k, _v)

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path_factory, monkeypatch):
    """Every test gets its own state folder, so nothing leaks into the checkout's .unmask/."""
    monkeypatch.setenv("UNMASK_HOME", str(tmp_path_factory.mktemp("unmask_home")))


# --- Prefect flow tests (tests/prefect_fixtures.py): the session's one test harness -------------
from prefect_fixtures import prefect_harness  # noqa: E402,F401
