"""Paired statistics for multi-seed experiments.

Explained in chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``),
section "Statistics for paired seeds".

In our experiments a seed fixes the initialization and the data order, and every condition (e.g. masking on/off)
is run with the same seeds. Two runs with the same seed are therefore a *pair*, and we analyse the per-seed
differences ``d_s = value(condition, s) - value(baseline, s)`` rather than two independent samples: the seed's
share of the variance cancels. On the differences we report a bootstrap confidence interval of the mean
(Efron & Tibshirani 1993), the Wilcoxon signed-rank test (Wilcoxon 1945), Holm's correction across comparisons
(Holm 1979), and two effect sizes: Cohen's d_z and the matched-pairs rank-biserial correlation (Kerby 2014).

The computations are scipy's and statsmodels'; this module fixes the conventions (zeros dropped, deterministic
resampling) and gives defined, warning-free answers in the degenerate cases that identical conditions produce
(all differences zero), where scipy would warn or return NaN.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

__all__ = [
    "paired_differences",
    "bootstrap_ci",
    "wilcoxon_test",
    "holm",
    "cohens_dz",
    "rank_biserial",
    "compare_paired",
]


def _as_1d_finite(x, min_n: int, name: str = "x") -> np.ndarray:
    """``x`` as a 1-D float array; ValueError unless it has at least ``min_n`` values, all finite."""
    arr = np.asarray(x, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size < min_n:
        raise ValueError(f"{name} needs at least {min_n} value(s), got {arr.size}")
    bad = int(np.count_nonzero(~np.isfinite(arr)))
    if bad:
        raise ValueError(f"{name} must be finite, got {bad} NaN/inf value(s) out of {arr.size}")
    return arr


def _wide(df: pd.DataFrame, value: str, condition: str, baseline, pair_on) -> tuple[pd.DataFrame, list]:
    """Validated pivot ``(pair keys) x condition`` of ``value``, rows restricted to keys that have the baseline."""
    keys = [pair_on] if isinstance(pair_on, str) else list(pair_on)
    missing = [c for c in [value, condition, *keys] if c not in df.columns]
    if missing:
        raise ValueError(f"df has no column(s) {missing}; its columns are {list(df.columns)}")
    conditions = list(pd.unique(df[condition]))
    if baseline not in conditions:
        raise ValueError(f"baseline {baseline!r} is not among the values of column {condition!r}: {conditions}")
    others = [c for c in conditions if c != baseline]
    if not others:
        raise ValueError(f"column {condition!r} holds only the baseline {baseline!r}; nothing to compare")
    dup = df.duplicated(subset=[*keys, condition], keep=False)
    if dup.any():
        shown = df.loc[dup, [*keys, condition]].drop_duplicates().head(5).to_dict("records")
        raise ValueError(f"duplicate runs: these ({keys}, {condition!r}) combinations occur more than once: {shown}")
    try:
        values = pd.to_numeric(df[value], errors="raise").astype(float)
    except (ValueError, TypeError) as err:
        raise ValueError(f"column {value!r} must be numeric, got dtype {df[value].dtype}: {err}") from err
    if not np.isfinite(values).all():
        bad = df.loc[~np.isfinite(values), [*keys, condition]].head(5).to_dict("records")
        raise ValueError(f"column {value!r} has NaN/inf values, e.g. in runs {bad}")
    index = keys[0] if len(keys) == 1 else keys
    wide = df.assign(**{value: values}).pivot(index=index, columns=condition, values=value)
    wide = wide.loc[wide[baseline].notna(), [baseline, *others]]
    empty = [c for c in others if wide[c].notna().sum() == 0]
    if empty:
        raise ValueError(f"no complete pair: no {keys} value has both the baseline {baseline!r} and {empty}")
    return wide, others


def paired_differences(
    df: pd.DataFrame, *, value: str, condition: str, baseline, pair_on: str | Sequence[str] = "seed"
) -> pd.DataFrame:
    """Per-seed differences ``value[condition] - value[baseline]`` from a long table of runs.

    Args:
        df: long format, one row per run, with columns ``condition`` (e.g. ``"masking"``), the pairing key(s)
            ``pair_on`` (e.g. ``"seed"``) and a numeric ``value`` (e.g. ``"test_accuracy"``; any unit).
        value, condition: column names.
        baseline: the value of ``df[condition]`` that is subtracted (e.g. ``"no_mask"``).
        pair_on: the column, or columns, that identify a pair (runs sharing them are compared).

    Returns:
        DataFrame indexed by the pairing key(s) (sorted), one column per non-baseline condition in order of first
        appearance, holding the differences in the unit of ``value``. Only keys that have the baseline are rows;
        a cell is NaN where that key lacks that condition (an incomplete pair), so drop NaN per column.

    Raises:
        ValueError: a column is missing; ``baseline`` is not a condition or is the only one; a (key, condition)
            occurs twice (duplicate runs); ``value`` is not numeric or has NaN/inf; or a condition has no complete
            pair with the baseline. The message names the offending columns or values.

    Uses :meth:`pandas.DataFrame.pivot`.
    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    wide, others = _wide(df, value, condition, baseline, pair_on)
    diffs = wide[others].sub(wide[baseline], axis=0)
    return diffs.dropna(how="all")


def bootstrap_ci(
    x, *, confidence_level: float = 0.95, n_resamples: int = 9999, seed: int = 0, method: str = "BCa"
) -> tuple[float, float]:
    """Bootstrap confidence interval of the mean of ``x`` (Efron & Tibshirani 1993, ch. 14).

    Args:
        x: 1-D array-like of at least 2 finite values (e.g. per-seed differences, in their unit).
        confidence_level: in (0, 1).
        n_resamples: number of bootstrap resamples.
        seed: seeds ``numpy.random.default_rng``; the same seed gives the same interval.
        method: ``"BCa"``, ``"percentile"`` or ``"basic"`` (as in :func:`scipy.stats.bootstrap`).

    Returns:
        ``(low, high)`` as floats, in the unit of ``x``. Constant ``x`` gives ``(x[0], x[0])``. If BCa is undefined
        (NaN, e.g. values equal up to rounding), the percentile interval is returned instead.

    Raises:
        ValueError: fewer than 2 values, NaN/inf values (the message says how many), or ``confidence_level``
            outside (0, 1).

    Computed by ``scipy.stats.bootstrap((x,), np.mean, rng=np.random.default_rng(seed), ...)``; emits no warnings.
    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    arr = _as_1d_finite(x, min_n=2)
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level must be in (0, 1), got {confidence_level}")
    if np.all(arr == arr[0]):  # scipy would warn DegenerateDataWarning and return NaN
        return float(arr[0]), float(arr[0])

    def run(m: str):
        return stats.bootstrap(
            (arr,), np.mean, confidence_level=confidence_level, n_resamples=n_resamples, method=m,
            rng=np.random.default_rng(seed),
        ).confidence_interval

    # BCa divides by zero when the resampled means are all on one side of the mean (values equal up to
    # rounding); scipy then warns and returns NaN. Silence exactly that, and fall back to percentile.
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        ci = run(method)
        if np.isnan(ci.low) or np.isnan(ci.high):
            ci = run("percentile")
    return float(ci.low), float(ci.high)


def wilcoxon_test(x) -> tuple[float, float]:
    """Wilcoxon signed-rank test (Wilcoxon 1945) of paired differences ``x`` against 0, two-sided.

    Args:
        x: 1-D array-like of at least 1 finite difference. Zeros are dropped (``zero_method="wilcox"``).

    Returns:
        ``(statistic, p_value)`` as floats: the smaller of the rank sums of the positive and the negative
        differences, and the two-sided p-value. All-zero ``x`` gives ``(0.0, 1.0)`` (no evidence of a difference).

    Raises:
        ValueError: no values, or NaN/inf values (the message says how many).

    Computed by ``scipy.stats.wilcoxon(x, zero_method="wilcox", alternative="two-sided", method="auto")``: exact
    for up to 50 differences without ties or zeros, exhaustive permutations for up to 13 with ties or zeros, and
    the normal approximation otherwise (scipy >= 1.15). Emits no warnings.
    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    arr = _as_1d_finite(x, min_n=1)
    if not np.any(arr):  # scipy warns (0/0 in the z statistic) for all-zero differences
        return 0.0, 1.0
    res = stats.wilcoxon(arr, zero_method="wilcox", alternative="two-sided", method="auto")
    return float(res.statistic), float(res.pvalue)


def holm(pvalues, alpha: float = 0.05) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (Holm 1979), controlling the family-wise error rate.

    Args:
        pvalues: 1-D array-like of p-values in [0, 1], one per comparison (any order).
        alpha: the family-wise error rate (statsmodels uses it only for its reject decisions).

    Returns:
        float array shaped like ``pvalues``, in the same order: ``max_{j<=i} min(1, (m - j + 1) p_(j))`` for the
        i-th smallest. Always ``>=`` the raw p-values. Empty input gives an empty array.

    Raises:
        ValueError: a p-value is NaN or outside [0, 1].

    Computed by ``statsmodels.stats.multitest.multipletests(p, alpha=alpha, method="holm")[1]``.
    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1:
        raise ValueError(f"pvalues must be one-dimensional, got shape {p.shape}")
    if p.size == 0:
        return np.empty(0)
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"p-values must be in [0, 1] and not NaN, got {p.tolist()}")
    return np.asarray(multipletests(p, alpha=alpha, method="holm")[1], dtype=float)


def cohens_dz(x) -> float:
    """Cohen's d_z: the mean of paired differences over their standard deviation (``ddof=1``).

    Args:
        x: 1-D array-like of at least 2 finite differences.

    Returns:
        ``mean(x) / std(x, ddof=1)``, unitless. Defined edge cases: all zeros gives 0.0; constant non-zero ``x``
        (std 0) gives ``+inf`` or ``-inf`` with the sign of the mean.

    Raises:
        ValueError: fewer than 2 values, or NaN/inf values.

    Equals the one-sample t statistic over sqrt(n) (``scipy.stats.ttest_1samp``); Cohen (1988).
    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    arr = _as_1d_finite(x, min_n=2)
    if np.all(arr == arr[0]):  # checked exactly: np.std of equal values can be 1e-18, not 0
        return 0.0 if arr[0] == 0 else float(np.copysign(np.inf, arr[0]))
    return float(np.mean(arr) / np.std(arr, ddof=1))


def rank_biserial(x) -> float:
    """Matched-pairs rank-biserial correlation (Kerby 2014), the effect size of the Wilcoxon test.

    Args:
        x: 1-D array-like of finite paired differences (at least 1). Zeros are dropped, as in
            :func:`wilcoxon_test`.

    Returns:
        ``(R+ - R-) / (R+ + R-)`` in [-1, 1], where ``R+``/``R-`` are the sums of the ranks of ``|x|``
        (``scipy.stats.rankdata``, ties averaged) over positive/negative differences. 1 = every non-zero
        difference is positive. All zeros gives 0.0.

    Raises:
        ValueError: no values, or NaN/inf values.

    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    arr = _as_1d_finite(x, min_n=1)
    arr = arr[arr != 0]
    if arr.size == 0:
        return 0.0
    ranks = stats.rankdata(np.abs(arr))
    return float((ranks[arr > 0].sum() - ranks[arr < 0].sum()) / ranks.sum())


def compare_paired(
    df: pd.DataFrame, *, value: str, condition: str, baseline, pair_on: str | Sequence[str] = "seed",
    comparisons: Sequence | None = None, confidence_level: float = 0.95, n_resamples: int = 9999, seed: int = 0,
    alpha: float = 0.05,
) -> pd.DataFrame:
    """Compare each condition with the baseline over paired seeds: CI, Wilcoxon test, Holm, effect sizes.

    Args:
        df, value, condition, baseline, pair_on: as in :func:`paired_differences`.
        comparisons: the conditions to compare with the baseline, in this order; ``None`` = every non-baseline
            condition in order of first appearance.
        confidence_level, n_resamples, seed: for :func:`bootstrap_ci`.
        alpha: for :func:`holm`.

    Returns:
        One row per comparison, columns ``condition, baseline, n_pairs, mean_baseline, mean_condition, mean_diff,
        ci_low, ci_high`` (bootstrap CI of ``mean_diff``), ``statistic, p_value`` (Wilcoxon), ``p_holm`` (Holm over
        the rows of this table), ``cohens_dz, rank_biserial, n_better, n_worse, n_equal`` (difference > 0, < 0,
        == 0). Means and the CI are in the unit of ``value``, over the complete pairs of that comparison.
        Identical conditions give ``ci = (0, 0)``, ``p = 1`` and zero effects, without warnings.

    Raises:
        ValueError: as :func:`paired_differences`; ``comparisons`` is empty or names an unknown condition or the
            baseline; or a comparison has fewer than 2 complete pairs.

    Explained in chapter 5, "Seq2vec attention and the padding-mask experiments", section "Statistics for paired seeds".
    """
    wide, others = _wide(df, value, condition, baseline, pair_on)
    chosen = others if comparisons is None else list(comparisons)
    unknown = [c for c in chosen if c not in others]
    if unknown or not chosen:
        raise ValueError(f"comparisons {chosen} must be non-empty and among the non-baseline conditions {others}")
    rows = []
    for cond in chosen:
        pair = wide[[baseline, cond]].dropna()
        d = (pair[cond] - pair[baseline]).to_numpy()
        if d.size < 2:
            raise ValueError(f"condition {cond!r} has {d.size} complete pair(s) with {baseline!r}; need at least 2")
        ci_low, ci_high = bootstrap_ci(d, confidence_level=confidence_level, n_resamples=n_resamples, seed=seed)
        statistic, p_value = wilcoxon_test(d)
        rows.append({
            "condition": cond, "baseline": baseline, "n_pairs": int(d.size),
            "mean_baseline": float(pair[baseline].mean()), "mean_condition": float(pair[cond].mean()),
            "mean_diff": float(d.mean()), "ci_low": ci_low, "ci_high": ci_high,
            "statistic": statistic, "p_value": p_value, "p_holm": np.nan,
            "cohens_dz": cohens_dz(d), "rank_biserial": rank_biserial(d),
            "n_better": int((d > 0).sum()), "n_worse": int((d < 0).sum()), "n_equal": int((d == 0).sum()),
        })
    table = pd.DataFrame(rows)
    table["p_holm"] = holm(table["p_value"].to_numpy(), alpha=alpha)
    return table
