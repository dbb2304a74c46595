"""The book's conventions, checked on the files as committed (docs/CONTRIBUTING.md)."""

import ast
import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

import attnbook

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
# Notebooks at the root of the book (back matter such as the masking checklist); they follow the chapters' cell
# conventions too.
ROOT_NOTEBOOKS = sorted(ROOT.glob("*.ipynb"))
COLAB_CELL = (ROOT / "tools" / "colab_cell.py").read_text().strip()
BIB_KEYS = set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(), flags=re.M))


def _toc_files(node):
    if isinstance(node, dict):
        if "file" in node:
            yield node["file"]
        for value in node.values():
            yield from _toc_files(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_files(item)


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_are_chapters_and_all_are_in_the_toc():
    assert NOTEBOOKS, "no chapter notebooks found"
    in_toc = set(_toc_files(TOC))
    for nb in NOTEBOOKS:
        assert f"chapters/{nb.stem}" in in_toc, f"{nb.name} is not in _toc.yml"
    for entry in in_toc:
        assert any((ROOT / entry).with_suffix(s).exists() for s in (".ipynb", ".md")), f"{entry} in toc is missing"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(nb):
    for i, cell in enumerate(_cells(nb)):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{nb.name} cell {i} has stored outputs"
            assert cell.get("execution_count") is None, f"{nb.name} cell {i} has an execution count"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_is_the_hidden_colab_cell(nb):
    first = _cells(nb)[0]
    assert first["cell_type"] == "code"
    assert "remove-cell" in first.get("metadata", {}).get("tags", [])
    assert _source(first).strip() == COLAB_CELL, f"{nb.name}: first cell differs from tools/colab_cell.py"


def test_colab_cell_repo_url_agrees_with_config():
    url = re.search(r'REPO_URL = "([^"]+)"', COLAB_CELL).group(1)
    assert url == CONFIG["repository"]["url"]
    assert CONFIG["repository"]["branch"] == "main"
    assert "git+{REPO_URL}@main#subdirectory=code" in COLAB_CELL


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_keeps_run_bookkeeping_in_the_appendix(nb):
    """A chapter starts its run clock (``RunInfo``: mode and device for its cells) but shows no "Run information"
    section: the mode, device and time of the build are on the appendix page "How the numbers were made"."""
    cells = _cells(nb)
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    assert "RunInfo.start()" in code
    assert not re.search(r"^#+ Run information", markdown, flags=re.M), f"{nb.name} has a Run information section"
    for name in ("run_mode", "run_device", "run_wall_s"):
        assert f"`{name}" not in markdown, f"{nb.name} shows the glued {name}; the appendix page shows the build's"


STORED_CHAPTERS = {"03", "04", "05", "07", "08", "09", "10"}


@pytest.mark.parametrize("nb", [p for p in NOTEBOOKS if p.name[:2] in STORED_CHAPTERS], ids=lambda p: p.name)
def test_chapter_with_stored_runs_links_to_its_evidence_page_once(nb):
    """One voice per page (issue 43): the apparatus is one click away, on the chapter's evidence page, and the
    chapter links to it exactly once."""
    markdown = "\n".join(_source(c) for c in _cells(nb) if c["cell_type"] == "markdown")
    page = f"evidence/ch{nb.name[:2]}"
    links = re.findall(r"\]\(\.\./" + page + r"\.(?:ipynb|md)\)|\{doc\}`[^`]*" + page + "[^`]*`", markdown)
    assert len(links) == 1, f"{nb.name} links to {page} {len(links)} times (once is the rule)"
    assert (ROOT / f"{page}.ipynb").exists()


def test_appendix_shows_the_build_and_names_every_store():
    """The appendix page glues the build's mode and device and has the execution table; the ledger names every
    provenance record in results/ (so that no store goes unexplained), and each chapter with a store has an evidence
    page that shows its provenance (issue 43: each fact lives in one place)."""
    from attnbook import ledger

    cells = _cells(ROOT / "how_numbers_were_made.ipynb")
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    for name in ("run_mode", "run_device"):
        assert f"`{name}" in markdown
    assert "{nb-exec-table}" in markdown
    records = {p.stem for p in (ROOT / "results").glob("*.json")}
    assert records <= {s.name for s in ledger.STORES}, sorted(records - {s.name for s in ledger.STORES})
    toc = (ROOT / "_toc.yml").read_text()
    for chapter in sorted({s.chapter for s in ledger.STORES if ledger.read_record(s.name) is not None}):
        page = ROOT / "evidence" / f"ch{chapter:02d}.ipynb"
        assert page.exists() and f"evidence/ch{chapter:02d}" in toc, page
        evidence_cells = _cells(page)
        evidence_md = "\n".join(_source(c) for c in evidence_cells if c["cell_type"] == "markdown")
        evidence_code = "\n".join(_source(c) for c in evidence_cells if c["cell_type"] == "code")
        assert f"(sec-evidence-ch{chapter})=" in evidence_md
        assert f"provenance_table({chapter})" in evidence_code and f"sessions_table({chapter})" in evidence_code
        assert f"(sec-how-numbers-ch{chapter})=" not in markdown   # not twice


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_has_four_exercises_with_dropdown_solutions(nb):
    markdown = "\n".join(_source(c) for c in _cells(nb) if c["cell_type"] == "markdown")
    exercises = re.findall(r"```\{exercise(?:-start)?\}", markdown)
    solutions = re.findall(r"```\{solution(?:-start)?\}[^\n]*\n(?::label:[^\n]*\n)?:class: dropdown", markdown)
    assert len(exercises) >= 4, f"{nb.name}: {len(exercises)} exercises"
    assert len(solutions) >= len(exercises), f"{nb.name}: {len(solutions)} dropdown solutions"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_citations_exist_in_references_bib(nb):
    markdown = "\n".join(_source(c) for c in _cells(nb) if c["cell_type"] == "markdown")
    cited = {k.strip() for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", markdown) for k in group.split(",")}
    assert cited, f"{nb.name} cites nothing"
    assert cited <= BIB_KEYS, f"{nb.name} cites unknown keys {sorted(cited - BIB_KEYS)}"


FIGURE_CALLS = re.compile(r"plt\.(subplots|figure|plot|imshow)\(|attention_heatmap\(")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_figures_have_caption_name_and_alt_text(nb):
    for i, cell in enumerate(_cells(nb)):
        if cell["cell_type"] != "code" or not FIGURE_CALLS.search(_source(cell)):
            continue
        if "remove-cell" in cell.get("metadata", {}).get("tags", []):
            continue
        meta = cell.get("metadata", {}).get("mystnb", {})
        figure, image = meta.get("figure", {}), meta.get("image", {})
        assert figure.get("caption"), f"{nb.name} cell {i}: figure without caption"
        assert figure.get("name", "").startswith("fig-"), f"{nb.name} cell {i}: figure without fig- name"
        alt = image.get("alt", "")
        assert len(alt.split()) >= 5 and "/" not in alt, f"{nb.name} cell {i}: alt text {alt!r} is not descriptive"


# Decimal numbers with two or more decimals typed into prose (outside math, code and glue roles) are results
# that should have been glued.
_STRIP = [r"\$\$.*?\$\$", r"\$[^$\n]*\$", r"```.*?```", r"`[^`\n]*`", r"\(sec-[^)]*\)=", r"\]\([^)]*\)"]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_no_hand_typed_results_in_prose(nb):
    for i, cell in enumerate(_cells(nb)):
        if cell["cell_type"] != "markdown":
            continue
        text = _source(cell)
        for pattern in _STRIP:
            text = re.sub(pattern, " ", text, flags=re.S)
        typed = re.findall(r"(?<![\w.])-?\d+\.\d{2,}\b", text)
        assert not typed, f"{nb.name} markdown cell {i} has hand-typed numbers {typed}; glue them"


def test_pyproject_uses_loose_ranges_and_requirements_pin_exactly():
    project = tomllib.loads((ROOT / "code" / "pyproject.toml").read_text())["project"]
    assert any(dep.replace(" ", "").startswith("torch>=") for dep in project["dependencies"])
    assert not any("==" in dep for dep in project["dependencies"])
    lines = [l.strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    reqs = [l for l in lines if l and not l.startswith("#")]
    assert reqs[-1] == "-e code"
    assert all("==" in l for l in reqs[:-1]), [l for l in reqs[:-1] if "==" not in l]
    names = {l.split("==")[0].lower() for l in reqs[:-1]}
    for needed in ("jupyter-book", "torch", "numpy", "scipy", "matplotlib", "pandas", "tqdm", "statsmodels",
                   "nbval", "pytest", "hypothesis", "sphinx-exercise", "sphinxcontrib-bibtex"):
        assert needed in names, f"requirements.txt does not pin {needed}"
    assert "jupyter-book==1.0.4.post1" in reqs and "torch==2.13.0" in reqs


def test_book_config_builds_strictly():
    sphinx = CONFIG["sphinx"]["config"]
    assert CONFIG["execute"]["execute_notebooks"] == "cache"   # filled afresh by tools/execute_book.py
    assert "execute_book.py" in (ROOT / "Makefile").read_text()
    assert sphinx["nb_execution_raise_on_error"] is True
    assert sphinx["numfig"] is True and sphinx["math_numfig"] is True
    assert "sphinx_exercise" in CONFIG["sphinx"]["extra_extensions"]
    assert CONFIG["launch_buttons"]["colab_url"] and CONFIG["launch_buttons"]["thebe"] is False
    makefile = (ROOT / "Makefile").read_text()
    assert "jupyter-book build . -W -n --keep-going" in makefile


def test_citation_matches_package_and_intro():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["type"] == "software"
    assert cff["preferred-citation"]["type"] == "book"
    assert cff["version"] == cff["preferred-citation"]["version"] == attnbook.__version__
    intro = (ROOT / "intro.md").read_text()
    blocks = re.findall(r"```bibtex\n(.*?)```", intro, flags=re.S)
    assert len(blocks) >= 2, "intro.md gives BibTeX for the book and for a single chapter"
    for bibtex in blocks:
        assert re.search(rf"version\s*=\s*\{{{re.escape(attnbook.__version__)}\}}", bibtex), bibtex
        assert cff["preferred-citation"]["title"] in bibtex
        assert cff["repository-code"] in bibtex and cff["repository-code"] == CONFIG["repository"]["url"]
    chapter_url = re.search(r"url\s*=\s*\{([^}]*)\}", blocks[1]).group(1)
    assert (ROOT / chapter_url.split("/blob/main/")[1]).exists(), chapter_url


# ---------------------------------------------------------------------------------------------------------------
# Pages as a reader sees them: glue out of sight, code within black's width, colour bars, the masking checklist.

BLACK_WIDTH = 88
NO_OUTPUT_SHOWN = {"remove-cell", "remove-output"}  # the reader sees no output of a cell with one of these tags


def _tags(cell):
    return set(cell.get("metadata", {}).get("tags", []))


def _is_glue_call(node):
    """``glue(...)``, ``runtime.glue(...)`` or ``run.glue_end()`` (which returns the glued wall time)."""
    names = (getattr(node.func, "id", None), getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else ()
    return any(name in ("glue", "glue_end") for name in names)


def ends_with_bare_glue(source: str) -> bool:
    """True if the cell's last statement is a bare ``glue(...)`` call: Jupyter echoes the value it returns."""
    body = ast.parse(source).body
    return bool(body) and isinstance(body[-1], ast.Expr) and _is_glue_call(body[-1].value)


def only_glues(source: str) -> bool:
    """True if every statement of the cell is a ``glue(...)`` call (or a loop that only glues)."""

    def glues(stmt):
        if isinstance(stmt, ast.Expr):
            return _is_glue_call(stmt.value)
        if isinstance(stmt, ast.For):
            return all(glues(s) for s in stmt.body) and not stmt.orelse
        return False

    body = ast.parse(source).body
    return bool(body) and all(glues(s) for s in body)


def test_the_glue_checks_can_fail():
    assert ends_with_bare_glue('x = 1\nglue("x", x)')
    assert ends_with_bare_glue('glue("x", 1);')  # a trailing semicolon hides the echo, but is easy to lose
    assert ends_with_bare_glue('runtime.glue("x", 1)')
    assert ends_with_bare_glue("run.glue_end()")
    assert not ends_with_bare_glue('y = glue("x", 1)\nprint(y)')
    assert not ends_with_bare_glue('glue("x", 1)\ntable')
    assert only_glues('glue("a", 1)\nfor k in "bc":\n    glue(k, 2)')
    assert not only_glues('glue("a", 1)\ntable = make_table()')
    assert not only_glues("")


@pytest.mark.parametrize("nb", NOTEBOOKS + ROOT_NOTEBOOKS, ids=lambda p: p.name)
def test_no_shown_cell_echoes_a_glued_value(nb):
    """A cell whose output the reader sees must not end on ``glue(...)``: the page would show the bare value."""
    for i, cell in enumerate(_cells(nb)):
        if cell["cell_type"] == "code" and not _tags(cell) & NO_OUTPUT_SHOWN:
            assert not ends_with_bare_glue(_source(cell)), (
                f"{nb.name} cell {i} ends on a bare glue(...): move the glue into a hidden (remove-cell) cell")


@pytest.mark.parametrize("nb", NOTEBOOKS + ROOT_NOTEBOOKS, ids=lambda p: p.name)
def test_cells_that_only_glue_are_removed(nb):
    for i, cell in enumerate(_cells(nb)):
        if cell["cell_type"] == "code" and only_glues(_source(cell)):
            assert "remove-cell" in _tags(cell), f"{nb.name} cell {i} only glues: tag it remove-cell"


@pytest.mark.parametrize("nb", NOTEBOOKS + ROOT_NOTEBOOKS, ids=lambda p: p.name)
def test_code_cells_fit_black_width(nb):
    """Code cells are at most 88 characters a line (black's width), so that no page scrolls sideways."""
    long = [(i, n + 1, len(line)) for i, cell in enumerate(_cells(nb)) if cell["cell_type"] == "code"
            for n, line in enumerate(_source(cell).splitlines()) if len(line) > BLACK_WIDTH]
    assert not long, f"{nb.name}: lines over {BLACK_WIDTH} characters (cell, line, length): {long[:10]}"


@pytest.mark.parametrize("nb", ROOT_NOTEBOOKS, ids=lambda p: p.name)
def test_root_notebooks_are_stored_without_outputs_and_start_with_the_colab_cell(nb):
    cells = _cells(nb)
    assert _source(cells[0]).strip() == COLAB_CELL and "remove-cell" in _tags(cells[0])
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, f"{nb.name} cell {i}"


HEATMAP_BYPASS = re.compile(r"colorbar=False|\.matshow\(|\.pcolormesh\(|\bsns\.heatmap\(|\bseaborn\b")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_heatmaps_are_drawn_by_attention_heatmap_with_a_colour_bar(nb):
    for i, cell in enumerate(_cells(nb)):
        if cell["cell_type"] == "code":
            found = HEATMAP_BYPASS.search(_source(cell))
            assert not found, f"{nb.name} cell {i}: {found.group(0)!r}; draw heatmaps with attention_heatmap"


def _page_texts():
    """Every page's text: the markdown cells of the notebooks and the root Markdown pages of the toc."""
    texts = {}
    for entry in _toc_files(TOC):
        path = next(ROOT / f"{entry}{s}" for s in (".ipynb", ".md") if (ROOT / f"{entry}{s}").exists())
        if path.suffix == ".ipynb":
            texts[entry] = "\n".join(_source(c) for c in _cells(path) if c["cell_type"] == "markdown")
        else:
            texts[entry] = path.read_text()
    return texts


def _ref_targets(text):
    return [m.group(2) or m.group(3) for m in re.finditer(r"\{ref\}`(?:([^`<]*)<([^`>]+)>|([^`<]+))`", text)]


def test_every_ref_points_at_a_label_of_the_book():
    texts = _page_texts()
    labels = {m for text in texts.values() for m in re.findall(r"^\(([\w-]+)\)=\s*$|^:label: ([\w-]+)\s*$", text,
                                                               flags=re.M) for m in m if m}
    missing = {(page, t.strip()) for page, text in texts.items() for t in _ref_targets(text) if t.strip() not in labels}
    assert not missing, f"{{ref}} targets without a (label)=: {sorted(missing)}"


def test_masking_checklist_is_in_the_back_matter_and_each_rule_is_linked_and_measured():
    back = next(part for part in TOC["parts"] if part.get("caption") == "Back matter")
    assert {"file": "checklist"} in back["chapters"]
    text = _page_texts()["checklist"]
    rules = re.findall(r"^- (.+?)(?=^- |^\*\*|\Z)", text, flags=re.M | re.S)
    assert len(rules) >= 8, f"only {len(rules)} rules"
    for rule in rules:
        assert len(_ref_targets(rule)) == 1, f"a rule links to one section: {rule[:80]!r}"
        assert "{glue:text}`" in rule, f"a rule states the number behind it: {rule[:80]!r}"


def test_execute_book_runs_every_book_notebook_into_an_emptied_cache():
    """tools/execute_book.py executes exactly the notebooks of _toc.yml, and empties the cache before it runs (so
    no output made with older library code survives)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("execute_book", ROOT / "tools" / "execute_book.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    listed = {p.relative_to(ROOT).as_posix() for p in tool.book_notebooks()}
    toc = (ROOT / "_toc.yml").read_text()
    stored = {p.relative_to(ROOT).as_posix() for p in [*ROOT.glob("*.ipynb"), *(ROOT / "chapters").glob("*.ipynb"),
                                                         *(ROOT / "evidence").glob("*.ipynb")]}
    assert listed == {p for p in stored if p.removesuffix(".ipynb") in toc}
    assert "chapters/05_seq2vec_masking.ipynb" in listed
    assert "shutil.rmtree(CACHE" in (ROOT / "tools" / "execute_book.py").read_text()


def test_no_sphinx_design_dropdown_directive():
    """Collapsed text uses ``{admonition}`` with ``:class: dropdown``: the single-page builder that prints the PDF
    edition (``make pdf``) cannot write sphinx-design's ``{dropdown}`` node and fails the build."""
    pages = sorted(ROOT.glob("chapters/*.ipynb")) + sorted(ROOT.glob("*.ipynb")) + sorted(ROOT.glob("*.md"))
    offenders = [p.name for p in pages if re.search(r"[`:]{3,}\{dropdown\}", p.read_text())]
    assert not offenders, f"{{dropdown}} directive in {offenders}"
