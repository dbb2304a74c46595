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
