"""The adoption dossier: one self-contained HTML document (and its PDF) per version, for a review board.

Built only from what the registry holds (`content.dossier_content`), rendered with Jinja2
(`render.render_html`), printed by headless Chromium (`pdf.print_pdf`). Read-only: logging it to MLflow
is `registry.dossiers`' job, driven by `unmask report` (flows/commands/report.py), which runs
`python -m dashboards.dossier` so the CLI layer never imports this one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dashboards.dossier.content import SECTIONS, DossierError, dossier_content
from dashboards.dossier.pdf import PdfError, print_pdf
from dashboards.dossier.render import content_sha256, render_html, stated_sha256, verify_html

__all__ = [
    "SECTIONS",
    "BuiltDossier",
    "DossierError",
    "PdfError",
    "build",
    "content_sha256",
    "dossier_content",
    "render_html",
    "stated_sha256",
    "verify_html",
]


@dataclass(frozen=True)
class BuiltDossier:
    model: str
    version: str
    html: str  # local paths
    pdf: str  # "" without a PDF
    sha256: str  # the content hash the HTML states

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build(
    registry: Any, model: str, out: str | Path, version: str | None = None, stage: str | None = None, pdf: bool = True
) -> BuiltDossier:
    """Write `<model>-v<version>-dossier.html` (and `.pdf`) under `out`; DossierError names what is missing."""
    content = dossier_content(registry, model, version, stage)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"{model.replace('/', '_')}-v{content['version']}{'-' + stage if stage else ''}-dossier"
    html_path = out / f"{name}.html"
    html = render_html(content)
    html_path.write_text(html, encoding="utf-8")
    pdf_path = print_pdf(html_path, out / f"{name}.pdf") if pdf else None
    return BuiltDossier(model, content["version"], str(html_path), str(pdf_path or ""), stated_sha256(html))
