"""The page rules of the book (docs/CONTRIBUTING.md, "How a page reads"), as code that checks a page.

One list of patterns and limits, used in two places:
- ``tests_site/test_reader_view.py`` and ``tests_site/test_page_rules.py`` apply them to the built website;
- ``python tools/page_rules.py [--long] EXECUTED.ipynb [...]`` applies them to an executed notebook (and reports its
  prose: words, sentences over 40 words, numbers per 100 words; ``--long`` prints the long sentences), with each glued value put
  in place of its ``{glue:text}`` role, so that an author can check a chapter without building the whole book::

      ATTNBOOK_NO_PROGRESS=1 .venv/bin/jupyter nbconvert --to notebook --execute \\
          --output /tmp/ch05.ipynb chapters/05_seq2vec_masking.ipynb
      .venv/bin/python tools/page_rules.py /tmp/ch05.ipynb

The rules (issue "The pages teach, the appendix keeps the books"):
- no bookkeeping phrase (:data:`BOOKKEEPING`) in a chapter's prose, captions or visible outputs: run bookkeeping lives
  in the appendix page "How the numbers were made";
- at most :data:`MAX_CODE_LINES_BEFORE_FIRST_SECTION` visible code lines before a chapter's first section;
- a box whose title is a question answers it in at most :data:`MAX_QUESTION_BOX_WORDS` words of prose (tables and
  notes follow the box);
- one voice per page (issue "One voice per page"): no statistical test name (:data:`STATISTICS`) and no word about
  the numbers' source (:data:`SOURCES`: "stored", "live run", "quick mode", "full mode") in a chapter's prose, and
  "seed" at most :data:`MAX_SEED_MENTIONS` times; these live on the chapter's evidence page;
- no unrendered markup on any page (:data:`RAW_MARKUP`: ``$...$``, ``\\(``, ``{cite}``, ``{ref}``, ``{glue}``,
  ``{numref}``, ``:::``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: Phrases that belong to the appendix, not to a chapter: each name maps to a pattern matched against the text a
#: reader sees (prose, captions and visible outputs; not code, and not the collapsed dropdowns).
BOOKKEEPING: dict[str, re.Pattern] = {
    "commit": re.compile(r"\b(?:the|which|a|each|its|at|same|one) commits?\b|\bcommits? [0-9a-f]{7}", re.I),
    "commit hash": re.compile(r"(?<![\w.+-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.+-])"),
    "session": re.compile(r"\bsessions?\b", re.I),
    "load average": re.compile(r"\bload averages?\b", re.I),
    "worker count": re.compile(r"--workers\b|\bworkers\s*=|\b(?:\d+|one|two|three|four|eight|sixteen) workers?\b(?!['’])"
                               r"|\bworkers? at a time\b", re.I),
    "thread count": re.compile(r"\b(?:\d+|one|two|four) threads?\b|\bthreads? each\b|\bthreads?=|--threads\b", re.I),
    "store file name": re.compile(r"\b[\w-]+\.(?:csv|json)\b"),
    "results folder": re.compile(r"\bresults/"),
    "the store": re.compile(r"\b(?:the|this|that|a|each|its|their|one) stores?\b", re.I),
    "run date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "machine name": re.compile(r"\b(?:H100|H200|A100|x86_64|aarch64)\b"),
    "CPU/GPU runs": re.compile(r"\b(?:CPU|GPU)[- ](?:runs?|sessions?)\b", re.I),
    "internal target": re.compile(r"\b(?:within|inside|meets?|met|missed?) the target\b|\btarget of\b", re.I),
    "placeholder": re.compile(r"\bnot (?:yet )?produced\b|\bproduced yet\b", re.I),
    "run information": re.compile(r"\bRun information\b", re.I),
}

#: One voice per page (issue "One voice per page"): a chapter's prose names no statistical test or correction (they
#: live on the chapter's evidence page; "the 95% interval" is the only statistic a chapter sentence names) ...
STATISTICS: dict[str, re.Pattern] = {
    "test name": re.compile(r"\b(?:Wilcoxon|Holm|McNemar|rank[- ]biserial|bootstrap(?:ped|ping)?|p[- ]values?)\b", re.I),
}
#: ... and does not speak of where its numbers came from (a chapter shows full-scale runs and its own small run,
#: never the two side by side) ...
SOURCES: dict[str, re.Pattern] = {
    "stored": re.compile(r"\bstored\b", re.I),
    "live run": re.compile(r"\blive runs?\b", re.I),
    "quick mode": re.compile(r"\bquick[- ]mode\b", re.I),
    "full mode": re.compile(r"\bfull[- ]mode\b", re.I),
}
#: ... and says "seed" at most this many times.
MAX_SEED_MENTIONS = 5
_SEED = re.compile(r"\bseeds?\b", re.I)

#: Markup that did not render: a reader sees it as raw text on the page (checked on every page).
RAW_MARKUP: dict[str, re.Pattern] = {
    "inline math": re.compile(r"(?<![\w$\\])\$(?=[^\s$])[^$\n]{1,200}?(?<=[^\s$\\])\$(?![\w$])"),
    "\\( math": re.compile(r"\\\(|\\\)"),
    "role": re.compile(r"\{(?:cite(?::[tp])?|ref|glue(?::\w+)?|numref|doc|eq|term)\}`?"),
    "directive fence": re.compile(r"^\s*:::", re.M),
    "LaTeX command": re.compile(r"\\(?:text|frac|sqrt|mathrm|mathbf|mathcal|operatorname|cdot|sum|top|left|right)"
                                r"(?![a-z])"),
}

MAX_CODE_LINES_BEFORE_FIRST_SECTION = 25
MAX_QUESTION_BOX_WORDS = 120
#: A sentence a reader reads once has at most about this many words ...
LONG_SENTENCE_WORDS = 40
#: ... and a group of chapters (1-3, 4-6, 7-9) has at most this share of longer sentences in its prose ...
MAX_LONG_SENTENCE_SHARE = 0.06
#: ... and at most this many numbers per 100 words of prose (numbers go into tables; prose says what they mean).
MAX_NUMBERS_PER_100_WORDS = 3.5
#: The chapter groups whose prose the two limits above apply to (file name prefixes).
CHAPTER_GROUPS = {"chapters 1-3": ("01", "02", "03"), "chapters 4-6": ("04", "05", "06"),
                  "chapters 7-9": ("07", "08", "09"), "chapter 10": ("10",)}
#: Tags that keep a code cell's source off the page (a ``hide-input`` cell shows a one-line summary instead).
HIDDEN_SOURCE_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}


def _matches(patterns: dict[str, re.Pattern], text: str) -> list[tuple[str, str]]:
    """``(rule, matched text with 40 characters of context on each side)`` for every match of ``patterns``."""
    found = []
    for name, pattern in patterns.items():
        for match in pattern.finditer(text):
            start, end = max(0, match.start() - 40), min(len(text), match.end() + 40)
            found.append((name, " ".join(text[start:end].split())))
    return found


def bookkeeping(text: str) -> list[tuple[str, str]]:
    """``(rule, matched text with some context)`` for every bookkeeping phrase in ``text``."""
    return _matches(BOOKKEEPING, text)


def one_voice(text: str) -> list[tuple[str, str]]:
    """``(rule, matched text with some context)`` for every statistical test name, every word about the numbers'
    source (:data:`STATISTICS`, :data:`SOURCES`) in a chapter's prose, and one entry when "seed" occurs more than
    :data:`MAX_SEED_MENTIONS` times."""
    found = _matches({**STATISTICS, **SOURCES}, text)
    seeds = _SEED.findall(text)
    if len(seeds) > MAX_SEED_MENTIONS:
        found.append(("seed", f"{len(seeds)} mentions of seed(s) (at most {MAX_SEED_MENTIONS})"))
    return found


def raw_markup(text: str) -> list[tuple[str, str]]:
    """``(rule, matched text with some context)`` for every piece of unrendered markup (:data:`RAW_MARKUP`) in the
    text a reader sees (code left out)."""
    return _matches(RAW_MARKUP, text)


def words(text: str) -> int:
    """The number of words in ``text`` (whitespace-separated tokens that contain a letter or a digit)."""
    return sum(1 for token in text.split() if re.search(r"[A-Za-z0-9]", token))


_ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|et al|Fig|Figs|Eq|Eqs|Sec|cf|vs|approx|resp|No|Ch|Ex)\.$", re.I)
#: A number in prose: digits standing alone (not inside a name such as fp16, d_k or H100), with a sign, decimals,
#: thousands separators or a percent sign.
_NUMBER = re.compile(r"(?<![\w.])[-+−±]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+−]?\d+)?%?(?![\w])")
#: A number right after one of these words names a place in the book (Fig. 4.8, chapter 5, Eq. 1.6), not a result.
_REFERENCE = re.compile(r"(?:\b(?:Fig|Figs|Figure|Figures|Eq|Eqs|Equation|Equations|Section|Sections|Chapter|Chapters|"
                        r"Table|Tables|Exercise|Exercises|Step|Listing|Sec|Appendix)\.?|§)\s*\(?$", re.I)


def sentences(text: str) -> list[str]:
    """The sentences of ``text``: each line (a paragraph, a list item, a caption) split after ``.``, ``!`` or ``?``
    followed by a space and a capital letter, a digit or an opening bracket, unless the full stop ends an
    abbreviation (e.g., i.e., et al., Fig., Eq.). Lines without a word are dropped."""
    out = []
    for line in text.splitlines():
        start = 0
        for match in re.finditer(r"[.!?][)\]”\"']?\s+(?=[A-Z0-9(\[“\"‘'−-])", line):
            if _ABBREVIATIONS.search(line[start:match.start() + 1]):
                continue
            out.append(line[start:match.end()].strip())
            start = match.end()
        out.append(line[start:].strip())
    return [s for s in out if words(s)]


def numbers(text: str) -> list[str]:
    """The numbers in ``text`` that report something: references to figures, equations, chapters, sections, tables
    and exercises are left out."""
    return [m.group(0) for m in _NUMBER.finditer(text) if not _REFERENCE.search(text[max(0, m.start() - 14):m.start()])]


def prose_stats(text: str) -> dict:
    """``words``, ``sentences``, ``long`` (sentences over :data:`LONG_SENTENCE_WORDS` words), ``long_share``,
    ``numbers`` and ``numbers_per_100_words`` of some prose (code, tables and math already taken out)."""
    all_sentences = sentences(text)
    n_words = sum(words(s) for s in all_sentences)
    long = [s for s in all_sentences if words(s) > LONG_SENTENCE_WORDS]
    n_numbers = sum(len(numbers(s)) for s in all_sentences)
    return {"words": n_words, "sentences": len(all_sentences), "long": long,
            "long_share": len(long) / max(len(all_sentences), 1), "numbers": n_numbers,
            "numbers_per_100_words": 100 * n_numbers / max(n_words, 1)}


def combine_stats(stats: list[dict]) -> dict:
    """The :func:`prose_stats` of several pages taken together."""
    n_words = sum(s["words"] for s in stats)
    n_sentences = sum(s["sentences"] for s in stats)
    n_numbers = sum(s["numbers"] for s in stats)
    long = [x for s in stats for x in s["long"]]
    return {"words": n_words, "sentences": n_sentences, "long": long, "long_share": len(long) / max(n_sentences, 1),
            "numbers": n_numbers, "numbers_per_100_words": 100 * n_numbers / max(n_words, 1)}


def _without_dropdowns(markdown: str) -> str:
    """``markdown`` without the directives a reader sees collapsed (``{dropdown}`` or ``:class: dropdown``)."""
    lines, out, i = markdown.splitlines(), [], 0
    while i < len(lines):
        opener = re.match(r"^\s*(`{3,}|:{3,})\{([\w:-]+)\}", lines[i])
        if opener:
            fence, j = opener.group(1), i + 1
            options = []
            while j < len(lines) and re.match(r"^\s*:[\w-]+:", lines[j]):
                options.append(lines[j])
                j += 1
            if opener.group(2) == "dropdown" or any(re.search(r":class:.*\bdropdown\b", o) for o in options):
                while j < len(lines) and lines[j].strip() != fence:
                    j += 1
                i = j + 1
                continue
        out.append(lines[i])
        i += 1
    return "\n".join(out)


def notebook_prose(notebook: dict) -> str:
    """The prose of an executed notebook as the page shows it, roughly: markdown cells with glued values in place,
    without code, tables, math, headings or the contents of collapsed dropdowns."""
    values = glued_values(notebook)
    parts = []
    for cell in notebook.get("cells", []):
        if cell["cell_type"] != "markdown":
            continue
        text = render_glue(_source(cell), values)
        text = _without_dropdowns(text)
        prose = _strip_markup(text)
        prose = re.sub(r"\$[^$\n]+\$", " ", prose)  # inline math
        prose = re.sub(r"`[^`\n]*`", " ", prose)  # inline code
        prose = "\n".join(line for line in prose.splitlines() if not line.lstrip().startswith("#"))
        prose = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", prose)  # links keep their text
        paragraphs, current = [], []
        for line in prose.splitlines():  # a paragraph or a list item is one line of the page
            item = re.match(r"^\s*(?:[-*+]|\d+\.)\s+", line)
            if not line.strip() or item:
                paragraphs.append(" ".join(current))
                current = []
            if line.strip():
                current.append(line[item.end():] if item else line.strip())
        paragraphs.append(" ".join(current))
        parts.append("\n".join(p for p in paragraphs if p.strip()))
    return "\n".join(parts)


def format_stats(name: str, stats: dict) -> str:
    return (f"{name}: {stats['words']} words, {stats['sentences']} sentences, {len(stats['long'])} over "
            f"{LONG_SENTENCE_WORDS} words ({stats['long_share']:.1%}; at most {MAX_LONG_SENTENCE_SHARE:.0%}), "
            f"{stats['numbers_per_100_words']:.2f} numbers per 100 words (at most {MAX_NUMBERS_PER_100_WORDS})")


# --- on an executed notebook -----------------------------------------------------------------------------------

def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def glued_values(notebook: dict) -> dict[str, str]:
    """``{name: text/plain}`` of every value the notebook glued."""
    values = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            scrap = output.get("metadata", {}).get("scrapbook", {})
            if "name" in scrap:
                prefix = scrap.get("mime_prefix", "")
                data = output.get("data", {})
                values[scrap["name"]] = "".join(data.get(f"{prefix}text/plain", data.get("text/plain", "")))
    return values


def _format(value: str, spec: str) -> str:
    """A glued ``text/plain`` value as ``{glue:text}`` shows it: strings without their quotes, numbers formatted
    with ``spec``."""
    import ast

    try:
        plain = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        plain = value
    if spec:
        try:
            return format(float(plain), spec)
        except (TypeError, ValueError):
            pass
    return str(plain)


def render_glue(markdown: str, values: dict[str, str]) -> str:
    """``markdown`` with each ``{glue:text}`name:spec``` (and ``{glue}``) replaced by its glued value."""
    def replace(match: re.Match) -> str:
        name, _, spec = match.group(1).partition(":")
        return _format(values.get(name, f"<{name}?>"), spec)
    return re.sub(r"\{glue(?::text)?\}`([^`]+)`", replace, markdown)


def _strip_markup(markdown: str) -> str:
    """The prose of MyST markdown, roughly: no code, no directive lines or options, no tables, no roles' markup."""
    out, stack = [], []  # stack of open fences: (fence, is_code)
    for line in markdown.splitlines():
        stripped = line.strip()
        if stack and stripped.startswith(stack[-1][0]) and stripped.strip("`:") == "":
            stack.pop()
            continue
        opener = re.match(r"^(`{3,}|:{3,})(\{[\w:-]+\})?", stripped)
        if opener and not (stack and stack[-1][1]):
            directive = opener.group(2)
            stack.append((opener.group(1), directive is None or directive in ("{code-cell}", "{code}",
                                                                             "{code-block}", "{math}")))
            continue
        if stack and stack[-1][1]:
            continue
        if re.match(r"^:[\w-]+:", stripped) or stripped.startswith("|") or re.match(r"^\(([\w-]+)\)=$", stripped):
            continue
        if re.match(r"^\$\$", stripped):
            continue
        out.append(line)
    text = "\n".join(out)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    return re.sub(r"\{[\w:-]+\}`([^`<]*?)(?:<[^`>]*>)?`", r"\1", text)


def question_boxes(markdown: str) -> list[tuple[str, str]]:
    """``(title, body)`` of every admonition in ``markdown`` whose title ends with a question mark."""
    boxes = []
    pattern = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?:admonition|note|tip|important)\}[ \t]*(?P<title>[^\n]*\?)[ \t]*\n"
                         r"(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)
    for match in pattern.finditer(markdown):
        boxes.append((match.group("title").strip(), match.group("body")))
    return boxes


def box_prose_words(body: str) -> int:
    """Words of prose in an admonition's body: directive options, tables and nested code left out."""
    return words(_strip_markup(body))


def check_notebook(notebook: dict, name: str = "") -> list[str]:
    """The page rules broken by one executed notebook (empty when none)."""
    problems = []
    values = glued_values(notebook)
    code_lines, first_section_seen = 0, False
    for i, cell in enumerate(notebook.get("cells", [])):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] == "markdown":
            text = render_glue(_source(cell), values)
            if re.search(r"^## ", text, re.M):
                first_section_seen = True
            for title, body in question_boxes(text):
                n = box_prose_words(body)
                if n > MAX_QUESTION_BOX_WORDS:
                    problems.append(f"{name} cell {i}: the box {title!r} has {n} words of prose "
                                    f"(at most {MAX_QUESTION_BOX_WORDS})")
            for rule, context in bookkeeping(_strip_markup(text)):
                problems.append(f"{name} cell {i}: {rule}: ...{context}...")
            for rule, context in one_voice(_without_dropdowns(_strip_markup(text))):
                if rule != "seed":
                    problems.append(f"{name} cell {i}: {rule}: ...{context}...")
        elif cell["cell_type"] == "code":
            if not first_section_seen and not tags & HIDDEN_SOURCE_TAGS:
                code_lines += len([line for line in _source(cell).splitlines() if line.strip()])
            if tags & {"remove-cell", "remove-output", "hide-output", "hide-cell"}:
                continue
            for output in cell.get("outputs", []):
                if output.get("metadata", {}).get("scrapbook"):
                    continue
                text = output.get("text") or "".join(output.get("data", {}).get("text/plain", ""))
                text = "".join(text) if isinstance(text, list) else text
                for rule, context in bookkeeping(text):
                    problems.append(f"{name} cell {i} (output): {rule}: ...{context}...")
    seeds = len(_SEED.findall(notebook_prose(notebook)))
    if seeds > MAX_SEED_MENTIONS:
        problems.append(f"{name}: {seeds} mentions of seed(s) in the prose (at most {MAX_SEED_MENTIONS})")
    if code_lines > MAX_CODE_LINES_BEFORE_FIRST_SECTION:
        problems.append(f"{name}: {code_lines} visible code lines before the first section "
                        f"(at most {MAX_CODE_LINES_BEFORE_FIRST_SECTION})")
    return problems


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    problems, stats = [], []
    show_long = "--long" in argv
    for path in [a for a in argv if a != "--long"]:
        notebook = json.loads(Path(path).read_text())
        glue = Path(path).with_suffix(".glue.json")  # the build's copy keeps its glued values beside the notebook
        if glue.exists():
            notebook.setdefault("cells", []).append({"cell_type": "code", "source": "", "metadata": {},
                                                      "outputs": list(json.loads(glue.read_text()).values())})
        problems += check_notebook(notebook, Path(path).name)
        stats.append(prose_stats(notebook_prose(notebook)))
        print(format_stats(Path(path).name, stats[-1]))
        if show_long:
            for sentence in stats[-1]["long"]:
                print(f"  [{words(sentence)} words] {sentence}")
    if len(stats) > 1:
        print(format_stats("together", combine_stats(stats)))
    print("\n".join(problems) if problems else "no page rule broken")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
