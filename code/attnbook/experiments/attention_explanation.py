"""Is attention an explanation? The tests of Jain and Wallace (2019) and Wiegreffe and Pinter (2019) on chapter 5's
classifier. Chapter 7, "Soft and hard attention", section "Is attention an explanation?".

The classifier is chapter 5's :class:`attnbook.models.BiGRUClassifier` (Yang et al. 2016 at the word level): word
embeddings, a bidirectional GRU over the packed batch (pads are never read and their states are exactly 0), attention
pooling with a learned context vector and the safe ``"neg_inf"`` mask (:mod:`attnbook.pooling`), and a linear layer
to two classes. It is built and trained as :func:`attnbook.experiments.masking.run_one` trains it: the same seeding
(:func:`attnbook.runtime.seed_everything`), Adam, cross-entropy, and that module's batching (length-bucketed or random
batches, padded per batch). Its *uniform twin* (Wiegreffe and Pinter's baseline) is the same model with chapter 5's
masked mean pooling, i.e. attention frozen to ``1 / n`` on the ``n`` real tokens. The tests see the trained model
through :class:`attnbook.interpret.BinaryView`.

Use from Python (the chapter does)::

    cfg = ExplanationConfig.for_mode(get_mode())
    data = prepare_reviews(cfg)
    model, history = train_classifier(cfg, data)                 # learned attention
    uniform, _ = train_classifier(cfg, data, uniform=True)        # attention frozen to uniform
    per_example = explanation_tests(cfg, model, data)             # one row per analysed test review
    difference = accuracy_difference(predict(model, data["test"]), predict(uniform, data["test"]),
                                     data["test"]["labels"])

or from the command line, for several seeds with provenance beside the CSV::

    python -m attnbook.experiments.attention_explanation --mode full --seeds 3 \
        --out results/attention_explanation_full.csv

which trains, for each seed, the learned-attention classifier (and runs the tests on it) and its uniform twin, and
writes ``attention_explanation_full.csv`` (one row per attention and seed), ``..._history.csv`` (per epoch),
``..._per_example.csv`` (the tests per analysed review) and ``attention_explanation_full.json`` (provenance, one
session per invocation). As in chapter 5, the split is fixed (``cfg.split_seed``) and a seed fixes the
initialization, the batch order and the permutations (``cfg.seed``; seed 0 is the chapter's run), so the two
classifiers of one seed are a pair. It is a results store (:mod:`attnbook.store`): each run is stored as soon as it
finishes, so a killed run resumes where it stopped.
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
from torch import nn

from ..data.reviews import build_vocab, encode, load_reviews, split_reviews
from ..interpret import AttentionClassifier, BinaryView, gradient_importance, kendall_tau, leave_one_out_importance, permutation_effect
from ..models import BiGRUClassifier
from ..runtime import ModeConfig, get_device, get_mode, listing, plural, progress, run_tasks, seed_everything
from ..stats import bootstrap_ci
from ..store import Layout, ResultsStore, Session, StoreError, csv_path, device_arg, positive_int
from . import masking

__all__ = ["ExplanationConfig", "prepare_reviews", "train_classifier", "train_twins", "predict", "accuracy",
           "accuracy_difference", "explanation_tests", "run_one", "stored_summary", "main", "LAYOUT", "ATTENTIONS",
           "NEARLY_UNIFORM_RATIO", "attention_peaks", "uniformity_sentence", "twin_verdict", "interval_phrase",
           "twin_meaning",
           "tau_word", "TAU_BANDS", "tau_bands_sentence", "tau_above_half_sentence", "explanation_verdict",
           "percent_of", "train_embedding_classifier", "train_embedding_twins", "uniform_reliance",
           "reliance_sentence", "RELIES_SHARE", "relies_on_weights", "two_token_alternative", "orders_of_magnitude"]


@dataclass(frozen=True)
class ExplanationConfig(ModeConfig):
    """Data sizes, model and training of the explanation experiment (quick: a 2-core CPU; full: a GPU).

    Sizes in reviews and tokens; ``n_train`` / ``n_test`` = 0 keep the whole split. ``batching`` is chapter 5's
    ``"bucketed"`` or ``"random"`` (:mod:`attnbook.batching`).
    """

    n_train: int = 8000
    n_test: int = 0
    n_analyse: int = 50
    max_len: int = 200
    vocab_size: int = 10_000
    min_freq: int = 2
    embed_size: int = 32
    hidden_size: int = 16
    attention_size: int = 16
    epochs: int = 1
    batch_size: int = 100
    lr: float = 3e-2
    batching: str = "bucketed"
    eval_batch_size: int = 500
    n_permutations: int = 50
    split_seed: int = 0
    seed: int = 0
    device: str = "cpu"
    bag_epochs: int = 2
    bag_lr: float = 1e-2
    bag_batch_size: int = 50

    @classmethod
    def quick(cls) -> "ExplanationConfig":
        """8,000 training reviews cut to 200 tokens (chapter 5's quick length), a small BiGRU (32, 16 per
        direction, 16), one epoch of Adam at 3e-2 in length-bucketed batches of 100, every test review, 50 analysed
        reviews."""
        return cls()

    @classmethod
    def full(cls) -> "ExplanationConfig":
        """All training reviews cut to 400 tokens, chapter 5's full sizes (Yang et al.: 200, 50, 100), batch 64,
        Adam 1e-3, 2 epochs, 500 analysed reviews."""
        return cls(n_train=0, n_test=0, n_analyse=500, max_len=400, vocab_size=20_000, embed_size=200,
                   hidden_size=50, attention_size=100, epochs=2, batch_size=64, lr=1e-3, n_permutations=100,
                   device=str(get_device()))


def prepare_reviews(cfg: ExplanationConfig) -> dict:
    """Load, clean, deduplicate and split the IMDB reviews (:mod:`attnbook.data.reviews`, split seed
    ``cfg.split_seed``), build the vocabulary on the training part, and encode.

    Returns a dict with ``vocab``, ``vocab_size``, ``n_reviews`` (after deduplication), ``split_sizes`` and the parts
    ``train`` and ``test`` in :mod:`attnbook.experiments.masking`'s layout: NumPy ``ids`` int32 ``(n, max_len)``
    (right-padded with 0), ``lengths`` int64 ``(n,)``, ``labels`` int64 ``(n,)`` (1 = positive), and ``text``.
    """
    reviews = load_reviews("imdb")
    splits = split_reviews(reviews, seed=cfg.split_seed)
    train = splits["train"].iloc[: cfg.n_train or None]
    test = splits["test"].iloc[: cfg.n_test or None]
    vocab = build_vocab(train.text, min_freq=cfg.min_freq, max_size=cfg.vocab_size)

    def arrays(df):
        ids, lengths = encode(df.text, vocab, cfg.max_len)
        return {"ids": ids.numpy().astype(np.int32), "lengths": lengths.numpy().astype(np.int64),
                "labels": df.label.to_numpy(dtype=np.int64, copy=True), "text": df.text.tolist()}

    return {"vocab": vocab, "vocab_size": len(vocab), "train": arrays(train), "test": arrays(test),
            "n_reviews": len(reviews), "split_sizes": {k: len(v) for k, v in splits.items()}}


def _view(model: nn.Module) -> nn.Module:
    """``model`` in :mod:`attnbook.interpret`'s protocol: a BiGRUClassifier through :class:`BinaryView`, any other
    model (e.g. :class:`attnbook.interpret.AttentionClassifier`) as it is."""
    return BinaryView(model) if isinstance(model, BiGRUClassifier) else model


@torch.no_grad()
def predict(model: nn.Module, part: dict, device: str | torch.device = "cpu", batch_size: int = 500) -> np.ndarray:
    """Predicted labels int64 ``(n,)`` (1 = positive: the protocol logit ``> 0``) of the reviews in ``part`` (a part of
    :func:`prepare_reviews`), for a :class:`~attnbook.models.BiGRUClassifier` or any model of
    :mod:`attnbook.interpret`'s protocol. Leaves the model in eval mode."""
    view = _view(model).eval()
    n = len(part["labels"])
    preds = np.zeros(n, dtype=np.int64)
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        ids, lengths, _ = masking._batch(part, index, "post")
        logits, _ = view(ids.to(device), lengths.to(device))
        preds[index] = (logits > 0).long().cpu().numpy()
    return preds


def accuracy(model: nn.Module, part: dict, device: str | torch.device = "cpu", batch_size: int = 500) -> float:
    """Share of the reviews in ``part`` whose label :func:`predict` gets right."""
    return float((predict(model, part, device, batch_size) == part["labels"]).mean())


def accuracy_difference(preds_a, preds_b, labels, confidence_level: float = 0.95, seed: int = 0) -> dict:
    """Accuracy of ``preds_a`` minus that of ``preds_b`` on the same reviews, with a paired bootstrap interval over
    the reviews (:func:`attnbook.stats.bootstrap_ci` of the per-review differences of correctness, -1, 0 or 1).

    The interval says how much the difference could change with other test reviews drawn from the same population;
    it says nothing about other training seeds.

    Returns:
        ``{"acc_a", "acc_b", "difference", "low", "high", "n"}``.

    Raises:
        ValueError: the three arrays do not have one entry per review each (the message gives the shapes), or there
            are fewer than 2 reviews.
    """
    a, b, y = (np.asarray(v).ravel() for v in (preds_a, preds_b, labels))
    if not a.shape == b.shape == y.shape:
        raise ValueError(f"preds_a, preds_b and labels must have the same length, got {a.shape}, {b.shape} and "
                         f"{y.shape}")
    if a.size < 2:
        raise ValueError(f"accuracy_difference needs at least 2 reviews, got {a.size}")
    d = (a == y).astype(float) - (b == y).astype(float)
    low, high = bootstrap_ci(d, confidence_level=confidence_level, n_resamples=2000, seed=seed,
                             method="percentile")
    return {"acc_a": float((a == y).mean()), "acc_b": float((b == y).mean()), "difference": float(d.mean()),
            "low": low, "high": high, "n": int(a.size)}


def _condition(cfg: ExplanationConfig, uniform: bool) -> dict:
    """The chapter-5 condition of the classifier: attention pooling with the ``"neg_inf"`` mask, or masked mean
    pooling (uniform attention); packed input, fp32."""
    return {"pooling": "mean" if uniform else "attention", "masking": "-" if uniform else "neg_inf",
            "rnn_input": "packed", "batching": cfg.batching, "precision": "fp32"}


def train_classifier(cfg: ExplanationConfig, data: dict, uniform: bool = False, show_progress: bool = True
                     ) -> tuple[BiGRUClassifier, pd.DataFrame]:
    """Train chapter 5's BiGRU classifier with attention pooling (or, ``uniform=True``, its masked-mean twin) on
    ``data["train"]`` (:func:`prepare_reviews`) with seed ``cfg.seed``, as :func:`attnbook.experiments.masking.run_one`
    trains one condition in fp32: seeded, Adam on cross-entropy, :mod:`attnbook.experiments.masking`'s batches.

    Returns:
        The model in eval mode and a DataFrame with one row per epoch: ``epoch``, ``train_loss``, ``test_acc``,
        ``wall_s`` (cumulative training seconds).

    Raises:
        ValueError: unknown ``cfg.batching`` (from the sampler).
    """
    condition = _condition(cfg, uniform)
    device = torch.device(cfg.device)
    seed_everything(cfg.seed)
    model = BiGRUClassifier(data["vocab_size"], cfg.embed_size, cfg.hidden_size, cfg.attention_size,
                            pooling=condition["pooling"], masking="neg_inf", packed=True).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    train = data["train"]
    sampler = masking._sampler(condition["batching"], train["lengths"], cfg.batch_size, cfg.seed)
    rows, wall = [], 0.0
    epochs = range(cfg.epochs)
    for epoch in progress(epochs, desc="uniform attention" if uniform else "learned attention") \
            if show_progress else epochs:
        start, losses = time.perf_counter(), []
        sampler.set_epoch(epoch)
        model.train()
        for index in sampler:
            ids, lengths, labels = (t.to(device) for t in masking._batch(train, index, "post"))
            logits, _ = model(ids, lengths)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        wall += time.perf_counter() - start
        rows.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)),
                     "test_acc": accuracy(model, data["test"], device, cfg.eval_batch_size), "wall_s": wall})
    return model.eval(), pd.DataFrame(rows)


def _train_one_thread(cfg: ExplanationConfig, data: dict, uniform: bool) -> tuple[BiGRUClassifier, pd.DataFrame]:
    """:func:`train_classifier` in a worker process, with one torch thread and no progress bar, on writable copies
    of the arrays (:func:`attnbook.experiments.masking._writable`)."""
    torch.set_num_threads(1)
    return train_classifier(cfg, masking._writable(data), uniform=uniform, show_progress=False)


def train_twins(cfg: ExplanationConfig, data: dict, workers: int = 1, show_progress: bool = True
                ) -> tuple[tuple[BiGRUClassifier, pd.DataFrame], tuple[BiGRUClassifier, pd.DataFrame]]:
    """Train the learned-attention classifier and its uniform twin (:func:`train_classifier` with ``uniform`` False,
    then True): one after the other in this process (``workers=1``), or side by side in ``workers`` processes of
    one torch thread each (:func:`attnbook.runtime.run_tasks`; on a CPU, two workers take about half the time).

    Each model is seeded inside :func:`train_classifier`, so on the CPU both ways give the same models and
    histories (bar ``wall_s``) as long as this process also runs one thread (chapter 7 sets
    ``torch.set_num_threads(1)``).

    Returns:
        ``((model, history), (uniform_model, uniform_history))`` as :func:`train_classifier` returns them.

    Raises:
        ValueError: ``workers`` below 1; what :func:`train_classifier` raises.

    Chapter 7, section "Is attention an explanation?".
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if workers == 1:
        return (train_classifier(cfg, data, show_progress=show_progress),
                train_classifier(cfg, data, uniform=True, show_progress=show_progress))
    return tuple(run_tasks(_train_one_thread, [(cfg, data, False), (cfg, data, True)], min(workers, 2)))


def explanation_tests(cfg: ExplanationConfig, model: nn.Module, data: dict) -> dict:
    """Attention weights against gradient and leave-one-out importance, and the permutation test, on the first
    ``cfg.n_analyse`` test reviews, for a :class:`~attnbook.models.BiGRUClassifier` with attention pooling (seen
    through :class:`~attnbook.interpret.BinaryView`) or any model of :mod:`attnbook.interpret`'s protocol.

    Returns a dict with ``per_example`` (DataFrame: ``length``, ``prob`` (positive class), ``max_weight``,
    ``tau_grad``, ``tau_loo``, ``tau_grad_loo`` (the two importance measures against each other),
    ``perm_median_change``) and the raw tensors ``ids`` int64 ``(n, T)``, ``lengths``, ``weights``, ``grad``,
    ``loo`` (``(n, T)``, T the longest analysed review).
    """
    view = _view(model).eval()
    test = data["test"]
    index = np.arange(min(cfg.n_analyse, len(test["labels"])))
    ids, lengths, _ = masking._batch(test, index, "post")
    ids, lengths = ids.to(cfg.device), lengths.to(cfg.device)
    with torch.no_grad():
        logits, weights = view(ids, lengths)
    grad = gradient_importance(view, ids, lengths).detach()
    loo = leave_one_out_importance(view, ids, lengths)
    perm = permutation_effect(view, ids, lengths, cfg.n_permutations, torch.Generator().manual_seed(cfg.seed))
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
#: seed; its history and (learned attention only) its per-review tests go into side tables. The device and the
#: evaluation batch size do not count as configuration, and ``seeds`` only chooses runs (a run's seed replaces
#: ``seed``).
LAYOUT = Layout(
    "attention_explanation", keys=("attention", "seed"),
    columns=("attention", "seed", "n_train", "n_test", "test_acc", "train_loss", "wall_s", "n_analysed",
             "mean_tau_grad", "mean_tau_loo", "mean_tau_grad_loo", "mean_perm_median_change", "mean_max_weight"),
    tables={"history": ("epoch", "train_loss", "test_acc", "wall_s", "attention", "seed"),
            "per_example": ("example", "length", "prob", "max_weight", "tau_grad", "tau_loo", "tau_grad_loo",
                            "perm_median_change", "attention", "seed")},
    not_configuration=("device", "seeds", "eval_batch_size"))


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


def stored_summary(runs: pd.DataFrame) -> str:
    """One sentence on stored runs of :func:`run_one` (one row per attention and seed): the mean test accuracy of each
    kind of attention over its seeds. Chapter 7, section "So, is it an explanation?".

    Raises:
        ValueError: ``runs`` has no rows.
    """
    if runs.empty:
        raise ValueError("runs is empty: there is nothing to summarize")
    names = {"learned": "learned attention", "uniform": "the uniform twin"}
    means = runs.groupby("attention").test_acc.mean()
    parts = listing(f"{means[a]:.3f} for {names.get(a, a)}" for a in sorted(means.index))
    return (f"Over {plural(int(runs.seed.nunique()), 'seed')} at full size (table above), mean test accuracy is "
            f"{parts}; the rest here is the quick run.")


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
        data = None
        for seed in seeds:
            todo = [a for a in ATTENTIONS if not store.has({"attention": a, "seed": seed})]
            if not todo:
                continue
            run_cfg = replace(cfg, seed=seed)
            data = prepare_reviews(run_cfg) if data is None else data  # the split does not depend on the seed
            for attention in todo:
                row, history, per_example = run_one(run_cfg, data, attention, show_progress=not args.no_progress)
                store.append(row, {"history": history, "per_example": per_example})
                session.checkpoint()
        summary = store.frame()
    print(summary.to_string(index=False))
    return 0


# --- chapter 7's sentences, chosen by code (each tested at its edge values in tests/test_experiments_ch7.py) -------

#: Attention counts as nearly uniform when the median review's largest weight is less than this many times the
#: weight ``1 / n`` that uniform attention gives each of its ``n`` tokens.
NEARLY_UNIFORM_RATIO = 3.0


@torch.no_grad()
def attention_peaks(model: nn.Module, part: dict, device: str | torch.device = "cpu", batch_size: int = 500
                    ) -> pd.DataFrame:
    """How far each review's attention is from uniform: one row per review of ``part`` (:func:`prepare_reviews`)
    with ``length`` (real tokens ``n``), ``max_weight`` (the largest attention weight), ``uniform`` (``1 / n``, the
    weight of every token under uniform attention) and ``ratio`` (``max_weight * n``: 1 for uniform attention, ``n``
    for attention on one token). For a :class:`~attnbook.models.BiGRUClassifier` with attention pooling or any model
    of :mod:`attnbook.interpret`'s protocol; leaves the model in eval mode. Chapter 7, section "Chapter 5's
    classifier and its uniform twin"."""
    view = _view(model).eval()
    n = len(part["labels"])
    peaks = np.zeros(n)
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        ids, lengths, _ = masking._batch(part, index, "post")
        _, weights = view(ids.to(device), lengths.to(device))
        peaks[index] = weights.max(-1).values.cpu().numpy()
    lengths = np.asarray(part["lengths"], dtype=float)
    return pd.DataFrame({"length": part["lengths"], "max_weight": peaks, "uniform": 1 / lengths,
                         "ratio": peaks * lengths})


def uniformity_sentence(median_max_weight: float, median_uniform: float, median_ratio: float) -> tuple[str, bool]:
    """The sentence that says, before any verdict, how peaked a classifier's attention is, and whether it counts as
    nearly uniform (:data:`NEARLY_UNIFORM_RATIO`), from the medians over reviews of :func:`attention_peaks`.

    Returns:
        ``(sentence, nearly_uniform)``.

    Raises:
        ValueError: a median is not positive, or ``median_ratio`` is below 1 (no attention is flatter than uniform).
    """
    if min(median_max_weight, median_uniform) <= 0:
        raise ValueError(f"the medians must be positive, got {median_max_weight} and {median_uniform}")
    if median_ratio < 1 - 1e-9:
        raise ValueError(f"median_ratio must be at least 1 (uniform attention), got {median_ratio}")
    nearly_uniform = median_ratio < NEARLY_UNIFORM_RATIO
    kind = "nearly uniform" if nearly_uniform else "peaked"
    largest, uniform = f"{median_max_weight:.3f}", f"{median_uniform:.3f}"
    if largest == uniform:
        tail = "the same as uniform weights would give every token"
    else:
        tail = f"where uniform weights would give every token {uniform}"
    sentence = f"This model's attention is {kind}: the largest weight in the median test review is {largest}, {tail}."
    return sentence, nearly_uniform


def twin_verdict(low: float, high: float) -> tuple[str, str]:
    """The verdict on learned attention against its uniform twin from the bootstrap interval ``[low, high]`` of
    their accuracy difference (learned minus uniform), as a clause and as a short label for a table.

    Raises:
        ValueError: ``low > high``.
    """
    if low > high:
        raise ValueError(f"low must not exceed high, got {low} > {high}")
    if low > 0:
        return ("learned attention is more accurate than its uniform twin by more than the test set's sampling "
                "noise", "learned attention ahead beyond test-set noise")
    if high < 0:
        return ("the uniform twin is more accurate than learned attention by more than the test set's sampling "
                "noise", "the uniform twin ahead beyond test-set noise")
    return "the two are within the test set's sampling noise of each other", "within test-set noise"


def interval_phrase(low: float, high: float, digits: int = 3) -> str:
    """The 95% interval of :func:`accuracy_difference` (a bootstrap over the test reviews) as a parenthesis for
    prose, signed with ``digits`` decimals: ``"(95% interval over the test reviews -0.030 to -0.008)"``, or, when
    both bounds print alike, ``"(the same, +0.000, on every resample of the test reviews)"``.

    Raises:
        ValueError: ``low > high``.
    """
    if low > high:
        raise ValueError(f"low must not exceed high, got {low} > {high}")
    a, b = f"{low:+.{digits}f}", f"{high:+.{digits}f}"
    if a == b:
        return f"(the same, {a}, on every resample of the test reviews)"
    return f"(95% interval over the test reviews {a} to {b})"


def twin_meaning(learned_ahead: bool, nearly_uniform: bool) -> str:
    """What the twin comparison means, given whether learned attention won and whether its attention is nearly
    uniform (:func:`uniformity_sentence`). Chapter 7, section "Chapter 5's classifier and its uniform twin"."""
    if nearly_uniform:
        if learned_ahead:
            return ("Even weights this close to uniform carry something the task needs. Still, every test below "
                    "speaks about this model only, not about one whose attention picks out a few tokens.")
        return ("With weights this close to uniform, the twin's result is no surprise: the learned model averages "
                "its states almost as the twin does. Every test below speaks about this model only, not about one "
                "whose attention picks out a few tokens.")
    if learned_ahead:
        return ("So the weights carry information that the task needs. Whether they also rank the tokens the way "
                "the prediction uses them is the next question.")
    return ("So this task can be solved without choosing tokens, and we should not expect the weights to single out "
            "the tokens that the prediction rests on.")


TAU_BANDS = ((0.1, "hardly"), (0.3, "loosely"), (0.6, "moderately"))
"""Upper ends of the bands of :func:`tau_word` (a median Kendall's tau below the bound gets the word); above the
last bound the word is "closely"."""


def tau_word(tau: float) -> str:
    """How closely two rankings agree, by a median Kendall's tau: "hardly" (below 0.1, negative included),
    "loosely" (below 0.3), "moderately" (below 0.6), "closely" (:data:`TAU_BANDS`). The word fits "rank the
    tokens ... alike"."""
    for bound, word in TAU_BANDS:
        if not tau >= bound:  # NaN reads as no agreement
            return word
    return "closely"


def tau_bands_sentence() -> str:
    """The definition of :func:`tau_word`'s words, from :data:`TAU_BANDS`, as one sentence for chapter 7."""
    parts = [f"{word} alike below {bound:g}" for bound, word in TAU_BANDS]
    parts[0] = parts[0].replace(" below ", " when the median τ is below ", 1)
    return f"We say that two scores rank the tokens {', '.join(parts)}, and closely alike above that."


def percent_of(share: float) -> str:
    """A share in [0, 1] as the quantity of a phrase "... of the reviews": "none", "all", "under 1%", "over 99%" or a
    whole percentage such as "51%". Chapter 7, sections "The reviews" and "Attention against importance".

    Raises:
        ValueError: ``share`` is outside [0, 1] or NaN.
    """
    if not 0 <= share <= 1:
        raise ValueError(f"share must lie in [0, 1], got {share}")
    if share == 0:
        return "none"
    if share == 1:
        return "all"
    text = f"{share:.0%}"
    return "under 1%" if text == "0%" else "over 99%" if text == "100%" else text


def _reviews(n: int, total: int) -> str:
    return "no review" if n == 0 else "every review" if n == total else f"{n} of {total} reviews"


def tau_above_half_sentence(n_attention: int, n_importance: int, total: int) -> str:
    """In how many of ``total`` analysed reviews Kendall's tau exceeds one half, for attention against gradient
    importance (``n_attention``) and for gradient against leave-one-out importance (``n_importance``).

    Raises:
        ValueError: ``total`` is below 1, or a count is negative or above ``total``.
    """
    if total < 1 or not (0 <= n_attention <= total and 0 <= n_importance <= total):
        raise ValueError(f"need 0 <= counts <= total and total >= 1, got {n_attention}, {n_importance} of {total}")
    if n_attention == n_importance and n_attention in (0, total):
        where = _reviews(n_attention, total)
        both = "neither" if n_attention == 0 else "both"
        link = "nor" if n_attention == 0 else "and"
        return (f"τ exceeds one half in {where}, {both} for attention against gradient {link} for gradient against "
                "leave-one-out.")
    return (f"τ exceeds one half in {_reviews(n_attention, total)} for attention against gradient, and in "
            f"{_reviews(n_importance, total)} for gradient against leave-one-out.")


def explanation_verdict(learned_ahead: bool, uniform_ahead: bool, agreement: str, same_prediction: bool,
                        nearly_uniform: bool, relies: bool | None = None) -> str:
    """The verdict of chapter 7's section "So, is it an explanation?", limited to the model tested.

    Args:
        learned_ahead, uniform_ahead: the twin comparison (:func:`twin_verdict`'s interval above or below 0).
        agreement: :func:`tau_word` of the better median tau between attention and an importance measure.
        same_prediction: very different weights were shown to give the same prediction.
        nearly_uniform: :func:`uniformity_sentence`'s flag.
        relies: whether uniform weights put in place of the model's own change some of its predictions
            (:func:`uniform_reliance`); ``None`` = not measured.

    Raises:
        ValueError: both ``learned_ahead`` and ``uniform_ahead``, or an unknown ``agreement``.
    """
    if learned_ahead and uniform_ahead:
        raise ValueError("learned_ahead and uniform_ahead cannot both hold")
    if agreement not in ("hardly", "loosely", "moderately", "closely"):
        raise ValueError(f"agreement must be a word of tau_word, got {agreement!r}")
    model = "this model, whose attention is nearly uniform" if nearly_uniform else "this model"
    parts = [f"The verdict holds for {model}."]
    if relies is not None:
        parts.append("Its predictions rest on its weights." if relies else
                     "Its predictions do not rest on its weights.")
    if relies and not learned_ahead:
        parts.append("The task does not need them: its uniform twin is "
                     + ("more accurate." if uniform_ahead else "as accurate, within test-set noise."))
    elif learned_ahead:
        parts.append("It uses its weights: it beats its uniform twin.")
    elif uniform_ahead:
        parts.append("It does not need its weights: its uniform twin is more accurate.")
    else:
        parts.append("It does not need its weights: its uniform twin is as accurate, within test-set noise.")
    if agreement in ("hardly", "loosely"):
        only = "only " if agreement == "loosely" else ""
        parts.append(f"The weights and the importance measures rank the tokens {only}{agreement} alike.")
    else:
        parts.append(f"The importance measures {agreement} confirm the weights' ranking.")
    if same_prediction:
        parts.append("Very different weights give the same prediction.")
    if (learned_ahead or relies) and agreement in ("moderately", "closely"):
        parts.append("So its weights point to tokens that matter, but they are not the only weights that give its "
                     "predictions.")
    else:
        parts.append("So its weights are not, by themselves, a faithful account of why it decided as it did.")
    return " ".join(parts)


def train_embedding_classifier(cfg: ExplanationConfig, data: dict, uniform: bool = False
                               ) -> tuple[AttentionClassifier, pd.DataFrame]:
    """Train the classifier whose attention sits directly on the word embeddings
    (:class:`attnbook.interpret.AttentionClassifier` with ``encoder="none"``: the logit is
    ``v . sum_t alpha_t e_t + b``), or its uniform twin (``uniform=True``: ``alpha_t = 1 / n``), on
    ``data["train"]`` (:func:`prepare_reviews`). Nothing mixes the tokens before the pooling, so a weight on token
    ``t`` is a weight on that word alone: the model of chapter 7, section "Is attention an explanation?".

    Seeded by ``cfg.seed`` (initialization and batch order, so the twins start alike and see the same batches);
    ``cfg.bag_epochs`` epochs of Adam at ``cfg.bag_lr`` on the binary cross-entropy, random batches of
    ``cfg.bag_batch_size`` reviews (right-padded with id 0, masked).

    Returns:
        The model in eval mode and a DataFrame with one row per epoch: ``epoch``, ``train_loss``, ``test_acc``.

    Raises:
        ValueError: ``data`` lacks a part, or the sizes of ``cfg`` are not positive (from the model).
    """
    seed_everything(cfg.seed)
    model = AttentionClassifier(data["vocab_size"], embed_size=cfg.embed_size, attention_size=cfg.attention_size,
                                uniform=uniform, encoder="none").to(cfg.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.bag_lr)
    train = data["train"]
    ids = torch.from_numpy(np.ascontiguousarray(train["ids"])).long()
    lengths = torch.from_numpy(np.ascontiguousarray(train["lengths"]))
    labels = torch.from_numpy(np.ascontiguousarray(train["labels"])).float()
    order = torch.Generator().manual_seed(cfg.seed)
    rows = []
    for epoch in range(cfg.bag_epochs):
        model.train()
        losses = []
        for batch in torch.randperm(len(labels), generator=order).split(cfg.bag_batch_size):
            logits, _ = model(ids[batch].to(cfg.device), lengths[batch].to(cfg.device))
            loss = F.binary_cross_entropy_with_logits(logits, labels[batch].to(cfg.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        rows.append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)),
                     "test_acc": accuracy(model, data["test"], cfg.device, cfg.eval_batch_size)})
    return model.eval(), pd.DataFrame(rows)


def train_embedding_twins(cfg: ExplanationConfig, data: dict
                          ) -> tuple[tuple[AttentionClassifier, pd.DataFrame], tuple[AttentionClassifier, pd.DataFrame]]:
    """The embedding classifier with learned attention and its uniform twin
    (:func:`train_embedding_classifier`), one after the other: ``((model, history), (uniform, history))``."""
    return train_embedding_classifier(cfg, data), train_embedding_classifier(cfg, data, uniform=True)


@torch.no_grad()
def uniform_reliance(model: nn.Module, part: dict, device: str | torch.device = "cpu", batch_size: int = 500
                     ) -> dict:
    """How much a trained model's predictions rest on its own attention weights: replace them, at test time and
    with everything else kept, by uniform weights ``1 / n`` over each review's real tokens, and compare.

    Args:
        model: a model of :mod:`attnbook.interpret`'s protocol (or a BiGRUClassifier, seen through
            :class:`~attnbook.interpret.BinaryView`).
        part: a part of :func:`prepare_reviews` (``ids``, ``lengths``, ``labels``).

    Returns:
        ``{"flip_share": share of reviews whose predicted label changes, "mean_abs_change": mean |change| of
        P(positive), "n": reviews}``.

    Chapter 7, section "Is attention an explanation?" (the test that the model uses its weights, after
    Jain and Wallace 2019).
    """
    view = _view(model).eval()
    n = len(part["labels"])
    flips, changes = np.zeros(n, dtype=bool), np.zeros(n)
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        ids, lengths, _ = masking._batch(part, index, "post")
        ids, lengths = ids.to(device), lengths.to(device)
        mask = torch.arange(ids.shape[1], device=device)[None] < lengths[:, None]
        uniform = mask / mask.sum(-1, keepdim=True).clamp(min=1)
        own, _ = view(ids, lengths)
        even, _ = view(ids, lengths, weights=uniform.to(own.dtype))
        flips[index] = ((own > 0) != (even > 0)).cpu().numpy()
        changes[index] = (torch.sigmoid(own) - torch.sigmoid(even)).abs().cpu().numpy()
    return {"flip_share": float(flips.mean()), "mean_abs_change": float(changes.mean()), "n": n}


#: The share of predictions that uniform weights must change before chapter 7 says that a model's predictions rest
#: on its weights (:func:`relies_on_weights`).
RELIES_SHARE = 0.10


def relies_on_weights(flip_share: float) -> bool:
    """Whether a model's predictions rest on its attention weights: uniform weights in their place change at least
    :data:`RELIES_SHARE` of them (:func:`uniform_reliance`)."""
    return flip_share >= RELIES_SHARE


def reliance_sentence(flip_share: float) -> str:
    """One sentence on :func:`uniform_reliance`: "Replacing its weights by uniform ones, with everything else kept,
    changes the predicted label of X of the test reviews." with X from :func:`percent_of` ("none", "under 1%",
    "37%", "all"), and what that says: nothing rests on the weights (none), few predictions do (below
    :data:`RELIES_SHARE`), or the predictions rest on them.

    Raises:
        ValueError: ``flip_share`` outside [0, 1] or NaN (from :func:`percent_of`).
    """
    share = percent_of(flip_share)
    opening = (f"Replacing its weights by uniform ones, with everything else kept, changes the predicted label of "
               f"{share} of the test reviews")
    if flip_share == 0:
        return opening + ": its predictions do not rest on where its attention goes."
    if not relies_on_weights(flip_share):
        return opening + ": few of its predictions rest on where its attention goes."
    return opening + ": its predictions rest on where its attention goes."


@torch.no_grad()
def two_token_alternative(model: nn.Module, ids: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor
                          ) -> dict:
    """Very different attention weights with exactly the same prediction (Brunner et al. 2020): for one review, put
    all the weight on two tokens, one whose ``u_t = v . h_t`` lies below the attention's value
    ``sum_t alpha_t u_t`` and one above, mixed to hit it exactly.

    Args:
        model: a model of :mod:`attnbook.interpret`'s protocol with ``states``, ``embed`` and ``direction`` (an
            :class:`~attnbook.interpret.AttentionClassifier`, or a BiGRUClassifier through ``BinaryView``).
        ids: int64 ``(1, T)``; lengths: int64 ``(1,)``; weights: the model's own weights ``(T,)`` or ``(1, T)``.

    Returns:
        ``{"p_orig", "p_alt": P(positive) with the model's weights and with the alternative, "tv": the total
        variation distance between the two weight vectors, "low", "high": the two tokens' positions,
        "alternative": the weights (T,)}``.

    Raises:
        ValueError: ``ids`` is not one review, or every token has the same ``u_t`` (no two tokens bracket it).
    """
    view = _view(model).eval()
    if ids.dim() != 2 or ids.shape[0] != 1 or lengths.shape != (1,):
        raise ValueError(f"ids must be one review (1, T) with lengths (1,), got {tuple(ids.shape)} and "
                         f"{tuple(lengths.shape)}")
    n = int(lengths[0])
    alpha = weights.reshape(-1)[:n]
    u = view.states(view.embed(ids), lengths)[0, :n] @ view.direction
    low, high = int(u.argmin()), int(u.argmax())
    if u[high] == u[low]:
        raise ValueError("every token has the same u_t = v . h_t: no two tokens bracket the attention's value")
    target = (alpha * u).sum()
    mix = (target - u[low]) / (u[high] - u[low])
    alternative = torch.zeros(ids.shape[1], dtype=alpha.dtype)
    alternative[low], alternative[high] = 1 - mix, mix
    p_orig = torch.sigmoid(view(ids, lengths)[0])[0]
    p_alt = torch.sigmoid(view(ids, lengths, weights=alternative[None])[0])[0]
    tv = 0.5 * (alternative[:n] - alpha).abs().sum()
    return {"p_orig": float(p_orig), "p_alt": float(p_alt), "tv": float(tv), "low": low, "high": high,
            "alternative": alternative}


def orders_of_magnitude(ratio: float) -> str:
    """A ratio above 1 as "about N orders of magnitude" (N = log10 rounded), "N to N+1 orders of magnitude" when it
    lies near the middle, "less than one order of magnitude" below 10, "equal" at 1. Chapter 7, section "How noisy
    are the gradients?".

    Raises:
        ValueError: ``ratio`` is not finite or below 1.
    """
    if not np.isfinite(ratio) or ratio < 1:
        raise ValueError(f"ratio must be a finite number >= 1, got {ratio}")
    if ratio == 1:
        return "equal"
    exponent = float(np.log10(ratio))
    if exponent < 1:
        return "less than one order of magnitude"
    whole = int(np.floor(exponent))
    if 0.3 < exponent - whole < 0.7:
        return f"{whole} to {whole + 1} orders of magnitude"
    n = int(round(exponent))
    return f"about {n} order{'s' if n != 1 else ''} of magnitude"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
