"""attnbook.demo_classifier: shapes, the padding mask, determinism, and learning on a synthetic task whose answer is
known (one signal word per sequence decides the label). The real-review demo runs in chapter 1."""

import pandas as pd
import pytest
import torch

from attnbook.demo_classifier import (AttentionBagClassifier, accuracy, confidence, count_sentence, fit_sentence,
                                      one_thread, quoted, top_content_words, train_classifier, word_weights,
                                      zero_up_to_rounding)
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


def test_confidence_lies_between_a_half_and_one():
    model, _, (ids, lengths, labels, _) = _trained()
    c = confidence(model, ids, lengths)
    assert 0.5 <= c <= 1.0
    assert c == pytest.approx(confidence(model, ids, lengths))


def test_top_content_words_skips_numbers_and_stop_words():
    table = pd.DataFrame({"token": ["most", "bad", "1", ",", "dull", "bad", "film"],
                          "weight": [0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.05]})
    assert top_content_words(table, k=2) == ["bad", "dull"]
    assert top_content_words(table, k=5) == ["bad", "dull", "film"]  # fewer than k, each once
    assert top_content_words(table, k=0) == []
    assert top_content_words(table.iloc[[0, 2, 3]], k=2) == []  # no content word at all
    with pytest.raises(ValueError, match="k must be"):
        top_content_words(table, k=-1)


def test_quoted():
    assert quoted(["bad"]) == "“bad”"
    assert quoted(["bad", "dull"]) == "“bad” and “dull”"
    assert quoted(["a", "b", "c"]) == "“a”, “b” and “c”"
    with pytest.raises(ValueError):
        quoted([])


@pytest.mark.parametrize("k, n, expected", [
    (0, 9, "None of the 9 recipes is correct"),
    (1, 9, "Only one of the 9 recipes is correct"),
    (3, 9, "3 of the 9 recipes are correct"),
    (9, 9, "All 9 recipes are correct"),
    (2, 2, "Both recipes are correct"),
    (0, 2, "None of the 2 recipes is correct"),
    (1, 1, "The one recipe is correct"),
    (0, 1, "The one recipe is not correct"),
    (0, 10_000, "None of the 10,000 recipes is correct"),
    (1_234, 10_000, "1,234 of the 10,000 recipes are correct"),
])
def test_count_sentence_at_edge_values(k, n, expected):
    assert count_sentence(k, n, "recipe", ("is correct", "are correct")) == expected


def test_count_sentence_plural_noun_and_errors():
    assert (count_sentence(0, 10_000, "sample", ("was an invalid action", "were invalid actions"))
            == "None of the 10,000 samples was an invalid action")
    assert count_sentence(2, 5, "child", ("is", "are"), "children") == "2 of the 5 children are"
    for k, n in [(-1, 3), (4, 3), (0, 0)]:
        with pytest.raises(ValueError, match="0 <= k <= n"):
            count_sentence(k, n, "recipe", ("is", "are"))


def test_zero_up_to_rounding():
    assert zero_up_to_rounding(0.0, 1e-12) == "exactly zero"
    assert zero_up_to_rounding(2e-16, 1e-12) == "zero up to rounding (at most 2.0e-16)"
    assert zero_up_to_rounding(1e-12, 1e-12) == "zero up to rounding (at most 1.0e-12)"
    assert zero_up_to_rounding(1e-3, 1e-12) == "not zero (up to 1.0e-03)"
    assert zero_up_to_rounding(0.0, 0.0) == "exactly zero"
    for bad in [(-1e-3, 1e-12), (float("nan"), 1e-12), (0.0, -1.0)]:
        with pytest.raises(ValueError, match="must be >= 0"):
            zero_up_to_rounding(*bad)


@pytest.mark.parametrize("train, test, conf, parts", [
    (0.98, 0.84, 0.92, ["overfits", "overconfident", "Neither matters"]),
    (0.85, 0.84, 0.84, ["about as well", "close to its accuracy"]),
    (0.98, 0.84, 0.84, ["overfits", "close to its accuracy", "That does not matter"]),
    (0.85, 0.84, 0.60, ["about as well", "underconfident", "That does not matter"]),
    (1.0, 1.0, 1.0, ["about as well", "close to its accuracy"]),
    (0.5, 0.5, 0.5, ["about as well", "close to its accuracy"]),
])
def test_fit_sentence_at_edge_values(train, test, conf, parts):
    text = fit_sentence(train, test, conf)
    for part in parts:
        assert part in text
    assert text.endswith(".")
    assert ("matter" in text) == (len(parts) == 3)  # the caveat only when something needs it
    assert all(len(sentence.split()) <= 40 for sentence in text.split(". "))


def test_fit_sentence_rejects_bad_shares():
    with pytest.raises(ValueError, match="must lie in"):
        fit_sentence(1.2, 0.8, 0.9)
    with pytest.raises(ValueError, match="margin"):
        fit_sentence(0.9, 0.8, 0.9, margin=-0.1)
