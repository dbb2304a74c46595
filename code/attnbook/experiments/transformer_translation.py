"""Chapter 8's translator: a small Transformer against chapter 4's Bahdanau model, on chapter 4's data and split.

Explained in chapter 8, "Self-attention and the Transformer" (``chapters/08_self_attention_transformer``), section
"A Transformer translator". Both models read the English-Spanish Tatoeba pairs of chapter 4, split and encoded by
:func:`attnbook.data.translation.prepare_translation` with chapter 4's configuration (quick mode: chapter 4's quick
data exactly, 35,000 training pairs, the same split, vocabularies and test set, read from
:meth:`attnbook.experiments.seq2seq.Seq2SeqConfig.quick`), see the same batches in the same order
(:func:`attnbook.experiments.seq2seq.make_batches`, seeded by the run's seed and the epoch), are decoded by
:func:`attnbook.seq2seq.greedy_decode` and :func:`attnbook.seq2seq.beam_search` and scored with sacreBLEU on all
references (:func:`attnbook.experiments.seq2seq.corpus_bleu`). The models:

- ``"transformer"``: :class:`attnbook.transformer.Transformer` (pre-LN, sinusoidal positions), trained with Adam,
  a linear learning-rate warm-up (Vaswani et al. 2017, section 5.3, without their decay) and label smoothing
  (ibid., section 5.4);
- ``"bahdanau"``: chapter 4's GRU encoder-decoder with additive attention, trained by chapter 4's own
  :func:`attnbook.experiments.seq2seq.train_model` with :meth:`TranslationConfig.baseline_config` (in quick mode
  chapter 4's quick configuration itself), so a Bahdanau run here is chapter 4's run with the same seed.

A *run* is one model with one seed; the seed fixes the initialization and the batch order (the split is fixed by
``split_seed``), so runs with the same seed are paired across the two models. Configuration is
:class:`TranslationConfig` (``quick()`` for a 2-core CPU, ``full()`` for all pairs on a GPU); :func:`run_experiment`
returns plain data. The command line stores the runs with their provenance in a results store
(:mod:`attnbook.store`; resumable; ``--seeds`` and ``--models`` only choose runs)::

    python -m attnbook.experiments.transformer_translation --mode quick --models transformer --seeds 3 \
        --out results/transformer_translation_quick.csv
    python -m attnbook.experiments.transformer_translation --mode full --seeds 3 \
        --out results/transformer_translation_full.csv

which write the summary (one row per run), ``<name>_by_length.csv`` (BLEU and token accuracy per source-length
bucket), ``<name>_history.csv`` (losses per epoch) and the provenance ``<name>.json``. ``--epochs`` (both models),
``--n-train``, ``--n-valid``, ``--n-test`` and ``--threads`` override the configuration (recorded as ``overrides``
in the provenance); ``--checkpoint-dir DIR`` (and ``--checkpoint-minutes M``) save each run's training state after
every epoch (and every ``M`` minutes) and resume it exactly (:mod:`attnbook.checkpoint`; one file per run, model and
seed), as chapter 4's CLI does; ``tools/gpu_job.sh transformer_translation`` runs the full-size comparison this way
on a GPU (see the README). The quick store holds only the Transformer's runs: the quick Bahdanau runs are chapter
4's stored seeds (``results/seq2seq_quick.csv``), which :func:`comparison_runs` takes when their configuration is
:meth:`TranslationConfig.baseline_config`'s. :func:`compare_models` gives the paired verdict.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..checkpoint import Checkpointer, add_checkpoint_arguments, checkpoint_every_s, set_rng_states
from ..data.translation import TranslationData, prepare_translation
from ..runtime import ModeConfig, get_device, get_mode, plural, progress, seed_everything
from ..seq2seq import Decoded, Seq2Seq, make_seq2seq
from ..store import Layout, add_backend_arguments, csv_path, device_arg, positive_int
from ..text import PAD_ID, detokenize
from ..transformer import Transformer
from .seq2seq import (Seq2SeqConfig, StoredRuns, _mean_loss, corpus_bleu, gather_runs, held_out_sources,
                      length_bucket, make_batches, read_runs, stored_status, store_translation_runs,
                      token_accuracy, translate)
from .seq2seq import train_model as seq2seq_train_model

__all__ = ["MODELS", "VERDICTS", "TranslationConfig", "TranslationResults", "StoredRuns", "build_model",
           "train_model", "evaluate", "run_experiment", "read_runs", "comparison_runs", "compare_models",
           "verdict_phrase", "results_table", "main", "LAYOUT"]

#: The models of the comparison.
MODELS = ("transformer", "bahdanau")


#: Chapter 4's quick configuration: chapter 8's quick data and Bahdanau model are taken from it, not retyped.
_CH4 = Seq2SeqConfig.quick()

#: The fields of :class:`TranslationConfig` that are :class:`attnbook.experiments.seq2seq.Seq2SeqConfig`'s under
#: the same name (the data, batches, decoding and scoring); :meth:`TranslationConfig.baseline_config` adds the
#: Bahdanau model's (``baseline_*``, ``epochs`` from ``baseline_epochs``).
SHARED_FIELDS = ("max_src_len", "max_tgt_len", "n_train", "n_valid", "n_test", "min_freq", "max_src_vocab",
                 "max_tgt_vocab", "covered_only", "split_seed", "batch_size", "clip", "beam_size", "length_penalty",
                 "max_decode_len", "length_edges", "seeds", "num_threads", "embed_size", "hidden_size")


@dataclass(frozen=True)
class TranslationConfig(ModeConfig):
    """Everything that defines the runs of chapter 8's translation comparison.

    Data (as :func:`attnbook.data.translation.prepare_translation`; the defaults are chapter 4's quick values, read
    from :meth:`attnbook.experiments.seq2seq.Seq2SeqConfig.quick`): ``max_src_len``/``max_tgt_len`` (tokens),
    ``n_train`` (pairs), ``n_valid``/``n_test`` (source sentences, each with all its references), ``min_freq``,
    ``max_src_vocab``, ``max_tgt_vocab``, ``covered_only``, ``split_seed`` (the split and its subsampling, the same
    for every run). ``seeds``: the model seeds, one run per model and seed (a seed fixes the initialization and the
    batch order of both models, so runs are paired by seed).

    The Transformer: ``d_model``, ``nhead``, ``num_layers`` (encoder and decoder each), ``dim_feedforward``,
    ``dropout``, ``norm_first`` (pre-LN), ``positional`` (:data:`attnbook.transformer.POSITIONAL_KINDS`); Adam at
    ``lr`` after a linear warm-up over ``warmup_steps`` steps, cross-entropy with ``label_smoothing``, for
    ``epochs`` epochs.

    The baseline, chapter 4's Bahdanau model (:meth:`baseline_config`): ``embed_size``, ``hidden_size`` (decoder;
    the bidirectional encoder has half per direction), ``baseline_attention_size`` (``None`` = ``hidden_size``),
    ``baseline_dropout``; Adam at ``baseline_lr``, constant, for ``baseline_epochs`` epochs.

    Both: ``batch_size``, ``clip`` (gradient norm), ``beam_size``, ``length_penalty``, ``max_decode_len``,
    ``length_edges`` (source-length buckets), ``models`` (a subset of :data:`MODELS`), ``num_threads`` (torch threads
    during a run; ``None`` = leave torch's setting).

    Raises:
        ValueError: ``models`` is empty or names an unknown model, ``seeds`` are not distinct non-negative ints, or
            ``label_smoothing`` is outside [0, 1).
    """

    max_src_len: int | None = _CH4.max_src_len
    max_tgt_len: int | None = _CH4.max_tgt_len
    n_train: int | None = _CH4.n_train
    n_valid: int | None = _CH4.n_valid
    n_test: int | None = _CH4.n_test
    min_freq: int = _CH4.min_freq
    max_src_vocab: int | None = _CH4.max_src_vocab
    max_tgt_vocab: int | None = _CH4.max_tgt_vocab
    covered_only: bool = _CH4.covered_only
    split_seed: int = _CH4.split_seed
    seeds: tuple[int, ...] = (0,)
    d_model: int = 64
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 256
    dropout: float = 0.0
    norm_first: bool = True
    positional: str = "sinusoidal"
    lr: float = 3e-3
    warmup_steps: int = 200
    label_smoothing: float = 0.0
    epochs: int = _CH4.epochs
    embed_size: int = _CH4.embed_size
    hidden_size: int = _CH4.hidden_size
    baseline_attention_size: int | None = _CH4.attention_size
    baseline_dropout: float = _CH4.dropout
    baseline_lr: float = _CH4.lr
    baseline_epochs: int = _CH4.epochs
    batch_size: int = _CH4.batch_size
    clip: float = _CH4.clip
    beam_size: int = _CH4.beam_size
    length_penalty: float = _CH4.length_penalty
    max_decode_len: int = _CH4.max_decode_len
    length_edges: tuple[int, ...] = _CH4.length_edges
    models: tuple[str, ...] = MODELS
    num_threads: int | None = _CH4.num_threads
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models:
            raise ValueError(f"models must be a non-empty selection of {list(MODELS)}, got {self.models!r}")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds) \
                or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct non-negative ints, at least one, got {self.seeds!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")

    @classmethod
    def quick(cls) -> "TranslationConfig":
        """Chapter 4's quick data and Bahdanau model exactly (:meth:`Seq2SeqConfig.quick`: 35,000 training pairs of
        at most 12 source tokens, the 1,000 most frequent English and 1,500 most frequent Spanish tokens, batches of
        64, the Bahdanau model at 64-d embeddings and 128 units, Adam at a constant 5e-3, 2 epochs), and a
        Transformer trained for as many epochs on the same batches: d_model 64, 4 heads, 2 + 2 pre-LN layers,
        feed-forward 256, no dropout, Adam at 3e-3 after a linear warm-up over 200 steps, no label smoothing.

        Why (seed 0, 2 epochs; greedy BLEU on the 600 test sentences, where chapter 4's Bahdanau model has 41.7):

        - The budget. An epoch of this Transformer costs no more CPU time on one thread than an epoch of the
          Bahdanau model, so both train for chapter 4's 2 epochs. Measured with :func:`time.process_time` on a busy
          2-core machine, at the same time: 45 to 48 s per epoch for the Transformer's three stored seeds
          (``train_cpu_s``), 54 s for the Bahdanau model (seed 0, through :func:`train_model`). CPU time grows
          with the load too: the chapter's live run of the Transformer took 35 s per epoch on a less busy machine.
          A wider Transformer (d_model 96, feed-forward 192) cost about 1.2 times as much per epoch as this one
          and is not used.
        - The data, not the model, was what failed before: the earlier preset (6,000 of these pairs, feed-forward
          128, 100 warm-up steps, 3 epochs) reached about 22 BLEU with beam search; on chapter 4's 35,000 pairs this
          Transformer reaches 48.7 greedy BLEU (validation loss 1.04 nats per token, Bahdanau's 1.27) and its
          translations of short held-out sentences are mostly right.
        - The warm-up: Vaswani et al. 2017 (section 5.3) raise the learning rate linearly over the first steps
          because Adam's first updates, made with poorly estimated second moments, are large; 200 steps is about a
          third of the first epoch. We keep the rate constant afterwards, as chapter 4 does (their inverse square
          root decay is for 100,000 steps).
        - Label smoothing 0.1 (Vaswani et al. 2017, section 5.4) gave 48.7 as well, and Adam at 5e-3 with 300
          warm-up steps and smoothing 48.9: no gain, so smoothing is off here (``label_smoothing`` stays an option).
        - No dropout: in 2 epochs the validation loss still falls, the model does not overfit.
        """
        return cls()

    @classmethod
    def full(cls) -> "TranslationConfig":
        """All pairs with sources of up to 50 tokens and vocabularies of the tokens seen twice (at most 30,000), as
        chapter 4's full mode; a Transformer with d_model 256, 8 heads, 3 + 3 layers, feed-forward 1024, dropout 0.1,
        4,000 warm-up steps, label smoothing 0.1, 10 epochs; Bahdanau's model at chapter 4's full sizes (620, 1000),
        10 epochs; 3 seeds. For a GPU: on one core of this project's 2-core CPU, a step took 1.9 s over 40 steps
        (1,600 steps an epoch), about 8 to 9 hours a run."""
        return cls(max_src_len=50, max_tgt_len=60, n_train=None, n_valid=None, n_test=None, min_freq=2,
                   max_src_vocab=30_000, max_tgt_vocab=30_000, covered_only=False, d_model=256, nhead=8,
                   num_layers=3, dim_feedforward=1024, dropout=0.1, lr=1e-3, warmup_steps=4_000,
                   label_smoothing=0.1, epochs=10, embed_size=620, hidden_size=1000, baseline_attention_size=1000,
                   baseline_dropout=0.2, baseline_lr=1e-3, baseline_epochs=10, batch_size=80, max_decode_len=80,
                   num_threads=None, seeds=(0, 1, 2), length_edges=(4, 6, 8, 10, 13, 16, 20, 30))

    extra_presets: ClassVar[tuple[str, ...]] = ("cpu",)   # ModeConfig.for_mode("cpu")

    @classmethod
    def cpu(cls) -> "TranslationConfig":
        """All pairs at the sizes this project's 2-core CPU can store, chapter 4's :meth:`Seq2SeqConfig.cpu`
        (sources of up to 50 tokens, :meth:`full`'s split and test set, vocabularies of the 6,000 English and 8,000
        Spanish tokens seen at least twice, batches of 64, 3 epochs, 3 seeds, one thread a run), whose Bahdanau
        model (128-d embeddings, 256 units, dropout 0.1, Adam at a constant 3e-3) is the baseline, so chapter 4's
        ``results/seq2seq_cpu.csv`` holds its runs; and a Transformer of d_model 128, 4 heads, 3 + 3 pre-LN layers,
        feed-forward 512, dropout 0.1, Adam at 2e-3 after a linear warm-up over 400 steps (a fifth of the first
        epoch), label smoothing 0.1. Its step costs the Bahdanau model's CPU time: 0.28 s against 0.22 to 0.28 s,
        measured with :func:`time.process_time` over 20 steps each on a busy machine (2 + 2 layers: 0.23 s). The
        command line: ``--mode cpu``."""
        ch4 = Seq2SeqConfig.cpu()
        return cls(**{k: getattr(ch4, k) for k in SHARED_FIELDS}, d_model=128, nhead=4, num_layers=3,
                   dim_feedforward=512, dropout=0.1, lr=2e-3, warmup_steps=400, label_smoothing=0.1,
                   epochs=ch4.epochs, baseline_attention_size=ch4.attention_size, baseline_dropout=ch4.dropout,
                   baseline_lr=ch4.lr, baseline_epochs=ch4.epochs)

    def data(self) -> TranslationData:
        """The prepared data (:func:`attnbook.data.translation.prepare_translation`, seeded by ``split_seed``)."""
        return prepare_translation(max_src_len=self.max_src_len, max_tgt_len=self.max_tgt_len, n_train=self.n_train,
                                   n_valid=self.n_valid, n_test=self.n_test, min_freq=self.min_freq,
                                   max_src_vocab=self.max_src_vocab, max_tgt_vocab=self.max_tgt_vocab,
                                   covered_only=self.covered_only, seed=self.split_seed)

    def baseline_config(self) -> Seq2SeqConfig:
        """The Bahdanau model's runs as chapter 4 configures them: a :class:`Seq2SeqConfig` with this
        configuration's data, batches, decoding, seeds and baseline sizes, Bahdanau's model only, a constant
        learning rate and scaled Luong scores (unused by Bahdanau's model). ``TranslationConfig.quick()``'s is
        ``Seq2SeqConfig.quick()`` up to ``models`` and ``seeds``, which only choose runs."""
        return Seq2SeqConfig(**{k: getattr(self, k) for k in SHARED_FIELDS},
                             attention_size=self.baseline_attention_size, dropout=self.baseline_dropout,
                             lr=self.baseline_lr, epochs=self.baseline_epochs, lr_schedule="constant",
                             luong_scaled=True, models=("bahdanau",))


def _check_kind(kind: object) -> str:
    if kind not in MODELS:
        raise ValueError(f"kind must be one of {list(MODELS)}, got {kind!r}")
    return kind


def build_model(kind: str, src_vocab_size: int, tgt_vocab_size: int, cfg: TranslationConfig) -> Seq2Seq:
    """A new, seeded-by-the-caller model: ``"transformer"`` (:class:`attnbook.transformer.Transformer` with the
    configuration's sizes, ``max_len = max_decode_len + 2`` learned positions if ``positional="learned"``) or
    ``"bahdanau"`` (:func:`attnbook.seq2seq.make_seq2seq`).

    Raises:
        ValueError: an unknown ``kind`` (the message lists :data:`MODELS`).
    """
    if _check_kind(kind) == "bahdanau":
        return make_seq2seq("bahdanau", src_vocab_size, tgt_vocab_size, cfg.embed_size, cfg.hidden_size,
                            cfg.baseline_attention_size, cfg.baseline_dropout)
    return Transformer(src_vocab_size, tgt_vocab_size, cfg.d_model, cfg.nhead, cfg.num_layers, cfg.num_layers,
                       cfg.dim_feedforward, cfg.dropout, norm_first=cfg.norm_first, positional=cfg.positional,
                       max_len=max(cfg.max_decode_len, cfg.max_src_len or 0, cfg.max_tgt_len or 0) + 2)


def _smoothed_loss(model: Seq2Seq, batch: tuple[torch.Tensor, ...], smoothing: float) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy over the batch's target tokens (pads ignored) with label smoothing, and their count."""
    src, src_len, tgt_in, tgt_out = batch
    logits, _ = model(src, src_len, tgt_in)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD_ID,
                           reduction="sum", label_smoothing=smoothing)
    return loss, int((tgt_out != PAD_ID).sum())


def train_model(kind: str, data: TranslationData, cfg: TranslationConfig, device: torch.device | str = "cpu",
                show_progress: bool = False, seed: int | None = None, checkpoint: Checkpointer | None = None
                ) -> tuple[Seq2Seq, pd.DataFrame]:
    """Train one model with teacher forcing, Adam, the gradient norm clipped to ``cfg.clip``.

    ``"bahdanau"`` is trained by chapter 4's :func:`attnbook.experiments.seq2seq.train_model` with
    :meth:`TranslationConfig.baseline_config` (so it is chapter 4's run with this seed, bitwise on the CPU).
    ``"transformer"`` the same way, except for its model, a learning rate that rises linearly from
    ``lr / warmup_steps`` to ``lr`` over the first ``warmup_steps`` steps and then stays (Vaswani et al. 2017,
    section 5.3, without their decay), and label smoothing ``cfg.label_smoothing`` in the training loss (ibid.,
    section 5.4): ``seed_everything(seed)`` first, and the batches of epoch ``e`` (from 0) are
    ``make_batches(data.train, cfg.batch_size, np.random.default_rng([seed, e]))``, so both models see the same
    batches in the same order.

    Args:
        kind: ``"transformer"`` or ``"bahdanau"``.
        data, cfg, device: the prepared data, the configuration, the device.
        show_progress: a progress bar over the epochs (the Transformer) or steps (chapter 4's loop).
        seed: the model seed; ``None`` = ``cfg.seeds[0]``.
        checkpoint: a :class:`attnbook.checkpoint.Checkpointer` for this run (see :func:`_checkpointer`), or None
            (no checkpoints). With one, training resumes from its checkpoint if there is one and saves one after
            every epoch (and inside an epoch when :meth:`~attnbook.checkpoint.Checkpointer.due`); on the CPU a
            resumed run gives bitwise the same model and history (but ``seconds``) as an uninterrupted one. The
            checkpoint is left in place. ``"bahdanau"`` passes it on to chapter 4's loop, which does the same.

    Returns:
        ``(model, history)``: the model in eval mode, and one row per epoch with ``epoch``, ``train_loss`` (the
        training objective, nats per target token: with label smoothing for the Transformer), ``valid_loss``
        (plain cross-entropy, nats per target token) and ``seconds`` (cumulative wall-clock time, validation
        included, as chapter 4 counts it, across resumes).

    Raises:
        ValueError: an unknown ``kind``, or a checkpoint of another run or configuration
            (:meth:`attnbook.checkpoint.Checkpointer.load`).
    """
    _check_kind(kind)
    seed = cfg.seeds[0] if seed is None else seed
    if kind == "bahdanau":
        return seq2seq_train_model("bahdanau", data, cfg.baseline_config(), device, show_progress, seed=seed,
                                   checkpoint=checkpoint)
    seed_everything(seed)
    device = torch.device(device)
    if device.type == "cuda":  # seeded, but not bitwise deterministic on a GPU (as chapter 4)
        torch.use_deterministic_algorithms(False)
    model = build_model(kind, len(data.src_vocab), len(data.tgt_vocab), cfg).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    warmup = cfg.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup)
                                                  if warmup else 1.0)
    valid = make_batches(data.valid, cfg.batch_size * 2, device=device)
    rows, seconds, total, count, first_epoch, first_step = [], 0.0, 0.0, 0, 0, 0
    saved = checkpoint.load(device) if checkpoint is not None else None
    if saved:
        model.load_state_dict(saved["state"]["model"])
        optimizer.load_state_dict(saved["state"]["optimizer"])
        scheduler.load_state_dict(saved["state"]["scheduler"])
        rows, seconds = [dict(r) for r in saved["state"]["rows"]], saved["state"]["seconds"]
        total, count = saved["state"]["total"], saved["state"]["count"]
        first_epoch, first_step = int(saved["epoch"]) - 1, int(saved["step"])   # 0-based here
        set_rng_states(saved["rng"], device)
    bar = progress(total=cfg.epochs, desc=f"training {kind}", disable=not show_progress)
    bar.update(min(first_epoch, cfg.epochs))
    start = time.perf_counter()
    for epoch in range(first_epoch, cfg.epochs):
        batches = make_batches(data.train, cfg.batch_size, np.random.default_rng([seed, epoch]), device)
        skip = first_step if epoch == first_epoch else 0
        if skip == 0:   # a new epoch (not one resumed inside): its running sums start at zero
            total, count = 0.0, 0
        model.train()
        for step, batch in enumerate(batches[skip:], skip + 1):
            loss, n = _smoothed_loss(model, batch, cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            scheduler.step()
            total, count = total + loss.item(), count + n
            if checkpoint is not None and step < len(batches) and checkpoint.due():
                _save(checkpoint, epoch + 1, step, cfg.epochs, len(batches), model, optimizer, scheduler, rows,
                      total, count, seconds + time.perf_counter() - start, device)
        rows.append({"epoch": epoch + 1, "train_loss": total / count, "valid_loss": _mean_loss(model, valid),
                     "seconds": seconds + time.perf_counter() - start})
        if checkpoint is not None:
            _save(checkpoint, epoch + 2, 0, cfg.epochs, len(batches), model, optimizer, scheduler, rows, total,
                  count, seconds + time.perf_counter() - start, device)
        bar.update(1)
    bar.close()
    return model.eval(), pd.DataFrame(rows)


def _save(checkpoint: Checkpointer, epoch: int, step: int, epochs: int, steps: int, model, optimizer, scheduler,
          rows: list, total: float, count: int, seconds: float, device: torch.device) -> None:
    """Save a Transformer run of :func:`train_model` at a batch boundary (``epoch`` 1-based, ``step`` batches of it
    done; ``seconds`` of training so far)."""
    checkpoint.save(epoch=epoch, step=step, epochs=epochs, steps_per_epoch=steps, device=device, state={
        "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
        "rows": rows, "total": total, "count": count, "seconds": seconds})


def evaluate(model: Seq2Seq, data: TranslationData, cfg: TranslationConfig, device: torch.device | str = "cpu"
             ) -> tuple[dict, pd.DataFrame, dict[str, Decoded]]:
    """BLEU with greedy decoding and beam search, and teacher-forced token accuracy, on the test split, overall and
    per source-length bucket.

    Returns:
        ``(summary, by_length, decoded)``: ``summary`` has ``bleu_greedy``, ``bleu_beam`` (sacreBLEU corpus BLEU,
        case-insensitive, all references; 0-100) and ``token_acc`` (mean over test pairs); ``by_length`` one row per
        bucket of :func:`attnbook.experiments.seq2seq.length_bucket` with ``length``, ``sentences``,
        ``bleu_greedy``, ``bleu_beam`` and ``token_acc``; ``decoded`` maps ``"greedy"`` and ``"beam"`` to the
        :class:`attnbook.seq2seq.Decoded` outputs, in the order of
        :func:`attnbook.experiments.seq2seq.held_out_sources`.
    """
    sources = held_out_sources(data.test, data.target_column)
    refs = list(sources["refs"])
    decoded = {"greedy": translate(model, sources, "greedy", max_len=cfg.max_decode_len, device=device),
               "beam": translate(model, sources, "beam", cfg.beam_size, max_len=cfg.max_decode_len,
                                 length_penalty=cfg.length_penalty, device=device)}
    hyps = {k: [detokenize(data.tgt_vocab.decode(t)) for t in d.tokens] for k, d in decoded.items()}
    acc = token_accuracy(model, data.test, device=device)
    summary = {"bleu_greedy": corpus_bleu(hyps["greedy"], refs), "bleu_beam": corpus_bleu(hyps["beam"], refs),
               "token_acc": float(acc.mean())}
    bucket_src = np.asarray(length_bucket(sources["src_len"], cfg.length_edges))
    bucket_pairs = np.asarray(length_bucket(data.test["src"].map(len), cfg.length_edges))
    rows = []
    for label in length_bucket([], cfg.length_edges).categories:
        inside, pairs = bucket_src == label, bucket_pairs == label
        row = {"length": label, "sentences": int(inside.sum())}
        for method in ("greedy", "beam"):
            row[f"bleu_{method}"] = corpus_bleu([h for h, m in zip(hyps[method], inside) if m],
                                                [r for r, m in zip(refs, inside) if m])
        row["token_acc"] = float(acc[pairs].mean()) if pairs.any() else float("nan")
        rows.append(row)
    return summary, pd.DataFrame(rows), decoded


@dataclass
class TranslationResults:
    """What :func:`run_experiment` returns: ``summary`` (one row per run: the columns of :data:`LAYOUT`, ``model``,
    ``seed``, ``parameters``, ``epochs``, ``train_s``, ``train_cpu_s``, ``eval_s`` (seconds), ``valid_loss``,
    ``bleu_greedy``, ``bleu_beam``, ``token_acc``), ``by_length`` and ``history`` (rows per run), the trained
    ``models`` and their test ``decoded`` outputs for the first seed (keyed by model), the ``data`` and the
    ``config``."""

    summary: pd.DataFrame
    by_length: pd.DataFrame
    history: pd.DataFrame
    models: dict[str, Seq2Seq] = field(repr=False)
    decoded: dict[str, dict[str, Decoded]] = field(repr=False)
    data: TranslationData = field(repr=False)
    config: TranslationConfig | None = None


def _train_and_evaluate(kind: str, seed: int, data: TranslationData, cfg: TranslationConfig, device: torch.device,
                        show_progress: bool = False, keep: bool = True, checkpoint: Checkpointer | None = None
                        ) -> tuple:
    """One run: train (from ``checkpoint``, see :func:`train_model`), evaluate; its summary row, per-length rows,
    history, and (``keep``) model and decoded outputs, else ``None`` for both. Runs with ``cfg.num_threads`` torch
    threads and restores the setting afterwards. ``train_cpu_s`` is the process's CPU time of the training
    (:func:`time.process_time`, validation included): with one thread, the cost of the training on one core (of this
    session only, for a run resumed from a checkpoint)."""
    threads = torch.get_num_threads()
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    try:
        cpu = time.process_time()
        model, history = train_model(kind, data, cfg, device, show_progress, seed=seed, checkpoint=checkpoint)
        cpu = time.process_time() - cpu
        start = time.perf_counter()
        summary, by_length, decoded = evaluate(model, data, cfg, device)
    finally:
        torch.set_num_threads(threads)
    row = {"model": kind, "seed": seed, "parameters": sum(p.numel() for p in model.parameters()),
           "epochs": int(history["epoch"].iloc[-1]), "train_s": float(history["seconds"].iloc[-1]),
           "train_cpu_s": cpu, "eval_s": time.perf_counter() - start,
           "valid_loss": float(history["valid_loss"].iloc[-1]), **summary}
    tag = {"model": kind, "seed": seed}
    return (row, by_length.assign(**tag), history.assign(**tag), model if keep else None,
            decoded if keep else None)


def run_experiment(cfg: TranslationConfig, data: TranslationData | None = None,
                   device: torch.device | str | None = None, workers: int = 1,
                   show_progress: bool = True) -> TranslationResults:
    """Train and evaluate every run (model of ``cfg.models``, seed of ``cfg.seeds``) on the same data and batches.

    Args:
        cfg: the configuration.
        data: prepared data (default ``cfg.data()``).
        device: default :func:`attnbook.runtime.get_device`.
        workers: processes that train the runs side by side (joblib, ``loky``), each with ``cfg.num_threads``
            threads; the runs are seeded and independent, so on the CPU the results do not depend on it. On a
            GPU keep 1.
        show_progress: a progress bar over the runs.

    Raises:
        ValueError: ``workers < 1``.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    device = torch.device(device) if device is not None else get_device()
    data = data if data is not None else cfg.data()
    runs = [(kind, seed) for seed in cfg.seeds for kind in cfg.models]
    first = cfg.seeds[0]
    bar = progress(total=len(runs), desc="runs", disable=not show_progress)
    tasks = [(kind, seed, data, cfg, device, False, seed == first) for kind, seed in runs]
    return TranslationResults(*gather_runs(_train_and_evaluate, tasks, runs, first, workers, bar), data, cfg)


#: The results store of the command line (:mod:`attnbook.store`): a run is one model with one seed, with its
#: per-length rows and per-epoch history in side tables. ``num_threads`` does not change results, and ``models`` and
#: ``seeds`` only choose runs.
LAYOUT = Layout(
    "transformer_translation", keys=("model", "seed"),
    columns=("model", "seed", "parameters", "epochs", "train_s", "train_cpu_s", "eval_s", "valid_loss", "bleu_greedy",
             "bleu_beam", "token_acc"),
    tables={"by_length": ("length", "sentences", "bleu_greedy", "bleu_beam", "token_acc", "model", "seed"),
            "history": ("epoch", "train_loss", "valid_loss", "seconds", "model", "seed")},
    not_configuration=("num_threads", "models", "seeds"))


def _checkpointer(directory: str | Path, kind: str, seed: int, cfg: TranslationConfig,
                  every_s: float | None) -> Checkpointer:
    """The checkpoint of the run (``kind``, ``seed``) in ``directory``: its configuration is the store's, less what
    only chooses runs or does not change results (:data:`LAYOUT`'s ``not_configuration``)."""
    config = {k: v for k, v in store_config(cfg).items() if k not in LAYOUT.not_configuration}
    return Checkpointer(directory, "transformer_translation", {"model": kind, "seed": seed}, config, every_s)


def _store_task(kind: str, seed: int, data: TranslationData, cfg: TranslationConfig, device: torch.device,
                checkpoint_dir: str | Path | None = None, every_s: float | None = None) -> tuple:
    """One run for the command line: its row, per-length rows, history (the model stays behind) and the resumes of
    its checkpoint (a list, empty if it trained in one go or without checkpoints)."""
    checkpoint = _checkpointer(checkpoint_dir, kind, seed, cfg, every_s) if checkpoint_dir is not None else None
    row, by_length, history, _, _ = _train_and_evaluate(kind, seed, data, cfg, device, keep=False,
                                                        checkpoint=checkpoint)
    return row, by_length, history, checkpoint.resumes if checkpoint is not None else []


def store_config(cfg: TranslationConfig) -> dict:
    """The configuration recorded with the runs and checked on resume (``cfg`` without ``extra``)."""
    return {k: v for k, v in asdict(cfg).items() if k != "extra"}


# ------------------------------------------------------------------------------------------------- stored runs
def comparison_runs(cfg: TranslationConfig, stored: StoredRuns | None, chapter4: StoredRuns | None = None
                    ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """The stored runs of ``cfg``'s comparison, both models, from this experiment's store and chapter 4's.

    A store counts only if its configuration is this one's (:func:`attnbook.store.config_differences`, the entries
    that only choose runs aside): ``stored`` against :func:`store_config`, ``chapter4`` (chapter 4's store,
    :mod:`attnbook.experiments.seq2seq`) against :meth:`TranslationConfig.baseline_config`. The Bahdanau runs of
    ``stored`` come first; chapter 4's Bahdanau runs fill the seeds it lacks (they are the same runs: see
    :func:`train_model`).

    Returns:
        ``(runs, by_length, sources)``: one row per run with ``model``, ``seed``, ``bleu_greedy``, ``bleu_beam``,
        ``token_acc``, ``valid_loss``, ``train_s`` and ``source`` (``"this store"`` or ``"chapter 4"``); the
        by-length rows of those runs (``bleu_beam`` is NaN for chapter 4's, which stores greedy BLEU by length
        only); and why each store was used or not, keyed ``"stored"`` and ``"chapter4"`` (``"used"``,
        ``"missing"`` or ``"differs in [...]"``).
    """
    from .seq2seq import LAYOUT as ch4_layout

    columns = ["model", "seed", "bleu_greedy", "bleu_beam", "token_acc", "valid_loss", "train_s"]
    parts, lengths, sources = [], [], {}
    for key, store, config, layout, models in (
            ("stored", stored, store_config(cfg), LAYOUT, MODELS),
            ("chapter4", chapter4, asdict(cfg.baseline_config()), ch4_layout, ("bahdanau",))):
        sources[key] = stored_status(store, config, layout)
        if sources[key] != "used":
            continue
        label = "this store" if key == "stored" else "chapter 4"
        runs = store.runs[store.runs["model"].isin(models)]
        parts.append(runs[columns].assign(source=label))
        lengths.append(store.by_length[store.by_length["model"].isin(models)].assign(source=label))
    if not parts:
        return (pd.DataFrame(columns=[*columns, "source"]), pd.DataFrame(columns=[*LAYOUT.tables["by_length"],
                "source"]), sources)
    runs = pd.concat(parts, ignore_index=True).drop_duplicates(["model", "seed"], keep="first")
    by_length = pd.concat(lengths, ignore_index=True)
    by_length = by_length.merge(runs[["model", "seed", "source"]], on=["model", "seed", "source"])
    if "bleu_beam" not in by_length:
        by_length["bleu_beam"] = np.nan
    return runs.reset_index(drop=True), by_length[[*LAYOUT.tables["by_length"], "source"]], sources


#: The verdict words of :func:`compare_models`.
VERDICTS = ("higher", "lower", "within seed noise", "not yet answered")


def compare_models(runs: pd.DataFrame, value: str = "bleu_greedy", min_pairs: int | None = None,
                   n_resamples: int = 9999,
                   seed: int = 0) -> pd.Series:
    """The Transformer against Bahdanau's model over the seeds that ran both (paired by seed), as chapter 5 compares
    conditions (:func:`attnbook.experiments.masking_report.paired_table`: bootstrap 95% CI of the mean paired
    difference, Wilcoxon's test, rank-biserial correlation).

    Args:
        runs: one row per run with ``model``, ``seed`` and ``value`` (as :func:`comparison_runs` returns).
        value: the compared column (BLEU in points).
        min_pairs: paired seeds needed for a verdict (default: the book's one rule,
            :data:`attnbook.evidence.MIN_PAIRS`).
        n_resamples, seed: of the bootstrap.

    Returns:
        The row of :func:`~attnbook.experiments.masking_report.paired_table` (``n_pairs``, ``mean_baseline``
        (Bahdanau), ``mean_condition`` (Transformer), ``mean_diff``, ``ci_low``, ``ci_high``, ``n_better``,
        ``n_worse``, ``p_value``, ...) with ``verdict`` one of :data:`VERDICTS`: ``"higher"``/``"lower"`` when the
        interval excludes zero, ``"within seed noise"`` when it includes it, ``"not yet answered"`` with fewer than
        ``min_pairs`` paired seeds.

    Raises:
        ValueError: ``runs`` lacks a column, or a (model, seed) run occurs twice.
    """
    from types import SimpleNamespace

    from .masking_report import paired_table, runs_by_kind

    from ..evidence import MIN_PAIRS

    min_pairs = MIN_PAIRS if min_pairs is None else min_pairs
    frame = runs_by_kind(runs, ("model",), lambda row: row["model"], value)
    # one planned comparison, not a family: its interval alone decides (masking_report's primary arm)
    pair = SimpleNamespace(condition="transformer", baseline="bahdanau", primary=True)
    row = paired_table(frame, [pair], {}, value=value, min_pairs=min_pairs, n_resamples=n_resamples,
                       seed=seed).iloc[0].copy()
    row["verdict"] = {"no difference resolved": "within seed noise"}.get(row["verdict"], row["verdict"])
    return row


def results_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The plain results table of chapter 8's translation comparison: one row per model and decoding (greedy,
    then beam search), with the mean BLEU over the runs, the 95% interval of the mean and the number of runs
    (:func:`attnbook.evidence.summary_table`).

    Args:
        runs: one row per run with ``model``, ``seed``, ``bleu_greedy`` and ``bleu_beam`` (:func:`comparison_runs`).

    Returns:
        Columns ``condition, BLEU, 95% interval, runs``; a model without runs is left out.

    Raises:
        ValueError: a column is missing.

    Chapter 8, section "A Transformer translator".
    """
    from ..evidence import summary_table

    missing = sorted({"model", "seed", "bleu_greedy", "bleu_beam"} - set(runs.columns))
    if missing:
        raise ValueError(f"runs lacks the columns {missing}")
    long = runs.melt(id_vars=["model", "seed"], value_vars=["bleu_greedy", "bleu_beam"], var_name="decoding",
                     value_name="bleu").dropna(subset=["bleu"])
    names = {"transformer": "Transformer", "bahdanau": "Bahdanau (chapter 4)"}
    ways = {"bleu_greedy": "greedy", "bleu_beam": "beam search"}
    present = set(zip(long["model"], long["decoding"]))
    order = [(m, d) for d in ways for m in names if (m, d) in present]
    labels = {(m, d): f"{names[m]}, {ways[d]}" for m, d in order}
    table = summary_table(long, ["model", "decoding"], "bleu", digits=1, order=order, labels=labels)
    return table.rename(columns={"mean": "BLEU"})


def verdict_phrase(row: pd.Series, baseline: str = "Bahdanau's model's") -> str:
    """The verdict of one :func:`compare_models` row as the end of a sentence that begins "the Transformer's BLEU
    is": the verdict word, then the mean paired difference in points and its 95% interval ("higher than Bahdanau's
    model's, by +7.0 points (95% interval +6.3 to +8.3)"); "indistinguishable from" when the interval includes
    zero; with too few paired runs, only that. The words name no seed and no test (chapter pages' rule). Chapter 8, section "A
    Transformer translator".

    Raises:
        ValueError: ``row["verdict"]`` is not one of :data:`VERDICTS`.
    """
    if row["verdict"] not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {row['verdict']!r}")
    if row["verdict"] == "not yet answered":
        return f"not yet compared ({plural(int(row['n_pairs']), 'paired run')}, too few for a verdict)"
    where = {"higher": "higher than", "lower": "lower than", "within seed noise": "indistinguishable from"}
    return (f"{where[row['verdict']]} {baseline}, by {row['mean_diff']:+.1f} points (95% interval "
            f"{row['ci_low']:+.1f} to {row['ci_high']:+.1f})")


def main(argv: list[str] | None = None) -> Path:
    """The command line (see the module docstring): train and evaluate every run (model, seed) not yet in ``--out``
    and store each as it finishes, with provenance. Returns the path of ``--out``. An interrupted run (Ctrl-C,
    SIGTERM) records its session as interrupted and exits with 130 or 143."""
    parser = argparse.ArgumentParser(prog="python -m attnbook.experiments.transformer_translation",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=TranslationConfig.presets(), default=None,
                        help="default: full on a GPU, else quick; cpu: all pairs at CPU sizes (TranslationConfig.cpu)")
    parser.add_argument("--out", type=csv_path, default=Path("results/transformer_translation_full.csv"))
    parser.add_argument("--device", type=device_arg, default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=None)
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help="number of model seeds (0..N-1); default: the mode's (quick 1, full 3)")
    add_backend_arguments(parser)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads per worker (default: the mode's; quick 1, full torch's own)")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="override the epochs of both models (epochs and baseline_epochs)")
    parser.add_argument("--n-train", type=positive_int, default=None, help="override the number of training pairs")
    parser.add_argument("--n-valid", type=positive_int, default=None,
                        help="override the number of validation sentences")
    parser.add_argument("--n-test", type=positive_int, default=None, help="override the number of test sentences")
    add_checkpoint_arguments(parser)
    args = parser.parse_args(argv)
    every_s = checkpoint_every_s(parser, args)
    mode = args.mode or get_mode()
    cfg = TranslationConfig.for_mode(mode)
    overrides = {k: v for k, v in (("epochs", args.epochs), ("baseline_epochs", args.epochs),
                                   ("n_train", args.n_train), ("n_valid", args.n_valid), ("n_test", args.n_test),
                                   ("num_threads", args.threads),
                                   ("models", tuple(args.models) if args.models else None),
                                   ("seeds", tuple(range(args.seeds)) if args.seeds else None)) if v is not None}
    cfg = replace(cfg, **overrides)
    device = torch.device(args.device) if args.device else get_device()
    started = time.perf_counter()
    summary, n_trained = store_translation_runs(
        parser, args, cfg, layout=LAYOUT, config=store_config(cfg), device=device, mode=mode, overrides=overrides,
        store_task=_store_task,
        task_args=lambda kind, seed, data: (kind, seed, data, cfg, device, args.checkpoint_dir, every_s),
        checkpointer=lambda kind, seed: _checkpointer(args.checkpoint_dir, kind, seed, cfg, None))
    print(summary.to_string(index=False))
    print(f"{len(summary)} runs in {args.out} ({n_trained} trained now, {time.perf_counter() - started:.0f} s)")
    return args.out


if __name__ == "__main__":  # pragma: no cover
    main()
