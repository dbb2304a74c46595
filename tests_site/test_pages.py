"""Every page of the built site, opened in headless Chromium as a reader would (offline)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import CONFIG, HTML, ROOT, site_pages

PAGES = site_pages()
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
REPO = urlparse(CONFIG["repository"]["url"]).path.strip("/")  # "org/repo"
BRANCH = CONFIG["repository"]["branch"]


def _rel(page: Path) -> str:
    return page.relative_to(HTML).as_posix()


@pytest.fixture(scope="module")
def visited(browser, site_url):
    """Open each page once; record JS and console errors, resources that fail to load (a 404 for /favicon.ico as
    much as for a script), requests that leave 127.0.0.1, and what the page shows."""
    results = {}
    for page_path in PAGES:
        page = browser.new_page()
        errors, external = [], []
        page.on("pageerror", lambda exc, errors=errors: errors.append(f"pageerror: {exc}"))
        page.on("console", lambda msg, errors=errors: errors.append(f"console.{msg.type}: {msg.text}")
                if msg.type == "error" else None)
        page.on("response", lambda response, errors=errors: errors.append(
            f"HTTP {response.status}: {response.url}") if response.status >= 400 else None)
        page.on("requestfailed", lambda request, errors=errors, external=external: errors.append(
            f"request failed: {request.url}") if request.url not in external else None)

        def route(request_route, external=external):
            url = request_route.request.url
            if url.startswith(site_url) or url.startswith("data:"):
                request_route.continue_()
            else:
                external.append(url)
                request_route.abort()

        page.route("**/*", route)
        page.goto(f"{site_url}/{_rel(page_path)}", wait_until="load")
        has_math = page.evaluate("document.querySelectorAll('.math').length") > 0
        if has_math:
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
            page.evaluate("MathJax.startup.promise")
            page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=20_000)
        results[_rel(page_path)] = {
            "errors": errors,
            "external": external,
            "has_math": has_math,
            "mjx": page.evaluate("document.querySelectorAll('mjx-container').length"),
            "mjx_errors": page.evaluate("document.querySelectorAll('mjx-merror, .MathJax_Error').length"),
            "raw_tex": page.evaluate(
                "Array.from(document.querySelectorAll('.math')).filter(e => !e.querySelector('mjx-container'))"
                ".map(e => e.textContent.slice(0, 60))"),
            "images": page.evaluate(
                "Array.from(document.querySelectorAll('img'))"
                ".map(i => ({src: i.getAttribute('src'), alt: i.getAttribute('alt') || ''}))"),
            "colab": page.evaluate(
                "Array.from(document.querySelectorAll('a[href*=\"colab.research.google.com\"]')).map(a => a.href)"),
        }
        page.close()
    return results


def test_index_redirects_to_the_introduction(browser, site_url):
    page = browser.new_page()
    page.goto(f"{site_url}/index.html")
    page.wait_for_url(f"{site_url}/intro.html", timeout=10_000)
    assert "Attention, Masked and Unmasked" in page.title()
    page.close()


def test_the_site_was_built():
    assert PAGES, "no pages found under _build/html"
    names = {_rel(p) for p in PAGES}
    assert "intro.html" in names
    for nb in CHAPTERS:
        assert f"chapters/{nb.stem}.html" in names, f"{nb.name} has no page"


@pytest.mark.parametrize("page", [_rel(p) for p in PAGES])
def test_no_javascript_or_console_errors(visited, page):
    """No script error, no console error, and every resource the page asks for loads (the favicon included)."""
    assert visited[page]["errors"] == []


@pytest.mark.parametrize("page", [_rel(p) for p in PAGES])
def test_page_works_offline(visited, page):
    """Nothing is fetched from outside the book (MathJax, fonts and scripts are served locally)."""
    assert visited[page]["external"] == []


@pytest.mark.parametrize("page", [_rel(p) for p in PAGES])
def test_images_have_meaningful_alt_text(visited, page):
    """Every ``img`` on the page (figures, diagrams, the logo) has alt text that describes it. The theme's icons of
    the launch buttons (``_static/images/logo_*``, e.g. "Colab logo") need a name, not a description."""
    for image in visited[page]["images"]:
        alt = image["alt"].strip()
        assert alt, f"{image['src']} has no alt text"
        assert "/" not in alt and not re.search(r"\.(png|svg|jpe?g|gif)$", alt), f"alt is a path: {alt!r}"
        icon = re.search(r"_static/images/logo_[\w-]+\.(png|svg)$", image["src"]) is not None
        assert len(alt.split()) >= (2 if icon else 3), f"alt text too short to describe {image['src']}: {alt!r}"


@pytest.mark.parametrize("page", [_rel(p) for p in PAGES])
def test_math_is_rendered(visited, page):
    result = visited[page]
    if page.startswith("chapters/"):
        assert result["has_math"], "a chapter page without any math"
    if result["has_math"]:
        assert result["mjx"] > 0, "MathJax did not render"
        assert result["mjx_errors"] == 0, "MathJax reported errors"
        assert result["raw_tex"] == [], f"unrendered math: {result['raw_tex'][:3]}"


@pytest.mark.parametrize("nb", CHAPTERS, ids=lambda p: p.name)
def test_colab_link_points_at_the_notebook_in_the_repository(visited, nb):
    links = visited[f"chapters/{nb.stem}.html"]["colab"]
    assert links, f"chapters/{nb.stem}.html has no Colab launch link"
    for link in links:
        match = re.fullmatch(r"https://colab\.research\.google\.com/github/([^/]+/[^/]+)/blob/([^/]+)/(.+)", link)
        assert match, f"unexpected Colab URL {link}"
        repo, branch, path = match.groups()
        assert repo == REPO and branch == BRANCH, link
        assert path == f"chapters/{nb.name}" and (ROOT / path).exists(), link


def test_every_colab_link_targets_an_existing_notebook(visited):
    for page, result in visited.items():
        for link in result["colab"]:
            path = link.split(f"/blob/{BRANCH}/", 1)[-1]
            assert (ROOT / path).exists(), f"{page}: {link} points at a missing file"
