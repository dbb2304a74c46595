"""attnbook.kernels against statsmodels' kernel regression, brute-force NumPy, and finite differences."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.nonparametric.kernel_regression import KernelReg

from attnbook.kernels import (
    KERNELS,
    NadarayaWatson,
    bandwidth_sweep,
    kernel_scores,
    leave_one_out_mse,
    nadaraya_watson,
)


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 5, n))
    y = 2 * np.sin(x) + x**0.8 + rng.normal(0, 0.5, n)
    return x, y


def _statsmodels(y, x, bw):
    """statsmodels' local-constant KernelReg. Its random generator serves only the "efficient" bandwidth search,
    which we never ask for; rng=0 just silences statsmodels 0.15's FutureWarning about its default."""
    try:
        return KernelReg(y, x, var_type="c", reg_type="lc", bw=bw, rng=0)
    except TypeError:  # statsmodels < 0.15 has no rng argument
        return KernelReg(y, x, var_type="c", reg_type="lc", bw=bw)


@pytest.mark.parametrize("bandwidth", [0.1, 0.4, 2.0])
def test_gaussian_matches_statsmodels_local_constant(bandwidth):
    x, y = _data()
    xq = np.linspace(-1, 6, 25)
    ref, _ = _statsmodels(y, x, [bandwidth]).fit(xq)
    ours = nadaraya_watson(torch.tensor(xq), torch.tensor(x), torch.tensor(y), bandwidth)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-10, atol=1e-10)


def _brute_force(xq, x, y, h, kernel):
    u = np.abs(xq[:, None] - x[None, :]) / h
    k = {
        "gaussian": np.exp(-0.5 * u**2),
        "laplacian": np.exp(-u),
        "epanechnikov": np.where(u < 1, 0.75 * (1 - u**2), 0.0),
        "boxcar": np.where(u < 1, 0.5, 0.0),
    }[kernel]
    w = k / k.sum(1, keepdims=True)
    return w @ y, w


@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_every_kernel_matches_brute_force_numpy(kernel):
    x, y = _data(seed=1)
    xq = np.linspace(0.2, 4.8, 30)
    ref, ref_w = _brute_force(xq, x, y, 0.9, kernel)
    out, w = nadaraya_watson(torch.tensor(xq), torch.tensor(x), torch.tensor(y), 0.9, kernel, return_weights=True)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-10)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-10, atol=1e-14)


def test_far_query_does_not_underflow_to_nan():
    """Naive exp(-u^2/2) underflows to 0/0 here in fp32; the softmax of log-kernels does not."""
    x = torch.tensor([0.0, 1.0])
    y = torch.tensor([1.0, 3.0])
    out = nadaraya_watson(torch.tensor([100.0]), x, y, bandwidth=0.5)
    assert torch.isfinite(out).all() and torch.allclose(out, torch.tensor([3.0]))
    naive = torch.exp(-0.5 * ((100.0 - x) / 0.5) ** 2)
    assert torch.isnan(naive / naive.sum()).all()


def test_multivariate_inputs_and_vector_values():
    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=torch.float64)
    y = torch.randn(30, 3, dtype=torch.float64)
    xq = torch.randn(5, 2, dtype=torch.float64)
    out, w = nadaraya_watson(xq, x, y, 0.7, return_weights=True)
    d2 = ((xq[:, None, :] - x[None]) ** 2).sum(-1)
    ref_w = torch.softmax(-0.5 * d2 / 0.49, dim=-1)
    assert out.shape == (5, 3)
    assert torch.allclose(w, ref_w) and torch.allclose(out, ref_w @ y)


def test_bandwidth_gradient_matches_finite_differences():
    x, y = (torch.tensor(a) for a in _data(20, seed=2))
    xq = torch.linspace(0, 5, 7, dtype=torch.float64)
    h = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda h: nadaraya_watson(xq, x, y, h), (h,))
    assert torch.autograd.gradcheck(lambda h: leave_one_out_mse(x, y, h), (h,))


def test_leave_one_out_matches_explicit_loop():
    x, y = _data(25, seed=3)
    for kernel in ("gaussian", "epanechnikov"):
        errors = []
        for i in range(len(x)):
            keep = np.arange(len(x)) != i
            pred, _ = _brute_force(x[i:i + 1], x[keep], y[keep], 0.8, kernel)
            if np.isfinite(pred).all():
                errors.append((y[i] - pred[0]) ** 2)
        ours = leave_one_out_mse(torch.tensor(x), torch.tensor(y), 0.8, kernel)
        assert np.isclose(float(ours), np.mean(errors))


def test_leave_one_out_infinite_when_no_neighbour_in_support():
    x = torch.tensor([0.0, 10.0, 20.0])
    assert leave_one_out_mse(x, torch.ones(3), 0.5, "boxcar") == float("inf")


def test_bandwidth_sweep_matches_statsmodels_cv_loo_and_fit():
    x, y = _data(30, seed=4)
    xq = np.linspace(0.0, 5.0, 17)
    truth = 2 * np.sin(xq) + xq**0.8
    grid = [0.05, 0.2, 0.5, 1.5]
    sweep = bandwidth_sweep(torch.tensor(x), torch.tensor(y), grid, x_test=torch.tensor(xq), y_test=torch.tensor(truth))
    assert list(sweep.columns) == ["bandwidth", "loo_mse", "test_mse"]
    assert sweep["bandwidth"].tolist() == grid
    for h, loo, test in sweep.itertuples(index=False):
        kr = _statsmodels(y, x, [h])
        assert np.isclose(loo, kr.cv_loo(np.array([h]), kr._est_loc_constant), rtol=1e-10)
        assert np.isclose(test, np.mean((kr.fit(xq)[0] - truth) ** 2), rtol=1e-10)


def test_bandwidth_sweep_minimum_is_near_statsmodels_cv_ls():
    x, y = _data(40, seed=5)
    grid = torch.logspace(-1.5, 0.5, 81, dtype=torch.float64)
    sweep = bandwidth_sweep(torch.tensor(x), torch.tensor(y), grid)
    assert list(sweep.columns) == ["bandwidth", "loo_mse"]
    best = sweep.loc[sweep["loo_mse"].idxmin(), "bandwidth"]
    reference = _statsmodels(y, x, "cv_ls").bw[0]
    step = 10 ** (2 / 80)  # ratio between neighbouring grid points
    assert reference / step**1.5 <= best <= reference * step**1.5


def test_bandwidth_sweep_infinite_where_compact_kernel_has_empty_windows():
    x = torch.tensor([0.0, 1.0, 2.0, 10.0])
    sweep = bandwidth_sweep(x, x.clone(), [0.5, 1.5], "boxcar", x_test=torch.tensor([5.0]), y_test=torch.tensor([5.0]))
    assert sweep["loo_mse"].tolist()[0] == float("inf")
    assert np.isfinite(sweep["loo_mse"].tolist()[1])
    assert sweep["test_mse"].tolist() == [float("inf"), float("inf")]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kernel=st.sampled_from(sorted(KERNELS)))
def test_bandwidth_sweep_does_not_depend_on_the_order_of_the_training_points(seed, kernel):
    x, y = (torch.tensor(a) for a in _data(15, seed=seed % 1000))
    perm = torch.randperm(15, generator=torch.Generator().manual_seed(seed))
    grid = [0.3, 1.0, 3.0]
    xq = torch.linspace(0.5, 4.5, 5, dtype=torch.float64)
    a = bandwidth_sweep(x, y, grid, kernel, x_test=xq, y_test=xq)
    b = bandwidth_sweep(x[perm], y[perm], grid, kernel, x_test=xq, y_test=xq)
    np.testing.assert_allclose(a.to_numpy(), b.to_numpy(), rtol=1e-12)


def test_bandwidth_sweep_errors():
    x, y = torch.linspace(0, 1, 5), torch.zeros(5)
    with pytest.raises(ValueError, match="at least one bandwidth"):
        bandwidth_sweep(x, y, [])
    with pytest.raises(ValueError, match="give both x_test and y_test, or neither"):
        bandwidth_sweep(x, y, [1.0], x_test=x)
    with pytest.raises(ValueError, match=r"y_test must be \(5,\) to match x_test \(5,\), got \(4,\)"):
        bandwidth_sweep(x, y, [1.0], x_test=x, y_test=torch.zeros(4))
    with pytest.raises(ValueError, match="bandwidth must be a positive finite number"):
        bandwidth_sweep(x, y, [1.0, -1.0])


def test_module_learns_and_keeps_positive_bandwidth():
    model = NadarayaWatson(bandwidth=0.3)
    x = torch.linspace(0, 1, 10)
    out = model(x, x, x**2)
    assert out.shape == (10,) and model.attention_weights.shape == (10, 10)
    assert torch.isclose(model.bandwidth, torch.tensor(0.3))


# ---------------------------------------------------------------- errors
def test_unknown_kernel():
    with pytest.raises(ValueError, match=r"unknown kernel 'cosine'; choose one of \['boxcar'"):
        kernel_scores(torch.zeros(2), torch.zeros(3), 1.0, "cosine")
    with pytest.raises(ValueError, match="unknown kernel"):
        NadarayaWatson(1.0, kernel="cosine")


@pytest.mark.parametrize("bandwidth", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_bandwidth(bandwidth):
    with pytest.raises(ValueError, match="bandwidth must be a positive finite number"):
        nadaraya_watson(torch.zeros(2), torch.zeros(3), torch.zeros(3), bandwidth)


def test_non_scalar_bandwidth():
    with pytest.raises(ValueError, match=r"bandwidth must be a scalar, got shape \(2,\)"):
        nadaraya_watson(torch.zeros(2), torch.zeros(3), torch.zeros(3), torch.ones(2))


def test_feature_size_mismatch():
    with pytest.raises(ValueError, match=r"x_query \(2, 3\) and x_train \(4, 2\) have different feature sizes"):
        nadaraya_watson(torch.zeros(2, 3), torch.zeros(4, 2), torch.zeros(4), 1.0)


def test_y_train_length_mismatch():
    with pytest.raises(ValueError, match=r"n_train=4 .from x_train \(4,\)., got \(3,\)"):
        nadaraya_watson(torch.zeros(2), torch.zeros(4), torch.zeros(3), 1.0)


def test_three_dimensional_inputs_rejected():
    with pytest.raises(ValueError, match=r"x_query must have shape \(n,\) or \(n, d\), got \(1, 2, 3\)"):
        nadaraya_watson(torch.zeros(1, 2, 3), torch.zeros(4), torch.zeros(4), 1.0)


def test_integer_inputs_rejected():
    with pytest.raises(TypeError, match="x_train must have a floating dtype, got torch.int64"):
        nadaraya_watson(torch.zeros(2), torch.zeros(4, dtype=torch.long), torch.zeros(4), 1.0)
    with pytest.raises(TypeError, match="y_train must be a float torch.Tensor"):
        nadaraya_watson(torch.zeros(2), torch.zeros(4), torch.zeros(4, dtype=torch.long), 1.0)


def test_compact_kernel_empty_window_names_the_query():
    with pytest.raises(ValueError, match=r"query 1 \(x=5.0\) has no training input within bandwidth 0.5"):
        nadaraya_watson(torch.tensor([0.1, 5.0]), torch.tensor([0.0, 0.3]), torch.ones(2), 0.5, "epanechnikov")


def test_leave_one_out_errors():
    with pytest.raises(ValueError, match="at least 2 training points"):
        leave_one_out_mse(torch.zeros(1), torch.zeros(1), 1.0)
    with pytest.raises(ValueError, match=r"y_train must be \(3,\) to match x_train"):
        leave_one_out_mse(torch.zeros(3), torch.zeros(2), 1.0)


def test_kernel_sd_matches_numerical_integration():
    """Each kernel's standard deviation in u, from sqrt(int u^2 K / int K) over the real line (scipy's quad)."""
    from scipy.integrate import quad

    from attnbook.kernels import KERNEL_SD, KERNELS, matched_bandwidths

    for name, (log_kernel, radius) in KERNELS.items():
        def k(u):
            return float(torch.exp(log_kernel(torch.tensor(abs(u), dtype=torch.float64)))) if abs(u) < radius else 0.0
        limit = min(radius, 60.0)
        mass = quad(k, -limit, limit, points=[0.0], limit=200)[0]
        second = quad(lambda u: u * u * k(u), -limit, limit, points=[0.0], limit=200)[0]
        assert math.sqrt(second / mass) == pytest.approx(KERNEL_SD[name], rel=1e-6), name
    h = matched_bandwidths(0.25)
    assert {name: h[name] * KERNEL_SD[name] for name in h} == pytest.approx({name: 0.25 for name in h})
    with pytest.raises(ValueError, match="sd must be positive"):
        matched_bandwidths(0.0)
