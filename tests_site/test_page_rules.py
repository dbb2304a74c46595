"""The page rules (docs/CONTRIBUTING.md, "How a page reads"; tools/page_rules.py), checked on every chapter page of
the built site in headless Chromium at 1280 x 900, as a reader sees it:

- no code block scrolls sideways;
- no bookkeeping phrase (commits, sessions, store files, worker counts, ...) in the prose, captions or visible
  outputs (code cells' sources, code blocks and the references left out; collapsed dropdowns are not visible);
- at most 25 visible code lines before the chapter's first section;
- every box whose title is a question answers it in at most 120 words of prose;
- each group of three chapters (1-3, 4-6, 7-9) has at most 6% of its prose sentences over 40 words and at most 3.5
  numbers per 100 words of prose (issues 34-36; tables, code, outputs, math, headings and collapsed dropdowns do not
  count, nor do the numbers of links such as "Fig. 4.8" or a citation's year); chapter 10 is a group of its own;
- one voice per page (issue 43): a chapter's prose names no statistical test, says nothing of "stored" numbers,
  "live runs", "quick mode" or "full mode", and says "seed" at most 5 times; a chapter with full-scale runs links to
  its evidence page exactly once;
- no page of the site shows unrendered markup (``$...$``, ``\\(``, ``{cite}``, ``{ref}``, ``{glue}``, ``{numref}``,
  ``:::``, LaTeX commands).

Run with ``make site-test`` after ``make book``.
"""

from __future__ import annotations

import sys

import pytest

from conftest import HTML, ROOT

sys.path.insert(0, str(ROOT / "tools"))
import page_rules  # noqa: E402

CHAPTER_PAGES = sorted(p.relative_to(HTML).as_posix() for p in (HTML / "chapters").glob("*.html"))
#: Every page of the site that a reader reads (the root index.html only redirects to the introduction).
ALL_PAGES = sorted(p.relative_to(HTML).as_posix() for p in HTML.rglob("*.html")
                   if not {"_static", "_sources", "_images", "genindex.html", "search.html"} & set(p.parts)
                   and p != HTML / "index.html")
#: The chapters with full-scale runs, each with an evidence page ``evidence/chNN.html``.
EVIDENCE_CHAPTERS = ("03", "04", "05", "07", "08", "09", "10")

#: Measures one page; returns what the tests below need.
MEASURE_JS = """
() => {
  const article = document.querySelector('article.bd-article');
  // Inside a closed <details> (a collapsed cell, a dropdown) nothing shows, though Chromium still lays it out.
  const collapsed = e => e.closest('details:not([open])') !== null && e.closest('summary') === null;
  const visible = e => !collapsed(e) && (e.offsetParent !== null || e.getClientRects().length > 0);
  const wide = Array.from(article.querySelectorAll('pre'))
    .filter(p => visible(p) && p.scrollWidth > p.clientWidth + 1)
    .map(p => ({width: p.scrollWidth, client: p.clientWidth,
                line: p.textContent.split('\\n').reduce((a, l) => l.length > a.length ? l : a, '')}));
  const firstSection = article.querySelector('section section > h2, section h2');
  const before = e => !firstSection ||
    (e.compareDocumentPosition(firstSection) & Node.DOCUMENT_POSITION_FOLLOWING);
  const codeLines = Array.from(article.querySelectorAll('.cell_input pre'))
    .filter(p => visible(p) && before(p))
    .reduce((n, p) => n + p.textContent.split('\\n').filter(l => l.trim()).length, 0);
  const boxes = Array.from(article.querySelectorAll('.admonition')).map(box => {
    const title = box.querySelector(':scope > .admonition-title');
    if (!title || !title.innerText.trim().endsWith('?')) return null;
    const copy = box.cloneNode(true);
    copy.querySelectorAll(':scope > .admonition-title, table, pre, .math, mjx-container').forEach(e => e.remove());
    return {title: title.innerText.trim(), text: copy.textContent};
  }).filter(b => b);
  // The prose as a reader sees it: hide code (cell sources and code blocks outside outputs), math and the
  // references, then read the visible text (collapsed dropdowns have none).
  const hidden = [];
  article.querySelectorAll('.cell_input, div[class*="highlight-"]:not(.cell_output *), .math, mjx-container, ' +
                           '.bibliography, .citation-list, div.citation, .headerlink, ' +
                           'details:not([open]) > :not(summary)').forEach(e => {
    hidden.push([e, e.style.display]);
    e.style.display = 'none';
  });
  const prose = article.innerText;
  // For the prose measures, also hide tables, the outputs of code cells (a figure's caption stays) and headings.
  article.querySelectorAll('table, .cell_output pre, .cell_output img, .cell_output .text_html, ' +
                           'h1, h2, h3, h4, h5, h6, .admonition-title, .sd-summary-title').forEach(e => {
    hidden.push([e, e.style.display]);
    e.style.display = 'none';
  });
  const statsProse = article.innerText;
  const links = Array.from(article.querySelectorAll('a')).filter(visible).map(a => a.innerText);
  const evidenceLinks = Array.from(article.querySelectorAll('a[href]'))
    .map(a => a.getAttribute('href')).filter(h => /(^|\\/)evidence\\/ch\\d\\d\\.html/.test(h));
  hidden.forEach(([e, display]) => e.style.display = display);
  return {wide, codeLines, boxes, prose, statsProse, links, evidenceLinks};
}
"""


def evaluate_pages(browser, site_url, names, script):
    """``{name: result of script}`` for each page, in Chromium at 1280 x 900."""
    results = {}
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    for name in names:
        page.goto(f"{site_url}/{name}", wait_until="load")
        results[name] = page.evaluate(script)
    page.close()
    return results


def listed(found: list[tuple[str, str]]) -> str:
    """The first eight ``(rule, context)`` pairs of a page rule's findings, for an assertion message."""
    return "; ".join(f"{rule}: ...{context}..." for rule, context in found[:8])


@pytest.fixture(scope="module")
def measured(browser, site_url):
    return evaluate_pages(browser, site_url, CHAPTER_PAGES, MEASURE_JS)


def test_there_are_chapter_pages():
    assert len(CHAPTER_PAGES) >= 9


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_no_code_block_scrolls_sideways(measured, name):
    wide = measured[name]["wide"]
    assert not wide, f"{len(wide)} code blocks scroll sideways, e.g. {wide[0]['line'][:100]!r} ({wide[0]['width']} px)"


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_no_bookkeeping_in_the_prose(measured, name):
    found = page_rules.bookkeeping(measured[name]["prose"])
    assert not found, "bookkeeping on a chapter page (it belongs in the appendix): " + listed(found)


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_short_setup_before_the_first_section(measured, name):
    lines = measured[name]["codeLines"]
    assert lines <= page_rules.MAX_CODE_LINES_BEFORE_FIRST_SECTION, f"{lines} visible code lines before §1"


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_question_boxes_answer_in_few_words(measured, name):
    for box in measured[name]["boxes"]:
        words = page_rules.words(box["text"])
        assert words <= page_rules.MAX_QUESTION_BOX_WORDS, f"{box['title']!r}: {words} words of prose"


def page_stats(measurement: dict) -> dict:
    """:func:`page_rules.prose_stats` of a page's prose, without the numbers in its links' texts."""
    stats = page_rules.prose_stats(measurement["statsProse"])
    link_numbers = sum(len(page_rules.numbers(text)) for text in measurement["links"])
    stats["numbers"] = max(stats["numbers"] - link_numbers, 0)
    stats["numbers_per_100_words"] = 100 * stats["numbers"] / max(stats["words"], 1)
    return stats


@pytest.mark.parametrize("name", CHAPTER_PAGES)
def test_one_voice_per_page(measured, name):
    found = page_rules.one_voice(measured[name]["statsProse"])
    assert not found, "belongs on the chapter's evidence page: " + listed(found)


@pytest.mark.parametrize("number", EVIDENCE_CHAPTERS)
def test_chapter_links_its_evidence_once(measured, number):
    name = next(n for n in CHAPTER_PAGES if n.split("/")[-1].startswith(number))
    links = [h for h in measured[name]["evidenceLinks"] if f"evidence/ch{number}.html" in h]
    assert len(links) == 1, f"{name} links to its evidence page {len(links)} times (once is the rule)"


#: The text a reader sees on any page, without code, math (rendered or not, MathJax hides its source) or the
#: references: unrendered markup shows up here.
VISIBLE_TEXT_JS = """
() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const copy = article.cloneNode(true);
  copy.querySelectorAll('pre, code, .cell_input, div[class*="highlight-"], .math, mjx-container, script, style, '
                        + '.headerlink').forEach(e => e.remove());
  return copy.textContent;
}
"""


@pytest.fixture(scope="module")
def visible_text(browser, site_url):
    return evaluate_pages(browser, site_url, ALL_PAGES, VISIBLE_TEXT_JS)


@pytest.mark.parametrize("name", ALL_PAGES)
def test_no_raw_markup_on_any_page(visible_text, name):
    found = page_rules.raw_markup(visible_text[name])
    assert not found, "markup that did not render: " + listed(found)


@pytest.mark.parametrize("group", sorted(page_rules.CHAPTER_GROUPS))
def test_prose_reads_once(measured, group):
    names = [n for n in CHAPTER_PAGES if n.split("/")[-1][:2] in page_rules.CHAPTER_GROUPS[group]]
    assert len(names) == len(page_rules.CHAPTER_GROUPS[group]), names
    stats = page_rules.combine_stats([page_stats(measured[n]) for n in names])
    report = page_rules.format_stats(group, stats)
    print(report)
    assert stats["long_share"] <= page_rules.MAX_LONG_SENTENCE_SHARE, report + "; e.g. " + " | ".join(stats["long"][:3])
    assert stats["numbers_per_100_words"] <= page_rules.MAX_NUMBERS_PER_100_WORDS, report


def test_the_measurements_can_fail():
    """The checks above see what they should: the patterns find bookkeeping, the word count counts."""
    assert page_rules.bookkeeping("The store holds 188 runs over 12 sessions")
    assert page_rules.words("Mask: −∞ before the softmax, +0.30 points.") == 6  # "−∞" is not a word
    text = ("Masking changed accuracy by +0.30 points (95% CI 0.1 to 0.5), see Fig. 5.4 and Eq. 1.6. "
            "The pads took 7.2% of the weight, e.g. in chapter 5. " + "Word " * 41 + "end.\nA list item")
    stats = page_rules.prose_stats(text)
    assert stats["sentences"] == 4 and len(stats["long"]) == 1
    assert page_rules.numbers(text) == ["+0.30", "95%", "0.1", "0.5", "7.2%"]  # not 5.4, 1.6 or 5
    assert page_rules.numbers("fp16, d_k = 64, H100 and 1,024 tokens") == ["64", "1,024"]
    voice = page_rules.one_voice("The Wilcoxon test, Holm's correction and the stored runs of the live run; "
                                 + "seed " * 6)
    assert {rule for rule, _ in voice} == {"test name", "stored", "live run", "seed"}
    assert not page_rules.one_voice("The 95% interval of five seeds: restored, seeded? no.")
    raw = page_rules.raw_markup("Var(w) = 2 / (d_\\text{in}) {cite:t}`he2015delving` and $x$ and \\(y\\)\n:::")
    assert {rule for rule, _ in raw} == {"LaTeX command", "role", "inline math", "\\( math", "directive fence"}
    assert not page_rules.raw_markup("It costs $5 and $10; the shell prompt $ stays; a set {1, 2}.")
