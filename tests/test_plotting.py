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
