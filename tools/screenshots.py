"""Take the README's screenshots of the built site with headless Chromium (Playwright).

Usage, after ``make book``: ``.venv/bin/python tools/screenshots.py`` writes ``docs/screenshots/intro.png`` and
``docs/screenshots/chapter.png`` (a chapter page scrolled to its first figure).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
OUT = ROOT / "docs" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # a browser closing early is not an error
        pass


def main() -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 860}, color_scheme="light")
        page.goto(f"{base}/intro.html", wait_until="load")
        page.screenshot(path=str(OUT / "intro.png"))
        page.goto(f"{base}/chapters/01_soft_lookup.html", wait_until="load")
        page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
        page.evaluate("MathJax.startup.promise")
        page.locator("figure").first.scroll_into_view_if_needed()
        page.evaluate("window.scrollBy(0, -120)")
        page.screenshot(path=str(OUT / "chapter.png"))
        browser.close()
    server.shutdown()
    print("wrote", *sorted(str(p.relative_to(ROOT)) for p in OUT.glob("*.png")))


if __name__ == "__main__":
    main()
