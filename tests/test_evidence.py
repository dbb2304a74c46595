"""attnbook.evidence: the one verdict rule and the plain results table (checked against numpy and scipy)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from attnbook import evidence
from attnbook.evidence import CORRECTED, MIN_PAIRS, NOT_YET, summary_table, verdict


def test_rule_at_its_edges():
    assert verdict(MIN_PAIRS, 0.001, 0.01) == "higher" and verdict(MIN_PAIRS, -0.01, -0.001) == "lower"
    assert verdict(MIN_PAIRS - 1, 0.1, 0.2) == NOT_YET and verdict(0, math.nan, math.nan) == NOT_YET
    assert verdict(50, 0.0, 0.1) == "no difference resolved"          # a bound at zero includes zero
    assert verdict(50, -0.1, 0.0) == "no difference resolved"
    assert verdict(50, 0.01, 0.01) == "higher"                         # equal bounds
    assert verdict(50, 0.01, 0.02, p_holm=evidence.ALPHA) == CORRECTED
    assert verdict(50, 0.01, 0.02, p_holm=0.049) == "higher"
    assert verdict(50, math.nan, 0.1) == NOT_YET
    assert set(evidence.VERDICTS) >= {verdict(50, 0.1, 0.2), verdict(50, -0.1, 0.1), NOT_YET, CORRECTED}


def test_rule_refuses_bad_input():
    with pytest.raises(ValueError, match="n_pairs must be >= 0, got -1"):
        verdict(-1, 0.0, 0.1)
    with pytest.raises(ValueError, match="ci_low=0.2 is above ci_high=0.1"):
        verdict(10, 0.2, 0.1)


def test_rule_is_the_one_masking_report_uses():
    from attnbook.experiments import masking_report

    assert masking_report.verdict is verdict and masking_report.MIN_PAIRS == MIN_PAIRS
    assert str(MIN_PAIRS) in evidence.RULE and CORRECTED in evidence.RULE


def _runs():
    rng = np.random.default_rng(0)
    return pd.DataFrame({"model": ["a"] * 5 + ["b"] * 3 + ["c"],
                         "bleu": np.r_[rng.normal(30, 1, 5), rng.normal(20, 1, 3), [7.0]]})


def test_summary_table_means_spreads_and_counts():
    runs = _runs()
    table = summary_table(runs, "model", "bleu", interval="spread", digits=2, labels={"a": "model A"})
    assert table.columns.tolist() == ["condition", "mean", "spread", "runs"]
    a = runs.bleu[runs.model == "a"]
    assert table.iloc[0].tolist() == ["model A", f"{a.mean():.2f}", f"{a.min():.2f} to {a.max():.2f}", 5]
    assert table.iloc[2].tolist() == ["c", "7.00", "–", 1]               # one run: no spread


def test_summary_table_interval_is_the_bootstrap_of_the_mean():
    runs = _runs()
    table = summary_table(runs, "model", "bleu", order=["b", "a"], n_resamples=999)
    assert table.condition.tolist() == ["b", "a"]
    a = runs.bleu[runs.model == "a"].to_numpy()
    ci = sps.bootstrap((a,), np.mean, n_resamples=999, method="BCa", rng=np.random.default_rng(0)).confidence_interval
    assert table.iloc[1]["95% interval"] == f"{ci.low:.1f} to {ci.high:.1f}"


def test_summary_table_refuses_bad_input():
    with pytest.raises(ValueError, match=r"runs lacks the columns \['acc'\]"):
        summary_table(_runs(), "model", "acc")
    with pytest.raises(ValueError, match="interval must be 'ci' or 'spread', got 'sd'"):
        summary_table(_runs(), "model", "bleu", interval="sd")
    with pytest.raises(ValueError, match=r"order names conditions with no runs: \['z'\]"):
        summary_table(_runs(), "model", "bleu", order=["a", "z"])


def test_provenance_of_every_chapter_with_stores():
    for chapter in (3, 4, 5, 8, 9, 10):
        table = evidence.provenance_table(chapter)
        assert not table.empty and table.index.tolist() == list(evidence.PROVENANCE_LABELS.values())
    assert evidence.provenance_table(1).empty and evidence.sessions_table(1).empty
    sessions = evidence.sessions_table(5)
    assert sessions.columns[0] == "store" and (sessions.store == "masking_full").all()


def test_tables_show_counts_as_counts_and_every_missing_cell_as_a_dash():
    """A count that pandas widened to float (one session did not record it) reads 46, not 46.0; a missing value
    reads "–" whether it is NaN, None or pd.NA; a measurement keeps its decimals."""
    frame = pd.DataFrame({"runs added": [46.0, float("nan")], "workers": [None, 2],
                          "threads": pd.array([1, None], dtype="Int64"), "wall time (min)": [25.5, 3.0]})
    html = evidence.table_html(frame)
    assert "<td>46</td>" in html and "46.0" not in html
    assert "None" not in html and "&lt;NA&gt;" not in html and "<NA>" not in html
    assert html.count("<td>–</td>") == 3 and "<td>25.5</td>" in html
    assert evidence.table_html(pd.DataFrame()).startswith("<table")
