"""Addresses of the MLflow UI for runs: one place that knows the UI's routes and where it listens.

On a tracking server the UI is the server itself; on the embedded store nobody serves one, so a link either is
None (`run_url`, for pages that only link what can be opened) or points where `mlflow_ui_command` would open
it (`run_link`, for summaries that say how to open it).
"""

from __future__ import annotations

UI_PORT = 5000  # where `mlflow ui` listens, as `mlflow_ui_command` starts it
LOCAL_UI = f"http://127.0.0.1:{UI_PORT}"


def served(tracking_uri: str) -> bool:
    """Whether the tracking URI is a server, which serves the UI too."""
    return tracking_uri.startswith(("http://", "https://"))


def run_url(tracking_uri: str, experiment_id: str, run_id: str | None) -> str | None:
    """The MLflow UI address of a run on a tracking server; None on the embedded store (no UI is running)."""
    if not run_id or not experiment_id or not served(tracking_uri):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def run_link(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """A run's UI address: on the server, else on the local UI that `mlflow_ui_command` starts."""
    base = tracking_uri.rstrip("/") if served(tracking_uri) else LOCAL_UI
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def run_url_base(tracking_uri: str) -> str:
    """Where the MLflow UI opens a run by id alone (its `/runs/<id>` route), on a tracking server; else ""."""
    return f"{tracking_uri.rstrip('/')}/#/runs/" if served(tracking_uri) else ""


def mlflow_ui_command(uri: str) -> str:
    """How to open the MLflow UI on the registry at tracking URI `uri` (port 5000, where run links point)."""
    if served(uri):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --port {UI_PORT}"
