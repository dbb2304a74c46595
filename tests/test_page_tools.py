"""The tools behind the page rules, the appendix page and the PDF edition: tools/page_rules.py, attnbook.ledger,
and the print visitors of _ext/attnbook_site.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from docutils import nodes

from attnbook import ledger

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


page_rules = _load("page_rules", ROOT / "tools" / "page_rules.py")


# --- page rules -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, rule", [
    ("the runs of commit 465f9bf, on a CPU", "commit"),
    ("made at 465f9bf5d5 by hand", "commit hash"),
    ("11.5 h of wall time over 12 sessions", "session"),
    ("load average about 8", "load average"),
    ("mostly 2 workers at a time", "worker count"),
    ("python -m x --workers 4", "worker count"),
    ("CPU (1 thread, x86_64)", "thread count"),
    ("CPU (1 thread, x86_64)", "machine name"),
    ("written to results/masking_full.csv", "store file name"),
    ("written to results/masking_full.csv", "results folder"),
    ("The store holds 188 runs", "the store"),
    ("the last on 2026-11-23", "run date"),
    ("47 CPU runs and 141 GPU runs", "CPU/GPU runs"),
    ("within the target of one eighth", "internal target"),
    ("nli_full has not been produced yet", "placeholder"),
    ("## Run information", "run information"),
])
def test_bookkeeping_patterns_find_what_the_issue_lists(text, rule):
    assert rule in {found for found, _ in page_rules.bookkeeping(text)}


@pytest.mark.parametrize("text", [
    "Greedy decoding commits early: a choice that looks best now can be wrong later.",
    "SNLI's crowd workers wrote the hypotheses.",
    "Ring attention splits the keys across workers; each worker returns its partial sums.",
    "Check that it works when one worker’s keys are all masked.",
    "max |ours - SDPA| = 8.881784e-16, and 1.298816e-06 in fp32",
    "The KV cache stores the keys and values of the prefix.",
    "Masked mean pooling against attention pooling: -0.44 points (95% CI -0.78 to -0.14).",
])
def test_bookkeeping_patterns_leave_ordinary_prose_alone(text):
    assert page_rules.bookkeeping(text) == []


def _notebook(*cells):
    out = []
    for kind, source, *rest in cells:
        cell = {"cell_type": kind, "source": source, "metadata": {"tags": rest[0] if rest else []}}
        if kind == "code":
            cell["outputs"] = rest[1] if len(rest) > 1 else []
        out.append(cell)
    return {"cells": out}


def _glue_output(name, value):
    return {"output_type": "display_data", "metadata": {"scrapbook": {"name": name, "mime_prefix": ""}},
            "data": {"text/plain": repr(value)}}


def test_check_notebook_renders_glue_counts_setup_lines_and_question_boxes():
    long_answer = " ".join(["word"] * 130)
    nb = _notebook(
        ("code", "import torch\n" * 20, [], []),
        ("code", "x = 1\n" * 10, ["hide-input"], []),
        ("markdown", f"# Title\n\n:::{{admonition}} Should I mask?\n{long_answer}\n\n| a | b |\n|---|---|\n:::\n"),
        ("code", "y = 2\n" * 10, [], []),
        ("markdown", "## First section\n\nThe runs ran on {glue:text}`dev`."),
        ("code", "glue('dev', 'CPU (1 thread, x86_64)')", ["remove-cell"],
         [_glue_output("dev", "CPU (1 thread, x86_64)")]),
    )
    problems = page_rules.check_notebook(nb, "nb")
    assert any("30 visible code lines before the first section" in p for p in problems), problems
    assert any("'Should I mask?' has 130 words" in p for p in problems), problems
    assert any("thread count" in p for p in problems) and any("machine name" in p for p in problems)


def test_check_notebook_passes_a_clean_page():
    nb = _notebook(
        ("code", "from attnbook import masking", [], []),
        ("markdown", "# Title\n\n:::{admonition} Should I mask?\nYes: mask before the softmax.\n:::\n"
                     "\n## First section\n\nThe mask changed accuracy by {glue:text}`d:.2f` points."),
        ("code", "glue('d', 0.3)", ["remove-cell"], [_glue_output("d", 0.3)]),
    )
    assert page_rules.check_notebook(nb, "nb") == []


def test_render_glue_formats_numbers_and_strings():
    values = {"x": "0.12345", "s": "'higher'"}
    assert page_rules.render_glue("{glue:text}`x:.2f` and {glue:text}`s`", values) == "0.12 and higher"
    assert page_rules.render_glue("{glue:text}`missing`", values) == "<missing?>"


# --- the ledger -------------------------------------------------------------------------------------------------

def test_every_stored_record_is_in_the_ledger():
    records = {p.stem for p in (ROOT / "results").glob("*.json")}
    assert records <= {s.name for s in ledger.STORES}


def test_ledger_summarizes_a_store_from_its_record(tmp_path):
    record = {"mode": "full", "torch": "2.13.0", "numpy": "2.4.6", "python": "3.11.7", "n_runs": 4,
              "config": {"epochs": 2, "seeds": [0, 1], "nested": {"a": 1}},
              "sessions": [
                  {"commit": "abcdef1234", "started_utc": "2026-11-21T10:00:00+00:00",
                   "date_utc": "2026-11-21T11:00:00+00:00", "device": "CPU (1 threads, x86_64)",
                   "wall_time_s": 1800, "workers": 2, "runs_added": 2, "status": "finished"},
                  {"commit": "1234567abc+dirty", "date_utc": "2026-11-23T05:00:00+00:00", "device": "NVIDIA H100",
                   "wall_time_s": 1800, "workers": 16, "runs_added": 2, "backend": "dask"}]}
    (tmp_path / "masking_full.json").write_text(json.dumps(record))
    (tmp_path / "masking_full.csv").write_text("seed,acc\n0,1\n1,1\n0,1\n1,1\n")
    store = next(s for s in ledger.STORES if s.name == "masking_full")
    row = ledger.summarize(store, tmp_path)
    assert row["runs"] == 4 and row["seeds"] == 2 and row["sessions"] == 2
    assert row["wall_h"] == pytest.approx(1.0)
    assert row["first"] == "2026-11-21" and row["last"] == "2026-11-23"
    assert row["commits"] == "abcdef1, 1234567 with uncommitted changes"
    assert row["devices"] == "CPU (1 thread, x86_64); NVIDIA H100"
    assert row["backends"] == "local (joblib), dask"
    assert row["sizes"] == "epochs=2, seeds=2 values"
    sessions = ledger.sessions_table(store, tmp_path)
    assert list(sessions["workers"]) == [2, 16] and list(sessions["wall time (min)"]) == [30.0, 30.0]


def test_ledger_lists_pending_stores_and_only_those(tmp_path):
    todo = ledger.pending(tmp_path)  # an empty results folder: every store that needs more is pending
    assert set(todo.store) == {s.name for s in ledger.STORES if s.needs}
    assert ledger.summarize(ledger.STORES[0], tmp_path) is None
    assert ledger.chapter_table(3, tmp_path).empty
    (tmp_path / "nli_full.json").write_text(json.dumps({"mode": "full"}))
    assert "nli_full" not in set(ledger.pending(tmp_path).store)


def test_short_commit():
    assert ledger.short_commit("38afaf49ce6b5bbba3f1591bc4ebe8ce309e7db1+dirty") == "38afaf4 with uncommitted changes"
    assert ledger.short_commit(None) == "?"


# --- the PDF edition's visitors for collapsed cells --------------------------------------------------------------

site = _load("attnbook_site", ROOT / "_ext" / "attnbook_site.py")


class _Translator:
    def __init__(self):
        self.body = []


def _hidden(classes, *children):
    from myst_nb.sphinx_ import HideCodeCellNode

    node = HideCodeCellNode(prompt_show="Show code cell {type}", prompt_hide="Hide")
    node["classes"].extend(classes)
    for kind in children:
        child = nodes.container()
        child["nb_element"] = kind
        node.append(child)
    return node


def test_print_leaves_out_a_hidden_source_and_prints_hidden_outputs_in_full():
    translator = _Translator()
    with pytest.raises(nodes.SkipNode):  # hide-input: the source is left out
        site._visit_hidden_code_cell_print(translator, _hidden(["above-input"], "cell_code_source"))
    for node in (_hidden(["below-input"], "cell_code_output"),  # hide-output
                 _hidden(["above-input"], "cell_code_source", "cell_code_output")):  # hide-cell
        translator = _Translator()
        site._visit_hidden_code_cell_print(translator, node)
        site._depart_hidden_code_cell_print(translator, node)
        assert "".join(translator.body) == '<div class="print-collapsed">\n</div>\n'
        assert "Show code" not in "".join(translator.body)


def test_ledger_tells_the_truth_about_the_audit_and_finished_sessions():
    audit = ledger.summarize(next(s for s in ledger.STORES if s.name == "audit"))
    assert audit["mode"] == "–" and audit["backends"] == "one process"
    assert "transformers " in audit["versions"] and "keras " in audit["versions"]
    assert "x-transformers " in audit["versions"] and "+dirty" not in audit["commits"]
    for store in ledger.STORES:
        if ledger.read_record(store.name) is not None:
            statuses = set(ledger.sessions_table(store).get("status", []))
            assert "running" not in statuses, store.name

