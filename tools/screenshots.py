"""Take the README's screenshots of the built site with headless Chromium (Playwright).

Usage, after ``make book``: ``.venv/bin/python tools/screenshots.py`` writes ``docs/screenshots/intro.png`` and three
chapter pages: ``chapter.png`` (chapter 1 at its first figure, the soft-lookup diagram), ``answer.png`` (chapter 5 at
its answer box, glued from the stored runs) and ``attention.png`` (chapter 4 at its attention maps, with colour bars).
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
        shots = [("chapters/01_soft_lookup.html", "figure", "chapter.png"),
                 ("chapters/05_seq2vec_masking.html", ".admonition", "answer.png"),
                 ("chapters/04_seq2seq_attention.html", "#fig-seq2seq-heatmaps, figure:has(img[alt*='heatmap'])",
                  "attention.png")]
        for url, selector, name in shots:
            page.goto(f"{base}/{url}", wait_until="load")
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=30_000)
            page.evaluate("MathJax.startup.promise")
            target = page.locator(selector).first
            if not target.count():          # fall back to the page's first figure
                target = page.locator("figure").first
            target.scroll_into_view_if_needed()
            page.evaluate("window.scrollBy(0, -120)")
            page.screenshot(path=str(OUT / name))
        browser.close()
    print("wrote", *sorted(str(p.relative_to(ROOT)) for p in OUT.glob("*.png")))


if __name__ == "__main__":
    main()
