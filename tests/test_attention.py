"""attnbook.attention against independent references: torch's fused F.scaled_dot_product_attention (outputs,
weights and gradients), nn.MultiheadAttention with copied weights, explicit loops, finite differences
(gradcheck), and hypothesis properties of padding invariance."""


import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.attention import (
    AdditiveAttention,
    CosineAttention,
    DotProductAttention,
    MultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention,
)
from attnbook.masking import lengths_to_mask, masked_softmax

PATHS = [False, True]  # return_weights: fast path, explicit path
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-8)}


def _qkv(dtype, batch=(3,), n_q=5, n_k=7, d_k=4, d_v=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return make(*batch, n_q, d_k), make(*batch, n_k, d_k), make(*batch, n_k, d_v)


def _run(fn, q, k, v, upstream):
    """Output and gradients of (output * upstream).sum() w.r.t. q, k, v."""
    out = fn(q, k, v)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v))
    return out, grads


def _ours(mask, return_weights, **kw):
    def fn(q, k, v):
        res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights, **kw)
        return res[0] if return_weights else res
    return fn


MASKS = {
    "none": lambda b, n_q, n_k: None,
    "padding": lambda b, n_q, n_k: lengths_to_mask(torch.tensor([n_k, 3, 1]), n_k)[:, None, :],
    "causal": lambda b, n_q, n_k: causal_mask(n_q, n_k),
    "broadcast_1d": lambda b, n_q, n_k: torch.tensor([True, False] * (n_k // 2) + [True] * (n_k % 2)),
    "full": lambda b, n_q, n_k: torch.rand(b, n_q, n_k, generator=torch.Generator().manual_seed(5)) < 0.7,
}


# ---------------------------------------------------------------- both paths against torch's fused kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("return_weights", PATHS)
def test_outputs_and_gradients_equal_torch_sdpa(dtype, mask_name, return_weights):
    q, k, v = _qkv(dtype)
    mask = MASKS[mask_name](3, 5, 7)
    if mask is not None and mask_name == "full":
        mask[..., 0] = True  # no fully masked rows here (tested separately)
    upstream = torch.randn(3, 5, 3, dtype=torch.float64).to(dtype)
    out, grads = _run(_ours(mask, return_weights), q, k, v, upstream)
    ref, ref_grads = _run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), q, k, v, upstream)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_explicit_weights_equal_torch_sdpa_with_identity_values(dtype):
    """With v = identity, torch's fused attention returns the weights themselves."""
    q, k, _ = _qkv(dtype)
    mask = lengths_to_mask(torch.tensor([7, 3, 1]), 7)[:, None, :] & causal_mask(5, 7)
    eye = torch.eye(7, dtype=dtype).expand(3, 7, 7)
    _, weights = scaled_dot_product_attention(q, k, eye, mask, return_weights=True)
    torch.testing.assert_close(weights, F.scaled_dot_product_attention(q, k, eye, attn_mask=mask), **TOL[dtype])


@pytest.mark.parametrize("return_weights", PATHS)
def test_multi_head_batch_dims_and_broadcast_mask(return_weights):
    q, k, v = _qkv(torch.float64, batch=(2, 4))
    mask = lengths_to_mask(torch.tensor([7, 2]), 7)[:, None, None, :]  # (batch, 1, 1, n_keys)
    out = _ours(mask, return_weights)(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("return_weights", PATHS)
def test_batch_dims_broadcast_one_query_for_all(return_weights):
    q, k, v = _qkv(torch.float64, batch=(3,))
    q1 = q[:1].detach()
    out = _ours(None, return_weights)(q1, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q1.expand(3, -1, -1), k, v))


@pytest.mark.parametrize("return_weights", PATHS)
def test_scale_argument_matches_torch(return_weights):
    q, k, v = _qkv(torch.float64)
    out = _ours(None, return_weights, scale=1.0)(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=1.0))


# ---------------------------------------------------------------- fully masked rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("return_weights", PATHS)
def test_fully_masked_rows_zero_and_other_rows_equal_reference(dtype, return_weights):
    q, k, v = _qkv(dtype)
    mask = MASKS["full"](3, 5, 7).all(0)  # (n_q, n_k), the same for every batch element
    mask[0] = mask[0] | torch.tensor([True] + [False] * 6)
    mask[1] = False
    mask[3] = False
    valid = mask.any(-1)
    upstream = torch.randn(3, 5, 3, dtype=torch.float64).to(dtype)
    out, (gq, gk, gv) = _run(_ours(mask, return_weights), q, k, v, upstream)
    # Reference: torch's fused attention on the queries that have at least one key.
    ref, (rq, rk, rv) = _run(
        lambda q_, k_, v_: F.scaled_dot_product_attention(q_[:, valid], k_, v_, attn_mask=mask[valid]),
        q, k, v, upstream[:, valid])
    assert torch.isfinite(out).all() and torch.isfinite(gq).all() and torch.isfinite(gk).all()
    assert torch.all(out[:, ~valid] == 0) and torch.all(gq[:, ~valid] == 0)
    torch.testing.assert_close(out[:, valid], ref, **TOL[dtype])
    for g, r in ((gq, rq), (gk, rk), (gv, rv)):
        torch.testing.assert_close(g, r, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("return_weights", PATHS)
def test_fully_masked_rows_never_nan_in_any_dtype(dtype, return_weights):
    q, k, v = _qkv(dtype)
    mask = lengths_to_mask(torch.tensor([0, 4, 7]), 7)[:, None, :]
    res = scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = res[0] if return_weights else res
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.all(out[0] == 0)
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    if return_weights:
        assert torch.all(res[1][0] == 0)
        torch.testing.assert_close(res[1].float().sum(-1)[1:], torch.ones(2, 5), atol=1e-2, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_explicit_weights_equal_masked_softmax_even_with_very_negative_scores(dtype):
    """Scores around -2e4 in fp16: an additive finfo.min bias would overflow to -inf; ours stays exact."""
    q = torch.full((1, 2, 1), -100.0, dtype=dtype)
    k = torch.tensor([[[200.0], [201.0], [150.0], [-3.0]]], dtype=dtype)
    v = torch.eye(4, dtype=dtype)[None]
    mask = torch.tensor([[True, True, False, False], [False] * 4])
    _, w = scaled_dot_product_attention(q, k, v, mask, scale=1.0, return_weights=True)
    ref = masked_softmax((q @ k.mT).float(), mask)
    assert torch.isfinite(w).all()
    assert torch.all(w[..., 2:] == 0) and torch.all(w[0, 1] == 0)
    torch.testing.assert_close(w.float(), ref, atol=1e-2, rtol=0)


# ---------------------------------------------------------------- dropout
def test_explicit_dropout_zeroes_or_rescales_each_weight():
    torch.manual_seed(0)
    q, k, _ = _qkv(torch.float64)
    eye = torch.eye(7, dtype=torch.float64).expand(3, 7, 7)
    mask = lengths_to_mask(torch.tensor([0, 4, 7]), 7)[:, None, :]
    out, w = scaled_dot_product_attention(q, k, eye, mask, dropout_p=0.5, return_weights=True)
    kept = torch.isclose(out, 2 * w)
    assert torch.all(kept | (out == 0))
    assert kept[w > 0].any() and (out[w > 0] == 0).any()
    torch.testing.assert_close(w.sum(-1)[1:], torch.ones(2, 5, dtype=torch.float64))


def test_fast_dropout_is_finite_and_zero_on_fully_masked_rows():
    torch.manual_seed(0)
    q, k, v = _qkv(torch.float32)
    mask = lengths_to_mask(torch.tensor([0, 4, 7]), 7)[:, None, :]
    out = scaled_dot_product_attention(q, k, v, mask, dropout_p=0.3)
    assert torch.isfinite(out).all() and torch.all(out[0] == 0)


# ---------------------------------------------------------------- modules
def test_dot_product_module_equals_torch_and_keeps_weights():
    q, k, v = _qkv(torch.float64)
    mask = MASKS["padding"](3, 5, 7)
    att = DotProductAttention()
    torch.testing.assert_close(att(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert att.attention_weights.shape == (3, 5, 7) and not att.attention_weights.requires_grad
    torch.testing.assert_close(att.attention_weights, masked_softmax(att.scores(q, k), mask))
    unscaled = DotProductAttention(scaled=False)
    torch.testing.assert_close(unscaled(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, mask, scale=1.0))
    fast = DotProductAttention(need_weights=False)
    torch.testing.assert_close(fast(q, k, v, mask), att(q, k, v, mask))
    assert fast.attention_weights is None


def test_general_score_equals_bilinear_form():
    q, k, v = _qkv(torch.float64, d_k=4)
    k6 = torch.randn(3, 7, 6, dtype=torch.float64)
    att = DotProductAttention(scaled=False, query_size=4, key_size=6).double()
    W = att.W_a.weight  # (4, 6)
    expected = torch.einsum("bqd,de,bke->bqk", q, W, k6)
    torch.testing.assert_close(att.scores(q, k6), expected)
    torch.testing.assert_close(att(q, k6, v), torch.softmax(expected, -1) @ v)


def test_additive_attention_equals_explicit_loop():
    torch.manual_seed(0)
    att = AdditiveAttention(query_size=4, key_size=6, hidden_size=5, bias=True).double()
    q = torch.randn(2, 3, 4, dtype=torch.float64)
    k = torch.randn(2, 7, 6, dtype=torch.float64)
    v = torch.randn(2, 7, 2, dtype=torch.float64)
    mask = lengths_to_mask(torch.tensor([7, 2]), 7)[:, None, :]
    Wq, Wk, bk, wv = att.W_q.weight, att.W_k.weight, att.W_k.bias, att.w_v.weight[0]
    expected = torch.empty(2, 3, 2, dtype=torch.float64)
    for b in range(2):
        n = int(mask[b, 0].sum())
        for i in range(3):
            s = torch.stack([wv @ torch.tanh(Wq @ q[b, i] + Wk @ k[b, j] + bk) for j in range(n)])
            expected[b, i] = torch.softmax(s, 0) @ v[b, :n]
    torch.testing.assert_close(att(q, k, v, mask), expected)
    assert att.attention_weights.shape == (2, 3, 7) and torch.all(att.attention_weights[1, :, 2:] == 0)


def test_cosine_attention_scores_are_scaled_cosines():
    torch.manual_seed(0)
    att = CosineAttention(init_scale=3.0).double()
    q, k, v = _qkv(torch.float64)
    expected = 3.0 * F.cosine_similarity(q.unsqueeze(-2), k.unsqueeze(-3), dim=-1)
    torch.testing.assert_close(att.scores(q, k), expected)
    torch.testing.assert_close(att(q, k, v), torch.softmax(expected, -1) @ v)
    assert att.attention_weights.shape == (3, 5, 7)
    zero_key = torch.zeros(1, 1, 4, dtype=torch.float64)
    assert torch.all(att.scores(q[:1], zero_key) == 0)  # a zero (padding) state scores 0, not NaN
    fixed = CosineAttention(learn_scale=False)
    assert len(list(fixed.parameters())) == 0 and float(fixed.scale) == 1.0


def test_cosine_scale_learns():
    att = CosineAttention()
    q = torch.randn(1, 1, 4)
    k = torch.cat([q, torch.randn(1, 9, 4)], 1)
    opt = torch.optim.SGD(att.parameters(), lr=1.0)
    for _ in range(20):
        opt.zero_grad()
        (-att(q, k, torch.eye(10)[None])[0, 0, 0].log()).backward()
        opt.step()
    assert float(att.scale.detach()) > 2.0


@pytest.mark.parametrize("make", [
    lambda: AdditiveAttention(4, 3, 5, bias=True),
    lambda: CosineAttention(init_scale=2.0),
    lambda: DotProductAttention(query_size=4, key_size=3),
])
def test_gradcheck_modules_with_fully_masked_row(make):
    torch.manual_seed(0)
    att = make().double()
    q = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 3 if not isinstance(att, CosineAttention) else 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    params = tuple(att.parameters())
    assert torch.autograd.gradcheck(lambda *xs: att(xs[0], xs[1], xs[2], mask), (q, k, v) + params)


def test_gradcheck_sdpa_explicit_path():
    q, k, v = _qkv(torch.float64)
    mask = MASKS["full"](3, 5, 7)
    assert torch.autograd.gradcheck(lambda *x: scaled_dot_product_attention(*x, mask, return_weights=True), (q, k, v))


# ---------------------------------------------------------------- multi-head against nn.MultiheadAttention
def _copy_to_torch(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    ref = nn.MultiheadAttention(ours.embed_dim, ours.num_heads, batch_first=True, kdim=ours.kdim, vdim=ours.vdim)
    ref = ref.to(ours.q_proj.weight.dtype)
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        else:
            ref.q_proj_weight.copy_(ours.q_proj.weight)
            ref.k_proj_weight.copy_(ours.k_proj.weight)
            ref.v_proj_weight.copy_(ours.v_proj.weight)
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("kind", ["self_padding", "causal_and_padding", "cross_kdim"])
def test_multi_head_equals_torch_multihead_attention(dtype, need_weights, kind):
    torch.manual_seed(0)
    kdim = vdim = 12 if kind == "cross_kdim" else None
    ours = MultiHeadAttention(12, 3, kdim=kdim, vdim=vdim, need_weights=need_weights).to(dtype)
    ref = _copy_to_torch(ours)
    x = torch.randn(2, 5, 12, dtype=dtype, requires_grad=True)
    mem = torch.randn(2, 6, 12, dtype=dtype) if kind == "cross_kdim" else x
    n_k = mem.shape[1]
    key_mask = lengths_to_mask(torch.tensor([n_k, 3]), n_k)  # (batch, n_keys), True = takes part
    attn_mask = causal_mask(5) if kind == "causal_and_padding" else None
    mask = key_mask[:, None, :] & attn_mask if attn_mask is not None else key_mask[:, None, :]
    out = ours(x, mem, mem, mask)
    # torch's convention: key_padding_mask and a bool attn_mask are True = ignored
    ref_out, ref_w = ref(x, mem, mem, key_padding_mask=~key_mask,
                         attn_mask=None if attn_mask is None else ~attn_mask, average_attn_weights=False)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref_out, **tol)
    if need_weights:
        torch.testing.assert_close(ours.attention_weights, ref_w.detach(), **tol)
    g = torch.randn_like(out)
    (gx,) = torch.autograd.grad((out * g).sum(), x)
    (rx,) = torch.autograd.grad((ref_out * g).sum(), x)
    torch.testing.assert_close(gx, rx, **tol)
    grads = torch.autograd.grad((ours(x, mem, mem, mask) * g).sum(), ours.out_proj.weight)[0]
    ref_grads = torch.autograd.grad((ref(x, mem, mem, key_padding_mask=~key_mask, attn_mask=None if attn_mask is None
                                         else ~attn_mask)[0] * g).sum(), ref.out_proj.weight)[0]
    torch.testing.assert_close(grads, ref_grads, **tol)


def test_multi_head_fully_masked_query_gives_bias_not_nan():
    torch.manual_seed(0)
    ours = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    mask = torch.tensor([[True, True, True], [False, False, False]])[:, None, :]
    out = ours(x, x, x, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1], ours.out_proj.bias.detach().expand(3, 8))
    assert torch.isnan(_copy_to_torch(ours)(x, x, x, key_padding_mask=~mask[:, 0])[0][1]).all()  # torch: NaN


def test_multi_head_per_head_mask():
    ours = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8)
    mask = torch.ones(1, 2, 3, 3, dtype=torch.bool)
    mask[0, 1, :, 0] = False
    ours(x, x, x, mask)
    assert torch.all(ours.attention_weights[0, 1, :, 0] == 0) and torch.all(ours.attention_weights[0, 0] > 0)


# ---------------------------------------------------------------- properties: padding invariance
@st.composite
def padded_batch(draw):
    batch = draw(st.integers(1, 3))
    n_q = draw(st.integers(1, 4))
    n_k = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, n_k), min_size=batch, max_size=batch))
    extra = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    return batch, n_q, n_k, torch.tensor(lengths), extra, seed


def _pad_further(k, v, lengths, extra, g):
    """Append `extra` pad keys/values with arbitrary contents and scramble the existing pads."""
    n_k = k.shape[1]
    k2 = torch.cat([k, 50 * torch.randn(k.shape[0], extra, k.shape[2], generator=g, dtype=k.dtype)], 1)
    v2 = torch.cat([v, 50 * torch.randn(v.shape[0], extra, v.shape[2], generator=g, dtype=v.dtype)], 1)
    keep = lengths_to_mask(lengths, n_k + extra)[:, :, None]
    return torch.where(keep, k2, -3 * k2 + 7), torch.where(keep, v2, 5 * v2 - 1)


MODULES = {
    "sdpa_fast": lambda d: (lambda q, k, v, m: scaled_dot_product_attention(q, k, v, m)),
    "sdpa_explicit": lambda d: (lambda q, k, v, m: scaled_dot_product_attention(q, k, v, m, return_weights=True)[0]),
    "additive": lambda d: AdditiveAttention(d, d, 5, bias=True).double(),
    "cosine": lambda d: CosineAttention(2.0).double(),
    "dot_general": lambda d: DotProductAttention(query_size=d, key_size=d).double(),
    "multi_head": lambda d: MultiHeadAttention(d, 2).double(),
}


@pytest.mark.parametrize("name", list(MODULES))
@settings(max_examples=40, deadline=None)
@given(data=padded_batch())
def test_property_output_unchanged_by_further_padding(name, data):
    batch, n_q, n_k, lengths, extra, seed = data
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d = 4
    att = MODULES[name](d)
    q = torch.randn(batch, n_q, d, generator=g, dtype=torch.float64)
    k = torch.randn(batch, n_k, d, generator=g, dtype=torch.float64)
    v = torch.randn(batch, n_k, d, generator=g, dtype=torch.float64)
    out = att(q, k, v, lengths_to_mask(lengths, n_k)[:, None, :])
    k2, v2 = _pad_further(k, v, lengths, extra, g)
    out2 = att(q, k2, v2, lengths_to_mask(lengths, n_k + extra)[:, None, :])
    torch.testing.assert_close(out, out2, atol=1e-10, rtol=1e-10)
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- errors
def _x(*s, dtype=torch.float32):
    return torch.zeros(*s, dtype=dtype)


@pytest.mark.parametrize("return_weights", PATHS)
def test_non_bool_mask_raises(return_weights):
    with pytest.raises(TypeError, match=r"mask must be a bool tensor \(True = takes part\), got dtype torch.int64"):
        scaled_dot_product_attention(_x(2, 3, 4), _x(2, 5, 4), _x(2, 5, 4), torch.ones(2, 3, 5, dtype=torch.long),
                                     return_weights=return_weights)


def test_mask_not_a_tensor_raises():
    with pytest.raises(TypeError, match="mask must be a bool torch.Tensor, got list"):
        scaled_dot_product_attention(_x(1, 2, 4), _x(1, 2, 4), _x(1, 2, 4), [[True, False]])


def test_mask_shape_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 4\) does not broadcast to "
                                         r"\(\.\.\., n_queries, n_keys\) = \(2, 3, 5\)"):
        scaled_dot_product_attention(_x(2, 3, 4), _x(2, 5, 4), _x(2, 5, 4), torch.ones(2, 1, 4, dtype=torch.bool))


def test_mask_that_would_enlarge_the_output_is_rejected():
    with pytest.raises(ValueError, match=r"mask of shape \(7, 2, 3, 5\) does not broadcast"):
        scaled_dot_product_attention(_x(2, 3, 4), _x(2, 5, 4), _x(2, 5, 4), torch.ones(7, 2, 3, 5, dtype=torch.bool))


def test_d_k_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"same size d_k in the last dim, got queries \(2, 3, 4\) and keys "
                                         r"\(2, 5, 6\)"):
        scaled_dot_product_attention(_x(2, 3, 4), _x(2, 5, 6), _x(2, 5, 4))


def test_n_keys_mismatch_names_shapes():
    with pytest.raises(ValueError, match=r"same number of keys \(dim -2\), got keys \(2, 5, 4\) and values "
                                         r"\(2, 6, 4\)"):
        scaled_dot_product_attention(_x(2, 3, 4), _x(2, 5, 4), _x(2, 6, 4))


def test_batch_dims_that_do_not_broadcast():
    with pytest.raises(ValueError, match=r"batch dims of queries \(2, 3, 4\), keys \(3, 5, 4\) .* do not broadcast"):
        scaled_dot_product_attention(_x(2, 3, 4), _x(3, 5, 4), _x(3, 5, 4))


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_out_of_range(p):
    with pytest.raises(ValueError, match=rf"dropout_p must be in \[0, 1\), got {p}"):
        scaled_dot_product_attention(_x(1, 2, 4), _x(1, 2, 4), _x(1, 2, 4), dropout_p=p)
    with pytest.raises(ValueError, match="dropout_p must be in"):
        MultiHeadAttention(4, 2, dropout=p)


def test_dtype_errors():
    with pytest.raises(TypeError, match="share one dtype, got torch.float32, torch.float64, torch.float32"):
        scaled_dot_product_attention(_x(1, 2, 4), _x(1, 2, 4, dtype=torch.float64), _x(1, 2, 4))
    with pytest.raises(TypeError, match="keys must have a floating dtype, got torch.int64"):
        scaled_dot_product_attention(_x(1, 2, 4), torch.zeros(1, 2, 4, dtype=torch.long), _x(1, 2, 4))
    with pytest.raises(TypeError, match="queries must be a torch.Tensor, got list"):
        scaled_dot_product_attention([[0.0]], _x(1, 2, 4), _x(1, 2, 4))


def test_one_dimensional_input():
    with pytest.raises(ValueError, match=r"values must have shape \(\.\.\., n, d\) with at least 2 dims, got \(4,\)"):
        scaled_dot_product_attention(_x(2, 4), _x(2, 4), _x(4))


def test_additive_wrong_sizes():
    att = AdditiveAttention(query_size=4, key_size=6, hidden_size=3)
    with pytest.raises(ValueError, match=r"expects queries \(\.\.\., 4\) and keys \(\.\.\., 6\), got queries "
                                         r"\(1, 2, 5\) and keys \(1, 3, 6\)"):
        att(_x(1, 2, 5), _x(1, 3, 6), _x(1, 3, 2))
    with pytest.raises(ValueError, match="sizes must be positive, got query_size=0"):
        AdditiveAttention(0, 6, 3)


def test_module_mask_errors():
    att = AdditiveAttention(4, 4, 3)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        att(_x(1, 2, 4), _x(1, 3, 4), _x(1, 3, 2), torch.ones(1, 1, 3))
    with pytest.raises(ValueError, match=r"mask of shape \(1, 1, 4\) does not broadcast to .* = \(1, 2, 3\)"):
        CosineAttention()(_x(1, 2, 4), _x(1, 3, 4), _x(1, 3, 2), torch.ones(1, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 4\) does not broadcast to .* = \(2, 3, 3\)"):
        MultiHeadAttention(4, 2)(_x(2, 3, 4), _x(2, 3, 4), _x(2, 3, 4), torch.ones(2, 1, 4, dtype=torch.bool))


def test_dot_general_errors():
    with pytest.raises(ValueError, match="give both query_size and key_size .* got query_size=4, key_size=None"):
        DotProductAttention(query_size=4)
    with pytest.raises(ValueError, match=r"expects keys \(\.\.\., 6\), got \(1, 3, 5\)"):
        DotProductAttention(query_size=4, key_size=6)(_x(1, 2, 4), _x(1, 3, 5), _x(1, 3, 2))
    with pytest.raises(ValueError, match=r"same size d_k .* got queries \(1, 2, 4\) and keys \(1, 3, 5\)"):
        DotProductAttention().scores(_x(1, 2, 4), _x(1, 3, 5))


def test_cosine_and_multi_head_constructor_errors():
    with pytest.raises(ValueError, match="init_scale must be positive and finite, got 0.0"):
        CosineAttention(init_scale=0.0)
    with pytest.raises(ValueError, match="positive multiple of num_heads, got embed_dim=10, num_heads=3"):
        MultiHeadAttention(10, 3)


def test_multi_head_wrong_input_shape():
    with pytest.raises(ValueError, match=r"keys must have shape \(batch, n, 8\), got \(2, 3, 6\)"):
        MultiHeadAttention(8, 2)(_x(2, 3, 8), _x(2, 3, 6), _x(2, 3, 8))
    with pytest.raises(ValueError, match=r"queries must have shape \(batch, n, 8\), got \(3, 8\)"):
        MultiHeadAttention(8, 2)(_x(3, 8), _x(3, 8), _x(3, 8))


def test_causal_mask_values_and_errors():
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    assert torch.equal(causal_mask(1, 3), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="n_keys >= n_queries, got n_queries=3, n_keys=2"):
        causal_mask(3, 2)
    with pytest.raises(ValueError, match="non-negative, got n_queries=-1"):
        causal_mask(-1)


@pytest.mark.parametrize("shapes, name", [
    (((2, 3, 0), (2, 5, 0), (2, 5, 4)), "queries"),
    (((2, 3, 4), (2, 5, 0), (2, 5, 4)), "keys"),
])
@pytest.mark.parametrize("function", ["scaled_dot_product_attention", "blockwise_attention", "sink_attention"])
def test_zero_width_d_k_is_rejected_by_name(shapes, name, function):
    """d_k = 0 is degenerate: there is no feature to compare, every score would be 0, and torch's SDPA silently
    gives uniform weights. A clear error instead."""
    from attnbook import attention, sinks

    fn = getattr(attention, function, None) or getattr(sinks, function)
    q, k, v = (torch.randn(*s) for s in shapes)
    shape = shapes[["queries", "keys"].index(name)]
    with pytest.raises(ValueError, match=rf"{name} have a zero-width last dim \(d_k = 0\) in shape "
                                         rf"\({', '.join(map(str, shape))}\)"):
        fn(q, k, v)


def test_zero_queries_zero_keys_and_zero_d_v_stay_defined():
    """Degenerate counts are not errors: no query gives an empty output, no key gives zeros (a fully masked row),
    and d_v = 0 an output without features (tests/test_numerics.py compares these with torch's SDPA)."""
    q, k, v = torch.randn(2, 0, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    assert scaled_dot_product_attention(q, k, v).shape == (2, 0, 3)
    out = scaled_dot_product_attention(torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 3))
    assert out.shape == (2, 3, 3) and torch.equal(out, torch.zeros(2, 3, 3))
