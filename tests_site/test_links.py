"""Link check of the built site: internal links must resolve (file and anchor); external links are tried and
reported, but do not fail (the build machine may have no network)."""

from __future__ import annotations

import urllib.request
import warnings
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

from conftest import HTML, site_pages


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.ids.add(attrs[key])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag in ("img", "script") and attrs.get("src"):
            self.links.append(attrs["src"])
        if tag == "link" and attrs.get("href") and attrs.get("rel") in ("stylesheet", "icon", "preload"):
            self.links.append(attrs["href"])


def _parse(path: Path) -> _Collector:
    collector = _Collector()
    collector.feed(path.read_text(errors="replace"))
    return collector


@pytest.fixture(scope="module")
def parsed():
    return {page: _parse(page) for page in site_pages()}


def test_internal_links_resolve(parsed):
    broken = []
    for page, collector in parsed.items():
        for href in collector.links:
            scheme = urlparse(href).scheme
            if scheme in ("http", "https", "mailto", "data", "javascript"):
                continue
            target, fragment = urldefrag(href)
            target_path = (page.parent / unquote(target.split("?")[0])).resolve() if target else page
            if target_path.is_dir():
                target_path = target_path / "index.html"
            if not target_path.exists():
                broken.append(f"{page.relative_to(HTML)} -> {href} (missing file)")
                continue
            if fragment and target_path.suffix == ".html":
                ids = parsed[target_path].ids if target_path in parsed else _parse(target_path).ids
                if unquote(fragment) not in ids:
                    broken.append(f"{page.relative_to(HTML)} -> {href} (missing anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(sorted(set(broken))[:50])


def test_external_links_are_reported(parsed):
    external = sorted({href for c in parsed.values() for href in c.links if urlparse(href).scheme in ("http", "https")})
    failures = []
    for url in external[:200]:
        try:
            request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "attnbook-linkcheck"})
            urllib.request.urlopen(request, timeout=3)
        except Exception as exc:  # noqa: BLE001 - any failure is reported, never fatal
            failures.append(f"{url}: {type(exc).__name__}")
    if failures:
        warnings.warn(f"{len(failures)} of {len(external)} external links could not be reached (not fatal): "
                      + "; ".join(failures[:10]))
