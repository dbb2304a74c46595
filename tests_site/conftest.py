"""Fixtures for the reader-facing checks of the built site: a local HTTP server over ``_build/html`` and a
headless Chromium (Debian's ``chromium`` package) driven by Playwright. Run with ``make site-test`` after
``make book``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import localserver  # noqa: E402
from localserver import CHROMIUM_ARGS, serve  # noqa: E402

HTML = ROOT / "_build" / "html"
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def chromium_path() -> str:
    try:
        return localserver.chromium_executable()
    except SystemExit as exc:
        pytest.fail(str(exc))


def site_pages() -> list[Path]:
    """Every HTML page of the book (not the theme's static files or the copied notebook sources)."""
    if not (HTML / "index.html").exists():
        return []
    pages = [p for p in HTML.rglob("*.html") if not {"_static", "_sources", "_images"} & set(p.parts)]
    # index.html is Jupyter Book's redirect to the root page; it is tested on its own.
    return sorted(p for p in pages if p != HTML / "index.html")


@pytest.fixture(scope="session")
def site_url():
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} has no index.html: run `make book` first")
    with serve(HTML) as base:
        yield base


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()
