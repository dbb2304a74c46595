"""Low precision, extreme values and degenerate sizes (issue 18) in attnbook.attention, attnbook.kernels and
attnbook.hard_attention.gumbel_softmax, against independent references: torch's fused
F.scaled_dot_product_attention on fp32 copies, 1-nearest-neighbour regression by brute force in NumPy, and the
Gumbel-softmax formula evaluated in fp64."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnbook.attention import (
    AdditiveAttention,
    CosineAttention,
    DotProductAttention,
    MultiHeadAttention,
    scaled_dot_product_attention,
)
from attnbook.hard_attention import gumbel_softmax, sample_gumbel
from attnbook.kernels import kernel_scores, leave_one_out_mse, nadaraya_watson

LOW = [torch.float16, torch.bfloat16]
PATHS = [False, True]  # return_weights: fast (fused) path, explicit path
# About one rounding of the output (|v| < 8) and of the weights (<= 1) in the dtype; torch's own fused fp16/bf16
# kernel is off from the fp32 reference by as much (fp16 1e-3, bf16 8e-3 on the cases below).
OUT_TOL = {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}
WEIGHT_TOL = {torch.float16: dict(atol=1e-3, rtol=0), torch.bfloat16: dict(atol=4e-3, rtol=0)}


def _reference(q, k, v, mask):
    """torch's fused SDPA on fp32 copies, with rows that have no valid key set to zero (the attnbook convention),
    and the weights from the same kernel with identity values."""
    q, k, v = q.float(), k.float(), v.float()
    has_key = mask.any(-1, keepdim=True)
    attn_mask = mask | ~has_key
    out = torch.where(has_key, F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask), 0.0)
    eye = torch.eye(k.shape[-2]).expand(*k.shape[:-2], -1, -1)
    weights = torch.where(has_key, F.scaled_dot_product_attention(q, k, eye, attn_mask=attn_mask), 0.0)
    return out, weights


def _large_cases(dtype, n_q, n_k, d_k, seed, batch=48):
    """``batch`` attention problems whose inputs have magnitudes up to 10**3 (fp16) or 10**6 (bf16), so that many
    scores exceed the fp16 range; random bool masks with some fully masked rows."""
    g = torch.Generator().manual_seed(seed)
    magnitude = 10 ** (torch.rand(batch, 1, 1, generator=g) * (3.0 if dtype == torch.float16 else 6.0))
    q = (torch.randn(batch, n_q, d_k, generator=g) * magnitude).to(dtype)
    k = (torch.randn(batch, n_k, d_k, generator=g) * magnitude).to(dtype)
    v = torch.randn(batch, n_k, 3, generator=g).to(dtype)
    mask = torch.rand(batch, n_q, n_k, generator=g) < 0.6
    mask[::5, 0] = False                                                     # some fully masked rows for sure
    return q, k, v, mask


# ---------------------------------------------------------------- attention in fp16 / bf16
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n_q, n_k, d_k", [(1, 1, 1), (3, 5, 4), (4, 6, 16), (2, 7, 9)])
@pytest.mark.parametrize("return_weights", PATHS)
def test_fuzz_large_finite_inputs_are_finite_and_match_fp32_sdpa(dtype, n_q, n_k, d_k, return_weights):
    q, k, v, mask = _large_cases(dtype, n_q, n_k, d_k, seed=n_q * 100 + n_k * 10 + d_k)
    scores = (q.float() @ k.float().mT) / math.sqrt(d_k)
    if dtype == torch.float16 and d_k > 1:
        assert (scores.abs() > torch.finfo(torch.float16).max).any()          # the cases do leave fp16's range
    ref_out, ref_weights = _reference(q, k, v, mask)
    res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref_out, **OUT_TOL[dtype])
    empty = ~mask.any(-1)
    assert torch.all(out[empty] == 0)
    if return_weights:
        weights = res[1]
        assert weights.dtype == dtype and torch.isfinite(weights).all()
        torch.testing.assert_close(weights.float(), ref_weights, **WEIGHT_TOL[dtype])
        assert torch.all(weights[empty] == 0) and torch.all(weights[~mask] == 0)


@pytest.mark.parametrize("dtype", LOW)
def test_fuzz_without_mask(dtype):
    q, k, v, _ = _large_cases(dtype, 3, 5, 8, seed=7)
    ref_out, ref_weights = _reference(q, k, v, torch.ones(3, 5, dtype=torch.bool))
    out, weights = scaled_dot_product_attention(q, k, v, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(out.float(), ref_out, **OUT_TOL[dtype])
    torch.testing.assert_close(weights.float(), ref_weights, **WEIGHT_TOL[dtype])


@pytest.mark.parametrize("dtype", LOW)
def test_explicit_gradients_are_finite_on_overflowing_scores(dtype):
    q, k, v, mask = _large_cases(dtype, 3, 5, 8, seed=3, batch=8)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out, _ = scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    out.float().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("dtype", LOW)
def test_dot_product_module_explicit_equals_fused_on_overflowing_scores(dtype):
    q, k, v, mask = _large_cases(dtype, 4, 6, 8, seed=11)
    explicit = DotProductAttention()(q, k, v, mask[:, :1])
    fused = DotProductAttention(need_weights=False)(q, k, v, mask[:, :1])
    assert torch.isfinite(explicit).all()
    torch.testing.assert_close(explicit.float(), fused.float(), **OUT_TOL[dtype])


@pytest.mark.parametrize("dtype", LOW)
def test_multi_head_explicit_equals_fused_on_overflowing_scores(dtype):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(4, 5, 16, generator=g) * 300).to(dtype)
    mask = torch.rand(4, 1, 5, generator=g) < 0.7
    mask[0] = False
    with torch.no_grad():
        q = mha._split(mha.q_proj(x)).float()
        k = mha._split(mha.k_proj(x)).float()
        assert ((q @ k.mT) / math.sqrt(8) > torch.finfo(torch.float16).max).any()
        explicit = mha(x, x, x, mask)
        weights = mha.attention_weights
        mha.need_weights = False
        fused = mha(x, x, x, mask)
    assert torch.isfinite(explicit).all() and torch.isfinite(weights).all() and weights.dtype == dtype
    torch.testing.assert_close(explicit.float(), fused.float(), **OUT_TOL[dtype])


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("make", [lambda: AdditiveAttention(4, 4, 6), lambda: CosineAttention(init_scale=30.0)])
def test_scored_modules_in_low_precision_match_fp32(dtype, make):
    torch.manual_seed(0)
    module = make()
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 3, generator=g)
    mask = torch.tensor([[True, True, False, True, False]] * 3 + [[False] * 5] * 3).reshape(2, 3, 5)
    ref = module(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), mask)
    out = module.to(dtype)(q.to(dtype), k.to(dtype), v.to(dtype), mask)
    assert out.dtype == dtype and module.attention_weights.dtype == dtype
    assert torch.all(out[1] == 0)
    torch.testing.assert_close(out.float(), ref, atol=0.05, rtol=0.05)  # scores rounded to the dtype first


# ---------------------------------------------------------------- scale
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("return_weights", PATHS)
def test_non_finite_scale_is_rejected(scale, return_weights):
    q = torch.randn(2, 3, 4)
    with pytest.raises(ValueError, match=rf"scale must be a finite number, got {scale}"):
        scaled_dot_product_attention(q, q, q, scale=scale, return_weights=return_weights)


def test_scale_of_the_wrong_type_is_rejected():
    q = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="scale must be a real number or None, got 'big'"):
        scaled_dot_product_attention(q, q, q, scale="big")


@pytest.mark.parametrize("scale", [0.0, -0.5])
@pytest.mark.parametrize("return_weights", PATHS)
def test_zero_and_negative_scale_are_defined_as_in_torch(scale, return_weights):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 4, generator=g, dtype=torch.float64) for n in (3, 5, 5))
    mask = torch.rand(2, 3, 5, generator=g) < 0.7
    mask[:, :, 0] = True
    res = scaled_dot_product_attention(q, k, v, mask, scale=scale, return_weights=return_weights)
    out = res[0] if return_weights else res
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale))
    if scale == 0.0 and return_weights:  # uniform over the valid keys
        torch.testing.assert_close(res[1], (mask / mask.sum(-1, keepdim=True)).double())


@pytest.mark.parametrize("init_scale", [math.inf, math.nan, 0.0, -1.0])
def test_cosine_init_scale_must_be_positive_and_finite(init_scale):
    with pytest.raises(ValueError, match=rf"init_scale must be positive and finite, got {init_scale}"):
        CosineAttention(init_scale=init_scale)


# ---------------------------------------------------------------- empty and degenerate sizes
EMPTY_SHAPES = {  # (q, k, v)
    "no queries": ((2, 0, 4), (2, 5, 4), (2, 5, 3)),
    "no keys": ((2, 3, 4), (2, 0, 4), (2, 0, 3)),
    "no batch": ((0, 3, 4), (0, 5, 4), (0, 5, 3)),
    "no queries, no keys": ((2, 0, 4), (2, 0, 4), (2, 0, 3)),
    "no value features": ((2, 3, 4), (2, 5, 4), (2, 5, 0)),
}


@pytest.mark.parametrize("shapes", list(EMPTY_SHAPES), ids=list(EMPTY_SHAPES))
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("return_weights", PATHS)
def test_empty_sizes_give_the_result_of_torch_sdpa(shapes, with_mask, return_weights):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in EMPTY_SHAPES[shapes])
    mask = torch.rand(q.shape[0], q.shape[1], k.shape[1], generator=g) < 0.5 if with_mask else None
    res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    ref = F.scaled_dot_product_attention(q, k, v)  # no keys: every row fully masked, zero output
    assert out.shape == ref.shape
    if mask is None or k.shape[1] == 0:
        torch.testing.assert_close(out, ref)
    if k.shape[1] == 0:
        assert torch.all(out == 0)
    if return_weights:
        assert res[1].shape == (q.shape[0], q.shape[1], k.shape[1])


def test_no_keys_gradient_is_zero():
    q, k, v = torch.randn(2, 3, 4, requires_grad=True), torch.randn(2, 0, 4), torch.randn(2, 0, 3)
    out, _ = scaled_dot_product_attention(q, k, v, return_weights=True)
    out.sum().backward()
    assert torch.all(q.grad == 0)


@pytest.mark.parametrize("n_q, n_k", [(0, 5), (3, 0), (0, 0)])
@pytest.mark.parametrize("need_weights", [False, True])
def test_multi_head_with_no_queries_or_no_keys(n_q, n_k, need_weights):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, need_weights=need_weights).eval()
    queries, keys = torch.randn(2, n_q, 8), torch.randn(2, n_k, 8)
    out = mha(queries, keys, keys, torch.ones(2, 1, n_k, dtype=torch.bool))
    assert out.shape == (2, n_q, 8)
    if n_k == 0:  # a zero context in every head: the output is out_proj's bias
        torch.testing.assert_close(out, mha.out_proj.bias.expand(2, n_q, 8))
    if need_weights:
        assert mha.attention_weights.shape == (2, 2, n_q, n_k)


@pytest.mark.parametrize("return_weights", PATHS)
def test_d_k_zero_is_an_error_where_torch_gives_uniform_weights(return_weights):
    """With d_k = 0 there is nothing to compare: torch's SDPA silently averages the values (uniform weights); the
    book's functions raise, naming the argument (issue 33)."""
    q, k, v = torch.randn(2, 3, 0), torch.randn(2, 4, 0), torch.randn(2, 4, 5)
    ref = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(ref, v.mean(1, keepdim=True).expand(2, 3, 5))   # what torch does
    with pytest.raises(ValueError, match=r"queries have a zero-width last dim \(d_k = 0\)"):
        scaled_dot_product_attention(q, k, v, return_weights=return_weights)


def test_dot_product_module_rejects_d_zero():
    q, k, v = torch.randn(2, 3, 0), torch.randn(2, 4, 0), torch.randn(2, 4, 5)
    with pytest.raises(ValueError, match=r"d_k = 0"):
        DotProductAttention()(q, k, v)


# ---------------------------------------------------------------- gumbel_softmax
@pytest.mark.parametrize("dtype, big", [(torch.float16, 6.0e4), (torch.bfloat16, 1e30), (torch.float32, 1e30)])
@pytest.mark.parametrize("tau", [1.0, 1e-3, 1e-10])
@pytest.mark.parametrize("hard", [False, True])
def test_gumbel_softmax_large_finite_logits_give_no_nan(dtype, big, tau, hard):
    logits = torch.tensor([[big, -big, 0.0, big / 2], [0.0, 1.0, 2.0, 3.0]], dtype=dtype)
    sample = gumbel_softmax(logits, tau=tau, hard=hard, generator=torch.Generator().manual_seed(0))
    assert sample.dtype == dtype and torch.isfinite(sample).all()
    torch.testing.assert_close(sample.float().sum(-1), torch.ones(2), atol=1e-2, rtol=0)
    assert sample[0].argmax() == 0                                        # big beats big / 2 by far more than g


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gumbel_softmax_low_precision_equals_the_formula_in_fp64(dtype):
    """The noise is drawn in fp32 for fp16/bf16 logits (documented), so the formula can be evaluated in fp64."""
    logits = (torch.randn(3, 5, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    sample = gumbel_softmax(logits, tau=0.5, generator=torch.Generator().manual_seed(2))
    g = sample_gumbel((3, 5), generator=torch.Generator().manual_seed(2), dtype=torch.float32)
    ref = torch.softmax((logits.double() + g.double()) / 0.5, dim=-1)
    torch.testing.assert_close(sample.double(), ref, **WEIGHT_TOL[dtype])


def test_gumbel_softmax_empty_dims():
    assert gumbel_softmax(torch.zeros(0, 3), hard=True).shape == (0, 3)
    with pytest.raises(ValueError, match=r"at least one category along dim=-1, got shape \(3, 0\)"):
        gumbel_softmax(torch.zeros(3, 0))
    with pytest.raises(ValueError, match=r"at least one category along dim=0, got shape \(0, 3\)"):
        gumbel_softmax(torch.zeros(0, 3), hard=True, dim=0)
    with pytest.raises(ValueError, match=r"dim=2 is out of range for logits of shape \(3, 4\)"):
        gumbel_softmax(torch.zeros(3, 4), dim=2)


@pytest.mark.parametrize("tau", [math.inf, math.nan, 0.0, -1.0])
def test_gumbel_softmax_tau_must_be_positive_and_finite(tau):
    with pytest.raises(ValueError, match=rf"tau must be positive and finite, got {tau}"):
        gumbel_softmax(torch.zeros(3), tau=tau)


# ---------------------------------------------------------------- Nadaraya-Watson: vanishing bandwidth, fp16/bf16
def _nearest_neighbour(xq, x, y):
    """1-NN regression by brute force: the mean of y over the training inputs at the smallest distance."""
    d = np.linalg.norm(xq[:, None, :] - x[None, :, :], axis=-1)
    nearest = d == d.min(axis=1, keepdims=True)
    weights = nearest / nearest.sum(axis=1, keepdims=True)
    return weights @ y, weights


@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
@pytest.mark.parametrize("dtype, bandwidth", [(torch.float32, 1e-30), (torch.float32, 1e-40),
                                              (torch.float32, 1e-300), (torch.float64, 1e-300)])
def test_vanishing_bandwidth_gives_nearest_neighbour(kernel, dtype, bandwidth):
    x = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 1.0], [3.0, 0.0], [1.0, 0.0]])   # a duplicate: a tie
    y = np.array([1.0, 2.0, 3.0, 4.0, 6.0])
    xq = np.array([[0.4, 0.0], [1.5, 0.0], [2.5, 0.5], [0.1, 0.1], [1.2, 0.0], [3.0, 0.0]])  # (2.5, .5): a tie
    ref, ref_w = _nearest_neighbour(xq, x, y)
    out, w = nadaraya_watson(torch.tensor(xq, dtype=dtype), torch.tensor(x, dtype=dtype),
                             torch.tensor(y, dtype=dtype), bandwidth, kernel, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    np.testing.assert_allclose(w.numpy(), ref_w, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)


@pytest.mark.parametrize("kernel", ["epanechnikov", "boxcar"])
def test_bandwidth_below_the_dtype_range_keeps_coinciding_points_in_a_compact_support(kernel):
    """h = 1e-300 is 0 in fp32; a query on a training input is still at u = 0, inside the support."""
    x, y = torch.tensor([0.0, 1.0, 2.0, 1.0]), torch.tensor([1.0, 2.0, 3.0, 5.0])
    out = nadaraya_watson(torch.tensor([0.0, 1.0]), x, y, 1e-300, kernel)
    torch.testing.assert_close(out, torch.tensor([1.0, 3.5]))
    with pytest.raises(ValueError, match=r"query 0 \(x=0.5\) has no training input within bandwidth 1e-300"):
        nadaraya_watson(torch.tensor([0.5]), x, y, 1e-300, kernel)


def test_vanishing_bandwidth_leave_one_out_is_nearest_neighbour():
    x, y = np.array([0.0, 1.0, 2.0, 3.5]), np.array([1.0, 2.0, 3.0, 4.0])
    errors = []
    for i in range(4):
        others = np.arange(4) != i
        pred, _ = _nearest_neighbour(x[i:i + 1, None], x[others, None], y[others])
        errors.append((y[i] - pred[0]) ** 2)
    loo = leave_one_out_mse(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32), 1e-30)
    assert math.isfinite(float(loo))
    assert float(loo) == pytest.approx(np.mean(errors), rel=1e-6)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("kernel", ["gaussian", "epanechnikov"])
def test_nadaraya_watson_in_low_precision_matches_fp64(dtype, kernel):
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(20, generator=g) * 5).to(dtype)                         # <= 25: cdist has no fp16 kernel
    y = torch.sin(x.double()).to(dtype)
    xq = torch.linspace(0.5, 4.5, 9).to(dtype)
    out, w = nadaraya_watson(xq, x, y, 0.7, kernel, return_weights=True)
    ref, ref_w = nadaraya_watson(xq.double(), x.double(), y.double(), 0.7, kernel, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    torch.testing.assert_close(out.double(), ref, **OUT_TOL[dtype])
    torch.testing.assert_close(w.double(), ref_w, **WEIGHT_TOL[dtype])
    scores, mask = kernel_scores(xq, x, 0.7, kernel)
    assert scores.dtype == dtype and mask.dtype == torch.bool
    loo = leave_one_out_mse(x, y, 0.7, kernel)
    assert loo.dtype == dtype
    assert float(loo) == pytest.approx(float(leave_one_out_mse(x.double(), y.double(), 0.7, kernel)), rel=2e-2)


def test_nadaraya_watson_dtype_mismatch_is_a_type_error():
    with pytest.raises(TypeError, match="x_query and x_train must share one dtype, got torch.float16 and "
                                        "torch.float32"):
        nadaraya_watson(torch.zeros(2, dtype=torch.float16), torch.zeros(3), torch.zeros(3), 1.0)
