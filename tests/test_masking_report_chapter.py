"""Chapter 5's own pieces in attnbook.experiments.masking_report (issue 45): the asker's example and the gradient
through the softmax's denominator against independent references (softmax by hand, finite differences), the
underflow of renormalizing against NumPy's float32/float16 exp, the plain results table, speed, and every template
sentence at its edge values (one run, equal bounds, zero, a negation, too few runs)."""

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

from attnbook.evidence import CORRECTED, MIN_PAIRS
from attnbook.experiments import masking_report as report
from attnbook.experiments.masking_report import ARMS

matplotlib.use("Agg")
FACTORS = ["pooling", "masking", "rnn_input", "batching", "precision"]


def arm_row(mean, low, high, verdict, n=20):
    return pd.Series({"mean_diff": mean, "ci_low": low, "ci_high": high, "verdict": verdict, "n_pairs": n})


# --- the asker's example ---

def test_asker_example_matches_a_softmax_by_hand():
    scores = np.array([0.1, 0.2, 0.0, 0.0, 0.0])
    example = report.asker_example(scores, n_real=2)
    e = np.exp(scores)
    np.testing.assert_allclose(example.unmasked, e / e.sum())
    np.testing.assert_allclose(example.masked[:2], e[:2] / e[:2].sum())
    assert (example.masked[2:] == 0).all()
    assert list(example.index) == ["o1", "o2", "pad", "pad", "pad"]
    # the question's numbers: 0.21, 0.23, 0.19 unmasked; 0.48, 0.52 masked; 44% of the length
    assert [round(x, 2) for x in example.unmasked[:3]] == [0.21, 0.23, 0.19]
    assert [round(x, 2) for x in example.masked[:2]] == [0.48, 0.52]
    assert round(example.unmasked[:2].sum(), 2) == 0.44


@pytest.mark.parametrize("n_real", [0, 6])
def test_asker_example_refuses_a_bad_count(n_real):
    with pytest.raises(ValueError, match="n_real must be between 1 and 5"):
        report.asker_example((0.1, 0.2, 0, 0, 0), n_real=n_real)


def test_plot_asker_example_checks_its_states():
    example = report.asker_example()
    fig = report.plot_asker_example(example)
    assert len(fig.axes) == 2
    with pytest.raises(ValueError, match=r"states must be 2 two-dimensional states, got shape \(3, 2\)"):
        report.plot_asker_example(example, states=((1, 0), (0, 1), (1, 1)))


# --- the gradient through the denominator ---

def _loss(scores, n_real, mask):
    """The same loss as pad_score_gradients, in NumPy (states drawn the same way)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    h = np.zeros((len(scores), 2))
    h[:n_real] = (torch.rand(n_real, 2, generator=gen, dtype=torch.float64) + 0.1).numpy()
    s = np.where(mask, scores, -np.inf)
    w = np.exp(s - s.max())
    w /= w.sum()
    return -(w @ h) @ np.ones(2)


@pytest.mark.parametrize("masked", [False, True])
def test_pad_score_gradients_match_finite_differences(masked):
    scores = np.array([0.1, 0.2, 0.0, 0.0, 0.0])
    mask = np.arange(5) < 2 if masked else np.ones(5, dtype=bool)
    grads = report.pad_score_gradients(scores, n_real=2)["masked" if masked else "unmasked"].to_numpy()
    eps = 1e-6
    numeric = [(_loss(scores + eps * np.eye(5)[i], 2, mask) - _loss(scores - eps * np.eye(5)[i], 2, mask)) / (2 * eps)
               for i in range(5)]
    np.testing.assert_allclose(grads, numeric, atol=1e-8)
    if masked:
        assert (grads[2:] == 0).all()
    else:
        assert (grads[2:] != 0).all()


def test_pad_score_gradients_refuse_a_bad_count():
    with pytest.raises(ValueError, match="n_real must be between 1 and 3"):
        report.pad_score_gradients((0.0, 0.0, 0.0), n_real=4)


# --- when renormalizing gives NaN ---

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_renormalize_nan_gap_is_where_the_real_share_underflows(dtype):
    # independent reference: the first whole gap at which exp(-gap) rounds to zero in the format
    reference = next(g for g in range(1, 400) if getattr(np, dtype)(math.exp(-g)) == 0)
    assert report.renormalize_nan_gap(dtype) == reference


def test_renormalize_underflow_masks_never_fail():
    table = report.renormalize_underflow(gaps=(1, 200))
    assert table.filter(like="−∞ mask").eq(1.0).all().all()
    assert table.loc[200].filter(like="renormalize").isna().all()
    assert table.loc[1].filter(like="renormalize").eq(1.0).all()
    assert report.renormalize_nan_gap("float32", max_gap=50) == -1


# --- the plain results table and its sentences ---

def _answer():
    frame = []
    rng = np.random.default_rng(0)
    for a in ARMS:
        for side, shift in (("baseline", 0.0), ("condition", 0.004)):
            factors = dict(zip(FACTORS, getattr(a, side).split("/")))
            frame.append(pd.DataFrame({**factors, "seed": range(8),
                                       "test_accuracy": 0.87 + shift + 0.001 * rng.standard_normal(8)}))
    runs = pd.concat(frame, ignore_index=True).drop_duplicates(FACTORS + ["seed"])
    return report.answer_table(runs, n_resamples=499)


def test_results_table_has_the_chapter_rows_in_plain_columns():
    table = report.results_table(_answer())
    assert list(table.columns) == ["condition", "compared with", "change in accuracy (points)", "95% interval",
                                   "runs", "verdict"]
    # every comparison whose verdict the chapter states: the primary row and all six secondary ones, so that
    # "among 6 secondary comparisons" counts rows the reader sees
    assert len(table) == len(report.CHAPTER_ROWS) == len(report.ARMS) == 7
    assert table.condition.iloc[0] == "−∞ mask"
    joined = " ".join(table.astype(str).to_numpy().ravel())
    assert "Holm" not in joined and "Wilcoxon" not in joined


def test_results_table_names_missing_arms_and_shows_dashes():
    with pytest.raises(ValueError, match=r"answer lacks the arms \['nope'\]"):
        report.results_table(_answer(), {"nope": ("a", "b")})
    answer = _answer()
    answer.loc[0, ["mean_diff", "ci_low", "ci_high"]] = np.nan
    answer.loc[0, "verdict"] = "not yet answered"
    row = report.results_table(answer).iloc[0]
    assert row["change in accuracy (points)"] == "–" and row["95% interval"] == "–"


def test_plain_verdicts_name_no_test_and_count_the_corrected_family():
    assert all("Holm" not in report.plain_verdict(v, 6) for v in report.PLAIN_VERDICTS)
    assert report.plain_verdict(CORRECTED, 6) == "not resolved among 6 secondary comparisons"
    assert report.plain_verdict(CORRECTED, 1) == "not resolved once tested"
    assert report.plain_verdict("higher", 0) == "higher"
    with pytest.raises(ValueError, match="n_family must be at least 1 for a corrected verdict, got 0"):
        report.plain_verdict(CORRECTED, 0)


def test_family_size_counts_the_rows_holm_ran_over():
    answer = pd.DataFrame({"p_holm": [np.nan, 0.8, 0.1, np.nan, 0.02]})   # primary, 3 answered, 1 too few
    assert report.family_size(answer) == 3
    assert report.family_size(pd.DataFrame({"p_holm": [np.nan]})) == 0


@pytest.mark.parametrize("row, expected", [
    (arm_row(0.003, 0.0006, 0.0052, "higher"), "raised accuracy by 0.30 points (95% interval +0.06 to +0.52)"),
    (arm_row(-0.0044, -0.0078, -0.0014, "lower"), "lowered accuracy by 0.44 points (95% interval -0.78 to -0.14)"),
    (arm_row(0.0004, -0.0006, 0.0014, "no difference resolved"),
     "changed accuracy by +0.04 points (95% interval -0.06 to +0.14), a difference not resolved"),
    (arm_row(0.0, -0.00001, 0.00001, "no difference resolved"),     # zero, equal rounded bounds
     "changed accuracy by 0.00 points (95% interval 0.00 to 0.00), a difference not resolved"),
    (arm_row(0.0025, 0.0003, 0.0045, CORRECTED), "changed accuracy by +0.25 points (95% interval +0.03 to +0.45), "
     "a difference not resolved once all of this question's comparisons are counted together"),
    (arm_row(np.nan, np.nan, np.nan, "not yet answered", n=1), "has too few runs to change accuracy in a resolved way"),
    (None, "has too few runs to change accuracy in a resolved way"),
])
def test_effect_text_at_its_edges(row, expected):
    assert report.effect_text(row) == expected


@pytest.mark.parametrize("n_ahead, n_pairs, expected", [
    (14, 20, "the masked model came out ahead in 14 of 20 pairs of runs"),
    (0, 20, "the masked model came out ahead in none of 20 pairs of runs"),
    (20, 20, "the masked model came out ahead in all 20 pairs of runs"),
    (1, 1, "the masked model came out ahead in the one pair of runs"),
    (0, 1, "the masked model did not come out ahead in the one pair of runs"),
    (0, 0, "no pair of runs has been made yet"),
])
def test_ahead_text_at_its_edges(n_ahead, n_pairs, expected):
    assert report.ahead_text(n_ahead, n_pairs) == expected


def test_ahead_text_refuses_impossible_counts():
    with pytest.raises(ValueError, match=r"n_ahead must be between 0 and n_pairs \(3\), got 4"):
        report.ahead_text(4, 3)


def test_bucketing_text_follows_the_verdicts():
    gain = arm_row(0.0053, 0.0031, 0.0092, "higher")
    masked_none = arm_row(0.003, -0.0001, 0.0063, "no difference resolved")
    after_none = arm_row(0.0004, -0.0006, 0.0014, "no difference resolved")
    text = report.bucketing_text(gain, masked_none, after_none, 0.42, 0.017)
    assert "from 42% to 2%" in text and "only the second can act" in text and "little left" not in text
    assert "does not replace the mask" in text and "what the mask does" not in text
    masked_up = arm_row(0.004, 0.001, 0.007, "higher")
    after_up = arm_row(0.003, 0.001, 0.005, "higher")
    text = report.bucketing_text(gain, masked_up, after_up, 0.42, 0.017)
    assert "matters by itself" in text and "little left" not in text
    text = report.bucketing_text(gain, None, None, 0.42, 0.017)
    assert text.startswith("Bucketing does two things.") and "do not separate" not in text
    with pytest.raises(ValueError, match="pad_random must be a share between 0 and 1, got 42"):
        report.bucketing_text(gain, masked_none, after_none, 42, 0.017)


def robust_row(pm_b, pm_r, fl_b, fl_r):
    return pd.Series({"pad_mass_condition": pm_b, "pad_mass_baseline": pm_r, "flip_in_condition": fl_b,
                      "flip_in_baseline": fl_r})


def test_bucketing_robustness_follows_the_flip_rates():
    row = robust_row(0.0849, 0.0730, 0.0045, 0.00056)        # the full-scale runs' values
    short = report.bucketing_robustness_text(row)
    assert "0.45% of its predictions, 8 times as often as" in short and "does not replace the mask" in short
    long = report.bucketing_robustness_text(row, detail=True)
    assert "8.5% of its attention, more than the 7.3%" in long and "0.45%" in long and "0.06%" in long
    assert "less than the" in report.bucketing_robustness_text(robust_row(0.05, 0.07, 0.004, 0.001), detail=True)
    assert "as much as" in report.bucketing_robustness_text(robust_row(0.07, 0.07, 0.004, 0.001), detail=True)
    # zero flips with random batches: no ratio; a small excess: no "times"
    assert "more often than" in report.bucketing_robustness_text(robust_row(0.08, 0.07, 0.004, 0.0))
    assert "more often than" in report.bucketing_robustness_text(robust_row(0.08, 0.07, 0.0015, 0.001))
    # bucketing's model no more sensitive: no claim that it failed to learn
    equal = report.bucketing_robustness_text(robust_row(0.05, 0.07, 0.001, 0.001))
    assert "did not learn" not in equal and "still does not replace" in equal
    assert "did not measure" in report.bucketing_robustness_text(robust_row(0.08, 0.07, np.nan, 0.001))
    assert "did not measure" in report.bucketing_robustness_text(None)
    assert report.bucketing_robustness_text(row, box=True) == (
        "A model trained on bucketed batches without a mask changed 8 times as many predictions when padded, so "
        "bucketing does not replace the mask.")
    zero_random = robust_row(0.08, 0.07, 0.004, 0.0)
    assert "changed more predictions when" in report.bucketing_robustness_text(zero_random, box=True)
    for other in (robust_row(0.05, 0.07, 0.001, 0.001), None):
        assert "changed" not in report.bucketing_robustness_text(other, box=True)
    with pytest.raises(ValueError, match="flip_in_condition must be a share between 0 and 1, got 4.5"):
        report.bucketing_robustness_text(robust_row(0.08, 0.07, 4.5, 0.001))


@pytest.mark.parametrize("flip, gain, expected", [
    (0.00056, 0.0031, "at most a small part of the mask's gain"),
    (0.002, 0.003, "part of the mask's gain in accuracy, but not all of it"),
    (0.003, 0.003, "enough to account for the whole"),
    (0.0, 0.003, "changed none of the unmasked model's predictions, which can account"),
    (0.001, 0.0, "predictions."),
    (0.001, -0.002, "predictions."),
    (np.nan, 0.003, "did not measure"),
])
def test_flip_gain_text_at_its_edges(flip, gain, expected):
    assert expected in report.flip_gain_text(flip, gain)


@pytest.mark.parametrize("flip, gain, expected", [
    (0.00056, 0.0031, "Padding changed 0.06% of the unmasked model's predictions, so the gain probably comes "
     "mostly from training."),
    (0.002, 0.003, "Padding changed 0.20% of the unmasked model's predictions, part of the gain."),
    (0.003, 0.003, "Padding changed 0.30% of the unmasked model's predictions, enough to explain the gain."),
    (0.001, 0.0, "Padding changed 0.10% of the unmasked model's predictions."),
])
def test_flip_gain_text_box_form(flip, gain, expected):
    assert report.flip_gain_text(flip, gain, box=True) == expected


def test_flip_gain_text_refuses_a_rate_above_one():
    with pytest.raises(ValueError, match="flip must be a share between 0 and 1, got 2"):
        report.flip_gain_text(2, 0.003)


def test_repeat_on_other_device_and_paired_differences():
    rng = np.random.default_rng(0)
    rows = []
    for kind, n in (("CPU (1 threads, x86_64)", 4), ("NVIDIA H100 80GB HBM3", 3)):
        for masking in ("none", "neg_inf"):
            for s in range(n):
                rows.append(dict(pooling="attention", masking=masking, rnn_input="packed", batching="random",
                                 precision="fp32", seed=s, device=kind,
                                 test_accuracy=0.87 + (0.003 if masking == "neg_inf" else 0) + 0.001 * s
                                 + 1e-4 * rng.random()))
    frame = report.runs_by_kind(pd.DataFrame(rows), tuple(FACTORS), report.condition_id, "test_accuracy")
    answer = report.answer_table(frame, ARMS[:1], n_resamples=99)
    central = answer.iloc[0]
    assert central.device_kind == "cpu" and central.n_pairs == 4
    repeat = report.repeat_on_other_device(frame, central)
    assert repeat.device_kind == "gpu" and repeat.n_pairs == 3
    assert report.repeat_on_other_device(frame[frame.device_kind == "cpu"], central) is None
    assert report.repeat_on_other_device(frame, None) is None
    d = report.paired_differences(frame, central)
    by_hand = frame[frame.device_kind == "cpu"].pivot(index="seed", columns="masking", values="test_accuracy")
    np.testing.assert_allclose(d.to_numpy(), 100 * (by_hand.neg_inf - by_hand.none).to_numpy())


# --- speed ---

def _speed_runs(n, mask_speed, renorm_speed, kind="NVIDIA H100 80GB HBM3", jitter=0.002):
    rng = np.random.default_rng(1)
    rows = []
    for masking, speed in (("none", 1.0), ("neg_inf", mask_speed), ("renormalize", renorm_speed)):
        for s in range(n):
            rows.append(dict(pooling="attention", masking=masking, rnn_input="packed", batching="random",
                             precision="fp32", seed=s, test_accuracy=0.87, device=kind,
                             tokens_per_s=70_000 * (1 + 0.1 * s) * speed * (1 + jitter * rng.standard_normal())))
    return pd.DataFrame(rows)


def test_speed_changes_pair_runs_and_skip_too_few():
    speeds = report.speed_changes(_speed_runs(10, 0.95, 1.0), n_resamples=499)
    row = speeds.set_index("condition").loc["−∞ mask"]
    assert row.n_pairs == 10 and row.change == pytest.approx(-0.05, abs=0.003) and row.n_slower == 10
    assert row.ci_low < row.change < row.ci_high
    assert "masked mean pooling" not in set(speeds.condition)         # no runs
    few = report.speed_changes(_speed_runs(MIN_PAIRS - 1, 0.95, 1.0), n_resamples=99)
    assert few.empty


def test_speed_sentence_at_its_edges():
    one_impl = report.speed_changes(_speed_runs(10, 0.95, 1.0), n_resamples=499)
    text = report.speed_sentence(one_impl)
    assert text.startswith("On a GPU the −∞ mask trained 5.") and "slower than no mask" in text
    assert "not to masking" in text
    both = report.speed_sentence(report.speed_changes(_speed_runs(10, 0.95, 0.95), n_resamples=499))
    assert "was about as slow" in both and "not to masking" not in both
    none = report.speed_sentence(report.speed_changes(_speed_runs(10, 1.0, 1.0, jitter=0.01), n_resamples=499))
    assert "is not resolved" in none
    faster = report.speed_sentence(report.speed_changes(_speed_runs(10, 1.05, 1.0), n_resamples=499))
    assert "faster than no mask" in faster
    assert report.speed_sentence(pd.DataFrame()) == "No pair of runs measured the mask's speed."
    assert report.speed_sentence(one_impl, kinds=("cpu",)) == "No pair of runs measured the mask's speed."


def test_plot_paired_has_one_row_per_table_row():
    answer = _answer()
    frame = []
    for a in ARMS:
        for side in ("baseline", "condition"):
            frame.append(pd.DataFrame({**dict(zip(FACTORS, getattr(a, side).split("/"))), "seed": range(8),
                                       "test_accuracy": 0.87}))
    runs = report.runs_by_kind(pd.concat(frame).drop_duplicates(FACTORS + ["seed"]), tuple(FACTORS),
                               report.condition_id, "test_accuracy")
    rows = answer.set_index("arm").loc[list(report.CHAPTER_ROWS)].reset_index()
    fig = report.plot_paired(runs, rows, {"mask": "the mask"})
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(labels) == len(report.CHAPTER_ROWS) == 7 and labels[0] == "the mask"


def test_a_slowdown_gives_its_interval_as_slowdowns():
    text = report.speed_sentence(report.speed_changes(_speed_runs(10, 0.95, 1.0), n_resamples=499))
    span = text[text.index("(95% interval"):text.index(")")]
    assert "-" not in span and span.endswith("slower")
    # the other mask's change carries its own interval, in a sentence of its own
    second = text.split(". ", 1)[1]
    assert second.startswith("Renormalize, which masks too,") and "(95% interval" in second


def test_a_flip_rate_from_a_repeat_says_so():
    text = report.flip_gain_text(0.0006, 0.003, box=True, repeat=True)
    assert text == ("In a repeat of these runs, padding changed 0.06% of the unmasked model's "
                    "predictions, so the gain probably comes mostly from training.")
    assert report.flip_gain_text(0.0006, 0.003, repeat=True).startswith(
        "In a repeat of these runs on another device, padding a review to the training maximum changed 0.06%")
    assert report.flip_gain_text(float("nan"), 0.003, repeat=True) == (
        "The runs did not measure how often padding changed a prediction.")
