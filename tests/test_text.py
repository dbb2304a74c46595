"""attnbook.text: tokenizer, vocabulary, padding (chapter 4, "Tokens, vocabulary and padding")."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.masking import lengths_to_mask
from attnbook.text import (BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID, Vocab, detokenize, pad_batch, tokenize)


@pytest.mark.parametrize("text, tokens", [
    ("Go.", ["go", "."]),
    ("¿Dónde está Tom's car?", ["¿", "dónde", "está", "tom's", "car", "?"]),
    ("I don't know, really!", ["i", "don't", "know", ",", "really", "!"]),
    ("¡Hola, señor Pérez!", ["¡", "hola", ",", "señor", "pérez", "!"]),
    ("  ", []),
    ("It costs 30 dollars.", ["it", "costs", "30", "dollars", "."]),
])
def test_tokenize_examples(text, tokens):
    assert tokenize(text) == tokens


def test_tokenize_normalizes_unicode():
    decomposed = "Cafe\u0301"          # e + combining acute accent
    assert tokenize(decomposed) == tokenize("Café") == ["café"]


def test_tokenize_rejects_non_strings():
    with pytest.raises(TypeError, match="text must be a str, got float"):
        tokenize(float("nan"))


@pytest.mark.parametrize("text", ["¿Dónde está Tom?", "Hola, ¿qué tal?", "No sé (todavía).", "¡Ve!", "I'm 30."])
def test_detokenize_inverts_tokenize_on_ordinary_sentences(text):
    assert detokenize(tokenize(text)) == text.lower()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["hola", "tom's", ".", ",", "¿", "?", "¡", "!", "(", ")", "sí", "3"]), max_size=12))
def test_tokenize_of_detokenize_is_identity(tokens):
    assert tokenize(detokenize(tokens)) == tokens


def test_vocab_build_orders_by_frequency_then_alphabet():
    vocab = Vocab.build([["b", "a", "c"], ["a", "c"], ["a", "d"]])
    assert vocab.itos[:4] == list(SPECIALS)
    assert vocab.itos[4:] == ["a", "c", "b", "d"]
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2, 3) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID)


def test_vocab_min_freq_and_max_size():
    sentences = [["a"] * 5 + ["b"] * 3 + ["c"]]
    assert Vocab.build(sentences, min_freq=2).itos[4:] == ["a", "b"]
    assert Vocab.build(sentences, max_size=5).itos[4:] == ["a"]


def test_vocab_encode_decode():
    vocab = Vocab.build([["hola", "mundo"]])
    ids = vocab.encode(["hola", "gato", "mundo"], bos=True, eos=True)
    assert ids == [BOS_ID, vocab.stoi["hola"], UNK_ID, vocab.stoi["mundo"], EOS_ID]
    assert vocab.decode(ids + [PAD_ID, PAD_ID]) == ["hola", "<unk>", "mundo"]
    assert vocab.decode([vocab.stoi["hola"], EOS_ID, vocab.stoi["mundo"]]) == ["hola"]
    assert vocab.decode(ids, strip=False)[0] == "<bos>"
    assert "hola" in vocab and "gato" not in vocab and len(vocab) == 6


def test_vocab_errors():
    with pytest.raises(ValueError, match="min_freq must be >= 1, got 0"):
        Vocab.build([["a"]], min_freq=0)
    with pytest.raises(ValueError, match=r"max_size must be > 4 \(the special tokens\), got 4"):
        Vocab.build([["a"]], max_size=4)
    with pytest.raises(ValueError, match="'<pad>' is a special token"):
        Vocab(["<pad>"])
    with pytest.raises(ValueError, match=r"tokens must be unique, got repeated \['a'\]"):
        Vocab(["a", "a"])
    with pytest.raises(IndexError, match="token id 99 is outside the vocabulary of size 5"):
        Vocab(["a"]).decode([99])


def test_pad_batch_matches_lengths_to_mask():
    ids, lengths = pad_batch([[5, 6, 7], [8], [9, 10]])
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert ids.dtype == torch.long and lengths.tolist() == [3, 1, 2]
    assert torch.equal(lengths_to_mask(lengths, ids.shape[1]), ids != PAD_ID)
    longer, _ = pad_batch([[5, 6, 7], [8]], length=5)
    assert longer.shape == (2, 5)


def test_pad_batch_errors():
    with pytest.raises(ValueError, match="sequences must not be empty"):
        pad_batch([])
    with pytest.raises(ValueError, match=r"every sequence needs at least one token, got lengths \[2, 0\]"):
        pad_batch([[1, 2], []])
    with pytest.raises(ValueError, match="a sequence of length 3 does not fit into length=2"):
        pad_batch([[1, 2, 3]], length=2)


# ---------------------------------------------------------------- typographic apostrophes (issue 18)
# Right and left single quotation marks, single high-reversed-9 quotation mark, modifier letter apostrophe,
# fullwidth apostrophe.
APOSTROPHES = ["\u2019", "\u2018", "\u201b", "\u02bc", "\uff07"]


@pytest.mark.parametrize("apostrophe", APOSTROPHES)
def test_typographic_apostrophes_tokenize_like_the_straight_one(apostrophe):
    """"don’t" (U+2019) gave ["don", "’", "t"] while "don't" gives ["don't"]."""
    text = "I don't know Tom's 'car'."
    assert tokenize(text.replace("'", apostrophe)) == tokenize(text) == ["i", "don't", "know", "tom's", "'", "car",
                                                                         "'", "."]


@settings(max_examples=50, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("abcé' .,?") + APOSTROPHES), max_size=30))
def test_tokenize_reads_every_apostrophe_as_the_straight_one(text):
    """Property: replacing the typographic apostrophes by "'" never changes the tokens."""
    straight = "".join("'" if c in APOSTROPHES else c for c in text)
    assert tokenize(text) == tokenize(straight)


# ---------------------------------------------------------------- no silent coercion in pad_batch (issue 18)
def test_pad_batch_refuses_non_integer_ids_and_length():
    with pytest.raises(TypeError, match=r"sequences\[1\] must hold int token ids, got float 1.5 \(nothing is rounded"):
        pad_batch([[4, 5], [1.5]])
    with pytest.raises(TypeError, match=r"sequences\[2\] must hold int token ids, got float 6.0"):
        pad_batch([[4, 5], [6], torch.tensor([6.0, 7.0])])
    with pytest.raises(TypeError, match=r"sequences\[0\] must hold int token ids, got bool True"):
        pad_batch([[True, 5]])
    with pytest.raises(TypeError, match=r"sequences\[1\] must hold int token ids, got bool False"):
        pad_batch([[4], np.array([False, True])])
    with pytest.raises(TypeError, match=r"sequences\[0\] must hold int token ids, got str 'a'"):
        pad_batch(["ab"])
    with pytest.raises(TypeError, match="length must be an int, got float 3.5"):
        pad_batch([[4, 5]], length=3.5)
    with pytest.raises(ValueError, match="length must be >= 0, got -1"):
        pad_batch([[4, 5]], length=-1)
    with pytest.raises(TypeError, match="pad_id must be an int, got float 0.5"):
        pad_batch([[4, 5]], pad_id=0.5)
    ids, lengths = pad_batch([(4, 5), torch.tensor([6]), np.array([7, 8], dtype=np.int32), [np.int64(9)]], length=3)
    assert ids.tolist() == [[4, 5, 0], [6, 0, 0], [7, 8, 0], [9, 0, 0]] and lengths.tolist() == [2, 1, 2, 1]


def test_tokenize_can_keep_typographic_apostrophes_as_punctuation():
    """The legacy tokenization that stored experiments pin (chapter 5's MaskingConfig.normalize_apostrophes)."""
    assert tokenize("don’t", normalize_apostrophes=False) == ["don", "’", "t"]
    assert tokenize("don’t") == tokenize("don't") == ["don't"]
