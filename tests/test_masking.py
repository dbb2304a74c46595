"""attnbook.masking against independent references: torch's fused attention, plain softmax over the valid
subset, finite differences, and hypothesis properties of the masking invariants."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.masking import (
    BERT_MASK_VALUE,
    additive_mask_softmax,
    lengths_to_mask,
    masked_softmax,
    renormalized_softmax,
)

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


# ---------------------------------------------------------------- lengths_to_mask
def test_lengths_to_mask_matches_explicit_construction():
    mask = lengths_to_mask(torch.tensor([2, 0, 3]), max_len=4)
    expected = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


def test_lengths_to_mask_default_max_len_and_lists():
    assert lengths_to_mask([1, 3]).shape == (2, 3)
    assert lengths_to_mask([]).shape == (0, 0)


def test_lengths_to_mask_matches_pad_sequence():
    lengths = [3, 1, 4]
    seqs = [torch.ones(n) for n in lengths]
    padded = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)  # independent: pads with 0
    assert torch.equal(lengths_to_mask(lengths), padded.bool())


def test_lengths_to_mask_negative_length():
    with pytest.raises(ValueError, match=r"non-negative, got \[2, -1\]"):
        lengths_to_mask([2, -1])


def test_lengths_to_mask_length_above_max_len():
    with pytest.raises(ValueError, match=r"<= max_len=3, got \[2, 5\]"):
        lengths_to_mask([2, 5], max_len=3)


def test_lengths_to_mask_negative_max_len():
    with pytest.raises(ValueError, match="max_len must be non-negative, got -1"):
        lengths_to_mask([0], max_len=-1)


def test_lengths_to_mask_float_lengths():
    with pytest.raises(TypeError, match="integer dtype, got torch.float32"):
        lengths_to_mask(torch.tensor([1.0, 2.0]))


def test_lengths_to_mask_2d_lengths():
    with pytest.raises(ValueError, match=r"one-dimensional \(batch,\), got shape \(2, 1\)"):
        lengths_to_mask(torch.tensor([[1], [2]]))


# ---------------------------------------------------------------- masked_softmax: references
def test_masked_softmax_equals_softmax_over_valid_keys():
    torch.manual_seed(0)
    scores = torch.randn(4, 7, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 1, 5])
    weights = masked_softmax(scores, lengths_to_mask(lengths, 7))
    for b, n in enumerate(lengths.tolist()):
        assert torch.allclose(weights[b, :n], torch.softmax(scores[b, :n], dim=-1))
        assert torch.all(weights[b, n:] == 0)


def test_masked_softmax_matches_torch_sdpa_weights():
    """F.scaled_dot_product_attention with an identity value matrix returns the weights themselves."""
    torch.manual_seed(1)
    q = torch.randn(2, 3, 5, dtype=torch.float64)
    k = torch.randn(2, 6, 5, dtype=torch.float64)
    eye = torch.eye(6, dtype=torch.float64).expand(2, 6, 6)
    mask = lengths_to_mask(torch.tensor([4, 6]), 6)[:, None, :]
    ref = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)
    scores = q @ k.transpose(-1, -2) / math.sqrt(5)
    assert torch.allclose(masked_softmax(scores, mask), ref)


def test_masked_softmax_none_is_plain_softmax():
    x = torch.randn(3, 4)
    assert torch.equal(masked_softmax(x, None), torch.softmax(x, -1))


def test_masked_softmax_other_dim():
    torch.manual_seed(2)
    scores = torch.randn(5, 3, dtype=torch.float64)
    mask = torch.tensor([True, True, False, True, False])[:, None]
    w = masked_softmax(scores, mask, dim=0)
    assert torch.allclose(w.sum(0), torch.ones(3, dtype=torch.float64))
    assert torch.all(w[~mask.squeeze(1)] == 0)


@pytest.mark.parametrize("dtype", FLOATS)
def test_fully_masked_rows_are_zero_never_nan(dtype):
    scores = torch.randn(3, 4).to(dtype)
    mask = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])
    w = masked_softmax(scores, mask)
    assert not torch.isnan(w).any()
    assert torch.all(w[1] == 0)
    assert torch.allclose(w.float().sum(-1), torch.tensor([1.0, 0.0, 1.0]), atol=1e-2)


@pytest.mark.parametrize("dtype", FLOATS)
def test_scores_far_below_bert_constant_still_masked_exactly(dtype):
    """Real scores of about -3e4 (below BERT's -1e4): the safe mask still gives masked keys weight 0."""
    scores = torch.tensor([[-30000.0, -30001.0, 0.0, 0.0]]).to(dtype)
    mask = torch.tensor([[True, True, False, False]])
    w = masked_softmax(scores, mask)
    assert torch.all(w[0, 2:] == 0)
    assert math.isclose(float(w[0, :2].float().sum()), 1.0, rel_tol=1e-2)


def test_fully_masked_row_has_zero_finite_gradient():
    scores = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    masked_softmax(scores, mask).pow(2).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[1] == 0)
    assert torch.all(scores.grad[0, 2] == 0)


def test_masked_softmax_gradcheck():
    """Finite differences (torch.autograd.gradcheck), with a fully masked row included."""
    scores = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda s: masked_softmax(s, mask), (scores,))


def test_masked_softmax_does_not_modify_inputs():
    scores = torch.randn(2, 4)
    mask = torch.tensor([[True, False, True, False], [False] * 4])
    s0, m0 = scores.clone(), mask.clone()
    masked_softmax(scores, mask)
    renormalized_softmax(scores, mask)
    additive_mask_softmax(scores, mask)
    assert torch.equal(scores, s0) and torch.equal(mask, m0)


# ---------------------------------------------------------------- teaching variants
def test_renormalized_equals_masked_softmax_when_no_underflow():
    torch.manual_seed(3)
    scores = torch.randn(6, 9, dtype=torch.float64)
    mask = lengths_to_mask(torch.tensor([9, 1, 4, 0, 2, 7]), 9)
    assert torch.allclose(renormalized_softmax(scores, mask), masked_softmax(scores, mask))


def test_renormalized_underflow_is_nan_but_masked_softmax_is_not():
    scores = torch.tensor([[-200.0, 0.0]])  # the valid key's softmax mass underflows in fp32
    mask = torch.tensor([[True, False]])
    assert torch.isnan(renormalized_softmax(scores, mask)).all()
    assert torch.equal(masked_softmax(scores, mask), torch.tensor([[1.0, 0.0]]))


def test_additive_mask_approximates_and_fails_as_documented():
    scores = torch.tensor([[0.1, 0.2, 0.0, 0.0, 0.0]])
    mask = lengths_to_mask([2], 5)
    approx = additive_mask_softmax(scores, mask)
    assert torch.allclose(approx, masked_softmax(scores, mask), atol=1e-6)
    low = torch.tensor([[-3e4, -3e4 + 1.0, 0.0]], dtype=torch.float64)
    bad = additive_mask_softmax(low, torch.tensor([[True, True, False]]))
    assert bad[0, 2] > 0.99  # wrong once real scores are below the constant
    full = additive_mask_softmax(torch.zeros(1, 4), torch.zeros(1, 4, dtype=torch.bool))
    assert torch.allclose(full, torch.full((1, 4), 0.25))
    assert BERT_MASK_VALUE == -10_000.0


def test_additive_mask_fully_masked_row_is_softmax_of_raw_scores():
    # The constant cancels (up to fp32 rounding of s - 10 000, spacing about 1e-3): the weights follow the raw
    # scores, not uniform, not zeros.
    raw = torch.tensor([[0.3, -0.2, 0.5, 0.1]])
    none = torch.zeros(1, 4, dtype=torch.bool)
    assert torch.allclose(additive_mask_softmax(raw, none), torch.softmax(raw, dim=-1), atol=1e-3)
    # In fp16 the constant swamps differences below the fp16 spacing near 10 000 (8), giving uniform weights.
    uniform = additive_mask_softmax(raw.half(), none).float()
    assert torch.allclose(uniform, torch.full((1, 4), 0.25), atol=1e-3)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("fn", [masked_softmax, renormalized_softmax, additive_mask_softmax])
def test_non_bool_mask_raises(fn):
    with pytest.raises(TypeError, match="mask must be a bool tensor .True = takes part., got dtype torch.int64"):
        fn(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.long))


@pytest.mark.parametrize("fn", [masked_softmax, renormalized_softmax, additive_mask_softmax])
def test_mask_shape_mismatch_names_both_shapes(fn):
    with pytest.raises(ValueError, match=r"mask of shape \(2, 4\) does not broadcast to scores of shape \(2, 3\)"):
        fn(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


def test_mask_that_would_enlarge_scores_is_rejected():
    with pytest.raises(ValueError, match=r"mask of shape \(5, 2, 3\) does not broadcast"):
        masked_softmax(torch.zeros(2, 3), torch.ones(5, 2, 3, dtype=torch.bool))


def test_integer_scores_raise():
    with pytest.raises(TypeError, match="floating dtype, got torch.int64"):
        masked_softmax(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="floating torch.Tensor"):
        masked_softmax(torch.zeros(2, 3, dtype=torch.long), None)


def test_mask_not_a_tensor_raises():
    with pytest.raises(TypeError, match="mask must be a bool torch.Tensor, got list"):
        masked_softmax(torch.zeros(1, 2), [[True, False]])


def test_scores_not_a_tensor_raises():
    with pytest.raises(TypeError, match="scores must be a torch.Tensor, got list"):
        masked_softmax([[0.0, 1.0]], torch.ones(1, 2, dtype=torch.bool))


def test_bad_dim_and_scalar_scores():
    with pytest.raises(ValueError, match=r"dim=2 is out of range for scores of shape \(2, 3\)"):
        masked_softmax(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), dim=2)
    with pytest.raises(ValueError, match="at least one dimension"):
        masked_softmax(torch.tensor(1.0), torch.tensor(True))


# ---------------------------------------------------------------- properties (hypothesis)
@st.composite
def scores_and_lengths(draw):
    batch = draw(st.integers(1, 4))
    n_keys = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(0, n_keys), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0, 1e4]))
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, 3, n_keys, generator=g, dtype=torch.float64) * scale
    return scores, torch.tensor(lengths)


@settings(max_examples=150, deadline=None)
@given(scores_and_lengths())
def test_property_masked_weights_exactly_zero_and_rows_sum(data):
    scores, lengths = data
    mask = lengths_to_mask(lengths, scores.shape[-1])[:, None, :]
    w = masked_softmax(scores, mask)
    assert torch.all(w.masked_select(~mask.expand_as(w)) == 0)
    expected = (lengths > 0).to(w.dtype)[:, None].expand(-1, 3)
    assert torch.allclose(w.sum(-1), expected)
    assert torch.isfinite(w).all()


@settings(max_examples=150, deadline=None)
@given(scores_and_lengths(), st.integers(1, 5), st.integers(0, 2**16))
def test_property_invariant_to_appended_padding_and_pad_values(data, extra, seed):
    scores, lengths = data
    n_keys = scores.shape[-1]
    mask = lengths_to_mask(lengths, n_keys)[:, None, :]
    values = torch.randn(scores.shape[0], n_keys, 2, dtype=torch.float64)
    out = masked_softmax(scores, mask) @ values
    # append `extra` pad keys whose scores and values are arbitrary, and scramble the existing pads
    g = torch.Generator().manual_seed(seed)
    pad_scores = torch.randn(*scores.shape[:-1], extra, generator=g, dtype=torch.float64) * 1e3
    longer = torch.cat([scores, pad_scores], -1)
    longer = torch.where(lengths_to_mask(lengths, n_keys + extra)[:, None, :], longer, longer * -7 + 3)
    longer_values = torch.cat([values, torch.randn(values.shape[0], extra, 2, generator=g, dtype=torch.float64)], 1)
    longer_mask = lengths_to_mask(lengths, n_keys + extra)[:, None, :]
    out_longer = masked_softmax(longer, longer_mask) @ longer_values
    assert torch.allclose(out, out_longer)


# ---------------------------------------------------------------- no silent coercion (issue 18)
@pytest.mark.parametrize("lengths, dtype", [([1.5, 2], "torch.float32"), (torch.tensor([1.0, 2.0]), "torch.float32"),
                                            ([True, False], "torch.bool"), (np.array([1.5, 2.0]), "torch.float64")])
def test_lengths_to_mask_refuses_non_integer_lengths(lengths, dtype):
    """Floats were truncated ([1.5, 2] gave the mask of [1, 2]) and bools read as 0/1; now both raise."""
    with pytest.raises(TypeError, match=rf"lengths must have an integer dtype, got {dtype}"):
        lengths_to_mask(lengths)


@pytest.mark.parametrize("max_len, shown", [(2.5, "float 2.5"), (3.0, "float 3.0"), (True, "bool True"),
                                            ("3", "str '3'")])
def test_lengths_to_mask_refuses_non_integer_max_len(max_len, shown):
    """max_len=2.5 gave 3 columns (torch.arange(2.5)); now a TypeError that names max_len and its value."""
    with pytest.raises(TypeError, match=f"max_len must be an int, got {shown}"):
        lengths_to_mask([1, 2], max_len=max_len)


def test_lengths_to_mask_accepts_integer_likes():
    expected = torch.tensor([[True, False, False], [True, True, False]])
    assert torch.equal(lengths_to_mask(np.array([1, 2]), max_len=np.int64(3)), expected)
    assert torch.equal(lengths_to_mask((n for n in [1, 2]), max_len=torch.tensor(3)), expected)
    assert torch.equal(lengths_to_mask(torch.tensor([1, 2], dtype=torch.int32), 3), expected)
    assert lengths_to_mask([]).shape == (0, 0) and lengths_to_mask([], max_len=2).shape == (0, 2)


# ---------------------------------------------------------------- dim errors agree with the docstrings (issue 18)
@pytest.mark.parametrize("fn, masked", [(masked_softmax, False), (masked_softmax, True), (renormalized_softmax, True),
                                        (additive_mask_softmax, True)])
@pytest.mark.parametrize("dim", [5, 2, -3])
def test_out_of_range_dim_is_a_value_error_everywhere(fn, masked, dim):
    """masked_softmax(s, None, dim=5) raised torch's IndexError although the docstring promises ValueError."""
    scores = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool) if masked else None
    with pytest.raises(ValueError, match=rf"dim={dim} is out of range for scores of shape \(2, 3\): scores have 2 "
                                         rf"dims, so dim must lie in \[-2, 1\]"):
        fn(scores, mask, dim=dim)


@pytest.mark.parametrize("mask", [None, torch.ones(2, 3, dtype=torch.bool)])
def test_non_integer_dim_is_a_type_error(mask):
    with pytest.raises(TypeError, match="dim must be an int, got float 1.0"):
        masked_softmax(torch.zeros(2, 3), mask, dim=1.0)


def test_scalar_scores_raise_with_or_without_a_mask():
    with pytest.raises(ValueError, match="scores must have at least one dimension"):
        masked_softmax(torch.tensor(1.0), None)
