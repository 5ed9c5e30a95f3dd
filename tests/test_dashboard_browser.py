"""The dashboard in a real browser: `streamlit run` headless on 127.0.0.1, Debian's Chromium driven by
Playwright, the gate board's rendered text checked and a screenshot saved.

UNMASK_UPDATE_SCREENSHOT=1 also writes the screenshot to docs/gate-board.png.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import registry.read as read
from dashboard_fixtures import free_port, shared_dashboard_registry, stop, wait_healthy
from flows.commands.dashboard import streamlit_command
from flows.environment import QUIET_DEFAULTS
from registry import Registry

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run"]
REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "docs" / "gate-board.png"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture
def dashboard_url(tmp_path):
    """A dashboard server on the filled registry; stopped by its pid afterwards."""
    filled = shared_dashboard_registry()
    port = free_port()
    log = tmp_path / "streamlit.log"
    env = dict(os.environ) | QUIET_DEFAULTS | filled.env()
    with log.open("w") as out:
        server = subprocess.Popen(streamlit_command(port, "127.0.0.1"), cwd=REPO, env=env, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/_stcore/health", server, log)
        yield f"http://127.0.0.1:{port}", filled
    finally:
        stop(server)


def test_gate_board_renders_in_chromium(dashboard_url, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url, filled = dashboard_url
    candidate = f"{filled.candidate} v{filled.candidate_version}"
    gates = len(read.gate_results(filled.candidate, filled.candidate_version, "poc", Registry(filled.tracking_uri)))
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 1500})
        try:
            page = browser.new_page()
            page.goto(url, timeout=60_000)  # the gate board is the default page
            expect(page.get_by_role("heading", name="Gate board")).to_be_visible(timeout=90_000)
            tables = page.locator("[data-testid='stTable']")
            held = tables.filter(has_text="held by").first
            expect(held).to_contain_text(candidate, timeout=60_000)
            expect(held).to_contain_text(f"{filled.fallback} v{filled.fallback_version}")
            board = tables.filter(has_text=f"{candidate} [candidate, poc]").first
            expect(board).to_contain_text(f"passed {gates}/{gates}")
            expect(board).to_contain_text("failed")
            # open the candidate's staging row: every gate with its reason
            title = f"{candidate} [candidate, poc] · staging ·"
            row = page.locator("[data-testid='stExpander']").filter(has_text=title).first
            row.get_by_text(title, exact=False).click()
            expect(row).to_contain_text("not reproducible: fresh_process failed")
            expect(row).to_contain_text("accuracy on arith")
            for label in ("Scores", "Quality vs latency", "Candidate", "Promotions"):
                expect(page.get_by_role("link", name=label)).to_be_visible()
            expect(page.get_by_test_id("stStatusWidget")).to_be_hidden(timeout=60_000)  # the script run is over
            page.wait_for_timeout(500)  # let the last paint settle before the picture
            shot = tmp_path / "gate-board.png"
            page.screenshot(path=str(shot), full_page=True)
            # the chart page draws Plotly in the browser too
            page.get_by_role("link", name="Quality vs latency").click()
            expect(page.get_by_role("heading", name="Quality vs latency")).to_be_visible(timeout=60_000)
            expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=60_000)
            expect(page.locator(".js-plotly-plot").first).to_contain_text("AR fallback")
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    if os.environ.get("UNMASK_UPDATE_SCREENSHOT") == "1":
        shutil.copy(shot, SCREENSHOT)
