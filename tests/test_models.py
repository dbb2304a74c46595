"""attnbook.models: invariance of the document classifiers to extra padding (hypothesis), with the controls that
show the property can fail; packed states against a GRU run on each document alone; masks for pre-padding; paired
initialization; the HAN's empty sentences under the safe and the unsafe mask."""

import functools

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.models import HAN, BiGRUClassifier, BiGRUEncoder, padding_mask


pytestmark = pytest.mark.usefixtures("one_thread")


VOCAB = 30
SIZES = dict(embed_size=6, hidden_size=4, attention_size=5)


@functools.lru_cache(maxsize=None)
def _classifier(masking="neg_inf", packed=True, padding_side="post", pooling="attention"):
    """A float64 model in eval mode, the same weights for every call with the same arguments."""
    torch.manual_seed(0)
    model = BiGRUClassifier(VOCAB, **SIZES, pooling=pooling, masking=masking, packed=packed,
                            padding_side=padding_side)
    with torch.no_grad():  # a non-zero pooling bias, so that a zero state does not score 0
        if model.pooling.attention is not None:
            model.pooling.attention.proj.bias.normal_()
    return model.double().eval()


def _batch(lengths, seed, width=None):
    """Post-padded ids (pad id 0) with random real tokens in [1, VOCAB)."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(lengths)
    width = int(lengths.max()) if width is None else width
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator)
    return ids.masked_fill(~padding_mask(lengths, width), 0), lengths


def _logits(model, ids, lengths):
    with torch.no_grad():
        return model(ids, lengths)[0]


LENGTH_LISTS = st.lists(st.integers(1, 8), min_size=1, max_size=5)


# ---------------------------------------------------------------- re-padding invariance (the property)
@settings(max_examples=25, deadline=None)
@given(lengths=LENGTH_LISTS, extra=st.integers(1, 20), seed=st.integers(0, 2**16),
       masking=st.sampled_from(["neg_inf", "additive", "renormalize"]))
def test_packed_masked_logits_do_not_change_when_repadded(lengths, extra, seed, masking):
    model = _classifier(masking)
    ids, lengths = _batch(lengths, seed)
    logits = _logits(model, ids, lengths)
    repadded = _logits(model, F.pad(ids, (0, extra)), lengths)
    assert torch.allclose(logits, repadded, atol=1e-6, rtol=0)
    assert torch.isfinite(logits).all()


@settings(max_examples=20, deadline=None)
@given(lengths=LENGTH_LISTS, extra=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_packed_neg_inf_logits_of_a_document_do_not_depend_on_its_batch(lengths, extra, seed):
    """A document alone, at its own length, gets the logits it gets inside a padded batch."""
    model = _classifier("neg_inf")
    ids, lengths = _batch(lengths, seed, width=max(lengths) + extra)
    logits = _logits(model, ids, lengths)
    for b, n in enumerate(lengths.tolist()):
        alone = _logits(model, ids[b: b + 1, :n], lengths[b: b + 1])
        assert torch.allclose(logits[b], alone[0], atol=1e-6, rtol=0)


@settings(max_examples=15, deadline=None)
@given(lengths=LENGTH_LISTS, extra=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_packed_unmasked_logits_change_when_repadded(lengths, extra, seed):
    """Control: without a mask the zero pad states take a share of the attention, so the property above fails."""
    model = _classifier("none")
    ids, lengths = _batch(lengths, seed)
    logits = _logits(model, ids, lengths)
    repadded = _logits(model, F.pad(ids, (0, extra)), lengths)
    assert not torch.allclose(logits, repadded, atol=1e-6, rtol=0)
    _, weights = model(F.pad(ids, (0, extra)), lengths)
    assert torch.all(weights[:, -extra:] > 0)


@settings(max_examples=15, deadline=None)
@given(lengths=LENGTH_LISTS, extra=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_unpacked_masked_logits_change_when_repadded(lengths, extra, seed):
    """Control: unpacked, the backward GRU reads the pads before the document, so even a masked model changes."""
    model = _classifier("neg_inf", packed=False)
    ids, lengths = _batch(lengths, seed)
    logits = _logits(model, ids, lengths)
    repadded = _logits(model, F.pad(ids, (0, extra)), lengths)
    assert not torch.allclose(logits, repadded, atol=1e-6, rtol=0)
    with torch.no_grad():  # the forward half of the states at real positions is unchanged, the backward half is not
        short = model.encoder(model.embedding(ids), lengths)
        long = model.encoder(model.embedding(F.pad(ids, (0, extra))), lengths)[:, : ids.shape[1]]
    mask = padding_mask(lengths, ids.shape[1])
    assert torch.allclose(short[..., :4][mask], long[..., :4][mask], atol=1e-12)
    assert not torch.allclose(short[..., 4:][mask], long[..., 4:][mask], atol=1e-6)


# ---------------------------------------------------------------- the encoder
def test_packed_encoder_pad_states_are_exactly_zero_and_real_states_match_a_gru_per_document():
    torch.manual_seed(0)
    encoder = BiGRUEncoder(3, 4, packed=True).double()
    lengths = torch.tensor([5, 2, 7, 1])
    inputs = torch.randn(4, 9, 3, dtype=torch.float64) * 10  # junk at the pad positions too
    with torch.no_grad():
        states = encoder(inputs, lengths)
        assert states.shape == (4, 9, 8)
        mask = padding_mask(lengths, 9)
        assert torch.all(states[~mask] == 0)
        for b, n in enumerate(lengths.tolist()):
            alone, _ = encoder.gru(inputs[b: b + 1, :n])  # the reference: the GRU over the document only
            assert torch.allclose(states[b, :n], alone[0], atol=1e-12)


def test_unpacked_encoder_runs_over_the_pads():
    torch.manual_seed(0)
    encoder = BiGRUEncoder(3, 4, packed=False).double()
    inputs = torch.zeros(1, 6, 3, dtype=torch.float64)
    inputs[0, :2] = torch.randn(2, 3, dtype=torch.float64)
    with torch.no_grad():
        states = encoder(inputs, torch.tensor([2]))
        assert torch.equal(states, encoder.gru(inputs)[0])
    assert torch.all(states[0, 2:].abs().sum(-1) > 0)  # the biases move the state over zero inputs


# ---------------------------------------------------------------- pre-padding, options and errors
def test_padding_mask_post_and_pre():
    lengths = torch.tensor([3, 1, 0])
    post = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(padding_mask(lengths, 4), post)
    assert torch.equal(padding_mask(lengths, 4, "pre"), post.flip(-1))


def test_pre_padded_classifier_masks_the_leading_positions():
    model = _classifier("neg_inf", packed=False, padding_side="pre")
    lengths = torch.tensor([5, 2, 7])
    post, _ = _batch(lengths.tolist(), seed=1)
    ids = torch.stack([row.roll(int(7 - n)) for row, n in zip(post, lengths)])  # pads moved to the front
    assert torch.equal(ids != 0, padding_mask(lengths, 7, "pre"))
    with torch.no_grad():
        logits, weights = model(ids, lengths)
    expected = padding_mask(lengths, 7, "pre")
    assert torch.all(weights[~expected] == 0) and torch.all(weights[expected] > 0)
    assert torch.allclose(weights.sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.isfinite(logits).all()


def test_pre_padded_last_pooling_takes_the_final_position():
    model = _classifier(packed=False, padding_side="pre", pooling="last")
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    with torch.no_grad():
        _, weights = model(ids, torch.tensor([3, 5]))
    assert weights.tolist() == [[0, 0, 0, 0, 1], [0, 0, 0, 0, 1]]


def test_packed_with_pre_padding_raises():
    with pytest.raises(ValueError, match=r"a packed encoder needs padding_side='post' \(pack_padded_sequence"):
        BiGRUClassifier(VOCAB, packed=True, padding_side="pre")


def test_unknown_padding_side_raises():
    with pytest.raises(ValueError, match="padding_side must be 'post' or 'pre', got 'left'"):
        BiGRUClassifier(VOCAB, packed=False, padding_side="left")
    with pytest.raises(ValueError, match="padding_side must be 'post' or 'pre', got 'left'"):
        padding_mask(torch.tensor([1]), 2, "left")


def test_unknown_pooling_and_masking_raise():
    with pytest.raises(ValueError, match="pooling must be one of .* got 'max'"):
        BiGRUClassifier(VOCAB, pooling="max")
    with pytest.raises(ValueError, match="masking must be one of .* got 'mask'"):
        BiGRUClassifier(VOCAB, masking="mask")


@pytest.mark.parametrize("lengths", [[3, 0], [3, 6]])
def test_lengths_out_of_range_raise(lengths):
    model = _classifier()
    ids = torch.ones(2, 5, dtype=torch.long)
    low, high = min(lengths), max(lengths)
    with pytest.raises(ValueError, match=rf"lengths must lie in \[1, 5\] for ids of shape \(2, 5\), got min {low} "
                                         rf"and max {high}"):
        model(ids, torch.tensor(lengths))


def test_padding_mask_length_above_max_len_raises():
    with pytest.raises(ValueError, match=r"lengths must be <= max_len=3, got \[4\]"):
        padding_mask(torch.tensor([4]), 3)


# ---------------------------------------------------------------- paired initialization
def _built_after_seed(**kwargs):
    torch.manual_seed(0)
    return BiGRUClassifier(VOCAB, **SIZES, **kwargs)


@pytest.mark.parametrize("other", [dict(pooling="mean"), dict(pooling="uniform"), dict(pooling="last"),
                                   dict(masking="none"), dict(packed=False), dict(packed=False, padding_side="pre")])
def test_one_seed_gives_the_same_embedding_encoder_and_classifier_in_every_condition(other):
    attention = _built_after_seed(pooling="attention", masking="neg_inf")
    baseline = _built_after_seed(**other)
    for name in ("embedding", "encoder", "classifier"):
        left, right = getattr(attention, name).state_dict(), getattr(baseline, name).state_dict()
        assert left.keys() == right.keys()
        assert all(torch.equal(left[k], right[k]) for k in left), name
    assert torch.all(attention.embedding.weight[0] == 0)  # <pad> embeds to zero


def test_maskings_share_every_parameter():
    left, right = _built_after_seed(masking="neg_inf").state_dict(), _built_after_seed(masking="none").state_dict()
    assert left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


# ---------------------------------------------------------------- HAN
HAN_SIZES = dict(embed_size=6, hidden_size=4, attention_size=5)


def _han(masking):
    torch.manual_seed(0)
    return HAN(VOCAB, **HAN_SIZES, masking=masking).double()


def _han_batch():
    """Three documents of 3, 1 and 2 sentences padded to 3 sentences of 5 words; padded sentences have length 0."""
    word_lengths = torch.tensor([[5, 2, 3], [4, 0, 0], [1, 3, 0]])
    sentence_lengths = torch.tensor([3, 1, 2])
    ids = torch.randint(1, VOCAB, (3, 3, 5), generator=torch.Generator().manual_seed(0))
    ids = ids.masked_fill(torch.arange(5) >= word_lengths.unsqueeze(-1), 0)
    return ids, word_lengths, sentence_lengths, torch.tensor([0, 1, 0])


def test_han_neg_inf_empty_sentences_give_finite_logits_and_gradients():
    model = _han("neg_inf")
    ids, word_lengths, sentence_lengths, labels = _han_batch()
    logits, word_weights, sentence_weights = model(ids, word_lengths, sentence_lengths)
    assert logits.shape == (3, 2) and word_weights.shape == (3, 3, 5) and sentence_weights.shape == (3, 3)
    assert torch.isfinite(logits).all()
    padded = word_lengths == 0
    assert torch.all(word_weights[padded] == 0)  # an empty sentence has an all-zero weight row, not NaN
    assert torch.allclose(word_weights[~padded].sum(-1), torch.ones(int((~padded).sum()), dtype=torch.float64))
    assert torch.all(sentence_weights[torch.arange(3) >= sentence_lengths.unsqueeze(1)] == 0)
    F.cross_entropy(logits, labels).backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


def test_han_unsafe_mask_puts_nan_into_the_gradients():
    """The failure the chapter shows: NaN word weights on empty sentences. The packed sentence GRU never reads the
    NaN sentence vectors, so the first loss is finite, but the backward pass carries NaN into the word encoder's
    gradient, and one optimizer step makes the next loss NaN."""
    model = _han("neg_inf_unsafe")
    ids, word_lengths, sentence_lengths, labels = _han_batch()
    logits, word_weights, _ = model(ids, word_lengths, sentence_lengths)
    padded = word_lengths == 0
    assert word_weights[padded].isnan().all() and not word_weights[~padded].isnan().any()
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    nan_grads = [name for name, p in model.named_parameters() if p.grad is not None and p.grad.isnan().any()]
    assert nan_grads and all(name.startswith("word_encoder.") for name in nan_grads)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    logits, _, _ = model(ids, word_lengths, sentence_lengths)
    assert F.cross_entropy(logits, labels).isnan()


def test_han_safe_and_unsafe_agree_without_empty_sentences():
    ids, word_lengths, sentence_lengths, _ = _han_batch()
    full = word_lengths.clamp_min(1)
    with torch.no_grad():
        safe = _han("neg_inf")(ids, full, torch.tensor([3, 3, 3]))[0]
        unsafe = _han("neg_inf_unsafe")(ids, full, torch.tensor([3, 3, 3]))[0]
    assert torch.allclose(safe, unsafe, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(extra_sentences=st.integers(0, 3), extra_words=st.integers(0, 4))
def test_han_logits_do_not_change_with_extra_empty_sentences_or_word_padding(extra_sentences, extra_words):
    model = _han("neg_inf").eval()
    ids, word_lengths, sentence_lengths, _ = _han_batch()
    with torch.no_grad():
        logits, _, sentence_weights = model(ids, word_lengths, sentence_lengths)
        longer_ids = F.pad(ids, (0, extra_words, 0, extra_sentences))
        longer_lengths = F.pad(word_lengths, (0, extra_sentences))
        longer, _, longer_weights = model(longer_ids, longer_lengths, sentence_lengths)
    assert longer_ids.shape == (3, 3 + extra_sentences, 5 + extra_words)
    assert torch.allclose(logits, longer, atol=1e-6, rtol=0)
    assert torch.allclose(sentence_weights, longer_weights[:, :3], atol=1e-12)


def test_han_shape_errors():
    model = _han("neg_inf")
    ids, word_lengths, sentence_lengths, _ = _han_batch()
    with pytest.raises(ValueError, match=r"ids must be \(B, S, T\), word_lengths \(B, S\) and sentence_lengths "
                                         r"\(B,\), got \(3, 15\), \(3, 3\) and \(3,\)"):
        model(ids.reshape(3, 15), word_lengths, sentence_lengths)
    with pytest.raises(ValueError, match=r"got \(3, 3, 5\), \(3, 2\) and \(3,\)"):
        model(ids, word_lengths[:, :2], sentence_lengths)
    with pytest.raises(ValueError, match=r"got \(3, 3, 5\), \(3, 3\) and \(2,\)"):
        model(ids, word_lengths, sentence_lengths[:2])


# ---------------------------------------------------------------- lengths checked against the ids (issue 18)
@pytest.mark.parametrize("pooling", ["attention", "mean", "uniform", "last"])
@pytest.mark.parametrize("n_lengths", [1, 3])
def test_classifier_refuses_lengths_of_another_batch_size(pooling, n_lengths):
    """lengths with one entry for a batch of 2 (or three) made a mask of the wrong batch size, which the pooling
    broadcast (or pack_padded_sequence rejected with its own message); now a ValueError that gives both shapes."""
    model = _classifier(pooling=pooling)
    ids, _ = _batch([4, 2], seed=0)
    with pytest.raises(ValueError, match=rf"lengths must have shape \(2,\) \(one length per row of ids of shape "
                                         rf"\(2, 4\)\), got \({n_lengths},\)"):
        model(ids, torch.tensor([4, 2, 3][:n_lengths]))


def test_classifier_refuses_float_lengths():
    ids, _ = _batch([4, 2], seed=0)
    with pytest.raises(TypeError, match=r"lengths must have an integer dtype, got torch.float32 \(\[4.0, 2.5\]\)"):
        _classifier()(ids, torch.tensor([4.0, 2.5]))


@pytest.mark.parametrize("packed", [True, False])
def test_encoder_checks_lengths_and_handles_an_empty_batch(packed):
    torch.manual_seed(0)
    encoder = BiGRUEncoder(3, 4, packed=packed).double()
    with pytest.raises(ValueError, match=r"lengths must have shape \(2,\) \(one length per row of inputs of shape "
                                         r"\(2, 5, 3\)\), got \(3,\)"):
        encoder(torch.zeros(2, 5, 3, dtype=torch.float64), torch.tensor([5, 2, 1]))
    low = 1 if packed else 0  # a packed GRU needs a token in every row
    with pytest.raises(ValueError, match=rf"lengths must lie in \[{low}, 5\] for inputs of shape \(2, 5, 3\), got "
                                         rf"min 2 and max 6"):
        encoder(torch.zeros(2, 5, 3, dtype=torch.float64), torch.tensor([6, 2]))
    states = encoder(torch.zeros(0, 5, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.long))
    assert states.shape == (0, 5, 8) and states.dtype == torch.float64


def test_han_lengths_out_of_range_raise_naming_the_argument():
    """Word lengths above T, or sentence lengths above S, reached pack_padded_sequence or lengths_to_mask under the
    name "lengths"; now the message names the argument and gives the range and the shape of ids."""
    model = _han("neg_inf")
    ids, word_lengths, sentence_lengths, _ = _han_batch()
    too_long = word_lengths.clone()
    too_long[1, 0] = 6
    with pytest.raises(ValueError, match=r"word_lengths must lie in \[0, 5\] for ids of shape \(3, 3, 5\), got min 0 "
                                         r"and max 6"):
        model(ids, too_long, sentence_lengths)
    with pytest.raises(ValueError, match=r"sentence_lengths must lie in \[0, 3\] for ids of shape \(3, 3, 5\), got "
                                         r"min 1 and max 4"):
        model(ids, word_lengths, torch.tensor([3, 1, 4]))
    with pytest.raises(TypeError, match="word_lengths must have an integer dtype, got torch.float64"):
        model(ids, word_lengths.double(), sentence_lengths)


def test_classifier_and_encoder_refuse_inputs_of_the_wrong_kind():
    torch.manual_seed(0)
    encoder = BiGRUEncoder(3, 4)
    with pytest.raises(TypeError, match="inputs must be a torch.Tensor, got list"):
        encoder([[[0.0] * 3]], torch.tensor([1]))
    with pytest.raises(ValueError, match=r"inputs must have shape \(batch, length, input_size\), got \(2, 5\)"):
        encoder(torch.zeros(2, 5), torch.tensor([5, 2]))
    with pytest.raises(TypeError, match="ids must be a torch.Tensor, got list"):
        _classifier()([[1, 2]], torch.tensor([2]))
    with pytest.raises(ValueError, match=r"ids must have shape \(batch, length\), got \(4,\)"):
        _classifier()(torch.ones(4, dtype=torch.long), torch.tensor([4]))
