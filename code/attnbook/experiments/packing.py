"""The packing experiment of chapter 9: chapter 8's IMDB Transformer classifier trained on packed rows or on padded
batches.

Chapter 9, section "Packing instead of padding" (issue 21, section 3). One *run* trains one
:class:`attnbook.transformer.TransformerClassifier` (masked, right padding, index positions, masked mean readout:
chapter 8's reference, :func:`attnbook.experiments.transformer_padding._build`) on chapter 5's IMDB split
(:func:`attnbook.experiments.transformer_padding.prepare_data`) with chapter 8's training loop
(:func:`attnbook.experiments.transformer_padding.train_model`), under one *condition* with one *seed*. A seed fixes
the initialization (the same for every condition) and the data order, so runs with the same seed are paired.

The conditions (:data:`CONDITIONS`):

- ``padded/random``: random batches of ``batch_size`` reviews (:class:`attnbook.batching.RandomBatchSampler`), each
  right-padded to its longest review, a key padding mask (chapter 8's reference);
- ``padded/bucketed``: batches of reviews of similar length (:class:`attnbook.batching.BucketBatchSampler`, pools of
  50 batches), padded the same way;
- ``packed``: the *same* random batches as ``padded/random`` (same sampler, same seed: the same reviews in the same
  step), each packed by first-fit decreasing (:func:`attnbook.batching.pack_documents`) into rows of at most
  ``max_len`` tokens, with the block-diagonal document mask, positions restarting in every review and a mean over
  each review's own tokens (:meth:`~attnbook.transformer.TransformerClassifier.forward_packed`). Packing each random
  batch, rather than the whole epoch, keeps the optimization identical to ``padded/random``: in exact arithmetic the
  two compute the same losses and gradients, so only the layout (and the speed) differs, and an accuracy difference
  beyond floating-point noise would be a bug (cross-contamination).

Measured per run: ``test_accuracy`` and ``val_accuracy`` (each condition read in its own layout: padded conditions in
padded batches, ``packed`` in packed rows, fixed order); ``layout_logit_diff``, the largest absolute difference of the
trained model's test logits between packed rows and padded batches (fp32 rounding only, if no review attends to
another); ``pad_fraction``, the share of pad slots among the token slots of training (``1 - real / (rows x width)``);
``tokens_per_s``, real (non-pad) training tokens per second of training; ``train_time_s``; ``nan_count``.

From the command line (resumable, as chapter 8's; see :mod:`attnbook.experiments.transformer_padding`)::

    python -m attnbook.experiments.packing --mode quick --seeds 2 --out /tmp/packing_quick.csv
    python -m attnbook.experiments.packing --mode full --workers 2 --out results/packing_full.csv

``--out`` is a results store (:mod:`attnbook.store`) with a run's kind of device as part of its identity
(``kind_column="device"``), provenance in ``<name>.json``; Ctrl-C or SIGTERM end a session as interrupted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..batching import BucketBatchSampler, RandomBatchSampler, pack_collate, pack_documents
from ..runtime import describe_device, get_device, seed_everything
from ..store import (Layout, ResultsStore, collect_runs, grid_arguments, grid_parser, run_grid_cli,
                     run_grid_in_session)
from ..transformer import TransformerClassifier
from .masking import _batch, _writable
from .masking_report import MIN_PAIRS, paired_table, runs_by_kind
from .transformer_padding import (REFERENCE, Comparison, TransformerPaddingConfig, _build, _evaluate, _in_order,
                                  prepare_data, train_model)

__all__ = ["PackingConfig", "CONDITIONS", "conditions", "condition_id", "FACTORS", "RESULT_COLUMNS", "LAYOUT",
           "COMPARISONS", "epoch_batches", "run_one", "run_grid", "open_store", "store_config", "compare_conditions",
           "main", "prepare_data"]

#: The conditions, ``padded/random`` (the baseline) first.
CONDITIONS = ("padded/random", "padded/bucketed", "packed")
#: A condition is a dict with this one key.
FACTORS = ("condition",)
#: The columns of one run's row, after ``condition`` and ``seed``.
RESULT_COLUMNS = ("test_accuracy", "val_accuracy", "layout_logit_diff", "pad_fraction", "nan_count", "tokens_per_s",
                  "train_time_s")
_KEYS = (*FACTORS, "seed")
#: Chapter 8's reference classifier, the model of every condition.
_MODEL = dict(zip(("mask", "padding", "positions", "readout"), REFERENCE.split("/")))


@dataclass(frozen=True)
class PackingConfig(TransformerPaddingConfig):
    """Data, model and training of the packing experiment: the fields of
    :class:`~attnbook.experiments.transformer_padding.TransformerPaddingConfig`, with other quick sizes. ``max_len``
    is both the longest review (longer ones are cut when encoded) and the width of a packed row."""

    @classmethod
    def quick(cls) -> "PackingConfig":
        """2,000 training reviews (500 validation, 500 test) cut to 256 tokens (not chapter 8's 128: at 128 most
        IMDB reviews are cut to the same length and there is little padding to save), chapter 8's small encoder
        (d_model 32, 1 layer, 2 heads, feed-forward 64), batch 32, 1 epoch, 2 seeds."""
        return cls(n_train=2_000, max_len=256, epochs=1, seeds=(0, 1))

    @classmethod
    def full(cls) -> "PackingConfig":
        """Chapter 8's full sizes (:meth:`TransformerPaddingConfig.full`): every review cut to 400 tokens, d_model
        64, 2 layers, 4 heads, batch 64, 1 epoch, 20 seeds."""
        full = TransformerPaddingConfig.full()
        return cls(**{f.name: getattr(full, f.name) for f in fields(full)})


def conditions() -> list[dict]:
    """The three conditions of :data:`CONDITIONS` as dicts ``{"condition": ...}``."""
    return [{"condition": c} for c in CONDITIONS]


def condition_id(condition: dict) -> str:
    """The condition's name, e.g. ``"packed"``."""
    return str(condition["condition"])


#: The paired comparisons of chapter 9.
COMPARISONS = (
    Comparison("packing", "packed rows against random padded batches (the same reviews per step)", "packed",
               "padded/random"),
    Comparison("packing against bucketing", "packed rows against bucketed padded batches", "packed",
               "padded/bucketed"),
    Comparison("bucketing", "bucketed against random padded batches", "padded/bucketed", "padded/random"),
)
_SIDES = {"tokens_per_s": "tokens_per_s", "pad_fraction": "pad_fraction"}


def _check_condition(condition: dict) -> str:
    if not isinstance(condition, dict) or set(condition) != set(FACTORS) or condition["condition"] not in CONDITIONS:
        raise ValueError(f"condition must be one of {[{'condition': c} for c in CONDITIONS]}, got {condition!r}")
    return condition["condition"]


def _packed_batch(part: dict, index, max_len: int):
    """The reviews ``index`` packed (first-fit decreasing) into rows of at most ``max_len`` tokens."""
    index = np.asarray(index)
    rows = pack_documents(part["lengths"][index], max_len)
    return pack_collate(torch.from_numpy(part["ids"]), torch.from_numpy(part["lengths"]),
                        [index[row].tolist() for row in rows])


def epoch_batches(part: dict, condition: dict, cfg: PackingConfig, seed: int, epoch: int):
    """One epoch of training batches of ``condition``: yields ``(inputs, labels, n_tokens, n_slots)``.

    ``inputs`` is ``(ids, lengths)`` for the padded conditions (right-padded to the batch's longest review) and
    ``(ids, doc_ids)`` for ``packed`` (rows of at most ``cfg.max_len`` tokens); ``labels`` int64, one per review in
    the order of the model's outputs; ``n_tokens`` the real tokens and ``n_slots`` the token slots (real + pad) of
    the batch. The sampler is seeded with ``seed`` and set to ``epoch``; ``padded/random`` and ``packed`` draw the
    same reviews in the same steps.

    Raises:
        ValueError: an unknown condition.
    """
    name = _check_condition(condition)
    sampler_class = BucketBatchSampler if name == "padded/bucketed" else RandomBatchSampler
    sampler = sampler_class(part["lengths"], cfg.batch_size, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    for index in sampler:
        if name == "packed":
            batch = _packed_batch(part, index, cfg.max_len)
            yield (batch.ids, batch.doc_ids), torch.from_numpy(part["labels"][batch.order.numpy()]), \
                int(batch.lengths.sum()), batch.ids.numel()
        else:
            ids, lengths, labels = _batch(part, index, "post")
            yield (ids, lengths), labels, int(lengths.sum()), ids.numel()


@torch.no_grad()
def _packed_logits(model: TransformerClassifier, part: dict, cfg: PackingConfig, device: torch.device) -> np.ndarray:
    """Logits of every review of ``part`` read in packed rows (fixed order, ``eval_batch_size`` reviews a batch)."""
    model.eval()
    logits = np.zeros((len(part["labels"]), model.classifier.out_features), dtype=np.float64)
    for index in _in_order(len(part["labels"]), cfg.eval_batch_size):
        batch = _packed_batch(part, index, cfg.max_len)
        out, _ = model.forward_packed(batch.ids.to(device), batch.doc_ids.to(device))
        logits[batch.order.numpy()] = out.double().cpu().numpy()
    return logits


@torch.no_grad()
def _padded_logits(model: TransformerClassifier, part: dict, cfg: PackingConfig, device: torch.device) -> np.ndarray:
    """Logits of every review of ``part`` read in right-padded batches (fixed order)."""
    model.eval()
    logits = np.zeros((len(part["labels"]), model.classifier.out_features), dtype=np.float64)
    for index in _in_order(len(part["labels"]), cfg.eval_batch_size):
        ids, lengths, _ = _batch(part, index, "post")
        logits[index] = model(ids.to(device), lengths.to(device))[0].double().cpu().numpy()
    return logits


def run_one(cfg: PackingConfig, data: dict, condition: dict, seed: int, device: torch.device | str = "cpu") -> dict:
    """Train one model under ``condition`` with ``seed`` and measure it; returns the row (``condition``, ``seed``,
    :data:`RESULT_COLUMNS`, ``device``). See the module docstring for what is measured.

    Raises:
        ValueError: an unknown condition.
    """
    name = _check_condition(condition)
    device = torch.device(device)
    torch.set_num_threads(cfg.threads)
    seed_everything(seed)
    model = _build(cfg, data["vocab_size"], _MODEL).to(device)
    slots = [0]

    def batches(epoch: int):
        for inputs, labels, n_tokens, n_slots in epoch_batches(data["train"], condition, cfg, seed, epoch):
            slots[0] += n_slots
            yield inputs, labels, n_tokens

    forward = model.forward_packed if name == "packed" else model
    nan_steps, tokens, train_time = train_model(model, cfg, batches, device, forward)
    test = data["test"]
    packed_logits, padded_logits = _packed_logits(model, test, cfg, device), _padded_logits(model, test, cfg, device)
    test_logits = packed_logits if name == "packed" else padded_logits
    if name == "packed":
        val_preds = _packed_logits(model, data["validation"], cfg, device).argmax(-1)
        val_accuracy = float((val_preds == data["validation"]["labels"]).mean())
    else:
        val_accuracy = _evaluate(model, data["validation"], cfg, device)["accuracy"]
    return {"condition": name, "seed": seed,
            "test_accuracy": float((test_logits.argmax(-1) == test["labels"]).mean()),
            "val_accuracy": val_accuracy,
            "layout_logit_diff": float(np.abs(packed_logits - padded_logits).max()),
            "pad_fraction": 1 - tokens / slots[0] if slots[0] else float("nan"),
            "nan_count": nan_steps + int((~np.isfinite(test_logits)).any(-1).sum()),
            "tokens_per_s": tokens / train_time if train_time > 0 else float("nan"), "train_time_s": train_time,
            "device": describe_device(device)}


def _task(cfg: PackingConfig, data: dict, condition: dict, seed: int, device: str) -> dict:
    """One run in a joblib worker, on writable copies of the (memory-mapped, read-only) arrays."""
    return run_one(cfg, _writable(data), condition, seed, device)


#: The results store of this experiment (:mod:`attnbook.store`): a run is a (condition, seed) on a kind of device.
LAYOUT = Layout("packing", keys=_KEYS, columns=(*_KEYS, *RESULT_COLUMNS, "device"),
                not_configuration=("threads", "seeds"), kind_column="device")


def store_config(cfg: PackingConfig) -> dict:
    """The configuration recorded with the runs and checked on resume (``cfg`` without ``extra``)."""
    return {k: v for k, v in asdict(cfg).items() if k != "extra"}


def open_store(out: str | Path, cfg: PackingConfig, device: torch.device | str | None = None) -> ResultsStore:
    """Open the results store ``out`` for ``cfg`` (:class:`attnbook.store.ResultsStore`; ``device`` says which kind
    of runs :meth:`~attnbook.store.ResultsStore.has` asks about, as in chapter 8's store).

    Raises:
        attnbook.store.StoreError: see :class:`~attnbook.store.ResultsStore`.
    """
    return ResultsStore(out, LAYOUT, store_config(cfg), device=None if device is None else str(device)).open()


def run_grid(cfg: PackingConfig, data: dict | None = None, *, workers: int = 1,
             out: str | Path | ResultsStore | None = None, device: torch.device | str | None = None,
             show_progress: bool = True, only: list[str] | None = None, on_run=None) -> pd.DataFrame:
    """Every (condition, seed of ``cfg.seeds``) run, seed by seed, as one DataFrame sorted by condition and seed;
    the arguments are those of :func:`attnbook.experiments.transformer_padding.run_grid` (``out`` a results store:
    runs already in it are skipped, each finished run is appended at once; ``only``: condition names).

    Raises:
        attnbook.store.StoreError: ``out`` cannot be resumed.
    """
    device = torch.device(device) if device is not None else get_device()
    if out is not None and not isinstance(out, ResultsStore):
        return run_grid_in_session(run_grid, open_store, cfg, data, out=out, device=device, workers=workers,
                                   only=only, show_progress=show_progress, on_run=on_run)
    store = out
    grid = [c for c in conditions() if only is None or condition_id(c) in only]
    tasks = [(c, s) for s in cfg.seeds for c in grid if store is None or not store.has({**c, "seed": s})]
    if tasks and data is None:
        data = prepare_data(cfg)
    arguments = ((cfg, data, c, s, str(device)) for c, s in tasks)
    return collect_runs(_task, arguments, len(tasks), workers=workers, store=store, keys=_KEYS,
                        show_progress=show_progress, on_run=on_run)


def compare_conditions(frame: pd.DataFrame, comparisons: tuple[Comparison, ...] = COMPARISONS, *,
                       value: str = "test_accuracy", min_pairs: int = MIN_PAIRS, n_resamples: int = 9999,
                       seed: int = 0) -> pd.DataFrame:
    """One row per comparison: the paired change in ``value`` (``"test_accuracy"`` or ``"tokens_per_s"``...), its
    statistics and a verdict word chosen from them, as
    :func:`attnbook.experiments.transformer_padding.compare_conditions` (same columns; the per-side means are of
    ``tokens_per_s`` and ``pad_fraction``).

    Raises:
        ValueError: ``frame`` lacks ``condition``, ``seed`` or ``value``, or a (condition, seed) run occurs twice on
            one kind of device.

    Chapter 9, section "Packing instead of padding"; the statistics are chapter 5's.
    """
    frame = runs_by_kind(frame, FACTORS, condition_id, value)
    table = paired_table(frame, comparisons, _SIDES, value=value, min_pairs=min_pairs, n_resamples=n_resamples,
                         seed=seed).drop(columns=["condition", "baseline", "device_kind", "primary"])
    return pd.concat([pd.DataFrame([comp._asdict() for comp in comparisons]), table], axis=1)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """The command line (see the module docstring); writes ``--out`` and its provenance ``<name>.json``. The
    arguments and the store are checked before any data are loaded."""
    parser = grid_parser("python -m attnbook.experiments.packing", __doc__.split("\n")[0], "results/packing_full.csv",
                         f"comma-separated conditions of {list(CONDITIONS)}")
    args = parser.parse_args(argv)
    cfg, only, device = grid_arguments(parser, args, PackingConfig.for_mode(args.mode), CONDITIONS)
    return run_grid_cli(parser, args, cfg, run_grid=run_grid, open_store=open_store, only=only, device=device)


if __name__ == "__main__":  # pragma: no cover
    main()


# ----------------------------------------------------------------------------------------------- a language model
#: The ways :func:`lm_packing_check` computes one optimizer step's loss, in the order of its table.
LM_RECIPES = (
    "each document alone",
    "packed: the whole recipe",
    "one causal mask across the row",
    "positions that do not restart",
    "no -100 at document starts",
    "mean of the micro-batches' means",
)


def lm_packing_check(lengths: tuple[tuple[int, ...], ...] = ((5, 3, 4), (6, 2), (9,)), width: int = 12, *,
                     vocab: int = 20, seed: int = 0) -> pd.DataFrame:
    """Chapter 9's check of causal packing for language-model training, on chapter 8's decoder-only model with
    random weights (fp64, sinusoidal positions): one optimizer step over packed rows, one row per micro-batch.

    Args:
        lengths: the documents' lengths in each packed row (each row's total at most ``width``).
        width: the packed rows' length (pads at the end).
        vocab: token ids ``1 .. vocab - 1`` (0 = pad).
        seed: of the weights and the tokens.

    Returns:
        One row per :data:`LM_RECIPES` entry: ``recipe``, ``targets`` (tokens predicted in the step), ``loss``
        (mean next-token cross-entropy over the step), ``loss_gap`` (its distance to each document alone) and
        ``grad_gap`` (the largest difference of any parameter's gradient from each document alone). The reference
        runs every document alone through the model's ordinary forward and torch's ``F.cross_entropy``; the packed
        recipe uses :func:`attnbook.packing.packed_lm_logits`, :func:`attnbook.packing.lm_labels` and
        :func:`attnbook.packing.lm_loss` with the step's count of targets; each other row leaves one ingredient
        out.

    Raises:
        ValueError: a row longer than ``width``.

    Chapter 9, section "Packing for a language model".
    """
    import torch.nn.functional as F

    from ..batching import document_ids
    from ..generation import DecoderOnlyLM
    from ..packing import IGNORE_INDEX, count_targets, document_causal_mask, lm_labels, lm_loss, packed_lm_logits

    if any(sum(row) > width for row in lengths):
        raise ValueError(f"every row of lengths must fit in width={width}, got {lengths}")
    torch.manual_seed(seed)
    model = DecoderOnlyLM(vocab, d_model=16, nhead=2, num_layers=2, dim_feedforward=32).double()
    doc = document_ids([list(row) for row in lengths], width)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, doc.shape, generator=g).masked_fill(doc < 0, 0)
    docs = [ids[b][doc[b] == d] for b in range(len(doc)) for d in range(int(doc[b].max()) + 1)]
    labels = lm_labels(ids, doc)
    n_targets = count_targets(labels)
    index_positions = torch.arange(width).expand(doc.shape)
    rows = range(len(doc))

    def no_restart(b):
        x = model.embedding(ids[b : b + 1], index_positions[b : b + 1])
        return model.out(model.stack(x, self_mask=document_causal_mask(doc[b : b + 1])))

    def one_mask(b):
        return model(ids[b : b + 1], doc[b : b + 1] >= 0, index_positions[b : b + 1])

    def packed(b):
        return packed_lm_logits(model, ids[b : b + 1], doc[b : b + 1])

    naive_labels = ids.masked_fill(doc < 0, IGNORE_INDEX)                 # -100 at pads only
    recipes = {
        "each document alone": lambda: sum(F.cross_entropy(model(t[None])[0, :-1], t[1:], reduction="sum")
                                           for t in docs) / sum(len(t) - 1 for t in docs),
        "packed: the whole recipe": lambda: sum(lm_loss(packed(b), labels[b : b + 1], n_targets) for b in rows),
        "one causal mask across the row": lambda: sum(lm_loss(one_mask(b), labels[b : b + 1], n_targets)
                                                      for b in rows),
        "positions that do not restart": lambda: sum(lm_loss(no_restart(b), labels[b : b + 1], n_targets)
                                                     for b in rows),
        "no -100 at document starts": lambda: sum(lm_loss(packed(b), naive_labels[b : b + 1],
                                                          count_targets(naive_labels)) for b in rows),
        "mean of the micro-batches' means": lambda: sum(lm_loss(packed(b), labels[b : b + 1]) for b in rows)
                                                    / len(doc),
    }
    params = list(model.parameters())
    out, reference = [], None
    for name in LM_RECIPES:
        loss = recipes[name]()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        if reference is None:
            reference = (loss.detach(), grads)
        targets = count_targets(naive_labels) if name == "no -100 at document starts" else n_targets
        out.append({"recipe": name, "targets": targets, "loss": loss.item(),
                    "loss_gap": abs(loss.item() - reference[0].item()),
                    "grad_gap": max((g - r).abs().max().item() for g, r in zip(grads, reference[1]))})
    return pd.DataFrame(out)


__all__ += ["LM_RECIPES", "lm_packing_check"]
