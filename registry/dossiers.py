"""Adoption dossiers in the registry: logged as artifacts of a version's evidence run, the latest named by a
version tag, and copied into the audit run of the promotion they were approved on.

A dossier is built by `dashboards.dossier` (read-only); this module only stores and finds it. Each one is
kept under `dossier/<UTC stamp>/` of the evidence run, so earlier dossiers stay archived; the version tag
`unmask.dossier` (JSON: `DossierRef`) names the latest. Attached to a promotion, the same bytes are logged
under `dossier/` of the `alias_move` audit run, checked against the sha256 recorded when it was logged.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from registry.connection import RegistryError
from registry.integrity import sha256_hex
from registry.store import Registry, model_tag, now_iso
from registry.tracking import evidence_run_id

DOSSIER_TAG = model_tag("dossier")
FILES = ("html", "pdf")


@dataclass(frozen=True)
class DossierRef:
    """Where a logged dossier lives: its run, artifact paths, the sha256 it states of itself and of each file."""

    model: str
    version: str
    run_id: str
    html: str  # artifact path of the HTML in `run_id`
    pdf: str  # artifact path of the PDF, "" when none was printed
    sha256: str  # the content hash the dossier states (dashboards.dossier.content_sha256)
    html_sha256: str
    pdf_sha256: str
    at: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def log_dossier(
    registry: Registry, model: str, version: str, html: str | Path, pdf: str | Path | None, sha256: str
) -> DossierRef:
    """Log a built dossier (HTML, and PDF when given) on the version's evidence run; tag it as the latest."""
    run_id = evidence_run_id(registry, model, version)
    at = now_iso()
    folder = "dossier/" + at[:19].replace("-", "").replace(":", "") + "Z"
    html_file, pdf_file = Path(html), Path(pdf) if pdf else None
    for path in (p for p in (html_file, pdf_file) if p is not None):
        registry.client.log_artifact(run_id, str(path), folder)
    ref = DossierRef(
        model,
        version,
        run_id,
        f"{folder}/{html_file.name}",
        f"{folder}/{pdf_file.name}" if pdf_file else "",
        sha256,
        sha256_hex(html_file.read_bytes()),
        sha256_hex(pdf_file.read_bytes()) if pdf_file else "",
        at,
    )
    registry.set_version_tags(model, version, {DOSSIER_TAG: json.dumps(ref.to_dict(), sort_keys=True)})
    return ref


def latest_dossier(registry: Registry, model: str, version: str) -> DossierRef | None:
    """The dossier last logged for a version, or None."""
    text = registry.version_tags(model, version).get(DOSSIER_TAG)
    if not text:
        return None
    try:
        return DossierRef(**json.loads(text))
    except (json.JSONDecodeError, TypeError) as e:
        raise RegistryError(f"{model} version {version}: tag {DOSSIER_TAG} is not a dossier reference ({e})") from None


def dossier_location(registry: Registry, ref: DossierRef, which: str = "html") -> str:
    """Where a person opens a logged dossier file: a URL on a tracking server, else the local file path."""
    path = getattr(ref, which)
    uri = registry.tracking_uri
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/get-artifact?path={path}&run_uuid={ref.run_id}"
    artifact_uri = registry.client.get_run(ref.run_id).info.artifact_uri
    return f"{artifact_uri.removeprefix('file://')}/{path}"


def attach_dossier(registry: Registry, audit_run_id: str, ref: DossierRef) -> dict[str, Any]:
    """Copy a logged dossier into an audit run (under `dossier/`), refusing bytes that no longer match the
    sha256 recorded when it was logged. Returns what was attached: the ref and the audit run's paths."""
    attached = {}
    with tempfile.TemporaryDirectory() as tmp:
        for which in FILES:
            path = getattr(ref, which)
            if not path:
                continue
            data = registry.load_artifact_bytes(ref.run_id, path)
            expected = getattr(ref, f"{which}_sha256")
            if sha256_hex(data) != expected:
                raise RegistryError(
                    f"{ref.model} version {ref.version}: dossier {path} (run {ref.run_id}) was "
                    f"changed after it was logged: recorded sha256 {expected}, found "
                    f"{sha256_hex(data)}; not attached"
                )
            local = Path(tmp) / Path(path).name
            local.write_bytes(data)
            registry.client.log_artifact(audit_run_id, str(local), "dossier")
            attached[which] = f"dossier/{local.name}"
        registry.client.log_text(
            audit_run_id, json.dumps(ref.to_dict(), indent=2, sort_keys=True), "dossier/dossier-ref.json"
        )
    return {"ref": ref.to_dict(), "audit_run_id": audit_run_id, "artifacts": attached}
