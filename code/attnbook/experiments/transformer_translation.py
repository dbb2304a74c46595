"""Chapter 8's translator: a small Transformer against chapter 4's Bahdanau model, on chapter 4's data and split.

Explained in chapter 8, "Self-attention and the Transformer" (``chapters/08_self_attention_transformer``), section
"A Transformer translator". Both models read the English-Spanish Tatoeba pairs of chapter 4, split and encoded by
:func:`attnbook.data.translation.prepare_translation` with chapter 4's split and vocabularies (quick mode: 6,000 of
chapter 4's training pairs, fewer than chapter 4's own quick mode uses, to fit the page's time), see the
same batches in the same order (:func:`attnbook.experiments.seq2seq.make_batches`, seeded by ``seed`` and the
epoch), are decoded by :func:`attnbook.seq2seq.greedy_decode` and :func:`attnbook.seq2seq.beam_search` and scored with
sacreBLEU on all references (:func:`attnbook.experiments.seq2seq.corpus_bleu`). The models:

- ``"transformer"``: :class:`attnbook.transformer.Transformer` (pre-LN, sinusoidal positions), trained with Adam and
  a linear learning-rate warm-up (Vaswani et al. 2017, section 5.3, without their decay);
- ``"bahdanau"``: chapter 4's GRU encoder-decoder with additive attention
  (:func:`attnbook.seq2seq.make_seq2seq`), at smaller sizes than chapter 4's quick mode (64, 96), 3 epochs. In quick
  mode the Transformer trains for as many epochs, which took about as much CPU time on a busy 2-core machine (per
  epoch, 0.8 to 1.3 times the Bahdanau model's, depending on the load); the chapter shows the measured times.

Configuration is :class:`TranslationConfig` (``quick()`` for a 2-core CPU, ``full()`` for all pairs on a GPU);
:func:`run_experiment` returns plain data. The command line stores the results with their provenance in a results
store (:mod:`attnbook.store`; one run = one model; resumable)::

    python -m attnbook.experiments.transformer_translation --mode full --out results/transformer_translation_full.csv

which writes the summary (one row per model), ``<name>_by_length.csv`` (BLEU and token accuracy per source-length
bucket), ``<name>_history.csv`` (losses per epoch) and the provenance ``<name>.json``. ``--epochs`` (both models),
``--n-train``, ``--n-valid`` and ``--n-test`` override the configuration; ``--checkpoint-dir DIR`` (and
``--checkpoint-minutes M``) save each run's training state after every epoch (and every ``M`` minutes) and resume
it exactly (:mod:`attnbook.checkpoint`), as chapter 4's CLI does; ``tools/gpu_job.sh transformer_translation`` runs
the full-size comparison this way on a GPU (see the README).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..checkpoint import Checkpointer, add_checkpoint_arguments, checkpoint_every_s, record_resumes, set_rng_states
from ..data.translation import TranslationData, prepare_translation
from ..runtime import ModeConfig, get_device, get_mode, progress, run_tasks, seed_everything
from ..seq2seq import Decoded, Seq2Seq, make_seq2seq
from ..store import Layout, ResultsStore, Session, StoreError, csv_path, device_arg, positive_int
from ..text import detokenize
from ..transformer import Transformer
from .seq2seq import (_loss, _mean_loss, corpus_bleu, held_out_sources, length_bucket, make_batches,  # chapter 4's
                      token_accuracy, translate)

__all__ = ["MODELS", "TranslationConfig", "TranslationResults", "build_model", "train_model", "evaluate",
           "run_experiment", "main", "LAYOUT"]

#: The models of the comparison.
MODELS = ("transformer", "bahdanau")


@dataclass(frozen=True)
class TranslationConfig(ModeConfig):
    """Everything that defines one run of chapter 8's translation comparison.

    Data (as :func:`attnbook.data.translation.prepare_translation`; the quick values are chapter 4's vocabularies and
    split, with 6,000 training pairs):
    ``max_src_len``/``max_tgt_len`` (tokens), ``n_train`` (pairs), ``n_valid``/``n_test`` (source sentences, each with
    all its references), ``min_freq``, ``max_src_vocab``, ``max_tgt_vocab``, ``covered_only``, ``seed`` (also seeds
    the batches and both initializations).

    The Transformer: ``d_model``, ``nhead``, ``num_layers`` (encoder and decoder each), ``dim_feedforward``,
    ``dropout``, ``norm_first`` (pre-LN), ``positional`` (:data:`attnbook.transformer.POSITIONAL_KINDS`); Adam at
    ``lr`` after a linear warm-up over ``warmup_steps`` steps, for ``epochs`` epochs.

    The baseline, chapter 4's Bahdanau model: ``embed_size``, ``hidden_size`` (decoder; the bidirectional encoder
    has half per direction), ``baseline_attention_size`` (``None`` = ``hidden_size``), ``baseline_dropout``; Adam at
    ``baseline_lr``, no warm-up, for ``baseline_epochs`` epochs.

    Both: ``batch_size``, ``clip`` (gradient norm), ``beam_size``, ``length_penalty``, ``max_decode_len``,
    ``length_edges`` (source-length buckets), ``models`` (a subset of :data:`MODELS`), ``num_threads`` (torch threads
    during a run; ``None`` = leave torch's setting).
    """

    max_src_len: int | None = 12
    max_tgt_len: int | None = 14
    n_train: int | None = 6_000
    n_valid: int | None = 300
    n_test: int | None = 600
    min_freq: int = 1
    max_src_vocab: int | None = 1_000
    max_tgt_vocab: int | None = 1_500
    covered_only: bool = True
    seed: int = 0
    d_model: int = 64
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 128
    dropout: float = 0.0
    norm_first: bool = True
    positional: str = "sinusoidal"
    lr: float = 3e-3
    warmup_steps: int = 100
    epochs: int = 3
    embed_size: int = 64
    hidden_size: int = 96
    baseline_attention_size: int | None = None
    baseline_dropout: float = 0.0
    baseline_lr: float = 5e-3
    baseline_epochs: int = 3
    batch_size: int = 64
    clip: float = 1.0
    beam_size: int = 4
    length_penalty: float = 1.0
    max_decode_len: int = 30
    length_edges: tuple[int, ...] = (4, 6, 8, 10)
    models: tuple[str, ...] = MODELS
    num_threads: int | None = 1
    extra: dict = field(default_factory=dict)

    @classmethod
    def quick(cls) -> "TranslationConfig":
        """Chapter 4's quick split and vocabularies (sources of at most 12 tokens, the 1,000 most frequent English and
        1,500 most frequent Spanish tokens) with 6,000 training pairs (chapter 4's quick mode uses 35,000); a
        Transformer with d_model 64, 4 heads, 2 + 2 pre-LN layers, feed-forward 128, 3 epochs; a Bahdanau model of
        chapter 4's kind at (64, 96) for 3 epochs."""
        return cls()

    @classmethod
    def full(cls) -> "TranslationConfig":
        """All pairs with sources of up to 50 tokens and vocabularies of the tokens seen twice (at most 30,000), as
        chapter 4's full mode; a Transformer with d_model 256, 8 heads, 3 + 3 layers, feed-forward 1024, dropout 0.1,
        4,000 warm-up steps, 10 epochs; Bahdanau's model at chapter 4's full sizes (620, 1000), 10 epochs. For a
        GPU; not yet timed."""
        return cls(max_src_len=50, max_tgt_len=60, n_train=None, n_valid=None, n_test=None, min_freq=2,
                   max_src_vocab=30_000, max_tgt_vocab=30_000, covered_only=False, d_model=256, nhead=8,
                   num_layers=3, dim_feedforward=1024, dropout=0.1, lr=1e-3, warmup_steps=4_000, epochs=10,
                   embed_size=620, hidden_size=1000, baseline_attention_size=1000, baseline_dropout=0.2,
                   baseline_lr=1e-3, baseline_epochs=10, batch_size=80, max_decode_len=80, num_threads=None,
                   length_edges=(4, 6, 8, 10, 13, 16, 20, 30))

    def data(self) -> TranslationData:
        """The prepared data (:func:`attnbook.data.translation.prepare_translation`)."""
        return prepare_translation(max_src_len=self.max_src_len, max_tgt_len=self.max_tgt_len, n_train=self.n_train,
                                   n_valid=self.n_valid, n_test=self.n_test, min_freq=self.min_freq,
                                   max_src_vocab=self.max_src_vocab, max_tgt_vocab=self.max_tgt_vocab,
                                   covered_only=self.covered_only, seed=self.seed)


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


def train_model(kind: str, data: TranslationData, cfg: TranslationConfig, device: torch.device | str = "cpu",
                show_progress: bool = False, checkpoint: Checkpointer | None = None) -> tuple[Seq2Seq, pd.DataFrame]:
    """Train one model with teacher forcing: cross-entropy per target token (pads ignored), Adam, gradient norm
    clipped to ``cfg.clip``.

    ``seed_everything(cfg.seed)`` comes first, and the batches of epoch ``e`` are
    ``make_batches(data.train, cfg.batch_size, np.random.default_rng([cfg.seed, e]))`` for every model, as in
    chapter 4: both models see the same batches in the same order. The Transformer's learning rate rises linearly
    from ``lr / warmup_steps`` to ``lr`` over the first ``warmup_steps`` steps and then stays; the baseline's is
    ``baseline_lr`` throughout.

    ``checkpoint``: a :class:`attnbook.checkpoint.Checkpointer` for this run, or None (none). With one, training
    resumes from its checkpoint if there is one and saves one after every epoch (and inside an epoch when it is
    :meth:`~attnbook.checkpoint.Checkpointer.due`); on the CPU a resumed run gives bitwise the same model and
    history (but ``seconds``) as an uninterrupted one. The checkpoint is left in place.

    Returns:
        ``(model, history)``: the model in eval mode, and one row per epoch with ``epoch``, ``train_loss``,
        ``valid_loss`` (nats per target token) and ``seconds`` (cumulative training time, validation excluded,
        across resumes).

    Raises:
        ValueError: an unknown ``kind``, or a checkpoint of another run or configuration.
    """
    _check_kind(kind)
    seed_everything(cfg.seed)
    device = torch.device(device)
    model = build_model(kind, len(data.src_vocab), len(data.tgt_vocab), cfg).to(device)
    transformer = kind == "transformer"
    lr, epochs = (cfg.lr, cfg.epochs) if transformer else (cfg.baseline_lr, cfg.baseline_epochs)
    warmup = cfg.warmup_steps if transformer else 0
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
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
    bar = progress(total=epochs, desc=f"training {kind}", disable=not show_progress)
    bar.update(min(first_epoch, epochs))
    for epoch in range(first_epoch, epochs):
        batches = make_batches(data.train, cfg.batch_size, np.random.default_rng([cfg.seed, epoch]), device)
        skip = first_step if epoch == first_epoch else 0
        if skip == 0:   # a new epoch (not one resumed inside): its running sums start at zero
            total, count = 0.0, 0
        model.train()
        start = time.perf_counter()
        for step, batch in enumerate(batches[skip:], skip + 1):
            loss, n = _loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            (loss / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
            optimizer.step()
            scheduler.step()
            total, count = total + loss.item(), count + n
            if checkpoint is not None and step < len(batches) and checkpoint.due():
                _save(checkpoint, epoch + 1, step, epochs, len(batches), model, optimizer, scheduler, rows, total,
                      count, seconds + time.perf_counter() - start, device)
        seconds += time.perf_counter() - start
        rows.append({"epoch": epoch + 1, "train_loss": total / count, "valid_loss": _mean_loss(model, valid),
                     "seconds": seconds})
        if checkpoint is not None:
            _save(checkpoint, epoch + 2, 0, epochs, len(batches), model, optimizer, scheduler, rows, total, count,
                  seconds, device)
        bar.update(1)
    bar.close()
    return model.eval(), pd.DataFrame(rows)


def _save(checkpoint: Checkpointer, epoch: int, step: int, epochs: int, steps: int, model, optimizer, scheduler,
          rows: list, total: float, count: int, seconds: float, device: torch.device) -> None:
    """Save a run of :func:`train_model` at a batch boundary (``epoch`` 1-based, ``step`` batches of it done)."""
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
    """What :func:`run_experiment` returns: ``summary`` (one row per model: ``model``, ``parameters``, ``epochs``,
    ``train_s``, ``eval_s`` (seconds), ``valid_loss``, ``bleu_greedy``, ``bleu_beam``, ``token_acc``),
    ``by_length`` and ``history`` (rows per model), the trained ``models``, their test ``decoded`` outputs, the
    ``data`` and the ``config``."""

    summary: pd.DataFrame
    by_length: pd.DataFrame
    history: pd.DataFrame
    models: dict[str, Seq2Seq] = field(repr=False)
    decoded: dict[str, dict[str, Decoded]] = field(repr=False)
    data: TranslationData = field(repr=False)
    config: TranslationConfig | None = None


def _train_and_evaluate(kind: str, data: TranslationData, cfg: TranslationConfig, device: torch.device,
                        show_progress: bool = False, checkpoint: Checkpointer | None = None) -> tuple:
    """One model: train (from ``checkpoint``, see :func:`train_model`), evaluate; its summary row, per-length rows,
    history, model and decoded outputs. Runs with ``cfg.num_threads`` torch threads and restores the setting
    afterwards."""
    threads = torch.get_num_threads()
    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    try:
        model, history = train_model(kind, data, cfg, device, show_progress, checkpoint=checkpoint)
        start = time.perf_counter()
        summary, by_length, decoded = evaluate(model, data, cfg, device)
    finally:
        torch.set_num_threads(threads)
    row = {"model": kind, "parameters": sum(p.numel() for p in model.parameters()),
           "epochs": int(history["epoch"].iloc[-1]), "train_s": float(history["seconds"].iloc[-1]),
           "eval_s": time.perf_counter() - start, "valid_loss": float(history["valid_loss"].iloc[-1]), **summary}
    return row, by_length.assign(model=kind), history.assign(model=kind), model, decoded


def run_experiment(cfg: TranslationConfig, data: TranslationData | None = None,
                   device: torch.device | str | None = None, workers: int = 1,
                   show_progress: bool = True) -> TranslationResults:
    """Train and evaluate every model of ``cfg.models`` on the same data and batches.

    Args:
        cfg: the configuration.
        data: prepared data (default ``cfg.data()``).
        device: default :func:`attnbook.runtime.get_device`.
        workers: processes that train the models side by side (joblib, ``loky``), each with ``cfg.num_threads``
            threads; the models are seeded and independent, so on the CPU the results do not depend on it. On a
            GPU keep 1.
        show_progress: a progress bar over the models.

    Raises:
        ValueError: ``workers < 1`` or an unknown model in ``cfg.models``.
    """
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    for kind in cfg.models:
        _check_kind(kind)
    device = torch.device(device) if device is not None else get_device()
    data = data if data is not None else cfg.data()
    bar = progress(total=len(cfg.models), desc="models", disable=not show_progress)
    outputs = []
    for output in run_tasks(_train_and_evaluate, [(kind, data, cfg, device) for kind in cfg.models], workers):
        outputs.append(output)
        bar.update(1)
    bar.close()
    rows, by_length, histories, models, decoded = zip(*outputs)
    return TranslationResults(pd.DataFrame(list(rows)), pd.concat(by_length, ignore_index=True),
                              pd.concat(histories, ignore_index=True), dict(zip(cfg.models, models)),
                              dict(zip(cfg.models, decoded)), data, cfg)


#: The results store of the command line (:mod:`attnbook.store`): a run is one model, with its per-length rows and
#: per-epoch history in side tables. ``num_threads`` does not change results and ``models`` only chooses runs.
LAYOUT = Layout(
    "transformer_translation", keys=("model",),
    columns=("model", "parameters", "epochs", "train_s", "eval_s", "valid_loss", "bleu_greedy", "bleu_beam",
             "token_acc"),
    tables={"by_length": ("length", "sentences", "bleu_greedy", "bleu_beam", "token_acc", "model"),
            "history": ("epoch", "train_loss", "valid_loss", "seconds", "model")},
    not_configuration=("num_threads", "models"))


def _checkpointer(directory: str | Path, kind: str, cfg: TranslationConfig, every_s: float | None) -> Checkpointer:
    """The checkpoint of the run ``kind`` in ``directory``, for the store's configuration less what does not change
    results (:data:`LAYOUT`'s ``not_configuration``)."""
    config = {k: v for k, v in store_config(cfg).items() if k not in LAYOUT.not_configuration}
    return Checkpointer(directory, "transformer_translation", {"model": kind}, config, every_s)


def _store_task(kind: str, data: TranslationData, cfg: TranslationConfig, device: torch.device,
                checkpoint_dir: str | Path | None = None, every_s: float | None = None) -> tuple:
    """One run for the command line: its row, per-length rows, history and its checkpoint's resumes (a list)."""
    checkpoint = _checkpointer(checkpoint_dir, kind, cfg, every_s) if checkpoint_dir is not None else None
    row, by_length, history, _, _ = _train_and_evaluate(kind, data, cfg, device, checkpoint=checkpoint)
    return row, by_length, history, checkpoint.resumes if checkpoint is not None else []


def store_config(cfg: TranslationConfig) -> dict:
    """The configuration recorded with the runs and checked on resume (``cfg`` without ``extra``)."""
    return {k: v for k, v in asdict(cfg).items() if k != "extra"}


def main(argv: list[str] | None = None) -> Path:
    """The command line (see the module docstring): train and evaluate every model not yet in ``--out`` and store
    each as it finishes, with provenance. Returns the path of ``--out``. An interrupted run (Ctrl-C, SIGTERM)
    records its session as interrupted and exits with 130 or 143."""
    from ..provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m attnbook.experiments.transformer_translation",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("quick", "full"), default=None, help="default: full on a GPU, else quick")
    parser.add_argument("--out", type=csv_path, default=Path("results/transformer_translation_full.csv"))
    parser.add_argument("--device", type=device_arg, default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=None)
    parser.add_argument("--workers", type=positive_int, default=1, help="local processes (joblib)")
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
                                   ("models", tuple(args.models) if args.models else None)) if v is not None}
    cfg = replace(cfg, **overrides)
    device = torch.device(args.device) if args.device else get_device()
    try:
        store = ResultsStore(args.out, LAYOUT, store_config(cfg)).open()
    except StoreError as err:
        parser.error(str(err))
    sizes = {"data_sizes": store.previous.get("data_sizes")}

    def describe(wall: float) -> dict:
        return provenance(wall, device=device, mode=mode, overrides=overrides, workers=args.workers, **sizes,
                          note="BLEU: sacreBLEU corpus BLEU, case-insensitive, 13a tokenization, all Tatoeba "
                               "translations of a held-out English sentence as references")

    extra = {"checkpoint_dir": str(args.checkpoint_dir)} if args.checkpoint_dir else {}
    with store, Session(store, describe, workers=args.workers, **extra) as session:
        todo = [kind for kind in cfg.models if not store.has({"model": kind})]
        if todo:
            data = cfg.data()
            sizes["data_sizes"] = data.sizes()
            tasks = [(kind, data, cfg, device, args.checkpoint_dir, every_s) for kind in todo]
            for row, by_length, history, resumes in run_tasks(_store_task, tasks, args.workers):
                store.append(row, {"by_length": by_length, "history": history})
                record_resumes(session, {"model": row["model"]}, resumes)
                session.checkpoint()
                if args.checkpoint_dir:   # the run is stored: its checkpoint is no longer needed
                    _checkpointer(args.checkpoint_dir, row["model"], cfg, None).remove()
        summary = store.frame()
    print(summary.to_string(index=False))
    print(f"{len(summary)} models in {args.out} ({len(todo)} trained now)")
    return args.out


if __name__ == "__main__":  # pragma: no cover
    main()
