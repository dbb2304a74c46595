"""Chapter 5's answer, read from stored runs of the masking experiment: one row per *arm* (a paired comparison).

Chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``), section "The
answer". The runs come from :mod:`attnbook.experiments.masking` (its CSV, one row per run); this module only reads
them. Every verdict word is chosen here from the data, never typed in the chapter:

The verdict rule is the book's one rule, :func:`attnbook.evidence.verdict`:

- an arm with fewer than ``min_pairs`` paired seeds is *not yet answered*, whatever its interval says;
- otherwise the bootstrap 95% confidence interval of the mean paired difference decides: it excludes zero (a
  difference, with its sign) or includes it (no difference resolved at this number of seeds);
- a *primary* arm (:attr:`Arm.primary`: the question the table was made to answer, fixed before any run, such as
  chapter 5's central comparison) is decided by its interval alone. Every other arm is secondary, one of a family of
  comparisons: its difference counts only if, besides its interval, its Wilcoxon p-value stays below 5% after
  Holm's correction over the answered secondary arms of the table (Holm 1979); otherwise its verdict is *not
  resolved after Holm's correction* (:data:`CORRECTED`).

Holm's correction runs over the answered secondary arms of one table, so adding an arm that has too few seeds
changes nothing; a primary arm's ``p_holm`` is NaN.

Runs pair only with runs of the same kind of device (the ``device`` column: CPU or GPU), because the same seed gives
a different training run on another device: when a store holds both, each arm uses the kind with more paired seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..evidence import ALPHA, CORRECTED, MIN_PAIRS, verdict
from ..stats import compare_paired, holm
from ..store import device_kind   # re-exported: the kind of device a stored run ran on
from .masking import condition_id

__all__ = ["Arm", "ARMS", "MIN_PAIRS", "CORRECTED", "ALPHA", "answer_table", "format_answer", "verdict",
           "direction_agrees", "device_kind", "runs_by_kind", "paired_table", "seed_by_seed", "boost_odds",
           "signed", "rho_sentence", "bucketing_verdict", "share_or_none"]

#: The book's one verdict rule lives in :mod:`attnbook.evidence` (``MIN_PAIRS`` paired runs, the 95% interval, Holm's
#: correction for secondary arms); the names stay importable from here.


@dataclass(frozen=True)
class Arm:
    """One paired comparison: ``condition`` against ``baseline`` (both :func:`condition_id` keys), same seeds.
    ``primary``: the table's own question, decided by its interval alone (see the module docstring); the other arms
    are corrected for the family. ``compared_with``: the baseline in a reader's words (the answer table's
    "compared with" column); empty = the baseline's key."""

    name: str
    question: str
    condition: str
    baseline: str
    primary: bool = False
    compared_with: str = ""


def _cid(pooling: str, masking: str, rnn_input: str = "packed", batching: str = "random") -> str:
    return condition_id(dict(pooling=pooling, masking=masking, rnn_input=rnn_input, batching=batching,
                             precision="fp32"))


#: The arms of chapter 5's answer: the central comparison, the two settings that argument 2 and the unpacked encoder
#: ask about, the asker's own method, the simplest baseline, and bucketing itself.
ARMS = (
    Arm("mask", "−∞ mask against none (packed encoder, random batches)",
        _cid("attention", "neg_inf"), _cid("attention", "none"), primary=True, compared_with="no mask"),
    Arm("mask, bucketed", "−∞ mask against none, bucketed batches",
        _cid("attention", "neg_inf", batching="bucketed"), _cid("attention", "none", batching="bucketed"),
        compared_with="no mask, bucketed"),
    Arm("mask, unpacked", "−∞ mask against none, unpacked encoder (post-padding)",
        _cid("attention", "neg_inf", "unpacked"), _cid("attention", "none", "unpacked"),
        compared_with="no mask, unpacked"),
    Arm("renormalize", "renormalize after the softmax against the −∞ mask",
        _cid("attention", "renormalize"), _cid("attention", "neg_inf"), compared_with="−∞ mask"),
    Arm("mean pooling", "masked mean pooling against −∞-masked attention pooling",
        _cid("mean", "-"), _cid("attention", "neg_inf"), compared_with="−∞ mask"),
    Arm("bucketing", "bucketed against random batches, no mask",
        _cid("attention", "none", batching="bucketed"), _cid("attention", "none"),
        compared_with="no mask, random batches"),
)


_SIDES = {"pad_mass": "pad_mass", "flip_in": "flip_rate_in", "flip_stress": "flip_rate",
          "tokens_per_s": "tokens_per_s"}


def _paired(frame: pd.DataFrame, arm) -> pd.DataFrame:
    """The runs of ``arm``'s two conditions on one kind of device (the kind with more paired seeds; GPU on a tie),
    restricted to the seeds that ran in both."""
    best = frame.iloc[:0]
    for kind in ("gpu", "cpu"):
        runs = frame[frame.condition.isin([arm.condition, arm.baseline]) & (frame.device_kind == kind)]
        seeds = runs.groupby("seed").condition.nunique()
        runs = runs[runs.seed.isin(seeds[seeds == 2].index)]
        if runs.seed.nunique() > best.seed.nunique():
            best = runs
    return best


def answer_table(frame: pd.DataFrame, arms: tuple[Arm, ...] = ARMS, *, value: str = "test_accuracy",
                 min_pairs: int = MIN_PAIRS, n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
    """One row per arm: the paired change in ``value`` and the other measurements of both sides.

    Args:
        frame: runs, one row each, with the factor columns of :mod:`attnbook.experiments.masking`, ``seed`` and the
            result columns (a stored ``results/masking_full.csv`` read with pandas). A ``flip_rate_in`` column may be
            missing or NaN for runs stored before it was measured.
        arms: the comparisons.
        value: the compared result (a fraction for accuracy: a difference of 0.003 is 0.3 points).
        min_pairs: paired seeds needed for a verdict and for Holm's correction.
        n_resamples, seed: of the bootstrap (:func:`attnbook.stats.bootstrap_ci`).

    Returns:
        Columns ``arm, question, compared_with`` (:attr:`Arm.compared_with`, or the baseline's key) and those of
        :func:`paired_table` (``condition, baseline, n_pairs, device_kind,
        mean_baseline, mean_condition, mean_diff, ci_low, ci_high, n_better, n_worse, n_equal, p_value, p_holm,
        rank_biserial, primary, verdict``), and for each side (``_condition``,
        ``_baseline``) the means over the paired seeds of ``pad_mass``, ``flip_in`` (re-pad inside the training
        distribution), ``flip_stress`` (re-pad to twice the training maximum) and ``tokens_per_s``. An arm with
        fewer than 2 paired seeds has NaN statistics; ``p_holm`` is NaN for the primary arm and for arms that are
        not yet answered.

    Raises:
        ValueError: ``frame`` lacks the factor, ``seed`` or ``value`` columns, or a (condition, seed) run occurs
            twice on one kind of device.
    """
    frame = runs_by_kind(frame, ("pooling", "masking", "rnn_input", "batching", "precision"), condition_id, value)
    table = paired_table(frame, arms, _SIDES, value=value, min_pairs=min_pairs, n_resamples=n_resamples, seed=seed)
    names = pd.DataFrame([{"arm": a.name, "question": a.question,
                           "compared_with": getattr(a, "compared_with", "") or a.baseline} for a in arms])
    return pd.concat([names, table], axis=1)


def runs_by_kind(frame: pd.DataFrame, factors: tuple[str, ...], condition_of, value: str) -> pd.DataFrame:
    """``frame`` (one row per run) with a ``condition`` column (``condition_of`` of each row's factors) and a
    ``device_kind`` column (:func:`attnbook.store.device_kind` of its ``device``; ``"cpu"`` without one).

    Raises:
        ValueError: ``frame`` lacks a factor, ``seed`` or ``value`` column, or a (condition, seed) run occurs twice
            on one kind of device.
    """
    missing = sorted({*factors, "seed", value} - set(frame.columns))
    if missing:
        raise ValueError(f"frame lacks the columns {missing}")
    frame = frame.assign(condition=frame.apply(condition_of, axis=1) if len(frame) else pd.Series(dtype=str),
                         device_kind=[device_kind(d) for d in frame["device"]] if "device" in frame else "cpu")
    duplicated = frame.duplicated(["condition", "seed", "device_kind"])
    if duplicated.any():
        raise ValueError(f"runs occur twice: {frame.loc[duplicated, ['condition', 'seed']].values.tolist()[:5]}")
    return frame


def paired_table(frame: pd.DataFrame, pairs, sides: dict[str, str], *, value: str = "test_accuracy",
                 min_pairs: int = MIN_PAIRS, n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
    """One row per pair (anything with ``condition`` and ``baseline`` attributes) of the runs in ``frame`` (from
    :func:`runs_by_kind`), on one kind of device each (the kind with more paired seeds; GPU on a tie).

    Returns:
        Columns ``condition, baseline, n_pairs, device_kind``, the paired statistics of ``value``
        (:func:`attnbook.stats.compare_paired`: ``mean_baseline, mean_condition, mean_diff, ci_low, ci_high,
        p_value, rank_biserial, n_better, n_worse, n_equal``; NaN with fewer than 2 paired seeds), for each entry
        ``key: column`` of ``sides`` the means of ``column`` over the paired seeds as ``key_condition`` and
        ``key_baseline`` (NaN where not measured), ``primary`` (the pair's ``primary`` attribute, False without
        one), ``p_holm`` (Holm over the answered secondary rows, NaN for the others) and ``verdict``
        (:func:`verdict`: a primary row by its interval, a secondary row by its interval and ``p_holm``).
    """
    rows = []
    for pair in pairs:
        runs = _paired(frame, pair)
        n = runs.seed.nunique()
        row: dict = {"condition": pair.condition, "baseline": pair.baseline, "n_pairs": n,
                     "device_kind": runs.device_kind.iloc[0] if n else ""}
        stats = dict.fromkeys(["mean_baseline", "mean_condition", "mean_diff", "ci_low", "ci_high", "p_value",
                               "rank_biserial"], np.nan)
        stats.update(n_better=0, n_worse=0, n_equal=0)
        if n >= 2:
            table = compare_paired(runs, value=value, condition="condition", baseline=pair.baseline,
                                   comparisons=[pair.condition], n_resamples=n_resamples, seed=seed).iloc[0]
            stats = {k: table[k] for k in stats}
        row.update(stats)
        for key, column in sides.items():
            for side in ("condition", "baseline"):
                values = runs.loc[runs.condition == getattr(pair, side), column] if column in runs else pd.Series()
                row[f"{key}_{side}"] = float(values.mean()) if values.notna().any() else np.nan
        row["primary"] = bool(getattr(pair, "primary", False))
        row["verdict"] = verdict(n, row["ci_low"], row["ci_high"], min_pairs)   # before the correction
        rows.append(row)
    out = pd.DataFrame(rows)
    out["p_holm"] = np.nan
    family = (out.verdict != "not yet answered") & ~out.primary
    if family.any():
        out.loc[family, "p_holm"] = holm(out.loc[family, "p_value"].to_numpy())
    out["verdict"] = [verdict(r.n_pairs, r.ci_low, r.ci_high, min_pairs, r.p_holm) for r in out.itertuples()]
    return out


def format_answer(table: pd.DataFrame) -> pd.DataFrame:
    """The reader's version of :func:`answer_table`: what the row is compared with (its baseline, in words), the
    kind of device the row's runs ran on ("CPU" or "GPU"), accuracy in points, rates in percent, tokens per second
    as condition / baseline, and missing measurements as "–" (a dash). One row per arm, indexed by the arm's
    name."""
    def pct(x, digits=2):
        return "–" if not np.isfinite(x) else f"{100 * x:.{digits}f}%"

    def pair(a, b, f):
        return f"{f(a)} / {f(b)}"

    rows = {}
    for _, t in table.iterrows():
        answered = np.isfinite(t.mean_diff)
        rows[t.arm] = {
            "compared with": t.get("compared_with", t.baseline) or t.baseline,
            "seeds": int(t.n_pairs),
            "device": str(t.device_kind).upper() if t.device_kind else "–",
            "accuracy change (points)": (f"{signed(100 * t.mean_diff)} [{signed(100 * t.ci_low)}, "
                                         f"{signed(100 * t.ci_high)}]" if answered else "–"),
            "better / worse": f"{int(t.n_better)} / {int(t.n_worse)}" if answered else "–",
            "Wilcoxon p (Holm)": f"{t.p_value:.3f} ({t.p_holm:.3f})" if np.isfinite(t.p_holm) else
            (f"{t.p_value:.3f} (primary)" if answered and t.get("primary", False) else
             f"{t.p_value:.3f}" if answered else "–"),
            "rank-biserial": f"{t.rank_biserial:+.2f}" if answered else "–",
            "pad mass": pair(t.pad_mass_condition, t.pad_mass_baseline, pct),
            "flip rate": pair(t.flip_in_condition, t.flip_in_baseline, pct),
            "flip rate, 2× stress": pair(t.flip_stress_condition, t.flip_stress_baseline, pct),
            "tokens/s": pair(t.tokens_per_s_condition, t.tokens_per_s_baseline,
                             lambda x: "–" if not np.isfinite(x) else f"{x:,.0f}"),
            "verdict": t.verdict,
        }
    return pd.DataFrame(rows).T.rename_axis("arm")


def signed(x: float, digits: int = 2) -> str:
    """``x`` with its sign and ``digits`` decimals, except that a value that rounds to zero is written without a
    sign ("0.00", never "-0.00" or "+0.00"); NaN is "–"."""
    if not np.isfinite(x):
        return "–"
    text = f"{x:+.{digits}f}"
    return text[1:] if float(text) == 0 else text


def direction_agrees(quick_diff: float, stored_diff: float) -> bool:
    """Whether a quick run's mean paired difference has the sign of the stored one (a zero difference agrees with
    nothing but zero)."""
    return bool(np.sign(quick_diff) == np.sign(stored_diff))


def seed_by_seed(frame: pd.DataFrame, arm: Arm = ARMS[0], *, n_resamples: int = 2000,
                 seed: int = 0) -> pd.DataFrame:
    """``arm`` seed by seed, on each kind of device: how often one pair of runs shows the condition ahead, and what
    the condition costs in speed (chapter 5, sections "The answer" and "Why the asker saw a boost").

    Args:
        frame: runs, one row each, as for :func:`answer_table`; ``val_accuracy``, ``tokens_per_s`` and
            ``pad_mass`` may be missing (NaN columns in the result).
        arm: the comparison (default: the central one, the −∞ mask against none).

    Returns:
        One row per kind of device that has at least one paired seed (index ``"gpu"``, ``"cpu"``), with columns
        ``n_pairs``; ``n_ahead`` and ``share_ahead`` (seeds where the condition's test accuracy is strictly higher
        than the baseline's, and their share); ``share_ahead_val`` (the same on validation accuracy);
        ``n_slower`` and ``median_speed_change`` (seeds where the condition trained fewer real tokens per second,
        and the median relative change, a fraction: -0.038 is 3.8% slower); ``spearman_pad_mass`` (Spearman's
        rank correlation between a seed's accuracy gain and its baseline's attention mass on pads; NaN with
        fewer than 3 seeds or a constant column); ``spearman_low``, ``spearman_high`` (its percentile bootstrap
        95% interval over seeds, ``n_resamples`` resamples with generator seed ``seed``; NaN where rho is);
        ``sd_diff`` (the standard deviation over seeds of the paired test-accuracy difference, a fraction; NaN
        with fewer than 2 seeds): what decides how often one pair of runs shows the condition ahead.

    Raises:
        ValueError: as :func:`runs_by_kind`.
    """
    from scipy.stats import spearmanr

    frame = runs_by_kind(frame, ("pooling", "masking", "rnn_input", "batching", "precision"), condition_id,
                         "test_accuracy")
    rows = {}
    for kind in ("gpu", "cpu"):
        runs = frame[frame.device_kind == kind]
        a = runs[runs.condition == arm.condition].set_index("seed")
        b = runs[runs.condition == arm.baseline].set_index("seed")
        seeds = a.index.intersection(b.index)
        if not len(seeds):
            continue
        a, b = a.loc[seeds], b.loc[seeds]

        def col(side, name):
            return side[name] if name in side else pd.Series(np.nan, index=seeds)

        gain = a.test_accuracy - b.test_accuracy
        val_gain = col(a, "val_accuracy") - col(b, "val_accuracy")
        speed = col(a, "tokens_per_s") / col(b, "tokens_per_s") - 1
        pads = col(b, "pad_mass")
        rho = rho_low = rho_high = np.nan
        if len(seeds) >= 3 and gain.nunique() > 1 and pads.notna().all() and pads.nunique() > 1:
            rho = float(spearmanr(gain, pads).statistic)
            rng = np.random.default_rng(seed)
            g, p = gain.to_numpy(), pads.to_numpy()
            boot = []
            for _ in range(n_resamples):
                pick = rng.integers(0, len(g), len(g))
                if np.unique(g[pick]).size > 1 and np.unique(p[pick]).size > 1:
                    boot.append(spearmanr(g[pick], p[pick]).statistic)
            if boot:
                rho_low, rho_high = (float(q) for q in np.quantile(boot, [0.025, 0.975]))
        rows[kind] = {
            "n_pairs": len(seeds), "n_ahead": int((gain > 0).sum()), "share_ahead": float((gain > 0).mean()),
            "share_ahead_val": float((val_gain > 0).mean()) if val_gain.notna().all() else np.nan,
            "n_slower": int((speed < 0).sum()),
            "median_speed_change": float(speed.median()) if speed.notna().any() else np.nan,
            "spearman_pad_mass": rho, "spearman_low": rho_low, "spearman_high": rho_high,
            "sd_diff": float(gain.std()) if len(seeds) >= 2 else np.nan,
        }
    columns = ["n_pairs", "n_ahead", "share_ahead", "share_ahead_val", "n_slower", "median_speed_change",
               "spearman_pad_mass", "spearman_low", "spearman_high", "sd_diff"]
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns)


def boost_odds(n_ahead: int, n_pairs: int) -> str:
    """How often one pair of runs (masked and unmasked, one seed) shows a boost, in words, for chapter 5's answer:
    ``"a single pair of runs shows a boost in 14 of 20 seeds"``. Reads well at the edges: no seed, none ahead, all
    ahead, one seed."""
    if n_pairs <= 0:
        return "no pair of runs has been made yet"
    if n_ahead <= 0:
        return f"no single pair of runs shows a boost (0 of {n_pairs} seeds)"
    if n_ahead >= n_pairs:
        return ("the single pair of runs shows a boost" if n_pairs == 1
                else f"every single pair of runs shows a boost ({n_pairs} of {n_pairs} seeds)")
    only = "only " if n_ahead / n_pairs < 0.8 else ""
    return f"a single pair of runs shows a boost in {only}{n_ahead} of {n_pairs} seeds"


def rho_sentence(rows: pd.DataFrame) -> str:
    """Chapter 5's sentence on whether a seed's gain from the mask goes with its unmasked model's pad mass, chosen
    from ``rows`` (columns ``spearman_pad_mass``, ``spearman_low``, ``spearman_high``, one row per kind of device,
    as from :func:`seed_by_seed`). A relation is claimed only where every row's bootstrap interval excludes zero on
    the same side; a consistent sign with an interval that includes zero is a hint; otherwise none is seen."""
    rows = rows.dropna(subset=["spearman_pad_mass"])
    if not len(rows):
        return "The stored runs cannot relate a seed's gain to its unmasked pad mass."
    rho = rows.spearman_pad_mass
    low, high = rows.spearman_low, rows.spearman_high
    both = "On both kinds of device, seeds" if len(rows) > 1 else "Seeds"
    for sign, more in ((1, "more"), (-1, "less")):
        if (sign * rho > 0).all():
            subject = (f"{both} whose unmasked model gave the pads more attention tended to gain {more} from "
                       "the mask")
            excludes = (low > 0) if sign > 0 else (high < 0)
            if excludes.all():
                where = " on both" if len(rows) == 2 else " on each" if len(rows) > 1 else ""
                return f"{subject}; the bootstrap interval of this rank correlation excludes zero{where}."
            n_incl = len(rows) - int(excludes.sum())
            where = ("" if len(rows) == 1 else " on both" if n_incl == len(rows) == 2
                     else f" on {n_incl} of {len(rows)} kinds of device")
            return (f"{subject}. But the bootstrap interval of this rank correlation includes zero{where}: a "
                    "hint, not a finding.")
    return "A seed's gain shows no consistent relation to its unmasked pad mass."


def bucketing_verdict(mask_bucketed: str, flip_bucketed: float, flip_random: float) -> str:
    """The verdict on objection 2 ("bucketing leaves little padding"), for chapter 5's objections table, from the
    verdict of the mask arm under bucketed batches (``mask_bucketed``, a :func:`verdict` word) and the within-range
    flip rates of the unmasked model trained with bucketed and with random batches (NaN: not measured)."""
    if mask_bucketed == "higher":
        return "no: the mask still raised accuracy"
    if mask_bucketed == "lower":
        return "holds: the mask lowered accuracy"
    if np.isfinite(flip_bucketed) and np.isfinite(flip_random) and flip_bucketed > flip_random:
        return "partly: less padding, but a model more sensitive to it"
    if mask_bucketed == "not yet answered":
        return "not yet answered"
    return "holds, while the batches stay bucketed"


def share_or_none(x: float, digits: int = 1) -> str:
    """A share of predictions in words for chapter 5's prose: "none" for zero, "all" for one, otherwise a percent
    with ``digits`` decimals (a nonzero share that would round to zero is written "under 0.1%" and so on)."""
    if not np.isfinite(x):
        return "not measured"
    if x == 0:
        return "none"
    if x == 1:
        return "all"
    text = f"{x:.{digits}%}"
    return f"under {10 ** -digits:.{digits}f}%" if float(text[:-1]) == 0 else text
