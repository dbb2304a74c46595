"""The book's one plot style (and its table display), and token-labelled attention heatmaps.

Every chapter calls :func:`use_book_style` once; every attention heatmap goes through :func:`attention_heatmap`,
so its axes are labelled with the tokens (or positions) that the weights belong to.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import torch

__all__ = ["use_book_style", "attention_heatmap", "BOOK_STYLE", "TABLE_OPTIONS"]

#: rcParams shared by every figure in the book.
BOOK_STYLE = {
    "figure.figsize": (6.0, 3.6),
    "figure.dpi": 110,
    "savefig.dpi": 110,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 10,
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "image.cmap": "viridis",
    "svg.hashsalt": "attnbook",
}


#: pandas display options for the book's tables: no entry of a configuration or a sample translation is cut to
#: "..." (pandas cuts cells at 50 characters and hides columns past 20 by default).
TABLE_OPTIONS = {"display.max_colwidth": 200, "display.max_columns": 40}


def use_book_style() -> None:
    """Apply :data:`BOOK_STYLE` to matplotlib's global rcParams and :data:`TABLE_OPTIONS` to pandas' display
    options (idempotent)."""
    import pandas as pd

    mpl.rcParams.update(BOOK_STYLE)
    for option, value in TABLE_OPTIONS.items():
        pd.set_option(option, value)


def attention_heatmap(
    weights: torch.Tensor | np.ndarray,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    *,
    ax: plt.Axes | None = None,
    xlabel: str = "keys",
    ylabel: str = "queries",
    title: str | None = None,
    annotate: bool = False,
    vmin: float | None = 0.0,
    vmax: float | None = None,
    colorbar: bool = True,
    colorbar_label: str = "attention weight",
) -> plt.Axes:
    """Draw attention weights ``(n_queries, n_keys)`` as a heatmap whose ticks are the tokens.

    Args:
        weights: 2-D array or tensor, rows = queries, columns = keys.
        x_labels: one label per key (column); ``None`` = positions ``0..n_keys-1``.
        y_labels: one label per query (row); ``None`` = positions ``0..n_queries-1``.
        ax: axes to draw on; ``None`` = a new figure.
        xlabel, ylabel, title: axis labels and title.
        annotate: write each weight in its cell (for small matrices).
        vmin, vmax: colour limits; ``vmax=None`` = the largest weight.
        colorbar: add a colour bar beside the axes. Every heatmap in the book has one; leave it on.
        colorbar_label: the colour bar's label, e.g. ``"score / its maximum"`` for weights that are not attention.

    Returns:
        The axes.

    Raises:
        ValueError: ``weights`` is not 2-D, a label list does not match its axis (sizes in the message), or
            ``colorbar_label`` is empty while ``colorbar`` is on.
    """
    w = weights.detach().cpu().float().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (n_queries, n_keys), got shape {w.shape}")
    n_q, n_k = w.shape
    x_labels = [str(i) for i in range(n_k)] if x_labels is None else [str(t) for t in x_labels]
    y_labels = [str(i) for i in range(n_q)] if y_labels is None else [str(t) for t in y_labels]
    if len(x_labels) != n_k:
        raise ValueError(f"{len(x_labels)} x_labels for {n_k} keys (weights shape {w.shape})")
    if len(y_labels) != n_q:
        raise ValueError(f"{len(y_labels)} y_labels for {n_q} queries (weights shape {w.shape})")
    if colorbar and not str(colorbar_label).strip():
        raise ValueError(f"colorbar_label must name what the colours show, got {colorbar_label!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(3.0, 0.45 * n_k + 1.5), max(2.2, 0.4 * n_q + 1.0)))
    image = ax.imshow(w, aspect="auto", vmin=vmin, vmax=vmax, cmap="viridis", interpolation="nearest")
    ax.grid(False)
    ax.set_xticks(range(n_k), x_labels, rotation=90 if max(map(len, x_labels), default=0) > 3 else 0)
    ax.set_yticks(range(n_q), y_labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if annotate:
        top = np.nanmax(w) if w.size else 1.0
        for i in range(n_q):
            for j in range(n_k):
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if w[i, j] > 0.6 * top else "white")
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label=colorbar_label, fraction=0.046, pad=0.04)
    return ax


# ------------------------------------------------------------------------------------ chapter 1 and chapter 2 figures
def word_weight_bars(panels: dict, *, top: int = 3, figsize: tuple[float, float] = (9, 6.5)) -> plt.Figure:
    """Attention weight per word of one or more texts as horizontal bars, side by side, words in reading order
    from the top; the ``top`` largest weights of each text darker, and a dotted line at the uniform weight ``1/n``
    (what mean pooling would give each word).

    Args:
        panels: ``{title: table}`` with ``table`` a DataFrame with columns ``token`` (str) and ``weight`` (float),
            as :func:`attnbook.demo_classifier.word_weights` returns; one panel per entry, in order.
        top: how many of each text's largest weights are drawn darker (``>= 0``).

    Returns:
        The figure.

    Raises:
        ValueError: ``panels`` is empty, a table lacks a column or is empty, or ``top < 0``.

    Chapter 1, section "A trained model reads a review" (Fig. ``fig-review-weights``).
    """
    if not panels:
        raise ValueError("panels must hold at least one {title: table}")
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    for title, table in panels.items():
        missing = {"token", "weight"} - set(table.columns)
        if missing or len(table) == 0:
            raise ValueError(f"panel {title!r} needs a non-empty table with columns token and weight; "
                             f"missing {sorted(missing)}, {len(table)} rows")
    fig, axes = plt.subplots(1, len(panels), figsize=figsize, constrained_layout=True, squeeze=False)
    for ax, (title, table) in zip(axes[0], panels.items()):
        largest = set(table["weight"].nlargest(top).index) if top else set()
        colours = ["C0" if i in largest else "#9ecae1" for i in table.index]
        ax.barh(range(len(table)), table["weight"], color=colours)
        ax.axvline(1 / len(table), color="grey", linestyle=":")
        ax.set_yticks(range(len(table)), table["token"])
        ax.invert_yaxis()
        ax.set_xlabel("attention weight $\\alpha_t$")
        ax.set_title(title)
    return fig


def mass_and_prediction(sweep, *, figsize: tuple[float, float] = (8, 3.2)) -> plt.Figure:
    """Two panels against the number of pads: the attention mass on the real tokens, and the probability that a
    fixed head assigns with and without the mask (a dotted line at 0.5).

    Args:
        sweep: DataFrame with columns ``pads``, ``mass m``, ``p(masked)`` and ``p(unmasked)``.

    Raises:
        ValueError: a column is missing.

    Chapter 1, section "What padding does when it is not masked" (Fig. ``fig-mass-vs-padding``).
    """
    missing = {"pads", "mass m", "p(masked)", "p(unmasked)"} - set(sweep.columns)
    if missing:
        raise ValueError(f"sweep lacks the columns {sorted(missing)}")
    fig, (ax_m, ax_p) = plt.subplots(1, 2, figsize=figsize)
    ax_m.plot(sweep["pads"], sweep["mass m"], marker=".")
    ax_m.set_xlabel("number of pad tokens $P$")
    ax_m.set_ylabel("attention mass on real tokens $m$")
    ax_p.plot(sweep["pads"], sweep["p(masked)"], label="masked")
    ax_p.plot(sweep["pads"], sweep["p(unmasked)"], label="unmasked")
    ax_p.axhline(0.5, color="grey", linestyle=":")
    ax_p.set_xlabel("number of pad tokens $P$")
    ax_p.set_ylabel("predicted probability")
    ax_p.legend(loc="upper right", bbox_to_anchor=(1.0, 0.8))
    fig.tight_layout()
    return fig


def thin_tick_labels(ax: plt.Axes, n: int = 8) -> plt.Axes:
    """Keep about ``n`` of a heatmap's tick labels on each axis (every k-th), so that they stay readable; x labels
    are turned upright. Returns ``ax``. Raises ValueError for ``n < 1``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for axis in (ax.xaxis, ax.yaxis):
        ticks, labels = axis.get_ticklocs(), [t.get_text() for t in axis.get_ticklabels()]
        step = max(1, -(-len(ticks) // n))
        axis.set_ticks(ticks[::step], labels[::step])
    ax.tick_params(axis="x", labelrotation=90)
    return ax


def bandwidth_sweep_grid(fits: dict, x_train, y_train, x_test, y_truth, *, tick_labels: int = 5,
                         ylim: tuple[float, float] = (-1.5, 5.5)) -> plt.Figure:
    """A column per bandwidth: the attention matrix on top (queries = test inputs, keys = training inputs, each
    panel with its own colour scale), the fit below with the training data and the true function (dashed).

    Args:
        fits: ``{h: (fit (n_test,), weights (n_test, n_train))}`` as ``nadaraya_watson(..., return_weights=True)``
            returns them, one column per entry in order.
        x_train, y_train: training inputs (sorted) and labels, ``(n_train,)``.
        x_test, y_truth: test inputs and the true function there, ``(n_test,)``.

    Raises:
        ValueError: ``fits`` is empty.

    Chapter 2, section "Choosing the bandwidth" (Fig. ``fig-kr-sweep``).
    """
    if not fits:
        raise ValueError("fits must hold at least one bandwidth")
    train_labels = [f"{float(v):.2f}" for v in x_train]
    test_labels = [f"{float(v):.2f}" for v in x_test]
    fig, axes = plt.subplots(2, len(fits), figsize=(3 * len(fits), 6.2), squeeze=False,
                             gridspec_kw={"height_ratios": [1.2, 1]})
    for col, (h, (fit, w)) in enumerate(fits.items()):
        ax = axes[0, col]
        attention_heatmap(w, train_labels, test_labels, ax=ax, title=f"h = {h:g}", xlabel="training input (key)",
                          ylabel="test input (query)" if col == 0 else "")
        thin_tick_labels(ax, n=tick_labels)
        ax = axes[1, col]
        ax.scatter(x_train, y_train, s=8, color="0.6")
        ax.plot(x_test, y_truth, "k--", lw=1)
        ax.plot(x_test, fit, color="C0")
        ax.set(xlabel="$x$", ylabel="$y$" if col == 0 else "", ylim=ylim)
    fig.tight_layout()
    return fig


def kernel_shapes_and_fits(kernels: dict, x_train, y_train, x_test, y_truth, *, sd: float) -> plt.Figure:
    """Left: each kernel's weight profile over the distance to the query, scaled to unit area; right: its fit.

    Args:
        kernels: ``{name: (log_kernel, radius, h, fit)}``: ``log_kernel`` and ``radius`` as in
            :data:`attnbook.kernels.KERNELS`, ``h`` the bandwidth used, ``fit`` the predictions at ``x_test``.
        x_train, y_train, x_test, y_truth: the data and the true function at ``x_test``, 1-D.
        sd: the common standard deviation (in x) of the kernels; the profiles are drawn over ``±2.5 sd``.

    Raises:
        ValueError: ``kernels`` is empty or ``sd <= 0``.

    Chapter 2, section "Four kernels" (Fig. ``fig-kr-kernels``).
    """
    if not kernels:
        raise ValueError("kernels must hold at least one kernel")
    if not sd > 0:
        raise ValueError(f"sd must be positive, got {sd}")
    fig, (ax_k, ax_f) = plt.subplots(1, 2, figsize=(10, 3.8))
    d = torch.linspace(-2.5 * sd, 2.5 * sd, 801, dtype=torch.float64)
    for name, (log_kernel, radius, h, fit) in kernels.items():
        k = torch.exp(log_kernel(d.abs() / h)) * (d.abs() / h < radius)
        ax_k.plot(d, k / torch.trapezoid(k, d), label=name)
        ax_f.plot(x_test, fit, label=name)
    ax_k.set(xlabel="distance to the query, $x - x_i$", ylabel="kernel weight (unit area)", title="kernel shapes")
    ax_f.scatter(x_train, y_train, s=12, color="0.5", label="training data")
    ax_f.plot(x_test, y_truth, "k--", label="truth $f(x)$")
    ax_f.set(xlabel="$x$", ylabel="$y$", title="Nadaraya–Watson fits")
    ax_k.legend()
    ax_f.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def engel_fits_and_cv(income, food, fits: dict, sweep, best, h_reference: float) -> plt.Figure:
    """Engel's data: left, food expenditure against income (log axis) with a fit per bandwidth; right, the
    leave-one-out CV error against the bandwidth, its minimum marked, and a reference bandwidth as a vertical line.

    Args:
        income, food: the households' income and food expenditure (francs), 1-D.
        fits: ``{h: (income_grid, prediction)}``, one line per entry (dotted, solid, dashed, ...).
        sweep: DataFrame with columns ``bandwidth`` and ``loo_mse`` (:func:`attnbook.kernels.bandwidth_sweep`).
        best: the row of ``sweep`` at the CV minimum.
        h_reference: the bandwidth statsmodels chose, drawn as a vertical line.

    Raises:
        ValueError: ``fits`` is empty.

    Chapter 2, section "A real data set: Engel's food expenditure" (Fig. ``fig-kr-engel``).
    """
    if not fits:
        raise ValueError("fits must hold at least one bandwidth")
    fig, (ax_fit, ax_cv) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_fit.scatter(income, food, s=8, color="0.6", label="households")
    for (h, (grid, prediction)), style in zip(fits.items(), [":", "-", "--", "-."] * len(fits)):
        ax_fit.plot(grid, prediction, style, label=f"h = {h:.3f}")
    ax_fit.set(xscale="log", xlabel="annual income (Belgian francs, log axis)", ylabel="food expenditure (francs)")
    ax_fit.set_xticks([400, 600, 1000, 2000, 4000], ["400", "600", "1000", "2000", "4000"])
    ax_fit.xaxis.set_minor_formatter(plt.NullFormatter())
    ax_fit.legend(fontsize=8)
    ax_cv.plot(sweep["bandwidth"], sweep["loo_mse"])
    ax_cv.plot(best["bandwidth"], best["loo_mse"], "o", color="C0")
    ax_cv.axvline(h_reference, color="0.4", lw=1, label="statsmodels cv_ls")
    ax_cv.set(xscale="log", xlabel="bandwidth $h$ (log income)", ylabel="leave-one-out MSE (francs²)")
    ax_cv.legend(fontsize=8)
    fig.tight_layout()
    return fig


__all__ += ["word_weight_bars", "mass_and_prediction", "thin_tick_labels", "bandwidth_sweep_grid",
            "kernel_shapes_and_fits", "engel_fits_and_cv"]



# ----------------------------------------------------------------------------------------------- chapter 9's benchmark
#: The implementations of chapter 9's long-sequence benchmark, in the order its figure and table show them.
LONG_BENCH_METHODS = ("torch SDPA", "attnbook explicit", "blockwise", "blockwise + checkpoint")


def _length_ticks(ax: plt.Axes, lengths: Sequence[int]) -> None:
    """Log-scaled x axis with one plain label per length (512, 1k, 2k, ...), and no minor labels to overlap."""
    ax.set_xscale("log")
    ax.set_xticks(list(lengths), [f"{n // 1024}k" if n >= 1024 else str(n) for n in lengths])
    ax.xaxis.set_minor_formatter(mpl.ticker.NullFormatter())
    ax.xaxis.set_minor_locator(mpl.ticker.NullLocator())


def long_attention_figure(bench, *, figsize: tuple[float, float] = (10, 3.4)) -> plt.Figure:
    """Chapter 9's Fig. 9.1 from the benchmark's table (``benchmarks/bench_long_attention.py``: columns ``method``,
    ``L``, ``mem_fwd_mib``, ``mem_fwd_bwd_mib``, ``score_matrix_mib``, ``forward_ratio``, ``backward_ratio``):
    memory added in the forward pass and in forward + backward (log-log, with one fp32 score matrix dotted), and
    time relative to torch's SDPA. Cells that were not measured (NaN) are left out of the lines. Chapter 9, section
    "Memory and time as the length grows"."""
    lengths = sorted(bench.L.unique())
    fig, axes = plt.subplots(1, 3, figsize=figsize, constrained_layout=True)
    for ax, col, title in ((axes[0], "mem_fwd_mib", "memory, forward"),
                           (axes[1], "mem_fwd_bwd_mib", "memory, forward + backward")):
        for i, method in enumerate(LONG_BENCH_METHODS):
            part = bench[bench.method == method].dropna(subset=[col])
            ax.plot(part.L, part[col], marker="o", color=f"C{i}", label=method)
        one = bench.drop_duplicates("L")
        ax.plot(one.L, one.score_matrix_mib, ":", color="grey", label="one score matrix")
        ax.set(yscale="log", xlabel="length L", ylabel="MiB added", title=title)
        _length_ticks(ax, lengths)
    axes[0].legend(fontsize=7)
    for i, method in enumerate(LONG_BENCH_METHODS[1:], start=1):      # the same colour as in the memory panels
        part = bench[bench.method == method].dropna(subset=["forward_ratio"])
        axes[2].plot(part.L, part.forward_ratio, marker="o", color=f"C{i}", label=method)
        axes[2].plot(part.L, part.backward_ratio, "--", marker="x", color=f"C{i}")
    axes[2].axhline(1, color="grey", lw=0.8)
    axes[2].set(xlabel="length L", ylabel="time / SDPA's time", title="time (solid: forward, dashed: backward)")
    _length_ticks(axes[2], sorted(bench.dropna(subset=["forward_ratio"]).L.unique()))
    axes[2].legend(fontsize=7)
    return fig


def long_attention_memory_table(bench, max_gib: float) -> "pd.DataFrame":
    """Chapter 9's memory table: MiB added by one call, per length and implementation, forward and forward +
    backward, with every cell the benchmark did not measure said in words instead of NaN: ``"as blockwise"`` for
    the checkpointed forward pass (the same computation: the checkpoint only changes the backward pass) and
    ``"over {max_gib} GiB"`` for a pass whose estimated memory exceeds the benchmark's limit (it was not run).

    Raises:
        ValueError: a NaN cell that neither reason explains (the table would otherwise hide a missing measurement).
    """
    import pandas as pd

    passes = {"mem_fwd_mib": "forward", "mem_fwd_bwd_mib": "forward + backward"}
    columns = pd.MultiIndex.from_product([list(passes.values()), LONG_BENCH_METHODS])
    table = pd.DataFrame(index=sorted(bench.L.unique()), columns=columns, dtype=object)
    table.index.name = "L"
    for _, row in bench[bench.method.isin(LONG_BENCH_METHODS)].iterrows():
        for col, name in passes.items():
            value = row[col]
            if np.isfinite(value):
                text = f"{value:,.1f}"
            elif row.method == "blockwise + checkpoint" and col == "mem_fwd_mib":
                text = "as blockwise"
            elif "skipped" in str(row.get("note", "")):
                text = f"over {max_gib:g} GiB"
            else:
                raise ValueError(f"{row.method} at L={row.L}: {name} was not measured, for no reason the "
                                 f"benchmark records (note {row.get('note')!r})")
            table.loc[row.L, (name, row.method)] = text
    return table


__all__ += ["LONG_BENCH_METHODS", "long_attention_figure", "long_attention_memory_table"]


# ------------------------------------------------------------------------------------------------ chapter 6 figure
def pad_sum_figure(table, labels, *, reference: int, figsize: tuple[float, float] = (10, 3.2)) -> plt.Figure:
    """Two panels against the padded length (both sentences padded, no masks): left, the probability of each label
    for one pair; right, the norms of the premise sum's real part and pad part and of the hypothesis sum's pad part.
    A dotted line marks the training length ``reference``.

    Args:
        table: from :func:`attnbook.experiments.nli.pad_sums` (rows with ``side == "both"`` are drawn).
        labels: the label columns to draw, e.g. :data:`attnbook.data.nli.LABELS`.

    Raises:
        ValueError: ``table`` has no ``side == "both"`` rows or lacks a label column.

    Chapter 6, section "The masking ablation" (Fig. ``fig-nli-pad-sum``).
    """
    both = table[table["side"] == "both"] if "side" in table else table.iloc[:0]
    missing = [label for label in labels if label not in table]
    if len(both) == 0 or missing:
        raise ValueError(f"table needs rows with side 'both' and the label columns; missing {missing}")
    fig, (ax_p, ax_n) = plt.subplots(1, 2, figsize=figsize)
    for label in labels:
        ax_p.plot(both["pad_to"], both[label], marker=".", label=label)
    ax_p.set(xlabel="padded length (tokens)", ylabel="predicted probability", ylim=(0, 1),
             title="the pair's prediction")
    ax_p.legend(fontsize=8)
    for column, name, style in (("v1_real", "premise sum, real tokens", "-"),
                                ("v1_pads", "premise sum, pads", "--"),
                                ("v2_pads", "hypothesis sum, pads", ":")):
        ax_n.plot(both["pad_to"], both[column], style, marker=".", label=name)
    ax_n.set(xlabel="padded length (tokens)", ylabel="norm of the part", title="the sums that H reads")
    ax_n.legend(fontsize=8)
    for ax in (ax_p, ax_n):
        ax.axvline(reference, color="0.5", linestyle=":", linewidth=1)
    fig.tight_layout()
    return fig


__all__ += ["pad_sum_figure"]
