"""attnbook.plotting.attention_heatmap: every heatmap has a colour bar and token tick labels."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attnbook.plotting import attention_heatmap  # noqa: E402


def _colorbar_labels(fig, heatmap_ax):
    return [a.get_ylabel() for a in fig.axes if a is not heatmap_ax]


def test_colour_bar_is_on_by_default_and_labelled():
    fig, ax = plt.subplots()
    attention_heatmap(np.array([[0.25, 0.75], [1.0, 0.0]]), ["a", "<pad>"], ["q1", "q2"], ax=ax)
    assert _colorbar_labels(fig, ax) == ["attention weight"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "<pad>"]
    plt.close(fig)


def test_colour_bar_label_can_name_other_scores():
    fig, ax = plt.subplots()
    attention_heatmap(np.eye(2), ["x", "y"], ["s", "t"], ax=ax, colorbar_label="score / its maximum")
    assert _colorbar_labels(fig, ax) == ["score / its maximum"]
    plt.close(fig)


def test_one_colour_bar_per_panel():
    fig, axes = plt.subplots(1, 3)
    for ax in axes:
        attention_heatmap(np.full((2, 3), 1 / 3), None, None, ax=ax, vmax=1.0)
    assert len(fig.axes) == 6
    plt.close(fig)


def test_no_colour_bar_when_asked_and_empty_label_is_refused():
    fig, ax = plt.subplots()
    attention_heatmap(np.eye(2), ax=ax, colorbar=False, colorbar_label="")
    assert len(fig.axes) == 1
    with pytest.raises(ValueError, match=r"colorbar_label must name what the colours show, got ' '"):
        attention_heatmap(np.eye(2), ax=ax, colorbar_label=" ")
    plt.close(fig)


# ------------------------------------------------------------------------ the figures of chapters 1 and 2
def test_word_weight_bars_one_panel_per_text_with_the_uniform_line():
    import pandas as pd

    from attnbook.plotting import word_weight_bars

    tables = {"a": pd.DataFrame({"token": ["x", "y"], "weight": [0.25, 0.75]}),
              "b": pd.DataFrame({"token": ["p", "q", "r", "s"], "weight": [0.1, 0.2, 0.3, 0.4]})}
    fig = word_weight_bars(tables, top=1)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["a", "b"]
    assert [len(ax.patches) for ax in axes] == [2, 4]
    assert axes[1].lines[0].get_xdata()[0] == pytest.approx(0.25)   # 1 / n for four words
    darker = [p.get_facecolor() for p in axes[1].patches]
    assert darker.count(darker[3]) == 1                              # only the largest weight is darker
    plt.close(fig)


def test_word_weight_bars_errors():
    import pandas as pd

    from attnbook.plotting import word_weight_bars

    with pytest.raises(ValueError, match="at least one"):
        word_weight_bars({})
    with pytest.raises(ValueError, match="top must be >= 0"):
        word_weight_bars({"a": pd.DataFrame({"token": ["x"], "weight": [1.0]})}, top=-1)
    with pytest.raises(ValueError, match="missing \\['weight'\\]"):
        word_weight_bars({"a": pd.DataFrame({"token": ["x"]})})


def test_mass_and_prediction_and_its_error():
    import pandas as pd

    from attnbook.plotting import mass_and_prediction

    sweep = pd.DataFrame({"pads": [0, 1], "mass m": [1.0, 0.5], "p(masked)": [0.7, 0.7], "p(unmasked)": [0.7, 0.4]})
    fig = mass_and_prediction(sweep)
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 3     # masked, unmasked, the 0.5 line
    plt.close(fig)
    with pytest.raises(ValueError, match="p\\(unmasked\\)"):
        mass_and_prediction(sweep.drop(columns="p(unmasked)"))


def test_thin_tick_labels_keeps_about_n():
    from attnbook.plotting import attention_heatmap, thin_tick_labels

    ax = attention_heatmap(np.ones((3, 40)))
    thin_tick_labels(ax, n=8)
    assert len(ax.get_xticks()) == 8 and len(ax.get_yticks()) == 3
    with pytest.raises(ValueError, match="n must be >= 1"):
        thin_tick_labels(ax, n=0)
    plt.close(ax.figure)


def test_kernel_and_engel_figures_and_their_errors():
    import pandas as pd
    import torch

    from attnbook.kernels import KERNELS
    from attnbook.plotting import bandwidth_sweep_grid, engel_fits_and_cv, kernel_shapes_and_fits

    x = torch.linspace(0, 1, 5, dtype=torch.float64)
    fig = bandwidth_sweep_grid({0.1: (x, torch.eye(5)), 1.0: (x, torch.full((5, 5), 0.2))}, x, x, x, x)
    assert len(fig.axes) == 2 * 2 + 2                              # heatmaps, fits and two colour bars
    plt.close(fig)
    log_k, radius = KERNELS["gaussian"]
    fig = kernel_shapes_and_fits({"gaussian": (log_k, radius, 0.2, x)}, x, x, x, x, sd=0.2)
    assert len(fig.axes) == 2
    plt.close(fig)
    sweep = pd.DataFrame({"bandwidth": [0.1, 0.2], "loo_mse": [2.0, 1.0]})
    fig = engel_fits_and_cv(x + 1, x, {0.2: (x + 1, x)}, sweep, sweep.iloc[1], 0.2)
    assert len(fig.axes) == 2
    plt.close(fig)
    with pytest.raises(ValueError, match="at least one bandwidth"):
        bandwidth_sweep_grid({}, x, x, x, x)
    with pytest.raises(ValueError, match="sd must be positive"):
        kernel_shapes_and_fits({"gaussian": (log_k, radius, 0.2, x)}, x, x, x, x, sd=0)
    with pytest.raises(ValueError, match="at least one kernel"):
        kernel_shapes_and_fits({}, x, x, x, x, sd=0.2)
    with pytest.raises(ValueError, match="at least one bandwidth"):
        engel_fits_and_cv(x, x, {}, sweep, sweep.iloc[0], 0.2)
