"""The dossier's PDF, printed from its HTML by headless Chromium (the browser the browser tests use)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_ENV = "UNMASK_CHROMIUM"
CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
PRINT_TIMEOUT_S = 120


class PdfError(RuntimeError):
    """No PDF: Chromium is missing or failed; the message says which and what to do."""


def chromium() -> str:
    """$UNMASK_CHROMIUM, else the first Chromium found on this machine."""
    chosen = os.environ.get(CHROMIUM_ENV)
    if chosen:
        if not (Path(chosen).is_file() and os.access(chosen, os.X_OK)):
            raise PdfError(f"${CHROMIUM_ENV}={chosen}: not an executable file")
        return chosen
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise PdfError(
        "the PDF is printed by headless Chromium, and none was found (looked for "
        f"{', '.join(CANDIDATES)}; set ${CHROMIUM_ENV}); on Debian: apt-get install chromium"
    )


def print_pdf(html: Path, pdf: Path) -> Path:
    """Print `html` to `pdf` (A4, backgrounds, no header or footer added by the browser)."""
    with tempfile.TemporaryDirectory(prefix="unmask-chromium-") as profile:
        command = [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--no-pdf-header-footer",
            "--run-all-compositor-stages-before-draw",
            f"--print-to-pdf={pdf}",
            html.resolve().as_uri(),
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=PRINT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PdfError(f"Chromium did not print {html} within {PRINT_TIMEOUT_S} s") from None
    if done.returncode != 0 or not pdf.is_file() or pdf.stat().st_size == 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PdfError(f"Chromium failed to print {html} (exit {done.returncode}): {' / '.join(tail)}")
    return pdf
