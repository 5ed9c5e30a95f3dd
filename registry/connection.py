"""Where the registry lives and how to reach it: embedded SQLite by default, an MLflow server when asked.

The embedded default is `sqlite:///<state_dir()>/mlflow/mlflow.db` with artifacts beside it; set
`MLFLOW_TRACKING_URI` (or pass `tracking_uri`) to use an `mlflow server`. A server that does not
answer its health check within a few seconds is a `RegistryUnavailable`, not minutes of retries.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from models.state import state_dir

# Artifact reads are small JSON files; MLflow's per-download progress bar would flood CLI and logs.
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

EXPERIMENT_PREFIX = "unmask-"  # every experiment unmask keeps is named so (registry/rollouts.py's too)
EVALUATIONS_EXPERIMENT = f"{EXPERIMENT_PREFIX}evaluations"
AUDIT_EXPERIMENT = f"{EXPERIMENT_PREFIX}audit"


class RegistryError(RuntimeError):
    """A registry operation that cannot be done; the message says which and why."""


class RegistryUnavailable(RegistryError):
    """The MLflow tracking server cannot be reached."""


class NotAuthenticated(RegistryError):
    """The tracking server did not accept the client's credentials (HTTP 401)."""


def not_authenticated(tracking_uri: str, error: BaseException) -> NotAuthenticated | None:
    """The one line for a tracking server's 401 (user name or password not accepted), else None: a read refused
    for that reason is not "no registered model"."""
    text = str(error)
    if "error code 401" not in text and "UNAUTHENTICATED" not in text:
        return None
    user = os.environ.get("MLFLOW_TRACKING_USERNAME", "")
    who = f"MLflow user {user!r}" if user else "this client (MLFLOW_TRACKING_USERNAME is not set)"
    return NotAuthenticated(
        f"the MLflow server at {tracking_uri} did not authenticate {who} (401): check MLFLOW_TRACKING_USERNAME "
        "and MLFLOW_TRACKING_PASSWORD"
    )


def default_tracking_uri() -> str:
    folder = state_dir() / "mlflow"
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def resolve_tracking_uri(tracking_uri: str | None = None) -> str:
    """The explicit URI, else $MLFLOW_TRACKING_URI, else the embedded SQLite store."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def artifact_root(tracking_uri: str) -> str | None:
    """Where experiments keep artifacts: beside the SQLite file; a server decides for itself (None)."""
    if tracking_uri.startswith("sqlite:///"):
        folder = Path(tracking_uri.removeprefix("sqlite:///")).parent / "artifacts"
        folder.mkdir(parents=True, exist_ok=True)
        return folder.as_uri()
    return None


def check_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """Raise `RegistryUnavailable` unless an http(s) tracking server answers /health."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            if response.status == 200:
                return
            problem = f"HTTP {response.status}"
    except (urllib.error.URLError, OSError) as e:
        problem = str(getattr(e, "reason", e))
    raise RegistryUnavailable(
        f"MLflow server at {tracking_uri} is unreachable ({problem}). Start it (`mlflow server --host 127.0.0.1 "
        f"--port PORT`) or unset MLFLOW_TRACKING_URI to use the embedded store under {state_dir()}/mlflow/."
    )
