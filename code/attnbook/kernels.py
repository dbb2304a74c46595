"""Nadaraya–Watson kernel regression, written as attention.

Explained in chapter 2, "Kernel regression as non-parametric attention" (``chapters/02_kernel_regression``).
Queries are the test inputs, keys the training inputs, values the training targets; the attention weights
are the normalized kernel values (Nadaraya 1964; Watson 1964; Murphy, PML 15.4.2):

    f(x) = sum_i  K((x - x_i) / h) / sum_j K((x - x_j) / h)  *  y_i

We compute the weights as a softmax of the *log* kernel, ``masked_softmax(log K(u), K(u) > 0)``. That is
exactly the normalized kernel, and it never underflows to 0/0 for a query far from every training point
(the naive ``exp(-u**2 / 2) / sum(...)`` does, in fp32 once every u exceeds about 14.4, where
exp(-u**2 / 2) is 0 even as a subnormal). Where even the log kernel overflows to ``-inf`` for every training
input (a bandwidth so small that ``u**2`` exceeds the float range, e.g. ``h = 1e-30``), the weights are their
``h -> 0`` limit: one-hot on the nearest training input, shared equally among exact ties.

Dtypes: fp16 and bf16 inputs are computed in fp32 (``torch.cdist`` lacks fp16/bf16 kernels for small inputs, and
``u**2`` overflows fp16 at ``u > 256``) and the results are cast back to the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import Tensor, nn

from .masking import masked_softmax

__all__ = [
    "KERNELS",
    "kernel_scores",
    "nadaraya_watson",
    "leave_one_out_mse",
    "bandwidth_sweep",
    "NadarayaWatson",
]

#: Kernels by name: (log-kernel of u >= 0, support radius in units of the bandwidth or ``inf``).
#: Normalizing constants are dropped: they cancel in the weights.
KERNELS = {
    "gaussian": (lambda u: -0.5 * u**2, math.inf),
    "laplacian": (lambda u: -u, math.inf),
    "epanechnikov": (lambda u: torch.log1p(-torch.clamp(u, max=1.0) ** 2), 1.0),
    "boxcar": (lambda u: torch.zeros_like(u), 1.0),
}


def _as_2d(x: Tensor, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if x.dim() == 1:
        return x.unsqueeze(-1)
    if x.dim() == 2:
        return x
    raise ValueError(f"{name} must have shape (n,) or (n, d), got {tuple(x.shape)}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_bandwidth(bandwidth: float | Tensor) -> Tensor | float:
    if isinstance(bandwidth, Tensor) and bandwidth.numel() != 1:
        raise ValueError(f"bandwidth must be a scalar, got shape {tuple(bandwidth.shape)}")
    value = float(bandwidth.detach()) if isinstance(bandwidth, Tensor) else float(bandwidth)  # not via fp32
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"bandwidth must be a positive finite number, got {value}")
    return bandwidth


def _distances_and_scores(
    x_query: Tensor, x_train: Tensor, bandwidth: float | Tensor, kernel: str
) -> tuple[Tensor, Tensor, Tensor]:
    """``(distances, log-kernel scores, support mask)``, each ``(n_queries, n_train)``, in the compute dtype (fp32
    for fp16/bf16 inputs); validates the arguments as :func:`kernel_scores` documents."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {sorted(KERNELS)}")
    bandwidth = _check_bandwidth(bandwidth)
    xq, xt = _as_2d(x_query, "x_query"), _as_2d(x_train, "x_train")
    if xq.dtype != xt.dtype:
        raise TypeError(f"x_query and x_train must share one dtype, got {xq.dtype} and {xt.dtype}")
    if xq.shape[1] != xt.shape[1]:
        raise ValueError(
            f"x_query {tuple(x_query.shape)} and x_train {tuple(x_train.shape)} have different feature sizes"
        )
    compute = _compute_dtype(xq.dtype)
    log_kernel, radius = KERNELS[kernel]
    distances = torch.cdist(xq.to(compute), xt.to(compute))
    # u = 0 at distance 0 for every h > 0, also where h underflows to 0 in the dtype (h = 1e-300 in fp32): no 0/0.
    u = torch.where(distances > 0, distances / bandwidth, torch.zeros((), dtype=compute, device=distances.device))
    mask = u < radius if math.isfinite(radius) else torch.ones_like(u, dtype=torch.bool)
    return distances, log_kernel(u), mask


def _weights(distances: Tensor, scores: Tensor, mask: Tensor) -> Tensor:
    """``masked_softmax(scores, mask)``, except in rows whose every supported score overflowed to ``-inf`` (a
    vanishing bandwidth): there the ``h -> 0`` limit, one-hot on the nearest supported key, ties shared."""
    degenerate = ~(mask & (scores > -math.inf)).any(dim=-1, keepdim=True) & mask.any(dim=-1, keepdim=True)
    if bool(degenerate.any()):
        d = distances.masked_fill(~mask, math.inf)
        nearest = mask & (d == d.amin(dim=-1, keepdim=True))
        limit = torch.full_like(scores, -math.inf).masked_fill(nearest, 0.0)
        scores = torch.where(degenerate, limit, scores)
    return masked_softmax(scores, mask, dim=-1)


def kernel_scores(
    x_query: Tensor, x_train: Tensor, bandwidth: float | Tensor, kernel: str = "gaussian"
) -> tuple[Tensor, Tensor]:
    """Log-kernel scores and their support mask between every query and every training input.

    Args:
        x_query: ``(n_queries,)`` or ``(n_queries, d)``, float (fp16, bf16, fp32 or fp64).
        x_train: ``(n_train,)`` or ``(n_train, d)``, same dtype and ``d`` as ``x_query``.
        bandwidth: ``h > 0``, in the units of ``x``; a Python float or a scalar tensor (may require grad).
        kernel: one of :data:`KERNELS` (``"gaussian"``, ``"laplacian"``, ``"epanechnikov"``, ``"boxcar"``).

    Returns:
        ``(scores, mask)``, both ``(n_queries, n_train)``: ``scores = log K(||x_q - x_i|| / h)`` (float, the
        inputs' dtype; computed in fp32 for fp16/bf16 and cast back, so ``-inf`` where the log kernel is beyond
        the dtype's range) and a bool ``mask``, True where ``K > 0`` (True = the key takes part, as in
        ``torch.nn.functional.scaled_dot_product_attention``).

    Raises:
        TypeError: inputs are not float tensors, or ``x_query`` and ``x_train`` differ in dtype.
        ValueError: unknown ``kernel``; shapes that do not match (named in the message); ``bandwidth`` not a
            positive finite scalar.

    Chapter 2, section "Nadaraya–Watson regression is attention", eq. ``eq-nw-weights``.
    """
    _, scores, mask = _distances_and_scores(x_query, x_train, bandwidth, kernel)
    return scores.to(x_query.dtype), mask


def nadaraya_watson(
    x_query: Tensor,
    x_train: Tensor,
    y_train: Tensor,
    bandwidth: float | Tensor,
    kernel: str = "gaussian",
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Nadaraya–Watson kernel regression as attention: ``f(x_q) = sum_i alpha(x_q, x_i) y_i``.

    Args:
        x_query: queries, ``(n_queries,)`` or ``(n_queries, d)``, float (fp16, bf16, fp32 or fp64).
        x_train: keys, ``(n_train,)`` or ``(n_train, d)``, same dtype as ``x_query``.
        y_train: values, ``(n_train,)`` or ``(n_train, d_v)``, float.
        bandwidth: ``h > 0`` in the units of ``x``; a float or a scalar tensor (differentiable).
        kernel: ``"gaussian"`` (default), ``"laplacian"``, ``"epanechnikov"`` or ``"boxcar"``.
        return_weights: also return the attention weights.

    Returns:
        Predictions ``(n_queries,)`` if ``y_train`` is 1-D, else ``(n_queries, d_v)``; with
        ``return_weights=True`` also the weights ``(n_queries, n_train)``, whose rows sum to 1. Both in the dtype
        of ``x_query``; fp16/bf16 inputs are computed in fp32 and cast back. Never NaN for finite inputs: as
        ``h -> 0`` (e.g. ``h = 1e-30``, where ``u**2`` overflows) the weights are one-hot on the nearest training
        input (shared equally among exact ties) and the prediction is that input's value, 1-nearest-neighbour
        regression.

    Raises:
        TypeError: inputs are not float tensors, or ``x_query`` and ``x_train`` differ in dtype.
        ValueError: mismatched shapes (named in the message), unknown kernel, bad bandwidth, or, for a
            compactly supported kernel, a query with no training input within one bandwidth (its estimate
            would be 0/0; the message names the query and suggests a larger bandwidth).

    Equals ``statsmodels.nonparametric.kernel_regression.KernelReg(..., reg_type="lc")`` for the Gaussian
    kernel (tested). Chapter 2, section "Nadaraya–Watson regression is attention", eq. ``eq-nw``.
    """
    if not isinstance(y_train, Tensor) or not y_train.is_floating_point():
        raise TypeError(f"y_train must be a float torch.Tensor, got {getattr(y_train, 'dtype', type(y_train))}")
    if y_train.dim() not in (1, 2) or y_train.shape[0] != x_train.shape[0]:
        raise ValueError(
            f"y_train must be (n_train,) or (n_train, d_v) with n_train={x_train.shape[0]} "
            f"(from x_train {tuple(x_train.shape)}), got {tuple(y_train.shape)}"
        )
    distances, scores, mask = _distances_and_scores(x_query, x_train, bandwidth, kernel)
    empty = ~mask.any(dim=-1)
    if bool(empty.any()):
        i = int(empty.nonzero()[0, 0])
        raise ValueError(
            f"query {i} (x={x_query[i].tolist()}) has no training input within bandwidth {float(bandwidth):g} "
            f"for the compact {kernel!r} kernel ({int(empty.sum())} such queries); use a larger bandwidth "
            "or the gaussian kernel"
        )
    weights = _weights(distances, scores, mask)
    y = y_train.unsqueeze(-1) if y_train.dim() == 1 else y_train
    out = (weights @ y.to(weights.dtype)).to(x_query.dtype)
    out = out.squeeze(-1) if y_train.dim() == 1 else out
    return (out, weights.to(x_query.dtype)) if return_weights else out


def leave_one_out_mse(
    x_train: Tensor, y_train: Tensor, bandwidth: float | Tensor, kernel: str = "gaussian"
) -> Tensor:
    """Leave-one-out cross-validation mean squared error of :func:`nadaraya_watson` at one bandwidth.

    Each training point is predicted from all the others. In attention terms this is a *masked* attention in
    which every query hides its own key: the mask is the training points' kernel support minus the diagonal.

    Args:
        x_train: ``(n_train,)`` or ``(n_train, d)``, float (fp16/bf16 are computed in fp32), ``n_train >= 2``.
        y_train: ``(n_train,)``, float.
        bandwidth: ``h > 0``; a float or a scalar tensor (differentiable, so the CV error can be minimized by
            gradient descent).
        kernel: as in :func:`nadaraya_watson`.

    Returns:
        Scalar tensor of ``y_train``'s dtype: ``mean_i (y_i - f_{-i}(x_i))**2``, in squared units of ``y``
        (with the nearest-neighbour weights of :func:`nadaraya_watson` where ``u**2`` overflows). Points with no other
        training input in a compact kernel's support are left out of the mean; if that is every point, the
        result is ``inf`` (the bandwidth is too small to predict anything).

    Raises:
        TypeError, ValueError: as :func:`kernel_scores`; also for ``y_train`` not of shape ``(n_train,)``, or
        fewer than 2 training points.

    Chapter 2, section "Choosing the bandwidth", eq. ``eq-loo``.
    """
    if y_train.dim() != 1 or y_train.shape[0] != x_train.shape[0]:
        raise ValueError(f"y_train must be ({x_train.shape[0]},) to match x_train, got {tuple(y_train.shape)}")
    if x_train.shape[0] < 2:
        raise ValueError(f"leave-one-out needs at least 2 training points, got {x_train.shape[0]}")
    distances, scores, mask = _distances_and_scores(x_train, x_train, bandwidth, kernel)
    eye = torch.eye(x_train.shape[0], dtype=torch.bool, device=x_train.device)
    mask = mask & ~eye
    weights = _weights(distances, scores, mask)
    y = y_train.to(weights.dtype)
    predicted = weights @ y
    has_neighbour = mask.any(dim=-1)
    if not bool(has_neighbour.any()):
        return torch.tensor(math.inf, dtype=y_train.dtype)
    return ((y - predicted)[has_neighbour] ** 2).mean().to(y_train.dtype)


def bandwidth_sweep(
    x_train: Tensor,
    y_train: Tensor,
    bandwidths: Sequence[float] | Tensor,
    kernel: str = "gaussian",
    x_test: Tensor | None = None,
    y_test: Tensor | None = None,
) -> pd.DataFrame:
    """Leave-one-out error (and optionally test error) of :func:`nadaraya_watson` at each of several bandwidths.

    The cross-validated bandwidth is the row with the smallest ``loo_mse``:
    ``sweep.loc[sweep["loo_mse"].idxmin(), "bandwidth"]``.

    Args:
        x_train: ``(n_train,)`` or ``(n_train, d)``, float, ``n_train >= 2``.
        y_train: ``(n_train,)``, float.
        bandwidths: the candidate ``h > 0`` (in the units of ``x``), a non-empty sequence or 1-D tensor; they
            are evaluated in the order given.
        kernel: as in :func:`nadaraya_watson`.
        x_test, y_test: optional held-out inputs ``(n_test,)`` or ``(n_test, d)`` and targets ``(n_test,)``
            (for synthetic data, the noise-free truth); give both or neither.

    Returns:
        A :class:`pandas.DataFrame` with one row per bandwidth and float columns ``bandwidth`` and ``loo_mse``
        (:func:`leave_one_out_mse`, squared units of ``y``), plus ``test_mse`` ``= mean((f(x_test) - y_test)**2)``
        when test data are given. ``loo_mse`` is ``inf`` where no training point has another within a compact
        kernel's support; ``test_mse`` is ``inf`` where some test query has no training input within it.

    Raises:
        TypeError, ValueError: as :func:`leave_one_out_mse` and :func:`nadaraya_watson` (bad shapes, dtypes,
            kernel or bandwidth); also for an empty ``bandwidths``, for only one of ``x_test``/``y_test``, or
            for ``y_test`` not of shape ``(n_test,)``.

    Computed without gradients. Chapter 2, section "Choosing the bandwidth", eq. ``eq-loo`` (leave-one-out
    cross-validation: Hastie et al. 2009, section 7.10).
    """
    values = [float(h) for h in (bandwidths.flatten() if isinstance(bandwidths, Tensor) else bandwidths)]
    if not values:
        raise ValueError("bandwidths must contain at least one bandwidth")
    if (x_test is None) != (y_test is None):
        raise ValueError("give both x_test and y_test, or neither")
    if y_test is not None and (y_test.dim() != 1 or y_test.shape[0] != x_test.shape[0]):
        raise ValueError(
            f"y_test must be ({x_test.shape[0]},) to match x_test {tuple(x_test.shape)}, got {tuple(y_test.shape)}"
        )
    rows = []
    with torch.no_grad():
        for h in values:
            row = {"bandwidth": h, "loo_mse": float(leave_one_out_mse(x_train, y_train, h, kernel))}
            if x_test is not None:
                _, mask = kernel_scores(x_test, x_train, h, kernel)
                if bool(mask.any(dim=-1).all()):
                    predicted = nadaraya_watson(x_test, x_train, y_train, h, kernel)
                    row["test_mse"] = float(((predicted - y_test.to(predicted.dtype)) ** 2).mean())
                else:
                    row["test_mse"] = math.inf
            rows.append(row)
    return pd.DataFrame(rows)


class NadarayaWatson(nn.Module):
    """Nadaraya–Watson regression with a learnable bandwidth (the "parametric attention" step of chapter 2).

    The bandwidth is stored as its logarithm, so gradient descent keeps it positive. Call as
    ``model(x_query, x_train, y_train)``; after a forward pass ``model.attention_weights`` holds the weights
    ``(n_queries, n_train)``.

    Args:
        bandwidth: the initial ``h > 0``, in the units of ``x``.
        kernel: as in :func:`nadaraya_watson`.

    Chapter 2, section "Learning the bandwidth".
    """

    def __init__(self, bandwidth: float = 1.0, kernel: str = "gaussian") -> None:
        super().__init__()
        _check_bandwidth(bandwidth)
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; choose one of {sorted(KERNELS)}")
        self.kernel = kernel
        self.log_bandwidth = nn.Parameter(torch.tensor(math.log(bandwidth)))
        self.attention_weights: Tensor | None = None

    @property
    def bandwidth(self) -> Tensor:
        """The current bandwidth ``h = exp(log_bandwidth)`` (scalar tensor)."""
        return self.log_bandwidth.exp()

    def forward(self, x_query: Tensor, x_train: Tensor, y_train: Tensor) -> Tensor:
        out, weights = nadaraya_watson(
            x_query, x_train, y_train, self.bandwidth, kernel=self.kernel, return_weights=True
        )
        self.attention_weights = weights.detach()
        return out


#: The standard deviation of each kernel of :data:`KERNELS` as a density in ``u = |x - x_i| / h``, in units of the
#: bandwidth ``h``: Gaussian 1, Laplacian sqrt(2), Epanechnikov 1/sqrt(5), boxcar 1/sqrt(3). Chapter 2, section
#: "Four kernels".
KERNEL_SD = {"gaussian": 1.0, "laplacian": math.sqrt(2.0), "epanechnikov": 1 / math.sqrt(5.0),
             "boxcar": 1 / math.sqrt(3.0)}


def matched_bandwidths(sd: float) -> dict[str, float]:
    """The bandwidth ``h`` of each kernel of :data:`KERNELS` at which its weights have standard deviation ``sd``
    (in the units of x), so that kernels of different shapes can be compared at one width: ``sd / KERNEL_SD[k]``.

    Raises:
        ValueError: ``sd`` is not positive.

    Chapter 2, section "Four kernels" (Fig. ``fig-kr-kernels``).
    """
    if not sd > 0:
        raise ValueError(f"sd must be positive, got {sd}")
    return {name: sd / KERNEL_SD[name] for name in KERNELS}


__all__ += ["KERNEL_SD", "matched_bandwidths"]
