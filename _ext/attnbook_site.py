"""Sphinx extension for the book's website (loaded through ``_config.yml``, ``sphinx.local_extensions``).

It fixes three defects of the default Jupyter Book 1 site, rather than allowlisting them in the browser tests:

1. **Duplicate sphinx-thebe configuration script.** sphinx-thebe registers an inline script with
   ``app.add_js_file(None, body=...)`` after the HTML builder has started; Sphinx adds it to the builder with
   filename ``None`` and, when it prepares writing, once more from its registry with filename ``""``, so every page
   declared ``THEBE_JS_URL`` twice ("Identifier 'THEBE_JS_URL' has already been declared"). We drop such
   duplicates from each page's script list.
2. **Images without alt text.** docutils writes an image's file path as its ``alt`` when none is given (plain
   ``plt.show()`` outputs). Every content image must describe itself: a notebook figure sets
   ``mystnb.image.alt`` in its cell metadata. An image without alt text is a build warning, which ``-W`` turns
   into an error, and the warning says which page and how to fix it.
3. **MathJax from a CDN.** The site must work offline, so MathJax 3 is served from the book's own ``_static``
   folder, copied at build time from an installed package (``django-static-mathjax``, which ships the MathJax 3
   distribution as plain files and has no dependencies).

It also sets Sphinx's ``version``/``release`` from ``attnbook.__version__``, the book's one version number, and the
theme's default colour mode (without one, pydata-sphinx-theme logs a console error on every page), and keeps the
book's title in the sidebar under the logo (``_config.yml``'s ``logo:``, drawn by ``tools/make_logo.py``).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

MATHJAX_STATIC = "mathjax"
MATHJAX_ENTRY = "tex-mml-chtml.js"
# The parts of the MathJax es5 tree that tex-mml-chtml.js loads on demand (fonts, extensions, menu).
MATHJAX_PARTS = [MATHJAX_ENTRY, "input", "output", "ui", "a11y", "adaptors", "core.js", "startup.js"]


def mathjax_source() -> Path:
    """The ``es5`` folder of the MathJax 3 distribution installed by ``django-static-mathjax``."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("MathJax files not found: install django-static-mathjax (see requirements.txt)")
    es5 = Path(list(spec.submodule_search_locations)[0]) / "static" / "mathjax" / "es5"
    if not (es5 / MATHJAX_ENTRY).exists():
        raise RuntimeError(f"{es5 / MATHJAX_ENTRY} is missing; reinstall django-static-mathjax")
    return es5


def _config_inited(app: Sphinx, config) -> None:
    import attnbook

    config.version = config.release = attnbook.__version__
    config.mathjax_path = f"{MATHJAX_STATIC}/{MATHJAX_ENTRY}"
    # pydata-sphinx-theme logs "Got invalid theme mode" to the console when no default mode is set.
    # sphinx-book-theme does not accept it as a theme option; the template reads it from the context.
    config.html_context.setdefault("default_mode", "auto")
    # With a logo, pydata-sphinx-theme shows only the image at the top of the sidebar, unless the logo has a text:
    # keep the book's title under the logo, as it is shown without one.
    if config.html_logo and isinstance(config.html_theme_options, dict):
        logo = config.html_theme_options.setdefault("logo", {})
        logo.setdefault("text", config.html_title)
        # With a text, the theme writes alt="" (decorative); every image on the site describes itself instead.
        logo.setdefault("alt_text", "The book's logo: attention weights as bars, and a hatched pad held at zero")


def _copy_mathjax(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    source = mathjax_source()
    target = Path(app.outdir) / "_static" / MATHJAX_STATIC
    for part in MATHJAX_PARTS:
        src = source / part
        if src.is_dir():
            shutil.copytree(src, target / part, dirs_exist_ok=True)
        elif src.exists():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / part)


def _dedupe_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        # The same inline script is registered once with filename None and once with "" (see module docstring).
        attributes = getattr(script, "attributes", {})
        key = (getattr(script, "filename", script) or "", tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key in seen:
            continue
        seen.add(key)
        unique.append(script)
    # In place: later handlers (sphinx.ext.mathjax) add their scripts to this same list.
    scripts[:] = unique


def _require_alt_text(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for image in doctree.findall(nodes.image):
        alt = (image.get("alt") or "").strip()
        uri = image.get("uri", "")
        if not alt or alt == uri or "/" in alt or alt.endswith((".png", ".svg", ".jpg")):
            logger.warning(
                f"image {uri!r} has no alt text; give the notebook cell metadata mystnb.image.alt "
                "(or the figure directive :alt:) a sentence that describes the picture",
                location=image,
            )


def _skip_node(self, node) -> None:
    raise nodes.SkipNode


def _register_singlehtml_visitors(app: Sphinx) -> None:
    """The PDF edition is printed from the ``singlehtml`` builder, for which sphinx-jupyterbook-latex registers no
    visitor for its ``HiddenCellNode`` (it only does so for ``html``, ``latex``, ...): skip it, as ``html`` does."""
    try:
        from sphinx_jupyterbook_latex.nodes import HiddenCellNode
    except ImportError:  # pragma: no cover - jupyter-book always installs it
        return
    app.add_node(HiddenCellNode, override=True, singlehtml=(_skip_node, None))


def _visit_hidden_code_cell_print(self, node) -> None:
    """myst-nb's ``HideCodeCellNode`` (a ``hide-input``, ``hide-output`` or ``hide-cell`` cell) in the PDF edition,
    where nothing can be clicked open. What a reader of paper needs, per tag (README, "The PDF edition"):

    - ``hide-input``: the source is set-up or bookkeeping the page summarizes in words: it is left out, and the
      output, if any, is printed;
    - ``hide-output`` and ``hide-cell``: the collapsed part is printed in full, without the "Show ..." summary, in a
      box marked as collapsed on the website (``div.print-collapsed``).
    """
    only_source = "above-input" in node["classes"] and not any(
        child.get("nb_element") == "cell_code_output" for child in node.children if isinstance(child, nodes.Element))
    if only_source:
        raise nodes.SkipNode
    self.body.append('<div class="print-collapsed">\n')


def _depart_hidden_code_cell_print(self, node) -> None:
    self.body.append("</div>\n")


def _register_print_visitors_for_hidden_cells(app: Sphinx) -> None:
    """myst-nb registers its ``HideCodeCellNode`` visitors for the ``html`` builder only, so the ``singlehtml``
    builder that the PDF is printed from stops at the node. Register the print visitors above for it."""
    try:
        from myst_nb.sphinx_ import HideCodeCellNode
    except ImportError:  # pragma: no cover - jupyter-book always installs myst-nb
        return
    app.registry.add_translation_handlers(
        HideCodeCellNode, singlehtml=(_visit_hidden_code_cell_print, _depart_hidden_code_cell_print))


def setup(app: Sphinx) -> dict:
    _register_singlehtml_visitors(app)
    _register_print_visitors_for_hidden_cells(app)
    app.connect("config-inited", _config_inited)
    # Early: a later html-page-context handler returns a template name, which stops the event (emit_firstresult).
    app.connect("html-page-context", _dedupe_scripts, priority=100)
    app.connect("doctree-resolved", _require_alt_text)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1.0"}
