"""Draw the book's logo and favicon with matplotlib: a row of attention weights whose last position is a masked pad.

Usage: ``python tools/make_logo.py [OUT_DIR]`` writes ``logo.svg`` and ``favicon.ico`` into ``OUT_DIR`` (default: the
book's ``_static/``, which ``_config.yml`` points to: ``logo:`` and ``html: favicon:``). The output is deterministic
(text-free vector paths, a fixed SVG hash salt, no dates; the favicon is drawn at each icon size rather than scaled),
so ``tests/test_diagrams.py`` re-runs this script and checks that the committed files are up to date. Run it again
after changing the drawing, and commit the files.

The motif: blue bars (the weights of the real tokens, the largest one orange: the attended token) and a pad whose
weight is held at zero by a red mask line, the book's theme in one picture. The logo (four tokens and a hatched pad)
has a transparent background and colours that read on the website's light and dark backgrounds alike; the favicon
(three tokens and the pad's red line) sits on an opaque dark tile so that it shows on any browser tab strip.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle
from PIL import Image

from attnbook.diagrams import to_svg

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "_static"
#: The files this script writes, relative to the output folder.
OUTPUTS = ("logo.svg", "favicon.ico")
#: Favicon sizes in pixels; each is drawn at its own size.
ICON_SIZES = (16, 32, 48, 64)

WEIGHTS = (0.34, 0.62, 1.0, 0.46)      # the real tokens' bar heights (relative)
BLUE, ORANGE, GREY, RED = "#3a8bd0", "#f39c12", "#9b9b9b", "#d64541"


def _bars(ax, *, x0: float, width: float, gap: float, base: float, height: float, hatch: bool,
          mask_lw: float) -> None:
    """The motif in data units: four weight bars and a masked pad slot with its red zero line."""
    top = max(WEIGHTS)
    for k, w in enumerate(WEIGHTS):
        ax.add_patch(Rectangle((x0 + k * (width + gap), base), width, height * w / top, linewidth=0,
                               facecolor=ORANGE if w == top else BLUE))
    pad_x = x0 + len(WEIGHTS) * (width + gap)
    if hatch:
        ax.add_patch(Rectangle((pad_x, base), width, height * 0.55, facecolor="none", edgecolor=GREY, linewidth=0.8,
                               hatch="////", linestyle=(0, (2, 1.5))))
    ax.plot([pad_x, pad_x + width], [base, base], color=RED, linewidth=mask_lw, solid_capstyle="butt")


def logo_figure() -> Figure:
    """The logo: the motif on a transparent background, 1.5 x 0.9 inches (shown at its natural size in the
    sidebar of the website, above the book's title)."""
    fig = Figure(figsize=(1.5, 0.9))
    fig.patch.set_alpha(0.0)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 5.0)
    ax.set_ylim(0, 3.0)
    ax.set_axis_off()
    _bars(ax, x0=0.35, width=0.7, gap=0.2, base=0.35, height=2.3, hatch=True, mask_lw=3.0)
    ax.plot([0.2, 4.8], [0.35, 0.35], color=GREY, linewidth=0.8, zorder=0)
    return fig


def icon_image(size: int) -> Image.Image:
    """The favicon at ``size`` x ``size`` pixels (RGBA): three weight bars and the pad's red zero line, light on a
    dark rounded tile, laid out on a 16 x 16 grid so that the edges fall on whole pixels at every size."""
    fig = Figure(figsize=(1, 1), dpi=size)
    fig.patch.set_alpha(0.0)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 16)
    ax.set_ylim(0, 16)
    ax.set_axis_off()
    ax.add_patch(FancyBboxPatch((0, 0), 16, 16, boxstyle="round,pad=0,rounding_size=3", facecolor="#1d3a57",
                                edgecolor="none"))
    for x, h, color in [(3, 5, BLUE), (6, 10, ORANGE), (9, 7, BLUE)]:
        ax.add_patch(Rectangle((x, 3), 2, h, facecolor=color, edgecolor="none"))
    ax.add_patch(Rectangle((12, 3), 2, 1, facecolor=RED, edgecolor="none"))     # the masked pad: weight 0
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=size, metadata={"Software": None})
    return Image.open(buffer).convert("RGBA")


def write(out_dir: Path = STATIC) -> list[Path]:
    """Write :data:`OUTPUTS` into ``out_dir`` (created if needed); return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    logo = out_dir / "logo.svg"
    logo.write_bytes(to_svg(logo_figure()))
    icons = [icon_image(size) for size in ICON_SIZES]
    favicon = out_dir / "favicon.ico"
    icons[-1].save(favicon, format="ICO", sizes=[(s, s) for s in ICON_SIZES], append_images=icons[:-1])
    return [logo, favicon]


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else STATIC):
        print("wrote", path)
