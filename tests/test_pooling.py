"""attnbook.pooling against independent references: softmax over the sliced valid positions, hand-built additive
masks, means and indexing of the states, finite differences (gradcheck), and hypothesis properties of padding."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.pooling import MASKINGS, POOLINGS, UNSAFE, AttentionPooling, Pooling, pool_weights


pytestmark = pytest.mark.usefixtures("one_thread")


LENGTHS = [6, 3, 1, 4]


def _scores_and_mask(lengths=LENGTHS, width=6, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(len(lengths), width, generator=generator, dtype=dtype) * 2
    mask = torch.arange(width) < torch.tensor(lengths).unsqueeze(1)
    return scores, mask


# ---------------------------------------------------------------- pool_weights: references
@pytest.mark.parametrize("masking", ["neg_inf", "renormalize"])
def test_masked_weights_equal_softmax_over_valid_positions(masking):
    scores, mask = _scores_and_mask()
    weights = pool_weights(scores, mask, masking)
    for b, n in enumerate(LENGTHS):
        assert torch.allclose(weights[b, :n], torch.softmax(scores[b, :n], dim=-1), atol=1e-12)
        assert torch.all(weights[b, n:] == 0)  # exactly 0, not merely small


def test_masked_weights_with_pads_in_front_and_holes():
    """The mask need not be a prefix: pre-padding and scattered pads are sliced the same way."""
    scores, _ = _scores_and_mask()
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 0, 1, 0, 1, 0], [0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1]]).bool()
    for masking in ("neg_inf", "renormalize"):
        weights = pool_weights(scores, mask, masking)
        for b in range(4):
            assert torch.allclose(weights[b, mask[b]], torch.softmax(scores[b, mask[b]], dim=-1), atol=1e-12)
            assert torch.all(weights[b, ~mask[b]] == 0)


def test_additive_weights_equal_softmax_with_minus_1e4_on_pads():
    scores, mask = _scores_and_mask()
    bias = torch.zeros_like(scores)
    bias[~mask] = -10_000.0
    reference = torch.exp(scores + bias - (scores + bias).amax(-1, keepdim=True))
    reference = reference / reference.sum(-1, keepdim=True)
    assert torch.allclose(pool_weights(scores, mask, "additive"), reference, atol=1e-12)
    # and in float64 the pads' share is exp(-1e4)-small: 0
    assert torch.all(pool_weights(scores, mask, "additive")[~mask] == 0)


def test_none_weights_equal_plain_softmax_pads_included():
    scores, mask = _scores_and_mask()
    weights = pool_weights(scores, mask, "none")
    reference = scores.exp() / scores.exp().sum(-1, keepdim=True)
    assert torch.allclose(weights, reference, atol=1e-12)
    assert torch.all(weights[~mask] > 0)


@pytest.mark.parametrize("masking", MASKINGS + (UNSAFE,))
def test_weights_sum_to_one_when_a_row_has_a_valid_position(masking):
    scores, mask = _scores_and_mask()
    assert torch.allclose(pool_weights(scores, mask, masking).sum(-1), torch.ones(len(LENGTHS), dtype=scores.dtype))


# ---------------------------------------------------------------- rows with every position masked
def test_all_masked_row_neg_inf_is_zero_with_zero_gradient():
    scores, mask = _scores_and_mask()
    mask[1] = False
    scores.requires_grad_(True)
    weights = pool_weights(scores, mask, "neg_inf")
    assert not weights.isnan().any()
    assert torch.all(weights[1] == 0)
    (weights * torch.randn_like(weights)).sum().backward()
    assert not scores.grad.isnan().any()
    assert torch.all(scores.grad[1] == 0)


def test_all_masked_row_renormalize_is_zero():
    scores, mask = _scores_and_mask()
    mask[2] = False
    weights = pool_weights(scores, mask, "renormalize")
    assert torch.all(weights[2] == 0) and not weights.isnan().any()


def test_all_masked_row_unsafe_is_nan():
    """The documented failure of ``masked_fill(-inf).softmax()``: NaN on the empty row only."""
    scores, mask = _scores_and_mask()
    mask[1] = False
    weights = pool_weights(scores, mask, UNSAFE)
    assert weights[1].isnan().all()
    assert not weights[[0, 2, 3]].isnan().any()
    assert torch.allclose(weights[[0, 2, 3]], pool_weights(scores, mask, "neg_inf")[[0, 2, 3]])


def test_all_masked_row_additive_is_softmax_of_scores():
    scores, mask = _scores_and_mask()
    mask[1] = False
    weights = pool_weights(scores, mask, "additive")
    assert torch.allclose(weights[1], torch.softmax(scores[1], dim=-1), atol=1e-9)


# ---------------------------------------------------------------- AttentionPooling
def _pool(masking, input_size=4, attention_size=3, seed=0):
    torch.manual_seed(seed)
    return AttentionPooling(input_size, attention_size, masking).double()


def test_attention_pooling_is_weighted_sum_of_states_with_yang_scores():
    pool = _pool("neg_inf")
    states, (_, mask) = torch.randn(4, 6, 4, dtype=torch.float64), _scores_and_mask()
    pooled, weights = pool(states, mask)
    # eqs. 5-7 by hand
    scores = torch.tanh(states @ pool.proj.weight.T + pool.proj.bias) @ pool.context
    for b, n in enumerate(LENGTHS):
        alpha = torch.softmax(scores[b, :n], dim=-1)
        assert torch.allclose(weights[b, :n], alpha)
        assert torch.allclose(pooled[b], (alpha.unsqueeze(1) * states[b, :n]).sum(0))


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4), extra=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_neg_inf_pooling_ignores_appended_pads_with_any_contents(lengths, extra, seed):
    pool = _pool("neg_inf")
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    states = torch.randn(len(lengths), width, 4, generator=generator, dtype=torch.float64)
    mask = torch.arange(width) < torch.tensor(lengths).unsqueeze(1)
    junk = torch.randn(len(lengths), extra, 4, generator=generator, dtype=torch.float64) * 100
    longer_states = torch.cat([states.masked_fill(~mask.unsqueeze(-1), 0.0), junk], dim=1)
    # junk also replaces the contents of the original pad positions
    longer_states[:, :width][~mask] = torch.randn(int((~mask).sum()), 4, generator=generator, dtype=torch.float64)
    longer_mask = torch.cat([mask, torch.zeros(len(lengths), extra, dtype=torch.bool)], dim=1)
    pooled, weights = pool(states, mask)
    pooled_long, weights_long = pool(longer_states, longer_mask)
    assert torch.allclose(pooled, pooled_long, atol=1e-12)
    assert torch.allclose(weights, weights_long[:, :width], atol=1e-12)
    assert torch.all(weights_long[~longer_mask] == 0)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4), extra=st.integers(1, 6),
       seed=st.integers(0, 2**16))
def test_unmasked_pooling_changes_when_zero_pads_are_appended(lengths, extra, seed):
    """Without a mask, zero states still score ``tanh(b) . u_w`` and take a share: the property above can fail."""
    pool = _pool("none")
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(len(lengths), max(lengths), 4, generator=generator, dtype=torch.float64)
    mask = torch.ones(len(lengths), max(lengths), dtype=torch.bool)
    longer = torch.cat([states, torch.zeros(len(lengths), extra, 4, dtype=torch.float64)], dim=1)
    longer_mask = torch.cat([mask, torch.zeros(len(lengths), extra, dtype=torch.bool)], dim=1)
    _, weights = pool(states, mask)
    _, weights_long = pool(longer, longer_mask)
    real_long = weights_long[:, : max(lengths)]
    assert torch.all(real_long.sum(-1) < 1 - 1e-6)  # the pads took part of the mass
    assert not torch.allclose(weights, real_long, atol=1e-6)


def test_zero_state_score_equals_score_of_a_zero_state():
    pool = _pool("neg_inf", input_size=5, attention_size=7)
    with torch.no_grad():
        pool.proj.bias.normal_()
        expected = float(pool.scores(torch.zeros(1, 1, 5, dtype=torch.float64))[0, 0])
        by_hand = float(torch.tanh(pool.proj.bias) @ pool.context)
    assert isinstance(pool.zero_state_score(), float)
    assert pool.zero_state_score() == pytest.approx(expected, abs=1e-12) == by_hand


def test_attention_pooling_gradcheck_with_mask():
    pool = _pool("neg_inf", input_size=3, attention_size=2)
    states = torch.randn(3, 4, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda s: pool(s, mask)[0], (states,))
    params = (pool.proj.weight, pool.proj.bias, pool.context)

    def by_parameters(weight, bias, context):
        scores = torch.tanh(states.detach() @ weight.T + bias) @ context
        return pool_weights(scores, mask, "neg_inf")

    assert torch.autograd.gradcheck(by_parameters, tuple(p.detach().clone().requires_grad_(True) for p in params))


# ---------------------------------------------------------------- Pooling kinds
def _states_and_mask(seed=1):
    generator = torch.Generator().manual_seed(seed)
    states = torch.randn(4, 6, 8, generator=generator, dtype=torch.float64)
    return states, torch.arange(6) < torch.tensor(LENGTHS).unsqueeze(1)


def test_mean_pooling_is_mean_of_valid_states():
    states, mask = _states_and_mask()
    pooled, weights = Pooling("mean", 8)(states, mask)
    for b, n in enumerate(LENGTHS):
        assert torch.allclose(pooled[b], states[b, :n].mean(0))
        assert torch.all(weights[b, n:] == 0)


def test_uniform_pooling_is_mean_over_all_positions():
    states, mask = _states_and_mask()
    pooled, weights = Pooling("uniform", 8)(states, mask)
    assert torch.allclose(pooled, states.mean(1))
    assert torch.allclose(weights, torch.full((4, 6), 1 / 6, dtype=torch.float64))


def test_last_pooling_post_padding():
    states, mask = _states_and_mask()
    pooled, weights = Pooling("last", 8)(states, mask)
    for b, n in enumerate(LENGTHS):
        assert torch.equal(pooled[b], torch.cat([states[b, n - 1, :4], states[b, 0, 4:]]))
        assert weights[b].tolist() == [float(t == n - 1) for t in range(6)]


def test_last_pooling_pre_padding():
    states, mask = _states_and_mask()
    mask = mask.flip(-1)  # the last lengths[b] positions are real
    pooled, _ = Pooling("last", 8)(states, mask)
    for b, n in enumerate(LENGTHS):
        assert torch.equal(pooled[b], torch.cat([states[b, 5, :4], states[b, 6 - n, 4:]]))


def test_last_pooling_unidirectional():
    states, mask = _states_and_mask()
    pooled, _ = Pooling("last", 8, bidirectional=False)(states, mask)
    for b, n in enumerate(LENGTHS):
        assert torch.equal(pooled[b], states[b, n - 1])


@pytest.mark.parametrize("masking", MASKINGS)
def test_attention_kind_delegates_to_attention_pooling(masking):
    torch.manual_seed(3)
    pooling = Pooling("attention", 8, attention_size=5, masking=masking).double()
    states, mask = _states_and_mask()
    pooled, weights = pooling(states, mask)
    expected, expected_weights = pooling.attention(states, mask)
    assert torch.equal(pooled, expected) and torch.equal(weights, expected_weights)
    assert pooling.attention.masking == masking and set(POOLINGS) == {"attention", "mean", "uniform", "last"}


# ---------------------------------------------------------------- errors
def test_pool_weights_unknown_masking():
    scores, mask = _scores_and_mask()
    with pytest.raises(ValueError, match=r"masking must be one of .*'neg_inf_unsafe'.*got 'zeros'"):
        pool_weights(scores, mask, "zeros")


def test_attention_pooling_unknown_masking():
    with pytest.raises(ValueError, match=r"masking must be one of .* got 'mask'"):
        AttentionPooling(4, 3, "mask")


def test_pooling_unknown_kind():
    with pytest.raises(ValueError, match=r"pooling must be one of \('attention', 'mean', 'uniform', 'last'\), got "
                                         r"'max'"):
        Pooling("max", 4)


def test_pool_weights_mask_not_bool():
    scores, mask = _scores_and_mask()
    with pytest.raises(TypeError, match="mask must be a bool tensor .* got dtype torch.int64"):
        pool_weights(scores, mask.long(), "neg_inf")


def test_pooling_mask_not_bool():
    states, mask = _states_and_mask()
    with pytest.raises(TypeError, match="mask must be a bool tensor .* got dtype torch.float32"):
        Pooling("mean", 8)(states, mask.float())
    with pytest.raises(TypeError, match="mask must be a bool torch.Tensor, got list"):
        Pooling("attention", 8).double()(states, mask.tolist())


def test_pool_weights_shape_mismatch():
    scores, mask = _scores_and_mask()
    with pytest.raises(ValueError, match=r"mask shape \(4, 5\) must equal scores shape \(4, 6\)"):
        pool_weights(scores, mask[:, :5], "neg_inf")


def test_attention_pooling_shape_mismatch():
    pool = _pool("neg_inf")
    states, (_, mask) = torch.randn(4, 6, 4, dtype=torch.float64), _scores_and_mask()
    with pytest.raises(ValueError, match=r"states must be \(B, T, D\) and mask \(B, T\), got \(4, 6, 4\) and \(4, 5\)"):
        pool(states, mask[:, :5])
    with pytest.raises(ValueError, match=r"got \(6, 4\) and \(4, 6\)"):
        pool(states[0], mask)


# ---------------------------------------------------------------- masks of the wrong shape (issue 18)
def _shape_message(states, mask):
    """The parts every wrong-shape message must hold: the mask's shape and the states' (batch, length)."""
    return (rf"mask must have shape \(batch, length\) = \({states.shape[0]}, {states.shape[1]}\), got "
            rf"{re.escape(str(tuple(mask.shape)))} \(states has shape {re.escape(str(tuple(states.shape)))}")


@pytest.mark.parametrize("kind", POOLINGS)
@pytest.mark.parametrize("cut", ["batch", "length", "both"])
def test_pooling_refuses_a_mask_of_another_batch_or_length(kind, cut):
    """"mean", "uniform" and "last" broadcast a (1, T) or (B, 1) mask silently; every kind now raises."""
    states, mask = _states_and_mask()
    wrong = {"batch": mask[:1], "length": mask[:, :1], "both": mask[:1, :1]}[cut]
    with pytest.raises(ValueError, match=_shape_message(states, wrong)):
        Pooling(kind, 8).double()(states, wrong)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(POOLINGS), batch=st.integers(1, 3), length=st.integers(1, 4),
       mask_shape=st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple), data=st.data())
def test_any_mask_shape_other_than_the_states_raises_naming_both(kind, batch, length, mask_shape, data):
    """Property: for every pooling kind, a bool mask whose shape is not (B, T) of the states raises a ValueError
    whose message gives both shapes; a mask of the right shape is accepted."""
    states = torch.randn(batch, length, 4, dtype=torch.float64)
    pool = Pooling(kind, 4, attention_size=3).double()
    if mask_shape == (batch, length):
        mask = torch.ones(mask_shape, dtype=torch.bool)
        assert pool(states, mask)[0].shape == (batch, 4)
        return
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=math.prod(mask_shape),
                                           max_size=math.prod(mask_shape))), dtype=torch.bool).reshape(mask_shape)
    with pytest.raises(ValueError) as info:
        pool(states, mask)
    assert str(tuple(mask.shape)) in str(info.value) and str(tuple(states.shape)) in str(info.value)


def test_pooling_refuses_states_that_are_not_3d():
    _, mask = _states_and_mask()
    with pytest.raises(ValueError, match=r"states must have shape \(batch, length, size\), got \(4, 6\)"):
        Pooling("mean", 8)(torch.zeros(4, 6), mask)
    with pytest.raises(TypeError, match="states must be a torch.Tensor, got list"):
        Pooling("uniform", 8)([[0.0]], mask)


def test_attention_pooling_checks_the_mask_type_before_its_shape():
    """AttentionPooling called directly with a list mask raised AttributeError ('list' has no 'shape')."""
    states, mask = _states_and_mask()
    with pytest.raises(TypeError, match="mask must be a bool torch.Tensor, got list"):
        _pool("neg_inf", input_size=8)(states, mask.tolist())


# ---------------------------------------------------------------- empty and degenerate sizes (issue 18)
@pytest.mark.parametrize("kind", ["attention", "mean", "uniform"])
def test_pooling_over_zero_positions_gives_zero_vectors(kind):
    """T = 0: "uniform" divided by zero (ZeroDivisionError); now every kind but "last" gives what a fully masked row
    gives, zero vectors and (B, 0) weights."""
    states, mask = torch.zeros(3, 0, 8, dtype=torch.float64), torch.zeros(3, 0, dtype=torch.bool)
    pooled, weights = Pooling(kind, 8).double()(states, mask)
    assert torch.equal(pooled, torch.zeros(3, 8, dtype=torch.float64)) and weights.shape == (3, 0)


def test_last_pooling_needs_a_real_position_in_every_row():
    states, mask = _states_and_mask()
    mask = mask.clone()
    mask[[1, 3]] = False
    for bidirectional in (True, False):
        with pytest.raises(ValueError, match=r"pooling 'last' needs at least one True position in every row of mask, "
                                             r"but rows \[1, 3\] of mask \(shape \(4, 6\)\) have none"):
            Pooling("last", 8, bidirectional=bidirectional)(states, mask)
    with pytest.raises(ValueError, match=r"rows \[0, 1\] of mask \(shape \(2, 0\)\) have none"):
        Pooling("last", 8)(torch.zeros(2, 0, 8), torch.zeros(2, 0, dtype=torch.bool))


@pytest.mark.parametrize("kind", POOLINGS)
def test_pooling_an_empty_batch_gives_empty_outputs(kind):
    pooled, weights = Pooling(kind, 8).double()(torch.zeros(0, 5, 8, dtype=torch.float64),
                                                torch.zeros(0, 5, dtype=torch.bool))
    assert pooled.shape == (0, 8) and weights.shape == (0, 5)
