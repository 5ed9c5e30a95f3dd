"""Debian's headless Chromium as the browser tests drive it (Makefile's browser-deps installs it)."""

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
WIDTH, HEIGHT = 1280, 800
