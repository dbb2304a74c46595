"""What a reader sees on each built page, checked on the files of the build (no browser needed): no progress bars,
no bare glued values, a favicon that exists. Run with ``make site-test`` after ``make book``."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from conftest import HTML, ROOT, site_pages

PAGES = site_pages()
EXECUTED = sorted((ROOT / "_build" / "jupyter_execute").rglob("*.ipynb"))

#: Text that only a progress bar prints: tqdm's percentage and bar ("100%|####|", "|████|"), its counter with
#: times ("5/5 [00:03<00:00"), its rates ("12.3it/s", "4.2s/it").
PROGRESS_TEXT = [
    re.compile(r"\d+%\|"),
    re.compile(r"\|[#█▏▎▍▌▋▊▉ ]{3,}\|"),
    re.compile(r"\d+/\d+ \[\d+:\d\d<"),
    re.compile(r"\d(?:\.\d+)?\s?(?:it/s|s/it)\b"),
]
#: Tags whose cells show the reader no output.
NO_OUTPUT_SHOWN = {"remove-cell", "remove-output"}


class _Text(HTMLParser):
    """The text of a page as a reader sees it (no scripts, no styles), and its ``<link rel="icon">`` targets."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.icons: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "style"):
            self._skip += 1
        if tag == "link" and "icon" in (attrs.get("rel") or "").split() and attrs.get("href"):
            self.icons.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _read(page: Path) -> _Text:
    parser = _Text()
    parser.feed(page.read_text(errors="replace"))
    return parser


def progress_text(text: str) -> list[str]:
    """The progress-bar fragments in ``text`` (empty when there are none)."""
    return [m.group(0) for pattern in PROGRESS_TEXT for m in pattern.finditer(text)]


def echoed_glue(notebook: dict) -> list[tuple[int, str]]:
    """``(cell index, value)`` for each shown cell whose result (``execute_result``) repeats a value the same
    cell glued: the bare number or string a cell ending on ``glue(...)`` puts on the page."""
    found = []
    for i, cell in enumerate(notebook.get("cells", [])):
        if cell.get("cell_type") != "code" or set(cell.get("metadata", {}).get("tags", [])) & NO_OUTPUT_SHOWN:
            continue
        glued = set()
        for output in cell.get("outputs", []):
            prefix = output.get("metadata", {}).get("scrapbook", {}).get("mime_prefix")
            if prefix is not None:
                glued.add("".join(output.get("data", {}).get(f"{prefix}text/plain", "")))
        for output in cell.get("outputs", []):
            if output.get("output_type") == "execute_result":
                shown = "".join(output.get("data", {}).get("text/plain", ""))
                if shown in glued:
                    found.append((i, shown))
    return found


def _rel(path: Path, base: Path) -> str:
    return path.relative_to(base).as_posix()


def test_the_checks_can_fail():
    assert progress_text("runs: 100%|##########| 5/5 [00:03<00:00,  1.52it/s]")
    assert progress_text("training  40%|████      | 2/5 [00:01<00:02, 2.1s/it]")
    assert not progress_text("Estimated run time of training three models: about 40 s; 5/5 seeds, 100% done")
    glue_record = {"output_type": "display_data", "metadata": {"scrapbook": {"name": "x", "mime_prefix": "p/"}},
                   "data": {"p/text/plain": "0.25"}}
    echo = {"output_type": "execute_result", "data": {"text/plain": "0.25"}, "metadata": {}}
    cell = {"cell_type": "code", "metadata": {}, "outputs": [glue_record, echo]}
    assert echoed_glue({"cells": [cell]}) == [(0, "0.25")]
    assert echoed_glue({"cells": [dict(cell, metadata={"tags": ["remove-cell"]})]}) == []
    assert echoed_glue({"cells": [dict(cell, outputs=[glue_record])]}) == []


def test_the_book_was_built_and_executed():
    assert PAGES, f"no pages under {HTML}: run `make book` first"
    assert EXECUTED, "no executed notebooks under _build/jupyter_execute: run `make book` first"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: _rel(p, HTML))
def test_no_progress_bar_on_the_page(page):
    text = html.unescape(" ".join(_read(page).parts))
    assert not progress_text(text), f"progress-bar text on the page: {progress_text(text)[:5]}"


@pytest.mark.parametrize("notebook", EXECUTED, ids=lambda p: _rel(p, ROOT / "_build" / "jupyter_execute"))
def test_no_glued_value_is_echoed(notebook):
    found = echoed_glue(json.loads(notebook.read_text()))
    assert not found, (f"cells that show a bare glued value (cell, value): {found[:5]}; end the cell without a "
                       "bare glue(...), or move the glue into a hidden (remove-cell) cell")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: _rel(p, HTML))
def test_page_links_a_favicon_that_exists(page):
    """A page that names its icon is never asked for /favicon.ico, whose 404 would be a console error."""
    icons = _read(page).icons
    assert icons, "no <link rel=icon>: the browser would request /favicon.ico"
    for href in icons:
        assert not urlparse(href).scheme, f"the favicon must be served with the book, not from {href}"
        assert (page.parent / unquote(href)).resolve().is_file(), f"favicon {href} is missing from the build"
