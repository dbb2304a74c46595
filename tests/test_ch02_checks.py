"""The checks that chapter 2 ("Kernel regression as non-parametric attention") runs off the page, against independent
references: leave-one-out cross-validation as a masked softmax with the diagonal masked, the claims its prose makes
about the bandwidth (training error below the noise, cross-validation error above it, kernel shape against width),
and the learned bandwidth: on the leave-one-out loss it converges to statsmodels' cross-validated bandwidth, on the
plain training loss it collapses. The data are the chapter's (quick mode): 50 points of 2 sin x + x^0.8 + noise."""

import math
import warnings

import pytest
import torch
from statsmodels.nonparametric.kernel_regression import KernelReg

from attnbook.kernels import NadarayaWatson, bandwidth_sweep, leave_one_out_mse, nadaraya_watson
from attnbook.masking import masked_softmax

pytestmark = pytest.mark.usefixtures("one_thread")

NOISE_SD = 0.5


def _f(x):
    return 2 * torch.sin(x) + x**0.8


@pytest.fixture(scope="module")
def data():
    """The chapter's synthetic data in quick mode: the same generator, seed and sizes."""
    gen = torch.Generator().manual_seed(0)
    x, _ = torch.sort(5 * torch.rand(50, generator=gen, dtype=torch.float64))
    y = _f(x) + NOISE_SD * torch.randn(50, generator=gen, dtype=torch.float64)
    x_test = torch.linspace(0, 5, 101, dtype=torch.float64)
    return x, y, x_test, _f(x_test)


def _cv_ls(x, y):
    """statsmodels' least-squares cross-validated bandwidth (local constant)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return KernelReg(y.numpy(), x.numpy(), var_type="c", reg_type="lc", bw="cv_ls").bw[0]


def _train(loss_fn, steps=200, lr=0.05, h_init=1.0):
    model = NadarayaWatson(bandwidth=h_init)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    history = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss_fn(model).backward()
        optimizer.step()
        history.append(model.bandwidth.item())
    return history


def test_leave_one_out_is_a_masked_softmax_with_the_diagonal_masked(data):
    x, y, _, _ = data
    for h in (0.1, 0.5, 2.0):
        scores = -((x[:, None] - x[None, :]) ** 2) / (2 * h**2)
        weights = masked_softmax(scores, ~torch.eye(len(x), dtype=torch.bool))
        assert weights.diagonal().abs().max() == 0
        inline = ((y - weights @ y) ** 2).mean()
        torch.testing.assert_close(inline, leave_one_out_mse(x, y, h), rtol=0, atol=1e-12)


def test_bandwidth_claims_of_the_chapter(data):
    x, y, x_test, truth = data
    train_mse = ((nadaraya_watson(x, x, y, 0.05) - y) ** 2).mean()
    assert train_mse < NOISE_SD**2  # each point mostly attends to itself
    grid = torch.logspace(-2, 1, 61, dtype=torch.float64)
    sweep = bandwidth_sweep(x, y, grid, x_test=x_test, y_test=truth)
    assert (sweep["loo_mse"] > NOISE_SD**2).all()  # every held-out label carries its own noise
    best = sweep.loc[sweep["loo_mse"].idxmin(), "bandwidth"]
    assert abs(math.log(best / _cv_ls(x, y))) <= math.log(grid[1] / grid[0])


def test_kernel_shape_matters_less_than_its_width(data):
    x, y, x_test, truth = data
    sd_in_u = {"gaussian": 1.0, "laplacian": math.sqrt(2), "epanechnikov": 1 / math.sqrt(5),
               "boxcar": 1 / math.sqrt(3)}
    sd = 0.25

    def mse(h, kernel="gaussian"):
        return ((nadaraya_watson(x_test, x, y, h, kernel=kernel) - truth) ** 2).mean().item()

    shapes = [mse(sd / s, kernel) for kernel, s in sd_in_u.items()]
    widths = [mse(factor * sd) for factor in (0.5, 1.0, 2.0)]
    assert max(shapes) - min(shapes) < max(widths) - min(widths)


def test_learned_bandwidth_converges_on_the_masked_loss_and_collapses_on_the_plain_one(data):
    x, y, _, _ = data
    h_cv = _cv_ls(x, y)
    masked = _train(lambda m: leave_one_out_mse(x, y, m.bandwidth))
    assert abs(masked[-1] / h_cv - 1) < 0.01
    plain = _train(lambda m: ((m(x, x, y) - y) ** 2).mean())
    assert plain[-1] < plain[-2] and plain[-1] < masked[-1] / 10
