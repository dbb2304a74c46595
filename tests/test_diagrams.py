"""Tests of the architecture diagrams (attnbook.diagrams) and of the logo and favicon (tools/make_logo.py)."""

from __future__ import annotations

import importlib.util
import re
import types
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from PIL import Image

from attnbook import diagrams
from attnbook.masking import masked_softmax

ROOT = Path(__file__).resolve().parents[1]

#: Text that each diagram must show: the symbols of the book's equations for that model, and the pads.
EXPECTED = {
    "soft_lookup": ["$q$", "$k_5$ <pad>", "softmax", "False: $-\\infty$", "$o = \\sum_i \\alpha_i v_i$", "0.59", "0"],
    "encoder_decoder_bottleneck": ["$c = h_n$", "$c_1$", "$c_3$", "$h_4$", "$s_3$",
                                   "$c_t = \\sum_i \\alpha_{ti} h_i$", "fixed size"],
    "bahdanau_luong_steps": ["$s_{t-1}$", "$e_{ti} = v_a^\\top \\tanh(W_a s_{t-1} + U_a h_i)$", "$h_t$",
                             "$e_{ti} = h_t^\\top W_a h_i$", "$\\tilde h_t = \\tanh(W_c [c_t; h_t])$",
                             "$c_t = \\sum_i \\alpha_{ti} h_i$", "$[e(y_{t-1}); \\tilde h_{t-1}]$", "<pad>", "GRU",
                             "input feeding"],
    "han_pooling": ["$u_t = \\tanh(W h_t + b)$", "$s_t = u_t^\\top u_w$", "mask $m_t$", "<pad>",
                    "$c = \\sum_t \\alpha_t h_t$", "linear classifier"],
    "decomposable_attention": ["$e_{ij} = F(a_i)^\\top F(b_j)$", "$\\beta_1$", "$\\alpha_1$",
                               "$v_{1,i} = G([a_i; \\beta_i])$", "$v_{2,j} = G([b_j; \\alpha_j])$",
                               "$v_1 = \\sum_i m^a_i v_{1,i}$", "$v_2 = \\sum_j m^b_j v_{2,j}$",
                               "$\\hat y = H([v_1; v_2])$", "<pad>", "aggregate"],
    "glimpse_captioner": ["$e_{ti} = w^\\top \\tanh(W_q h_{t-1} + W_k a_i)$", "$\\alpha_t = \\mathrm{softmax}_i",
                          "$\\hat z_t = \\sum_i \\alpha_{ti}\\, a_i$", "$\\hat z_t = a_{s_t}$", "REINFORCE", "Gumbel",
                          "$h_t = \\mathrm{GRU}([E y_{t-1}; \\hat z_t],\\ h_{t-1})$", "$h_{t-1}$", "CNN"],
    "transformer_block": ["multi-head self-attention", "key padding mask (True = real token)", "causal mask",
                          "$j \\leq i$", "cross-attention", "source\npadding mask", "memory", "add & LayerNorm",
                          "feed-forward $W_2\\, \\mathrm{ReLU}(W_1 x)$", "+ PE(\\mathrm{pos})$", "× N",
                          "pre-LN: $x \\leftarrow x + \\mathrm{Sublayer}(\\mathrm{LN}(x))$"],
}


def _texts(fig: Figure) -> list[Text]:
    return [t for t in fig.findobj(Text) if t.get_text() and t.get_visible()]


@pytest.fixture(scope="module")
def drawn() -> dict[str, tuple[Figure, bytes]]:
    """Each diagram built once and rendered to SVG once (rendering is the slow part)."""
    return {name: (fig := draw(), diagrams.to_svg(fig)) for name, draw in diagrams.DIAGRAMS.items()}


def test_every_diagram_is_listed_and_checked():
    assert set(diagrams.DIAGRAMS) == set(EXPECTED) == {
        "soft_lookup", "encoder_decoder_bottleneck", "bahdanau_luong_steps", "han_pooling", "decomposable_attention",
        "glimpse_captioner", "transformer_block"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagram_shows_its_symbols_and_renders_to_svg(drawn, name):
    fig, svg = drawn[name]
    assert isinstance(fig, Figure)
    assert fig not in [plt.figure(n) for n in plt.get_fignums()], "diagrams must not be registered with pyplot"
    text = "\n".join(t.get_text() for t in _texts(fig))
    missing = [s for s in EXPECTED[name] if s not in text]
    assert not missing, f"{name} lacks {missing}"
    assert svg.startswith(b"<?xml") and b"<svg" in svg and svg.rstrip().endswith(b"</svg>")
    assert b"<dc:date>" not in svg, "the SVG must not carry a date (it would differ from run to run)"
    # Legible at the page width: 7.2 inches, no text under 6.5 pt.
    assert fig.get_size_inches()[0] == pytest.approx(7.2)
    assert min(t.get_fontsize() for t in _texts(fig)) >= 6.5


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagram_svg_is_deterministic(drawn, name):
    assert diagrams.to_svg(diagrams.DIAGRAMS[name]()) == drawn[name][1]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_diagram_labels_do_not_overlap_and_stay_on_the_panel(drawn, name):
    fig = drawn[name][0]
    FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in _texts(fig)]
    overlaps = [(a, b) for k, (a, box_a) in enumerate(boxes) for b, box_b in boxes[k + 1:] if box_a.overlaps(box_b)]
    assert not overlaps, f"{name}: overlapping labels {overlaps}"
    figure_box = fig.bbox
    outside = [s for s, box in boxes if not (box.x0 >= figure_box.x0 and box.x1 <= figure_box.x1
                                            and box.y0 >= figure_box.y0 and box.y1 <= figure_box.y1)]
    assert not outside, f"{name}: labels outside the figure {outside}"


def test_soft_lookup_shows_the_library_masked_softmax(drawn):
    scores, mask = [1.2, 0.1, 2.0, -0.5, 0.8], [True, True, True, True, False]
    weights = masked_softmax(torch.tensor([scores], dtype=torch.float64), torch.tensor([mask]))[0]
    shown = [t.get_text() for t in _texts(drawn["soft_lookup"][0])]
    for score in scores:
        assert any(f"= {score:.1f}" in text for text in shown), score
    assert [f"{w:.2f}" for w in weights[:4].tolist()] == [t for t in shown if re.fullmatch(r"0\.\d\d", t)]
    assert weights[4] == 0.0 and "0" in shown


def test_box_anchors():
    d = diagrams._Drawing(4, 2)
    box = d.box(2.0, 1.0, 1.0, 0.5, "x")
    assert (box.left, box.right, box.top, box.bottom) == ((1.5, 1.0), (2.5, 1.0), (2.0, 1.25), (2.0, 0.75))
    assert box.at(0.5, -1) == (2.25, 0.75)


# ----------------------------------------------------------------------------------------------- logo and favicon
def _make_logo() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("make_logo", ROOT / "tools" / "make_logo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _icon_frames(path: Path) -> dict[tuple[int, int], np.ndarray]:
    frames = {}
    with Image.open(path) as icon:
        for size in sorted(icon.info["sizes"]):
            icon.size = size
            icon.load()
            frames[size] = np.asarray(icon.convert("RGBA"))
    return frames


def test_committed_logo_and_favicon_are_up_to_date(tmp_path):
    make_logo = _make_logo()
    written = make_logo.write(tmp_path)
    assert sorted(p.name for p in written) == sorted(make_logo.OUTPUTS)
    committed = ROOT / "_static"
    assert (tmp_path / "logo.svg").read_bytes() == (committed / "logo.svg").read_bytes(), \
        "_static/logo.svg is stale: run `python tools/make_logo.py` and commit the result"
    fresh, old = _icon_frames(tmp_path / "favicon.ico"), _icon_frames(committed / "favicon.ico")
    assert sorted(fresh) == sorted(old) == [(s, s) for s in make_logo.ICON_SIZES]
    for size in fresh:
        assert np.array_equal(fresh[size], old[size]), \
            f"_static/favicon.ico ({size}) is stale: run `python tools/make_logo.py` and commit the result"
    # Deterministic: a second run gives the same bytes.
    again = make_logo.write(tmp_path / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]


def test_favicon_is_opaque_in_the_middle_and_shows_the_masked_pad():
    icon = np.asarray(_make_logo().icon_image(16))
    assert icon.shape == (16, 16, 4)
    assert (icon[2:14, 2:14, 3] == 255).all(), "the tile must be opaque (readable on any tab strip)"
    red = np.array(Image.new("RGB", (1, 1), "#d64541").getpixel((0, 0)))
    assert (np.abs(icon[..., :3].astype(int) - red).sum(-1) < 30).any(), "the pad's red zero line is missing"


def test_book_config_uses_the_logo_and_favicon():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["logo"] == "_static/logo.svg"
    assert config["html"]["favicon"] == "_static/favicon.ico"
    for path in (config["logo"], config["html"]["favicon"]):
        assert (ROOT / path).is_file(), path
        assert Path(path).name in _make_logo().OUTPUTS


def test_site_extension_keeps_the_title_under_the_logo():
    spec = importlib.util.spec_from_file_location("attnbook_site", ROOT / "_ext" / "attnbook_site.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    config = types.SimpleNamespace(html_logo="_static/logo.svg", html_theme_options={}, html_title="T",
                                   html_context={}, version="", release="", mathjax_path="")
    site._config_inited(None, config)
    assert config.html_theme_options["logo"]["text"] == "T"
    assert "pad" in config.html_theme_options["logo"]["alt_text"]   # the theme would write alt="" next to a text
    config.html_theme_options = {"logo": {"text": "own"}}
    site._config_inited(None, config)
    assert config.html_theme_options["logo"]["text"] == "own"
    config = types.SimpleNamespace(html_logo="", html_theme_options={}, html_title="T", html_context={},
                                   version="", release="", mathjax_path="")
    site._config_inited(None, config)
    assert "logo" not in config.html_theme_options
    assert re.fullmatch(r"\d+\.\d+.*", config.version)
