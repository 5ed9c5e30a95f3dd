"""Process-wide settings: telemetry off, servers embedded by default, Prefect's home in the state folder
(`models.state.state_dir`)."""

from __future__ import annotations

import os
from pathlib import Path

from models.state import state_dir

# Offline-friendly defaults; a user's own environment always wins (setdefault).
QUIET_DEFAULTS = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
    "STREAMLIT_SERVER_HEADLESS": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def configure_environment() -> Path:
    """Apply the quiet defaults and point Prefect's home under the state folder."""
    for key, value in QUIET_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # only now: importing `models` loads torch and tokenizers, which should start with the defaults in place

    state = state_dir()
    os.environ.setdefault("PREFECT_HOME", str(state / "prefect"))
    return state
