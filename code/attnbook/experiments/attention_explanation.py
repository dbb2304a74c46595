"""Is attention an explanation? A small attention classifier on IMDB reviews, and the tests of Jain and Wallace
(2019) and Wiegreffe and Pinter (2019). Chapter 7, "Soft and hard attention", section "Is attention an explanation?".

Use from Python (the chapter does)::

    cfg = ExplanationConfig.for_mode(get_mode())
    data = prepare_reviews(cfg)
    model, history = train_classifier(cfg, data)                 # learned attention
    uniform, _ = train_classifier(cfg, data, uniform=True)        # attention frozen to uniform
    per_example = explanation_tests(cfg, model, data)             # one row per analysed test review
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..data.reviews import build_vocab, encode, load_reviews, split_reviews
from ..interpret import (AttentionClassifier, gradient_importance, kendall_tau, leave_one_out_importance,
                         permutation_effect)
from ..runtime import ModeConfig, get_device, progress

__all__ = ["ExplanationConfig", "prepare_reviews", "train_classifier", "accuracy", "explanation_tests"]


@dataclass(frozen=True)
class ExplanationConfig(ModeConfig):
    """Data sizes, model and training of the explanation experiment (quick: a 2-core CPU; full: a GPU)."""

    n_train: int = 5000
    n_test: int = 1000
    n_analyse: int = 100
    max_len: int = 128
    vocab_size: int = 10_000
    min_freq: int = 2
    encoder: str = "cnn"
    embed_size: int = 64
    hidden_size: int = 32
    attention_size: int = 32
    epochs: int = 3
    batch_size: int = 64
    lr: float = 3e-3
    n_permutations: int = 50
    seed: int = 0
    device: str = "cpu"

    @classmethod
    def quick(cls) -> "ExplanationConfig":
        """5,000 training reviews cut to 128 tokens, a convolutional encoder, 3 epochs, 100 analysed reviews."""
        return cls()

    @classmethod
    def full(cls) -> "ExplanationConfig":
        """All training reviews cut to 400 tokens, a bidirectional GRU, 5 epochs, 500 analysed reviews."""
        return cls(n_train=0, n_test=0, n_analyse=500, max_len=400, vocab_size=20_000, encoder="bigru",
                   hidden_size=64, attention_size=64, epochs=5, n_permutations=100, device=str(get_device()))



def prepare_reviews(cfg: ExplanationConfig) -> dict:
    """Load, clean, deduplicate and split the IMDB reviews; build the vocabulary on the training part; encode.

    ``n_train`` / ``n_test`` = 0 keep the whole split. Returns a dict with ``vocab``, ``train`` and ``test``
    (each a dict of ``ids``, ``lengths``, ``labels`` (float32) and ``text``), and ``n_reviews`` (after
    deduplication).
    """
    reviews = load_reviews("imdb")
    splits = split_reviews(reviews, seed=cfg.seed)
    train = splits["train"].iloc[: cfg.n_train or None]
    test = splits["test"].iloc[: cfg.n_test or None]
    vocab = build_vocab(train.text, min_freq=cfg.min_freq, max_size=cfg.vocab_size)

    def tensors(df):
        ids, lengths = encode(df.text, vocab, cfg.max_len)
        return {"ids": ids, "lengths": lengths, "labels": torch.tensor(df.label.to_numpy(), dtype=torch.float32),
                "text": df.text.tolist()}

    return {"vocab": vocab, "train": tensors(train), "test": tensors(test), "n_reviews": len(reviews),
            "split_sizes": {k: len(v) for k, v in splits.items()}}


@torch.no_grad()
def accuracy(model: AttentionClassifier, part: dict, device: str = "cpu", batch_size: int = 500) -> float:
    """Share of reviews whose predicted label (``logit > 0``) is right."""
    correct = 0
    for s in range(0, len(part["labels"]), batch_size):
        logits, _ = model(part["ids"][s:s + batch_size].to(device), part["lengths"][s:s + batch_size].to(device))
        correct += ((logits > 0).float().cpu() == part["labels"][s:s + batch_size]).sum().item()
    return correct / len(part["labels"])


def train_classifier(cfg: ExplanationConfig, data: dict, uniform: bool = False, show_progress: bool = True
                     ) -> tuple[AttentionClassifier, pd.DataFrame]:
    """Train an :class:`AttentionClassifier` (or its uniform-attention twin) with Adam on binary cross-entropy.

    Returns the model in eval mode and a DataFrame with one row per epoch: ``epoch``, ``train_loss``,
    ``test_acc``, ``wall_s`` (cumulative training time).
    """
    torch.manual_seed(cfg.seed)
    model = AttentionClassifier(len(data["vocab"]), cfg.embed_size, cfg.hidden_size, cfg.attention_size,
                                uniform=uniform, encoder=cfg.encoder).to(cfg.device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    train = data["train"]
    rows, wall = [], 0.0
    epochs = range(1, cfg.epochs + 1)
    for epoch in progress(epochs, desc="uniform attention" if uniform else "learned attention") \
            if show_progress else epochs:
        start, losses = time.perf_counter(), []
        model.train()
        perm = torch.randperm(len(train["labels"]), generator=gen)
        for s in range(0, len(perm), cfg.batch_size):
            idx = perm[s:s + cfg.batch_size]
            logits, _ = model(train["ids"][idx].to(cfg.device), train["lengths"][idx].to(cfg.device))
            loss = F.binary_cross_entropy_with_logits(logits, train["labels"][idx].to(cfg.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        wall += time.perf_counter() - start
        model.eval()
        rows.append({"epoch": epoch, "train_loss": float(np.mean(losses)),
                     "test_acc": accuracy(model, data["test"], cfg.device), "wall_s": wall})
    return model, pd.DataFrame(rows)


def explanation_tests(cfg: ExplanationConfig, model: AttentionClassifier, data: dict) -> dict:
    """Attention weights against gradient and leave-one-out importance, and the permutation test, on the first
    ``cfg.n_analyse`` test reviews.

    Returns a dict with ``per_example`` (DataFrame: ``length``, ``prob`` (positive class), ``max_weight``,
    ``tau_grad``, ``tau_loo``, ``tau_grad_loo`` (the two importance measures against each other),
    ``perm_median_change``) and the raw tensors ``ids``, ``lengths``, ``weights``, ``grad``, ``loo``.
    """
    model.eval()
    ids = data["test"]["ids"][: cfg.n_analyse].to(cfg.device)
    lengths = data["test"]["lengths"][: cfg.n_analyse].to(cfg.device)
    with torch.no_grad():
        logits, weights = model(ids, lengths)
    grad = gradient_importance(model, ids, lengths).detach()
    loo = leave_one_out_importance(model, ids, lengths)
    perm = permutation_effect(model, ids, lengths, cfg.n_permutations, torch.Generator().manual_seed(cfg.seed))
    per_example = pd.DataFrame({
        "length": lengths.cpu().numpy(),
        "prob": torch.sigmoid(logits).cpu().numpy(),
        "max_weight": weights.max(-1).values.cpu().numpy(),
        "tau_grad": kendall_tau(weights, grad, lengths),
        "tau_loo": kendall_tau(weights, loo, lengths),
        "tau_grad_loo": kendall_tau(grad, loo, lengths),
        "perm_median_change": perm.numpy(),
    })
    return {"per_example": per_example, "ids": ids.cpu(), "lengths": lengths.cpu(), "weights": weights.cpu(),
            "grad": grad.cpu(), "loo": loo.cpu()}
