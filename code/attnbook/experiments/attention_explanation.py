"""Is attention an explanation? A small attention classifier on IMDB reviews, and the tests of Jain and Wallace
(2019) and Wiegreffe and Pinter (2019). Chapter 7, "Soft and hard attention", section "Is attention an explanation?".

Use from Python (the chapter does)::

    cfg = ExplanationConfig.for_mode(get_mode())
    data = prepare_reviews(cfg)
    model, history = train_classifier(cfg, data)                 # learned attention
    uniform, _ = train_classifier(cfg, data, uniform=True)        # attention frozen to uniform
    per_example = explanation_tests(cfg, model, data)             # one row per analysed test review

or from the command line, for several seeds with provenance beside the CSV::

    python -m attnbook.experiments.attention_explanation --mode full --seeds 3 \
        --out results/attention_explanation_full.csv

which trains, for each seed, the learned-attention classifier (and runs the tests on it) and its uniform twin, and
writes ``attention_explanation_full.csv`` (one row per attention and seed), ``..._history.csv`` (per epoch),
``..._per_example.csv`` (the tests per analysed review) and ``attention_explanation_full.json`` (provenance, one
session per invocation). A seed fixes the split, the initialization and the permutations (``cfg.seed``; seed 0 is
the chapter's run). It is a results store (:mod:`attnbook.store`): each run is stored as soon as it finishes, so a
killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..data.reviews import build_vocab, encode, load_reviews, split_reviews
from ..interpret import (AttentionClassifier, gradient_importance, kendall_tau, leave_one_out_importance,
                         permutation_effect)
from ..runtime import ModeConfig, get_device, get_mode, progress
from ..store import Layout, ResultsStore, Session, StoreError, csv_path, device_arg, positive_int

__all__ = ["ExplanationConfig", "prepare_reviews", "train_classifier", "accuracy", "explanation_tests", "run_one",
           "main", "LAYOUT", "ATTENTIONS"]


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


#: The two classifiers of a run: learned attention (tested as an explanation) and attention frozen to uniform.
ATTENTIONS = ("learned", "uniform")

#: The results store of the command line (:mod:`attnbook.store`): a run is one classifier (``attention``) with one
#: seed; its history and (learned attention only) its per-review tests go into side tables. The device does not count
#: as configuration, and ``seeds`` only chooses runs (a run's seed replaces ``seed``).
LAYOUT = Layout(
    "attention_explanation", keys=("attention", "seed"),
    columns=("attention", "seed", "n_train", "n_test", "test_acc", "train_loss", "wall_s", "n_analysed",
             "mean_tau_grad", "mean_tau_loo", "mean_tau_grad_loo", "mean_perm_median_change", "mean_max_weight"),
    tables={"history": ("epoch", "train_loss", "test_acc", "wall_s", "attention", "seed"),
            "per_example": ("example", "length", "prob", "max_weight", "tau_grad", "tau_loo", "tau_grad_loo",
                            "perm_median_change", "attention", "seed")},
    not_configuration=("device", "seeds"))


def run_one(cfg: ExplanationConfig, data: dict, attention: str, show_progress: bool = True
            ) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Train one classifier (``attention``: ``"learned"`` or ``"uniform"``, :func:`train_classifier`) on ``data``
    (:func:`prepare_reviews` of ``cfg``) with seed ``cfg.seed``; for learned attention also run
    :func:`explanation_tests`.

    Returns:
        ``(row, history, per_example)``: the run's row (:data:`LAYOUT` columns: final test accuracy and training loss,
        training seconds, and the means over the analysed reviews of the tests' columns, NaN for uniform attention),
        the history (one row per epoch) and the per-review tests (``example`` = index among the analysed test
        reviews; no rows for uniform attention), all with ``attention`` and ``seed``.

    Raises:
        ValueError: unknown ``attention``.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention must be one of {ATTENTIONS}, got {attention!r}")
    model, history = train_classifier(cfg, data, uniform=attention == "uniform", show_progress=show_progress)
    last = history.iloc[-1]
    row = {"attention": attention, "seed": cfg.seed, "n_train": len(data["train"]["labels"]),
           "n_test": len(data["test"]["labels"]), "test_acc": float(last["test_acc"]),
           "train_loss": float(last["train_loss"]), "wall_s": float(last["wall_s"])}
    per_example = pd.DataFrame(columns=list(LAYOUT.tables["per_example"]))
    if attention == "learned":
        per = explanation_tests(cfg, model, data)["per_example"]
        row.update(n_analysed=len(per), mean_tau_grad=float(per.tau_grad.mean()),
                   mean_tau_loo=float(per.tau_loo.mean()), mean_tau_grad_loo=float(per.tau_grad_loo.mean()),
                   mean_perm_median_change=float(per.perm_median_change.mean()),
                   mean_max_weight=float(per.max_weight.mean()))
        per_example = per.assign(attention=attention, seed=cfg.seed)
        per_example.insert(0, "example", range(len(per)))
    return row, history.assign(attention=attention, seed=cfg.seed), per_example


def main(argv: list[str] | None = None) -> int:
    """CLI (see the module docstring): store each run as it finishes, with provenance beside ``--out``. Returns 0;
    an interrupted run (Ctrl-C, SIGTERM) records its session as interrupted and exits with 130 or 143."""
    from ..provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m attnbook.experiments.attention_explanation",
                                     description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--mode", choices=("quick", "full"), default=None, help="default: ATTNBOOK_MODE / device")
    parser.add_argument("--out", type=csv_path, default=Path("results/attention_explanation_full.csv"))
    parser.add_argument("--device", type=device_arg, default=None, help="cpu or cuda (default: the config's)")
    parser.add_argument("--seeds", type=positive_int, default=1, help="number of seeds (0..N-1), default 1")
    parser.add_argument("--epochs", type=positive_int, default=None, help="override the configuration's epochs")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    mode = args.mode or get_mode()
    cfg = ExplanationConfig.for_mode(mode)
    cfg = replace(cfg, **{k: v for k, v in (("device", args.device), ("epochs", args.epochs)) if v is not None})
    seeds = tuple(range(args.seeds))
    config = {**{k: v for k, v in asdict(cfg).items() if k != "seed"}, "seeds": seeds}
    try:
        store = ResultsStore(args.out, LAYOUT, config).open()
    except StoreError as err:
        parser.error(str(err))

    def describe(wall: float) -> dict:
        return provenance(wall, device=cfg.device, mode=mode)

    with store, Session(store, describe) as session:
        for seed in seeds:
            todo = [a for a in ATTENTIONS if not store.has({"attention": a, "seed": seed})]
            if not todo:
                continue
            run_cfg = replace(cfg, seed=seed)
            data = prepare_reviews(run_cfg)
            for attention in todo:
                row, history, per_example = run_one(run_cfg, data, attention, show_progress=not args.no_progress)
                store.append(row, {"history": history, "per_example": per_example})
                session.checkpoint()
        summary = store.frame()
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
