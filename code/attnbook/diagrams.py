"""Architecture diagrams of the book's models, drawn from code with matplotlib (no graphviz, no image files).

One function per diagram, each returning a :class:`matplotlib.figure.Figure` (not registered with pyplot, so
nothing is shown or kept open behind the caller's back):

- :func:`soft_lookup`: one query against five keys, one of them a masked pad (chapter 1, "From hard lookup to soft
  lookup"; :mod:`attnbook.masking`);
- :func:`encoder_decoder_bottleneck`: one fixed context against a context per decoder step (chapter 4);
- :func:`bahdanau_luong_steps`: one decoder step of Bahdanau et al. (2015) beside one of Luong et al. (2015)
  (chapter 4; :class:`attnbook.seq2seq.AttentionDecoder`);
- :func:`han_pooling`: HAN attention pooling over a padded batch (Yang et al. 2016; chapter 5;
  :class:`attnbook.pooling.AttentionPooling`, :class:`attnbook.models.BiGRUClassifier`);
- :func:`decomposable_attention`: attend, compare, aggregate with both sides masked (Parikh et al. 2016; chapter 6;
  :class:`attnbook.nli.DecomposableAttention`);
- :func:`glimpse_captioner`: the digit captioner with soft and hard attention (Xu et al. 2015; chapter 7;
  :class:`attnbook.hard_attention.DigitCaptioner`);
- :func:`transformer_block`: an encoder layer and a decoder layer with their masks (Vaswani et al. 2017; chapter 8;
  :class:`attnbook.transformer.TransformerEncoderLayer`, :class:`~attnbook.transformer.TransformerDecoderLayer`).

Every diagram is drawn on an opaque, light, rounded panel, so it reads the same in the website's light and dark
modes, in the book's style (:data:`attnbook.plotting.BOOK_STYLE`). :func:`to_svg` renders a figure to SVG bytes that
are identical from run to run (fixed ``svg.hashsalt``, no date). In a notebook::

    from IPython.display import SVG
    from attnbook.diagrams import soft_lookup, to_svg
    SVG(to_svg(soft_lookup()))

Masks in the pictures follow the book's convention: True (1) = the position takes part, False (0) = a pad.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib as mpl
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import ArrowStyle, FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.path import Path

from .masking import masked_softmax
from .plotting import BOOK_STYLE

__all__ = ["soft_lookup", "encoder_decoder_bottleneck", "bahdanau_luong_steps", "han_pooling",
           "decomposable_attention", "glimpse_captioner",
           "transformer_block", "to_svg", "DIAGRAMS"]

# ----------------------------------------------------------------------------------------------- palette
#: Inches per drawing unit: every diagram is laid out on a grid of units, 16 units = 7.2 in = the page width.
UNIT = 0.45
INK = "#262626"
MUTED = "#6e6e6e"
PANEL_FACE = "#fbfaf6"
PANEL_EDGE = "#d4d0c4"
MASK_RED = "#b8332f"
#: (face, edge) colours of each kind of box; the edges are the book's default matplotlib colours (C0, C1, C2, C4).
ROLES = {
    "query": ("#dce9f5", "#1f77b4"),
    "key": ("#fde5cc", "#d46a00"),
    "value": ("#d8efd8", "#2a8a2a"),
    "state": ("#ebe4f4", "#7b5aa6"),
    "op": ("#ffffff", INK),
    "output": ("#f7dddc", MASK_RED),
    "pad": ("#ececec", "#9b9b9b"),
}
WEIGHT_BLUE = "#1f77b4"
FONT = 9.5
SMALL = 8.0
PAD_SIZE = 6.5


# ----------------------------------------------------------------------------------------------- primitives
@dataclass(frozen=True)
class Box:
    """A drawn box: centre ``(x, y)``, width ``w`` and height ``h`` in drawing units, and its patch."""

    x: float
    y: float
    w: float
    h: float
    patch: FancyBboxPatch

    def at(self, fx: float, fy: float) -> tuple[float, float]:
        """The point at fractions ``fx, fy`` in [-1, 1] of the half-width and half-height from the centre."""
        return (self.x + fx * self.w / 2, self.y + fy * self.h / 2)

    @property
    def left(self) -> tuple[float, float]:
        return self.at(-1, 0)

    @property
    def right(self) -> tuple[float, float]:
        return self.at(1, 0)

    @property
    def top(self) -> tuple[float, float]:
        return self.at(0, 1)

    @property
    def bottom(self) -> tuple[float, float]:
        return self.at(0, -1)


class _Drawing:
    """A figure of ``width x height`` drawing units on a light rounded panel, with box, arrow and row helpers."""

    def __init__(self, width: float, height: float) -> None:
        self.width, self.height = width, height
        self.fig = Figure(figsize=(width * UNIT, height * UNIT))
        self.fig.patch.set_alpha(0.0)
        self.ax = self.fig.add_axes((0, 0, 1, 1))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(0, height)
        self.ax.set_axis_off()
        self.ax.patch.set_alpha(0.0)
        self.ax.add_patch(FancyBboxPatch((0.08, 0.08), width - 0.16, height - 0.16,
                                         boxstyle="round,pad=0,rounding_size=0.35", facecolor=PANEL_FACE,
                                         edgecolor=PANEL_EDGE, linewidth=0.8, zorder=0))

    def text(self, x: float, y: float, s: str, *, size: float = FONT, color: str = INK, ha: str = "center",
             va: str = "center", **kwargs):
        return self.ax.text(x, y, s, fontsize=size, color=color, ha=ha, va=va, zorder=5, **kwargs)

    def box(self, x: float, y: float, w: float, h: float, text: str = "", *, role: str = "op", size: float = FONT,
            pad: bool = False) -> Box:
        """A rounded box of a :data:`ROLES` kind centred at ``(x, y)``; ``pad=True`` draws a hatched grey pad."""
        face, edge = ROLES["pad" if pad else role]
        patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.12",
                               facecolor=face, edgecolor=edge, linewidth=1.0, zorder=3, hatch="////" if pad else None)
        if pad:
            patch.set_hatch_linewidth(0.5)
        self.ax.add_patch(patch)
        if text:
            self.text(x, y, text, size=size, color=MUTED if pad else INK)
        return Box(x, y, w, h, patch)

    def arrow(self, start: Box | tuple[float, float], end: Box | tuple[float, float], *, color: str = INK,
              lw: float = 1.0, rad: float = 0.0, dashed: bool = False, head: bool = True) -> FancyArrowPatch:
        """A straight (``rad=0``) or curved arrow; a :class:`Box` end is met at its border."""
        pos = [(b.x, b.y) if isinstance(b, Box) else b for b in (start, end)]
        arrow = FancyArrowPatch(pos[0], pos[1], patchA=start.patch if isinstance(start, Box) else None,
                                patchB=end.patch if isinstance(end, Box) else None, shrinkA=1.0, shrinkB=1.0,
                                arrowstyle=self._style(head), mutation_scale=10, connectionstyle=f"arc3,rad={rad}",
                                color=color, linewidth=lw, linestyle=(0, (3, 2)) if dashed else "-", zorder=2)
        self.ax.add_patch(arrow)
        return arrow

    def route(self, points: Sequence[tuple[float, float]], *, color: str = INK, lw: float = 1.0,
              dashed: bool = False, head: bool = True) -> FancyArrowPatch:
        """An arrow along a polyline through ``points`` (for elbows); the head is at the last point."""
        arrow = FancyArrowPatch(path=Path(list(points)), arrowstyle=self._style(head), mutation_scale=10,
                                color=color, linewidth=lw, linestyle=(0, (3, 2)) if dashed else "-", zorder=2,
                                shrinkA=0.0, shrinkB=1.0, joinstyle="miter")
        self.ax.add_patch(arrow)
        return arrow

    @staticmethod
    def _style(head: bool) -> ArrowStyle:
        return ArrowStyle("-|>", head_length=0.55, head_width=0.28) if head else ArrowStyle("-")

    def row(self, labels: Sequence[str], x0: float, y0: float, *, w: float, h: float, step: float, role: str,
            n_real: int | None = None, size: float = FONT, down: bool = False) -> list[Box]:
        """A row of boxes centred at ``(x0, y0), (x0 + step, y0), ...`` (or a column going down from ``(x0, y0)``
        if ``down``); the positions from ``n_real`` on are pads."""
        n_real = len(labels) if n_real is None else n_real
        at = (lambda k: (x0, y0 - k * step)) if down else (lambda k: (x0 + k * step, y0))
        return [self.box(*at(k), w, h, label, role=role, pad=k >= n_real, size=PAD_SIZE if k >= n_real else size)
                for k, label in enumerate(labels)]

    def weight_bar(self, x: float, y: float, weight: float, *, scale: float, thickness: float,
                   vertical: bool = True, masked: bool = False, color: str = WEIGHT_BLUE, size: float = SMALL) -> None:
        """A weight drawn as a bar from the base point ``(x, y)``, up (``vertical``) or to the right, of length
        ``scale * weight``, with the weight written at its end; a masked weight is a red stub labelled 0."""
        length = 0.0 if masked else scale * weight
        if vertical:
            rect = Rectangle((x - thickness / 2, y), thickness, length, facecolor=color, edgecolor="none", zorder=3)
            stub = ([x - thickness / 2, x + thickness / 2], [y, y])
            label_at, align = (x, y + length + 0.08), dict(ha="center", va="bottom")
        else:
            rect = Rectangle((x, y - thickness / 2), length, thickness, facecolor=color, edgecolor="none", zorder=3)
            stub = ([x, x], [y - thickness / 2, y + thickness / 2])
            label_at, align = (x + length + 0.12, y), dict(ha="left", va="center")
        self.ax.add_patch(rect)
        if masked:
            self.ax.plot(*stub, color=MASK_RED, lw=1.8, zorder=4, solid_capstyle="butt")
        self.text(*label_at, "0" if masked else f"{weight:.2f}", size=size, color=MASK_RED if masked else INK,
                  **align)


def to_svg(fig: Figure) -> bytes:
    """``fig`` as SVG bytes, the same bytes on every run: text as paths, fixed hash salt, no date or creator.

    The whole figure is written (no ``bbox_inches="tight"``: a diagram's panel fills its figure, and a tight box
    would draw the figure twice).

    Args:
        fig: any matplotlib figure (a diagram of this module, or the logo of ``tools/make_logo.py``).
    """
    buffer = io.BytesIO()
    with mpl.rc_context({"svg.hashsalt": BOOK_STYLE["svg.hashsalt"], "svg.fonttype": "path"}):
        fig.savefig(buffer, format="svg", bbox_inches=None, metadata={"Date": None, "Creator": None})
    return buffer.getvalue()


def _softmax(scores: Sequence[float], mask: Sequence[bool]) -> np.ndarray:
    """The weights a picture shows: the book's :func:`attnbook.masking.masked_softmax` of a few scores (``mask``:
    True = takes part; the pads get exactly 0)."""
    return masked_softmax(torch.tensor(scores, dtype=torch.float64), torch.tensor(mask)).numpy()


# ----------------------------------------------------------------------------------------------- diagrams
def soft_lookup() -> Figure:
    """Soft lookup: a query ``q`` scores keys ``k_1..k_5``, a masked softmax turns the scores into weights
    ``alpha_i``, and the output is ``sum_i alpha_i v_i``; ``k_5`` is a pad (mask False), so its weight is 0.

    The line widths into the output are proportional to the weights. Chapter 1, sections "From hard lookup to soft
    lookup" and "The padding question"; Murphy (2023), PML 15.4.

    Returns:
        The figure (7.2 x 3.7 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 8.2)
        scores = [1.2, 0.1, 2.0, -0.5, 0.8]
        mask = [True, True, True, True, False]
        weights = _softmax(scores, mask)
        ys = [6.1 - 1.1 * i for i in range(5)]
        header_y = 7.55
        for x, label in [(1.0, "query"), (3.25, "keys"), (5.3, "scores\n$a(q, k_i)$"),
                         (7.1, "mask\nTrue = takes part"), (10.3, "weights $\\alpha_i$"), (12.7, "values"),
                         (14.85, "output")]:
            d.text(x, header_y, label, size=SMALL, color=MUTED)
        q = d.box(1.0, ys[2], 1.1, 0.8, "$q$", role="query", size=12)
        softmax = d.box(8.8, ys[2], 0.62, ys[0] - ys[4] + 0.7, "", role="op")
        d.text(8.8, ys[2], "softmax", rotation=90, size=FONT)
        out = d.box(14.85, ys[2], 1.75, 1.25, "$o = \\sum_i \\alpha_i v_i$", role="output", size=FONT)
        for i, (y, s, m, a) in enumerate(zip(ys, scores, mask, weights)):
            pad = not m
            key = d.box(3.25, y, 1.5, 0.7, f"$k_{i + 1}$" + (" <pad>" if pad else ""), role="key", pad=pad)
            d.arrow(q, key, color=MUTED, lw=0.8)
            d.text(5.3, y, f"$s_{i + 1}$ = {s:.1f}", color=MUTED if pad else INK)
            d.arrow((4.0, y), (4.6, y), color=MUTED, lw=0.8)
            d.text(7.1, y, "False: $-\\infty$" if pad else "True", color=MASK_RED if pad else INK)
            d.arrow((7.95, y), (softmax.x - softmax.w / 2, y), color=MUTED, lw=0.8)
            d.arrow((softmax.x + softmax.w / 2, y), (9.45, y), color=MUTED, lw=0.8)
            d.weight_bar(9.5, y, a, scale=2.2, thickness=0.44, vertical=False, masked=pad)
            value = d.box(12.7, y, 1.1, 0.7, f"$v_{i + 1}$", role="value", pad=pad)
            if pad:
                d.arrow(value, out, color=ROLES["pad"][1], lw=0.8, dashed=True, head=False)
            else:
                d.arrow(value, out, color=ROLES["value"][1], lw=0.6 + 6.0 * a)
        d.text(8.0, 0.5, "The pad's score is set to $-\\infty$ before the softmax: its weight is exactly 0, and the "
                         "real keys' weights sum to 1.", size=SMALL, color=MASK_RED)
        return d.fig


def encoder_decoder_bottleneck() -> Figure:
    """The bottleneck of an encoder-decoder, and how attention removes it.

    Left: without attention the encoder's states ``h_1..h_4`` feed only the last one, ``c = h_n``, a vector of fixed
    size that every decoder state ``s_t`` reads (Cho et al. 2014; Sutskever et al. 2014). Right: with attention
    each decoder step reads its own context ``c_t = sum_i alpha_ti h_i`` over all encoder states, the line widths
    drawn from a softmax of fixed scores that favour the aligned source position (Bahdanau et al. 2015). Chapter 4,
    section "The encoder-decoder bottleneck" (eqs. eq-fixed-context and eq-dynamic-context).

    Returns:
        The figure (7.2 x 3.7 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 8.2)
        d.ax.plot([8.0, 8.0], [0.35, 7.85], color=PANEL_EDGE, lw=0.8, zorder=1)
        for ox, title in ((0.0, "without attention: one fixed vector"),
                          (8.0, "with attention: a new context at every step")):
            d.text(ox + 4.0, 7.45, title, size=10)
            states = d.row([f"$h_{i}$" for i in range(1, 5)], ox + 1.6, 1.3, w=0.8, h=0.6, step=1.6, role="key")
            for a, b in zip(states, states[1:]):
                d.arrow(a, b, color=MUTED, lw=0.8)
            d.text(ox + 4.0, 0.6, "encoder states (one per source word)", size=SMALL, color=MUTED)
            decoder = d.row([f"$s_{t}$" for t in range(1, 4)], ox + 2.0, 6.1, w=0.8, h=0.6, step=2.0, role="state")
            for a, b in zip(decoder, decoder[1:]):
                d.arrow(a, b, color=MUTED, lw=0.8)
            d.text(ox + 6.85, 6.1, "decoder", size=SMALL, color=MUTED, ha="left")
            if ox == 0.0:
                context = d.box(ox + 4.0, 3.7, 1.7, 0.7, "$c = h_n$", role="output")
                d.arrow(states[-1], context, color=ROLES["value"][1], lw=1.2)
                d.text(ox + 1.6, 3.7, "fixed size,\nany length", size=SMALL, color=MASK_RED)
                for s in decoder:
                    d.arrow(context, s, color=ROLES["value"][1], lw=1.0)
            else:
                for t, s in enumerate(decoder):
                    c_t = d.box(s.x, 3.9, 0.8, 0.6, f"$c_{t + 1}$", role="value")
                    weights = _softmax([-1.5 * abs(i - 1.5 * t) for i in range(4)], [True] * 4)
                    for h, a in zip(states, weights):
                        d.arrow(h.top, c_t.bottom, color=ROLES["value"][1], lw=0.3 + 3.0 * a, head=False)
                    d.arrow(c_t, s, color=ROLES["value"][1], lw=1.2)
                d.text(ox + 3.0, 5.0, "$c_t = \\sum_i \\alpha_{ti} h_i$", size=SMALL, color=ROLES["value"][1])
        return d.fig


def _encoder_attention(d: _Drawing, ox: float, query: Box, score_text: str) -> Box:
    """The attention part shared by both decoder steps of :func:`bahdanau_luong_steps`, in the panel starting at
    ``ox``: encoder states (one pad) -> scores against ``query`` -> masked softmax -> context ``c_t`` (returned)."""
    states = d.row(["$h_1$", "$h_2$", "$h_3$", "$h_4$", "<pad>"], ox + 3.75, 1.0, w=0.7, h=0.6, step=0.8,
                   role="key", n_real=4)
    d.text(ox + 5.35, 0.42, "encoder states $h_i$ (keys and values)", size=SMALL, color=MUTED)
    score = d.box(ox + 5.2, 4.0, 4.4, 0.95, score_text, role="op", size=FONT)
    for state in states:
        pad = state.patch.get_hatch() is not None
        d.arrow(state.top, (state.x, score.y - score.h / 2), color=ROLES["pad"][1] if pad else MUTED, lw=0.8,
                dashed=pad)
    d.arrow(query, score, color=ROLES["query"][1], lw=1.2)
    d.text((query.x + query.w / 2 + score.x - score.w / 2) / 2, 4.3, "query", size=SMALL,
           color=ROLES["query"][1])
    softmax = d.box(ox + 5.2, 5.3, 4.4, 0.6, "$\\alpha_{ti} = \\mathrm{softmax}_i(e_{ti})$, pad $\\to 0$", role="op",
                    size=SMALL)
    d.arrow(score, softmax)
    context = d.box(ox + 5.2, 6.6, 2.4, 0.7, "$c_t = \\sum_i \\alpha_{ti} h_i$", role="value")
    d.arrow(softmax, context)
    last = states[-1]
    d.route([last.right, (ox + 7.65, 1.0), (ox + 7.65, 6.6), context.right], color=ROLES["value"][1], lw=0.9)
    d.text(ox + 7.82, 3.0, "values", size=SMALL, color=ROLES["value"][1], rotation=90)
    return context


def bahdanau_luong_steps() -> Figure:
    """One decoder step of Bahdanau attention (left) beside one of Luong attention (right).

    Bahdanau et al. (2015, eqs. 4-6 and appendix A): the previous state ``s_{t-1}`` is the query, the additive score
    ``e_ti = v_a^T tanh(W_a s_{t-1} + U_a h_i)`` gives the weights, and the context ``c_t`` enters the GRU that makes
    ``s_t``. Luong et al. (2015, eqs. 5, 7, 8 and section 3.3): the GRU first makes ``h_t`` from
    ``[e(y_{t-1}); h~_{t-1}]`` (input feeding), ``h_t`` is the query (dot or general score), and
    ``h~_t = tanh(W_c [c_t; h_t])`` gives the output and is fed to the next step. The encoder's pad gets weight 0.
    As :class:`attnbook.seq2seq.AttentionDecoder` (``style="bahdanau"`` / ``"luong"``); chapter 4, sections "Bahdanau
    attention" and "Luong attention and attention_layer_size".

    Returns:
        The figure (7.2 x 5.0 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 11.1)
        d.ax.plot([8.0, 8.0], [0.35, 10.75], color=PANEL_EDGE, lw=0.8, zorder=1)
        # Bahdanau: attend with s_{t-1}, then update the GRU with c_t.
        ox = 0.0
        d.text(ox + 4.0, 10.45, "Bahdanau et al. (2015): attend, then update", size=10)
        s_prev = d.box(ox + 1.3, 4.0, 1.2, 0.7, "$s_{t-1}$", role="query")
        context = _encoder_attention(d, ox, s_prev,
                                     "additive score\n$e_{ti} = v_a^\\top \\tanh(W_a s_{t-1} + U_a h_i)$")
        gru = d.box(ox + 3.6, 8.0, 2.8, 0.75, "GRU", role="state")
        embed = d.box(ox + 2.6, 6.6, 1.25, 0.65, "$e(y_{t-1})$", role="op")
        d.arrow(embed.top, (embed.x, gru.y - gru.h / 2))
        d.arrow(context.at(-0.5, 1), (context.at(-0.5, 1)[0], gru.y - gru.h / 2), color=ROLES["value"][1], lw=1.2)
        d.route([s_prev.top, (s_prev.x, gru.y), gru.left], color=ROLES["query"][1], lw=1.0)
        out = d.box(ox + 3.6, 9.35, 3.6, 0.65, "$p(y_t) = \\mathrm{softmax}(W_o s_t)$", role="output")
        d.arrow(gru, out)
        d.text(gru.x + 0.25, (gru.y + out.y) / 2, "$s_t$", size=SMALL, ha="left")
        d.arrow(gru.right, (ox + 7.6, gru.y), dashed=True, color=ROLES["query"][1])
        d.text(ox + 7.7, gru.y + 0.45, "$s_t$: query of step $t+1$", size=SMALL, color=ROLES["query"][1], ha="right")
        # Luong: update the GRU first, attend with h_t, then combine c_t and h_t.
        ox = 8.0
        d.text(ox + 4.0, 10.45, "Luong et al. (2015): update, then attend", size=10)
        h_prev = d.box(ox + 0.65, 1.0, 0.75, 0.6, "$h_{t-1}$", role="state", size=SMALL)
        feed = d.box(ox + 2.15, 1.0, 1.95, 0.6, "$[e(y_{t-1}); \\tilde h_{t-1}]$", role="op", size=SMALL)
        d.text(ox + 1.45, 0.42, "decoder inputs", size=SMALL, color=MUTED)
        gru = d.box(ox + 1.3, 2.5, 1.6, 0.65, "GRU", role="state")
        d.arrow(h_prev, gru)
        d.arrow(feed, gru)
        h_t = d.box(ox + 1.3, 4.0, 1.2, 0.7, "$h_t$", role="query")
        d.arrow(gru, h_t)
        context = _encoder_attention(d, ox, h_t, "$e_{ti} = h_t^\\top h_i$  (dot)\n$e_{ti} = h_t^\\top W_a h_i$  "
                                     "(general)")
        combine = d.box(ox + 3.6, 8.0, 3.0, 0.75, "$\\tilde h_t = \\tanh(W_c [c_t; h_t])$", role="state")
        d.arrow(context.at(-0.5, 1), (context.at(-0.5, 1)[0], combine.y - combine.h / 2), color=ROLES["value"][1],
                lw=1.2)
        d.route([h_t.top, (h_t.x, combine.y), combine.left], color=ROLES["query"][1], lw=1.0)
        out = d.box(ox + 3.6, 9.35, 3.6, 0.65, "$p(y_t) = \\mathrm{softmax}(W_s \\tilde h_t)$", role="output")
        d.arrow(combine, out)
        d.arrow(combine.right, (ox + 7.6, combine.y), dashed=True, color=ROLES["state"][1])
        d.text(ox + 7.7, combine.y + 0.6, "$\\tilde h_t$: input of step $t+1$\n(input feeding)", size=SMALL,
               color=ROLES["state"][1], ha="right")
        return d.fig


def han_pooling() -> Figure:
    """HAN attention pooling over a padded batch of three documents (lengths 5, 3, 2, padded to 5).

    Bottom to top: tokens; BiGRU states ``h_t`` (packed, so the pad states are exactly 0); scores
    ``s_t = u_t^T u_w`` with ``u_t = tanh(W h_t + b)`` (a pad's score is ``tanh(b)^T u_w``, not 0); the mask
    ``m_t`` (1 = True = a real token); the weights ``alpha_t``, a softmax over the real tokens only (pads exactly
    0); the pooled vector ``c = sum_t alpha_t h_t`` (line width = weight); a linear classifier. Yang et al. (2016),
    eqs. 5-7, as :class:`attnbook.pooling.AttentionPooling` with ``masking="neg_inf"`` and
    :class:`attnbook.models.BiGRUClassifier`; chapter 5, sections "Attention pooling" and "Four ways to treat the
    padding".

    Returns:
        The figure (7.2 x 4.6 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 10.3)
        docs = [["a", "fun", "and", "warm", "film"], ["so", "very", "dull"], ["loved", "it"]]
        scores = [[0.2, 1.1, -0.3, 1.4, 0.5], [0.1, 0.4, 1.6], [1.5, 0.3]]
        pad_score = -0.4          # tanh(b) . u_w: the same for every zero state
        T, step, w = 5, 0.8, 0.74
        rows = {"tokens": 1.0, "states": 2.35, "scores": 3.65, "mask": 4.75, "weights": 5.55, "pooled": 8.15,
                "classifier": 9.45}
        for key, label in [("tokens", "tokens\n(padded batch)"), ("states", "BiGRU states $h_t$\n(packed: pads = 0)"),
                           ("scores", "scores $s_t = u_t^\\top u_w$\n$u_t = \\tanh(W h_t + b)$"),
                           ("mask", "mask $m_t$\n(1 = real token)"),
                           ("weights", "weights $\\alpha_t$: softmax\nover the real tokens"),
                           ("pooled", "pooled vector\n$c = \\sum_t \\alpha_t h_t$")]:
            d.text(1.6, rows[key] + (0.35 if key == "weights" else 0.0), label, size=SMALL, color=MUTED)
        pooled = []
        for b, (tokens, s) in enumerate(zip(docs, scores)):
            x0, n = 3.2 + b * 4.3, len(tokens)
            mask = [k < n for k in range(T)]
            weights = _softmax(s + [pad_score] * (T - n), mask)
            d.row(tokens + ["<pad>"] * (T - n), x0, rows["tokens"], w=w, h=0.55, step=step, role="key", n_real=n,
                  size=SMALL)
            states = d.row([f"$h_{k + 1}$" for k in range(n)] + ["0"] * (T - n), x0, rows["states"], w=w, h=0.55,
                           step=step, role="state", n_real=n, size=SMALL)
            c = d.box(x0 + 2 * step, rows["pooled"], 1.5, 0.6, f"$c^{{({b + 1})}}$", role="value")
            pooled.append(c)
            for k, state in enumerate(states):
                real = k < n
                if real:
                    d.arrow((state.x, rows["tokens"] + 0.28), state.bottom, color=MUTED, lw=0.8)
                score = s[k] if real else pad_score
                d.text(state.x, rows["scores"], f"{score:.1f}", size=SMALL, color=INK if real else MUTED)
                d.arrow(state.top, (state.x, rows["scores"] - 0.22), color=MUTED if real else ROLES["pad"][1], lw=0.8,
                        dashed=not real)
                d.text(state.x, rows["mask"], "1" if real else "0", size=FONT, color=INK if real else MASK_RED)
                d.weight_bar(state.x, rows["weights"], weights[k], scale=1.5, thickness=0.42, masked=not real)
                if real:
                    d.arrow((state.x, rows["weights"] + 1.5 * weights[k] + 0.42), c, color=ROLES["value"][1],
                            lw=0.5 + 3.0 * weights[k], head=False)
        d.box(9.6, rows["classifier"], 12.0, 0.6, "linear classifier: one row of logits per document",
                  role="output")
        for c in pooled:
            d.arrow(c, (c.x, rows["classifier"] - 0.3))
        return d.fig


def decomposable_attention() -> Figure:
    """Parikh et al.'s (2016) decomposable attention: attend, compare, aggregate, with both sentences padded.

    The premise ``a`` (5 tokens + 1 pad) and the hypothesis ``b`` (4 tokens + 2 pads) give the score grid
    ``e_ij = F(a_i)^T F(b_j)`` (eq. 1); a pair takes part only if both tokens are real (hatched: masked). Each row's
    softmax over the real ``b_j`` gives ``beta_i``, each column's softmax over the real ``a_i`` gives ``alpha_j``
    (eq. 2; a pad's own alignment is 0). Compare: ``v_{1,i} = G([a_i; beta_i])``, ``v_{2,j} = G([b_j; alpha_j])``
    (eq. 3). Aggregate: sums over the real tokens only (eq. 4, with the masks ``m^a``, ``m^b``), then
    ``y = H([v_1; v_2])`` (eq. 5). As :class:`attnbook.nli.DecomposableAttention`; chapter 6, sections "The
    decomposable attention model" and "Masking both sides".

    Returns:
        The figure (7.2 x 4.7 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 10.4)
        premise, hypothesis = ["a", "small", "dog", "is", "running"], ["a", "dog", "is", "moving"]
        la, lb = 6, 6
        na, nb = len(premise), len(hypothesis)
        # Scores of the picture: high where the words match (a/a, dog/dog, is/is, running/moving).
        e = np.full((na, nb), 0.15)
        for i, j, v in [(0, 0, 0.8), (2, 1, 1.0), (3, 2, 0.85), (4, 3, 0.7), (1, 1, 0.45), (2, 0, 0.3)]:
            e[i, j] = v
        cw, ch, gx, gtop = 0.8, 0.56, 2.5, 7.9
        cx = [gx + cw / 2 + j * cw for j in range(lb)]
        cy = [gtop - ch / 2 - i * ch for i in range(la)]
        ramp = mpl.colormaps["Blues"]
        for i in range(la):
            for j in range(lb):
                real = i < na and j < nb
                d.ax.add_patch(Rectangle((cx[j] - cw / 2, cy[i] - ch / 2), cw, ch, zorder=3, linewidth=0.6,
                                         facecolor=ramp(0.15 + 0.7 * e[i, j]) if real else ROLES["pad"][0],
                                         edgecolor="white" if real else ROLES["pad"][1],
                                         hatch=None if real else "////"))
        d.text((cx[0] + cx[-1]) / 2, 9.95, "1  attend:  $e_{ij} = F(a_i)^\\top F(b_j)$,  masked where $a_i$ or $b_j$ "
                                          "is a pad", size=FONT)
        d.row(premise + ["<pad>"] * (la - na), 1.5, cy[0], w=1.3, h=0.46, step=ch, role="key", n_real=na,
              size=SMALL, down=True)
        hyp_boxes = [d.box(x, 8.55, 0.7, 1.1, "", role="key", pad=j >= nb) for j, x in enumerate(cx)]
        for j, (box, word) in enumerate(zip(hyp_boxes, hypothesis + ["<pad>"] * (lb - nb))):
            d.text(box.x, box.y, word, size=SMALL if j < nb else PAD_SIZE, rotation=90,
                   color=INK if j < nb else MUTED)
        d.text(1.5, 8.75, "hypothesis $b_j$", size=SMALL, color=MUTED)
        d.text(1.5, 8.2, "premise $a_i$", size=SMALL, color=MUTED)
        # beta_i (rows) and the premise side of compare and aggregate.
        grid_right, grid_bottom = cx[-1] + cw / 2, cy[-1] - ch / 2
        d.text(8.9, 8.55, "$\\beta_i$: softmax\nover real $b_j$", size=SMALL, color=MUTED)
        d.text(10.95, 8.55, "2  compare\n$v_{1,i} = G([a_i; \\beta_i])$", size=SMALL)
        v1 = d.box(13.3, cy[2] - ch / 2, 2.3, 0.75, "$v_1 = \\sum_i m^a_i v_{1,i}$", role="value")
        d.text(13.3, 8.55, "3  aggregate\nreal tokens only", size=SMALL)
        for i, y in enumerate(cy):
            real = i < na
            d.arrow((grid_right + 0.05, y), (8.4, y), color=MUTED, lw=0.7)
            d.box(8.9, y, 0.95, 0.44, f"$\\beta_{i + 1}$" if real else "0", role="value", pad=not real,
                  size=SMALL)
            d.arrow((9.4, y), (10.2, y), color=MUTED, lw=0.7)
            v = d.box(10.95, y, 1.35, 0.44, f"$v_{{1,{i + 1}}}$", role="state", pad=not real, size=SMALL)
            d.arrow(v, v1, color=ROLES["state"][1] if real else ROLES["pad"][1], lw=0.8, dashed=not real,
                    head=False)
        # alpha_j (columns) and the hypothesis side.
        ya, yv = grid_bottom - 0.85, grid_bottom - 2.05
        d.text(1.5, ya, "$\\alpha_j$: softmax\nover real $a_i$", size=SMALL, color=MUTED)
        d.text(1.5, yv, "2  compare\n$v_{2,j} = G([b_j; \\alpha_j])$", size=SMALL)
        v2 = d.box((cx[0] + cx[-1]) / 2, 0.8, 2.3, 0.75, "$v_2 = \\sum_j m^b_j v_{2,j}$", role="value")
        d.text(1.5, 0.8, "3  aggregate\nreal tokens only", size=SMALL)
        for j, x in enumerate(cx):
            real = j < nb
            d.arrow((x, grid_bottom - 0.05), (x, ya + 0.25), color=MUTED, lw=0.7)
            d.box(x, ya, 0.7, 0.44, f"$\\alpha_{j + 1}$" if real else "0", role="value", pad=not real, size=SMALL)
            d.arrow((x, ya - 0.25), (x, yv + 0.25), color=MUTED, lw=0.7)
            v = d.box(x, yv, 0.7, 0.44, f"$v_{{2,{j + 1}}}$", role="state", pad=not real, size=SMALL)
            d.arrow(v, v2, color=ROLES["state"][1] if real else ROLES["pad"][1], lw=0.8, dashed=not real,
                    head=False)
        head = d.box(13.3, 2.6, 3.4, 1.0, "$\\hat y = H([v_1; v_2])$\nentailment / neutral / contradiction",
                     role="output", size=SMALL)
        d.arrow(v1, head)
        d.route([v2.right, (head.x, v2.y), head.bottom])
        return d.fig


#: Three 8x8 digits (values 0..16) of scikit-learn's ``load_digits()`` (UCI optical digits; indices 3, 1, 4: the
#: first "3", "1" and "4"), copied here so that drawing the captioner needs neither scikit-learn nor its data.
_DIGITS = {
    3: ((0, 0, 7, 15, 13, 1, 0, 0), (0, 8, 13, 6, 15, 4, 0, 0), (0, 2, 1, 13, 13, 0, 0, 0),
        (0, 0, 2, 15, 11, 1, 0, 0), (0, 0, 0, 1, 12, 12, 1, 0), (0, 0, 0, 0, 1, 10, 8, 0),
        (0, 0, 8, 4, 5, 14, 9, 0), (0, 0, 7, 13, 13, 9, 0, 0)),
    1: ((0, 0, 0, 12, 13, 5, 0, 0), (0, 0, 0, 11, 16, 9, 0, 0), (0, 0, 3, 15, 16, 6, 0, 0),
        (0, 7, 15, 16, 16, 2, 0, 0), (0, 0, 1, 16, 16, 3, 0, 0), (0, 0, 1, 16, 16, 6, 0, 0),
        (0, 0, 1, 16, 16, 6, 0, 0), (0, 0, 0, 11, 16, 10, 0, 0)),
    4: ((0, 0, 0, 1, 11, 0, 0, 0), (0, 0, 0, 7, 8, 0, 0, 0), (0, 0, 1, 13, 6, 2, 2, 0),
        (0, 0, 7, 15, 0, 9, 8, 0), (0, 5, 16, 10, 0, 16, 6, 0), (0, 4, 15, 16, 13, 16, 1, 0),
        (0, 0, 0, 3, 15, 10, 0, 0), (0, 0, 0, 2, 16, 4, 0, 0)),
}


def _grid_image(d: _Drawing, image: np.ndarray, extent: tuple[float, float, float, float], grid: tuple[int, int],
                *, overlay: np.ndarray | None = None, pick: tuple[int, int] | None = None) -> None:
    """Draw a grey-scale ``image`` into ``extent`` (left, right, bottom, top) with the lines of a ``grid`` of
    locations over it; ``overlay`` (grid-shaped weights in [0, 1]) tints the cells, ``pick`` outlines one cell."""
    left, right, bottom, top = extent
    d.ax.imshow(image, cmap="gray", vmin=0, vmax=1, extent=extent, interpolation="nearest", zorder=3,
                aspect="auto")
    rows, cols = grid
    cw, ch = (right - left) / cols, (top - bottom) / rows
    if overlay is not None:
        rgba = np.zeros(overlay.shape + (4,))
        rgba[..., :3] = mpl.colors.to_rgb("#ff9f1c")
        rgba[..., 3] = 0.7 * overlay / overlay.max()
        d.ax.imshow(rgba, extent=extent, interpolation="nearest", zorder=4, aspect="auto")
    for c in range(1, cols):
        d.ax.plot([left + c * cw] * 2, [bottom, top], color="#8a8a8a", lw=0.4, zorder=5)
    for r in range(1, rows):
        d.ax.plot([left, right], [bottom + r * ch] * 2, color="#8a8a8a", lw=0.4, zorder=5)
    d.ax.add_patch(Rectangle((left, bottom), right - left, top - bottom, fill=False, edgecolor=INK, lw=0.8,
                             zorder=6))
    if pick is not None:
        r, c = pick
        d.ax.add_patch(Rectangle((left + c * cw, top - (r + 1) * ch), cw, ch, facecolor="#ff9f1c", alpha=0.9,
                                 edgecolor=MASK_RED, lw=1.6, zorder=6))


def glimpse_captioner() -> Figure:
    """The digit captioner of chapter 7 at one decoding step, with soft and hard attention.

    A canvas of 8 x 24 pixels (the digits 3, 1, 4) goes through the CNN encoder (plus two coordinate channels) to a
    4 x 12 grid of ``L = 48`` annotation vectors ``a_i``. At step ``t`` (here: reading the "1"), the additive score
    ``e_ti = w^T tanh(W_q h_{t-1} + W_k a_i)`` and ``alpha_t = softmax(e_t)`` give a distribution over the grid.
    Soft attention reads the expected glimpse ``z_t = sum_i alpha_ti a_i``; hard attention samples one location
    ``s_t ~ Categorical(alpha_t)`` and reads ``z_t = a_{s_t}`` (trained with REINFORCE, or with the
    straight-through Gumbel-softmax). ``h_t = GRU([E y_{t-1}; z_t], h_{t-1})`` and ``softmax(W_o [h_t; z_t])``
    give the next digit. Xu et al. (2015), sections 3-4; :class:`attnbook.hard_attention.DigitCaptioner`; chapter 7,
    section "Digit captioning".

    Returns:
        The figure (7.2 x 4.8 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 10.7)
        canvas = np.concatenate([np.asarray(_DIGITS[k], dtype=float) / 16.0 for k in (3, 1, 4)], axis=1)
        grid = (4, 12)
        rows, cols = np.mgrid[0:4, 0:12]
        alpha = np.exp(-((cols - 5.6) ** 2) / 1.1 - ((rows - 1.6) ** 2) / 2.0)
        alpha /= alpha.sum()
        # Row 1: the encoder.
        top = (8.0, 9.6)
        _grid_image(d, canvas, (0.6, 5.4, *top), grid)
        d.text(3.0, 10.05, "canvas, 8 × 24 pixels", size=SMALL, color=MUTED)
        cnn = d.box(6.95, 8.8, 1.7, 0.85, "CNN\n+ (row, col)", role="op", size=SMALL)
        d.arrow((5.45, 8.8), cnn)
        feats = (8.5, 13.3)
        for r in range(4):
            for c in range(12):
                d.ax.add_patch(Rectangle((feats[0] + c * 0.4 + 0.03, top[0] + r * 0.4 + 0.03), 0.34, 0.34, zorder=3,
                                         facecolor=ROLES["value"][0], edgecolor=ROLES["value"][1], lw=0.6))
        d.arrow(cnn, (feats[0] - 0.05, 8.8))
        d.text(10.9, 10.05, "annotations $a_1, \\ldots, a_L$ (L = 4 × 12)", size=SMALL, color=MUTED)
        d.text(14.7, 8.8, "$h_0 = \\tanh(W_{\\mathrm{init}}\\, \\bar a)$", size=SMALL, color=ROLES["state"][1])
        # Row 2: attention over the grid.
        score = d.box(3.3, 5.9, 5.6, 1.05, "additive score  $e_{ti} = w^\\top \\tanh(W_q h_{t-1} + W_k a_i)$\n"
                                           "$\\alpha_t = \\mathrm{softmax}_i(e_{ti})$ over the L locations",
                      role="op", size=SMALL)
        d.arrow((feats[0] + 0.1, top[0] - 0.05), score.at(0.75, 1), color=ROLES["key"][1], lw=1.0)
        d.text(6.5, 7.6, "keys $a_i$", size=SMALL, color=ROLES["key"][1])
        soft_box, hard_box = (7.3, 10.9, 5.4, 6.6), (11.9, 15.5, 5.4, 6.6)
        _grid_image(d, canvas, soft_box, grid, overlay=alpha)
        _grid_image(d, canvas, hard_box, grid, pick=(2, 5))
        d.arrow(score.right, (soft_box[0] - 0.05, 6.0), lw=1.0)
        d.arrow((soft_box[1] + 0.05, 6.0), (hard_box[0] - 0.05, 6.0), lw=1.0)
        d.text(11.4, 6.3, "sample", size=SMALL, color=MUTED, rotation=90)
        d.text(9.1, 6.95, "soft: weights $\\alpha_t$", size=SMALL)
        d.text(13.7, 6.95, "hard: one location $s_t \\sim \\alpha_t$", size=SMALL)
        d.text(9.1, 4.9, "$\\hat z_t = \\sum_i \\alpha_{ti}\\, a_i$", size=FONT, color=ROLES["value"][1])
        d.text(13.7, 4.9, "$\\hat z_t = a_{s_t}$  (REINFORCE\nor straight-through Gumbel)", size=SMALL,
               color=ROLES["value"][1])
        # Row 3: the decoder step.
        h_prev = d.box(1.2, 2.0, 1.2, 0.7, "$h_{t-1}$", role="query")
        d.arrow(h_prev.top, (h_prev.x, score.y - score.h / 2), color=ROLES["query"][1], lw=1.1)
        d.text(h_prev.x + 0.15, 3.65, "query", size=SMALL, color=ROLES["query"][1], ha="left")
        gru = d.box(8.6, 2.0, 4.4, 0.75, "$h_t = \\mathrm{GRU}([E y_{t-1}; \\hat z_t],\\ h_{t-1})$", role="state",
                    size=SMALL)
        d.arrow(h_prev, gru, color=ROLES["query"][1], lw=1.0)
        y_prev = d.box(4.6, 0.85, 2.2, 0.55, "$y_{t-1}$ (last digit)", role="op", size=SMALL)
        d.route([y_prev.right, (7.2, 0.85), (7.2, gru.y - gru.h / 2)])
        d.arrow((9.1, 4.55), (9.1, gru.y + gru.h / 2), color=ROLES["value"][1], lw=1.2)
        d.route([(13.7, 4.3), (13.7, 3.3), (10.3, 3.3), (10.3, gru.y + gru.h / 2)], color=ROLES["value"][1], lw=1.2)
        out = d.box(13.6, 2.0, 3.5, 0.75, "$\\mathrm{softmax}(W_o [h_t; \\hat z_t]) \\to y_t$", role="output",
                    size=SMALL)
        d.arrow(gru, out)
        d.route([out.bottom, (out.x, 0.85), (11.0, 0.85)], dashed=True, color=MASK_RED)
        d.text(10.9, 0.85, "$y_t$: input of step $t+1$", size=SMALL, color=MASK_RED, ha="right")
        return d.fig


def transformer_block() -> Figure:
    """One encoder layer (left) and one decoder layer (right) of the Transformer, with the masks each attention gets.

    Encoder: embeddings ``sqrt(d) E[token] + PE(position)``; multi-head self-attention (queries, keys and values
    from the same sequence; key padding mask, True = a real token); residual sum and LayerNorm; the position-wise
    feed-forward layer ``W_2 ReLU(W_1 x)``; residual sum and LayerNorm; ``N`` such layers give the memory.
    Decoder: causal self-attention (query ``i`` sees keys ``j <= i``), cross-attention (queries from the decoder,
    keys and values from the memory, with the source padding mask), the feed-forward layer, each followed by a
    residual sum and LayerNorm, and the output layer. Post-LN as drawn (Vaswani et al. 2017, figure 1 and section
    3.1); the note gives pre-LN (Xiong et al. 2020). As :class:`attnbook.transformer.TransformerEncoderLayer` and
    :class:`~attnbook.transformer.TransformerDecoderLayer`; chapter 8, sections "The encoder layer" and "The
    decoder layer".

    Returns:
        The figure (7.2 x 5.2 in).
    """
    with mpl.rc_context(BOOK_STYLE):
        d = _Drawing(16, 11.6)
        d.ax.plot([7.75, 7.75], [2.3, 8.9], color=PANEL_EDGE, lw=0.8, zorder=1)

        def residual(start_y: float, box: Box, x_side: float) -> None:
            d.route([(box.x, start_y), (x_side, start_y), (x_side, box.y), box.left if x_side < box.x else box.right],
                    color=MUTED, lw=0.9)

        # The encoder layer.
        ex, w = 3.9, 4.4
        d.text(ex, 10.95, "encoder layer", size=10)
        src = d.box(ex, 0.95, w, 0.7, "$x = \\sqrt{d}\\, E[\\mathrm{token}] + PE(\\mathrm{pos})$", role="key",
                    size=SMALL)
        attn = d.box(ex, 2.55, w, 0.75, "multi-head self-attention\nqueries, keys, values from $x$", role="query",
                     size=SMALL)
        d.arrow(src, attn)
        norm1 = d.box(ex, 3.85, 2.6, 0.55, "add & LayerNorm", size=SMALL)
        d.arrow(attn, norm1)
        ff = d.box(ex, 5.2, w, 0.75, "feed-forward $W_2\\, \\mathrm{ReLU}(W_1 x)$\nat every position", role="state",
                   size=SMALL)
        d.arrow(norm1, ff)
        norm2 = d.box(ex, 6.5, 2.6, 0.55, "add & LayerNorm", size=SMALL)
        d.arrow(ff, norm2)
        residual(1.8, norm1, ex - w / 2 - 0.35)
        residual(4.45, norm2, ex - w / 2 - 0.35)
        d.text(ex + 0.15, 1.75, "key padding mask (True = real token)", size=SMALL, color=MASK_RED, ha="left")
        d.text(0.55, 4.2, "× N", size=10, color=MUTED, ha="left")
        memory = d.box(ex, 8.1, 2.6, 0.6, "memory", role="value", size=SMALL)
        d.arrow(norm2, memory)
        d.text(ex, 9.6, "post-LN (drawn): $x \\leftarrow \\mathrm{LN}(x + \\mathrm{Sublayer}(x))$\n"
               "pre-LN: $x \\leftarrow x + \\mathrm{Sublayer}(\\mathrm{LN}(x))$", size=SMALL, color=MUTED)
        # The decoder layer.
        dx = 11.7
        d.text(dx, 10.95, "decoder layer", size=10)
        tgt = d.box(dx, 0.95, w, 0.7, "$\\sqrt{d}\\, E[y_{<t}] + PE(\\mathrm{pos})$", role="key", size=SMALL)
        self_attn = d.box(dx, 2.55, w, 0.75, "causal self-attention\nquery $i$ sees keys $j \\leq i$", role="query",
                          size=SMALL)
        d.arrow(tgt, self_attn)
        n1 = d.box(dx, 3.85, 2.6, 0.55, "add & LayerNorm", size=SMALL)
        d.arrow(self_attn, n1)
        cross = d.box(dx, 5.2, w, 0.75, "cross-attention: queries from the\ndecoder, keys and values: memory",
                      role="value", size=SMALL)
        d.arrow(n1, cross)
        n2 = d.box(dx, 6.5, 2.6, 0.55, "add & LayerNorm", size=SMALL)
        d.arrow(cross, n2)
        ff2 = d.box(dx, 7.65, w, 0.6, "feed-forward $W_2\\, \\mathrm{ReLU}(W_1 x)$", role="state", size=SMALL)
        d.arrow(n2, ff2)
        n3 = d.box(dx, 8.75, 2.6, 0.55, "add & LayerNorm", size=SMALL)
        d.arrow(ff2, n3)
        out = d.box(dx, 9.85, w, 0.6, "$p(y_t) = \\mathrm{softmax}(W_o h_t)$", role="output", size=SMALL)
        d.arrow(n3, out)
        side = dx + w / 2 + 0.35
        residual(1.8, n1, side)
        residual(4.45, n2, side)
        residual(7.1, n3, side)
        d.text(15.45, 4.9, "× N", size=10, color=MUTED, ha="right")
        d.route([memory.right, (7.75, 8.1), (7.75, 5.2), cross.left], color=ROLES["value"][1], lw=1.3)
        d.text(8.65, 4.55, "source\npadding mask", size=SMALL, color=MASK_RED)
        d.text(dx - 0.15, 1.75, "causal mask", size=SMALL, color=MASK_RED, ha="right")
        return d.fig


#: The diagram functions by name (for tests and for regenerating all of them).
DIAGRAMS = {f.__name__: f for f in (soft_lookup, encoder_decoder_bottleneck, bahdanau_luong_steps, han_pooling,
                                     decomposable_attention, glimpse_captioner, transformer_block)}
