"""Digit canvases for "digit captioning": real handwritten digits pasted left to right on a blank canvas.

Explained in chapter 7, "Soft and hard attention" (``chapters/07_soft_hard_attention``), section "Digit
captioning". The task is a miniature of image captioning (Xu et al. 2015): the input is an image, the caption is
the sequence of digits on it, read left to right, and a decoder must look at the right place for each token.

The digits are scikit-learn's ``load_digits()`` images (1,797 grey-scale 8x8 images, about 180 per class; the test
part of the UCI "Optical Recognition of Handwritten Digits" data, Alpaydin and Kaynak 1998), scaled to [0, 1].
They are split into disjoint pools of *images* first, so that test canvases contain only digit images that no
training canvas contains.

Everything is seeded: the same arguments give the same canvases, bit for bit, on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["DIGIT_SIZE", "DigitImages", "DigitCanvases", "load_digit_images", "split_digit_images", "make_canvases"]

#: Side of one digit image, in pixels.
DIGIT_SIZE = 8


@dataclass(frozen=True)
class DigitImages:
    """A pool of digit images: ``images`` float32 ``(n, side, side)`` in [0, 1], ``labels`` int64 ``(n,)`` in 0..9.

    ``side`` is 8 for scikit-learn's digits (:func:`load_digit_images`) and 28 for MNIST
    (:func:`attnbook.data.mnist.load_mnist_sample`); :func:`split_digit_images` takes either.
    """

    images: Tensor
    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class DigitCanvases:
    """Canvases and their captions.

    Attributes:
        images: float32 ``(n, 1, height, width)`` in [0, 1] (channel dim first, ready for ``nn.Conv2d``).
        captions: int64 ``(n, n_digits)``, the digit labels read left to right (values 0..9).
        offsets: int64 ``(n, n_digits, 2)``, the (row, column) of each digit's top-left pixel; columns increase
            along a caption.
    """

    images: Tensor
    captions: Tensor
    offsets: Tensor

    def __len__(self) -> int:
        return int(self.captions.shape[0])


def load_digit_images() -> DigitImages:
    """All 1,797 images of scikit-learn's ``load_digits()``, as float32 in [0, 1] (the raw values are 0..16).

    Raises:
        ImportError: scikit-learn is not installed (the message says how to install it).
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - scikit-learn is in the book's requirements
        raise ImportError("attnbook.data.digits needs scikit-learn: pip install scikit-learn") from err
    bunch = load_digits()
    images = torch.as_tensor(bunch.images, dtype=torch.float32) / 16.0
    labels = torch.as_tensor(bunch.target, dtype=torch.long)
    return DigitImages(images=images, labels=labels)


def split_digit_images(
    pool: DigitImages | None = None, test_fraction: float = 0.3, seed: int = 0
) -> tuple[DigitImages, DigitImages]:
    """Split a pool of digit images into disjoint (train, test) pools, stratified by class and seeded.

    Args:
        pool: the images to split; ``None`` = :func:`load_digit_images`.
        test_fraction: the share of each class that goes to the test pool, in (0, 1).
        seed: seed of the permutation within each class.

    Returns:
        ``(train, test)``; every image is in exactly one of them.

    Raises:
        ValueError: ``test_fraction`` is not in (0, 1), or a class would end up with no image on one side.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    pool = load_digit_images() if pool is None else pool
    rng = np.random.default_rng(seed)
    labels = pool.labels.numpy()
    train_idx, test_idx = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(test_fraction * len(idx)))
        if n_test == 0 or n_test == len(idx):
            raise ValueError(f"class {cls} has {len(idx)} images: test_fraction={test_fraction} leaves one side empty")
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    train_idx, test_idx = np.sort(np.concatenate(train_idx)), np.sort(np.concatenate(test_idx))
    take = lambda idx: DigitImages(pool.images[torch.as_tensor(idx)], pool.labels[torch.as_tensor(idx)])
    return take(train_idx), take(test_idx)


def make_canvases(
    pool: DigitImages,
    n_canvases: int,
    n_digits: int = 3,
    width: int | None = None,
    height: int = DIGIT_SIZE,
    seed: int = 0,
) -> DigitCanvases:
    """Compose ``n_canvases`` canvases of ``n_digits`` digits each, drawn from ``pool``, read left to right.

    Each canvas is black (0). Digits are drawn uniformly from the pool (with replacement) and pasted without
    overlap: the free columns ``width - 8 * n_digits`` are split into random gaps before, between and after the
    digits, and each digit gets a random row offset in ``0..height - 8``. With the default ``width = 8 * n_digits``
    and ``height = 8`` the digits tile the canvas exactly, e.g. 3 digits on an 8x24 canvas.

    Args:
        pool: digit images to draw from (e.g. one side of :func:`split_digit_images`).
        n_canvases: number of canvases, >= 0.
        n_digits: digits per canvas (= caption length), >= 1.
        width: canvas width in pixels, >= ``8 * n_digits``; ``None`` = ``8 * n_digits``.
        height: canvas height in pixels, >= 8.
        seed: seed of all random choices; the same arguments give identical canvases.

    Returns:
        A :class:`DigitCanvases` with ``images (n, 1, height, width)``, ``captions (n, n_digits)`` and
        ``offsets (n, n_digits, 2)``.

    Raises:
        ValueError: a size is out of range (the message gives the values), or ``pool`` is empty.
    """
    if n_canvases < 0:
        raise ValueError(f"n_canvases must be >= 0, got {n_canvases}")
    if n_digits < 1:
        raise ValueError(f"n_digits must be >= 1, got {n_digits}")
    width = DIGIT_SIZE * n_digits if width is None else width
    if width < DIGIT_SIZE * n_digits:
        raise ValueError(f"width={width} cannot hold {n_digits} digits of {DIGIT_SIZE} pixels side by side")
    if height < DIGIT_SIZE:
        raise ValueError(f"height must be >= {DIGIT_SIZE}, got {height}")
    if len(pool) == 0:
        raise ValueError("the pool of digit images is empty")
    rng = np.random.default_rng(seed)
    which = rng.integers(0, len(pool), size=(n_canvases, n_digits))
    free = width - DIGIT_SIZE * n_digits
    # Random gaps: n_digits + 1 non-negative integers that sum to `free` (stars and bars).
    cuts = np.sort(rng.integers(0, free + 1, size=(n_canvases, n_digits)), axis=1)
    gaps = np.diff(np.concatenate([np.zeros((n_canvases, 1), int), cuts], axis=1), axis=1)
    cols = np.cumsum(gaps, axis=1) + DIGIT_SIZE * np.arange(n_digits)
    rows = rng.integers(0, height - DIGIT_SIZE + 1, size=(n_canvases, n_digits))
    images = torch.zeros(n_canvases, 1, height, width)
    for i in range(n_canvases):
        for j in range(n_digits):
            r, c = int(rows[i, j]), int(cols[i, j])
            images[i, 0, r:r + DIGIT_SIZE, c:c + DIGIT_SIZE] = pool.images[int(which[i, j])]
    captions = pool.labels[torch.as_tensor(which, dtype=torch.long)].reshape(n_canvases, n_digits)
    offsets = torch.as_tensor(np.stack([rows, cols], axis=-1), dtype=torch.long).reshape(n_canvases, n_digits, 2)
    return DigitCanvases(images=images, captions=captions, offsets=offsets)
