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
           "direction_agrees", "device_kind", "runs_by_kind", "table_device_kind", "paired_table", "seed_by_seed", "boost_odds",
           "signed", "rho_sentence", "bucketing_verdict", "share_or_none", "CHAPTER_ROWS", "PLAIN_VERDICTS",
           "results_table", "effect_text", "asker_example", "plot_asker_example", "pad_score_gradients",
           "renormalize_underflow", "speed_changes", "speed_sentence", "ahead_text", "plot_paired", "bucketing_text",
           "renormalize_nan_gap",
           "family_size", "plain_verdict", "bucketing_robustness_text", "flip_gain_text", "repeat_on_other_device",
           "paired_differences"]

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
#: ask about, the asker's own method, the simplest baseline, and bucketing itself, without and with the mask (with
#: the mask and a packed encoder the pads play no part, so what bucketing changes there is only which reviews share
#: a batch).
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
    Arm("bucketing, masked", "bucketed against random batches, −∞ mask (pads play no part)",
        _cid("attention", "neg_inf", batching="bucketed"), _cid("attention", "neg_inf"),
        compared_with="−∞ mask, random batches"),
)


_SIDES = {"pad_mass": "pad_mass", "flip_in": "flip_rate_in", "flip_stress": "flip_rate",
          "tokens_per_s": "tokens_per_s"}


def _paired(frame: pd.DataFrame, arm, kind: str) -> pd.DataFrame:
    """The runs of ``arm``'s two conditions on ``kind`` of device (``"gpu"`` or ``"cpu"``, as
    :func:`table_device_kind` chose), restricted to the seeds that ran in both."""
    runs = frame[frame.condition.isin([arm.condition, arm.baseline]) & (frame.device_kind == kind)]
    seeds = runs.groupby("seed").condition.nunique()
    return runs[runs.seed.isin(seeds[seeds == 2].index)]


def table_device_kind(frame: pd.DataFrame, pairs, min_pairs: int = MIN_PAIRS) -> str:
    """The one kind of device whose runs answer a whole table of comparisons (``frame`` from :func:`runs_by_kind`):
    the kind on which the most comparisons have at least ``min_pairs`` paired runs, then the one with more paired
    runs in all, then GPU. One table reads one set of runs, so that no two of its numbers come from different
    devices; the runs on the other kind are a repeat, shown on the evidence page. ``""`` when ``frame`` is empty."""
    scores = {}
    for kind in ("gpu", "cpu"):
        counts = [_paired(frame, pair, kind).seed.nunique() for pair in pairs]
        scores[kind] = (sum(n >= min_pairs for n in counts), sum(counts))
    best = max(scores, key=lambda k: scores[k])   # max keeps the first on a tie: GPU
    return best if scores[best][1] else ""


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
        ``_baseline``) the means over all runs of that condition on the table's kind of device of ``pad_mass``, ``flip_in`` (re-pad inside the training
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
    :func:`runs_by_kind`), all on one kind of device (:func:`table_device_kind`).

    Returns:
        Columns ``condition, baseline, n_pairs, device_kind``, the paired statistics of ``value``
        (:func:`attnbook.stats.compare_paired`: ``mean_baseline, mean_condition, mean_diff, ci_low, ci_high,
        p_value, rank_biserial, n_better, n_worse, n_equal``; NaN with fewer than 2 paired seeds), for each entry
        ``key: column`` of ``sides`` the means of ``column`` over all the condition's runs on that kind of device
        (not only the paired seeds: a condition has one value in every row) as ``key_condition`` and
        ``key_baseline`` (NaN where not measured), ``primary`` (the pair's ``primary`` attribute, False without
        one), ``p_holm`` (Holm over the answered secondary rows, NaN for the others) and ``verdict``
        (:func:`verdict`: a primary row by its interval, a secondary row by its interval and ``p_holm``).
    """
    rows = []
    pairs = list(pairs)
    kind = table_device_kind(frame, pairs, min_pairs)
    for pair in pairs:
        runs = _paired(frame, pair, kind) if kind else frame.iloc[:0]
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
        # a condition's own measurements (pad mass, flips, speed) describe the condition, not the pair: the mean
        # over all its runs on the table's kind of device, so that one condition has one value in every row
        on_kind = frame[frame.device_kind == kind] if kind else frame.iloc[:0]
        for key, column in sides.items():
            for side in ("condition", "baseline"):
                values = (on_kind.loc[on_kind.condition == getattr(pair, side), column] if column in on_kind
                          else pd.Series())
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


# --- The chapter's own pieces (issue 45): the asker's example, the plain results table, speed, the gradient ---

#: The rows of chapter 5's results table (a subset of :data:`ARMS`, in the order the page discusses them), with the
#: reader's words for each side. The other arms (mean pooling) are on the evidence page.
CHAPTER_ROWS = {
    "mask": ("−∞ mask", "no mask"),
    "renormalize": ("renormalize after the softmax", "−∞ mask"),
    "bucketing": ("bucketed batches, no mask", "random batches, no mask"),
    "mask, bucketed": ("−∞ mask, bucketed batches", "no mask, bucketed batches"),
    "mask, unpacked": ("−∞ mask, unpacked encoder", "no mask, unpacked encoder"),
    "bucketing, masked": ("bucketed batches, −∞ mask", "random batches, −∞ mask"),
    "mean pooling": ("masked mean pooling", "−∞-masked attention pooling"),
}

#: A verdict of :func:`attnbook.evidence.verdict` in the words of a chapter's table (no test named). The entry for
#: :data:`CORRECTED` is a template: ``{n}`` is the size of the corrected family (:func:`family_size`).
PLAIN_VERDICTS = {"higher": "higher", "lower": "lower", "no difference resolved": "no difference resolved",
                  CORRECTED: "not resolved among {n} secondary comparisons", "not yet answered": "not yet answered"}


def family_size(answer: pd.DataFrame) -> int:
    """How many rows of ``answer`` (from :func:`answer_table`) form the family that Holm's correction ran over: the
    answered secondary arms, those with a finite ``p_holm``. The chapter's table and the evidence page both state
    this count, so it is read from the table, never from :data:`ARMS` (an arm with too few runs is left out)."""
    return int(np.isfinite(answer["p_holm"].to_numpy(float)).sum())


def plain_verdict(verdict_word: str, n_family: int) -> str:
    """``verdict_word`` (a :func:`attnbook.evidence.verdict` word) in the words of a chapter's table; a corrected
    verdict names the size ``n_family`` of its family (:func:`family_size`).

    Raises:
        ValueError: a corrected verdict with a family of fewer than 1 comparison (none was corrected).
    """
    if verdict_word == CORRECTED:
        if n_family < 1:
            raise ValueError(f"n_family must be at least 1 for a corrected verdict, got {n_family}")
        if n_family == 1:
            return "not resolved once tested"
    return PLAIN_VERDICTS.get(verdict_word, verdict_word).format(n=n_family)


def results_table(answer: pd.DataFrame, rows: dict = CHAPTER_ROWS) -> pd.DataFrame:
    """Chapter 5's plain results table, from :func:`answer_table`: one row per entry of ``rows`` (arm name ->
    (condition, compared with) in words), with the paired change in test accuracy (points), its 95% interval, the
    number of paired runs and the verdict in plain words (:data:`PLAIN_VERDICTS`).

    Raises:
        ValueError: ``rows`` names an arm that ``answer`` lacks.
    """
    missing = [name for name in rows if name not in set(answer.arm)]
    if missing:
        raise ValueError(f"answer lacks the arms {missing}")
    arms = answer.set_index("arm")
    out = []
    for name, (condition, baseline) in rows.items():
        t = arms.loc[name]
        answered = np.isfinite(t.mean_diff)
        out.append({"condition": condition, "compared with": baseline,
                    "change in accuracy (points)": signed(100 * t.mean_diff) if answered else "–",
                    "95% interval": (f"{signed(100 * t.ci_low)} to {signed(100 * t.ci_high)}" if answered
                                     else "–"),
                    "runs": int(t.n_pairs), "verdict": plain_verdict(t.verdict, family_size(answer))})
    return pd.DataFrame(out)


def effect_text(arm, what: str = "accuracy") -> str:
    """One arm's effect with its interval, in points, as a verdict sentence's clause chosen by its verdict:
    "raised accuracy by 0.30 points (95% interval +0.06 to +0.52)", "lowered ...", "changed accuracy by +0.04
    points (95% interval −0.06 to +0.14), a difference not resolved" (a secondary comparison whose interval excludes
    zero but whose corrected p-value does not: "..., a difference that does not hold up once ..."), "has too few
    runs to change accuracy in a resolved way". ``arm``: a row of
    :func:`answer_table` (``mean_diff``, ``ci_low``, ``ci_high``, ``verdict``)."""
    if arm is None or not np.isfinite(arm.mean_diff) or arm.verdict == "not yet answered":
        return f"has too few runs to change {what} in a resolved way"
    interval = f"(95% interval {signed(100 * arm.ci_low)} to {signed(100 * arm.ci_high)})"
    if arm.verdict in ("higher", "lower"):
        verb = "raised" if arm.verdict == "higher" else "lowered"
        return f"{verb} {what} by {abs(100 * arm.mean_diff):.2f} points {interval}"
    if arm.verdict == CORRECTED:
        return (f"changed {what} by {signed(100 * arm.mean_diff)} points {interval}, a difference not resolved "
                "once all of this question's comparisons are counted together")
    return f"changed {what} by {signed(100 * arm.mean_diff)} points {interval}, a difference not resolved"


def asker_example(scores=(0.1, 0.2, 0.0, 0.0, 0.0), n_real: int = 2) -> pd.DataFrame:
    """The asker's five-position example (chapter 5, "The question"): two real outputs and three pads, unmasked and
    masked. ``scores``: the attention scores of the positions (the pads' equal, as zero states give), the first
    ``n_real`` of them real.

    Returns:
        One row per position (index ``o1, o2, pad, ...``) with ``score``, ``unmasked`` (the softmax over every
        position) and ``masked`` (the softmax over the real positions, 0 on pads). The unmasked real weights sum
        to ``1 - pi``; their ratios are those of the masked weights.

    Raises:
        ValueError: ``n_real`` is not between 1 and the number of scores.
    """
    s = np.asarray(scores, dtype=float)
    if not 1 <= n_real <= len(s):
        raise ValueError(f"n_real must be between 1 and {len(s)}, got {n_real}")
    e = np.exp(s - s.max())
    masked = np.where(np.arange(len(s)) < n_real, e, 0.0)
    names = [f"o{i + 1}" for i in range(n_real)] + ["pad"] * (len(s) - n_real)
    return pd.DataFrame({"score": s, "unmasked": e / e.sum(), "masked": masked / masked.sum()},
                        index=pd.Index(names, name="position"))


def plot_asker_example(example: pd.DataFrame, states=((1.0, 0.25), (0.35, 1.0))):
    """Chapter 5's first figure: the weights of :func:`asker_example`, unmasked and masked (left), and the pooled
    vector of two real 2-d states ``states`` (pads are zero states) with and without the mask (right): the same
    direction, the unmasked one ``1 - pi`` as long. Returns the figure."""
    import matplotlib.pyplot as plt

    n_real = int((example.masked > 0).sum())
    h = np.asarray(states, dtype=float)
    if h.shape != (n_real, 2):
        raise ValueError(f"states must be {n_real} two-dimensional states, got shape {h.shape}")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [1.4, 1]})
    x = np.arange(len(example))
    for offset, column, colour, label in ((-0.2, "unmasked", "C3", "no mask"), (0.2, "masked", "C0", "−∞ mask")):
        bars = ax1.bar(x + offset, example[column], width=0.4, color=colour, label=label)
        ax1.bar_label(bars, labels=[f"{v:.2f}" for v in example[column]], fontsize=8)
    ax1.set_xticks(x, example.index)
    ax1.set_ylabel("attention weight")
    ax1.set_ylim(0, 0.62)
    ax1.legend()
    pooled = {"−∞ mask": example.masked.to_numpy()[:n_real] @ h, "no mask": example.unmasked.to_numpy()[:n_real] @ h}
    for (label, c), colour, width in zip(pooled.items(), ("C0", "C3"), (2, 3.5)):   # the shorter one on top
        ax2.annotate("", xy=c, xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=colour, lw=width,
                                                              mutation_scale=18))
        ax2.plot([], [], color=colour, lw=width, label=f"pooled vector, {label}")
    for i, state in enumerate(h):
        ax2.plot(*state, "o", color="grey")
        ax2.annotate(f"$h_{i + 1}$", state, textcoords="offset points", xytext=(5, 3))
    ax2.set_xlim(-0.05, 1.15)
    ax2.set_ylim(-0.05, 1.15)
    ax2.set_aspect("equal")
    ax2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def pad_score_gradients(scores, n_real: int, target=None) -> pd.DataFrame:
    """The gradient of a loss on the pooled vector with respect to every position's score, unmasked and masked
    (chapter 5, "Do the pads' scores get a gradient?"). The pads are zero states, so they enter the unmasked
    pooled vector only through the softmax's denominator; autograd shows that their scores get a gradient there,
    and none under the −∞ mask.

    Args:
        scores: 1-d scores, the first ``n_real`` real.
        n_real: real positions (1 to ``len(scores)``).
        target: the 2-d direction the loss rewards, ``loss = -(c . target)``; default ``(1, 1)``.

    Returns:
        One row per position (``o1, ..., pad``) with the score gradient ``unmasked`` and ``masked``.

    Raises:
        ValueError: ``n_real`` out of range.
    """
    import torch

    from ..masking import masked_softmax

    s0 = torch.as_tensor(scores, dtype=torch.float64)
    if not 1 <= n_real <= len(s0):
        raise ValueError(f"n_real must be between 1 and {len(s0)}, got {n_real}")
    gen = torch.Generator().manual_seed(0)
    h = torch.zeros(len(s0), 2, dtype=torch.float64)
    h[:n_real] = torch.rand(n_real, 2, generator=gen, dtype=torch.float64) + 0.1
    t = torch.as_tensor(target if target is not None else (1.0, 1.0), dtype=torch.float64)
    mask = torch.arange(len(s0)) < n_real
    out = {}
    for name, use_mask in (("unmasked", False), ("masked", True)):
        s = s0.clone().requires_grad_(True)
        w = masked_softmax(s, mask) if use_mask else torch.softmax(s, dim=-1)
        loss = -(w @ h) @ t
        loss.backward()
        out[name] = s.grad.numpy()
    names = [f"o{i + 1}" for i in range(n_real)] + ["pad"] * (len(s0) - n_real)
    return pd.DataFrame(out, index=pd.Index(names, name="position"))


def renormalize_underflow(gaps=(10, 50, 100, 110, 200), dtypes=("float32", "bfloat16", "float16")) -> pd.DataFrame:
    """When renormalizing after the softmax gives NaN (chapter 5, "When renormalizing fails"): one real token and
    one pad whose score is ``gap`` higher. The softmax gives the real token ``exp(-gap) / (1 + exp(-gap))``; once
    that underflows to 0 in the dtype, renormalizing divides 0 by 0. The −∞ mask never computes the pad's share.

    Returns:
        One row per gap, one column per ``dtype`` and method (``"renormalize, float16"``, ``"−∞ mask, float16"``):
        the real token's weight (1.0 when right, NaN when the share underflowed).
    """
    import torch

    from ..masking import masked_softmax, renormalized_softmax

    mask = torch.tensor([True, False])
    rows = {}
    for gap in gaps:
        row = {}
        for name in dtypes:
            s = torch.tensor([0.0, float(gap)]).to(getattr(torch, name))
            row[f"renormalize, {name}"] = float(renormalized_softmax(s, mask)[0])
            row[f"−∞ mask, {name}"] = float(masked_softmax(s, mask)[0])
        rows[gap] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("pad score minus real score")


def speed_changes(frame: pd.DataFrame, conditions: dict | None = None, *, min_pairs: int = MIN_PAIRS,
                  n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
    """Training speed (real tokens per second) of each masked condition against no mask, paired by seed, on each
    kind of device (chapter 5's claim about what the mask costs; the evidence page's speed table).

    Args:
        frame: runs, as for :func:`answer_table`, with a ``tokens_per_s`` column.
        conditions: condition key -> label; default the −∞ mask, renormalize and masked mean pooling (packed
            encoder, random batches, fp32), each against attention pooling without a mask.

    Returns:
        One row per (device kind, condition) with at least ``min_pairs`` paired seeds (the book's
        :data:`attnbook.evidence.MIN_PAIRS`): ``device_kind``, ``condition`` (the
        label), ``n_pairs``, ``tokens_per_s`` and ``baseline_tokens_per_s`` (means over the paired seeds),
        ``change`` (mean relative change, a fraction: -0.05 is 5% slower), ``ci_low``, ``ci_high`` (its bootstrap
        95% interval) and ``n_slower``.

    Raises:
        ValueError: as :func:`runs_by_kind`.
    """
    from ..stats import bootstrap_ci

    conditions = conditions or {_cid("attention", "neg_inf"): "−∞ mask",
                                _cid("attention", "renormalize"): "renormalize",
                                _cid("mean", "-"): "masked mean pooling"}
    base = _cid("attention", "none")
    frame = runs_by_kind(frame, ("pooling", "masking", "rnn_input", "batching", "precision"), condition_id,
                         "tokens_per_s")
    rows = []
    for kind in ("gpu", "cpu"):
        runs = frame[frame.device_kind == kind]
        b = runs[runs.condition == base].set_index("seed").tokens_per_s
        for key, label in conditions.items():
            a = runs[runs.condition == key].set_index("seed").tokens_per_s
            seeds = a.index.intersection(b.index)
            if len(seeds) < min_pairs:
                continue
            change = (a.loc[seeds] / b.loc[seeds] - 1).to_numpy(float)
            low, high = bootstrap_ci(change, n_resamples=n_resamples, seed=seed)
            rows.append({"device_kind": kind, "condition": label, "n_pairs": len(seeds),
                         "tokens_per_s": float(a.loc[seeds].mean()),
                         "baseline_tokens_per_s": float(b.loc[seeds].mean()), "change": float(change.mean()),
                         "ci_low": float(low), "ci_high": float(high), "n_slower": int((change < 0).sum())})
    columns = ["device_kind", "condition", "n_pairs", "tokens_per_s", "baseline_tokens_per_s", "change", "ci_low",
               "ci_high", "n_slower"]
    return pd.DataFrame(rows, columns=columns)


def _speed_span(row) -> str:
    """A change in speed's 95% interval in words: as slowdowns when the whole interval is a slowdown (so that
    "slower" never sits beside negative numbers), else as signed percentages."""
    if row.ci_high < 0:
        return f"(95% interval {abs(100 * row.ci_high):.1f}% to {abs(100 * row.ci_low):.1f}% slower)"
    return f"(95% interval {signed(100 * row.ci_low, 1)}% to {signed(100 * row.ci_high, 1)}%)"


def speed_sentence(speeds: pd.DataFrame, mask: str = "−∞ mask", other: str = "renormalize",
                   kinds: tuple[str, ...] = ("gpu", "cpu")) -> str:
    """What the runs say about the mask's cost in speed, in one or two sentences chosen from ``speeds``
    (:func:`speed_changes`): on each kind of device where the ``mask`` row's interval excludes a slowdown of zero,
    whether ``other`` (also a mask) shared it. A cost is said to belong to one implementation only when the
    ``other`` mask's interval includes zero or lies entirely above the ``mask``'s. ``kinds``: the kinds of device
    to speak of, in order ("gpu", "cpu")."""
    def pct(x):
        return f"{abs(100 * x):.1f}%"

    parts = []
    words = {"gpu": "a GPU", "cpu": "a CPU"}
    for kind in kinds:
        word = words.get(kind, kind)
        if not len(speeds):
            continue
        rows = speeds[speeds.device_kind == kind].set_index("condition")
        if mask not in rows.index:
            continue
        m = rows.loc[mask]
        span = _speed_span(m)
        if m.ci_high < 0:
            text = f"On {word} the {mask} trained {pct(m.change)} slower than no mask {span}"
            if other in rows.index:
                o = rows.loc[other]
                said = f"{other[0].upper()}{other[1:]}, which masks too,"
                if o.ci_low <= 0 <= o.ci_high:
                    text += (f". {said} changed speed by {signed(100 * o.change, 1)}% {_speed_span(o)}, a change "
                             "not resolved: the cost belongs to one implementation of the mask, not to masking")
                elif o.ci_low > m.ci_high:
                    text += (f". {said} was only {pct(o.change)} slower {_speed_span(o)}: most of the cost "
                             "belongs to one implementation of the mask, not to masking")
                else:
                    text += f". {said} was about as slow: {signed(100 * o.change, 1)}% {_speed_span(o)}"
        elif m.ci_low > 0:
            text = f"On {word} the {mask} trained {pct(m.change)} faster than no mask {span}"
        else:
            text = f"On {word} the {mask}'s change in speed, {signed(100 * m.change, 1)}% {span}, is not resolved"
        parts.append(text + ".")
    return " ".join(parts) if parts else "No pair of runs measured the mask's speed."


def ahead_text(n_ahead: int, n_pairs: int) -> str:
    """How often the masked model of a pair of runs (same seed, masked and unmasked) came out ahead, in words for
    chapter 5's prose: "the masked model came out ahead in 14 of 20 pairs of runs". Reads well at the edges: no
    pair, none ahead, all ahead, one pair.

    Raises:
        ValueError: ``n_ahead`` is negative or above ``n_pairs``.
    """
    if not 0 <= n_ahead <= max(n_pairs, 0):
        raise ValueError(f"n_ahead must be between 0 and n_pairs ({n_pairs}), got {n_ahead}")
    if n_pairs <= 0:
        return "no pair of runs has been made yet"
    if n_pairs == 1:
        return ("the masked model came out ahead in the one pair of runs" if n_ahead else
                "the masked model did not come out ahead in the one pair of runs")
    if n_ahead == 0:
        return f"the masked model came out ahead in none of {n_pairs} pairs of runs"
    if n_ahead == n_pairs:
        return f"the masked model came out ahead in all {n_pairs} pairs of runs"
    return f"the masked model came out ahead in {n_ahead} of {n_pairs} pairs of runs"


def plot_paired(runs: pd.DataFrame, table: pd.DataFrame, labels: dict | None = None):
    """Chapter 5's paired-runs figure: one row per row of ``table`` (from :func:`answer_table`), a dot per seed for
    the paired test-accuracy difference against the row's baseline on the row's kind of device, and the mean with
    its 95% interval, all in points. ``runs``: the runs of :func:`runs_by_kind` (``condition``, ``device_kind``,
    ``seed``, ``test_accuracy``). ``labels``: arm name -> the row's label (default the arm's name). Returns the
    figure."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len(table)))
    for row, t in enumerate(table.itertuples()):
        d = paired_differences(runs, t)
        ax.scatter(d, row + np.linspace(-0.15, 0.15, len(d)), s=18, color="C0", alpha=0.8)
        if np.isfinite(t.mean_diff):
            low, high = 100 * (t.mean_diff - t.ci_low), 100 * (t.ci_high - t.mean_diff)
            ax.errorbar(100 * t.mean_diff, row, xerr=[[low], [high]], fmt="o", color="black", capsize=3)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_yticks(range(len(table)), [(labels or {}).get(t.arm, t.arm) for t in table.itertuples()])
    ax.invert_yaxis()
    ax.set_xlabel("test accuracy minus the baseline's, same seed (points)")
    fig.tight_layout()
    return fig


def bucketing_text(bucketing, bucketing_masked, mask_bucketed, pad_random: float, pad_bucketed: float) -> str:
    """Chapter 5's explanation of what bucketing does, chosen from three rows of :func:`answer_table`: bucketing
    without a mask (``bucketing``), bucketing with the −∞ mask (``bucketing_masked``: with a packed encoder the pads
    then play no part, so only the make-up of the batches changes) and the mask under bucketed batches
    (``mask_bucketed``); ``pad_random`` and ``pad_bucketed`` are the shares of pads in the training batches
    (fractions).

    Raises:
        ValueError: a padding share is outside [0, 1].
    """
    for name, x in (("pad_random", pad_random), ("pad_bucketed", pad_bucketed)):
        if not 0 <= x <= 1:
            raise ValueError(f"{name} must be a share between 0 and 1, got {x}")
    parts = [f"Bucketing does two things. It cuts the pads from {pad_random:.0%} to {pad_bucketed:.0%} of the "
             "training tokens, and it puts reviews of similar length in one batch."]
    masked = getattr(bucketing_masked, "verdict", "not yet answered")
    if masked in ("no difference resolved", CORRECTED):
        parts.append("With the mask and a packed encoder the pads play no part, so only the second can act there: "
                     f"bucketing {effect_text(bucketing_masked, 'accuracy')}.")
    elif masked in ("higher", "lower"):
        parts.append("With the mask and a packed encoder the pads play no part, yet bucketing "
                     f"{effect_text(bucketing_masked, 'accuracy')}: the make-up of the batches matters by itself.")
    if masked != "not yet answered":
        parts.append("The runs do not separate how much of bucketing's gain comes from each.")
    parts.append(bucketing_robustness_text(bucketing, detail=True))
    return " ".join(parts)


def bucketing_robustness_text(bucketing, detail: bool = False, box: bool = False) -> str:
    """Whether a model trained on bucketed batches without a mask learned to ignore the pads, chosen from the
    ``bucketing`` row of :func:`answer_table` (bucketed against random batches, no mask, paired on one kind of
    device): its attention mass on pads (``pad_mass_condition`` against ``pad_mass_baseline``) and its flip rate,
    the share of test predictions that change between no padding and padding to the training maximum
    (``flip_in_condition`` against ``flip_in_baseline``), all fractions. ``detail``: also give the pad mass and the
    random-batch model's numbers (chapter 5's results section); without it, one sentence (the conclusions).
    ``box``: the shortest form, for the answer box. A condition's pad mass is the mean over all its runs on the
    table's device (:func:`answer_table`), so the random-batch model's here equals the one the rest of the page
    quotes. Bucketing never replaces the mask: it removes pads from the batches, not from the model.

    Raises:
        ValueError: a pad mass or flip rate outside [0, 1].
    """
    names = ("pad_mass_condition", "pad_mass_baseline", "flip_in_condition", "flip_in_baseline")
    values = {k: float(getattr(bucketing, k, np.nan)) if bucketing is not None else np.nan for k in names}
    for k, x in values.items():
        if np.isfinite(x) and not 0 <= x <= 1:
            raise ValueError(f"{k} must be a share between 0 and 1, got {x}")
    pm_b, pm_r, fl_b, fl_r = (values[k] for k in names)
    if box:
        if np.isfinite(fl_b) and np.isfinite(fl_r) and fl_b > fl_r:
            many = f"{fl_b / fl_r:.0f} times as many" if fl_r > 0 and fl_b / fl_r >= 2 else "more"
            return (f"A model trained on bucketed batches without a mask changed {many} predictions when "
                    "padded, so bucketing does not replace the mask.")
        return "Bucketing does not replace the mask: a model served with other batches meets the pads again."
    if not (np.isfinite(fl_b) and np.isfinite(fl_r)):
        return ("The runs did not measure how a model trained on bucketed batches reacts to padding. Bucketing "
                "removes pads from the batches, not from the model, so it does not replace the mask.")
    if fl_b > fl_r:
        times = f", {fl_b / fl_r:.0f} times as often as" if fl_r > 0 and fl_b / fl_r >= 2 else ", more often than"
        if not detail:
            return (f"A model trained on bucketed batches without a mask did not learn to ignore the pads: "
                    f"padding changed {share_or_none(fl_b, 2)} of its predictions{times} the random-batch model's, "
                    "so bucketing does not replace the mask.")
        said = ["A model trained on bucketed batches without a mask does not learn to ignore the pads."]
        if np.isfinite(pm_b) and np.isfinite(pm_r):
            than = "more than" if pm_b > pm_r else "less than" if pm_b < pm_r else "as much as"
            said.append(f"It gave the pads {pm_b:.1%} of its attention, {than} the {pm_r:.1%} of the unmasked "
                        "model trained on random batches.")
        said.append(f"Padding a review to the training maximum changed {share_or_none(fl_b, 2)} of its "
                    f"predictions, against {share_or_none(fl_r, 2)}. Bucketing keeps the pads out of the training "
                    "batches, not out of the model, so it does not replace the mask.")
        return " ".join(said)
    return (f"Padding a review to the training maximum changed {share_or_none(fl_b, 2)} of the predictions of a "
            f"model trained on bucketed batches without a mask, against {share_or_none(fl_r, 2)} with random "
            "batches. Bucketing still does not replace the mask: it removes pads from the batches, and a model "
            "served with other batches meets them again.")


def flip_gain_text(flip: float, gain: float, box: bool = False, repeat: bool = False) -> str:
    """What the unmasked model's flip rate (``flip``, the share of test predictions that change between no padding
    and padding to the training maximum, a fraction) says about where the mask's gain in test accuracy (``gain``, a
    fraction: 0.003 is 0.3 points) comes from, chosen by comparing the two. A prediction that padding changes can
    move accuracy by one prediction at most, so the pads at test time can explain at most ``flip`` of the gain.
    ``box``: one short sentence, for the answer box. ``repeat``: the flip rate and gain come from a repeat of the
    comparison on another kind of device (the headline's runs did not measure flips), which the sentence says.

    Raises:
        ValueError: ``flip`` outside [0, 1].
    """
    if repeat and np.isfinite(flip):
        text = flip_gain_text(flip, gain, box=box)
        return ("In a repeat of these runs, p" if box else "In a repeat of these runs on another device, p") + text[1:]
    if not np.isfinite(flip):
        return "The runs did not measure how often padding changed a prediction."
    if not 0 <= flip <= 1:
        raise ValueError(f"flip must be a share between 0 and 1, got {flip}")
    if box:
        said = f"Padding changed {share_or_none(flip, 2)} of the unmasked model's predictions"
        if not np.isfinite(gain) or gain <= 0:
            return said + "."
        if flip < gain / 2:
            return said + ", so the gain probably comes mostly from training."
        return said + (", part of the gain." if flip < gain else ", enough to explain the gain.")
    said = (f"Padding a review to the training maximum changed {share_or_none(flip, 2)} of the unmasked model's "
            "predictions")
    if not np.isfinite(gain) or gain <= 0:
        return said + "."
    if flip < gain / 2:
        return (said + ", which can account for at most a small part of the mask's gain in accuracy. So the gain "
                "probably comes mostly from training without the pads, not from the pads at test time.")
    if flip < gain:
        return said + ", which can account for part of the mask's gain in accuracy, but not all of it."
    return said + ", enough to account for the whole of the mask's gain in accuracy."


def repeat_on_other_device(frame: pd.DataFrame, central):
    """The central comparison (the first of :data:`ARMS`) run again on the other kind of device than the row ``central``
    of :func:`answer_table` used: its :func:`answer_table` row, or ``None`` when ``frame`` (runs with a
    ``device_kind`` column) holds no paired run there."""
    if central is None or not len(frame):
        return None
    other = frame[frame.device_kind != central.device_kind]
    if not len(other):
        return None
    row = answer_table(other, ARMS[:1]).iloc[0]
    return row if int(row.n_pairs) > 0 else None


def paired_differences(runs: pd.DataFrame, row) -> pd.Series:
    """The paired differences in test accuracy (points, indexed by seed) behind one row of :func:`answer_table`:
    ``row.condition`` minus ``row.baseline``, same seed, on ``row.device_kind`` (``runs`` as from
    :func:`runs_by_kind`). One dot per seed of chapter 5's paired figure."""
    on = runs[runs.device_kind == row.device_kind]
    a = on[on.condition == row.condition].set_index("seed").test_accuracy
    b = on[on.condition == row.baseline].set_index("seed").test_accuracy
    return 100 * (a - b).dropna()


def renormalize_nan_gap(dtype: str = "float32", max_gap: int = 400) -> int:
    """The smallest whole-number gap between a pad's score and a real token's at which renormalizing after the
    softmax gives NaN in ``dtype`` (one real token, one pad; :func:`renormalize_underflow`); ``-1`` if none up to
    ``max_gap``."""
    table = renormalize_underflow(gaps=range(1, max_gap + 1), dtypes=(dtype,))
    failed = table.index[table[f"renormalize, {dtype}"].isna()]
    return int(failed.min()) if len(failed) else -1
