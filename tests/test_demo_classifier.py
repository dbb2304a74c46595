"""attnbook.demo_classifier: shapes, the padding mask, determinism, and learning on a synthetic task whose answer is
known (one signal word per sequence decides the label). The real-review demo runs in chapter 1."""

import pytest
import torch

from attnbook.demo_classifier import (AttentionBagClassifier, accuracy, one_thread, train_classifier,
                                      word_weights)
from attnbook.text import Vocab

pytestmark = pytest.mark.usefixtures("one_thread")

GOOD, BAD = 4, 5  # the signal words' ids; 6..29 are filler


def _synthetic(n=400, width=12, seed=0):
    """Sequences of filler ids with one signal word (GOOD -> 1, BAD -> 0) at a random position, right-padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (n,), generator=g)
    ids = torch.randint(6, 30, (n, width), generator=g)
    labels = torch.randint(0, 2, (n,), generator=g)
    where = (torch.rand(n, generator=g) * lengths).long()
    ids[torch.arange(n), where] = torch.where(labels == 1, GOOD, BAD)
    ids[torch.arange(width) >= lengths[:, None]] = 0
    return ids, lengths, labels, where


def test_shapes_and_weights():
    torch.manual_seed(0)
    model = AttentionBagClassifier(30, dim=8)
    ids, lengths, _, _ = _synthetic(n=5)
    logits, weights = model(ids, lengths)
    assert logits.shape == (5,) and logits.dtype == torch.float32
    assert weights.shape == (5, int(lengths.max()))
    assert torch.allclose(weights.sum(-1), torch.ones(5))
    assert torch.all(weights[torch.arange(weights.shape[1]) >= lengths[:, None]] == 0)


def test_extra_padding_changes_nothing():
    torch.manual_seed(0)
    model = AttentionBagClassifier(30, dim=8)
    ids, lengths, _, _ = _synthetic(n=6)
    wide = torch.cat([ids, torch.zeros(6, 20, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a, wa = model(ids, lengths)
        b, wb = model(wide, lengths)
    assert torch.equal(a, b) and torch.equal(wa, wb)


@pytest.mark.parametrize("lengths", [torch.tensor([0, 3]), torch.tensor([3, 13])])
def test_bad_lengths_raise(lengths):
    model = AttentionBagClassifier(30, dim=8)
    with pytest.raises(ValueError, match="lengths must lie in"):
        model(torch.zeros(2, 12, dtype=torch.long), lengths)


def test_bad_shapes_raise():
    model = AttentionBagClassifier(30, dim=8)
    with pytest.raises(ValueError, match="must be"):
        model(torch.zeros(12, dtype=torch.long), torch.tensor([3]))
    with pytest.raises(ValueError, match="one row each"):
        train_classifier(model, torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 1]), torch.tensor([0]),
                         epochs=1, batch_size=2, lr=0.01, seed=0)
    with pytest.raises(ValueError, match=">= 1"):
        train_classifier(model, torch.zeros(1, 3, dtype=torch.long), torch.tensor([1]), torch.tensor([0]),
                         epochs=0, batch_size=2, lr=0.01, seed=0)


def _trained(seed=0):
    torch.manual_seed(seed)
    model = AttentionBagClassifier(30, dim=16)
    ids, lengths, labels, where = _synthetic()
    losses = train_classifier(model, ids, lengths, labels, epochs=15, batch_size=32, lr=0.02, seed=seed)
    return model, losses, (ids, lengths, labels, where)


def test_learns_the_signal_word_and_attends_to_it():
    model, losses, (ids, lengths, labels, where) = _trained()
    assert losses[-1] < losses[0]
    test_ids, test_lengths, test_labels, test_where = _synthetic(n=200, seed=1)
    assert accuracy(model, test_ids, test_lengths, test_labels) > 0.95
    with torch.no_grad():
        weights = model(test_ids, test_lengths)[1]
    # the largest weight of (almost) every sequence is on its signal word
    assert (weights.argmax(-1) == test_where).float().mean() > 0.9


def test_training_is_deterministic():
    a, losses_a, _ = _trained()
    b, losses_b, _ = _trained()
    assert losses_a == losses_b
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


def test_one_thread_restores_the_count():
    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_word_weights_lists_every_token():
    torch.manual_seed(0)
    vocab = Vocab(["great", "film", "."])
    model = AttentionBagClassifier(len(vocab), dim=8)
    table, p_pos = word_weights(model, vocab, "Great film, truly.")
    assert table["token"].tolist() == ["great", "film", ",", "truly", "."]
    assert table["weight"].sum() == pytest.approx(1.0)
    assert 0.0 < p_pos < 1.0
    empty, _ = word_weights(model, vocab, "")
    assert empty["token"].tolist() == ["<unk>"] and empty["weight"].tolist() == [1.0]
