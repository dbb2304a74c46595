"""Print the single-page HTML edition of the book to PDF with headless Chromium (Playwright).

Usage: ``python tools/print_pdf.py _build/singlehtml _build/pdf/attnbook.pdf`` (``make pdf`` does this). The page is
served on 127.0.0.1, MathJax is allowed to finish typesetting, every dropdown (exercise solutions, collapsed cells)
is opened, and the result is printed to A4 with the book's colours:

- a title page (title, subtitle, authors, version, repository, date of printing);
- a contents page, with the page on which each chapter starts (found by a first printing and ``pdftotext``, from
  poppler-utils; without it the contents has no page numbers and a warning is printed);
- every chapter and back-matter page starts on a new page; page numbers in the footer.

What a printed page shows of a hidden cell is chosen in ``_ext/attnbook_site.py`` (README, "The PDF edition").
"""

from __future__ import annotations

import datetime as _dt
import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from localserver import CHROMIUM_ARGS, chromium_executable, serve

ROOT = Path(__file__).resolve().parents[1]

PRINT_CSS = """
@page { size: A4; margin: 16mm 14mm; }
.bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .bd-header-article, .header-article, .prev-next-area,
.bd-footer, .bd-footer-article, .bd-footer-content, .theme-switch-button, .search-button, .skip-link,
#pst-back-to-top, .headerlink, .toggle-secondary-sidebar, .primary-toggle { display: none !important; }
html, body, .bd-container, .bd-container__inner, .bd-page-width, .bd-main, .bd-content, .bd-article-container,
.bd-article { max-width: 100% !important; width: 100% !important; margin: 0 !important; padding: 0 !important; }
.bd-container__inner { display: block !important; }
pre { white-space: pre-wrap !important; word-break: break-word; overflow: visible !important; }
/* 88-character code lines (black's width) fit A4's text width at this size; longer output lines wrap. */
pre, pre code { font-size: 11px !important; line-height: 1.35 !important; }
img, svg, figure { max-width: 100% !important; height: auto; }
details, details > * { display: block !important; }
details > summary { display: none !important; }
figure, .cell_output img, mjx-container[display="true"], table { break-inside: avoid; }
/* The theme keeps code blocks and admonitions whole, which leaves half-empty pages; on paper they may break. */
div.highlight, div[class*="highlight-"], div.literal-block-wrapper, .admonition, div.admonition, pre {
  break-inside: auto !important; display: block !important; }
h1, h2, h3, h4 { break-after: avoid; }
.chapter-start { break-before: page; }
.print-title-page { break-after: page; text-align: center; padding-top: 55mm !important; }
.print-title-page h1 { font-size: 30pt; margin-bottom: 6mm; display: block !important; }
.print-title-page .subtitle { font-size: 15pt; font-style: italic; margin-bottom: 40mm; }
.print-title-page p { font-size: 12pt; margin: 2mm 0; }
#jb-print-docs-body { break-after: page; }
#jb-print-docs-body > h1 { display: none !important; }
#jb-print-toc a { text-decoration: none; display: inline !important; padding: 0 !important; }
#jb-print-toc, #jb-print-toc nav, #jb-print-toc ul { display: block !important; width: 100% !important; }
#jb-print-toc ul { list-style: none !important; padding-left: 4mm !important; }
#jb-print-toc li { list-style: none !important; display: flex !important; justify-content: space-between;
                   width: 100%; margin: 1.5mm 0; }
#jb-print-toc .toc-page { margin-left: auto; padding-left: 4mm; }
section#chapters > h2 { display: none !important; }
div.print-collapsed { border-left: 3px solid #ccc; padding-left: 3mm !important; }
"""

#: Marks chapter starts, adds the title page and the page numbers of the contents. ``args``: ``{"title_html":
#: str, "pages": {document id: page number}}``. Returns ``{document id: title as printed}``.
PREPARE_JS = """
(args) => {
  const titles = {};
  document.querySelectorAll('span[id^="document-"]').forEach(span => {
    const section = span.nextElementSibling;
    if (!section) return;
    section.classList.add('chapter-start');
    const heading = section.querySelector('h1, h2, h3');
    if (heading) titles[span.id] = heading.textContent.replace(/#$/, '').trim();
  });
  // The introduction's sections after its contents (prerequisites, how to cite) print before chapter 1.
  const chapters = document.querySelector('section#chapters');
  if (chapters) {
    let next = chapters.nextElementSibling;
    while (next) {
      const after = next.nextElementSibling;
      chapters.parentNode.insertBefore(next, chapters);
      next = after;
    }
  }
  const docs = document.querySelector('#jb-print-docs-body');
  if (docs && !document.querySelector('.print-title-page')) {
    const title = document.createElement('section');
    title.className = 'print-title-page';
    title.innerHTML = args.title_html;
    docs.parentNode.insertBefore(title, docs);
  }
  document.querySelectorAll('#jb-print-toc a[href^="#document-"]').forEach(a => {
    let page = a.parentNode.querySelector(':scope > .toc-page');
    if (!page) {
      page = document.createElement('span');
      page.className = 'toc-page';
      a.after(page);
    }
    page.textContent = args.pages[a.getAttribute('href').slice(1)] ?? '000';
  });
  document.querySelectorAll('details').forEach(d => d.open = true);
  return titles;
}
"""


def title_page_html() -> str:
    """The title page: the book's title and author from ``_config.yml``, the subtitle, version and repository."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "code" / "attnbook" / "__init__.py").read_text())
    parts = [
        f"<h1>{html.escape(config['title'])}</h1>",
        '<div class="subtitle">A runnable textbook on attention mechanisms</div>',
        f"<p>{html.escape(config['author'])}</p>",
        f"<p>Version {html.escape(version.group(1) if version else '?')}, printed "
        f"{_dt.date.today().isoformat()}</p>",
        f"<p>{html.escape(config['repository']['url'])}</p>",
    ]
    return "\n".join(parts)


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def start_pages(pdf: Path, titles: dict[str, str]) -> dict[str, int]:
    """``{document id: page}``: the first page, after the contents, whose text begins with the document's title.
    Empty when ``pdftotext`` is not installed."""
    if shutil.which("pdftotext") is None:
        print("pdftotext (poppler-utils) not found: the contents will have no page numbers", file=sys.stderr)
        return {}
    text = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], check=True, capture_output=True,
                          text=True).stdout
    pages = [_normalize(page) for page in text.split("\f")]
    found = {}
    for doc, title in titles.items():
        key = _normalize(title)[:30]
        for number, page in enumerate(pages, start=1):
            if number > 2 and page.startswith(key):
                found[doc] = number
                break
    missing = sorted(set(titles) - set(found))
    if missing:
        print(f"no start page found for {missing}", file=sys.stderr)
    return found


def _print(page, path: Path) -> None:
    page.pdf(path=str(path), format="A4", print_background=True, outline=True, tagged=True,
             display_header_footer=True, header_template="<span></span>",
             footer_template='<div style="font-size:8px;width:100%;text-align:center">'
                             '<span class="pageNumber"></span> / <span class="totalPages"></span></div>',
             margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})


def main(source: str, target: str) -> int:
    from playwright.sync_api import sync_playwright

    html_dir, pdf_path = Path(source).resolve(), Path(target).resolve()
    if not (html_dir / "index.html").exists():
        raise SystemExit(f"{html_dir}/index.html not found: build the singlehtml edition first")
    pdf_path.parent.mkdir(parents=True, exist_ok=True)
    args = {"title_html": title_page_html(), "pages": {}}
    with serve(html_dir) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_executable(), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/index.html", wait_until="load")
        page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=60_000)
        page.evaluate("MathJax.startup.promise")
        page.add_style_tag(content=PRINT_CSS)
        page.emulate_media(media="print")
        titles = page.evaluate(PREPARE_JS, args)
        # First printing: find where each chapter starts; the second prints those pages into the contents. The
        # placeholders have as many digits as the numbers, so no page moves between the two.
        with tempfile.TemporaryDirectory() as tmp:
            draft = Path(tmp) / "draft.pdf"
            _print(page, draft)
            args["pages"] = start_pages(draft, titles)
        page.evaluate(PREPARE_JS, args)
        _print(page, pdf_path)
        browser.close()
    print(f"wrote {pdf_path} ({pdf_path.stat().st_size / 1e6:.1f} MB; contents with "
          f"{len(args['pages'])} of {len(titles)} start pages)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
