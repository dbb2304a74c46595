"""Check the PDF edition (``make pdf``) as a reader of paper would meet it; ``make pdf`` runs this after printing.

Usage: ``python tools/check_pdf.py _build/pdf/attnbook.pdf _build/singlehtml`` (exit status 1 and one line per
problem when a check fails). Needs poppler-utils (``pdfinfo``, ``pdftotext``, ``pdfimages``).

The checks (issue "The PDF edition builds again"):
- the page count is plausible for the book (:data:`PAGES`);
- every chapter's title, the checklist, the appendix and the bibliography are in the text;
- no raw markup is left: MyST roles and fences, or the "Show code cell" prompts of collapsed cells;
- every figure is embedded: each figure number of the single-page edition is printed, and the PDF holds at least as
  many raster images as the single-page edition shows.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The plausible page count: the book printed 290 pages on A4 when this check was written (ten chapters).
PAGES = (150, 600)
#: Text that only unrendered markup or an unopened collapsed cell leaves.
RAW_MARKUP = ["{glue", "{ref}", "{numref}", "{cite", "{eq}", ":::", "```", "Show code cell", "Hide code cell",
              "Show code", "Click to show"]
BACK_MATTER = ["Masking checklist", "How the numbers were made", "Bibliography"]


def _run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def chapter_titles() -> list[str]:
    """The first ``# `` heading of every chapter notebook."""
    titles = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                match = re.search(r"^# (.+)$", "".join(cell["source"]), flags=re.M)
                if match:
                    titles.append(match.group(1).strip())
                    break
    return titles


def _normalize(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("\u00ad", "")).strip()


def check(pdf: Path, singlehtml: Path) -> list[str]:
    problems = []
    info = _run("pdfinfo", str(pdf))
    pages = int(re.search(r"^Pages:\s+(\d+)", info, flags=re.M).group(1))
    if not PAGES[0] <= pages <= PAGES[1]:
        problems.append(f"{pages} pages, outside the plausible range {PAGES}")
    text = _normalize(_run("pdftotext", str(pdf), "-"))
    for title in [*chapter_titles(), *BACK_MATTER]:
        if _normalize(title) not in text:
            problems.append(f"title missing from the text: {title!r}")
    for markup in RAW_MARKUP:
        if markup in text:
            at = text.index(markup)
            problems.append(f"raw markup {markup!r} in the text: ...{text[max(0, at - 60):at + 60]}...")
    page_html = (singlehtml / "intro.html").read_text()
    figures = sorted(set(re.findall(r'<span class="caption-number">(Fig\. [\d.]+)', page_html)))
    for figure in figures:
        if figure not in text:
            problems.append(f"{figure} (a figure's caption) is not in the PDF's text")
    raster = len(re.findall(r'<img [^>]*src="[^"]+\.(?:png|jpe?g)"', page_html))
    rows = [line.split() for line in _run("pdfimages", "-list", str(pdf)).splitlines()[2:]]
    embedded = sum(1 for row in rows if len(row) > 2 and row[2] == "image")
    if embedded < raster:
        problems.append(f"{embedded} raster images embedded, but the single-page edition shows {raster}")
    if not figures:
        problems.append("no numbered figure found in the single-page edition")
    print(f"{pdf}: {pages} pages, {len(figures)} numbered figures, {embedded} raster images "
          f"({raster} in the single-page edition)")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit(__doc__)
    problems = check(Path(argv[0]), Path(argv[1]))
    print("\n".join(problems) if problems else "the PDF passes every check")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
