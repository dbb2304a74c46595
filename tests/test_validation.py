"""Input validation that is the same everywhere (issue 18): the shared checks of attnbook.masking, and the lengths
and shapes that interpret.AttentionClassifier takes. Each test names the silent behaviour it replaces."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook import masking
from attnbook.interpret import AttentionClassifier
from attnbook.masking import lengths_to_mask

pytestmark = pytest.mark.usefixtures("one_thread")

ENCODERS = ["bigru", "cnn", "none"]


# ---------------------------------------------------------------- attnbook.masking: the shared checks
def test_check_mask_for_accepts_the_states_shape_and_nothing_else():
    states = torch.zeros(2, 3, 4)
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert masking.check_mask_for(states, mask) is mask
    for wrong in (mask[:1], mask[:, :2], mask[:1, :1], mask[0], mask[..., None]):
        with pytest.raises(ValueError, match=r"premise_mask must have shape \(batch, length\) = \(2, 3\), got "
                                             + re.escape(str(tuple(wrong.shape)))):
            masking.check_mask_for(states, wrong, "premise_mask", states_name="premise")
    with pytest.raises(ValueError, match=r"\(premise has shape \(2, 3, 4\); masks are not broadcast\)"):
        masking.check_mask_for(states, mask[:1], "premise_mask", states_name="premise")
    with pytest.raises(TypeError, match="mask must be a bool tensor .True = takes part., got dtype torch.int64"):
        masking.check_mask_for(states, mask.long())
    with pytest.raises(ValueError, match=r"states must have at least two axes \(batch, length, ...\), got shape "
                                         r"\(3,\)"):
        masking.check_mask_for(torch.zeros(3), mask)
    with pytest.raises(TypeError, match="states must be a torch.Tensor, got list"):
        masking.check_mask_for([[0.0]], mask)


def test_check_lengths_for_shapes_ranges_and_dtypes():
    ids = torch.zeros(3, 5, dtype=torch.long)
    lengths = torch.tensor([5, 0, 2])
    assert masking.check_lengths_for(ids, lengths) is lengths
    assert masking.check_lengths_for(ids, [5, 0, 2]).tolist() == [5, 0, 2]
    with pytest.raises(ValueError, match=r"lengths must have shape \(3,\) \(one length per row of states of shape "
                                         r"\(3, 5\)\), got \(2,\)"):
        masking.check_lengths_for(ids, lengths[:2])
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 5\] for ids of shape \(3, 5\), got min 0 and "
                                         r"max 5"):
        masking.check_lengths_for(ids, lengths, x_name="ids", min_length=1)
    with pytest.raises(TypeError, match=r"lengths must have an integer dtype, got torch.float32 \(\[1.5, 2.0, 3.0\]\)"):
        masking.check_lengths_for(ids, [1.5, 2, 3])
    with pytest.raises(TypeError, match=r"lengths must have an integer dtype, got torch.bool"):
        masking.check_lengths_for(ids, np.array([True, False, True]))
    # Two batch axes, as HAN's word lengths (B, S) of ids (B, S, T).
    han_ids = torch.zeros(2, 3, 4, dtype=torch.long)
    assert masking.check_lengths_for(han_ids, torch.full((2, 3), 4), batch_dims=2).shape == (2, 3)
    with pytest.raises(ValueError, match=r"word_lengths must lie in \[0, 4\]"):
        masking.check_lengths_for(han_ids, torch.full((2, 3), 5), "word_lengths", batch_dims=2)
    with pytest.raises(ValueError, match=r"states must have at least 3 axes, got shape \(2, 3\)"):
        masking.check_lengths_for(torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), batch_dims=2)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(0, 4), length=st.integers(0, 5),
       shape=st.lists(st.integers(0, 5), min_size=0, max_size=2).map(tuple))
def test_check_lengths_for_any_other_shape_raises_naming_both(batch, length, shape):
    """Property: lengths of any shape other than (batch,) raise a ValueError that gives both shapes."""
    x = torch.zeros(batch, length, 2)
    lengths = torch.zeros(shape, dtype=torch.long)
    if shape == (batch,):
        assert masking.check_lengths_for(x, lengths) is lengths
        return
    with pytest.raises(ValueError) as info:
        masking.check_lengths_for(x, lengths)
    assert str(tuple(x.shape)) in str(info.value) and str(shape) in str(info.value)


def test_check_int_and_as_integer_tensor():
    assert masking.check_int(np.int64(3), "n") == 3 and masking.check_int(torch.tensor(2), "n") == 2
    with pytest.raises(TypeError, match="n must be an int, got float 3.0"):
        masking.check_int(3.0, "n")
    with pytest.raises(TypeError, match="n must be an int, got bool False"):
        masking.check_int(False, "n")
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        masking.check_int(0, "n", minimum=1)
    assert masking.as_integer_tensor([], "ids").dtype == torch.long
    with pytest.raises(TypeError, match="ids must be an integer tensor or a sequence of ints, got str"):
        masking.as_integer_tensor("12", "ids")
    with pytest.raises(TypeError, match="ids must be an integer tensor or a sequence of ints, got int"):
        masking.as_integer_tensor(3, "ids")
    with pytest.raises(TypeError, match=r"ids must be an integer tensor or a sequence of ints \(.*\)"):
        masking.as_integer_tensor([[1, 2], [3]], "ids")                        # ragged: torch cannot read it
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got list"):
        masking.check_lengths_for([[1, 2]], [2], x_name="ids")


# ---------------------------------------------------------------- interpret.AttentionClassifier
def _model(encoder, uniform=False):
    torch.manual_seed(0)
    return AttentionClassifier(20, embed_size=6, hidden_size=4, attention_size=5, uniform=uniform,
                               encoder=encoder).double().eval()


def _ids(b=3, t=5):
    return torch.randint(1, 20, (b, t), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("encoder", ENCODERS)
@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("lengths", [[5], [5, 4], [5, 4, 3, 2]])
def test_classifier_refuses_lengths_of_another_batch_size(encoder, uniform, lengths):
    """lengths of batch 1 for 3 rows reused row 0's length for every row (encoder "none"/"cnn"), and lengths of
    batch 2 dropped the third row ("bigru" packing); now a ValueError that gives both shapes."""
    model = _model(encoder, uniform)
    with pytest.raises(ValueError, match=rf"lengths must have shape \(3,\) \(one length per row of ids of shape "
                                         rf"\(3, 5\)\), got \({len(lengths)},\)"):
        model(_ids(), torch.tensor(lengths))


@pytest.mark.parametrize("encoder", ENCODERS)
def test_classifier_refuses_float_and_out_of_range_lengths(encoder):
    model = _model(encoder)
    with pytest.raises(TypeError, match=r"lengths must have an integer dtype, got torch.float32 \(\[5.0, 4.5, 1.0\]\)"):
        model(_ids(), torch.tensor([5.0, 4.5, 1.0]))
    low = 1 if encoder == "bigru" else 0
    with pytest.raises(ValueError, match=rf"lengths must lie in \[{low}, 5\] for ids of shape \(3, 5\), got min 1 "
                                         rf"and max 6"):
        model(_ids(), torch.tensor([6, 2, 1]))
    with pytest.raises(ValueError, match=r"ids must have shape \(batch, length\), got \(5,\)"):
        model(_ids()[0], torch.tensor([5]))


@pytest.mark.parametrize("encoder", ["cnn", "none"])
def test_classifier_length_zero_row_gets_zero_weights_without_packing(encoder):
    _, weights = _model(encoder)(_ids(), torch.tensor([5, 0, 2]))
    assert torch.all(weights[1] == 0) and torch.allclose(weights[0].sum(), torch.tensor(1.0, dtype=torch.float64))


def test_classifier_refuses_a_length_zero_row_with_the_packed_gru():
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 5\] for ids of shape \(3, 5\), got min 0"):
        _model("bigru")(_ids(), torch.tensor([5, 0, 2]))


@pytest.mark.parametrize("encoder", ENCODERS)
def test_classifier_checks_given_embeddings_and_weights(encoder):
    model = _model(encoder)
    ids, lengths = _ids(), torch.tensor([5, 3, 1])
    embeddings = model.embed(ids)
    with pytest.raises(ValueError, match=r"embeddings must have shape \(3, 5, 6\) to match ids of shape \(3, 5\), "
                                         r"got \(2, 5, 6\)"):
        model(ids, lengths, embeddings=embeddings[:2])
    with pytest.raises(ValueError, match=r"weights must have the shape of ids \(3, 5\), got \(3, 4\)"):
        model(ids, lengths, weights=torch.full((3, 4), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"embeddings must have shape \(batch, length, 6\), got \(3, 5, 2\)"):
        model.states(embeddings[..., :2], lengths)
    with pytest.raises(ValueError, match=r"lengths must have shape \(3,\) \(one length per row of embeddings of "
                                         r"shape \(3, 5, 6\)\), got \(1,\)"):
        model.states(embeddings, lengths[:1])


@pytest.mark.parametrize("encoder", ENCODERS)
def test_classifier_on_an_empty_batch_gives_empty_outputs(encoder):
    logits, weights = _model(encoder)(torch.zeros(0, 5, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert logits.shape == (0,) and weights.shape == (0, 5)


@pytest.mark.parametrize("encoder", ENCODERS)
def test_classifier_accepts_valid_lengths_as_before(encoder):
    """The checks change nothing for valid input: a list of lengths gives what the tensor gives, and the weights are
    the masked softmax over the valid positions."""
    model = _model(encoder)
    ids, lengths = _ids(), torch.tensor([5, 3, 1])
    logits, weights = model(ids, lengths)
    logits_list, _ = model(ids, [5, 3, 1])
    assert torch.equal(logits, logits_list)
    assert torch.all(weights[~lengths_to_mask(lengths, 5)] == 0)


def test_classifier_refuses_ids_and_embeddings_that_are_not_tensors():
    model = _model("cnn")
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got list"):
        model([[1, 2, 3]], torch.tensor([3]))
    with pytest.raises(TypeError, match="embeddings must be a torch.Tensor, got list"):
        model.states([[[0.0] * 6]], torch.tensor([1]))
