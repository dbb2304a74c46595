"""attnbook.data.digits: canvases are deterministic per seed, their captions are the digits actually pasted (checked
pixel by pixel against scikit-learn's images), and digits never overlap."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from attnbook.data.digits import DigitImages, load_digit_images, make_canvases, split_digit_images


@pytest.fixture(scope="module")
def pools():
    return split_digit_images(seed=0)


def test_load_digit_images_matches_sklearn():
    pool = load_digit_images()
    bunch = load_digits()
    assert pool.images.shape == (1797, 8, 8) and pool.images.dtype == torch.float32
    assert np.allclose(pool.images.numpy() * 16, bunch.images) and np.array_equal(pool.labels.numpy(), bunch.target)


def test_split_is_disjoint_stratified_and_seeded(pools):
    train, test = pools
    assert len(train) + len(test) == 1797
    key = lambda p: {tuple(img.flatten().tolist()) for img in p.images}
    assert not key(train) & key(test)
    share = torch.bincount(test.labels, minlength=10) / torch.bincount(load_digit_images().labels, minlength=10)
    assert torch.all((share - 0.3).abs() < 0.02)
    again = split_digit_images(seed=0)[1]
    other = split_digit_images(seed=1)[1]
    assert torch.equal(again.images, test.images) and not torch.equal(other.images, test.images)


@pytest.mark.parametrize("width,height", [(24, 8), (40, 16)])
def test_canvases_are_deterministic_per_seed(pools, width, height):
    a = make_canvases(pools[0], 50, n_digits=3, width=width, height=height, seed=7)
    b = make_canvases(pools[0], 50, n_digits=3, width=width, height=height, seed=7)
    c = make_canvases(pools[0], 50, n_digits=3, width=width, height=height, seed=8)
    assert torch.equal(a.images, b.images) and torch.equal(a.captions, b.captions) and torch.equal(a.offsets, b.offsets)
    assert not torch.equal(a.images, c.images)
    assert a.images.shape == (50, 1, height, width) and a.captions.shape == (50, 3)


@pytest.mark.parametrize("width,height", [(24, 8), (40, 16)])
def test_captions_are_the_pasted_digits_left_to_right(pools, width, height):
    pool = pools[0]
    canv = make_canvases(pool, 40, n_digits=3, width=width, height=height, seed=3)
    for i in range(len(canv)):
        cols = canv.offsets[i, :, 1]
        assert torch.all(cols[1:] - cols[:-1] >= 8), "digits overlap or are out of order"
        covered = torch.zeros(height, width, dtype=torch.bool)
        for j in range(3):
            r, c = canv.offsets[i, j].tolist()
            patch = canv.images[i, 0, r:r + 8, c:c + 8]
            matches = (pool.images - patch).abs().flatten(1).max(1).values == 0
            assert matches.any() and canv.captions[i, j] in pool.labels[matches]
            covered[r:r + 8, c:c + 8] = True
        assert torch.all(canv.images[i, 0][~covered] == 0), "ink outside the pasted digits"


def test_canvas_errors(pools):
    pool = pools[0]
    with pytest.raises(ValueError, match="width=20 cannot hold 3 digits of 8 pixels"):
        make_canvases(pool, 2, n_digits=3, width=20)
    with pytest.raises(ValueError, match="height must be >= 8, got 7"):
        make_canvases(pool, 2, height=7)
    with pytest.raises(ValueError, match="n_digits must be >= 1, got 0"):
        make_canvases(pool, 2, n_digits=0)
    with pytest.raises(ValueError, match="n_canvases must be >= 0, got -1"):
        make_canvases(pool, -1)
    with pytest.raises(ValueError, match="the pool of digit images is empty"):
        make_canvases(DigitImages(torch.zeros(0, 8, 8), torch.zeros(0, dtype=torch.long)), 2)
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\), got 1.0"):
        split_digit_images(pool, test_fraction=1.0)


from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=25, deadline=None)
@given(n_digits=st.integers(1, 4), extra_w=st.integers(0, 12), extra_h=st.integers(0, 8), seed=st.integers(0, 2**16))
def test_canvas_geometry_property(n_digits, extra_w, extra_h, seed):
    """For any valid size: digits in bounds, left to right without overlap, no ink outside them, same seed = same."""
    pool = split_digit_images(seed=0)[1]
    width, height = 8 * n_digits + extra_w, 8 + extra_h
    a = make_canvases(pool, 6, n_digits, width, height, seed=seed)
    b = make_canvases(pool, 6, n_digits, width, height, seed=seed)
    assert torch.equal(a.images, b.images) and torch.equal(a.offsets, b.offsets)
    rows, cols = a.offsets[..., 0], a.offsets[..., 1]
    assert torch.all((rows >= 0) & (rows + 8 <= height) & (cols >= 0) & (cols + 8 <= width))
    assert torch.all(cols[:, 1:] - cols[:, :-1] >= 8)
    for i in range(6):
        covered = torch.zeros(height, width, dtype=torch.bool)
        for r, c in a.offsets[i].tolist():
            covered[r:r + 8, c:c + 8] = True
        assert torch.all(a.images[i, 0][~covered] == 0)
