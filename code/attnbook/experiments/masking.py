"""The padding-mask experiments of chapter 5: does masking attention pooling over zero-padded states change accuracy?

Chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``). One *run* trains
one :class:`attnbook.models.BiGRUClassifier` under one *condition* with one *seed* and measures it. A seed fixes the
initialization and the data order, so runs with the same seed are paired across conditions. :func:`train_model`
gives the trained model of a run itself, and :func:`padding_sweep` re-pads the test reviews of a packed model to
wider and wider batches (the chapter's section "The mechanism on a trained model").

A condition is a dict of factors (:func:`conditions` builds the grids):

- ``pooling``: ``"attention"`` or a baseline ``"mean"``, ``"uniform"``, ``"last"`` (:mod:`attnbook.pooling`);
- ``masking``: ``"none"``, ``"renormalize"``, ``"additive"``, ``"neg_inf"`` (attention pooling only);
- ``rnn_input``: ``"packed"`` (pad states are exactly 0), ``"unpacked"`` (post-padding, the GRU runs over the pads)
  or ``"unpacked-pre"`` (pre-padding);
- ``batching``: ``"random"`` or ``"bucketed"`` (:mod:`attnbook.batching`), for training and evaluation;
- ``precision``: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (``torch.autocast``; fp16 with a ``GradScaler``).

Grids:

- ``"chapter"``: what the chapter's notebook runs, in both modes: "none" and "neg_inf" on packed and unpacked
  input, and the masked mean, all with random batching in fp32 ("renormalize" and "additive" equal "neg_inf" up to
  rounding whenever a review has a token, chapter 1). In quick mode that is 5 seeds of a small model on a subset;
  in full mode (the chapter's GPU cells) 20 seeds on all reviews, 100 runs.
- ``"core"``: 4 maskings x packed/unpacked x random/bucketed, fp32, plus the masked mean (20 conditions).
- ``"full"``: the full factorial, 4 maskings x 3 inputs x 2 batchings x 3 precisions, and the three baselines x 3
  inputs x 2 batchings in fp32 (90 conditions); the default of ``--mode full``.

From the command line (resumable: finished runs in ``--out`` are skipped, each finished run is appended at once)::

    python -m attnbook.experiments.masking --mode full --out results/masking_full.csv --workers 4
    python -m attnbook.experiments.masking --mode full --grid core --seeds 20 --out results/masking_core.csv
    python -m attnbook.experiments.masking --mode full --only attention/none/packed/random/fp32,attention/neg_inf/packed/random/fp32

``--out`` is a results store (:mod:`attnbook.store`): one row per finished run, written whole and fsynced; a damaged
last line is set aside and its run made again; the header and the configuration are checked on resume (``threads``,
``workers``, ``device``, ``seeds``, ``grid`` and ``only`` may change, nothing else); a second process on the same
``--out`` is refused. Provenance (device, versions, commit, date, wall time) goes into every row and into
``<name>.json``, one entry per session, written atomically. The record is rewritten after every finished run (the
session's ``status`` is ``"running"``), so a run killed without notice still leaves one; Ctrl-C or SIGTERM end it
as ``"interrupted"`` (exit status 130 or 143), a completed grid as ``"finished"``. Runs made elsewhere (a GPU) join
the stored ones with ``python -m attnbook.store merge OTHER.csv results/masking_full.csv``.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..batching import BucketBatchSampler, RandomBatchSampler, pad_to_batch, padding_fraction
from ..data.reviews import build_vocab, encode, load_reviews, split_reviews
from ..models import BiGRUClassifier, padding_mask
from ..pooling import MASKINGS
from ..runtime import ModeConfig, describe_device, get_device, seed_everything
from ..store import Layout, ResultsStore, collect_runs, grid_parser, run_grid_cli, run_grid_in_session

__all__ = ["MaskingConfig", "conditions", "condition_id", "prepare_data", "run_one", "train_model", "padding_sweep",
           "run_grid", "open_store",
           "store_config", "main", "RESULT_COLUMNS", "LAYOUT"]

INPUTS = ("packed", "unpacked", "unpacked-pre")
BATCHINGS = ("random", "bucketed")
PRECISIONS = ("fp32", "bf16", "fp16")
BASELINES = ("mean", "uniform", "last")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: The columns of one run's row, after the condition's factors and ``seed``.
RESULT_COLUMNS = ("test_accuracy", "val_accuracy", "pad_mass", "flip_rate", "nan_count", "zero_state_score",
                  "pad_score_mean", "real_score_mean", "real_score_std", "real_below_zero_state", "padding_fraction",
                  "tokens_per_s", "train_time_s", "flip_rate_in")
#: Settings added to :class:`MaskingConfig` after runs were first stored, with the value those runs had.
LEGACY_CONFIG = {"normalize_apostrophes": False}
#: Result columns added after runs were first stored: a file without them is upgraded on resume (its stored runs
#: get NaN there, since they were never measured), rather than refused.
ADDED_COLUMNS = ("flip_rate_in",)
_KEYS = ("pooling", "masking", "rnn_input", "batching", "precision", "seed")


@dataclass(frozen=True)
class MaskingConfig(ModeConfig):
    """Data, model, training and grid of the masking experiments (quick: a 2-core CPU; full: a GPU, as the paper).

    Sizes are in reviews and tokens; ``None`` means all of the split. ``repad_to`` is the length (tokens) to which
    test reviews are re-padded for the stress flip rate (twice ``max_len``: outside the training distribution);
    the in-distribution flip rate re-pads to ``max_len``.
    """

    source: str = "imdb"
    n_train: int | None = 400
    n_eval: int | None = 400
    max_len: int = 200
    vocab_size: int = 5_000
    embed_size: int = 32
    hidden_size: int = 16
    attention_size: int = 16
    batch_size: int = 50
    epochs: int = 4
    lr: float = 1e-2
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    grid: str = "chapter"
    repad_to: int = 400
    split_seed: int = 0
    eval_batch_size: int = 200
    threads: int = 1
    #: Tokenization of the reviews (:func:`attnbook.text.tokenize`): ``False`` keeps typographic apostrophes as
    #: punctuation, as when the stored full-scale runs began (18 of the 24,902 IMDB reviews tokenize differently), so
    #: that every stored run, and every run that resumes them, sees the same tokens.
    normalize_apostrophes: bool = False
    extra: dict = field(default_factory=dict)

    @classmethod
    def quick(cls) -> "MaskingConfig":
        """400 training reviews cut to 200 tokens, a small BiGRU (32, 16, 16), 4 epochs, 5 seeds, the ``"chapter"``
        grid."""
        return cls()

    @classmethod
    def full(cls) -> "MaskingConfig":
        """All reviews (80/10/10 split) cut to 400 tokens, Yang et al.'s sizes (200, 50, 100), batch 64,
        2 epochs, 20 seeds, the full factorial (the command line's default; chapter 5's notebook runs the
        ``"chapter"`` grid)."""
        return cls(n_train=None, n_eval=None, max_len=400, vocab_size=20_000, embed_size=200, hidden_size=50,
                   attention_size=100, batch_size=64, epochs=2, lr=1e-3, seeds=tuple(range(20)), grid="full",
                   repad_to=800, eval_batch_size=500)


def conditions(grid: str) -> list[dict]:
    """The conditions of ``grid`` (``"chapter"``, ``"core"`` or ``"full"``; see the module docstring) as dicts with the keys ``pooling``,
    ``masking``, ``rnn_input``, ``batching``, ``precision`` (``masking`` is ``"-"`` for baselines).

    Raises:
        ValueError: unknown grid.
    """
    def attention(maskings, inputs, batchings, precisions):
        return [dict(pooling="attention", masking=m, rnn_input=i, batching=b, precision=p)
                for i, b, p, m in itertools.product(inputs, batchings, precisions, maskings)]

    def baseline(poolings, inputs, batchings):
        return [dict(pooling=k, masking="-", rnn_input=i, batching=b, precision="fp32")
                for i, b, k in itertools.product(inputs, batchings, poolings)]

    if grid == "chapter":
        return (attention(("none", "neg_inf"), ("packed", "unpacked"), ("random",), ("fp32",))
                + baseline(("mean",), ("packed",), ("random",)))
    if grid == "core":
        return (attention(MASKINGS, ("packed", "unpacked"), BATCHINGS, ("fp32",))
                + baseline(("mean",), ("packed", "unpacked"), BATCHINGS))
    if grid == "full":
        return attention(MASKINGS, INPUTS, BATCHINGS, PRECISIONS) + baseline(BASELINES, INPUTS, BATCHINGS)
    raise ValueError(f"grid must be 'chapter', 'core' or 'full', got {grid!r}")


def condition_id(condition: dict) -> str:
    """A readable key such as ``"attention/neg_inf/packed/random/fp32"``."""
    return "/".join(str(condition[k]) for k in ("pooling", "masking", "rnn_input", "batching", "precision"))


def prepare_data(cfg: MaskingConfig) -> dict:
    """Load, deduplicate and split the reviews (:mod:`attnbook.data.reviews`), build the vocabulary on the
    training split, and encode every split to NumPy arrays ``ids`` int32 ``(n, max_len)`` (right-padded with 0),
    ``lengths`` int64 ``(n,)`` and ``labels`` int64 ``(n,)``. Returns ``{"vocab_size": int, "train": {...},
    "validation": {...}, "test": {...}}``."""
    splits = split_reviews(load_reviews(cfg.source), seed=cfg.split_seed)
    caps = {"train": cfg.n_train, "validation": cfg.n_eval, "test": cfg.n_eval}
    splits = {k: df if caps[k] is None else df.iloc[: caps[k]] for k, df in splits.items()}
    vocab = build_vocab(splits["train"].text, min_freq=2, max_size=cfg.vocab_size,
                        normalize_apostrophes=cfg.normalize_apostrophes)
    data: dict = {"vocab_size": len(vocab)}
    for name, df in splits.items():
        ids, lengths = encode(df.text, vocab, cfg.max_len, normalize_apostrophes=cfg.normalize_apostrophes)
        data[name] = {"ids": ids.numpy().astype(np.int32), "lengths": lengths.numpy(),
                      "labels": df.label.to_numpy(dtype=np.int64)}
    return data


def _batch(part: dict, index, side: str, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids ``(B, T)`` padded on ``side`` to the longest review of the batch (or to ``length``), lengths, labels."""
    ids, lengths = pad_to_batch(torch.from_numpy(part["ids"]), torch.from_numpy(part["lengths"]), index, side=side)
    if length is not None:  # re-pad to a fixed width, on the same side
        extra = length - ids.shape[1]
        ids = F.pad(ids, (extra, 0) if side == "pre" else (0, extra))
    return ids.long(), lengths, torch.from_numpy(part["labels"][np.asarray(index)])


def _side(condition: dict) -> str:
    """Where the pads go for a condition: in front for ``"unpacked-pre"``, else after the tokens."""
    return "pre" if condition["rnn_input"] == "unpacked-pre" else "post"


def _sampler(batching: str, lengths: np.ndarray, batch_size: int, seed: int, shuffle: bool = True):
    if batching == "bucketed":
        return BucketBatchSampler(lengths, batch_size, shuffle=shuffle, seed=seed)
    return RandomBatchSampler(lengths, batch_size, shuffle=True, seed=seed)


def _exact_length_batches(lengths: np.ndarray, batch_size: int) -> list[list[int]]:
    """Batches in which every review has the same length, so that no batch holds a pad (ascending length)."""
    order = np.argsort(lengths, kind="stable")
    batches: list[list[int]] = []
    for length in np.unique(lengths):
        same = order[lengths[order] == length]
        batches.extend(same[i : i + batch_size].tolist() for i in range(0, len(same), batch_size))
    return batches


def _autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_DTYPES[precision])


@torch.no_grad()
def _evaluate(model: BiGRUClassifier, part: dict, condition: dict, cfg: MaskingConfig, device: torch.device,
              repad_to: int | None = None, seed: int = 12345) -> dict:
    """Predictions and attention statistics on ``part`` under the condition's batching (fixed eval order)."""
    model.eval()
    side = _side(condition)
    n = len(part["labels"])
    preds = np.zeros(n, dtype=np.int64)
    pad_mass, pad_scores, real_scores, nan_count = np.zeros(n), [], [], 0
    attention = model.pooling.attention
    # The scores of real and pad tokens (argument 1) come from the encoder states of the same forward pass,
    # caught by a hook rather than computed by running the encoder a second time.
    states = []
    hook = (model.encoder.register_forward_hook(lambda module, inputs, output: states.append(output))
            if attention is not None and repad_to is None else None)
    try:
        for index in _sampler(condition["batching"], part["lengths"], cfg.eval_batch_size, seed, shuffle=False):
            ids, lengths, _ = _batch(part, index, side, repad_to)
            ids, lengths = ids.to(device), lengths.to(device)
            mask = padding_mask(lengths, ids.shape[1], side)
            with _autocast(device, condition["precision"]):
                logits, weights = model(ids, lengths)
                if hook is not None:
                    scores = attention.scores(states.pop()).float()
                    real_scores.append(scores[mask].cpu().numpy())
                    pad_scores.append(scores[~mask].cpu().numpy())
            logits, weights = logits.float(), weights.float()
            nan_count += int((~torch.isfinite(logits)).any(-1).sum())
            preds[index] = logits.argmax(-1).cpu().numpy()
            pad_mass[index] = (weights * ~mask).sum(-1).cpu().numpy()
    finally:
        if hook is not None:
            hook.remove()
    out = {"preds": preds, "accuracy": float((preds == part["labels"]).mean()), "pad_mass": float(pad_mass.mean()),
           "nan_count": nan_count}
    if real_scores:
        real = np.concatenate(real_scores)
        pads = np.concatenate(pad_scores) if pad_scores else np.zeros(0)
        zero = model.pooling.attention.zero_state_score()
        out.update(zero_state_score=zero, pad_score_mean=float(pads.mean()) if pads.size else float("nan"),
                   real_score_mean=float(real.mean()), real_score_std=float(real.std()),
                   real_below_zero_state=float((real < zero).mean()))
    return out


@torch.no_grad()
def _unpadded_predictions(model: BiGRUClassifier, part: dict, condition: dict, cfg: MaskingConfig,
                          device: torch.device) -> np.ndarray:
    """The predictions on ``part`` with no pad at all: each review as if it were alone.

    An unpacked encoder reads the pads, so it runs on batches of reviews of one length. A packed encoder never reads
    them, so its states at real positions do not depend on the padding: it runs on length-sorted batches, and only
    the pooling and the classifier run per review, over its real states alone (the same predictions, far fewer
    small batches)."""
    model.eval()
    preds = np.zeros(len(part["labels"]), dtype=np.int64)
    side = _side(condition)
    if not model.encoder.packed:
        for index in _exact_length_batches(part["lengths"], cfg.eval_batch_size):
            ids, lengths, _ = _batch(part, index, side)
            with _autocast(device, condition["precision"]):
                logits, _ = model(ids.to(device), lengths.to(device))
            preds[index] = logits.float().argmax(-1).cpu().numpy()
        return preds
    order = np.argsort(part["lengths"], kind="stable")
    for start in range(0, len(order), cfg.eval_batch_size):
        index = order[start : start + cfg.eval_batch_size]
        ids, lengths, _ = _batch(part, index, side)
        ids, lengths = ids.to(device), lengths.to(device)
        with _autocast(device, condition["precision"]):
            states = model.encoder(model.embedding(ids), lengths)
            for row, length in enumerate(lengths.tolist()):
                real = states[row : row + 1, :length]
                pooled, _ = model.pooling(real, torch.ones(1, length, dtype=torch.bool, device=device))
                preds[index[row]] = int(model.classifier(pooled).float().argmax(-1))
    return preds


def _train(cfg: MaskingConfig, data: dict, condition: dict, seed: int, device: torch.device | str = "cpu"):
    """Train one model; returns it and ``(nan_steps, real tokens trained, batches seen, seconds)``."""
    device = torch.device(device)
    torch.set_num_threads(cfg.threads)
    seed_everything(seed)
    model = BiGRUClassifier(
        data["vocab_size"], cfg.embed_size, cfg.hidden_size, cfg.attention_size, pooling=condition["pooling"],
        masking=condition["masking"] if condition["pooling"] == "attention" else "neg_inf",
        packed=condition["rnn_input"] == "packed",
        padding_side=_side(condition)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=condition["precision"] == "fp16")
    train = data["train"]
    sampler = _sampler(condition["batching"], train["lengths"], cfg.batch_size, seed)
    side = _side(condition)
    nan_steps, tokens, batches_seen = 0, 0, []
    start = time.perf_counter()
    for epoch in range(cfg.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for index in sampler:
            ids, lengths, labels = (t.to(device) for t in _batch(train, index, side))
            with _autocast(device, condition["precision"]):
                logits, _ = model(ids, lengths)
            loss = F.cross_entropy(logits.float(), labels)
            if not torch.isfinite(loss):
                nan_steps += 1
                optimizer.zero_grad(set_to_none=True)
                continue
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            tokens += int(lengths.sum())
            batches_seen.append(list(index))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    train_time = time.perf_counter() - start
    return model, (nan_steps, tokens, batches_seen, train_time)


def train_model(cfg: MaskingConfig, data: dict, condition: dict, seed: int,
                device: torch.device | str = "cpu") -> BiGRUClassifier:
    """The model that :func:`run_one` trains for ``condition`` and ``seed`` (the same weights: same seed, same batches),
    in eval mode, for a chapter that looks inside it (chapter 5, section "The mechanism on a trained model")."""
    return _train(cfg, data, condition, seed, device)[0].eval()


@torch.no_grad()
def padding_sweep(model: BiGRUClassifier, part: dict, widths, *, batch_size: int = 200,
                  device: torch.device | str = "cpu") -> pd.DataFrame:
    """Re-pad every review of ``part`` to each width in ``widths`` and measure what the padding does to a trained
    model with a packed encoder (chapter 5, Eq. ``eq-pad-mass``; section "The mechanism on a trained model").

    A packed encoder's states at real positions do not depend on the padding and its pad states are 0, so a review
    padded to width ``W`` differs from the unpadded review only through the pooling: the pads take the weight
    ``pi`` and the pooled vector becomes ``(1 - pi) c`` (unmasked), or stays ``c`` (masked).

    Args:
        model: a :class:`attnbook.models.BiGRUClassifier` with a packed encoder and attention or mean pooling.
        part: a split from :func:`prepare_data` (``ids`` ``(n, max_len)``, ``lengths`` ``(n,)``, ``labels``).
        widths: batch widths in tokens, each at least the longest review of ``part``.
        batch_size: reviews per forward pass.

    Returns:
        One row per width (and a first row ``width = 0``: each review alone, no pad), with ``width``,
        ``pads`` (mean pads per review), ``pad_mass`` (mean ``pi``), ``norm_ratio`` (mean of
        ``||c_W|| / ||c_0||``), ``one_minus_pi`` (mean of ``1 - pi``), ``max_shrink_error`` (largest
        ``| ||c_W|| / ||c_0|| - (1 - pi) |`` over reviews) and ``flip_rate`` (share of reviews whose prediction
        differs from the unpadded one).

    Raises:
        ValueError: the encoder is not packed, or a width is shorter than a review.
    """
    if not model.encoder.packed:
        raise ValueError("padding_sweep needs a packed encoder (an unpacked one reads the pads)")
    lengths_all = part["lengths"]
    widths = [int(w) for w in widths]
    if widths and min(widths) < int(lengths_all.max()):
        raise ValueError(f"every width must be at least the longest review ({int(lengths_all.max())}), got {widths}")
    device = torch.device(device)
    model.eval()
    n = len(lengths_all)
    order = np.argsort(lengths_all, kind="stable")
    base_norm, base_pred = np.zeros(n), np.zeros(n, dtype=np.int64)
    per_width = {w: {k: np.zeros(n) for k in ("pi", "norm", "pred")} for w in widths}
    for start in range(0, n, batch_size):
        index = order[start : start + batch_size]
        ids, lengths, _ = _batch(part, index, "post")
        ids, lengths = ids.to(device), lengths.to(device)
        states = model.encoder(model.embedding(ids), lengths)      # (B, T, D): pad states are exactly 0
        for row, length in enumerate(lengths.tolist()):
            real = states[row : row + 1, :length]
            pooled, _ = model.pooling(real, torch.ones(1, length, dtype=torch.bool, device=device))
            base_norm[index[row]] = float(pooled.norm())
            base_pred[index[row]] = int(model.classifier(pooled).argmax(-1))
        for w in widths:
            padded = F.pad(states, (0, 0, 0, w - states.shape[1]))
            mask = padding_mask(lengths, w, "post")
            pooled, weights = model.pooling(padded, mask)
            logits = model.classifier(pooled)
            out = per_width[w]
            out["pi"][index] = (weights * ~mask).sum(-1).cpu().numpy()
            out["norm"][index] = pooled.norm(dim=-1).cpu().numpy()
            out["pred"][index] = logits.argmax(-1).cpu().numpy()
    rows = [{"width": 0, "pads": 0.0, "pad_mass": 0.0, "norm_ratio": 1.0, "one_minus_pi": 1.0,
             "max_shrink_error": 0.0, "flip_rate": 0.0}]
    for w in widths:
        out = per_width[w]
        ratio = out["norm"] / base_norm
        rows.append({"width": w, "pads": float((w - lengths_all).mean()), "pad_mass": float(out["pi"].mean()),
                     "norm_ratio": float(ratio.mean()), "one_minus_pi": float((1 - out["pi"]).mean()),
                     "max_shrink_error": float(np.abs(ratio - (1 - out["pi"])).max()),
                     "flip_rate": float((out["pred"] != base_pred).mean())})
    return pd.DataFrame(rows)


def run_one(cfg: MaskingConfig, data: dict, condition: dict, seed: int, device: torch.device | str = "cpu") -> dict:
    """Train one model under ``condition`` with ``seed`` and measure it; returns the row (factors, ``seed``,
    :data:`RESULT_COLUMNS`, ``device``).

    Measured: test and validation accuracy (the condition's batching; test reviews in a fixed order); ``pad_mass``,
    the mean attention weight on pad positions over test reviews; ``flip_rate_in``, the share of test reviews whose
    prediction changes between no padding at all (batches of reviews of one length) and padding to ``cfg.max_len``
    tokens, the widest batch of training (the flip test inside the training distribution); ``flip_rate``, the
    share whose prediction changes when the test batches are re-padded to ``cfg.repad_to`` tokens (twice the
    training maximum in the presets: a stress test outside the training distribution); ``nan_count``, non-finite training
    losses (their steps are skipped) plus test reviews with non-finite logits; the score of an all-zero state
    ``tanh(b) . u_w`` against the scores of real tokens (argument 1) and the mean score at pad positions;
    ``padding_fraction`` of the training batches and real ``tokens_per_s`` in training (argument 2); and
    ``train_time_s`` (seconds). Statistics that do not apply (e.g. scores without attention pooling) are NaN.
    """
    model, (nan_steps, tokens, batches_seen, train_time) = _train(cfg, data, condition, seed, device)
    device = torch.device(device)
    train = data["train"]
    val = _evaluate(model, data["validation"], condition, cfg, device)
    test = _evaluate(model, data["test"], condition, cfg, device)
    repadded = _evaluate(model, data["test"], condition, cfg, device, repad_to=cfg.repad_to)
    unpadded = _unpadded_predictions(model, data["test"], condition, cfg, device)
    at_max = _evaluate(model, data["test"], condition, cfg, device, repad_to=cfg.max_len)
    nan = float("nan")
    return {**condition, "seed": seed, "test_accuracy": test["accuracy"], "val_accuracy": val["accuracy"],
            "pad_mass": test["pad_mass"], "flip_rate": float((repadded["preds"] != test["preds"]).mean()),
            "nan_count": nan_steps + test["nan_count"], "zero_state_score": test.get("zero_state_score", nan),
            "pad_score_mean": test.get("pad_score_mean", nan), "real_score_mean": test.get("real_score_mean", nan),
            "real_score_std": test.get("real_score_std", nan),
            "real_below_zero_state": test.get("real_below_zero_state", nan),
            "padding_fraction": padding_fraction(train["lengths"], batches_seen) if batches_seen else nan,
            "tokens_per_s": tokens / train_time if train_time > 0 else nan, "train_time_s": train_time,
            "flip_rate_in": float((unpadded != at_max["preds"]).mean()), "device": describe_device(device)}


def _task(cfg: MaskingConfig, data: dict, condition: dict, seed: int, device: str) -> dict:
    """One run in a joblib worker, on :func:`_writable` copies of the arrays."""
    return run_one(cfg, _writable(data), condition, seed, device)


def _writable(data: dict) -> dict:
    """``data`` (from :func:`prepare_data`) with writable copies of its arrays. joblib hands large arrays to workers as
    read-only memory maps, which ``torch.from_numpy`` warns about; each run therefore works on its own copy (tens of
    MB, once per run). Entries of a part that are not arrays (texts, a vocabulary) are passed on as they are."""
    return {name: {k: np.array(v) if isinstance(v, np.ndarray) else v for k, v in part.items()}
            if isinstance(part, dict) else part for name, part in data.items()}


def run_grid(cfg: MaskingConfig, data: dict | None = None, *, workers: int = 1,
             out: str | Path | ResultsStore | None = None, device: torch.device | str | None = None,
             show_progress: bool = True, only: list[str] | None = None, on_run=None) -> pd.DataFrame:
    """Every (condition of ``cfg.grid``, seed of ``cfg.seeds``) run, seed by seed, as one DataFrame.

    Args:
        cfg: the configuration.
        data: from :func:`prepare_data` (loaded if None, and only if a run is left to do).
        workers: local processes (``joblib``, loky backend); 1 runs in this process. On a machine with several
            GPUs the runs are dealt out over them.
        out: a results store (:mod:`attnbook.store`): a ``.csv`` path, opened here under its lock with its
            provenance record ``<name>.json`` (one session per call), or an open :class:`~attnbook.store.ResultsStore`
            (the command line's). Runs already in it (same condition and seed) are skipped, and every finished run
            is appended at once, whole and fsynced, so that an interrupted grid resumes where it stopped.
        device: default :func:`attnbook.runtime.get_device`.
        show_progress: a progress bar over runs.
        only: run only the conditions of the grid with these :func:`condition_id` keys.
        on_run: called after each finished run (stored first) with a DataFrame of every run so far, stored and
            new; the command line uses it to checkpoint the provenance record.

    Returns:
        One row per run (:func:`run_one`), the stored ones included, sorted by condition and seed.

    Raises:
        attnbook.store.StoreError: ``out`` cannot be resumed (see :class:`~attnbook.store.ResultsStore`).
    """
    device = torch.device(device) if device is not None else get_device()
    if out is not None and not isinstance(out, ResultsStore):
        return run_grid_in_session(run_grid, open_store, cfg, data, out=out, device=device, workers=workers,
                                   only=only, show_progress=show_progress, on_run=on_run)
    store = out
    grid = [c for c in conditions(cfg.grid) if only is None or condition_id(c) in only]
    tasks = [(c, s) for s in cfg.seeds for c in grid
             if store is None or not store.has({**c, "seed": s, "device": str(device)})]
    if tasks and data is None:
        data = prepare_data(cfg)
    n_gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    devices = [f"cuda:{i % n_gpus}" if n_gpus > 1 else str(device) for i in range(len(tasks))]
    arguments = ((cfg, data, c, s, d) for (c, s), d in zip(tasks, devices))
    return collect_runs(_task, arguments, len(tasks), workers=workers, store=store, keys=_KEYS,
                        show_progress=show_progress, on_run=on_run)


def _columns() -> list[str]:
    """The header of a results file: the factors, ``seed``, :data:`RESULT_COLUMNS` and ``device``."""
    return [*_KEYS, *RESULT_COLUMNS, "device"]


#: The results store of this experiment (:mod:`attnbook.store`): a run is a (condition, seed); ``threads`` does not
#: change results, and ``seeds`` and ``grid`` only choose runs, so none of them counts as configuration.
LAYOUT = Layout("masking", keys=_KEYS, columns=tuple(_columns()), added_columns=ADDED_COLUMNS,
                not_configuration=("threads", "seeds", "grid"), legacy_config=LEGACY_CONFIG, kind_column="device")


def store_config(cfg: MaskingConfig) -> dict:
    """The configuration recorded with the runs and checked on resume (``cfg`` without ``extra``)."""
    return {k: v for k, v in asdict(cfg).items() if k != "extra"}


def open_store(out: str | Path, cfg: MaskingConfig, device: torch.device | str | None = None) -> ResultsStore:
    """Open the results store ``out`` for ``cfg`` (:class:`attnbook.store.ResultsStore`: lock, damaged tail, header
    and configuration checked; a file without :data:`ADDED_COLUMNS` is upgraded, NaN for its stored runs).

    Raises:
        attnbook.store.StoreError: see :class:`~attnbook.store.ResultsStore`.
    """
    return ResultsStore(out, LAYOUT, store_config(cfg), device=None if device is None else str(device)).open()


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """The command line (see the module docstring); writes ``--out`` and its provenance ``<name>.json``.

    An interrupted run (Ctrl-C, SIGTERM) records its session as interrupted and exits with 130 or 143."""
    parser = grid_parser("python -m attnbook.experiments.masking", __doc__.split("\n")[0], "results/masking_full.csv",
                         "comma-separated condition ids to run, e.g. attention/none/packed/random/fp32")
    parser.add_argument("--grid", choices=("chapter", "core", "full"), default=None, help="default: the mode's grid")
    parser.add_argument("--source", choices=("imdb", "rotten_tomatoes"), default=None)
    args = parser.parse_args(argv)
    cfg = MaskingConfig.for_mode(args.mode)
    changes = {k: v for k, v in dict(grid=args.grid, source=args.source, threads=args.threads).items() if v is not None}
    if args.seeds is not None:
        changes["seeds"] = tuple(range(args.seeds))
    cfg = replace(cfg, **changes)
    only = args.only.split(",") if args.only else None
    unknown = set(only or ()) - {condition_id(c) for c in conditions(cfg.grid)}
    if unknown:
        parser.error(f"--only names conditions that are not in the {cfg.grid!r} grid: {sorted(unknown)}")
    device = torch.device(args.device) if args.device else get_device()
    return run_grid_cli(parser, args, cfg, run_grid=run_grid, open_store=open_store, only=only, device=device,
                        extra=lambda frame: {"n_seeds_complete": _complete_seeds(frame, cfg, only)})


def _complete_seeds(frame: pd.DataFrame, cfg: MaskingConfig, only: list[str] | None = None) -> int:
    """How many seeds have a run in every condition of the grid, or of ``only`` if given (complete paired sets)."""
    if not len(frame):
        return 0
    wanted = set(only) if only else {condition_id(c) for c in conditions(cfg.grid)}
    per_seed = frame.assign(cid=frame.apply(condition_id, axis=1)).groupby("seed")["cid"].apply(set)
    return int(sum(wanted <= ids for ids in per_seed))


if __name__ == "__main__":  # pragma: no cover
    main()
