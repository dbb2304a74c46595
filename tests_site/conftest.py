"""Fixtures for the reader-facing checks of the built site: a local HTTP server over ``_build/html`` and a
headless Chromium (Debian's ``chromium`` package) driven by Playwright. Run with ``make site-test`` after
``make book``."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed; `make site-test` installs it (apt-get install chromium)")
    return path


def site_pages() -> list[Path]:
    """Every HTML page of the book (not the theme's static files or the copied notebook sources)."""
    if not (HTML / "index.html").exists():
        return []
    pages = [p for p in HTML.rglob("*.html") if not {"_static", "_sources", "_images"} & set(p.parts)]
    # index.html is Jupyter Book's redirect to the root page; it is tested on its own.
    return sorted(p for p in pages if p != HTML / "index.html")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output readable
        pass


@pytest.fixture(scope="session")
def site_url():
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no index.html: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()
