"""Take the README's screenshots of the built site with headless Chromium (Playwright).

Usage, after ``make book``: ``.venv/bin/python tools/screenshots.py`` writes ``docs/screenshots/intro.png`` and
``docs/screenshots/chapter.png`` (a chapter page scrolled to its first figure).
"""

from __future__ import annotations

from pathlib import Path

from localserver import CHROMIUM_ARGS, chromium_executable, serve

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
OUT = ROOT / "docs" / "screenshots"


def main() -> None:
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with serve(HTML) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
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
    print("wrote", *sorted(str(p.relative_to(ROOT)) for p in OUT.glob("*.png")))


if __name__ == "__main__":
    main()
