"""Print the single-page HTML edition of the book to PDF with headless Chromium (Playwright).

Usage: ``python tools/print_pdf.py _build/singlehtml _build/pdf/attnbook.pdf`` (``make pdf`` does this). The page is
served on 127.0.0.1, MathJax is allowed to finish typesetting, every exercise solution dropdown is opened, and the
result is printed to A4 with the book's colours.
"""

from __future__ import annotations

import sys
from pathlib import Path

from localserver import CHROMIUM_ARGS, chromium_executable, serve

PRINT_CSS = """
@page { size: A4; margin: 16mm 14mm; }
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-header-article, .header-article, .prev-next-area,
.bd-footer, .bd-footer-article, .bd-footer-content, .theme-switch-button, .search-button, .skip-link,
#pst-back-to-top, .headerlink, .toggle-secondary-sidebar, .primary-toggle { display: none !important; }
html, body, .bd-container, .bd-container__inner, .bd-page-width, .bd-main, .bd-content, .bd-article-container,
.bd-article { max-width: 100% !important; width: 100% !important; margin: 0 !important; padding: 0 !important; }
.bd-container__inner { display: block !important; }
pre { white-space: pre-wrap !important; word-break: break-word; }
details, details > * { display: block !important; }
figure, .cell_output img, mjx-container[display="true"], table { break-inside: avoid; }
h1.chapter-start { break-before: page; }
"""


def main(source: str, target: str) -> int:
    from playwright.sync_api import sync_playwright

    html_dir, pdf_path = Path(source).resolve(), Path(target).resolve()
    if not (html_dir / "index.html").exists():
        raise SystemExit(f"{html_dir}/index.html not found: build the singlehtml edition first")
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    with serve(html_dir) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/index.html", wait_until="load")
        page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=60_000)
        page.evaluate("MathJax.startup.promise")
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        # every chapter but the first starts on a new page
        page.evaluate("Array.from(document.querySelectorAll('h1')).slice(1)"
                      ".forEach(h => h.classList.add('chapter-start'))")
        page.add_style_tag(content=PRINT_CSS)
        page.emulate_media(media="print")
        page.pdf(path=str(pdf_path), format="A4", print_background=True, outline=True, tagged=True,
                 display_header_footer=True, header_template="<span></span>",
                 footer_template='<div style="font-size:8px;width:100%;text-align:center">'
                                 '<span class="pageNumber"></span> / <span class="totalPages"></span></div>',
                 margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})
        browser.close()
    print(f"wrote {pdf_path} ({pdf_path.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
