"""attnbook.data.reviews: cleaning, deduplication, a seeded stratified split and encoding, checked on the real file
(read with pandas independently) and on small hand-made frames."""

import pandas as pd
import pytest
import torch

from attnbook.data.reviews import (build_vocab, clean_review, encode, load_reviews, reviews_path, split_reviews,
                                   tokenize)
from attnbook.text import PAD_ID, UNK_ID


@pytest.fixture(scope="module")
def imdb():
    return load_reviews("imdb")


def test_clean_review():
    assert clean_review("Great.<br /><br />Really <BR>good\t film ") == "Great. Really good film"
    with pytest.raises(TypeError, match="text must be a str, got float"):
        clean_review(float("nan"))


def test_load_reviews_cleans_and_deduplicates(imdb):
    raw = pd.read_csv(reviews_path())
    raw = raw[raw.source == "imdb"]
    assert len(raw) == 25_000
    cleaned = raw.text.str.replace(r"<br\s*/?>", " ", regex=True, case=False).str.split().str.join(" ")
    assert len(imdb) == cleaned.nunique() < 25_000
    assert not imdb.text.duplicated().any() and not imdb.text.str.contains("<br", case=False).any()
    assert list(imdb.columns) == ["text", "label"] and set(imdb.label.unique()) == {0, 1}
    both = load_reviews(None, deduplicate=False)
    assert len(both) == 33_530 and set(both.source) == {"imdb", "rotten_tomatoes"}
    with pytest.raises(ValueError, match="source must be one of .* got 'yelp'"):
        load_reviews("yelp")


def test_split_is_disjoint_covering_stratified_and_seeded(imdb):
    splits = split_reviews(imdb, seed=0)
    assert sum(len(s) for s in splits.values()) == len(imdb)
    texts = [set(s.text) for s in splits.values()]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    for part in splits.values():
        assert abs(part.label.mean() - imdb.label.mean()) < 0.01
    assert abs(len(splits["train"]) / len(imdb) - 0.8) < 0.001
    same = split_reviews(imdb, seed=0)["test"]
    other = split_reviews(imdb, seed=1)["test"]
    assert same.equals(splits["test"]) and not other.equals(splits["test"])


def test_split_errors():
    df = pd.DataFrame({"text": list("abcd"), "label": [0, 1, 0, 1]})
    with pytest.raises(ValueError, match="fractions must be positive and sum to 1"):
        split_reviews(df, (0.5, 0.6, -0.1))
    with pytest.raises(ValueError, match=r"2 fractions for 3 names"):
        split_reviews(df, (0.5, 0.5))


def test_vocab_and_encode():
    texts = ["A good, good film.", "A bad film!", "film"]
    vocab = build_vocab(texts, min_freq=2, max_size=None)
    assert set(vocab.itos[4:]) == {"a", "good", "film"}
    ids, lengths = encode(["a good unseen film", "", "good " * 10], vocab, max_len=4)
    assert ids.shape == (3, 4) and lengths.tolist() == [4, 1, 4]
    assert ids[0].tolist() == [vocab.stoi["a"], vocab.stoi["good"], UNK_ID, vocab.stoi["film"]]
    assert ids[1].tolist() == [UNK_ID, PAD_ID, PAD_ID, PAD_ID]
    assert tokenize("Don't stop!") == ["don't", "stop", "!"]
    with pytest.raises(ValueError, match="max_len must be >= 1, got 0"):
        encode(["x"], vocab, 0)
