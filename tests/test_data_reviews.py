"""attnbook.data.reviews: cleaning, deduplication, a seeded stratified split and encoding, checked on the real file
(read with pandas independently) and on small hand-made frames."""

import pandas as pd
import pytest
import torch

from attnbook.data.reviews import (build_vocab, clean_review, encode, encode_sentences, load_reviews, reviews_path,
                                   split_reviews, tokenize)
from attnbook.masking import lengths_to_mask
from attnbook.text import PAD_ID, UNK_ID, Vocab


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


# ---------------------------------------------------------------- encode_sentences (HAN input)
@pytest.fixture()
def tiny_vocab():
    return Vocab.build([["good", "film", "bad", "plot", ".", "!", "?"]])


def _ids(vocab, tokens):
    return [vocab.stoi.get(t, UNK_ID) for t in tokens]


def test_encode_sentences_splits_at_end_marks_and_keeps_them(tiny_vocab):
    v = tiny_vocab
    ids, word_lengths, sentence_lengths = encode_sentences(
        ["Good film. Bad plot! Good?", "Bad film"], v, max_sentences=4, max_words=5)
    assert ids.dtype == word_lengths.dtype == sentence_lengths.dtype == torch.int64
    assert ids.shape == (2, 4, 5) and word_lengths.shape == (2, 4) and sentence_lengths.shape == (2,)
    assert sentence_lengths.tolist() == [3, 1]
    assert word_lengths.tolist() == [[3, 3, 2, 0], [2, 0, 0, 0]]
    assert ids[0, 0].tolist() == _ids(v, ["good", "film", "."]) + [PAD_ID] * 2
    assert ids[0, 1].tolist() == _ids(v, ["bad", "plot", "!"]) + [PAD_ID] * 2
    assert ids[0, 2].tolist() == _ids(v, ["good", "?"]) + [PAD_ID] * 3
    assert ids[1, 0].tolist() == _ids(v, ["bad", "film"]) + [PAD_ID] * 3  # no end mark: still one sentence
    # padded sentences are all <pad> with word length 0; the word mask of the lengths covers exactly the non-pads
    assert (ids[0, 3] == PAD_ID).all() and (ids[1, 1:] == PAD_ID).all()
    assert torch.equal(lengths_to_mask(word_lengths.reshape(-1), 5).reshape(2, 4, 5), ids != PAD_ID)


def test_encode_sentences_runs_of_end_marks_make_no_empty_sentence(tiny_vocab):
    v = tiny_vocab
    ids, word_lengths, sentence_lengths = encode_sentences(["Good film... Bad?! !", "!! good."], v, 3, 6)
    assert sentence_lengths.tolist() == [2, 1]
    assert ids[0, 0, :5].tolist() == _ids(v, ["good", "film", ".", ".", "."])
    assert ids[0, 1, :4].tolist() == _ids(v, ["bad", "?", "!", "!"])
    assert ids[1, 0, :4].tolist() == _ids(v, ["!", "!", "good", "."])  # leading marks join the first sentence
    assert word_lengths.tolist() == [[5, 4, 0], [4, 0, 0]]
    assert (word_lengths[torch.arange(3) < sentence_lengths.unsqueeze(1)] >= 1).all()


def test_encode_sentences_truncates_sentences_and_words(tiny_vocab):
    v = tiny_vocab
    text = "good film bad plot good. bad. film. plot."
    ids, word_lengths, sentence_lengths = encode_sentences([text], v, max_sentences=2, max_words=3)
    assert ids.shape == (1, 2, 3) and sentence_lengths.tolist() == [2]
    assert word_lengths.tolist() == [[3, 2]]
    assert ids[0].tolist() == [_ids(v, ["good", "film", "bad"]), _ids(v, ["bad", "."]) + [PAD_ID]]


def test_encode_sentences_unknown_and_empty_texts(tiny_vocab):
    ids, word_lengths, sentence_lengths = encode_sentences(["", "   ", "Superb acting."], tiny_vocab, 2, 3)
    assert sentence_lengths.tolist() == [1, 1, 1]
    assert word_lengths.tolist() == [[1, 0], [1, 0], [3, 0]]
    assert ids[0].tolist() == ids[1].tolist() == [[UNK_ID, PAD_ID, PAD_ID], [PAD_ID] * 3]
    assert ids[2, 0].tolist() == [UNK_ID, UNK_ID, tiny_vocab.stoi["."]]
    ids, word_lengths, sentence_lengths = encode_sentences([], tiny_vocab, 2, 3)
    assert ids.shape == (0, 2, 3) and word_lengths.shape == (0, 2) and sentence_lengths.shape == (0,)
    assert ids.dtype == word_lengths.dtype == sentence_lengths.dtype == torch.int64


def test_encode_sentences_agrees_with_encode_on_one_sentence(tiny_vocab):
    texts = ["good film bad plot", "bad", "plot good film"]
    ids, _, sentence_lengths = encode_sentences(texts, tiny_vocab, 1, 6)
    flat, lengths = encode(texts, tiny_vocab, 6)
    assert torch.equal(ids[:, 0], flat) and sentence_lengths.tolist() == [1, 1, 1]


def test_encode_sentences_max_sentences_error(tiny_vocab):
    with pytest.raises(ValueError, match="max_sentences must be >= 1, got 0"):
        encode_sentences(["good."], tiny_vocab, 0, 3)


def test_encode_sentences_max_words_error(tiny_vocab):
    with pytest.raises(ValueError, match="max_words must be >= 1, got -2"):
        encode_sentences(["good."], tiny_vocab, 2, -2)
