"""The translation experiment of chapter 4: train the seq2seq models on identical data, decode, score with BLEU.

Explained in chapter 4, "Sequence to sequence with attention" (``chapters/04_seq2seq_attention``), sections
"Five models, one training loop", "BLEU on held-out sentences" and "The bottleneck: quality against source length".

Configuration is :class:`Seq2SeqConfig` (``quick()`` for a 2-core CPU, ``full()`` for all pairs at sizes like
Bahdanau et al.'s on a GPU); :func:`run_experiment` returns plain data (DataFrames and the trained models). A *run* is
one model kind trained with one seed; the seed fixes the initialization and the batch order (the data split is fixed
by ``split_seed``), so runs with the same seed are paired across model kinds. The CLI writes the full-mode results
with their provenance, e.g. the chapter's stored comparison (3 seeds of three models)::

    python -m attnbook.experiments.seq2seq --mode full --models none bahdanau luong-general --seeds 3 \
        --out results/seq2seq_full.csv

which writes ``seq2seq_full.csv`` (one row per model and seed), ``seq2seq_full_by_length.csv`` (BLEU and token
accuracy per source-length bucket, model and seed: Bahdanau et al.'s Fig. 2, the last bucket holding the longest
sentences), ``seq2seq_full_history.csv`` (losses per epoch) and ``seq2seq_full.json`` (provenance and configuration,
one session per invocation) into the folder of ``--out``. It is a results store (:mod:`attnbook.store`): each run is
stored as soon as it is evaluated, with its rows of the other two tables, so a run that is killed resumes with the
runs it has not finished (the same command again; ``--seeds`` and ``--models`` may grow, the configuration may not).
A full-size run trains for longer than one call of a lent GPU may run: with ``--checkpoint-dir DIR`` (and
``--checkpoint-minutes M``) each run saves its training state to ``DIR/seq2seq-model=<kind>-seed=<seed>.pt`` after
every epoch (and every ``M`` minutes) and resumes from it exactly (:mod:`attnbook.checkpoint`); the session that
finishes a resumed run lists it under ``resumed_runs`` in the sidecar, and the checkpoint is deleted once the run is
stored. ``tools/gpu_job.sh seq2seq`` runs the stored comparison this way on a GPU (see the README).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..checkpoint import Checkpointer, add_checkpoint_arguments, checkpoint_every_s, record_resumes, set_rng_states
from ..data.translation import TranslationData, prepare_translation
from ..provenance import provenance
from ..runtime import ModeConfig, get_device, get_mode, parallel_backend, progress, run_tasks, seed_everything
from ..seq2seq import MODEL_KINDS, Decoded, Seq2Seq, beam_search, greedy_decode, make_seq2seq
from ..store import (Layout, ResultsStore, Session, StoreError, add_backend_arguments, backend_record,
                     check_backend_arguments, config_differences, csv_path, device_arg, positive_int, read_tables)
from ..text import PAD_ID, detokenize, pad_batch

__all__ = [
    "Seq2SeqConfig", "Seq2SeqResults", "make_batches", "train_model", "held_out_sources", "translate", "corpus_bleu",
    "token_accuracy", "length_bucket", "evaluate_model", "attention_spread", "attention_collapse", "run_experiment",
    "main", "LAYOUT", "LR_SCHEDULES", "StoredRuns", "read_runs", "stored_status", "length_gap_change",
    "interval_words", "paired_sentence", "change_verdict", "paired_bleu_p", "MODEL_NAMES", "MODEL_SUBJECTS",
    "runs_behind_chapter", "MODEL_COLORS", "PAPER_TABLE1", "PAPER_SETTINGS", "paper_bleu_table", "settings_table", "plot_bleu",
    "plot_history", "plot_by_length", "beam_tree", "Pair", "ATTENTION_PAIRS", "LAYER_PAIRS", "LONG_PAIRS", "BEAM_PAIRS", "decoding_runs", "compare", "evidence_table", "verdict_words",
]


#: The learning-rate schedules of :class:`Seq2SeqConfig`.
LR_SCHEDULES = ("constant", "linear")


@dataclass
class Seq2SeqConfig(ModeConfig):
    """Everything that defines one run of the translation experiment.

    Data: ``max_src_len``/``max_tgt_len`` (tokens), ``n_train`` (pairs), ``n_valid``/``n_test`` (source sentences,
    each with all its references), ``min_freq``, ``max_src_vocab``, ``max_tgt_vocab``, ``covered_only`` (vocabulary; see
    :func:`attnbook.data.translation.prepare_translation`). Model: ``embed_size``, ``hidden_size``
    (decoder; the bidirectional encoder has half per direction), ``attention_size`` (additive tanh layer and Luong's
    ``attention_layer_size``; ``None`` = ``hidden_size``), ``dropout``. Training: ``batch_size``, ``epochs``,
    ``lr`` (Adam), ``lr_schedule`` (``"constant"``, or ``"linear"``: the learning rate falls linearly from ``lr``
    to 0 over all training steps), ``clip`` (gradient norm), ``luong_scaled`` (the Luong scores divided by
    ``sqrt(d)``; False = Luong et al.'s unscaled scores, see :func:`attnbook.seq2seq.make_seq2seq`). Decoding:
    ``beam_size``, ``length_penalty``, ``max_decode_len``. ``models``: the kinds of
    :data:`attnbook.seq2seq.MODEL_KINDS` to train; ``seeds``: the model seeds (initialization and batch order), one
    run per model and seed; ``length_edges``: bucket edges for the bottleneck analysis; ``split_seed``: seeds the
    split into training, validation and test sentences and their subsampling (the same for every run);
    ``num_threads``: CPU threads for torch during the run (``None`` = leave torch's setting). Quick mode uses 1: on a
    2-core CPU two threads were about 1.3 times faster when the machine was otherwise idle, but up to 50 times
    *slower* when another process competed for the cores (the decoder's many small operations each wait for both
    threads).
    """

    max_src_len: int | None = 12
    max_tgt_len: int | None = 14
    n_train: int | None = 35_000
    n_valid: int | None = 300
    n_test: int | None = 600
    min_freq: int = 1
    max_src_vocab: int | None = 1_000
    max_tgt_vocab: int | None = 1_500
    covered_only: bool = True
    embed_size: int = 64
    hidden_size: int = 128
    attention_size: int | None = None
    dropout: float = 0.0
    batch_size: int = 64
    epochs: int = 2
    lr: float = 5e-3
    lr_schedule: str = "constant"
    clip: float = 1.0
    luong_scaled: bool = True
    beam_size: int = 4
    length_penalty: float = 1.0
    max_decode_len: int = 30
    models: tuple[str, ...] = tuple(MODEL_KINDS)
    seeds: tuple[int, ...] = (0,)
    length_edges: tuple[int, ...] = (4, 6, 8, 10)
    split_seed: int = 0
    num_threads: int | None = 1

    def __post_init__(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        unknown = [m for m in self.models if m not in MODEL_KINDS]
        if unknown or not self.models:
            raise ValueError(f"models must be a non-empty selection of {list(MODEL_KINDS)}, got {self.models!r}")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds) \
                or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct non-negative ints, at least one, got {self.seeds!r}")

    @classmethod
    def quick(cls) -> "Seq2SeqConfig":
        """Models of 128 units (64-d embeddings) on 35,000 training pairs of at most 12 source tokens, made only of
        the 1,000 most frequent English and 1,500 most frequent Spanish tokens (35,000 is about all of them: the
        most that leave the test sentences and the vocabularies as they are), 2 epochs of Adam at a constant 5e-3
        (a linear decay to zero, ``lr_schedule="linear"``, gave no lower validation loss for Bahdanau's and Luong
        general's models, seed 0), one seed: sized for chapter 4 on a 2-core CPU, with the models trained two at a
        time (``run_experiment(..., workers=2)``, one thread each)."""
        return cls()

    @classmethod
    def full(cls) -> "Seq2SeqConfig":
        """All pairs with sources of up to 50 tokens (like RNNsearch-50) at sizes like Bahdanau et al.'s (620-d
        embeddings, 1000-unit decoder and attention layer, 2 x 500 encoder units, vocabularies of the tokens seen
        at least twice, at most 30,000, batches of 80, gradient norm clipped at 1), 10 epochs, 3 seeds, for a
        GPU."""
        return cls(max_src_len=50, max_tgt_len=60, n_train=None, n_valid=None, n_test=None, min_freq=2,
                   max_src_vocab=30_000, max_tgt_vocab=30_000, covered_only=False, embed_size=620,
                   hidden_size=1000, attention_size=1000, dropout=0.2, batch_size=80, epochs=10, lr=1e-3, clip=1.0,
                   max_decode_len=80, num_threads=None, seeds=(0, 1, 2),
                   length_edges=(4, 6, 8, 10, 13, 16, 20, 30))

    extra_presets: ClassVar[tuple[str, ...]] = ("cpu",)   # ModeConfig.for_mode("cpu")

    @classmethod
    def cpu(cls) -> "Seq2SeqConfig":
        """All pairs, as :meth:`full` (sources of up to 50 tokens, the same split, test and length groups), at
        sizes a 2-core CPU trains within a working session: 128-d embeddings, 256 units, vocabularies of the 6,000
        most frequent English and 8,000 most frequent Spanish tokens seen at least twice (2.7% of the training
        target tokens become ``<unk>``), batches of 64, dropout 0.1, 3 epochs of Adam at a constant 3e-3
        (constant as in quick mode, so that chapter 8's Transformer can share these Bahdanau runs), 3 seeds, one
        thread per run. It is what this project's CPU can store (``--mode cpu``, ``results/seq2seq_cpu.csv``):
        :meth:`full`'s sizes cost 2.6 s a step on one core, about 12 hours a run, these 0.25 s (measured alone,
        15 steps); two runs side by side took 7 to 13 minutes an epoch, by what else ran. After 2 epochs (seed
        0) the validation loss still fell by 0.17 to 0.22 nats per token an epoch, and Bahdanau's model had only
        26.5 greedy BLEU, hence 3. The long sentences, which quick mode cuts off, are what it adds; its models are
        smaller than Bahdanau et al.'s, which chapter 4 says where it uses them."""
        return replace(cls.full(), max_src_vocab=6_000, max_tgt_vocab=8_000, embed_size=128, hidden_size=256,
                       attention_size=256, dropout=0.1, batch_size=64, epochs=3, lr=3e-3, lr_schedule="constant",
                       num_threads=1)

    def data(self) -> TranslationData:
        """The prepared data of this configuration (:func:`attnbook.data.translation.prepare_translation`)."""
        return prepare_translation(max_src_len=self.max_src_len, max_tgt_len=self.max_tgt_len, n_train=self.n_train,
                                   n_valid=self.n_valid, n_test=self.n_test, min_freq=self.min_freq,
                                   max_src_vocab=self.max_src_vocab, max_tgt_vocab=self.max_tgt_vocab,
                                   covered_only=self.covered_only, seed=self.split_seed)


# ------------------------------------------------------------------------------------------------- batches
def make_batches(df: pd.DataFrame, batch_size: int, rng: np.random.Generator | None = None,
                 device: torch.device | str = "cpu", pool: int = 20) -> list[tuple[torch.Tensor, ...]]:
    """Minibatches ``(src, src_lengths, tgt_in, tgt_out)`` of the pairs in ``df`` (columns ``src_ids``,
    ``tgt_ids``), grouped by source length to save padding.

    With ``rng``, the pairs are shuffled, cut into pools of ``pool * batch_size`` pairs, each pool is sorted by
    source length and cut into batches, and the batches are shuffled (Bahdanau et al. 2015, appendix B.2, sort
    pools of 1600 pairs into 20 batches). Without ``rng``, all pairs are sorted by length (for evaluation).
    ``src`` ``(batch, src_len)`` and ``tgt_in``/``tgt_out`` ``(batch, tgt_len)`` are int64, right-padded with
    ``<pad>`` = 0; ``tgt_in`` is ``<bos> y_1 ... y_n`` and ``tgt_out`` is ``y_1 ... y_n <eos>``.

    Raises:
        ValueError: ``batch_size < 1`` or ``df`` is empty.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(df) == 0:
        raise ValueError("no pairs to batch")
    src_ids, tgt_ids = list(df["src_ids"]), list(df["tgt_ids"])
    lengths = np.array([len(s) for s in src_ids])
    if rng is None:
        groups = [np.argsort(lengths, kind="stable")]
    else:
        order = rng.permutation(len(df))
        groups = [chunk[np.argsort(lengths[chunk], kind="stable")]
                  for chunk in np.array_split(order, max(1, int(np.ceil(len(df) / (pool * batch_size)))))]
    index_batches = [group[i:i + batch_size] for group in groups for i in range(0, len(group), batch_size)]
    if rng is not None:
        index_batches = [index_batches[i] for i in rng.permutation(len(index_batches))]
    batches = []
    for idx in index_batches:
        src, src_len = pad_batch([src_ids[i] for i in idx])
        tgt, _ = pad_batch([tgt_ids[i] for i in idx])
        batches.append((src.to(device), src_len.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)))
    return batches


def _loss(model: Seq2Seq, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, int]:
    src, src_len, tgt_in, tgt_out = batch
    logits, _ = model(src, src_len, tgt_in)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=PAD_ID,
                           reduction="sum")
    return loss, int((tgt_out != PAD_ID).sum())


@torch.no_grad()
def _mean_loss(model: Seq2Seq, batches: list) -> float:
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        loss, n = _loss(model, batch)
        total, count = total + loss.item(), count + n
    model.train()
    return total / max(count, 1)


def train_model(kind: str, data: TranslationData, cfg: Seq2SeqConfig, device: torch.device | str = "cpu",
                show_progress: bool = True, seed: int | None = None, checkpoint: Checkpointer | None = None
                ) -> tuple[Seq2Seq, pd.DataFrame]:
    """Train one model (:func:`attnbook.seq2seq.make_seq2seq`, Luong scores scaled as ``cfg.luong_scaled``) with
    teacher forcing and Adam.

    Every model trained with the same ``seed`` sees the same batches in the same order (the batch generator is
    seeded by ``seed`` and the epoch), and the initialization is seeded by ``seed`` (bitwise reproducible on the
    CPU; on a GPU deterministic algorithms are switched off, for speed and because some have none). The loss is the
    cross-entropy per target token (padding ignored), the gradient norm is clipped to ``cfg.clip``, and with
    ``cfg.lr_schedule == "linear"`` the learning rate falls linearly from ``cfg.lr`` after the first step to 0
    after the last (``torch.optim.lr_scheduler.LinearLR``).

    Args:
        kind, data, cfg, device: the model kind, the prepared data, the configuration, the device.
        show_progress: a progress bar over the training steps.
        seed: the model seed; ``None`` = ``cfg.seeds[0]``.
        checkpoint: a :class:`attnbook.checkpoint.Checkpointer` for this run, or None (no checkpoints). With one,
            training resumes from its checkpoint if there is one, and saves one after every epoch (and inside an
            epoch when :meth:`~attnbook.checkpoint.Checkpointer.due`); a resumed run gives bitwise the same model
            and history (but ``seconds``) as an uninterrupted one on the CPU. The checkpoint is left in place.

    Returns:
        ``(model, history)``: the trained model (in eval mode) and a DataFrame with one row per epoch: ``epoch``,
        ``train_loss``, ``valid_loss`` (nats per token), ``seconds`` (cumulative training time, across resumes).

    Raises:
        ValueError: the checkpoint belongs to another run or configuration (:meth:`Checkpointer.load`).

    Chapter 4, section "Five models, one training loop".
    """
    seed = cfg.seeds[0] if seed is None else seed
    seed_everything(seed)
    device = torch.device(device)
    if device.type == "cuda":  # seeded, but not bitwise deterministic on a GPU (the book promises that on the CPU)
        torch.use_deterministic_algorithms(False)
    model = make_seq2seq(kind, len(data.src_vocab), len(data.tgt_vocab), cfg.embed_size, cfg.hidden_size,
                         cfg.attention_size, cfg.dropout, scaled=cfg.luong_scaled).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    valid_batches = make_batches(data.valid, cfg.batch_size * 2, device=device)
    def epoch_batches(epoch: int) -> list:
        return make_batches(data.train, cfg.batch_size, np.random.default_rng([seed, epoch]), device)

    saved = checkpoint.load(device) if checkpoint is not None else None
    first_epoch, first_step = (int(saved["epoch"]), int(saved["step"])) if saved else (1, 0)
    # every epoch has the same number of batches (same pool sizes)
    batches = epoch_batches(first_epoch - 1 if first_epoch <= cfg.epochs else 0)
    steps = len(batches)
    scheduler = None
    if cfg.lr_schedule == "linear":
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, total_iters=cfg.epochs * steps)
    rows, total, count, seconds = [], 0.0, 0, 0.0
    if saved:
        model.load_state_dict(saved["state"]["model"])
        optimizer.load_state_dict(saved["state"]["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(saved["state"]["scheduler"])
        rows, total, count, seconds = ([dict(r) for r in saved["state"]["rows"]], saved["state"]["total"],
                                       saved["state"]["count"], saved["state"]["seconds"])
        set_rng_states(saved["rng"], device)

    def save(epoch: int, step: int) -> None:
        checkpoint.save(epoch=epoch, step=step, epochs=cfg.epochs, steps_per_epoch=steps, device=device, state={
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None, "rows": rows, "total": total,
            "count": count, "seconds": seconds + time.perf_counter() - start})

    bar = progress(total=cfg.epochs * steps, desc=f"training {kind}") if show_progress else None
    if bar is not None:
        bar.update(min(cfg.epochs * steps, (first_epoch - 1) * steps + first_step))
    start = time.perf_counter()
    model.train()
    for epoch in range(first_epoch, cfg.epochs + 1):
        batches = batches if epoch == first_epoch else epoch_batches(epoch - 1)
        skip = first_step if epoch == first_epoch else 0
        if skip == 0:   # a new epoch (not one resumed inside): its running sums start at zero
            total, count = 0.0, 0
        for step, batch in enumerate(batches[skip:], skip + 1):
            loss, n = _loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            total, count = total + loss.item(), count + n
            if bar is not None:
                bar.update(1)
            if checkpoint is not None and step < steps and checkpoint.due():
                save(epoch, step)
        rows.append({"epoch": epoch, "train_loss": total / count, "valid_loss": _mean_loss(model, valid_batches),
                     "seconds": seconds + time.perf_counter() - start})
        if checkpoint is not None:
            save(epoch + 1, 0)
    if bar is not None:
        bar.close()
    model.eval()
    return model, pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------- evaluation
def held_out_sources(df: pd.DataFrame, target_column: str = "es") -> pd.DataFrame:
    """One row per distinct source sentence of a held-out split: ``en``, ``src``, ``src_ids``, ``src_len`` (tokens,
    without ``<eos>``) and ``refs`` (all its translations, raw text), in order of first appearance."""
    grouped = df.groupby("en", sort=False)
    out = grouped.agg(src=("src", "first"), src_ids=("src_ids", "first"), refs=(target_column, list)).reset_index()
    out["src_len"] = out["src"].map(len)
    return out


def translate(model: Seq2Seq, sources: pd.DataFrame, method: str = "greedy", beam_size: int = 4,
              batch_size: int = 64, max_len: int = 40, length_penalty: float = 1.0,
              device: torch.device | str = "cpu") -> Decoded:
    """Decode every row of ``sources`` (column ``src_ids``) greedily or with beam search, in batches sorted by
    length; the result is in the row order of ``sources``."""
    if method not in ("greedy", "beam"):
        raise ValueError(f"method must be 'greedy' or 'beam', got {method!r}")
    ids = list(sources["src_ids"])
    order = np.argsort([len(s) for s in ids], kind="stable")
    tokens, scores, weights = [None] * len(ids), torch.zeros(len(ids)), [None] * len(ids)
    for start in range(0, len(ids), batch_size):
        idx = order[start:start + batch_size]
        src, src_len = pad_batch([ids[i] for i in idx])
        src, src_len = src.to(device), src_len.to(device)
        if method == "greedy":
            out = greedy_decode(model, src, src_len, max_len)
        else:
            out = beam_search(model, src, src_len, beam_size, max_len, length_penalty=length_penalty)
        for j, i in enumerate(idx):
            tokens[i], scores[i] = out.tokens[j], out.scores[j]
            if out.weights is not None:
                weights[i] = out.weights[j]
    return Decoded(tokens, scores, weights if weights[0] is not None else None)


def corpus_bleu(hypotheses: list[str], references: list[list[str]]) -> float:
    """Corpus BLEU (sacreBLEU, Post 2018) of detokenized ``hypotheses`` against a *variable* number of references
    per sentence, case-insensitive, with sacreBLEU's default ``13a`` tokenization. Returns the score in [0, 100].

    Raises:
        ValueError: different numbers of hypotheses and reference lists, or a sentence without reference.
    """
    import sacrebleu

    if not hypotheses and not references:
        return float("nan")
    streams = _reference_streams(hypotheses, references)
    return float(sacrebleu.corpus_bleu(hypotheses, streams, lowercase=True).score)


def _reference_streams(hypotheses: list[str], references: list[list[str]]) -> list[list[str | None]]:
    """sacreBLEU's layout of a variable number of references per sentence: stream ``i`` holds every sentence's
    ``i``-th reference, or None where a sentence has fewer."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    if any(len(r) == 0 for r in references):
        raise ValueError("every sentence needs at least one reference")
    n_streams = max((len(r) for r in references), default=0)
    return [[r[i] if i < len(r) else None for r in references] for i in range(n_streams)]


def paired_bleu_p(baseline: list[str], system: list[str], references: list[list[str]],
                  n_samples: int = 1000) -> float:
    """The p-value of sacreBLEU's paired bootstrap test (Koehn 2004; sacreBLEU's ``PairedTest`` with
    ``test_type="bs"``) for the difference in corpus BLEU between two systems' detokenized outputs for the *same*
    sentences, scored as :func:`corpus_bleu` scores them (case-insensitive, all references). It resamples the
    sentences ``n_samples`` times; sacreBLEU fixes its random seed (``SACREBLEU_SEED``, default 12345), so the
    value is reproducible (unless that variable is set to ``0`` or ``none``, which leaves it unseeded). The test is
    two-sided: it compares absolute differences, and p lies in ``[1 / (n_samples + 1), 1]``. It measures the noise
    of *these sentences* for *these two outputs*: it says nothing about seeds. Two outputs with the same corpus BLEU
    get p = 1, since the observed difference is zero (sacreBLEU itself would give identical outputs the smallest p,
    ``1 / (n_samples + 1)``, because it counts only resampled differences strictly above the observed one).
    Chapter 4, exercise "ex-seq2seq-length-penalty".

    Raises:
        ValueError: the two systems or the references differ in number, a sentence has no reference, there are
            fewer than 2 sentences, or ``n_samples`` < 1.
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if len(baseline) != len(system):
        raise ValueError(f"baseline has {len(baseline)} outputs but system has {len(system)}")
    streams = _reference_streams(system, references)
    if len(system) < 2:
        raise ValueError(f"a paired bootstrap needs at least 2 sentences, got {len(system)}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    test = PairedTest([("baseline", list(baseline)), ("system", list(system))], {"BLEU": BLEU(lowercase=True)},
                      streams, test_type="bs", n_samples=n_samples)
    _, scores = test()
    baseline_result, system_result = scores["BLEU"]
    if baseline_result.score == system_result.score:   # no observed difference
        return 1.0
    return float(system_result.p_value)


@torch.no_grad()
def token_accuracy(model: Seq2Seq, df: pd.DataFrame, batch_size: int = 128,
                   device: torch.device | str = "cpu") -> np.ndarray:
    """Teacher-forced next-token accuracy of every pair in ``df`` (fraction of its target tokens, ``<eos>``
    included, that the model ranks first given the reference prefix), in the row order of ``df``."""
    model.eval()
    ids = list(df["src_ids"])
    order = np.argsort([len(s) for s in ids], kind="stable")
    acc = np.zeros(len(df))
    for start in range(0, len(df), batch_size):
        idx = order[start:start + batch_size]
        src, src_len = pad_batch([ids[i] for i in idx])
        tgt, _ = pad_batch([df["tgt_ids"].iloc[i] for i in idx])
        logits, _ = model(src.to(device), src_len.to(device), tgt[:, :-1].to(device))
        gold = tgt[:, 1:].to(device)
        real = gold != PAD_ID
        right = ((logits.argmax(-1) == gold) & real).sum(1).float() / real.sum(1)
        acc[idx] = right.cpu().numpy()
    return acc


def length_bucket(lengths, edges: tuple[int, ...]) -> pd.Categorical:
    """Label each source length with its bucket: with ``edges = (4, 6, 8)`` the buckets are ``"1-4"``, ``"5-6"``,
    ``"7-8"`` and ``"9+"`` (ordered categories)."""
    edges = sorted(edges)
    labels, low = [], 1
    for edge in edges:
        labels.append(f"{low}-{edge}" if edge > low else f"{edge}")
        low = edge + 1
    labels.append(f"{low}+")
    codes = np.searchsorted(np.asarray(edges), np.asarray(lengths), side="left")
    return pd.Categorical.from_codes(codes, categories=labels, ordered=True)


def evaluate_model(model: Seq2Seq, data: TranslationData, cfg: Seq2SeqConfig, beam: bool = True,
                   device: torch.device | str = "cpu") -> tuple[dict, pd.DataFrame, dict[str, Decoded]]:
    """BLEU (greedy and beam search) and token accuracy on the test split, overall and per source length.

    Returns:
        ``(summary, by_length, decoded)``: ``summary`` has ``bleu_greedy``, ``bleu_beam`` (NaN when ``beam`` is
        False), ``token_acc`` (mean over test pairs); ``by_length`` has one row per length bucket with
        ``sentences``, ``bleu_greedy`` and ``token_acc``; ``decoded`` maps ``"greedy"``/``"beam"`` to the
        :class:`attnbook.seq2seq.Decoded` output for the test sources (:func:`held_out_sources` order).
    """
    sources = held_out_sources(data.test, data.target_column)
    refs = list(sources["refs"])
    decoded = {"greedy": translate(model, sources, "greedy", max_len=cfg.max_decode_len, device=device)}
    hyps = [detokenize(data.tgt_vocab.decode(t)) for t in decoded["greedy"].tokens]
    summary = {"bleu_greedy": corpus_bleu(hyps, refs), "bleu_beam": float("nan")}
    if beam:
        decoded["beam"] = translate(model, sources, "beam", cfg.beam_size, max_len=cfg.max_decode_len,
                                    length_penalty=cfg.length_penalty, device=device)
        summary["bleu_beam"] = corpus_bleu([detokenize(data.tgt_vocab.decode(t)) for t in decoded["beam"].tokens],
                                           refs)
    acc = token_accuracy(model, data.test, device=device)
    summary["token_acc"] = float(acc.mean())
    bucket_src = length_bucket(sources["src_len"], cfg.length_edges)
    bucket_pairs = length_bucket(data.test["src"].map(len), cfg.length_edges)
    rows = []
    for label in bucket_src.categories:
        in_bucket = np.asarray(bucket_src == label)
        pair_mask = np.asarray(bucket_pairs == label)
        rows.append({"length": label, "sentences": int(in_bucket.sum()),
                     "bleu_greedy": corpus_bleu([h for h, m in zip(hyps, in_bucket) if m],
                                                [r for r, m in zip(refs, in_bucket) if m]),
                     "token_acc": float(acc[pair_mask].mean()) if pair_mask.any() else float("nan")})
    return summary, pd.DataFrame(rows), decoded


# ------------------------------------------------------------------------------------------------- collapse
@torch.no_grad()
def attention_spread(model: Seq2Seq, batch: tuple[torch.Tensor, ...]) -> tuple[float, float]:
    """How peaked a model's attention is on one teacher-forced batch ``(src, src_lengths, tgt_in, tgt_out)`` (as
    :func:`make_batches` makes them).

    Returns:
        ``(max_weight, score_spread)``: the largest attention weight of each decoding step, and the spread of its
        scores ``max_i e_ti - min_i e_ti`` over the real source tokens (nats, the scores being log-weights up to a
        constant), both averaged over the real target tokens of the batch. The scores are the attention module's
        ``scores(query, memory)`` with the query the decoder uses: ``s_{t-1}`` (Bahdanau), ``h_t`` (Luong).

    Raises:
        ValueError: the model has no attention (``"none"``).

    Chapter 4, section "The unscaled Luong scores collapse".
    """
    dec = model.decoder
    if dec.attention is None:
        raise ValueError("attention_spread needs a model with attention, got one without (kind 'none')")
    was_training = model.training
    model.eval()
    try:
        src, src_len, tgt_in, tgt_out = batch
        enc = model.encode(src, src_len)
        real = enc.mask[:, 0]
        state, top, spread = enc.state, [], []
        for t in range(tgt_in.shape[1]):
            _, new_state, weights = dec.step(tgt_in[:, t], state, enc.memory, enc.mask)
            query = new_state.hidden if dec.style == "luong" else state.hidden
            scores = dec.attention.scores(query[:, None, :], enc.memory)[:, 0]
            gap = scores.masked_fill(~real, -torch.inf).amax(-1) - scores.masked_fill(~real, torch.inf).amin(-1)
            keep = tgt_out[:, t] != PAD_ID
            top.append(weights.max(-1).values[keep])
            spread.append(gap[keep])
            state = new_state
    finally:
        model.train(was_training)
    return torch.cat(top).mean().item(), torch.cat(spread).mean().item()


def _collapse_run(kind: str, scaled: bool, data: TranslationData, cfg: Seq2SeqConfig, steps: int, seed: int,
                  probe: tuple[torch.Tensor, ...]) -> list[dict]:
    threads = torch.get_num_threads()
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    try:
        seed_everything(seed)
        model = make_seq2seq(kind, len(data.src_vocab), len(data.tgt_vocab), cfg.embed_size, cfg.hidden_size,
                             cfg.attention_size, cfg.dropout, scaled=scaled)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        batches = make_batches(data.train, cfg.batch_size, np.random.default_rng([seed, 0]))[:steps]
        rows = [{"model": kind, "scaled": scaled, "step": 0, "train_loss": float("nan")}]
        rows[0].update(zip(("max_weight", "score_spread"), attention_spread(model, probe)))
        model.train()
        for step, batch in enumerate(batches, 1):
            loss, n = _loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            row = {"model": kind, "scaled": scaled, "step": step, "train_loss": loss.item() / n}
            row.update(zip(("max_weight", "score_spread"), attention_spread(model, probe)))
            rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return rows


def attention_collapse(data: TranslationData, cfg: Seq2SeqConfig, kinds: tuple[str, ...] = ("luong-dot",
                       "luong-general"), steps: int = 20, seed: int | None = None, probe_size: int = 64,
                       workers: int = 1) -> pd.DataFrame:
    """The first training steps of Luong models with unscaled and with scaled scores, side by side.

    Each kind is trained twice from the same initialization and on the same first ``steps`` batches (those of
    :func:`train_model` with this ``seed``; Adam with ``cfg.lr`` and ``cfg.clip``, constant learning rate), once
    with Luong et al.'s unscaled scores and once divided by ``sqrt(d)`` (:func:`attnbook.seq2seq.make_seq2seq`).
    Before the first step and after each, :func:`attention_spread` measures the attention on a fixed probe: the
    first ``probe_size`` validation pairs.

    Returns:
        One row per kind, scaling and step (0 = before training): ``model``, ``scaled``, ``step``, ``train_loss``
        (nats per token of that step's batch; NaN at step 0), ``max_weight``, ``score_spread`` (nats).

    Raises:
        ValueError: an unknown or attention-free kind, ``steps`` or ``probe_size`` < 1, or ``workers`` < 1.

    Chapter 4, section "The unscaled Luong scores collapse" (the mechanism is chapter 3's saturated softmax).
    """
    bad = [k for k in kinds if k not in MODEL_KINDS or k == "none"]
    if bad or not kinds:
        raise ValueError(f"kinds must be attention models of {list(MODEL_KINDS)[1:]}, got {kinds!r}")
    for name, value in (("steps", steps), ("probe_size", probe_size), ("workers", workers)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    seed = cfg.seeds[0] if seed is None else seed
    probe = make_batches(data.valid.iloc[:probe_size], probe_size)[0]
    tasks = [(kind, scaled, data, cfg, steps, seed, probe) for kind in kinds for scaled in (False, True)]
    return pd.DataFrame([row for rows in run_tasks(_collapse_run, tasks, workers) for row in rows])


# ------------------------------------------------------------------------------------------------- the run
@dataclass
class Seq2SeqResults:
    """What :func:`run_experiment` returns.

    ``summary``: one row per run (model kind and seed): ``model``, ``seed``, ``parameters``, ``train_s``,
    ``eval_s`` (seconds), ``valid_loss``, ``token_acc``, ``bleu_greedy``, ``bleu_beam``. ``by_length``: rows per run
    and length bucket; ``history``: rows per run and epoch (both with ``model`` and ``seed``). ``models`` and
    ``decoded`` (the test outputs) hold the runs of the first seed, ``config.seeds[0]``, keyed by model kind (the
    other seeds' models are not kept); ``data`` and ``config`` are the run's."""

    summary: pd.DataFrame
    by_length: pd.DataFrame
    history: pd.DataFrame
    models: dict[str, Seq2Seq] = field(repr=False)
    decoded: dict[str, dict[str, Decoded]] = field(repr=False)
    data: TranslationData = field(repr=False)
    config: Seq2SeqConfig = None


def _train_and_evaluate(kind: str, seed: int, data: TranslationData, cfg: Seq2SeqConfig, device: torch.device,
                        beam: bool, show_progress: bool, keep: bool = True, checkpoint: Checkpointer | None = None
                        ) -> tuple[dict, pd.DataFrame, pd.DataFrame, Seq2Seq | None, dict[str, Decoded] | None]:
    """One run of :func:`run_experiment`: train (from ``checkpoint``, see :func:`train_model`), evaluate, and
    return its summary row, per-length rows, history, and (``keep``) the model and its decoded outputs, else
    ``None`` for both. Runs with ``cfg.num_threads`` torch threads and restores the setting afterwards."""
    threads = torch.get_num_threads()
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    try:
        model, history = train_model(kind, data, cfg, device, show_progress, seed=seed, checkpoint=checkpoint)
        start = time.perf_counter()
        summary, per_length, dec = evaluate_model(model, data, cfg, beam=beam, device=device)
    finally:
        torch.set_num_threads(threads)
    row = {"model": kind, "seed": seed, "parameters": sum(p.numel() for p in model.parameters()),
           "train_s": history["seconds"].iloc[-1], "eval_s": time.perf_counter() - start,
           "valid_loss": history["valid_loss"].iloc[-1], **summary}
    tag = {"model": kind, "seed": seed}
    return (row, per_length.assign(**tag), history.assign(**tag), model if keep else None,
            dec if keep else None)


def _check_runs(runs, cfg: Seq2SeqConfig) -> list[tuple[str, int]]:
    if runs is None:
        return [(kind, seed) for seed in cfg.seeds for kind in cfg.models]
    runs = [tuple(r) for r in runs]
    bad = [r for r in runs if len(r) != 2 or r[0] not in MODEL_KINDS or not isinstance(r[1], int)
           or isinstance(r[1], bool) or r[1] < 0]
    if bad or not runs:
        raise ValueError(f"runs must be a non-empty list of (model kind, seed >= 0) with kinds from "
                         f"{list(MODEL_KINDS)}; got {bad or runs}")
    if len(set(runs)) != len(runs):
        raise ValueError(f"runs name a (model, seed) twice: {runs}")
    return runs


def run_experiment(cfg: Seq2SeqConfig, data: TranslationData | None = None, device: torch.device | str | None = None,
                   beam_models: tuple[str, ...] | None = None, show_progress: bool = True,
                   workers: int = 1, runs: Sequence[tuple[str, int]] | None = None,
                   beam_seeds: tuple[int, ...] | None = None) -> Seq2SeqResults:
    """Train every run (model kind, seed) on the same data, and evaluate each on the test split.

    Args:
        cfg: the configuration.
        data: prepared data (default ``cfg.data()``).
        device: default :func:`attnbook.runtime.get_device`.
        beam_models: the model kinds that are also decoded with beam search (default: all).
        show_progress: a progress bar per model (``workers=1``) or over the runs (``workers > 1``).
        workers: processes that train models side by side (joblib, ``loky`` backend), each with
            ``cfg.num_threads`` torch threads. The runs are independent and seeded, so on the CPU the results
            are identical for any number of workers (``tests/test_translation.py`` checks it); 2 halves the
            chapter's wall time on a 2-core CPU. On a GPU keep 1.
        runs: the ``(model kind, seed)`` pairs to train, in this order (put the slowest first when ``workers > 1``);
            default: every kind of ``cfg.models`` with every seed of ``cfg.seeds``.
        beam_seeds: the seeds whose runs are decoded with beam search (default: all).

    Returns:
        :class:`Seq2SeqResults`, its tables in the order of ``runs``.

    Raises:
        ValueError: if ``workers < 1``, or ``runs`` is empty, names an unknown kind, a negative seed or a run twice.

    Chapter 4, sections "Five models, one training loop" and "attention_layer_size: a layer or the context itself?".
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    runs = _check_runs(runs, cfg)
    first = cfg.seeds[0]
    device = torch.device(device) if device is not None else get_device()
    data = data if data is not None else cfg.data()
    beam_models = cfg.models if beam_models is None else beam_models
    per_model_bars = show_progress and workers == 1   # worker processes cannot draw on this page
    bar = progress(total=len(runs), desc="models", disable=not show_progress or per_model_bars)
    tasks = [(kind, seed, data, cfg, device, kind in beam_models and (beam_seeds is None or seed in beam_seeds),
              per_model_bars, seed == first) for kind, seed in runs]
    return Seq2SeqResults(*gather_runs(_train_and_evaluate, tasks, runs, first, workers, bar), data, cfg)


def gather_runs(task, tasks: list[tuple], runs: list[tuple[str, int]], first: int, workers: int,
                bar) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict, dict]:
    """Run ``task(*args)`` for each of ``tasks`` (one per ``(kind, seed)`` of ``runs``, in that order) on ``workers``
    processes, ticking ``bar``; each returns ``(row, by_length, history, model, decoded)``. Returns the summary
    (one row per run), the per-length rows, the histories, and the models and decoded outputs of seed ``first`` keyed
    by kind: the fields of :class:`Seq2SeqResults` and of chapter 8's ``TranslationResults``."""
    outputs = []
    for output in run_tasks(task, tasks, workers):
        outputs.append(output)
        bar.update(1)
    bar.close()
    rows, by_length, histories, models, decoded = zip(*outputs)
    kept = [(kind, m, d) for (kind, seed), m, d in zip(runs, models, decoded) if seed == first]
    return (pd.DataFrame(list(rows)), pd.concat(by_length, ignore_index=True),
            pd.concat(histories, ignore_index=True), {k: m for k, m, _ in kept}, {k: d for k, _, d in kept})


#: The results store of the command line (:mod:`attnbook.store`): a run is one model kind with one seed; its
#: per-length rows and its per-epoch history go into the side tables ``<name>_by_length.csv`` and
#: ``<name>_history.csv``. ``num_threads`` does not change results, and ``models`` and ``seeds`` only choose runs:
#: none of them counts as configuration.
LAYOUT = Layout(
    "seq2seq", keys=("model", "seed"),
    columns=("model", "seed", "parameters", "train_s", "eval_s", "valid_loss", "bleu_greedy", "bleu_beam",
             "token_acc"),
    tables={"by_length": ("length", "sentences", "bleu_greedy", "token_acc", "model", "seed"),
            "history": ("epoch", "train_loss", "valid_loss", "seconds", "model", "seed")},
    not_configuration=("num_threads", "models", "seeds"))


# ------------------------------------------------------------------------------------------------- stored runs
@dataclass
class StoredRuns:
    """A translation results store as read back (chapter 4's, :data:`LAYOUT`, and chapter 8's): ``runs`` (the main
    table, one row per run), ``by_length``, ``history`` (may be empty) and the provenance record ``provenance``
    (with its ``config``)."""

    runs: pd.DataFrame
    by_length: pd.DataFrame
    history: pd.DataFrame
    provenance: dict

    def usable_for(self, config: Mapping, layout: Layout | None = None) -> str:
        """``"used"`` if these runs were made with ``config`` (:func:`attnbook.store.config_differences`, ignoring
        ``layout.not_configuration``: the entries that only choose runs or threads; default :data:`LAYOUT`), else
        ``"differs in [...]"`` naming the entries that differ."""
        layout = LAYOUT if layout is None else layout
        differs = config_differences(self.provenance.get("config", {}), config, layout.not_configuration)
        return f"differs in {differs}" if differs else "used"


def read_runs(name: str, start: str | Path | None = None) -> StoredRuns | None:
    """The stored runs ``results/<name>.csv`` with ``<name>_by_length.csv``, ``<name>_history.csv`` and
    ``<name>.json``, found as :func:`attnbook.provenance.read_stored` finds them (from ``start`` upwards; on Colab
    from the book's repository), or ``None`` when the summary, the by-length table or the provenance is missing.
    Chapter 4, section "Seeds and uncertainty", reads its stored runs with it."""
    stored = read_tables(name, ("by_length", "history"), start)
    if stored is None or "by_length" not in stored.tables:
        return None
    return StoredRuns(stored.runs, stored.tables["by_length"], stored.tables.get("history", pd.DataFrame()),
                      stored.provenance)


def stored_status(stored: StoredRuns | None, config: Mapping, layout: Layout | None = None) -> str:
    """Whether ``stored`` can stand for runs of ``config``: ``"missing"`` (None), else
    :meth:`StoredRuns.usable_for`."""
    return "missing" if stored is None else stored.usable_for(config, layout)


def length_gap_change(by_length: pd.DataFrame, value: str = "token_acc", *, model: str = "bahdanau",
                      baseline: str = "none", first: str | None = None, last: str | None = None) -> pd.Series:
    """Per seed, how the advantage of ``model`` over ``baseline`` changes with the source length: ``model -
    baseline`` in the longest group ``last`` minus ``model - baseline`` in the shortest group ``first``. A positive
    change is an advantage that grows with the length, as attention's over a fixed context in Bahdanau et al.
    (2015), Fig. 2; it equals ``baseline``'s drop from ``first`` to ``last`` minus ``model``'s.

    Args:
        by_length: one row per (``model``, ``seed``, ``length`` group) with ``value`` and ``sentences``, as
            :func:`run_experiment` and the stores give them (``by_length``); other models are ignored.
        value: the column compared, e.g. ``"token_acc"`` (fraction) or ``"bleu_greedy"`` (BLEU points).
        model, baseline: the two model kinds.
        first, last: the length groups (labels of :func:`length_bucket`); default the first and the last group,
            in the table's order, that hold sentences.

    Returns:
        One value per seed that has both models in both groups (index ``seed``, sorted; in the unit of ``value``);
        empty if there is none, if no group holds sentences, or if ``first`` and ``last`` are the same group (then
        nothing changes with the length that could be measured).

    Raises:
        ValueError: a missing column, a (model, seed, length) row that occurs twice, or ``first``/``last`` not a
            group of the table.

    Chapter 4, sections "The bottleneck: quality against source length" and "Runs on all pairs".
    """
    missing = sorted({"model", "seed", "length", "sentences", value} - set(by_length.columns))
    if missing:
        raise ValueError(f"by_length lacks the columns {missing}")
    two = by_length[by_length["model"].isin([model, baseline])]
    twice = two.duplicated(["model", "seed", "length"])
    if twice.any():
        rows = two.loc[twice, ["model", "seed", "length"]].values.tolist()
        raise ValueError(f"by_length has rows twice: {rows[:5]}")
    groups = list(dict.fromkeys(by_length["length"]))
    filled = list(dict.fromkeys(by_length.loc[by_length["sentences"] > 0, "length"]))
    empty = pd.Series(dtype=float, name=value).rename_axis("seed")
    for name, group in (("first", first), ("last", last)):
        if group is not None and group not in groups:
            raise ValueError(f"{name}={group!r} is not a length group of by_length: {groups}")
    if not filled and (first is None or last is None):
        return empty
    first = filled[0] if first is None else first
    last = filled[-1] if last is None else last
    if first == last:
        return empty
    wide = two.pivot_table(index=["seed", "length"], columns="model", values=value, aggfunc="first")
    if model not in wide or baseline not in wide:
        return empty
    gap = (wide[model] - wide[baseline]).unstack("length")
    if first not in gap or last not in gap:
        return empty
    return (gap[last] - gap[first]).dropna().sort_index().rename(value)


def _signed(x: float, digits: int) -> str:
    """``x`` with its sign and ``digits`` decimals; a value that rounds to zero is ``+0.0``, never ``-0.0``."""
    return f"{(round(float(x), digits) or 0.0):+.{digits}f}"


def _check_interval(mean_diff: float, ci_low: float, ci_high: float) -> bool:
    """True if the bounds are an interval, False if both are NaN (one run: no interval); else ValueError."""
    if np.isnan(mean_diff):
        raise ValueError("mean_diff is NaN: there is no difference to describe")
    low_nan, high_nan = np.isnan(ci_low), np.isnan(ci_high)
    if low_nan != high_nan:
        raise ValueError(f"give both bounds or neither, got ci_low={ci_low}, ci_high={ci_high}")
    if not low_nan and ci_low > ci_high:
        raise ValueError(f"ci_low={ci_low} is above ci_high={ci_high}")
    return not low_nan


# ------------------------------------------------------------------------------------------------- comparisons
#: The readers' names of the model kinds, for tables and legends.
MODEL_NAMES = {"none": "no attention", "bahdanau": "Bahdanau", "luong-dot": "Luong dot",
               "luong-general": "Luong general", "luong-general-context": "Luong general, no layer"}

#: The same models as the subject or object of a sentence.
MODEL_SUBJECTS = {"none": "the model without attention", "bahdanau": "Bahdanau's model", "luong-dot": "Luong dot",
                  "luong-general": "Luong general", "luong-general-context": "Luong general without the layer"}


@dataclass(frozen=True)
class Pair:
    """One paired comparison of chapter 4: ``condition`` against ``baseline`` (conditions of :func:`compare`'s
    runs, e.g. model kinds), over the runs both have with the same seed. ``primary``: the comparison its question
    was designed to answer, decided by its 95% interval alone; the others in its family also need a corrected
    p-value (the book's one rule, :func:`attnbook.evidence.verdict`)."""

    condition: str
    baseline: str
    primary: bool = False


#: The question "does attention help, and which score?" on the short sentences: Bahdanau et al.'s comparison
#: (their RNNsearch against RNNencdec) is the primary one; the Luong scores and the ranking are a family around it.
ATTENTION_PAIRS = (Pair("bahdanau", "none", primary=True), Pair("luong-dot", "none"), Pair("luong-general", "none"),
                   Pair("luong-dot", "bahdanau"), Pair("luong-general", "bahdanau"))
#: The question from practice, ``attention_layer_size``: the layer against the context itself.
LAYER_PAIRS = (Pair("luong-general", "luong-general-context", primary=True),)
#: The runs on all pairs (long sentences included): Bahdanau's comparison first, then Luong general.
LONG_PAIRS = (Pair("bahdanau", "none", primary=True), Pair("luong-general", "none"),
              Pair("luong-general", "bahdanau"))
#: Beam search against greedy decoding, model by model (conditions of :func:`decoding_runs`); Bahdanau's model,
#: the one the chapter decodes, is the primary comparison.
BEAM_PAIRS = (Pair("bahdanau, beam", "bahdanau, greedy", primary=True),
              *(Pair(f"{k}, beam", f"{k}, greedy") for k in ("none", "luong-dot", "luong-general")))


def decoding_runs(runs: pd.DataFrame, models: Sequence[str] | None = None) -> pd.DataFrame:
    """``runs`` (one row per model and seed, with ``bleu_greedy`` and ``bleu_beam``) as one row per model, seed and
    decoding: columns ``model`` (``"<kind>, greedy"`` or ``"<kind>, beam"``), ``kind``, ``decoding``, ``seed`` and
    ``bleu``, for :func:`compare` with :data:`BEAM_PAIRS`. ``models``: the kinds to keep (default all).

    Raises:
        ValueError: a column is missing. Chapter 4, section "Beam search"."""
    missing = sorted({"model", "seed", "bleu_greedy", "bleu_beam"} - set(runs.columns))
    if missing:
        raise ValueError(f"runs lacks the columns {missing}")
    if models is not None:
        runs = runs[runs["model"].isin(models)]
    long = runs.melt(id_vars=["model", "seed"], value_vars=["bleu_greedy", "bleu_beam"], var_name="decoding",
                     value_name="bleu")
    long["decoding"] = long["decoding"].str.removeprefix("bleu_")
    long = long.rename(columns={"model": "kind"})
    long.insert(0, "model", long["kind"] + ", " + long["decoding"])
    return long.reset_index(drop=True)


def compare(runs: pd.DataFrame, pairs: Sequence[Pair], value: str = "bleu_greedy", *, n_resamples: int = 9999,
            seed: int = 0) -> pd.DataFrame:
    """Each comparison of ``pairs`` over the runs in ``runs`` (one row per ``model`` and ``seed``; a ``device``
    column, if any, pairs runs only on the same kind of device), by the book's one rule.

    Returns:
        One row per pair (:func:`attnbook.experiments.masking_report.paired_table`): ``condition, baseline,
        n_pairs``, ``mean_baseline, mean_condition, mean_diff`` (condition minus baseline, in the unit of
        ``value``), ``ci_low, ci_high`` (bootstrap 95% interval of the mean paired difference), ``p_value``
        (Wilcoxon), ``rank_biserial``, ``n_better, n_worse, n_equal``, ``primary``, ``p_holm`` (Holm over the
        answered secondary pairs) and ``verdict`` (:func:`attnbook.evidence.verdict`: ``"higher"``, ``"lower"``,
        ``"no difference resolved"``, :data:`attnbook.evidence.CORRECTED` or :data:`attnbook.evidence.NOT_YET`).

    Raises:
        ValueError: ``runs`` lacks ``model``, ``seed`` or ``value``, or a run occurs twice.

    Chapter 4, sections "How sure are we?", "``attention_layer_size``", "Beam search" and "Runs on all pairs".
    """
    from .masking_report import paired_table, runs_by_kind

    frame = runs_by_kind(runs, ("model",), lambda row: row["model"], value)
    return paired_table(frame, list(pairs), {}, value=value, n_resamples=n_resamples, seed=seed)


def evidence_table(table: pd.DataFrame, labels: Mapping[str, str] | None = None, digits: int = 2) -> pd.DataFrame:
    """The rows of :func:`compare` as the evidence page shows them: ``comparison`` ("condition − baseline" in the
    readers' words, ``labels`` or :data:`MODEL_NAMES`), ``primary`` ("yes"/"no"), ``paired runs``, ``mean
    difference``, ``95% interval``, ``Wilcoxon p``, ``Holm p`` ("–" for a primary comparison), ``rank-biserial``,
    ``better / worse / equal`` (the paired runs in each direction) and ``verdict``. Chapter 4's evidence page."""
    labels = {**MODEL_NAMES, **(labels or {})}

    def name(condition: str) -> str:   # "bahdanau, beam" (decoding_runs) -> "Bahdanau, beam"
        kind, _, rest = condition.partition(", ")
        return labels.get(condition) or (f"{labels.get(kind, kind)}, {rest}" if rest else condition)

    def fmt(x, spec=f"+.{digits}f"):
        return "–" if pd.isna(x) else format(x, spec)

    rows = []
    for _, r in table.iterrows():
        rows.append({
            "comparison": f"{name(r['condition'])} − {name(r['baseline'])}",
            "primary": "yes" if r["primary"] else "no", "paired runs": int(r["n_pairs"]),
            "mean difference": fmt(r["mean_diff"]),
            "95% interval": "–" if pd.isna(r["ci_low"]) else f"{fmt(r['ci_low'])} to {fmt(r['ci_high'])}",
            "Wilcoxon p": fmt(r["p_value"], ".3f"), "Holm p": fmt(r["p_holm"], ".3f"),
            "rank-biserial": fmt(r["rank_biserial"], "+.2f"),
            "better / worse / equal": f"{int(r['n_better'])} / {int(r['n_worse'])} / {int(r['n_equal'])}",
            "verdict": r["verdict"]})
    return pd.DataFrame(rows)

def interval_words(ci_low: float, ci_high: float, digits: int = 1) -> str:
    """``"95% interval +6.5 to +6.8"`` (signed, ``digits`` decimals), ``"both 95% bounds round to +6.5"`` when they
    print the same, or ``"no interval from one run"`` when both bounds are NaN. Raises ValueError for one NaN bound
    or ``ci_low > ci_high``. Chapter 4."""
    if not _check_interval(0.0, ci_low, ci_high):
        return "no interval from one run"
    low, high = _signed(ci_low, digits), _signed(ci_high, digits)
    if low == high:  # a narrow interval: "95% interval +6.5 to +6.5" would read as a slip
        return f"both 95% bounds round to {low}"
    return f"95% interval {low} to {high}"


def verdict_words(verdict: str, mean_diff: float, baseline: str) -> str:
    """A verdict of :func:`attnbook.evidence.verdict` in words that follow "X scores", naming no test:
    ``"higher than <baseline>"``, ``"lower than <baseline>"``, ``"within the run-to-run noise of <baseline>"`` (no
    difference resolved), ``"higher than <baseline> on average (shown for information, not tested)"`` (a comparison
    the runs were not designed to test: resolved by its interval but not after the family's correction; "lower" by
    the sign of ``mean_diff``), or
    ``"not yet compared with <baseline>"`` (too few paired runs).

    Raises:
        ValueError: ``verdict`` is not one of :data:`attnbook.evidence.VERDICTS`, or ``mean_diff`` is NaN for a
            corrected verdict.
    """
    from ..evidence import CORRECTED, NOT_YET, VERDICTS

    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {VERDICTS}, got {verdict!r}")
    if verdict in ("higher", "lower"):
        return f"{verdict} than {baseline}"
    if verdict == "no difference resolved":
        return f"within the run-to-run noise of {baseline}"
    if verdict == NOT_YET:
        return f"not yet compared with {baseline}"
    assert verdict == CORRECTED
    if np.isnan(mean_diff):
        raise ValueError("mean_diff is NaN: there is no difference to describe")
    side = "higher" if mean_diff > 0 else "lower"
    return f"{side} than {baseline} on average (shown for information, not tested)"


def paired_sentence(subject: str, baseline: str, row: Mapping, unit: str = "BLEU", digits: int = 1) -> str:
    """One verdict sentence with one effect and its interval, from one row of :func:`compare`, e.g.
    ``"Bahdanau's model scores higher than the model without attention: +10.3 BLEU (95% interval +9.9 to +10.9)."``
    (:func:`verdict_words`, :func:`interval_words`; the subject's first letter is capitalized). Without enough
    paired runs (``row["verdict"]`` is :data:`attnbook.evidence.NOT_YET`) it says only that, with the number.

    Raises:
        ValueError: as :func:`verdict_words`; ``mean_diff`` NaN with a verdict that has one; half an interval.
    """
    from ..evidence import NOT_YET

    head = f"{subject[:1].upper()}{subject[1:]}"
    if row["verdict"] == NOT_YET:
        n = int(row["n_pairs"])
        return (f"{head} is {verdict_words(NOT_YET, math.nan, baseline)}: "
                f"{'no paired run' if n == 0 else f'{n} paired run' + ('s' if n > 1 else '')}, too few.")
    _check_interval(row["mean_diff"], row["ci_low"], row["ci_high"])
    unit = f" {unit}" if unit else ""
    return (f"{head} scores {verdict_words(row['verdict'], row['mean_diff'], baseline)}: "
            f"{_signed(row['mean_diff'], digits)}{unit} ({interval_words(row['ci_low'], row['ci_high'], digits)}).")


def change_verdict(mean_change: float, ci_low: float, ci_high: float, n_runs: int) -> str:
    """Whether an advantage changes with the source length (:func:`length_gap_change`, one value per run), in words
    that follow "the advantage", by the book's one rule (:func:`attnbook.evidence.verdict`): ``"grows"`` or
    ``"shrinks"`` when the 95% interval of the per-run change excludes zero, ``"does not change resolvably"`` when
    it includes zero, ``"is not yet measured over enough runs"`` with fewer than
    :data:`attnbook.evidence.MIN_PAIRS` runs or no interval.

    Raises:
        ValueError: ``mean_change`` is NaN, only one bound is NaN, ``ci_low > ci_high`` or ``n_runs < 0``.

    Chapter 4, sections "The bottleneck: quality against source length" and "Runs on all pairs".
    """
    from ..evidence import verdict

    _check_interval(mean_change, ci_low, ci_high)
    word = verdict(n_runs, ci_low, ci_high)
    return {"higher": "grows", "lower": "shrinks", "no difference resolved": "does not change resolvably"}.get(
        word, "is not yet measured over enough runs")


# ------------------------------------------------------------------------------------------------- the chapter's tables
def runs_behind_chapter(name: str = "seq2seq_quick", config: "Seq2SeqConfig | None" = None,
                        start: str | Path | None = None) -> StoredRuns:
    """The stored runs behind chapter 4's results tables, checked against the configuration they must have been
    made with (default :meth:`Seq2SeqConfig.quick`, the chapter's sizes; models, seeds and threads aside).

    Raises:
        FileNotFoundError: the store ``results/<name>.csv`` (with its side tables and record) is not found.
        ValueError: it was made with another configuration (the message names the entries that differ).

    Chapter 4, section "Five models, one training loop".
    """
    stored = read_runs(name, start)
    if stored is None:
        raise FileNotFoundError(f"no stored runs {name!r} (results/{name}.csv with its side tables and record)")
    status = stored.usable_for(asdict(Seq2SeqConfig.quick() if config is None else config))
    if status != "used":
        raise ValueError(f"the stored runs {name!r} were made with another configuration: {status}")
    return stored


#: Bahdanau et al. (2015), Table 1: BLEU on the WMT'14 English-French test set, all sentences and those without
#: unknown words.
PAPER_TABLE1 = {"RNNencdec-30": (13.93, 24.19), "RNNsearch-30": (21.50, 31.44), "RNNencdec-50": (17.82, 26.71),
                "RNNsearch-50": (26.75, 34.16), "RNNsearch-50* (trained longer)": (28.45, 36.15),
                "Moses (phrase-based)": (33.30, 35.63)}

#: Bahdanau et al. (2015), sections 4-5 and appendix B: data, sizes and training of their models.
PAPER_SETTINGS = {"words": 348e6, "vocab": 30_000, "hidden": 1000, "embed": 620, "batch": 80, "days": 5,
                  "fig2_max_len": 60}


def paper_bleu_table(ours: Mapping[str, float], label: str = "this chapter, Tatoeba En-Es") -> pd.DataFrame:
    """Bahdanau et al.'s Table 1 (:data:`PAPER_TABLE1`) with our models below it: ``ours`` maps a model kind to its
    BLEU (e.g. the mean beam-search BLEU of its runs), shown under the readers' names (:data:`MODEL_NAMES`).
    Columns ``source, model, BLEU, BLEU, no unknown words`` (NaN for ours: our test has none). Chapter 4, section
    "Beside the papers, for scale"."""
    paper = [{"source": "Bahdanau et al. 2015, WMT'14 En-Fr", "model": m, "BLEU": a, "BLEU, no unknown words": b}
             for m, (a, b) in PAPER_TABLE1.items()]
    mine = [{"source": label, "model": MODEL_NAMES.get(k, k), "BLEU": float(v), "BLEU, no unknown words": np.nan}
            for k, v in ours.items()]
    return pd.DataFrame(paper + mine)


def settings_table(cfg: "Seq2SeqConfig", sizes: Mapping[str, int], minutes_per_model: float,
                   device: str = "a CPU") -> pd.DataFrame:
    """Bahdanau et al.'s settings (:data:`PAPER_SETTINGS`) against ``cfg``'s: training data, sentence length,
    vocabulary, model size, training and test references, one row each. ``sizes``: the prepared data's
    :meth:`~attnbook.data.translation.TranslationData.sizes` (``train_pairs, src_vocab, tgt_vocab, test_pairs,
    test_sources``); ``minutes_per_model``: the measured training time of one model on ``device``. Chapter 4."""
    p = PAPER_SETTINGS
    return pd.DataFrame({
        "Bahdanau et al. 2015": [
            f"{p['words'] / 1e6:.0f}M words (WMT'14 En-Fr)", "up to 30 or 50 words", f"{p['vocab']:,} per language",
            f"{p['hidden']} units (encoder: {p['hidden']} per direction), embeddings {p['embed']}",
            f"about {p['days']} days per model, Adadelta, batches of {p['batch']}",
            "one reference, English-French news"],
        "this chapter": [
            f"{sizes['train_pairs']:,} Tatoeba pairs", f"up to {cfg.max_src_len} tokens",
            f"{sizes['src_vocab']:,} (En) / {sizes['tgt_vocab']:,} (Es)",
            f"{cfg.hidden_size} units (encoder: {cfg.hidden_size // 2} per direction), embeddings {cfg.embed_size}",
            f"about {minutes_per_model:.1f} minutes per model on {device}, Adam, batches of {cfg.batch_size}",
            f"all Tatoeba translations ({sizes['test_pairs']:,} for {sizes['test_sources']:,} sentences)"]},
        index=["training data", "sentence length", "vocabulary", "model size", "training", "test references"])


#: One colour per model kind in every figure of chapter 4.
MODEL_COLORS = {"none": "0.3", "bahdanau": "C0", "luong-dot": "C1", "luong-general": "C2",
                "luong-general-context": "C4"}


def _style(kind: str) -> dict:
    """The model's colour; the model without attention thick and dashed, as Bahdanau et al.'s Fig. 2 draws
    RNNencdec."""
    if kind == "none":
        return dict(lw=2.5, ls="--", color=MODEL_COLORS["none"])
    return dict(lw=1.2, color=MODEL_COLORS.get(kind))


def plot_bleu(runs: pd.DataFrame, beam_size: int, order: Sequence[str] | None = None, ax=None):
    """Grouped bars of BLEU per model, greedy and beam search: the mean over the runs, with a line from the lowest
    to the highest run. ``runs``: one row per model and seed with ``bleu_greedy`` and ``bleu_beam``; ``order``: the
    kinds to show (default as they occur), labelled with :data:`MODEL_NAMES`. Returns the axes. Chapter 4, section
    "BLEU on held-out sentences"."""
    import matplotlib.pyplot as plt

    order = list(dict.fromkeys(runs["model"])) if order is None else list(order)
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    x = np.arange(len(order))
    for shift, column, label in ((-0.2, "bleu_greedy", "greedy"), (0.2, "bleu_beam", f"beam {beam_size}")):
        stats = runs.groupby("model")[column].agg(["mean", "min", "max"]).loc[order]
        ax.bar(x + shift, stats["mean"], 0.4, label=label,
               yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]], capsize=3)
    ax.set_xticks(x, [MODEL_NAMES.get(k, k) for k in order], rotation=15, ha="right")
    ax.set_ylabel("BLEU")
    ax.legend(loc="lower right")
    return ax


def plot_history(history: pd.DataFrame, order: Sequence[str] | None = None, ax=None):
    """Validation loss after each epoch per model: the mean over the runs (markers and a line), with a band from
    the lowest to the highest run; legend in :data:`MODEL_NAMES`. Returns the axes. Chapter 4."""
    import matplotlib.pyplot as plt

    order = list(dict.fromkeys(history["model"])) if order is None else list(order)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.4))
    for kind in order:
        stats = history[history["model"] == kind].groupby("epoch")["valid_loss"].agg(["mean", "min", "max"])
        line = ax.plot(stats.index, stats["mean"], marker="o", label=MODEL_NAMES.get(kind, kind), **_style(kind))[0]
        ax.fill_between(stats.index, stats["min"], stats["max"], color=line.get_color(), alpha=0.15)
    ax.set(xlabel="epoch", ylabel="validation loss (nats / token)")
    ax.set_xticks(sorted(history["epoch"].unique()))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return ax


def plot_by_length(by_length: pd.DataFrame, value: str = "bleu_greedy", order: Sequence[str] | None = None,
                   ax=None, ylabel: str = "BLEU (greedy)"):
    """``value`` against the source-length group, in the style of Bahdanau et al.'s Fig. 2: per model the mean
    over the runs, with a band from the lowest to the highest run; under each group its number of test sentences;
    groups without test sentences left out; legend in :data:`MODEL_NAMES`. Returns the axes. Chapter 4."""
    import matplotlib.pyplot as plt

    filled = by_length[by_length["sentences"] > 0]
    order = list(dict.fromkeys(filled["model"])) if order is None else list(order)
    groups = list(dict.fromkeys(filled["length"]))
    sizes = filled.drop_duplicates("length").set_index("length")["sentences"]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6))
    for kind in order:
        stats = filled[filled["model"] == kind].groupby("length")[value].agg(["mean", "min", "max"])
        stats = stats.reindex(groups).dropna(subset=["mean"])
        x = [groups.index(g) for g in stats.index]
        line = ax.plot(x, stats["mean"], marker="o", label=MODEL_NAMES.get(kind, kind), **_style(kind))[0]
        ax.fill_between(x, stats["min"], stats["max"], color=line.get_color(), alpha=0.15)
    ax.set_xticks(range(len(groups)), [f"{g}\n({sizes[g]})" for g in groups])
    ax.set(xlabel="source length in tokens (sentences)", ylabel=ylabel)
    ax.legend(fontsize=7)
    return ax


def beam_tree(steps, labels: Sequence[str], *, ax=None, title: str | None = None):
    """Draw a beam search as d2l draws it: one column per step, the kept hypotheses ranked top to bottom, each node
    labelled with its token and total log-probability, joined to the node it extends; the returned translation's
    path in bold, finished hypotheses carried along (``labels`` empty) as small grey dots.

    Args:
        steps: a table with one row per kept hypothesis and step, columns ``step, rank, parent, score, chosen``
            (as :func:`attnbook.seq2seq.beam_steps` returns).
        labels: one token string per row of ``steps`` (empty = a finished hypothesis carried along).
        ax: axes to draw on; ``None`` = a new figure.
        title: the axes' title.

    Returns:
        The axes.

    Raises:
        ValueError: ``labels`` does not have one entry per row of ``steps``, or a column is missing.

    Chapter 4, section "Beam search".
    """
    import matplotlib.pyplot as plt

    missing = sorted({"step", "rank", "parent", "score", "chosen"} - set(steps.columns))
    if missing:
        raise ValueError(f"steps lacks the columns {missing}")
    if len(labels) != len(steps):
        raise ValueError(f"{len(labels)} labels for {len(steps)} rows of steps")
    n_steps, k = int(steps["step"].max()), int(steps["rank"].max()) + 1
    if ax is None:
        _, ax = plt.subplots(figsize=(1.35 * n_steps + 1.5, 0.55 * k + 1.2))
    ax.grid(False)
    kept = {(int(r.step), int(r.rank)) for r in steps.itertuples()}
    for row, label in zip(steps.itertuples(), labels):
        step, rank, parent = int(row.step), int(row.rank), int(row.parent)
        bold = bool(row.chosen)
        if step > 1 and (step - 1, parent) in kept:
            ax.plot([step - 1, step], [parent, rank], color="black" if bold else "0.7", lw=2.0 if bold else 0.8,
                    zorder=1)
        elif step == 1:
            ax.plot([0, 1], [0, rank], color="black" if bold else "0.7", lw=2.0 if bold else 0.8, zorder=1)
        if label:
            ax.text(step, rank, f"{label}\n{row.score:.1f}", ha="center", va="center", fontsize=7.5, zorder=2,
                    fontweight="bold" if bold else "normal",
                    bbox=dict(boxstyle="round,pad=0.25", fc="#fde9c9" if bold else "white", ec="0.5", lw=0.6))
        else:
            ax.plot(step, rank, "o", color="0.6", ms=3, zorder=2)
    ax.text(0, 0, "<bos>", ha="center", va="center", fontsize=7.5, zorder=2,
            bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="0.5", lw=0.6))
    ax.set_xlim(-0.6, n_steps + 0.6)
    ax.set_ylim(k - 0.4, -0.6)
    ax.set_xticks(range(n_steps + 1))
    ax.set_yticks(range(k), [f"{r + 1}" for r in range(k)])
    ax.set(xlabel="decoding step", ylabel="rank in the beam")
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    return ax


def store_translation_runs(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg, *, layout: Layout,
                           config: dict, device: torch.device, mode: str, overrides: dict, store_task,
                           task_args, checkpointer) -> tuple[pd.DataFrame, int]:
    """The store half of the translation command lines (chapter 4's and chapter 8's): open ``args.out`` with
    ``layout`` and ``config`` (one that cannot be resumed is a usage error), then, in one command-line
    :class:`~attnbook.store.Session`, train every (kind of ``cfg.models``, seed of ``cfg.seeds``) run not yet stored
    with ``store_task(*task_args(kind, seed, data))`` on ``args.workers`` processes. Each finished run is appended
    with its side tables ``by_length`` and ``history``, its checkpoint resumes are recorded, the session is
    checkpointed, and its training checkpoint (``checkpointer(kind, seed)``, with ``--checkpoint-dir``) removed.

    Returns:
        ``(every stored run, number trained now)``.
    """
    check_backend_arguments(parser, args)
    try:
        store = ResultsStore(args.out, layout, config).open()
    except StoreError as err:
        parser.error(str(err))
    sizes = {"data_sizes": store.previous.get("data_sizes")}
    engine = backend_record(args)

    def describe(wall: float) -> dict:
        return provenance(wall, device=device, mode=mode, overrides=overrides, workers=args.workers, **engine,
                          **sizes,
                          note="BLEU: sacreBLEU corpus BLEU, case-insensitive, 13a tokenization, all Tatoeba "
                               "translations of a held-out English sentence as references")

    extra = {"checkpoint_dir": str(args.checkpoint_dir)} if args.checkpoint_dir else {}
    with store, Session(store, describe, workers=args.workers, **engine, **extra) as session, \
            parallel_backend(args.backend, args.scheduler):
        todo = [(kind, seed) for seed in cfg.seeds for kind in cfg.models
                if not store.has({"model": kind, "seed": seed})]
        if todo:
            data = cfg.data()
            sizes["data_sizes"] = data.sizes()
            tasks = [task_args(kind, seed, data) for kind, seed in todo]
            for row, by_length, history, resumes in run_tasks(store_task, tasks, args.workers):
                store.append(row, {"by_length": by_length, "history": history})
                record_resumes(session, {"model": row["model"], "seed": row["seed"]}, resumes)
                session.checkpoint()
                if args.checkpoint_dir:   # the run is stored: its checkpoint is no longer needed
                    checkpointer(row["model"], row["seed"]).remove()
        return store.frame(), len(todo)


def _checkpointer(directory: str | Path, kind: str, seed: int, cfg: Seq2SeqConfig,
                  every_s: float | None) -> Checkpointer:
    """The checkpoint of the run (``kind``, ``seed``) in ``directory``: its configuration is the store's, less
    what only chooses runs or does not change results (:data:`LAYOUT`'s ``not_configuration``)."""
    config = {k: v for k, v in asdict(cfg).items() if k not in LAYOUT.not_configuration}
    return Checkpointer(directory, "seq2seq", {"model": kind, "seed": seed}, config, every_s)


def _store_task(kind: str, seed: int, data: TranslationData, cfg: Seq2SeqConfig, device: torch.device,
                show_progress: bool, checkpoint_dir: str | Path | None = None, every_s: float | None = None):
    """One run for the command line: its summary row, per-length rows, history (the model stays behind) and the
    resumes of its checkpoint (a list, empty if it trained in one go or without checkpoints)."""
    checkpoint = _checkpointer(checkpoint_dir, kind, seed, cfg, every_s) if checkpoint_dir is not None else None
    row, per_length, history, _, _ = _train_and_evaluate(kind, seed, data, cfg, device, True, show_progress,
                                                         keep=False, checkpoint=checkpoint)
    return row, per_length, history, checkpoint.resumes if checkpoint is not None else []


def main(argv: list[str] | None = None) -> Path:
    """CLI: train and evaluate every run (model kind, seed) of the configuration and store each as it finishes,
    with provenance (see the module docstring). Resumable: runs already in ``--out`` are skipped (same
    configuration required; ``--models`` and ``--seeds`` only choose runs).

    Returns the path of ``--out``. An interrupted run (Ctrl-C, SIGTERM) records its session as interrupted and exits
    with 130 or 143."""
    parser = argparse.ArgumentParser(prog="python -m attnbook.experiments.seq2seq",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=Seq2SeqConfig.presets(), default=None,
                        help="default: ATTNBOOK_MODE / device; cpu: all pairs at CPU sizes (Seq2SeqConfig.cpu)")
    parser.add_argument("--out", type=csv_path, default=Path("results/seq2seq_full.csv"),
                        help="the summary CSV; the others go beside it")
    parser.add_argument("--device", type=device_arg, default=None, help="cpu, cuda, ... (default: cuda when available)")
    parser.add_argument("--models", nargs="+", choices=list(MODEL_KINDS), default=None)
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help="number of model seeds (0..N-1); default: the mode's (quick 1, full 3)")
    parser.add_argument("--epochs", type=positive_int, default=None, help="override the configuration's epochs")
    parser.add_argument("--n-train", type=positive_int, default=None, help="override the number of training pairs")
    parser.add_argument("--n-valid", type=positive_int, default=None,
                        help="override the number of validation sentences")
    parser.add_argument("--n-test", type=positive_int, default=None, help="override the number of test sentences")
    add_backend_arguments(parser)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads per worker (default: the mode's; quick 1, full torch's own)")
    add_checkpoint_arguments(parser)
    args = parser.parse_args(argv)
    every_s = checkpoint_every_s(parser, args)
    mode = args.mode or get_mode()
    cfg = Seq2SeqConfig.for_mode(mode)
    overrides = {k: v for k, v in (("epochs", args.epochs), ("n_train", args.n_train), ("n_valid", args.n_valid),
                                   ("n_test", args.n_test),
                                   ("models", tuple(args.models) if args.models else None),
                                   ("seeds", tuple(range(args.seeds)) if args.seeds else None),
                                   ("num_threads", args.threads)) if v is not None}
    cfg = replace(cfg, **overrides)
    device = torch.device(args.device) if args.device else get_device()
    out, started = args.out, time.perf_counter()
    summary, n_trained = store_translation_runs(
        parser, args, cfg, layout=LAYOUT, config=asdict(cfg), device=device, mode=mode, overrides=overrides,
        store_task=_store_task,
        task_args=lambda kind, seed, data: (kind, seed, data, cfg, device, args.workers == 1, args.checkpoint_dir,
                                            every_s),
        checkpointer=lambda kind, seed: _checkpointer(args.checkpoint_dir, kind, seed, cfg, None))
    print(summary.to_string(index=False))
    print(f"{len(summary)} runs in {out} and its companions ({n_trained} trained now, "
          f"{time.perf_counter() - started:.0f} s)")
    return out


if __name__ == "__main__":  # pragma: no cover
    main()
