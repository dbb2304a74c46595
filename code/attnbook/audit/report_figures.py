"""Figures and tables of chapter 10 ("Padding bugs in the wild"): the padded batch, the audit's differences with
their NaN and error points, and the root-cause words of the registry's failures (the sweep over transformers'
architectures words its own: :mod:`attnbook.audit.transformers_sweep`).

Needs matplotlib (the book's extra), imported when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = ["padded_batch_figure", "differences_figure", "point_kind", "root_cause_table", "root_cause_sentence",
           "count_word", "side_sentence", "ROOT_WORDS", "SIDE_WORDS"]


def _positions(n: int, length: int, side: str, from_mask: bool) -> list[int | None]:
    """Each cell's position id (None for a pad), as the model would see it."""
    start = 0 if side == "right" else length - n
    if not from_mask:
        return [j if start <= j < start + n else None for j in range(length)]
    return [j - start if start <= j < start + n else None for j in range(length)]


def padded_batch_figure(lengths: Sequence[int] = (5, 3, 2), length: int = 6, tokens: Sequence[str] | None = None):
    """Three views of one batch: right padding; left padding with index positions (0..L-1, the pads counted); left
    padding with positions counted from the mask. Each cell shows its token and the position id the model sees.

    Args:
        lengths: real lengths of the rows, each in ``[0, length]``.
        length: the padded length ``L``.
        tokens: labels for the tokens (default: "w1", "w2", ...), at least ``max(lengths)`` of them.

    Returns:
        The matplotlib figure (chapter 10, section "Why padding bugs happen").

    Raises:
        ValueError: a length outside ``[0, length]``, or too few token labels.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if any(not 0 <= n <= length for n in lengths):
        raise ValueError(f"lengths must lie in [0, length] = [0, {length}], got {list(lengths)}")
    tokens = list(tokens) if tokens is not None else [f"w{i + 1}" for i in range(max(lengths, default=0))]
    if len(tokens) < max(lengths, default=0):
        raise ValueError(f"tokens must hold at least max(lengths) = {max(lengths)} labels, got {len(tokens)}")
    views = [("right padding", "right", False), ("left padding, positions 0..L-1", "left", False),
             ("left padding, positions from the mask", "left", True)]
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 0.55 * len(lengths) + 1.1))
    for ax, (title, side, from_mask) in zip(axes, views):
        for i, n in enumerate(lengths):
            positions = _positions(n, length, side, from_mask)
            alone = list(range(n))
            k = 0
            for j, p in enumerate(positions):
                y = len(lengths) - 1 - i
                if p is None:
                    ax.add_patch(Rectangle((j, y), 0.94, 0.9, color="0.88"))
                    ax.text(j + 0.47, y + 0.45, "pad", ha="center", va="center", fontsize=7, color="0.45")
                    continue
                shifted = p != alone[k]
                ax.add_patch(Rectangle((j, y), 0.94, 0.9, color="#f4b6b6" if shifted else "#b9d3ee"))
                ax.text(j + 0.47, y + 0.58, tokens[k], ha="center", va="center", fontsize=8)
                ax.text(j + 0.47, y + 0.22, f"pos {p}", ha="center", va="center", fontsize=6.5,
                        color="C3" if shifted else "0.25")
                k += 1
        ax.set_xlim(0, length)
        ax.set_ylim(0, len(lengths))
        ax.set_title(title, fontsize=9)
        ax.set_xticks([j + 0.47 for j in range(length)], [str(j) for j in range(length)], fontsize=7)
        ax.set_yticks([])
        ax.set_xlabel("index in the row", fontsize=8)
        for spine in ax.spines.values():
            spine.set_visible(False)
    fig.tight_layout()
    return fig


def point_kind(row: pd.Series) -> str:
    """``"pass"``, ``"fail"`` (finite difference), ``"NaN"`` (a non-finite output) or ``"error"`` (the forward
    raised) for one row of the audit's table."""
    if bool(row["passed"]):
        return "pass"
    detail = str(row.get("detail", ""))
    if "forward raised" in detail:
        return "error"
    value = row.get("max_rel_diff", math.nan)
    if "NaN or infinite" in detail or not (isinstance(value, float) and math.isfinite(value)):
        return "NaN"
    return "fail"


def differences_figure(results: pd.DataFrame, checks: Sequence[str], rtol: float = 1e-5):
    """Every subject's largest relative difference per check (``max_rel_diff``, log scale), passes and failures,
    with the NaN and error points in two columns of their own at the right (their difference is not a number).

    Args:
        results: rows of the audit (columns ``check``, ``passed``, ``max_rel_diff``, ``detail``).
        checks: the checks to draw, one row of the figure each, in order.
        rtol: the default relative tolerance, drawn as a dashed line.

    Returns:
        The matplotlib figure (chapter 10, Fig. 10.1).

    Raises:
        ValueError: ``checks`` is empty or none of them is in ``results``.
    """
    import matplotlib.pyplot as plt

    rows = results[results["check"].isin(checks)].copy()
    if not len(checks) or rows.empty:
        raise ValueError(f"none of the checks {list(checks)} is in the results")
    rows["kind"] = rows.apply(point_kind, axis=1)
    fig, (ax, side) = plt.subplots(1, 2, figsize=(8, 0.5 * len(checks) + 1.6), sharey=True,
                                   gridspec_kw={"width_ratios": [5, 1], "wspace": 0.05})
    style = {"pass": ("o", "C0"), "fail": ("o", "C3"), "NaN": ("X", "C3"), "error": ("s", "0.3")}
    seen = set()
    for y, check in enumerate(checks):
        sel = rows[rows["check"] == check]
        jitter = np.linspace(-0.25, 0.25, max(len(sel), 2))[: len(sel)]
        for (kind, value), dy in zip(zip(sel["kind"], sel["max_rel_diff"]), jitter):
            marker, colour = style[kind]
            label = kind if kind not in seen else None
            seen.add(kind)
            if kind in ("pass", "fail"):
                ax.scatter(max(float(value), 1e-12), y + dy, s=16, marker=marker, color=colour, label=label)
            else:
                side.scatter(0 if kind == "NaN" else 1, y + dy, s=22, marker=marker, color=colour, label=label)
    ax.axvline(rtol, color="0.3", ls="--", lw=1)
    ax.text(rtol, len(checks) - 0.45, " default tolerance", fontsize=7, color="0.3", va="bottom")
    ax.set_xscale("log")
    ax.set_yticks(range(len(checks)), list(checks))
    ax.set_ylim(-0.6, len(checks) - 0.2)
    ax.set_xlabel("largest |difference| / largest |reference| (0 drawn at $10^{-12}$)")
    side.set_xlim(-0.6, 1.6)
    side.set_xticks([0, 1], ["NaN", "error"])
    side.set_xlabel("no number")
    handles = [h for a in (ax, side) for h in a.get_legend_handles_labels()[0]]
    labels = [lab for a in (ax, side) for lab in a.get_legend_handles_labels()[1]]
    side.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.05, 1), fontsize=8)
    return fig


# --- the chapter's sentences, worded by code ------------------------------------------------------------------------

#: Short words for the registry's root causes (:data:`attnbook.audit.subjects.ROOT_CAUSES`); a cause without an
#: entry falls back to its summary there.
ROOT_WORDS = {
    "left-padding-positions": "left padding without position_ids",
    "empty-row-nan": "NaN for a row with no real token (the weights path)",
    "fastpath-empty-row-nan": "NaN for a row with no real token (the fused fast path)",
    "fastpath-causal-nan": "NaN that reaches real tokens (the fused fast path, a causal mask, left padding)",
    "cpu-autocast-fastpath": "an error of the fast path under CPU autocast",
    "fp16-fill-overflow": "NaN in fp16 for a row with no real token: d2l's fill constant overflows (fp32 gives "
                          "uniform weights)",
}
#: Whose side each category of root cause is on, as the chapter words it.
SIDE_WORDS = {"caller": "the caller's requirement", "contract": "a contract choice",
              "library": "library behaviour"}


def root_cause_table(by_root: pd.DataFrame) -> pd.DataFrame:
    """The headline table: one row per root cause outside the book's own models, each counted once: ``whose side``,
    ``root cause``, ``configurations`` (how many show it) and ``checks`` (how many checks it fails).

    Args:
        by_root: :func:`attnbook.audit.subjects.by_root_cause` (columns ``category, root_cause, summary, subjects,
            checks``).

    Raises:
        ValueError: a category that :data:`SIDE_WORDS` does not know (an unexplained failure is never hidden).
    """
    rows = by_root[by_root["category"] != "book"]
    unknown = sorted(set(rows["category"]) - set(SIDE_WORDS))
    if unknown:
        raise ValueError(f"failures without a known root cause: categories {unknown}")
    return pd.DataFrame({"whose side": rows["category"].map(SIDE_WORDS).to_numpy(),
                         "root cause": [ROOT_WORDS.get(r, s) for r, s in zip(rows["root_cause"], rows["summary"])],
                         "configurations": rows["subjects"].astype(int).to_numpy(),
                         "checks": rows["checks"].astype(int).to_numpy()})


_NUMBER_WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def count_word(n: int) -> str:
    """``n`` as a word from zero to nine ("no" for zero), as digits from ten."""
    return _NUMBER_WORDS[n] if 0 <= n < len(_NUMBER_WORDS) else str(n)


def root_cause_sentence(table: pd.DataFrame) -> str:
    """One sentence on :func:`root_cause_table`: how many root causes, and how many on each side.

    ``"No configuration failed a check."`` for an empty table; otherwise, e.g. "Their failures have five root
    causes, each counted once: one is the caller's requirement, one a contract choice, and three are
    library behaviour."
    """
    if table.empty:
        return "No configuration failed a check."
    counts = [(side, int((table["whose side"] == side).sum())) for side in SIDE_WORDS.values()]
    counts = [(side, k) for side, k in counts if k]
    n = len(table)
    parts = []
    for j, (side, k) in enumerate(counts):
        verb = ("is" if k == 1 else "are") if j == 0 or j == len(counts) - 1 else ""
        parts.append(f"{count_word(k)} {verb} {side}".replace("  ", " "))
    if n == 1:
        return f"Their failures have one root cause: {counts[0][0]}."
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]
    return f"Their failures have {count_word(n)} root causes, each counted once: {body}."


def side_sentence(explained: pd.DataFrame) -> str:
    """The answer's count by side: how many configurations show a library's own behaviour (from how many root
    causes), leave out the caller's requirement, or get NaN for a row without tokens (a contract choice).

    Args:
        explained: :func:`attnbook.audit.subjects.explain` of the configurations counted (columns ``subject``,
            ``category``, ``root_cause``).

    Raises:
        ValueError: a failure without a known root cause (category ``"unexplained"``).
    """
    if (explained["category"] == "unexplained").any():
        raise ValueError("a failure has no known root cause; explain it before counting sides")

    def configurations(category: str) -> tuple[int, int]:
        rows = explained[explained["category"] == category]
        return rows["subject"].nunique(), rows["root_cause"].nunique()

    library, roots = configurations("library")
    caller, _ = configurations("caller")
    contract, _ = configurations("contract")
    if library == 0:
        first = "None shows a library's own behaviour"
    else:
        first = (f"{count_word(library).capitalize()} {'shows' if library == 1 else 'show'} a library's own "
                 f"behaviour ({count_word(roots)} root cause{'' if roots == 1 else 's'})")
    def who(n: int) -> str:
        return "none" if n == 0 else count_word(n)

    second = f"{who(caller)} {'leave' if caller > 1 else 'leaves'} out what the library asks of the caller"
    third = (f"{who(contract)} {'get' if contract > 1 else 'gets'} NaN for a row without tokens"
             + (": a contract choice, not a bug" if contract else ""))
    return f"{first}; {second}, and {third}."
