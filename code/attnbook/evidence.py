"""The book's one verdict rule, and the building blocks of the evidence pages.

A chapter page teaches and gives its verdicts; the page "Evidence for chapter N" (``evidence/chNN.ipynb``, back
matter) holds everything behind them: each comparison with its test, correction, effect size and count of runs in
each direction, the pairing of runs by device, speed by device, and the chapter's provenance. Both read the same
stored runs in ``results/``, so the two pages cannot disagree.

**The verdict rule** (one rule for every chapter, stated once on the evidence pages, :data:`RULE`):

1. a comparison gets a verdict only when it has at least :data:`MIN_PAIRS` paired runs (runs of both conditions with
   the same seed, on the same kind of device); with fewer it is *not yet answered*. A table of comparisons reads the
   runs of one kind of device, the one on which the most of its comparisons can get a verdict
   (:func:`attnbook.experiments.masking_report.table_device_kind`); runs on the other kind are a repeat;
2. otherwise the 95% interval of the mean paired difference decides: an interval that excludes zero gives a
   direction (*higher* or *lower*), one that includes zero gives *no difference resolved*;
3. in a family of comparisons, only the one the experiment was designed to answer (the *primary* one) is decided by
   its interval alone; every other one also needs its p-value, after Holm's correction over the family, below
   :data:`ALPHA`, or it is *not resolved after Holm's correction* (:data:`CORRECTED`).

:func:`verdict` applies it; :func:`attnbook.experiments.masking_report.paired_table` and the chapters' comparison
functions call it. Chapter pages show :func:`summary_table` (condition, mean, 95% interval or spread, runs); the
evidence pages show the rest with :func:`show`, :func:`provenance_table` and :func:`sessions_table`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["MIN_PAIRS", "ALPHA", "CORRECTED", "NOT_YET", "VERDICTS", "RULE", "verdict", "summary_table", "show",
           "table_html", "provenance_table", "sessions_table", "pending_table", "PROVENANCE_LABELS"]

#: Paired runs a comparison needs before any chapter draws a verdict from it. Three is the smallest number with
#: which a 95% interval of a mean can exclude zero only when the runs agree; the translation experiments of chapters
#: 4 and 8, whose runs take half an hour each, have three.
MIN_PAIRS = 3

#: The level below which a secondary comparison's Holm-corrected p-value must stay for its difference to count.
ALPHA = 0.05

#: The verdict of a secondary comparison whose interval excludes zero but whose corrected p-value does not stay
#: below :data:`ALPHA`.
CORRECTED = "not resolved after Holm's correction"

#: The verdict of a comparison with fewer than :data:`MIN_PAIRS` paired runs.
NOT_YET = "not yet answered"

#: Every verdict :func:`verdict` returns.
VERDICTS = ("higher", "lower", "no difference resolved", CORRECTED, NOT_YET)

#: The rule in words, as the evidence pages state it.
RULE = (f"A comparison gets a verdict only when it has at least {MIN_PAIRS} paired runs (the same seed under both "
        "conditions, on the same kind of device); with fewer it is \"not yet answered\". One table reads the runs "
        "of one kind of device, the one on which the most of its comparisons can get a verdict; runs on the other "
        "kind are shown as a repeat. The 95% interval of the "
        "mean paired difference then decides: \"higher\" or \"lower\" when it excludes zero, \"no difference "
        "resolved\" when it includes zero. In a family of comparisons, only the one the experiment was designed "
        "to answer is decided by its interval alone; each other one also needs its Wilcoxon p-value, after Holm's "
        f"correction over the family, below {ALPHA:g}, or it is \"{CORRECTED}\".")


def verdict(n_pairs: int, ci_low: float, ci_high: float, min_pairs: int = MIN_PAIRS, p_holm: float = math.nan,
            alpha: float = ALPHA) -> str:
    """The verdict word of one comparison, by the book's one rule (module docstring).

    Args:
        n_pairs: paired runs (int >= 0).
        ci_low, ci_high: the 95% interval of the mean paired difference (NaN when there is none).
        min_pairs: paired runs needed (default :data:`MIN_PAIRS`; other values only in tests).
        p_holm: the Holm-corrected p-value of a secondary comparison; NaN for a primary one, which its interval
            alone decides.
        alpha: the level for ``p_holm``.

    Returns:
        One of :data:`VERDICTS`.

    Raises:
        ValueError: ``n_pairs`` is negative, or ``ci_low > ci_high``.
    """
    if n_pairs < 0:
        raise ValueError(f"n_pairs must be >= 0, got {n_pairs}")
    finite = np.isfinite(ci_low) and np.isfinite(ci_high)
    if finite and ci_low > ci_high:
        raise ValueError(f"ci_low={ci_low} is above ci_high={ci_high}")
    if n_pairs < min_pairs or not finite:
        return NOT_YET
    if ci_low > 0 or ci_high < 0:
        if np.isfinite(p_holm) and p_holm >= alpha:
            return CORRECTED
        return "higher" if ci_low > 0 else "lower"
    return "no difference resolved"


def _interval(values: np.ndarray, interval: str, n_resamples: int, seed: int) -> tuple[float, float]:
    if len(values) < 2:
        return math.nan, math.nan
    if interval == "spread":
        return float(values.min()), float(values.max())
    from .stats import bootstrap_ci   # scipy: imported only when an interval is asked for

    low, high = bootstrap_ci(values, n_resamples=n_resamples, seed=seed)
    return float(low), float(high)


def summary_table(runs: pd.DataFrame, by: str | Sequence[str], value: str, *, interval: str = "ci",
                  scale: float = 1.0, digits: int = 1, order: Sequence | None = None, labels: dict | None = None,
                  n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
    """The plain results table of a chapter: one row per condition, with its mean, its 95% interval (or spread),
    and its number of runs.

    Args:
        runs: one row per run.
        by: the column(s) that name a condition.
        value: the result column (e.g. ``"test_accuracy"`` as a fraction, ``"bleu"`` in points).
        interval: ``"ci"`` (the 95% bootstrap interval of the mean, :func:`attnbook.stats.bootstrap_ci`) or
            ``"spread"`` (lowest to highest run).
        scale: multiplies ``value`` before formatting (100 turns a fraction into points).
        digits: decimals shown.
        order: the conditions in the order to show (default: as they first occur); values of ``by``.
        labels: condition -> the reader's words for it.

    Returns:
        A DataFrame with columns ``condition, mean, 95% interval`` (or ``spread``) ``, runs``; the interval is
        ``"a to b"`` and ``"–"`` for a single run.

    Raises:
        ValueError: a column is missing, ``interval`` is unknown, or ``order`` names a condition with no runs.
    """
    by = [by] if isinstance(by, str) else list(by)
    missing = sorted({*by, value} - set(runs.columns))
    if missing:
        raise ValueError(f"runs lacks the columns {missing}")
    if interval not in ("ci", "spread"):
        raise ValueError(f"interval must be 'ci' or 'spread', got {interval!r}")
    key = runs[by[0]] if len(by) == 1 else runs[by].apply(tuple, axis=1)
    conditions = list(dict.fromkeys(key)) if order is None else list(order)
    absent = [c for c in conditions if not (key == c).any()]
    if absent:
        raise ValueError(f"order names conditions with no runs: {absent}")
    column = "95% interval" if interval == "ci" else "spread"
    rows = []
    for condition in conditions:
        values = runs.loc[key == condition, value].dropna().to_numpy(float) * scale
        low, high = _interval(values, interval, n_resamples, seed)
        span = "–" if not np.isfinite(low) else f"{low:.{digits}f} to {high:.{digits}f}"
        rows.append({"condition": (labels or {}).get(condition, condition),
                     "mean": f"{values.mean():.{digits}f}" if len(values) else "–",
                     column: span, "runs": len(values)})
    return pd.DataFrame(rows, columns=["condition", "mean", column, "runs"])


def _plain_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with counts as counts and every missing cell as a dash: a float column whose values are all whole
    numbers becomes integers (a count that pandas widened to float because one value was missing), and a missing
    value in any other column (``None``, ``pd.NA``) becomes "–", as NaN does in :func:`table_html`."""
    columns = []
    for j in range(frame.shape[1]):
        col = frame.iloc[:, j]
        if pd.api.types.is_float_dtype(col) and col.notna().any():
            values = col.dropna().to_numpy(float)
            if np.all(np.isfinite(values)) and np.all(values == np.round(values)):
                col = col.astype("Int64")
        if not pd.api.types.is_float_dtype(col) and col.isna().any():
            col = col.astype(object).where(col.notna(), "–")
        columns.append(col)
    if not columns:
        return frame
    out = pd.concat(columns, axis=1)
    out.columns = frame.columns
    return out


def table_html(frame: pd.DataFrame, *, index: bool = False, classes: str = "table evidence") -> str:
    """``frame`` as a plain HTML table (no pandas index unless ``index``): whole-number floats as integers, and
    every missing cell (NaN, ``None``, ``pd.NA``) as a dash (:func:`_plain_cells`)."""
    return _plain_cells(frame).to_html(index=index, border=0, classes=classes, na_rep="–", escape=True)


def show(frame: pd.DataFrame, *, index: bool = False) -> None:
    """Display ``frame`` as a plain table in a notebook (:func:`table_html`)."""
    from IPython.display import HTML, display

    display(HTML(table_html(frame, index=index)))


#: The rows of :func:`provenance_table`: a field of :func:`attnbook.ledger.summarize` and the reader's words for it.
PROVENANCE_LABELS = {
    "backs": "what it backs", "runs": "runs", "seeds": "seeds", "mode": "mode", "sizes": "sizes",
    "devices": "device", "versions": "library versions (session that last wrote the record)", "commits": "commit",
    "first": "first day (UTC)", "last": "last day (UTC)", "wall_h": "wall time (h)", "sessions": "sessions",
    "backends": "ran with", "command": "to make it again",
}


def provenance_table(chapter: int, folder: str | Path | None = None) -> pd.DataFrame:
    """How each stored result of ``chapter`` was made: one column per store, one row per fact
    (:data:`PROVENANCE_LABELS`); empty when the chapter has none stored (:func:`attnbook.ledger.chapter_table`)."""
    from . import ledger

    table = ledger.chapter_table(chapter, folder)
    if table.empty:
        return table

    def count(x):
        return "–" if pd.isna(x) else f"{int(x):,}"

    table = table.assign(wall_h=table.wall_h.map(lambda h: f"{h:.2f}"), runs=table.runs.map(count),
                         seeds=table.seeds.map(count))
    wide = table.set_index("store")[list(PROVENANCE_LABELS)].rename(columns=PROVENANCE_LABELS).T
    wide.columns.name = None
    return wide


def sessions_table(chapter: int, folder: str | Path | None = None) -> pd.DataFrame:
    """Every session that added to a stored result of ``chapter`` (:func:`attnbook.ledger.sessions_table`), with a
    ``store`` column first; empty when none is stored."""
    from . import ledger

    frames = [ledger.sessions_table(s, folder).assign(store=s.name) for s in ledger.STORES
              if s.chapter == chapter and ledger.read_record(s.name, folder) is not None]
    if not frames:
        return pd.DataFrame()
    every = pd.concat(frames, ignore_index=True)
    return every[["store", *[c for c in every.columns if c != "store"]]]


def pending_table(chapter: int, folder: str | Path | None = None) -> pd.DataFrame:
    """The stores of ``chapter`` not yet made, with what making them needs (:func:`attnbook.ledger.pending`)."""
    from . import ledger

    todo = ledger.pending(folder)
    return todo[todo.chapter == chapter].drop(columns="chapter").reset_index(drop=True)
