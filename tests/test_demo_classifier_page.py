"""attnbook.demo_classifier's helpers for chapter 1's page: the review chosen for the figure (first_correct), the range
of trained scores (score_range, checked against the weights the model returns) and the model's listing
(model_source, checked against the class's source)."""

import inspect
import math

import pandas as pd
import pytest
import torch

from attnbook.demo_classifier import AttentionBagClassifier, first_correct, model_source, score_range
from attnbook.text import Vocab


@pytest.fixture
def model_and_vocab():
    torch.manual_seed(0)
    vocab = Vocab(["great", "film", "bad", "plot", "."])
    return AttentionBagClassifier(len(vocab), dim=8), vocab


def test_score_range_matches_the_weights_the_model_softmaxes(model_and_vocab):
    model, vocab = model_and_vocab
    texts = ["great film .", "bad plot", "great great bad film plot ."]
    lo, hi = score_range(model, vocab, texts)
    # independent: log-weight differences are score differences (softmax is shift invariant)
    spans = []
    for text in texts:
        ids = torch.tensor([[vocab.stoi.get(t, 1) for t in text.split()]])
        with torch.no_grad():
            _, w = model(ids, torch.tensor([ids.shape[1]]))
        spans.append(float(w.log().max() - w.log().min()))
    assert hi - lo >= max(spans) - 1e-5
    assert lo <= hi and math.isfinite(lo) and math.isfinite(hi)


def test_score_range_of_one_token_is_its_score(model_and_vocab):
    model, vocab = model_and_vocab
    with torch.no_grad():
        key = model.W_K(model.embedding(torch.tensor([vocab.stoi["great"]])))[0]
        expected = float(key @ model.query / math.sqrt(8))
    lo, hi = score_range(model, vocab, ["great"])
    assert lo == pytest.approx(expected, abs=1e-6) and hi == pytest.approx(expected, abs=1e-6)


def test_score_range_refuses_no_texts(model_and_vocab):
    with pytest.raises(ValueError, match="at least one review"):
        score_range(*model_and_vocab, [])


def test_first_correct_picks_a_review_the_model_gets_right(model_and_vocab):
    model, vocab = model_and_vocab
    reviews = pd.DataFrame({"text": ["great film . great plot great", "bad plot", "great plot", "bad film ."],
                            "label": [1, 1, 0, 0]})
    for label, bias in ((1, 10.0), (0, -10.0)):   # a head that says "positive" (or "negative") to everything
        with torch.no_grad():
            model.head.bias.fill_(bias)
        text, table, p = first_correct(model, vocab, reviews, label, max_tokens=3)
        assert (p > 0.5) == bool(label)
        # the first review of that label short enough: the long positive one is skipped
        assert text == {1: "bad plot", 0: "great plot"}[label]
        assert table["weight"].sum() == pytest.approx(1.0)


def test_first_correct_errors(model_and_vocab):
    model, vocab = model_and_vocab
    reviews = pd.DataFrame({"text": ["great film ."], "label": [1]})
    with pytest.raises(ValueError, match="label must be 0 or 1"):
        first_correct(model, vocab, reviews, 2)
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        first_correct(model, vocab, reviews, 1, max_tokens=0)
    with pytest.raises(LookupError, match="no review with label 0"):
        first_correct(model, vocab, reviews, 0)
    with pytest.raises(LookupError, match="at most 1 tokens"):
        first_correct(model, vocab, reviews, 1, max_tokens=1)


def test_model_source_is_the_class_without_docstrings():
    listing = model_source()
    source = inspect.getsource(AttentionBagClassifier)
    assert listing.startswith("class AttentionBagClassifier(nn.Module):\n    def __init__")
    assert '"""' not in listing and "Args:" not in listing
    for line in listing.splitlines():
        assert line in source
    assert "masked_softmax(scores" in listing and "def forward" in listing
