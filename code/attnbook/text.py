"""Tokenizer, vocabulary and padding for the translation chapter.

Explained in chapter 4, "Sequence to sequence with attention" (``chapters/04_seq2seq_attention``), section
"Tokens, vocabulary and padding".

The tokenizer is deliberately simple and fully documented, so that a reader can predict every token:

- text is Unicode-normalized (NFC) and lower-cased, and typographic apostrophes (``’`` U+2019, ``‘`` U+2018,
  ``‛`` U+201B, ``ʼ`` U+02BC, ``＇`` U+FF07) become the ASCII ``'``, so ``don’t`` and ``don't`` give the same
  token;
- a token is a run of word characters (``\\w``, so accented letters count), optionally joined by apostrophes
  (``don't``, ``tom's`` stay one token), or a single other non-space character (punctuation such as ``.``,
  ``,``, ``?``, Spanish ``¿`` and ``¡``).

The vocabulary reserves four special tokens at fixed ids: ``<pad>`` = 0 (padding; masked everywhere, and ignored
by the loss), ``<bos>`` = 1 (beginning of a target sentence, the decoder's first input), ``<eos>`` = 2 (end of
sentence) and ``<unk>`` = 3 (any token not in the vocabulary). Padded batches come with their lengths, from which
:func:`attnbook.masking.lengths_to_mask` makes the bool mask (True = the position takes part).
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from .masking import check_int

__all__ = [
    "PAD", "BOS", "EOS", "UNK", "SPECIALS", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID",
    "APOSTROPHES", "tokenize", "detokenize", "Vocab", "pad_batch",
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
#: The special tokens, in the order of their ids.
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
#: Apostrophe look-alikes mapped to ``'`` before tokenizing: right and left single quotation marks (U+2019, the
#: apostrophe of typeset text, and U+2018), the single high-reversed-9 quotation mark (U+201B), the modifier letter
#: apostrophe (U+02BC) and the fullwidth apostrophe (U+FF07).
APOSTROPHES = "\u2019\u2018\u201b\u02bc\uff07"
_APOSTROPHE_TABLE = str.maketrans({c: "'" for c in APOSTROPHES})
# Detokenization: no space before closing punctuation, none after opening punctuation.
_NO_SPACE_BEFORE = re.compile(r" ([.,!?;:%)\]}»])")
_NO_SPACE_AFTER = re.compile(r"([¿¡(\[{«]) ")


def tokenize(text: str, *, normalize_apostrophes: bool = True) -> list[str]:
    """Split ``text`` into lower-cased tokens: words (with inner apostrophes) and single punctuation marks.

    Args:
        text: one sentence, any Unicode string.
        normalize_apostrophes: read typographic apostrophes as ``'`` (the default). ``False`` keeps them as
            punctuation tokens, as attnbook did before version 0.2; stored experiments that were made so (chapter
            5's ``results/masking_full.csv``) keep it, so that every one of their runs sees the same tokens.

    Returns:
        The tokens, e.g. ``tokenize("¿Dónde está Tom's car?")`` is
        ``["¿", "dónde", "está", "tom's", "car", "?"]``. An empty or all-space string gives ``[]``. Typographic
        apostrophes (:data:`APOSTROPHES`) are read as ``'``: ``tokenize("Tom’s")`` is ``["tom's"]``.

    Raises:
        TypeError: ``text`` is not a ``str`` (e.g. NaN from a malformed data row).

    Chapter 4, section "Tokens, vocabulary and padding".
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = unicodedata.normalize("NFC", text)
    if normalize_apostrophes:
        text = text.translate(_APOSTROPHE_TABLE)
    return _TOKEN.findall(text.lower())


def detokenize(tokens: Sequence[str]) -> str:
    """Join tokens into a sentence: spaces between tokens, except before closing punctuation (``. , ! ? ; :``)
    and after opening punctuation (``¿ ¡ (``), so that ``detokenize(tokenize(s))`` equals ``s.lower()`` for
    ordinary sentences. This is the form that is scored with sacreBLEU (which tokenizes again, its own way)."""
    text = " ".join(tokens)
    return _NO_SPACE_AFTER.sub(r"\1", _NO_SPACE_BEFORE.sub(r"\1", text))


class Vocab:
    """A token <-> id mapping with the special tokens ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3.

    Build one with :meth:`build` from tokenized sentences; tokens are ordered by decreasing frequency (ties
    alphabetically), so the ids are deterministic.

    Attributes:
        itos: list of tokens, ``itos[i]`` is the token with id ``i``.
        stoi: dict token -> id.

    Chapter 4, section "Tokens, vocabulary and padding".
    """

    pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID

    def __init__(self, tokens: Iterable[str]) -> None:
        """``tokens``: the non-special tokens, in id order (ids start at 4). Raises ``ValueError`` if a token is
        repeated or is one of the special tokens."""
        self.itos = list(SPECIALS)
        for token in tokens:
            if token in SPECIALS:
                raise ValueError(f"{token!r} is a special token and is added automatically")
            self.itos.append(token)
        self.stoi = {token: i for i, token in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            repeated = [t for t, c in Counter(self.itos).items() if c > 1]
            raise ValueError(f"tokens must be unique, got repeated {repeated[:5]}")

    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], min_freq: int = 1, max_size: int | None = None) -> "Vocab":
        """Vocabulary of the tokens that occur at least ``min_freq`` times in ``sentences``.

        Args:
            sentences: tokenized sentences (lists of tokens), e.g. the training split only.
            min_freq: minimum count (>= 1) for a token to get its own id; rarer tokens map to ``<unk>``.
            max_size: keep at most this many tokens *including* the four specials (the most frequent ones);
                ``None`` = no limit. Must be > 4.

        Raises:
            ValueError: ``min_freq < 1`` or ``max_size <= 4``.
        """
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        if max_size is not None and max_size <= len(SPECIALS):
            raise ValueError(f"max_size must be > {len(SPECIALS)} (the special tokens), got {max_size}")
        counts = Counter(token for sentence in sentences for token in sentence)
        for special in SPECIALS:
            counts.pop(special, None)
        kept = sorted((t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t))
        if max_size is not None:
            kept = kept[: max_size - len(SPECIALS)]
        return cls(kept)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def encode(self, tokens: Sequence[str], bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``tokens`` (unknown tokens -> ``<unk>`` = 3), with ``<bos>``/``<eos>`` added if asked."""
        ids = [self.stoi.get(token, UNK_ID) for token in tokens]
        return ([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else [])

    def decode(self, ids: Iterable[int], strip: bool = True) -> list[str]:
        """Tokens of ``ids``. With ``strip`` (default), stop at the first ``<eos>`` and drop ``<bos>`` and
        ``<pad>``; ``<unk>`` is kept. Raises ``IndexError`` for an id outside ``[0, len(self))``."""
        tokens = []
        for i in (int(i) for i in ids):
            if not 0 <= i < len(self.itos):
                raise IndexError(f"token id {i} is outside the vocabulary of size {len(self.itos)}")
            if strip and i == EOS_ID:
                break
            if strip and i in (BOS_ID, PAD_ID):
                continue
            tokens.append(self.itos[i])
        return tokens

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)}, first={self.itos[4:9]})"


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = PAD_ID, length: int | None = None
              ) -> tuple[Tensor, Tensor]:
    """Right-pad id sequences into one tensor.

    Args:
        sequences: ``batch`` lists of token ids, each of length >= 1.
        pad_id: the padding id (``<pad>`` = 0).
        length: the padded length; ``None`` = the longest sequence.

    Returns:
        ``(ids, lengths)``: ``ids`` is int64 ``(batch, length)`` with ``pad_id`` after each sequence,
        ``lengths`` int64 ``(batch,)``. ``attnbook.masking.lengths_to_mask(lengths, length)`` is the matching
        bool mask (True = a real token).

    Raises:
        TypeError: a sequence holds non-integer ids (e.g. ``1.5`` or ``True``; nothing is rounded), or ``pad_id`` or
            ``length`` is not an int.
        ValueError: ``sequences`` is empty, a sequence is empty, one is longer than ``length``, or ``length`` is
            negative.

    Chapter 4, section "Tokens, vocabulary and padding".
    """
    if len(sequences) == 0:
        raise ValueError("sequences must not be empty")
    pad_id = check_int(pad_id, "pad_id")
    rows = [seq.tolist() if isinstance(seq, (Tensor, np.ndarray)) else seq for seq in sequences]
    lengths = [len(r) for r in rows]
    if min(lengths) == 0:
        raise ValueError(f"every sequence needs at least one token, got lengths {lengths}")
    longest = max(lengths)
    if length is None:
        length = longest
    else:
        length = check_int(length, "length", minimum=0)
        if longest > length:
            raise ValueError(f"a sequence of length {longest} does not fit into length={length}")
    flat = list(itertools.chain.from_iterable(rows))
    kinds = set(map(type, flat))
    if not all(issubclass(k, (int, np.integer)) and not issubclass(k, (bool, np.bool_)) for k in kinds):
        for row, seq in enumerate(rows):  # only on the error path: find the first offending id
            for token in seq:
                if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
                    raise TypeError(f"sequences[{row}] must hold int token ids, got {type(token).__name__} "
                                    f"{token!r} (nothing is rounded, and bools are not ids)")
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    # One vectorized fill instead of one tensor per sequence: the real positions of row b are the first lengths[b].
    ids[torch.arange(length) < torch.tensor(lengths).unsqueeze(1)] = torch.from_numpy(np.asarray(flat, dtype=np.int64))
    return ids, torch.tensor(lengths, dtype=torch.long)
