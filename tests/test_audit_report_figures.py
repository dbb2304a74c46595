"""attnbook.audit.report_figures: chapter 10's figures, tables and sentences, at their edge values."""

import math

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from attnbook.audit import report_figures as rf  # noqa: E402


def by_root(*rows):
    return pd.DataFrame(rows, columns=["category", "root_cause", "summary", "subjects", "checks", "failures"])


def test_root_cause_sentence_words_each_side_once_and_counts_configurations():
    table = rf.root_cause_table(by_root(
        ("caller", "left-padding-positions", "s", 4, 2, 8), ("contract", "empty-row-nan", "s", 5, 1, 5),
        ("library", "fp16-fill-overflow", "s", 1, 1, 1), ("library", "new-cause", "its summary", 1, 2, 2),
        ("book", "book-unmasked", "s", 2, 3, 5)))
    assert list(table["whose side"]) == ["the caller's requirement", "a contract choice",
                                         "library behaviour", "library behaviour"]
    assert table["root cause"].iloc[-1] == "its summary"
    assert rf.root_cause_sentence(table) == (
        "Their failures have four root causes, each counted once: one is the caller's requirement, "
        "one a contract choice, and two are library behaviour.")


def test_root_cause_sentence_at_its_edges():
    assert rf.root_cause_sentence(rf.root_cause_table(by_root())) == "No configuration failed a check."
    one = rf.root_cause_table(by_root(("contract", "empty-row-nan", "s", 1, 1, 1)))
    assert rf.root_cause_sentence(one) == "Their failures have one root cause: a contract choice."
    two = rf.root_cause_table(by_root(("library", "a", "s", 1, 1, 1), ("library", "b", "s", 1, 1, 1)))
    assert rf.root_cause_sentence(two) == ("Their failures have two root causes, each counted once: two are "
                                           "library behaviour.")
    assert rf.count_word(0) == "no" and rf.count_word(9) == "nine" and rf.count_word(10) == "10"
    with pytest.raises(ValueError, match=r"failures without a known root cause: categories \['unexplained'\]"):
        rf.root_cause_table(by_root(("unexplained", "", "x", 1, 1, 1)))


def test_point_kind_tells_nan_and_errors_from_differences():
    row = lambda passed, value, detail: pd.Series({"passed": passed, "max_rel_diff": value, "detail": detail})  # noqa
    assert rf.point_kind(row(True, 1e-7, "")) == "pass"
    assert rf.point_kind(row(False, 0.3, "rows 1 differ")) == "fail"
    assert rf.point_kind(row(False, math.nan, "row 1: NaN or infinite outputs")) == "NaN"
    assert rf.point_kind(row(False, math.nan, "forward raised ValueError: x")) == "error"


def test_the_figures_draw_nan_and_error_points_and_check_their_input():
    results = pd.DataFrame({"check": ["a", "a", "b", "b"], "passed": [True, False, False, False],
                            "max_rel_diff": [1e-8, 0.5, math.nan, math.nan],
                            "detail": ["", "differ", "NaN or infinite", "forward raised RuntimeError"]})
    fig = rf.differences_figure(results, ["a", "b"])
    side = fig.axes[1]
    assert sum(len(c.get_offsets()) for c in side.collections) == 2  # the NaN and the error point
    with pytest.raises(ValueError, match="none of the checks"):
        rf.differences_figure(results, ["z"])
    assert len(rf.padded_batch_figure((2, 0), 3).axes) == 3
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, length\] = \[0, 3\]"):
        rf.padded_batch_figure((4,), 3)


def explained(*rows):
    return pd.DataFrame(rows, columns=["subject", "category", "root_cause"])


def test_side_sentence_counts_configurations_per_side_at_its_edges():
    table = explained(("a", "library", "x"), ("a", "contract", "empty"), ("b", "library", "y"),
                      ("c", "caller", "pos"), ("d", "caller", "pos"), ("e", "contract", "empty"))
    assert rf.side_sentence(table) == (
        "Two show a library's own behaviour (two root causes); two leave out what the library asks of the caller, "
        "and two get NaN for a row without tokens: a contract choice, not a bug.")
    one = explained(("a", "library", "x"), ("b", "caller", "p"), ("c", "contract", "e"))
    assert rf.side_sentence(one) == (
        "One shows a library's own behaviour (one root cause); one leaves out what the library asks of the caller, "
        "and one gets NaN for a row without tokens: a contract choice, not a bug.")
    assert rf.side_sentence(explained()) == (
        "None shows a library's own behaviour; none leaves out what the library asks of the caller, and none "
        "gets NaN for a row without tokens.")
    with pytest.raises(ValueError, match="a failure has no known root cause"):
        rf.side_sentence(explained(("a", "unexplained", "")))
