"""attnbook.sinks and attnbook.experiments.sinks against independent references: torch's fused
F.scaled_dot_product_attention with an extra zero-value key whose score is the sink logit, torch.softmax over the
scores with the sink logit appended, nn.MultiheadAttention(add_zero_attn=True) with copied weights (softmax with one
added, and a learned sink through a float mask), torch.logsumexp, finite differences (gradcheck), and hypothesis
properties; every error path with its message."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.attention import MultiHeadAttention
from attnbook.experiments import sinks as exp
from attnbook.sinks import (SinkMultiHeadAttention, fully_masked_row, online_softmax_rule, sink_attention,
                            sink_softmax, softmax_one)

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = {torch.float32: dict(atol=2e-6, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}


def _qkv(dtype=torch.float64, batch=(2, 3), n_q=4, n_k=5, d_k=6, d_v=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
    return make(*batch, n_q, d_k), make(*batch, n_k, d_k), make(*batch, n_k, d_v)


def _mask(batch=(2, 1), n_q=4, n_k=5, seed=0):
    """A random bool mask (True = takes part) with one fully masked row and one row with a single key."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(*batch, n_q, n_k, generator=g) > 0.4
    mask[0, :, 1] = False
    mask[-1, :, 2] = False
    mask[-1, :, 2, 0] = True
    return mask


def _sdpa_with_sink_key(q, k, v, mask, b):
    """Reference: F.scaled_dot_product_attention over the keys plus one key with score ``b`` and value 0 (the score
    enters through a float mask on a zero key, whose dot product is 0)."""
    *batch, n_q, _ = q.shape
    zero_key = torch.zeros(*k.shape[:-2], 1, k.shape[-1], dtype=k.dtype)
    zero_value = torch.zeros(*v.shape[:-2], 1, v.shape[-1], dtype=v.dtype)
    bias = torch.zeros(*batch, n_q, k.shape[-2] + 1, dtype=q.dtype)
    bias[..., :-1] = bias[..., :-1].masked_fill(~mask, float("-inf"))
    bias[..., -1] = torch.as_tensor(b, dtype=q.dtype).expand(*batch, n_q)
    return F.scaled_dot_product_attention(q, torch.cat([k, zero_key], -2), torch.cat([v, zero_value], -2),
                                          attn_mask=bias)


def _softmax_with_sink_column(scores, mask, b):
    """Reference weights: torch.softmax over [scores (masked to -inf), b]; returns (key weights, sink weight)."""
    filled = scores.masked_fill(~mask, float("-inf"))
    sink = torch.as_tensor(b, dtype=scores.dtype).expand(scores.shape[:-1]).unsqueeze(-1)
    weights = torch.softmax(torch.cat([filled, sink], -1), -1)
    return weights[..., :-1], weights[..., -1]


# ----------------------------------------------------------------------------------------------- sink_attention
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sink", ["none", "scalar", "per_head"])
def test_sink_attention_equals_sdpa_with_an_extra_zero_value_key(dtype, sink):
    q, k, v = _qkv(dtype)
    mask = _mask()
    b = {"none": 0.0, "scalar": -0.7, "per_head": torch.tensor([[0.5], [-1.0], [2.0]], dtype=dtype)}[sink]
    out, weights, sink_weight = sink_attention(q, k, v, mask, sink_logits=None if sink == "none" else b)
    torch.testing.assert_close(out, _sdpa_with_sink_key(q, k, v, mask, b), **TOL[dtype])
    ref_w, ref_sink = _softmax_with_sink_column(q @ k.mT / math.sqrt(q.shape[-1]), mask, b)
    torch.testing.assert_close(weights, ref_w, **TOL[dtype])
    torch.testing.assert_close(sink_weight, ref_sink, **TOL[dtype])
    assert out.dtype == weights.dtype == sink_weight.dtype == dtype
    assert weights.shape == (2, 3, 4, 5) and sink_weight.shape == (2, 3, 4)


def test_sink_attention_broadcasts_batch_dims_and_takes_a_scale():
    q, _, _ = _qkv(batch=(1, 1))
    _, k, v = _qkv(batch=(2, 3), seed=1)
    mask = _mask()
    out, _, _ = sink_attention(q, k, v, mask, sink_logits=0.3, scale=0.5)
    ref = _sdpa_with_sink_key(q.expand(2, 3, 4, 6) * (0.5 * math.sqrt(6)), k, v, mask, 0.3)
    torch.testing.assert_close(out, ref)


def test_fully_masked_rows_put_all_weight_on_the_sink_with_zero_output_and_finite_gradients():
    q, k, v = (x.requires_grad_() for x in _qkv())
    b = torch.tensor([[0.5], [-30.0], [2.0]], dtype=torch.float64, requires_grad=True)
    mask = _mask()
    out, weights, sink_weight = sink_attention(q, k, v, mask, sink_logits=b)
    empty = ~mask.any(-1).expand(2, 3, 4)
    assert empty.any()
    assert (out[empty] == 0).all() and (weights[empty] == 0).all()
    torch.testing.assert_close(sink_weight[empty], torch.ones_like(sink_weight[empty]))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    grads = torch.autograd.grad(out.square().sum() + sink_weight.sum(), (q, k, v, b))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][empty] == 0).all()


def test_a_large_sink_takes_the_weight_and_a_very_negative_one_gives_plain_masked_attention():
    q, k, v = _qkv()
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    out, _, sink_weight = sink_attention(q, k, v, mask, sink_logits=-200.0)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert sink_weight.max() < 1e-80
    out, weights, sink_weight = sink_attention(q, k, v, mask, sink_logits=200.0)
    assert out.abs().max() < 1e-80 and weights.max() < 1e-80 and (sink_weight == 1).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_is_computed_in_fp32_and_stays_finite(dtype):
    q, k, v = _qkv(torch.float32)
    q = q * 300  # scores beyond the fp16 range
    mask = _mask()
    out, weights, sink_weight = sink_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask, sink_logits=1.0)
    assert out.dtype == weights.dtype == sink_weight.dtype == dtype
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    ref = _sdpa_with_sink_key(*(x.to(dtype).float() for x in (q, k, v)), mask, 1.0)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_sink_attention_gradcheck_fp64_including_the_sink_logits():
    q, k, v = (x.requires_grad_() for x in _qkv(batch=(2, 2), n_q=3, n_k=4, d_k=3, d_v=2))
    b = torch.tensor([[0.2], [-0.4]], dtype=torch.float64, requires_grad=True)
    mask = _mask(batch=(2, 1), n_q=3, n_k=4)

    def fn(q, k, v, b):
        out, weights, sink_weight = sink_attention(q, k, v, mask, sink_logits=b)
        return out, weights, sink_weight

    assert torch.autograd.gradcheck(fn, (q, k, v, b))


def test_dropout_zeroes_key_weights_only_and_p_zero_is_identity():
    q, k, v = _qkv()
    torch.manual_seed(0)
    out_drop, weights, sink_weight = sink_attention(q, k, v, sink_logits=0.0, dropout_p=0.5)
    out, weights0, sink0 = sink_attention(q, k, v, sink_logits=0.0, dropout_p=0.0)
    torch.testing.assert_close(weights, weights0)  # the weights are returned before dropout
    torch.testing.assert_close(sink_weight, sink0)
    assert not torch.allclose(out_drop, out)


# ----------------------------------------------------------------------------------------------- sink_softmax
@settings(max_examples=40, deadline=None)
@given(n_rows=st.integers(1, 4), n_keys=st.integers(0, 6), b=st.floats(-20, 20), seed=st.integers(0, 10_000),
       big=st.sampled_from([1.0, 1e3]))
def test_sink_softmax_matches_softmax_with_the_sink_appended(n_rows, n_keys, b, seed, big):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_rows, n_keys, generator=g, dtype=torch.float64) * big
    mask = torch.rand(n_rows, n_keys, generator=g) > 0.3
    weights, sink_weight = sink_softmax(scores, mask, b)
    ref_w, ref_sink = _softmax_with_sink_column(scores, mask, b)
    torch.testing.assert_close(weights, ref_w)
    torch.testing.assert_close(sink_weight, ref_sink)
    torch.testing.assert_close(weights.sum(-1) + sink_weight, torch.ones(n_rows, dtype=torch.float64))
    assert (weights[~mask] == 0).all()


def test_softmax_one_is_exp_over_one_plus_sum_exp_and_stable_for_large_scores():
    scores = torch.tensor([[0.0, 0.0], [1.0, -2.0], [-50.0, -60.0]], dtype=torch.float64)
    ref = scores.exp() / (1 + scores.exp().sum(-1, keepdim=True))
    torch.testing.assert_close(softmax_one(scores), ref)
    torch.testing.assert_close(softmax_one(scores), sink_softmax(scores, None, None)[0])
    big = torch.tensor([[1000.0, 999.0], [-1000.0, -1000.0]])  # naive exp overflows / underflows
    weights = softmax_one(big)
    torch.testing.assert_close(weights[0], torch.softmax(big[0], -1))  # the implicit 0 logit gets ~nothing
    assert (weights[1] == 0).all() or weights[1].max() < 1e-300
    assert torch.isfinite(weights).all()
    mask = torch.tensor([[False, False], [True, False], [True, True]])
    torch.testing.assert_close(softmax_one(scores, mask)[0], torch.zeros(2, dtype=torch.float64))


def test_sink_softmax_gradcheck_fp64():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True], [False] * 4, [True, False, False, False]])
    assert torch.autograd.gradcheck(lambda s, b: sink_softmax(s, mask, b), (scores, b))


# ----------------------------------------------------------------------------------------------- the module
def _copy_from_torch(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    e = ours.embed_dim
    with torch.no_grad():
        for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
            proj.weight.copy_(theirs.in_proj_weight[i * e:(i + 1) * e])
            proj.bias.copy_(theirs.in_proj_bias[i * e:(i + 1) * e])
        ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


@pytest.mark.parametrize("learned", [False, True])
def test_sink_mha_equals_nn_multihead_attention_with_add_zero_attn(learned):
    """nn.MultiheadAttention(add_zero_attn=True) appends a zero key and value: the score of that key is 0, which is
    softmax with one added per head. A sink logit b_h is the same after shifting every real score by -b_h (a float
    attn_mask per head), since a softmax does not change when all its logits shift together."""
    torch.manual_seed(0)
    e, h, batch, n_q, n_k = 8, 2, 3, 4, 5
    theirs = nn.MultiheadAttention(e, h, batch_first=True, add_zero_attn=True).double()
    ours = SinkMultiHeadAttention(e, h, learn_sink=learned).double()
    _copy_from_torch(ours, theirs)
    b = torch.tensor([0.8, -1.5], dtype=torch.float64) if learned else torch.zeros(h, dtype=torch.float64)
    with torch.no_grad():
        ours.sink_logits.copy_(b)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, n_q, e, generator=g).double(), torch.randn(batch, n_k, e, generator=g).double()
    mask = torch.rand(batch, n_q, n_k, generator=g) > 0.3
    mask[0, 1] = False  # a fully masked query: still defined, all weight on the sink
    float_mask = torch.zeros(batch, h, n_q, n_k, dtype=torch.float64) - b.view(1, h, 1, 1)
    float_mask = float_mask.masked_fill(~mask[:, None], float("-inf")).reshape(batch * h, n_q, n_k)
    ref, ref_w = theirs(x, y, y, attn_mask=float_mask, need_weights=True, average_attn_weights=False)
    out = ours(x, y, y, mask)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(ours.attention_weights, ref_w[..., :-1])
    torch.testing.assert_close(ours.sink_weights, ref_w[..., -1])
    torch.testing.assert_close(out[0, 1], ours.out_proj.bias)  # zero context: out_proj's bias
    ours.need_weights = False
    torch.testing.assert_close(ours(x, y, y, mask), ref)
    assert ours.attention_weights is None and ours.sink_weights is not None


def test_sink_mha_learns_its_sink_logits_only_when_asked():
    learned, fixed = SinkMultiHeadAttention(4, 2, init_sink=1.5), SinkMultiHeadAttention(4, 2, learn_sink=False)
    assert isinstance(learned.sink_logits, nn.Parameter) and learned.sink_logits.tolist() == [1.5, 1.5]
    assert "sink_logits" not in dict(fixed.named_parameters()) and "sink_logits" in dict(fixed.named_buffers())
    x = torch.randn(2, 3, 4)
    learned(x, x, x).sum().backward()
    assert learned.sink_logits.grad is not None and learned.sink_logits.grad.abs().sum() > 0


def test_multihead_attention_is_unchanged_by_the_attend_hook():
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=True)
    ours = MultiHeadAttention(8, 2)
    _copy_from_torch(ours, theirs)
    x = torch.randn(2, 4, 8)
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[1, :, 3] = False
    ref, _ = theirs(x, x, x, attn_mask=~mask.repeat_interleave(2, 0), need_weights=False)
    torch.testing.assert_close(ours(x, x, x, mask), ref)


# ----------------------------------------------------------------------------------------------- fully masked rows
@settings(max_examples=25, deadline=None)
@given(n_keys=st.integers(1, 7), block=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_online_softmax_rule_equals_softmax_attention_and_logsumexp(n_keys, block, seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, 2, n_keys, generator=g, dtype=torch.float64) * 5
    values = torch.randn(3, n_keys, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 2, n_keys, generator=g) > 0.4
    mask[0, 0] = False
    out, lse = online_softmax_rule(scores, values, mask, block_size=block)
    filled = scores.masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(filled, -1))  # -inf for a fully masked row
    has_key = mask.any(-1, keepdim=True)
    ref = torch.where(has_key, torch.softmax(torch.where(has_key, filled, 0.0), -1), 0.0) @ values
    torch.testing.assert_close(out, ref)
    assert (out[0, 0] == 0).all() and lse[0, 0] == float("-inf")


def test_fully_masked_row_measures_each_implementation():
    table = fully_masked_row()
    assert list(table.columns) == ["implementation", "mode", "need_weights", "grad", "path", "output", "weights",
                                   "sink_weight", "lse"]
    ours = table[table["implementation"].str.startswith("attnbook")]
    assert len(ours) == 6 and (ours["output"] == "zeros").all() and (ours["weights"] != "NaN").all()
    sdpa = table[table["implementation"] == "torch F.scaled_dot_product_attention"]
    assert len(sdpa) == 2 and (sdpa["output"] == "zeros").all()  # pytorch PR #133882 (torch >= 2.5)
    flash = table[table["implementation"].str.startswith("FlashAttention")].iloc[0]
    assert flash["output"] == "zeros" and flash["lse"] == float("-inf")
    sink = table[table["implementation"].str.startswith("softmax_one")].iloc[0]
    assert sink["output"] == "zeros" and sink["sink_weight"] == 1.0
    mha = table[table["implementation"] == "torch nn.MultiheadAttention"]
    assert len(mha) == 8
    # The pinned torch (2.13): NaN whenever the weights are computed, and on the fused fast path (eval, no grad).
    weighted = mha[mha["need_weights"] == True]  # noqa: E712 (an object column)
    assert (weighted["output"] == "NaN").all() and (weighted["weights"] == "NaN").all()
    fast = mha[mha["path"].str.startswith("fused fast path")]
    assert set(zip(fast["mode"], fast["grad"])) == {("eval", False)} and (fast["output"] == "NaN").all()
    sdpa_path = mha[(mha["need_weights"] == False) & ~mha["path"].str.startswith("fused")]  # noqa: E712
    assert len(sdpa_path) == 3 and (sdpa_path["output"] == "zeros").all()


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call, error, message", [
    (lambda: sink_softmax([1.0, 2.0]), TypeError, "scores must be a floating torch.Tensor, got list"),
    (lambda: sink_softmax(torch.tensor([1, 2])), TypeError, "scores must be a floating torch.Tensor, got dtype"),
    (lambda: sink_softmax(torch.tensor(1.0)), ValueError, "scores must have at least 1 dim"),
    (lambda: sink_softmax(torch.zeros(2, 3), torch.ones(2, 3)), TypeError, "mask must be a bool tensor"),
    (lambda: sink_softmax(torch.zeros(2, 3), torch.ones(3, 2, dtype=torch.bool)), ValueError,
     r"mask of shape \(3, 2\) does not broadcast to scores of shape \(2, 3\)"),
    (lambda: sink_softmax(torch.zeros(2, 3), None, "0"), TypeError, "sink_logits must be a float tensor"),
    (lambda: sink_softmax(torch.zeros(2, 3), None, True), TypeError, "got bool"),
    (lambda: sink_softmax(torch.zeros(2, 3), None, torch.tensor([1, 2])), TypeError,
     "sink_logits must have a floating dtype, got torch.int64"),
    (lambda: sink_softmax(torch.zeros(2, 3), None, torch.zeros(3)), ValueError,
     r"sink_logits of shape \(3,\) does not broadcast to the rows \(..., n_queries\) = \(2,\)"),
    (lambda: sink_softmax(torch.zeros(2, 3), None, float("-inf")), ValueError, "sink_logits must be finite"),
    (lambda: sink_softmax(torch.zeros(2, 3), None, torch.tensor([0.0, float("nan")])), ValueError,
     "sink_logits must be finite"),
    (lambda: sink_attention(*_qkv(), dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\), got 1.0"),
    (lambda: sink_attention(*_qkv(), scale=float("inf")), ValueError, "scale must be a finite number"),
    (lambda: sink_attention(*_qkv(), mask=torch.ones(4, 4, dtype=torch.bool)), ValueError,
     r"mask of shape \(4, 4\) does not broadcast to \(..., n_queries, n_keys\) = \(2, 3, 4, 5\)"),
    (lambda: sink_attention(*_qkv(), sink_logits=torch.zeros(5, 1)), ValueError,
     r"does not broadcast to the rows \(..., n_queries\) = \(2, 3, 4\)"),
    (lambda: sink_attention(*_qkv()[:2], torch.zeros(2, 3, 4, 3, dtype=torch.float64)), ValueError,
     "keys and values must have the same number of keys"),
    (lambda: SinkMultiHeadAttention(4, 2, init_sink=float("inf")), ValueError, "init_sink must be finite, got inf"),
    (lambda: SinkMultiHeadAttention(5, 2), ValueError, "embed_dim must be a positive multiple of num_heads"),
    (lambda: online_softmax_rule(torch.zeros(2, 3), torch.zeros(3, 1), block_size=0), ValueError,
     "block_size must be >= 1, got 0"),
    (lambda: online_softmax_rule(torch.zeros(2, 3), torch.zeros(3, 1), torch.ones(2, 3)), TypeError,
     "mask must be a bool tensor"),
])
def test_errors_name_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ----------------------------------------------------------------------------------------------- the experiment
TINY = exp.SinksConfig(n_symbols=8, n_values=3, max_keys=3, n_train=256, n_test=200, d_model=8, num_heads=2,
                       hidden=8, batch_size=64, epochs=1, seeds=(0,))


def test_make_data_rows_follow_the_task():
    data = exp.make_data(TINY, 500, seed=4)
    keys, values, lengths, query = data["keys"], data["values"], data["lengths"], data["query"]
    real = torch.arange(TINY.max_keys) < lengths[:, None]
    assert lengths.min() >= 1 and lengths.max() <= TINY.max_keys
    assert (keys[~real] == TINY.n_symbols).all() and (values[~real] == TINY.n_values).all()
    assert (keys[real] < TINY.n_symbols).all() and (values[real] < TINY.n_values).all()
    for i in range(500):
        row = keys[i, :lengths[i]].tolist()
        assert len(set(row)) == len(row)  # distinct keys
        if data["match"][i]:
            assert data["target"][i] == values[i, row.index(int(query[i]))]
        else:
            assert int(query[i]) not in row and data["target"][i] == TINY.n_values
    assert 0.35 < data["match"].float().mean() < 0.65
    again = exp.make_data(TINY, 500, seed=4)
    assert all(torch.equal(data[name], again[name]) for name in data)


def test_run_grid_is_tidy_deterministic_and_its_masses_sum_to_one():
    frame = exp.run_grid(TINY, show_progress=False)
    assert list(frame.columns) == ["condition", "seed", "match", "n_keys", "padded", "n", "accuracy", "key_mass",
                                   "pad_mass", "sink_weight", "sink_logit", "train_time_s"]
    assert set(frame["condition"]) == set(exp.CONDITIONS)
    assert frame.groupby("condition")["n"].sum().eq(TINY.n_test).all()
    total = frame["key_mass"] + frame["pad_mass"] + frame["sink_weight"].fillna(0.0)
    np.testing.assert_allclose(total, 1.0, atol=1e-5)
    masked = frame["condition"] != "softmax, pads unmasked"
    assert (frame.loc[masked, "pad_mass"] == 0).all()
    unmasked_padded = frame[~masked & frame["padded"]]
    assert (unmasked_padded["pad_mass"] > 0).all()
    has_sink = frame["condition"].isin(["softmax_one", "learned sink"])
    assert frame.loc[~has_sink, "sink_weight"].isna().all() and (frame.loc[has_sink, "sink_weight"] > 0).all()
    assert (frame.loc[frame["condition"] == "softmax_one", "sink_logit"] == 0).all()
    # one key and a mask: the only key takes all the weight, match or not
    one_key = frame[(frame["condition"] == "softmax") & (frame["n_keys"] == 1)]
    np.testing.assert_allclose(one_key["key_mass"], 1.0)
    again = exp.run_grid(TINY, conditions=("learned sink",), show_progress=False)
    pd.testing.assert_frame_equal(again.drop(columns="train_time_s"),
                                  frame[frame["condition"] == "learned sink"].reset_index(drop=True)
                                  .drop(columns="train_time_s"))
    summary = exp.summarize(frame)
    assert list(summary["condition"]) == [c for c in exp.CONDITIONS for _ in (True, False)]
    assert list(summary["match"]) == [True, False] * 4 and (summary["n_seeds"] == 1).all()
    by_keys = exp.summarize(frame, ("match", "n_keys"))
    assert len(by_keys) == 4 * 2 * TINY.max_keys


def test_run_one_restores_the_thread_count():
    before = torch.get_num_threads()
    data = exp.make_data(TINY, 64, 0)
    exp.run_one(exp.SinksConfig(**{**TINY.__dict__, "threads": 2, "n_train": 64}), data, data, "softmax", 0)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("call, error, message", [
    (lambda: exp.make_data(exp.SinksConfig(n_symbols=6, max_keys=6), 4, 0), ValueError,
     "n_symbols must exceed max_keys, got n_symbols=6, max_keys=6"),
    (lambda: exp.RetrievalModel(TINY, "sparsemax"), ValueError, "condition must be one of"),
    (lambda: exp.run_grid(TINY, conditions=("softmax", "sparsemax")), ValueError,
     r"unknown conditions \['sparsemax'\]"),
    (lambda: exp.summarize(pd.DataFrame(), ("seed",)), ValueError, "by must name columns among"),
])
def test_experiment_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_quick_and_full_configs():
    assert exp.SinksConfig.for_mode("quick") == exp.SinksConfig.quick()
    full = exp.SinksConfig.for_mode("full")
    assert full.n_train > exp.SinksConfig.quick().n_train and len(full.seeds) >= 10


# ---------------------------------------------------------------- sliding windows and streaming caches
from attnbook.sinks import sliding_window_mask, streaming_cache_keep  # noqa: E402


def _window_loops(n_q, window, n_k):
    off = n_k - n_q
    rows = [[i + off - window < j <= i + off for j in range(n_k)] for i in range(n_q)]
    return torch.tensor(rows, dtype=torch.bool).reshape(n_q, n_k)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 7), st.integers(0, 4), st.integers(1, 9))
def test_sliding_window_mask_against_loops(n_q, extra, window):
    n_k = n_q + extra
    mask = sliding_window_mask(n_q, window, n_k)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, _window_loops(n_q, window, n_k))


def test_sliding_window_large_window_is_causal_and_combines_with_padding():
    from attnbook.attention import causal_mask
    assert torch.equal(sliding_window_mask(6, 6), causal_mask(6))
    assert torch.equal(sliding_window_mask(6, 100), causal_mask(6))
    pad = torch.tensor([[False, False, True, True, True, True], [True] * 6])   # left padding in row 0
    mask = sliding_window_mask(6, 3, key_padding_mask=pad)
    assert mask.shape == (2, 6, 6)
    assert torch.equal(mask, _window_loops(6, 3, 6)[None] & pad[:, None, :])


def test_sliding_window_with_sdpa_equals_loops_over_keys():
    q, k, v = _qkv(batch=(2, 2), n_q=7, n_k=7)
    pad = torch.tensor([[False, True, True, True, True, True, True], [True] * 7])
    mask = sliding_window_mask(7, 3, key_padding_mask=pad)                        # (B, L, L)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    for b in range(2):
        for i in range(7):
            keys = [j for j in range(7) if i - 3 < j <= i and bool(pad[b, j])]
            if not keys:
                assert out[b, :, i].abs().max() == 0
                continue
            ref = F.scaled_dot_product_attention(q[b, :, i:i + 1], k[b, :, keys], v[b, :, keys])
            torch.testing.assert_close(out[b, :, i:i + 1], ref, **TOL[torch.float64])


def test_sliding_window_errors():
    with pytest.raises(ValueError, match="window must be >= 1"):
        sliding_window_mask(4, 0)
    with pytest.raises(TypeError, match="window must be an int"):
        sliding_window_mask(4, 2.5)
    with pytest.raises(ValueError, match="n_keys >= n_queries"):
        sliding_window_mask(4, 2, 3)
    with pytest.raises(TypeError, match="key_padding_mask must be a bool"):
        sliding_window_mask(4, 2, key_padding_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"key_padding_mask must be \(batch, n_keys=4\)"):
        sliding_window_mask(4, 2, key_padding_mask=torch.ones(1, 5, dtype=torch.bool))


def test_streaming_cache_keep_by_hand_left_and_right_padding():
    left = torch.tensor([[False, False, True, True, True, True, True, True]])
    right = torch.tensor([[True, True, True, True, True, True, False, False]])
    assert streaming_cache_keep(left, 2, 3).int().tolist() == [[0, 0, 1, 1, 0, 1, 1, 1]]
    assert streaming_cache_keep(right, 2, 3).int().tolist() == [[1, 1, 0, 1, 1, 1, 0, 0]]
    short = torch.tensor([[False, True, True, True]])
    assert torch.equal(streaming_cache_keep(short, 2, 3), short)       # fewer real tokens than sinks + window
    assert not streaming_cache_keep(torch.zeros(1, 4, dtype=torch.bool), 2, 3).any()
    assert streaming_cache_keep(left, 0, 0).sum() == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 6), st.integers(0, 9), st.integers(0, 4), st.integers(0, 5))
def test_streaming_cache_keep_ignores_left_padding(n_pad, n_real, n_sink, window):
    real_only = torch.ones(1, n_real, dtype=torch.bool)
    padded = torch.cat([torch.zeros(1, n_pad, dtype=torch.bool), real_only], 1)
    keep = streaming_cache_keep(padded, n_sink, window)
    assert not keep[:, :n_pad].any()
    assert torch.equal(keep[:, n_pad:], streaming_cache_keep(real_only, n_sink, window))
    expected = [r < n_sink or r >= n_real - window for r in range(n_real)]
    assert keep[0, n_pad:].tolist() == expected


def test_streaming_cache_keep_errors():
    with pytest.raises(TypeError, match="padding_mask must be a bool"):
        streaming_cache_keep(torch.ones(1, 3), 1, 1)
    with pytest.raises(ValueError, match=r"\(batch, length\)"):
        streaming_cache_keep(torch.ones(3, dtype=torch.bool), 1, 1)
    with pytest.raises(ValueError, match="n_sink must be >= 0"):
        streaming_cache_keep(torch.ones(1, 3, dtype=torch.bool), -1, 1)
