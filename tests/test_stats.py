"""attnbook.stats against independent references: published/hand-computed values, direct scipy and
statsmodels calls, the t statistic, and Wilcoxon's rank sums."""

import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from attnbook.stats import (
    bootstrap_ci,
    cohens_dz,
    compare_paired,
    holm,
    paired_differences,
    rank_biserial,
    wilcoxon_test,
)

# The example of scipy.stats.wilcoxon's documentation (Cerebral cortex data, Fisher 1935 via scipy).
SCIPY_DOC_D = [6, 8, 14, 16, 23, 24, 28, 29, 41, -48, 49, 56, 60, -67, 75]


@pytest.fixture
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def runs(per_condition: dict, seeds=None) -> pd.DataFrame:
    """Long table: one row per (condition, seed) with column ``acc``."""
    rows = []
    for cond, values in per_condition.items():
        for s, v in zip(seeds or range(len(values)), values):
            rows.append({"masking": cond, "seed": s, "acc": v})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- wilcoxon_test
def test_wilcoxon_published_example(no_warnings):
    stat, p = wilcoxon_test(SCIPY_DOC_D)
    # Exact null distribution over 2**15 sign patterns: P(T <= 24) * 2 = 1352 / 32768 = 169 / 4096.
    assert stat == 24.0
    assert p == pytest.approx(169 / 4096, abs=1e-12)
    assert p == pytest.approx(0.0413, abs=5e-5)
    assert (stat, p) == pytest.approx(tuple(stats.wilcoxon(SCIPY_DOC_D)))


def test_wilcoxon_hand_computed_small_exact():
    # n = 3, all positive: T = 0, and only 1 of 8 sign patterns is as extreme on each side -> p = 2/8.
    assert wilcoxon_test([1.0, 2.0, 3.0]) == (0.0, 0.25)
    assert wilcoxon_test([-1.0, -2.0, -3.0]) == (0.0, 0.25)


@pytest.mark.parametrize("n", [5, 12, 60])
def test_wilcoxon_matches_scipy_on_random_data(no_warnings, n):
    x = np.random.default_rng(n).normal(0.3, 1.0, size=n)
    x[:2] = [0.0, x[3]]  # a zero and a tie
    ref = stats.wilcoxon(x, zero_method="wilcox", alternative="two-sided")
    assert wilcoxon_test(x) == pytest.approx((ref.statistic, ref.pvalue))


def test_wilcoxon_all_zero_is_defined_and_silent(no_warnings):
    assert wilcoxon_test([0.0, 0.0, 0.0]) == (0.0, 1.0)
    assert wilcoxon_test(np.zeros(60)) == (0.0, 1.0)


def test_wilcoxon_rejects_empty():
    with pytest.raises(ValueError, match="at least 1 value"):
        wilcoxon_test([])


def test_one_dimensional_input_required():
    with pytest.raises(ValueError, match=r"x must be one-dimensional, got shape \(2, 2\)"):
        wilcoxon_test([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(ValueError, match=r"pvalues must be one-dimensional, got shape \(1, 2\)"):
        holm([[0.1, 0.2]])


def test_wilcoxon_rejects_nan():
    with pytest.raises(ValueError, match="got 1 NaN/inf value"):
        wilcoxon_test([1.0, np.nan, 2.0])


# ---------------------------------------------------------------- holm
def test_holm_hand_computed():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06.
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])


def test_holm_caps_at_one_and_is_at_least_raw():
    # sorted: 0.3*3 = 0.9, 0.5*2 = 1.0, 0.9*1 = 0.9 -> running max 0.9, 1.0, 1.0.
    p = np.array([0.5, 0.3, 0.9])
    adj = holm(p)
    np.testing.assert_allclose(adj, [1.0, 0.9, 1.0])
    assert (adj >= p).all()


def test_holm_empty():
    out = holm([])
    assert isinstance(out, np.ndarray) and out.shape == (0,)


@pytest.mark.parametrize("bad", [[0.1, 1.5], [-0.1], [0.2, np.nan]])
def test_holm_rejects_invalid_p(bad):
    with pytest.raises(ValueError, match=r"must be in \[0, 1\] and not NaN"):
        holm(bad)


# ---------------------------------------------------------------- bootstrap_ci
def test_bootstrap_ci_equals_direct_scipy_call(no_warnings):
    x = np.random.default_rng(0).normal(0.01, 0.02, size=10)
    ref = stats.bootstrap((x,), np.mean, n_resamples=999, method="BCa", rng=np.random.default_rng(7))
    ci = bootstrap_ci(x, n_resamples=999, seed=7)
    assert ci == (ref.confidence_interval.low, ref.confidence_interval.high)
    ref90 = stats.bootstrap(
        (x,), np.mean, n_resamples=999, confidence_level=0.9, method="percentile", rng=np.random.default_rng(3)
    )
    assert bootstrap_ci(x, confidence_level=0.9, n_resamples=999, seed=3, method="percentile") == tuple(
        ref90.confidence_interval
    )


def test_bootstrap_ci_contains_mean_narrows_and_is_deterministic(no_warnings):
    rng = np.random.default_rng(1)
    small, large = rng.normal(1.0, 1.0, size=10), rng.normal(1.0, 1.0, size=200)
    lo, hi = bootstrap_ci(small, n_resamples=999)
    assert lo < small.mean() < hi
    lo2, hi2 = bootstrap_ci(large, n_resamples=999)
    assert hi2 - lo2 < (hi - lo) / 2
    assert bootstrap_ci(small, n_resamples=999, seed=5) == bootstrap_ci(small, n_resamples=999, seed=5)
    assert bootstrap_ci(small, n_resamples=999, seed=5) != bootstrap_ci(small, n_resamples=999, seed=6)


def test_bootstrap_ci_constant_input(no_warnings):
    assert bootstrap_ci([0.25] * 5) == (0.25, 0.25)
    assert bootstrap_ci([0.0, 0.0]) == (0.0, 0.0)


def test_bootstrap_ci_constant_input_does_not_call_scipy(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("scipy.stats.bootstrap called on constant data")

    monkeypatch.setattr(stats, "bootstrap", fail)  # attnbook.stats uses this same module object
    assert bootstrap_ci([-1.5, -1.5, -1.5]) == (-1.5, -1.5)


def test_bootstrap_ci_near_constant_falls_back_to_percentile(no_warnings):
    # Equal up to one ulp: BCa is NaN in scipy (and warns); we return the percentile interval silently.
    x = np.array([1.0] * 9 + [np.nextafter(1.0, 2.0)])
    lo, hi = bootstrap_ci(x, n_resamples=999)
    assert 1.0 <= lo <= hi <= x.max()


def test_bootstrap_ci_rejects_too_few():
    with pytest.raises(ValueError, match="at least 2 value"):
        bootstrap_ci([1.0])


def test_bootstrap_ci_rejects_non_finite():
    with pytest.raises(ValueError, match="got 2 NaN/inf value"):
        bootstrap_ci([1.0, np.inf, np.nan, 2.0])


@pytest.mark.parametrize("level", [0.0, 1.0, 95])
def test_bootstrap_ci_rejects_confidence_level(level):
    with pytest.raises(ValueError, match=r"confidence_level must be in \(0, 1\)"):
        bootstrap_ci([1.0, 2.0], confidence_level=level)


# ---------------------------------------------------------------- effect sizes
def test_cohens_dz_hand_computed_and_t_statistic():
    # x = [1, 2, 3, -1]: mean 1.25, sample var = (0.0625 + 0.5625 + 3.0625 + 5.0625) / 3 = 8.75 / 3.
    assert cohens_dz([1, 2, 3, -1]) == pytest.approx(1.25 / np.sqrt(8.75 / 3))
    x = np.random.default_rng(2).normal(0.5, 1.0, size=9)
    assert cohens_dz(x) == pytest.approx(stats.ttest_1samp(x, 0.0).statistic / np.sqrt(x.size))


def test_cohens_dz_degenerate():
    assert cohens_dz([0.0, 0.0, 0.0]) == 0.0
    assert cohens_dz([0.1] * 10) == np.inf  # mean 0.1 +- rounding, std exactly 0
    assert cohens_dz([-2.0, -2.0]) == -np.inf


def test_cohens_dz_rejects_too_few():
    with pytest.raises(ValueError, match="at least 2 value"):
        cohens_dz([1.0])


def test_rank_biserial_hand_computed():
    # |x| = [1, 2, 3, 1] -> ranks [1.5, 3, 4, 1.5]; R+ = 8.5, R- = 1.5, total 10 -> 0.7.
    assert rank_biserial([1, 2, 3, -1]) == pytest.approx(0.7)
    assert rank_biserial([1, 2, 0, 3, -1]) == pytest.approx(0.7)  # zeros dropped
    assert rank_biserial([1.0, 2.0]) == 1.0 and rank_biserial([-1.0, -2.0]) == -1.0
    assert rank_biserial([0.0, 0.0]) == 0.0


def test_rank_biserial_from_wilcoxon_rank_sum():
    x = np.random.default_rng(3).normal(0.2, 1.0, size=15)
    r_plus = stats.wilcoxon(x, alternative="greater").statistic  # the sum of ranks of positive differences
    total = x.size * (x.size + 1) / 2
    assert rank_biserial(x) == pytest.approx((2 * r_plus - total) / total)


def test_rank_biserial_rejects_nan():
    with pytest.raises(ValueError, match="got 1 NaN/inf value"):
        rank_biserial([np.nan])


# ---------------------------------------------------------------- paired_differences
def test_paired_differences_pairs_by_seed_and_drops_incomplete():
    df = runs({"none": [0.5, 0.6, 0.7], "mask": [0.8, 0.6]}, seeds=None)
    df = pd.concat([df, pd.DataFrame([{"masking": "mask", "seed": 9, "acc": 1.0}])])  # no baseline for seed 9
    df = df.sample(frac=1.0, random_state=0)  # row order must not matter
    out = paired_differences(df, value="acc", condition="masking", baseline="none")
    assert list(out.columns) == ["mask"]
    assert list(out.index) == [0, 1]
    np.testing.assert_allclose(out["mask"], [0.3, 0.0], atol=1e-12)


def test_paired_differences_column_order_and_multi_key():
    df = runs({"b": [2.0, 3.0], "base": [1.0, 1.0], "a": [0.0, 5.0]})
    df["fold"] = 0
    out = paired_differences(df, value="acc", condition="masking", baseline="base", pair_on=["seed", "fold"])
    assert list(out.columns) == ["b", "a"]
    assert out.index.names == ["seed", "fold"]
    np.testing.assert_allclose(out.to_numpy(), [[1.0, -1.0], [2.0, 4.0]])


def test_paired_differences_incomplete_pair_is_nan_in_its_column_only():
    df = runs({"base": [1.0, 1.0, 1.0], "a": [2.0, 2.0, 2.0], "b": [0.0, 0.0]})  # seed 2 lacks "b"
    out = paired_differences(df, value="acc", condition="masking", baseline="base")
    np.testing.assert_allclose(out["a"], [1.0, 1.0, 1.0])
    assert out["b"].isna().tolist() == [False, False, True]
    table = compare_paired(df, value="acc", condition="masking", baseline="base", n_resamples=99)
    assert table["n_pairs"].tolist() == [3, 2]
    assert table[["n_better", "n_worse", "n_equal"]].to_numpy().tolist() == [[3, 0, 0], [0, 2, 0]]


def test_paired_differences_rejects_missing_column():
    with pytest.raises(ValueError, match=r"no column\(s\) \['accuracy'\]"):
        paired_differences(runs({"a": [1.0], "b": [2.0]}), value="accuracy", condition="masking", baseline="a")


def test_paired_differences_rejects_unknown_baseline():
    with pytest.raises(ValueError, match="baseline 'off' is not among"):
        paired_differences(runs({"a": [1.0], "b": [2.0]}), value="acc", condition="masking", baseline="off")


def test_paired_differences_rejects_baseline_only():
    with pytest.raises(ValueError, match="holds only the baseline 'a'"):
        paired_differences(runs({"a": [1.0, 2.0]}), value="acc", condition="masking", baseline="a")


def test_paired_differences_rejects_duplicate_runs():
    df = pd.concat([runs({"a": [1.0, 2.0], "b": [2.0, 3.0]}), runs({"b": [9.0]})])
    with pytest.raises(ValueError, match=r"duplicate runs.*'seed': 0, 'masking': 'b'"):
        paired_differences(df, value="acc", condition="masking", baseline="a")


def test_paired_differences_rejects_no_complete_pair():
    df = runs({"a": [1.0, 2.0]}, seeds=[0, 1])
    df = pd.concat([df, runs({"b": [1.0]}, seeds=[5])])
    with pytest.raises(ValueError, match=r"no complete pair.*\['b'\]"):
        paired_differences(df, value="acc", condition="masking", baseline="a")


def test_paired_differences_rejects_nan_values():
    with pytest.raises(ValueError, match="'acc' has NaN/inf values"):
        paired_differences(runs({"a": [1.0, 2.0], "b": [np.nan, 3.0]}), value="acc", condition="masking", baseline="a")


def test_paired_differences_rejects_non_numeric_values():
    df = runs({"a": [1.0, 2.0], "b": ["high", "low"]})
    with pytest.raises(ValueError, match="column 'acc' must be numeric"):
        paired_differences(df, value="acc", condition="masking", baseline="a")


# ---------------------------------------------------------------- compare_paired
@pytest.fixture
def experiment():
    base = np.random.default_rng(4).uniform(0.6, 0.9, size=8)
    return runs({"no_mask": base, "mask": base + 0.01, "mask_again": base.copy()})


def test_compare_paired_shift_and_identical(no_warnings, experiment):
    table = compare_paired(experiment, value="acc", condition="masking", baseline="no_mask", n_resamples=999)
    assert list(table["condition"]) == ["mask", "mask_again"]
    assert list(table.columns) == [
        "condition", "baseline", "n_pairs", "mean_baseline", "mean_condition", "mean_diff", "ci_low", "ci_high",
        "statistic", "p_value", "p_holm", "cohens_dz", "rank_biserial", "n_better", "n_worse", "n_equal",
    ]
    shift, same = table.iloc[0], table.iloc[1]
    assert shift["mean_diff"] == pytest.approx(0.01)
    assert shift["n_better"] == shift["n_pairs"] == 8 and shift["n_worse"] == 0
    assert shift["ci_low"] == pytest.approx(0.01) and shift["ci_high"] == pytest.approx(0.01)
    assert shift["ci_low"] <= shift["mean_diff"] <= shift["ci_high"]
    assert shift["p_value"] == pytest.approx(2 / 2**8)  # all 8 signs positive, exact two-sided
    assert shift["rank_biserial"] == 1.0
    assert (same["p_value"], same["ci_low"], same["ci_high"]) == (1.0, 0.0, 0.0)
    assert (same["cohens_dz"], same["rank_biserial"], same["n_equal"]) == (0.0, 0.0, 8)
    assert (same["n_better"], same["n_worse"]) == (0, 0)
    assert (table["p_holm"] >= table["p_value"]).all()
    np.testing.assert_allclose(table["p_holm"], holm(table["p_value"]))


def test_compare_paired_comparisons_order_and_plain_types(experiment):
    table = compare_paired(
        experiment, value="acc", condition="masking", baseline="no_mask", comparisons=["mask_again", "mask"],
        n_resamples=99,
    )
    assert list(table["condition"]) == ["mask_again", "mask"]
    row = table.iloc[1].to_dict()
    assert row["mean_condition"] - row["mean_baseline"] == pytest.approx(row["mean_diff"])
    counts = ["n_pairs", "n_better", "n_worse", "n_equal"]
    assert all(pd.api.types.is_integer_dtype(table[c]) for c in counts)
    floats = [c for c in table.columns if c not in [*counts, "condition", "baseline"]]
    assert all(pd.api.types.is_float_dtype(table[c]) for c in floats)


def test_compare_paired_matches_direct_computation():
    rng = np.random.default_rng(5)
    base = rng.normal(0.7, 0.05, size=12)
    cond = base + rng.normal(0.01, 0.02, size=12)
    cond[0] = base[0]  # one tie between conditions
    row = compare_paired(runs({"off": base, "on": cond}), value="acc", condition="masking", baseline="off",
                         n_resamples=999).iloc[0]
    d = cond - base
    assert (row["n_better"], row["n_worse"], row["n_equal"]) == ((d > 0).sum(), (d < 0).sum(), 1)
    ref = stats.wilcoxon(d)
    assert (row["statistic"], row["p_value"]) == pytest.approx((ref.statistic, ref.pvalue))
    assert row["p_holm"] == row["p_value"]  # a single comparison
    assert row["cohens_dz"] == pytest.approx(d.mean() / d.std(ddof=1))
    ci = stats.bootstrap((d,), np.mean, n_resamples=999, rng=np.random.default_rng(0)).confidence_interval
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high))


def test_compare_paired_rejects_unknown_comparison(experiment):
    with pytest.raises(ValueError, match=r"comparisons \['gate'\] must be non-empty and among"):
        compare_paired(experiment, value="acc", condition="masking", baseline="no_mask", comparisons=["gate"])


def test_compare_paired_rejects_baseline_as_comparison(experiment):
    with pytest.raises(ValueError, match="among the non-baseline conditions"):
        compare_paired(experiment, value="acc", condition="masking", baseline="no_mask", comparisons=["no_mask"])


def test_compare_paired_rejects_single_pair():
    with pytest.raises(ValueError, match="'on' has 1 complete pair"):
        compare_paired(runs({"off": [0.5], "on": [0.6]}), value="acc", condition="masking", baseline="off")
