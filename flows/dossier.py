"""Build a version's adoption dossier and log it in the registry: what `unmask report` and the promote flow run.

The builder lives a layer up (`dashboards.dossier`, read-only), so it runs as `python -m dashboards.dossier`
in a child process, as `unmask dashboard` runs Streamlit; its files are then logged by `registry.dossiers`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from registry import Registry, RegistryError, resolve_tracking_uri
from registry.dossiers import DossierRef, attach_dossier, dossier_location, log_dossier

REPO = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 600


class DossierFailed(RuntimeError):
    """The dossier could not be built; the message is the builder's own (what is missing, or why no PDF)."""


def build_dossier(
    model: str,
    out: str | Path,
    version: str | None = None,
    stage: str | None = None,
    tracking_uri: str | None = None,
    pdf: bool = True,
) -> dict[str, Any]:
    """Run the builder; {model, version, html, pdf, sha256} of the files it wrote under `out`."""
    command = [sys.executable, "-m", "dashboards.dossier", model, "--out", str(Path(out).resolve())]
    command += ["--version", version] if version else []
    command += ["--stage", stage] if stage else []
    command += [] if pdf else ["--no-pdf"]
    env = dict(os.environ, MLFLOW_TRACKING_URI=resolve_tracking_uri(tracking_uri))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)  # this checkout's code
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise DossierFailed(f"the dossier of {model} was not built within {BUILD_TIMEOUT_S} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        said = next((line.removeprefix("error: ") for line in reversed(lines) if line.startswith("error: ")), None)
        raise DossierFailed(said or f"the dossier builder exited with {done.returncode}: " + " / ".join(lines[-3:]))
    built: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return built


def report(
    model: str,
    out: str | Path,
    version: str | None = None,
    stage: str | None = None,
    tracking_uri: str | None = None,
    pdf: bool = True,
) -> tuple[dict[str, Any], Any]:
    """Build the dossier and log it on the version's evidence run; (built files, `DossierRef`)."""
    built = build_dossier(model, out, version, stage, tracking_uri, pdf)
    ref = log_dossier(
        Registry(tracking_uri), built["model"], built["version"], built["html"], built["pdf"] or None, built["sha256"]
    )
    return built, ref


# the promote flow: the dossier an approver is shown, archived with the move it led to ------------------
def dossier_for_approval(model: str, version: str, stage: str, tracking_uri: str) -> dict[str, Any]:
    """Build and log the dossier of a version about to be approved for `stage`: {ref, location} or {error}.

    A dossier that cannot be printed is built without its PDF; one that cannot be built at all does not
    block the promotion (the gates and checklist decide that), and the reason is kept instead.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="unmask-dossier-") as out:
        try:
            try:
                _, ref = report(model, out, version, stage, tracking_uri)
            except DossierFailed as e:
                if "Chromium" not in str(e):
                    raise
                _, ref = report(model, out, version, stage, tracking_uri, pdf=False)
        except (DossierFailed, RegistryError) as e:
            return {"error": str(e)}
    return {"ref": ref.to_dict(), "location": dossier_location(Registry(tracking_uri), ref)}


def attach_to_move(audit_run_id: str, dossier: dict[str, Any], tracking_uri: str) -> dict[str, Any]:
    """Copy the dossier the approver was shown into the move's audit run; what was attached, or {error}."""
    if "ref" not in dossier:
        return dossier
    try:
        return attach_dossier(Registry(tracking_uri), audit_run_id, DossierRef(**dossier["ref"]))
    except RegistryError as e:
        return {"error": str(e)}
