"""Chapter 5's answer table (attnbook.experiments.masking_report) on synthetic runs whose answer is known: the
verdict words follow the interval and the number of paired seeds, only complete pairs count, Holm runs over the
answered secondary arms alone and decides their verdicts with the interval, and the reader's table shows points and
percentages."""

import numpy as np
import pandas as pd
import pytest

from dataclasses import replace

from attnbook.experiments.masking_report import (ARMS, CORRECTED, MIN_PAIRS, Arm, answer_table, boost_odds,
                                                 bucketing_verdict, direction_agrees, format_answer, rho_sentence,
                                                 runs_by_kind, seed_by_seed, share_or_none, signed,
                                                 table_device_kind, verdict)
from attnbook.experiments.masking import condition_id
from attnbook.stats import compare_paired

FACTORS = ["pooling", "masking", "rnn_input", "batching", "precision"]


def runs(condition: str, seeds, accuracy, **extra) -> pd.DataFrame:
    factors = dict(zip(FACTORS, condition.split("/")))
    frame = pd.DataFrame({**factors, "seed": list(seeds), "test_accuracy": accuracy})
    for key, value in extra.items():
        frame[key] = value
    return frame


def central(n, shift, seed=0, **extra):
    rng = np.random.default_rng(seed)
    base = 0.85 + 0.01 * rng.standard_normal(n)
    noise = 0.001 * rng.standard_normal(n)
    arm = ARMS[0]
    return pd.concat([runs(arm.baseline, range(n), base, **extra),
                      runs(arm.condition, range(n), base + shift + noise, **extra)], ignore_index=True)


def test_a_clear_gain_is_higher_and_matches_compare_paired():
    frame = central(12, 0.01)
    table = answer_table(frame, n_resamples=999).set_index("arm")
    row = table.loc["mask"]
    assert row.verdict == "higher" and row.n_pairs == 12 and row.n_better == 12
    frame["condition"] = frame[FACTORS].astype(str).agg("/".join, axis=1)
    reference = compare_paired(frame, value="test_accuracy", condition="condition", baseline=ARMS[0].baseline,
                               n_resamples=999).iloc[0]
    for key in ("mean_diff", "ci_low", "ci_high", "p_value", "rank_biserial"):
        assert row[key] == pytest.approx(reference[key])
    assert row.primary and np.isnan(row.p_holm)  # the primary arm is decided by its interval, uncorrected
    assert (table.drop(index="mask").verdict == "not yet answered").all()
    assert table.drop(index="mask").p_holm.isna().all()


def test_a_loss_is_lower_and_no_effect_is_unresolved():
    assert answer_table(central(12, -0.01), n_resamples=999).verdict.iloc[0] == "lower"
    rng = np.random.default_rng(1)
    arm = ARMS[0]
    noisy = pd.concat([runs(arm.baseline, range(12), 0.85 + 0.01 * rng.standard_normal(12)),
                       runs(arm.condition, range(12), 0.85 + 0.01 * rng.standard_normal(12))])
    row = answer_table(noisy, n_resamples=999).iloc[0]
    assert row.ci_low < 0 < row.ci_high and row.verdict == "no difference resolved"


def test_too_few_pairs_give_no_verdict_whatever_the_interval():
    row = answer_table(central(MIN_PAIRS - 1, 0.05), n_resamples=999).iloc[0]
    assert row.ci_low > 0 and row.verdict == "not yet answered" and np.isnan(row.p_holm)
    assert answer_table(central(MIN_PAIRS - 1, 0.05), min_pairs=MIN_PAIRS - 1, n_resamples=999).verdict.iloc[0] == "higher"


def test_only_seeds_in_both_conditions_are_paired():
    frame = central(12, 0.01)
    arm = ARMS[0]
    extra = runs(arm.condition, [50, 51], [0.0, 0.0])  # no baseline for these seeds
    row = answer_table(pd.concat([frame, extra]), n_resamples=999).iloc[0]
    assert row.n_pairs == 12 and row.mean_condition > 0.8


def _two_arms(n: int, primary: bool) -> tuple[pd.DataFrame, tuple[Arm, Arm]]:
    """Runs of two arms that improve every one of ``n`` seeds: the central one (``primary`` or not) and the same
    comparison on bucketed batches (secondary)."""
    arm2 = Arm("other", "q", "attention/neg_inf/packed/bucketed/fp32", "attention/none/packed/bucketed/fp32")
    a = central(n, 0.01)
    b = central(n, 0.01, seed=3)
    b["batching"] = "bucketed"
    return pd.concat([a, b]), (replace(ARMS[0], primary=primary), arm2)


def test_holm_runs_over_answered_secondary_arms():
    frame, arms = _two_arms(12, primary=False)
    table = answer_table(frame, arms, n_resamples=999)
    assert (table.p_holm >= table.p_value).all() and table.p_holm.notna().all()
    assert (table.verdict == "higher").all()
    frame, arms = _two_arms(12, primary=True)
    table = answer_table(frame, arms, n_resamples=999)
    assert table.p_holm.isna().tolist() == [True, False]
    assert table.p_holm.iloc[1] == pytest.approx(table.p_value.iloc[1])  # the only secondary arm


def test_a_secondary_difference_must_survive_holm():
    """Six seeds that all improve: the interval excludes zero and Wilcoxon's exact p is 2/2^6 = 0.031; Holm over two
    secondary arms doubles it past 5%, so neither difference counts, while a primary arm keeps its verdict."""
    frame, arms = _two_arms(6, primary=False)
    table = answer_table(frame, arms, min_pairs=5, n_resamples=999)
    assert (table.ci_low > 0).all() and table.p_value.tolist() == pytest.approx([2 / 2 ** 6] * 2)
    assert table.p_holm.tolist() == pytest.approx([4 / 2 ** 6] * 2) and (table.verdict == CORRECTED).all()
    frame, arms = _two_arms(6, primary=True)
    table = answer_table(frame, arms, min_pairs=5, n_resamples=999)
    assert table.verdict.tolist() == ["higher", "higher"]   # one secondary arm: Holm leaves its p as it is
    shown = format_answer(table)
    assert shown["Wilcoxon p (Holm)"].tolist() == ["0.031 (primary)", "0.031 (0.031)"]


def test_side_measurements_and_missing_flip_in():
    frame = central(12, 0.01, pad_mass=0.1, flip_rate=0.02, tokens_per_s=1000.0)
    row = answer_table(frame, n_resamples=999).iloc[0]
    assert row.pad_mass_condition == pytest.approx(0.1) and np.isnan(row.flip_in_condition)
    shown = format_answer(answer_table(frame, n_resamples=999)).loc["mask"]
    assert shown["flip rate"] == "– / –" and shown["flip rate, 2× stress"] == "2.00% / 2.00%"
    assert shown["accuracy change (points)"].startswith(("+0.9", "+1.0")) and shown["verdict"] == "higher"
    assert shown["tokens/s"] == "1,000 / 1,000" and shown["device"] == "CPU"


def test_bad_frames_are_refused():
    with pytest.raises(ValueError, match="lacks the columns"):
        answer_table(pd.DataFrame({"seed": [0]}))
    frame = central(3, 0.01)
    with pytest.raises(ValueError, match="occur twice"):
        answer_table(pd.concat([frame, frame.iloc[:1]]))


def test_verdict_words_and_direction():
    assert verdict(20, 0.001, 0.01) == "higher" and verdict(20, -0.01, -0.001) == "lower"
    assert verdict(20, -0.01, 0.01) == "no difference resolved"
    assert verdict(MIN_PAIRS - 1, 0.1, 0.2) == "not yet answered" and verdict(MIN_PAIRS, 0.1, 0.2) == "higher"
    assert verdict(20, float("nan"), 0.1) == "not yet answered"
    assert verdict(20, 0.001, 0.01, p_holm=0.2) == CORRECTED == verdict(20, -0.01, -0.001, p_holm=0.05)
    assert verdict(20, 0.001, 0.01, p_holm=0.049) == "higher"
    assert verdict(20, -0.01, 0.01, p_holm=0.001) == "no difference resolved"   # the interval must exclude zero
    assert verdict(MIN_PAIRS - 1, 0.001, 0.01, p_holm=0.001) == "not yet answered"
    assert direction_agrees(0.01, 0.003) and not direction_agrees(-0.01, 0.003) and not direction_agrees(0.0, 0.1)


def test_runs_pair_only_on_one_kind_of_device():
    """A store with CPU and GPU runs of the same seeds: each arm pairs within one kind, the one with more pairs."""
    cpu = central(12, 0.01, device="CPU (1 threads, x86_64)")
    gpu = central(5, -0.02, seed=7, device="NVIDIA H100 80GB HBM3")
    row = answer_table(pd.concat([cpu, gpu]), n_resamples=999).iloc[0]
    assert row.n_pairs == 12 and row.device_kind == "cpu" and row.verdict == "higher"
    gpu = central(14, -0.02, seed=7, device="NVIDIA H100 80GB HBM3")
    row = answer_table(pd.concat([cpu, gpu]), n_resamples=999).iloc[0]
    assert row.n_pairs == 14 and row.device_kind == "gpu" and row.verdict == "lower"
    half = pd.concat([cpu[cpu.masking == "none"], gpu[gpu.masking == "neg_inf"]])   # no pair within a kind
    assert answer_table(half, n_resamples=999).n_pairs.iloc[0] == 0


def test_a_whole_table_reads_one_kind_of_device():
    """The central arm has more pairs on the CPU, but only the GPU runs answer both arms: every row reads the GPU
    runs, so that no two numbers of one table come from different devices."""
    frame, arms = _two_arms(6, primary=True)
    gpu = frame.assign(device="NVIDIA H100 80GB HBM3")
    cpu = central(12, -0.01, seed=5, device="CPU (1 threads, x86_64)")   # the central arm only, more pairs
    table = answer_table(pd.concat([gpu, cpu]), arms, n_resamples=999)
    assert table.device_kind.tolist() == ["gpu", "gpu"] and table.n_pairs.tolist() == [6, 6]
    assert table.verdict.iloc[0] == "higher"   # the GPU runs' gain, not the CPU runs' loss
    assert table_device_kind(runs_by_kind(cpu, tuple(FACTORS), condition_id, "test_accuracy"), arms) == "cpu"
    assert table_device_kind(runs_by_kind(cpu.iloc[:0], tuple(FACTORS), condition_id, "test_accuracy"), arms) == ""


def test_each_row_says_what_it_is_compared_with():
    shown = format_answer(answer_table(central(12, 0.01), n_resamples=999))
    assert shown.columns[0] == "compared with"
    assert shown["compared with"].to_dict() == {a.name: a.compared_with for a in ARMS}
    assert shown.loc["renormalize", "compared with"] == "−∞ mask" == shown.loc["mean pooling", "compared with"]
    unnamed = Arm("x", "q", ARMS[0].condition, ARMS[0].baseline)   # no words given: the baseline's key
    assert format_answer(answer_table(central(12, 0.01), (unnamed,), n_resamples=999)).iloc[0, 0] == ARMS[0].baseline


def test_seed_by_seed_counts_boosts_speed_and_the_pad_mass_relation():
    frame = central(10, 0.0, device="CPU (1 threads, x86_64)")
    arm = ARMS[0]
    gain = np.array([1, 1, 1, -1, -1, 1, 1, -1, 1, 1]) * 0.002   # 7 seeds ahead
    cond_rows = frame.masking == "neg_inf"
    frame.loc[cond_rows, "test_accuracy"] = frame.loc[~cond_rows, "test_accuracy"].to_numpy() + gain
    frame["val_accuracy"] = frame.test_accuracy
    frame["tokens_per_s"] = np.where(cond_rows, 960.0, 1000.0)
    frame["pad_mass"] = np.r_[np.arange(10) / 100, np.zeros(10)]   # baseline rows first
    row = seed_by_seed(frame, arm).loc["cpu"]
    assert (row.n_pairs, row.n_ahead, row.n_slower) == (10, 7, 10)
    assert row.share_ahead == pytest.approx(0.7) == row.share_ahead_val
    assert row.median_speed_change == pytest.approx(-0.04)
    assert -1 <= row.spearman_pad_mass <= 1
    assert -1 <= row.spearman_low <= row.spearman_pad_mass <= row.spearman_high <= 1
    assert row.sd_diff == pytest.approx(np.std(gain, ddof=1))   # the spread of the paired gains
    assert "gpu" not in seed_by_seed(frame, arm).index
    again = seed_by_seed(frame, arm).loc["cpu"]   # a seeded bootstrap: the same interval twice
    assert (again.spearman_low, again.spearman_high) == (row.spearman_low, row.spearman_high)


def test_seed_by_seed_edges():
    """No val or speed columns give NaN; fewer than 3 seeds or a constant gain give no correlation; no pair, no row."""
    frame = central(2, 0.01)
    row = seed_by_seed(frame).loc["cpu"]
    assert row.n_pairs == 2 and np.isnan(row.share_ahead_val) and np.isnan(row.median_speed_change)
    assert np.isnan(row.spearman_pad_mass) and np.isnan(row.spearman_low) and np.isnan(row.spearman_high)
    assert np.isfinite(row.sd_diff)
    assert np.isnan(seed_by_seed(central(12, 0.01)[lambda f: f.seed < 1]).loc["cpu", "sd_diff"])   # one seed
    flat = central(5, 0.01)
    flat["test_accuracy"] = 0.8
    flat["pad_mass"] = np.arange(len(flat)) / 100
    assert np.isnan(seed_by_seed(flat).loc["cpu", "spearman_pad_mass"])
    assert seed_by_seed(flat).loc["cpu", "n_ahead"] == 0
    assert seed_by_seed(central(3, 0.01)[lambda f: f.masking == "none"]).empty


def test_boost_odds_reads_well_at_its_edges():
    assert boost_odds(14, 20) == "a single pair of runs shows a boost in only 14 of 20 seeds"
    assert boost_odds(19, 20) == "a single pair of runs shows a boost in 19 of 20 seeds"
    assert boost_odds(20, 20) == "every single pair of runs shows a boost (20 of 20 seeds)"
    assert boost_odds(1, 1) == "the single pair of runs shows a boost"
    assert boost_odds(0, 5) == "no single pair of runs shows a boost (0 of 5 seeds)"
    assert boost_odds(0, 0) == "no pair of runs has been made yet"


def test_signed_never_writes_minus_zero():
    assert signed(-0.0047) == "0.00" == signed(0.0) == signed(0.004) == signed(-0.0)
    assert signed(-0.005001) == "-0.01" and signed(0.3) == "+0.30" and signed(-0.44) == "-0.44"
    assert signed(float("nan")) == "–" and signed(0.25, 1) == "+0.2"
    table = answer_table(central(12, 0.0), n_resamples=999)
    table.loc[0, ["mean_diff", "ci_low", "ci_high"]] = [0.00001, -0.00004, 0.0002]
    assert format_answer(table).iloc[0]["accuracy change (points)"] == "0.00 [0.00, +0.02]"


def _rho(*rows):
    return pd.DataFrame(rows, columns=["spearman_pad_mass", "spearman_low", "spearman_high"])


def test_rho_sentence_reads_well_at_its_edges():
    both_hint = rho_sentence(_rho((0.63, 0.19, 0.87), (0.42, -0.08, 0.78)))
    assert both_hint.startswith("On both kinds of device, seeds whose unmasked model gave the pads more attention "
                                "tended to gain more from the mask. But")
    assert "includes zero on 1 of 2 kinds of device: a hint, not a finding." in both_hint
    assert rho_sentence(_rho((0.5, -0.1, 0.8), (0.4, -0.2, 0.7))).endswith("includes zero on both: a hint, not a "
                                                                            "finding.")
    found = rho_sentence(_rho((0.63, 0.19, 0.87), (0.6, 0.1, 0.9)))
    assert found.endswith("excludes zero on both.") and "tended to gain more" in found
    one = rho_sentence(_rho((-0.6, -0.9, -0.2)))
    assert one.startswith("Seeds whose") and "gain less" in one and one.endswith("excludes zero.")
    assert rho_sentence(_rho((0.5, -0.1, 0.8))).endswith("includes zero: a hint, not a finding.")
    assert rho_sentence(_rho((0.5, 0.1, 0.8), (-0.3, -0.6, 0.1))) == ("A seed's gain shows no consistent relation "
                                                                       "to its unmasked pad mass.")
    assert rho_sentence(_rho((0.0, -0.5, 0.5))).startswith("A seed's gain shows no")
    assert rho_sentence(_rho((np.nan, np.nan, np.nan))).startswith("The stored runs cannot")
    assert rho_sentence(_rho()).startswith("The stored runs cannot")


def test_bucketing_verdict_follows_the_data():
    assert bucketing_verdict("higher", 0.0045, 0.0006) == "no: the mask still raised accuracy"
    assert bucketing_verdict("lower", 0.0, 0.0) == "holds: the mask lowered accuracy"
    sensitive = "partly: less padding, but a model more sensitive to it"
    assert bucketing_verdict("no difference resolved", 0.0045, 0.0006) == sensitive
    assert bucketing_verdict(CORRECTED, 0.0045, 0.0006) == sensitive
    holds = "holds, while the batches stay bucketed"
    assert bucketing_verdict("no difference resolved", 0.0006, 0.0006) == holds   # equal: not more sensitive
    assert bucketing_verdict("no difference resolved", np.nan, 0.0006) == holds   # not measured
    assert bucketing_verdict("not yet answered", 0.0, 0.001) == "not yet answered"


def test_share_or_none_in_words():
    assert share_or_none(0) == "none" and share_or_none(1) == "all"
    assert share_or_none(0.085) == "8.5%" and share_or_none(0.0001) == "under 0.1%"
    assert share_or_none(0.0001, 2) == "0.01%" and share_or_none(float("nan")) == "not measured"


def test_a_conditions_own_measurements_are_the_mean_over_all_its_runs():
    """The baseline has four more runs than pairs: its pad mass is the mean over all ten of its runs, not over the
    six paired ones, so one condition has one value in every row that uses it (chapter 5 quotes it once)."""
    frame = central(6, 0.01, pad_mass=0.1)
    extra = runs(ARMS[0].baseline, range(6, 10), 0.85, pad_mass=0.2)   # unpaired runs of the baseline
    row = answer_table(pd.concat([frame, extra], ignore_index=True), n_resamples=999).iloc[0]
    assert row.n_pairs == 6 and row.pad_mass_baseline == pytest.approx((6 * 0.1 + 4 * 0.2) / 10)
    assert row.pad_mass_condition == pytest.approx(0.1)
