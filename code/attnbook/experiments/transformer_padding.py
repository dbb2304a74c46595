"""The padding experiments of chapter 8: chapter 5's padding questions asked again of a Transformer classifier.

Chapter 8, section "Padding in a Transformer classifier" (``chapters/08_self_attention_transformer``). One *run*
trains one :class:`attnbook.transformer.TransformerClassifier` on chapter 5's IMDB split (the data preparation of
:mod:`attnbook.experiments.masking`) under one *condition* with one *seed* and measures it. A seed fixes the
initialization and the data order (the batch sampler's seed), so runs with the same seed are paired across
conditions.

A condition is a dict of four factors:

- ``mask``: ``"masked"`` (a key padding mask in every self-attention; bool, True = a real token takes part, as in
  ``F.scaled_dot_product_attention``) or ``"none"`` (every position attends to the pads as to tokens);
- ``padding``: ``"post"`` (right padding: tokens, then pads) or ``"pre"`` (left padding);
- ``positions``: ``"index"`` (absolute positions = the array index, whatever the padding) or ``"first_token"``
  (counted from the first real token, :func:`attnbook.transformer.positions_from_mask`: the fix that generation
  libraries apply to left-padded batches);
- ``readout``: ``"mean"`` (masked mean pooling over the real tokens) or ``"first"`` (the encoder's output at the
  first real token; there is no ``[CLS]`` token).

The grid (:func:`conditions`) holds the five conditions that the comparisons of :data:`COMPARISONS` need, each
against the reference ``masked/post/index/mean``:

- the key padding mask against none (right padding, index positions, mean readout): ``none/post/index/mean``;
- left against right padding, both masked, index positions: ``masked/pre/index/mean``; and left padding with the
  positions counted from the first token: ``masked/pre/first_token/mean``;
- a first-token readout against masked mean pooling (masked, right padding): ``masked/post/index/first``.

:func:`compare_conditions` turns runs (live or stored) into one row per comparison, with the paired statistics of
:mod:`attnbook.stats` and a verdict word chosen from the data (:func:`attnbook.experiments.masking_report.verdict`).

From the command line (resumable: finished runs in ``--out`` are skipped, each finished run is appended at once)::

    python -m attnbook.experiments.transformer_padding --mode full --out results/transformer_padding_full.csv
    python -m attnbook.experiments.transformer_padding --mode quick --workers 2 --seeds 3 --out results/tp.csv
    python -m attnbook.experiments.transformer_padding --only masked/post/index/mean,none/post/index/mean

``--out`` is a results store (:mod:`attnbook.store`, the same as chapter 5's): one row per finished run, written
whole and fsynced; a damaged last line is set aside and its run made again; the header and the configuration are
checked on resume (``threads``, ``workers``, ``device``, ``seeds`` and ``only`` may change, nothing else); a second
process on the same ``--out`` is refused. Provenance (device, versions, commit, date, wall time) goes into every
row and into ``<name>.json``, one entry per session, written atomically and rewritten after every finished run;
Ctrl-C or SIGTERM end a session as ``"interrupted"`` (exit status 130 or 143). Runs made elsewhere (a GPU) join the
stored ones with ``python -m attnbook.store merge OTHER.csv results/transformer_padding_full.csv``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from ..batching import RandomBatchSampler
from ..models import padding_mask
from ..runtime import ModeConfig, describe_device, device_label, get_device, listing, plural, seed_everything
from ..store import Layout, ResultsStore, collect_runs, grid_parser, run_grid_cli, run_grid_in_session
from ..transformer import TransformerClassifier, pad_attention_mass
from . import masking as _masking
from .masking import _batch, _exact_length_batches, _writable
from .masking_report import CORRECTED, MIN_PAIRS, paired_table, runs_by_kind

__all__ = ["TransformerPaddingConfig", "conditions", "condition_id", "prepare_data", "train_model", "run_one",
           "run_grid", "open_store", "store_config", "main", "RESULT_COLUMNS", "LAYOUT", "FACTORS", "REFERENCE",
           "Comparison", "COMPARISONS", "compare_conditions", "answer_text", "condition_label", "results_table",
           "empty_row_word", "mha_empty_row_table"]

#: The factors of a condition, in the order of :func:`condition_id`.
FACTORS = ("mask", "padding", "positions", "readout")
#: The columns of one run's row, after the condition's factors and ``seed``.
RESULT_COLUMNS = ("test_accuracy", "val_accuracy", "pad_mass", "flip_rate_in", "nan_count", "tokens_per_s",
                  "train_time_s")
_KEYS = (*FACTORS, "seed")


@dataclass(frozen=True)
class TransformerPaddingConfig(ModeConfig):
    """Data, model and training of the Transformer padding experiments (quick: one busy CPU core; full: a few
    minutes a run on one CPU core, or a GPU).

    Sizes are in reviews and tokens; ``None`` means all of the split. The data fields (``source`` to
    ``normalize_apostrophes``) are those of :class:`attnbook.experiments.masking.MaskingConfig` and mean the same:
    :func:`prepare_data` is chapter 5's. ``lr`` is Adam's learning rate; ``dropout`` the encoder's.

    Both presets train without dropout: on a CPU, torch's fused attention kernel has no dropout, so attention dropout
    in training sends every self-attention to torch's unfused path (its own softmax and a Bernoulli mask per
    weight), which made a full-size training step about four times slower; one or two epochs of a small encoder do
    not need it.
    """

    source: str = "imdb"
    n_train: int | None = 4_000
    n_eval: int | None = 500
    max_len: int = 128
    vocab_size: int = 5_000
    d_model: int = 32
    nhead: int = 2
    num_layers: int = 1
    dim_feedforward: int = 64
    dropout: float = 0.0
    positional: str = "sinusoidal"
    batch_size: int = 32
    epochs: int = 1
    lr: float = 3e-3
    seeds: tuple[int, ...] = (0, 1)
    split_seed: int = 0
    eval_batch_size: int = 100
    threads: int = 1
    normalize_apostrophes: bool = True
    extra: dict = field(default_factory=dict)

    @classmethod
    def quick(cls) -> "TransformerPaddingConfig":
        """4,000 training reviews (500 validation, 500 test) cut to 128 tokens, a small encoder (d_model 32,
        1 layer, 2 heads, feed-forward 64), batch 32, 1 epoch, 2 seeds: a few seconds a run on one core, and about
        77% test accuracy with mean pooling.

        Why 1 epoch and 2 seeds: chapter 8 executes within its 150 s quick budget only so. Alone on this 2-core
        machine (2026-11-23) the chapter took 156 s with 2 epochs, 68 s of it training the translator; a second
        epoch here cost about 20 s (10 runs on two workers) and changed no mean-pooling accuracy by more than a
        point (0.767 and 0.768 for the reference condition, 2 seeds), and 3 seeds did not fit either."""
        return cls()

    @classmethod
    def full(cls) -> "TransformerPaddingConfig":
        """All reviews (chapter 5's 80/10/10 split) cut to 400 tokens, d_model 64, 2 layers, 4 heads, feed-forward
        256, batch 64, 1 epoch at learning rate 2e-3, 20 seeds: five to eight minutes a run on one CPU core of a
        2-core machine, depending on its load (``benchmarks/bench_transformer_padding.py`` times it)."""
        return cls(n_train=None, n_eval=None, max_len=400, vocab_size=20_000, d_model=64, nhead=4, num_layers=2,
                   dim_feedforward=256, batch_size=64, epochs=1, lr=2e-3, seeds=tuple(range(20)), eval_batch_size=50)


def conditions() -> list[dict]:
    """The five conditions of the grid (see the module docstring), as dicts with the keys of :data:`FACTORS`; the
    reference ``masked/post/index/mean`` comes first."""
    def c(mask="masked", padding="post", positions="index", readout="mean"):
        return dict(mask=mask, padding=padding, positions=positions, readout=readout)

    return [c(), c(mask="none"), c(padding="pre"), c(padding="pre", positions="first_token"), c(readout="first")]


def condition_id(condition: dict) -> str:
    """A readable key such as ``"masked/pre/first_token/mean"`` (mask/padding/positions/readout)."""
    return "/".join(str(condition[k]) for k in FACTORS)


#: The reference condition: masked, right padding, index positions, masked mean pooling.
REFERENCE = "masked/post/index/mean"


class Comparison(NamedTuple):
    """One paired comparison of :func:`compare_conditions`: ``condition`` against ``baseline`` (both
    :func:`condition_id` keys), over the seeds that ran both. ``primary``: decided by its interval alone, as
    :class:`attnbook.experiments.masking_report.Arm`; the others (all of this chapter's) are corrected for the
    family with Holm's method."""

    name: str
    question: str
    condition: str
    baseline: str
    primary: bool = False


#: The comparisons of chapter 8 (issue 20): the mask, left padding, the position fix (against left padding with
#: index positions, and against right padding, whose function it computes), and the readout.
COMPARISONS = (
    Comparison("mask", "key padding mask against none (right padding)", REFERENCE, "none/post/index/mean"),
    Comparison("left padding", "left against right padding, both masked, index positions",
               "masked/pre/index/mean", REFERENCE),
    Comparison("position fix", "left padding: positions from the first token against index positions",
               "masked/pre/first_token/mean", "masked/pre/index/mean"),
    Comparison("fixed left padding", "left padding with positions from the first token against right padding",
               "masked/pre/first_token/mean", REFERENCE),
    Comparison("first-token readout", "first-token readout against masked mean pooling (masked, right padding)",
               "masked/post/index/first", REFERENCE),
)

#: Per-side means reported by :func:`compare_conditions` (name in the table: column of a run).
_SIDES = {"pad_mass": "pad_mass", "flip": "flip_rate_in", "tokens_per_s": "tokens_per_s"}


def compare_conditions(frame: pd.DataFrame, comparisons: tuple[Comparison, ...] = COMPARISONS, *,
                       value: str = "test_accuracy", min_pairs: int = MIN_PAIRS, n_resamples: int = 9999,
                       seed: int = 0) -> pd.DataFrame:
    """One row per comparison: the paired change in ``value``, its statistics and a verdict word chosen from them.

    Args:
        frame: runs, one row each, with the columns of :data:`LAYOUT` (a live :func:`run_grid` result or a stored
            ``results/transformer_padding_full.csv`` read with pandas). Runs pair only with runs on the same kind
            of device (``device`` column: CPU or GPU); each comparison uses the kind with more paired seeds.
        comparisons: the comparisons (default :data:`COMPARISONS`).
        value: the compared result (accuracy is a fraction: a difference of 0.003 is 0.3 points).
        min_pairs: paired seeds needed for a verdict (:data:`attnbook.evidence.MIN_PAIRS`, the book's one rule).
        n_resamples, seed: of the bootstrap (:func:`attnbook.stats.bootstrap_ci`).

    Returns:
        Columns ``name, question, condition, baseline, primary`` (of the comparison), ``n_pairs, mean_baseline,
        mean_condition, mean_diff, ci_low, ci_high, n_better, n_worse, n_equal, p_value, p_holm, rank_biserial,
        verdict`` and, for each side (``_condition``, ``_baseline``), the means over the paired seeds of
        ``pad_mass``, ``flip`` (the flip rate inside the training distribution) and ``tokens_per_s``. ``verdict`` is
        :func:`attnbook.experiments.masking_report.verdict`: ``"higher"`` or ``"lower"`` (the bootstrap 95%
        interval excludes 0 and, for a comparison that is not ``primary``, Holm's corrected p-value stays below
        5%), ``"no difference resolved"`` (the interval includes 0), ``"not resolved after Holm's correction"`` or
        ``"not yet answered"`` (fewer than ``min_pairs`` seeds). Holm's correction runs over the answered
        comparisons that are not primary; a comparison with fewer than 2 paired seeds has NaN statistics.

    Raises:
        ValueError: ``frame`` lacks a factor, ``seed`` or ``value`` column, or a (condition, seed) run occurs twice
            on one kind of device.

    Chapter 8, section "Padding in a Transformer classifier"; the statistics are chapter 5's (section "Statistics
    for paired seeds").
    """
    frame = runs_by_kind(frame, FACTORS, condition_id, value)
    table = paired_table(frame, comparisons, _SIDES, value=value, min_pairs=min_pairs, n_resamples=n_resamples,
                         seed=seed).drop(columns=["condition", "baseline", "device_kind", "primary"])
    return pd.concat([pd.DataFrame([comp._asdict() for comp in comparisons]), table], axis=1)


def answer_text(answer: pd.DataFrame, min_pairs: int = MIN_PAIRS) -> str:
    """The answer of :func:`compare_conditions`'s table in plain sentences, for chapter 8's answer box.

    Each comparison that resolves a difference ("higher" or "lower") gets a sentence of its own, with its effect on
    test accuracy in points and the effect's 95% interval (a lowering is stated as a positive amount: "lowered test
    accuracy by 1.77 points (95% interval 0.95 to 2.82)"). The comparisons that resolve no difference share one
    sentence, those that fail the correction for several comparisons another, and those with fewer than
    ``min_pairs`` paired runs a third. The sentences name no statistical test and no seed: tallies, tests and
    corrections are for the evidence page. Chapter 8, section "The experiment".

    Raises:
        ValueError: ``answer`` has no rows.
    """
    if answer.empty:
        raise ValueError("answer is empty: there are no comparisons to state")
    sentences = []
    for row in answer[answer["verdict"].isin(["higher", "lower"])].itertuples():
        diff, low, high = 100 * row.mean_diff, 100 * row.ci_low, 100 * row.ci_high
        if row.verdict == "lower":
            diff, low, high = -diff, -high, -low
        word = "raised" if row.verdict == "higher" else "lowered"
        sentences.append(f"The {row.name} {word} test accuracy by {diff:.2f} points (95% interval {low:.2f} to "
                         f"{high:.2f}).")
    same = answer[answer["verdict"] == "no difference resolved"]
    if len(same):
        n_low, n_high = int(same["n_pairs"].min()), int(same["n_pairs"].max())
        runs = plural(n_low, "paired run") if n_low == n_high else f"{n_low} or more paired runs"
        sentences.append(f"With {runs}, no difference in test accuracy was resolved for the "
                         f"{listing(same['name'], 'or')}.")
    corrected = answer[answer["verdict"] == CORRECTED]
    if len(corrected):
        sentences.append(f"For the {listing(corrected['name'])}, the interval excludes zero, but the correction for "
                         "several comparisons does not confirm a difference.")
    waiting = answer[answer["verdict"] == "not yet answered"]
    if len(waiting):
        verb = "has" if len(waiting) == 1 else "have"
        sentences.append(f"The {listing(waiting['name'])} {verb} fewer than {min_pairs} paired runs, too few for "
                         "a verdict.")
    return " ".join(sentences)


def condition_label(condition) -> str:
    """A reader's name for a condition (a dict or row with the four :data:`FACTORS`), e.g. ``"mask, left padding,
    positions: from the mask"``. Chapter 8, section "The experiment"."""
    if condition["mask"] == "none":
        return "no mask, right padding"
    if condition["padding"] == "pre":
        where = "from the mask" if condition["positions"] == "first_token" else "array index"
        return f"mask, left padding, positions: {where}"
    return "mask, right padding" + (", first-token readout" if condition["readout"] == "first" else "")


def device_sentence(devices, n_runs: int, *, threads: int | None = None, workers: int | None = None,
                    machine: str | None = None) -> str:
    """The evidence page's sentence on where the full-scale padding runs ran (evidence for chapter 8).

    Args:
        devices: the distinct entries of the runs' ``device`` column, e.g. ``["CPU (1 threads, x86_64)"]``
            (written through :func:`attnbook.runtime.device_label`, so "1 threads" reads "1 thread").
        n_runs: how many runs (rows) there are.
        threads: torch threads per run (the record's ``config.threads``), or None if not recorded.
        workers: runs at a time (the record's ``workers``), or None if not recorded.
        machine: the record's own ``device`` entry, the threads of the process that wrote it; where it differs from
            the one per-run device, the sentence says why.

    Raises:
        ValueError: ``devices`` is empty, or ``n_runs`` is below 1.
    """
    devices = sorted({device_label(d) for d in devices})
    if not devices:
        raise ValueError("devices is empty: no run names its device")
    if n_runs < 1:
        raise ValueError(f"n_runs must be at least 1, got {n_runs}")
    if len(devices) > 1:
        return (f"The runs ran on {len(devices)} kinds of device ({listing(devices)}); runs pair only with runs "
                "on the same kind, and each comparison uses the kind with more pairs.")
    runs = "The one run" if n_runs == 1 else f"All {n_runs} runs"
    text = f"{runs} ran on one kind of device ({devices[0]}), so every pair is a pair on the same device."
    if machine is not None and device_label(machine) != devices[0] and threads and workers:
        text += (f" Each run used {plural(int(threads), 'thread')} and {plural(int(workers), 'run')} ran at a "
                 f"time; the table of how the runs were made gives the threads of the process that wrote the "
                 f"record, {device_label(machine)}.")
    return text


def results_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The plain results table of chapter 8's padding experiment: one row per condition (in :func:`conditions`'
    order, named by :func:`condition_label`), its mean test accuracy in percent with the 95% interval of the mean
    (:func:`attnbook.evidence.summary_table`), the mean share of test predictions that flip when only the batch's
    padding changes (``flip_rate_in``, in percent), and the number of runs.

    Args:
        runs: one row per run, with the :data:`FACTORS`, ``test_accuracy`` and ``flip_rate_in`` (fractions).

    Returns:
        Columns ``condition, test accuracy (%), 95% interval, predictions that flip (%), runs``.

    Raises:
        ValueError: a column is missing, or a condition of :func:`conditions` has no run.

    Chapter 8, section "The experiment".
    """
    from ..evidence import summary_table

    missing = sorted({*FACTORS, "test_accuracy", "flip_rate_in"} - set(runs.columns))
    if missing:
        raise ValueError(f"runs lacks the columns {missing}")
    names = runs.apply(condition_label, axis=1)
    order = [condition_label(c) for c in conditions()]
    table = summary_table(runs.assign(condition=names), "condition", "test_accuracy", scale=100, digits=1,
                          order=order)
    flips = (100 * runs.groupby(names)["flip_rate_in"].mean()).reindex(order)
    table.insert(3, "predictions that flip (%)", [f"{f:.1f}" if f else "0" for f in flips])
    return table.rename(columns={"mean": "test accuracy (%)"})


def empty_row_word(output: Tensor, bias: Tensor | None = None) -> str:
    """What the output of a query with no valid key is, in words: ``"NaN"``, ``"partly NaN"``, ``"zeros"``, ``"the
    output bias"`` (equal to ``bias``: an attention of zeros, then the output projection's bias) or ``"finite
    values"``. Chapter 8, section "What a fully padded row does"."""
    if torch.isnan(output).all():
        return "NaN"
    if torch.isnan(output).any():
        return "partly NaN"
    if (output == 0).all():
        return "zeros"
    if bias is not None and torch.equal(output, bias.expand_as(output)):
        return "the output bias"
    return "finite values"


def mha_empty_row_table(d_model: int = 8, nhead: int = 2, seed: int = 0) -> pd.DataFrame:
    """What ``nn.MultiheadAttention`` (the installed torch) returns for a query whose every key is masked, by mode and
    ``need_weights``: a batch of two rows of three tokens, the second all pads (``key_padding_mask`` True = ignored).

    Args:
        d_model, nhead: the module's sizes (float64). seed: of the weights (``out_proj`` gets a nonzero bias) and
            inputs.

    Returns:
        A DataFrame indexed by mode (``"training"``, ``"eval"``, ``"eval, no_grad (fast path)"``) with columns
        ``need_weights=True`` and ``need_weights=False``; each cell is :func:`empty_row_word` of the empty row's
        output. ``"the output bias"`` means the attention gave zeros (``F.scaled_dot_product_attention``'s result
        for an empty row since PyTorch 2.5) and ``out_proj`` added its bias; code that subtracts or zeroes the bias
        sees zeros there.

    Chapter 8, section "What a fully padded row does".
    """
    from torch import nn

    gen = torch.Generator().manual_seed(seed)
    mha = nn.MultiheadAttention(d_model, nhead, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for p in mha.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    x = torch.randn(2, 3, d_model, generator=gen, dtype=torch.float64)
    ignored = torch.tensor([[False, False, True], [True, True, True]])          # torch: True = ignored
    bias = mha.out_proj.bias.detach()
    rows = {}
    for mode, training, grad in (("training", True, True), ("eval", False, True),
                                 ("eval, no_grad (fast path)", False, False)):
        mha.train(training)
        with torch.set_grad_enabled(grad):
            rows[mode] = {f"need_weights={w}": empty_row_word(
                mha(x, x, x, key_padding_mask=ignored, need_weights=w)[0][1].detach(), bias) for w in (True, False)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "mode"
    return table


def prepare_data(cfg: TransformerPaddingConfig) -> dict:
    """Chapter 5's reviews: :func:`attnbook.experiments.masking.prepare_data` (load, deduplicate, split with
    ``cfg.split_seed``, vocabulary of the training split, encode). Returns ``{"vocab_size": int, "train": {...},
    "validation": {...}, "test": {...}}``, each part with ``ids`` int32 ``(n, max_len)`` right-padded with 0,
    ``lengths`` int64 ``(n,)`` and ``labels`` int64 ``(n,)``."""
    return _masking.prepare_data(cfg)


def _build(cfg: TransformerPaddingConfig, vocab_size: int, condition: dict) -> TransformerClassifier:
    return TransformerClassifier(vocab_size, 2, cfg.d_model, cfg.nhead, cfg.num_layers, cfg.dim_feedforward,
                                 cfg.dropout, positional=cfg.positional, max_len=cfg.max_len,
                                 masked=condition["mask"] == "masked", padding_side=condition["padding"],
                                 positions=condition["positions"], readout=condition["readout"])


def _in_order(n: int, batch_size: int) -> list[np.ndarray]:
    """The fixed evaluation order: consecutive batches of ``0 .. n - 1``."""
    return [np.arange(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


@torch.no_grad()
def _evaluate(model: TransformerClassifier, part: dict, cfg: TransformerPaddingConfig, device: torch.device, *,
              length: int | None = None, attention: bool = False) -> dict:
    """Predictions on ``part`` in a fixed order, each batch padded on the model's side to its longest review (or to
    ``length``); with ``attention``, the mean attention mass on pads per review (over layers and heads), and the
    number of reviews with non-finite logits."""
    model.eval()
    n = len(part["labels"])
    preds, pad_mass, nan_count = np.zeros(n, dtype=np.int64), np.zeros(n), 0
    for index in _in_order(n, cfg.eval_batch_size):
        ids, lengths, _ = _batch(part, index, model.padding_side, length)
        ids, lengths = ids.to(device), lengths.to(device)
        logits, weights = model(ids, lengths, return_attention=attention)
        logits = logits.float()
        nan_count += int((~torch.isfinite(logits)).any(-1).sum())
        preds[index] = logits.argmax(-1).cpu().numpy()
        if attention:
            real = padding_mask(lengths, ids.shape[1], model.padding_side)
            pad_mass[index] = pad_attention_mass(weights.float(), real).mean((1, 2)).cpu().numpy()
    return {"preds": preds, "accuracy": float((preds == part["labels"]).mean()), "pad_mass": float(pad_mass.mean()),
            "nan_count": nan_count}


@torch.no_grad()
def _unpadded_predictions(model: TransformerClassifier, part: dict, cfg: TransformerPaddingConfig,
                          device: torch.device) -> np.ndarray:
    """The predictions on ``part`` with no pad at all: batches of reviews of one length
    (:func:`attnbook.experiments.masking._exact_length_batches`)."""
    model.eval()
    preds = np.zeros(len(part["labels"]), dtype=np.int64)
    for index in _exact_length_batches(part["lengths"], cfg.eval_batch_size):
        ids, lengths, _ = _batch(part, index, model.padding_side)
        logits, _ = model(ids.to(device), lengths.to(device))
        preds[index] = logits.float().argmax(-1).cpu().numpy()
    return preds


def _check_condition(condition: dict) -> None:
    allowed = dict(mask=("masked", "none"), padding=("post", "pre"), positions=("index", "first_token"),
                   readout=("first", "mean"))
    if not isinstance(condition, dict) or set(condition) != set(FACTORS):
        raise ValueError(f"condition must be a dict with the keys {list(FACTORS)}, got {condition!r}")
    for key, values in allowed.items():
        if condition[key] not in values:
            raise ValueError(f"condition[{key!r}] must be one of {list(values)}, got {condition[key]!r}")


def train_model(model: torch.nn.Module, cfg: TransformerPaddingConfig, batches, device: torch.device,
                forward=None) -> tuple[int, int, float]:
    """The training loop of the Transformer classifiers of chapters 8 and 9: Adam (``cfg.lr``), cross-entropy,
    ``cfg.epochs`` epochs, the model in training mode.

    Args:
        model: the model (its parameters are trained).
        cfg: the configuration (``lr``, ``epochs``).
        batches: ``batches(epoch)`` yields one epoch's ``(inputs, labels, n_tokens)``: ``inputs`` a tuple of tensors
            for ``forward``, ``labels`` int64 ``(N,)`` (one per output row of ``forward``), ``n_tokens`` the number
            of real (non-pad) tokens of the step. Preparing a batch counts as training time.
        device: where ``inputs`` and ``labels`` are moved.
        forward: ``forward(*inputs) -> (logits (N, classes), anything)``; ``None`` = ``model``.

    Returns:
        ``(nan_steps, tokens, train_time_s)``: the steps skipped for a non-finite loss, the real tokens of the other
        steps, and the wall time of the loop (after ``torch.cuda.synchronize`` on a GPU).

    Chapter 8, section "Padding in a Transformer classifier"; chapter 9, section "Packing instead of padding".
    """
    forward = model if forward is None else forward
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    nan_steps, tokens = 0, 0
    start = time.perf_counter()
    for epoch in range(cfg.epochs):
        model.train()
        for inputs, labels, n_tokens in batches(epoch):
            inputs = tuple(t.to(device) for t in inputs)
            logits, _ = forward(*inputs)
            loss = F.cross_entropy(logits.float(), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                nan_steps += 1
                continue
            loss.backward()
            optimizer.step()
            tokens += n_tokens
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return nan_steps, tokens, time.perf_counter() - start


def run_one(cfg: TransformerPaddingConfig, data: dict, condition: dict, seed: int,
            device: torch.device | str = "cpu") -> dict:
    """Train one model under ``condition`` with ``seed`` and measure it; returns the row (the factors, ``seed``,
    :data:`RESULT_COLUMNS`, ``device``).

    Training: Adam (``cfg.lr``), cross-entropy, ``cfg.epochs`` epochs of random batches
    (:class:`attnbook.batching.RandomBatchSampler` seeded with ``seed``), each padded on the condition's side to its
    longest review. ``seed_everything(seed)`` comes before the model is built, so a seed gives every condition the
    same initialization (the parameters do not depend on the condition) and the same data order.

    Measured (as in chapter 5 where they apply): ``test_accuracy`` and ``val_accuracy`` (fixed order); ``pad_mass``,
    the attention weight that real queries put on pad keys (:func:`attnbook.transformer.pad_attention_mass`), mean
    over layers, heads and test reviews: 0 under a key padding mask; ``flip_rate_in``, the share of test reviews
    whose prediction changes between no padding at all (batches of reviews of one length) and padding to
    ``cfg.max_len`` tokens on the condition's side (the widest batch of training: the flip test inside the training
    distribution); ``nan_count``, non-finite training losses (their steps are skipped) plus test reviews with
    non-finite logits; ``tokens_per_s``, real (non-pad) training tokens per second of training; ``train_time_s``.

    Raises:
        ValueError: a condition without the keys of :data:`FACTORS` or with an unknown value.
    """
    _check_condition(condition)
    device = torch.device(device)
    torch.set_num_threads(cfg.threads)
    seed_everything(seed)
    model = _build(cfg, data["vocab_size"], condition).to(device)
    train = data["train"]
    sampler = RandomBatchSampler(train["lengths"], cfg.batch_size, shuffle=True, seed=seed)
    side = condition["padding"]

    def batches(epoch: int):
        sampler.set_epoch(epoch)
        for index in sampler:
            ids, lengths, labels = _batch(train, index, side)
            yield (ids, lengths), labels, int(lengths.sum())

    nan_steps, tokens, train_time = train_model(model, cfg, batches, device)
    val = _evaluate(model, data["validation"], cfg, device)
    test = _evaluate(model, data["test"], cfg, device, attention=True)
    at_max = _evaluate(model, data["test"], cfg, device, length=cfg.max_len)
    unpadded = _unpadded_predictions(model, data["test"], cfg, device)
    return {**condition, "seed": seed, "test_accuracy": test["accuracy"], "val_accuracy": val["accuracy"],
            "pad_mass": test["pad_mass"], "flip_rate_in": float((unpadded != at_max["preds"]).mean()),
            "nan_count": nan_steps + test["nan_count"],
            "tokens_per_s": tokens / train_time if train_time > 0 else float("nan"), "train_time_s": train_time,
            "device": describe_device(device)}


def _task(cfg: TransformerPaddingConfig, data: dict, condition: dict, seed: int, device: str) -> dict:
    """One run in a joblib worker, on writable copies of the (memory-mapped, read-only) arrays."""
    return run_one(cfg, _writable(data), condition, seed, device)


def run_grid(cfg: TransformerPaddingConfig, data: dict | None = None, *, workers: int = 1,
             out: str | Path | ResultsStore | None = None, device: torch.device | str | None = None,
             show_progress: bool = True, only: list[str] | None = None, on_run=None) -> pd.DataFrame:
    """Every (condition, seed of ``cfg.seeds``) run, seed by seed, as one DataFrame.

    Args:
        cfg: the configuration.
        data: from :func:`prepare_data` (loaded if None, and only if a run is left to do).
        workers: local processes (``joblib``, loky backend); 1 runs in this process. On a machine with several
            GPUs the runs are dealt out over them.
        out: a results store (:mod:`attnbook.store`): a ``.csv`` path, opened here under its lock with its
            provenance record ``<name>.json`` (one session per call), or an open
            :class:`~attnbook.store.ResultsStore`. Runs already in it (same condition and seed) are skipped; every
            finished run is appended at once, whole and fsynced.
        device: default :func:`attnbook.runtime.get_device`.
        show_progress: a progress bar over runs.
        only: run only the conditions with these :func:`condition_id` keys.
        on_run: called after each finished run (stored first) with a DataFrame of every run so far.

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
    grid = [c for c in conditions() if only is None or condition_id(c) in only]
    tasks = [(c, s) for s in cfg.seeds for c in grid if store is None or not store.has({**c, "seed": s})]
    if tasks and data is None:
        data = prepare_data(cfg)
    n_gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    devices = [f"cuda:{i % n_gpus}" if n_gpus > 1 else str(device) for i in range(len(tasks))]
    arguments = ((cfg, data, c, s, d) for (c, s), d in zip(tasks, devices))
    return collect_runs(_task, arguments, len(tasks), workers=workers, store=store, keys=_KEYS,
                        show_progress=show_progress, on_run=on_run)


#: The results store of this experiment (:mod:`attnbook.store`): a run is a (condition, seed); ``threads`` does not
#: change results and ``seeds`` only chooses runs, so neither counts as configuration.
LAYOUT = Layout("transformer_padding", keys=_KEYS, columns=(*_KEYS, *RESULT_COLUMNS, "device"),
                not_configuration=("threads", "seeds"), kind_column="device")


def store_config(cfg: TransformerPaddingConfig) -> dict:
    """The configuration recorded with the runs and checked on resume (``cfg`` without ``extra``)."""
    return {k: v for k, v in asdict(cfg).items() if k != "extra"}


def open_store(out: str | Path, cfg: TransformerPaddingConfig,
               device: torch.device | str | None = None) -> ResultsStore:
    """Open the results store ``out`` for ``cfg`` (:class:`attnbook.store.ResultsStore`: lock, damaged tail, header
    and configuration checked). A run's kind of device is part of its identity (:attr:`LAYOUT.kind_column
    <attnbook.store.Layout.kind_column>`), so ``device`` says which kind of runs :meth:`~attnbook.store.ResultsStore.has`
    asks about: a GPU run does not stand in for its CPU twin, nor the other way round.

    Raises:
        attnbook.store.StoreError: see :class:`~attnbook.store.ResultsStore`.
    """
    return ResultsStore(out, LAYOUT, store_config(cfg), device=None if device is None else str(device)).open()


def _complete_seeds(frame: pd.DataFrame, only: list[str] | None = None) -> int:
    """How many seeds have a run in every condition (or in every one of ``only``): complete paired sets."""
    if not len(frame):
        return 0
    wanted = set(only) if only else {condition_id(c) for c in conditions()}
    per_seed = frame.assign(cid=frame.apply(condition_id, axis=1)).groupby("seed")["cid"].apply(set)
    return int(sum(wanted <= ids for ids in per_seed))


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """The command line (see the module docstring); writes ``--out`` and its provenance ``<name>.json``.

    The arguments and the store are checked before any data are loaded. An interrupted run (Ctrl-C, SIGTERM)
    records its session as interrupted and exits with 130 or 143."""
    parser = grid_parser("python -m attnbook.experiments.transformer_padding", __doc__.split("\n")[0],
                         "results/transformer_padding_full.csv",
                         "comma-separated condition ids to run, e.g. masked/post/index/mean,none/post/index/mean")
    parser.add_argument("--source", choices=("imdb", "rotten_tomatoes"), default=None)
    args = parser.parse_args(argv)
    cfg = TransformerPaddingConfig.for_mode(args.mode)
    changes = {k: v for k, v in dict(source=args.source, threads=args.threads).items() if v is not None}
    if args.seeds is not None:
        changes["seeds"] = tuple(range(args.seeds))
    cfg = replace(cfg, **changes)
    only = args.only.split(",") if args.only else None
    unknown = set(only or ()) - {condition_id(c) for c in conditions()}
    if unknown:
        parser.error(f"--only names conditions that are not in the grid: {sorted(unknown)}; the grid is "
                     f"{[condition_id(c) for c in conditions()]}")
    device = torch.device(args.device) if args.device else get_device()
    return run_grid_cli(parser, args, cfg, run_grid=run_grid, open_store=open_store, only=only, device=device,
                        extra=lambda frame: {"n_seeds_complete": _complete_seeds(frame, only)})


if __name__ == "__main__":  # pragma: no cover
    main()
