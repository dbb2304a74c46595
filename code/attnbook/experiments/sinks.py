"""The attention-sink experiment of chapter 9: where does a query put its weight when no key matches?

Chapter 9, section "Attending to nowhere" (issue 21, section 4). A synthetic retrieval task, small enough to train
in a second on a CPU core:

- a row holds ``1 .. max_keys`` (key, value) pairs: distinct key symbols out of ``n_symbols`` and value classes out
  of ``n_values``, padded to ``max_keys`` positions;
- the query is a key symbol. With probability ``p_match`` it is one of the row's keys, and the target is that key's
  value; otherwise it is a symbol absent from the row, and the target is the extra class ``"none"``.

The model (:class:`RetrievalModel`) embeds the query and the keys with one symbol embedding and the values with a
value embedding, attends once (multi-head, the query's only view of the row) and reads the class from the attention
output alone, with a small MLP. When no key matches, the right output carries no information from any key, but a
softmax row must sum to 1: its weight lands on some real key (under a key padding mask), or on the pads, which then
serve as a sink (without one: chapter 5's "attention mass on pads"), and rows without pads have no such place. A row
with one key and no match is the extreme case: under a mask its only key gets all the weight, and the output is the
same as when that key matches.

The conditions (:data:`CONDITIONS`), all else equal:

- ``"softmax"``: masked softmax (bool key padding mask, True = a real key takes part);
- ``"softmax, pads unmasked"``: softmax over every position, pads included (a learned pad key and pad value);
- ``"softmax_one"``: masked, softmax with one added to the denominator (a sink with logit 0 and value 0);
- ``"learned sink"``: masked, a learned sink logit per head (:class:`attnbook.sinks.SinkMultiHeadAttention`).

:func:`run_grid` trains every (condition, seed) and returns a tidy frame: per run and per group of test rows
(match or not, by the number of keys), the accuracy and where the weight went (real keys, pads, sink).
:func:`summarize` pools the groups into match / no match per condition, over the seeds; :func:`per_run` gives one row
per run, and :func:`compare_conditions` the paired comparisons of no-match accuracy over seeds.

From the command line (resumable, as chapter 9's packing experiment; see :mod:`attnbook.experiments.packing`)::

    python -m attnbook.experiments.sinks --mode quick --seeds 2 --out /tmp/sinks_quick.csv
    python -m attnbook.experiments.sinks --mode full --workers 2 --out results/sinks_full.csv

``--out`` is a results store (:mod:`attnbook.store`): the main table ``<name>.csv`` has one row per run (condition,
seed, kind of device; :func:`per_run`'s columns), the side table ``<name>_groups.csv`` the run's tidy rows (those of
:func:`run_one`, with ``device``), provenance in ``<name>.json``; Ctrl-C or SIGTERM end a session as interrupted.
Chapter 9 reads the stored full-mode runs with :func:`read_runs` and draws its verdicts from them.

Sources: softmax with one added is Miller (2023), "Attention is off by one"; attention sinks are Xiao et al. (2024),
"Efficient streaming language models with attention sinks".
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..runtime import ModeConfig, describe_device, seed_everything
from ..sinks import SinkMultiHeadAttention
from ..store import (Layout, ResultsStore, collect_runs, device_kind, grid_arguments, grid_parser, read_tables,
                     run_grid_cli, run_grid_in_session)
from .masking_report import CORRECTED, MIN_PAIRS, paired_table, runs_by_kind
from .transformer_padding import Comparison

__all__ = ["SinksConfig", "CONDITIONS", "RESULT_COLUMNS", "GROUP_COLUMNS", "LAYOUT", "COMPARISONS", "make_data",
           "RetrievalModel", "run_one", "run_grid", "summarize", "per_run", "compare_conditions", "store_config",
           "open_store", "StoredRuns", "read_runs", "comparison_sentence", "main"]

#: The attention weightings compared (see the module docstring).
CONDITIONS = ("softmax", "softmax, pads unmasked", "softmax_one", "learned sink")


@dataclass(frozen=True)
class SinksConfig(ModeConfig):
    """Data, model and training of the sink experiment.

    ``n_symbols`` key symbols, ``n_values`` value classes (plus ``"none"``), ``1 .. max_keys`` pairs a row, a query
    that matches with probability ``p_match``; ``n_train`` and ``n_test`` rows drawn with ``data_seed`` (the same
    data for every run). The model has width ``d_model``, ``num_heads`` heads and an MLP readout of width
    ``hidden``; Adam at ``lr``, ``epochs`` passes in batches of ``batch_size``, one run per seed of ``seeds`` (a seed
    fixes the initialization and the batch order, so runs with one seed are paired across conditions). ``threads``:
    torch threads during a run (restored after it).
    """

    n_symbols: int = 16
    n_values: int = 8
    max_keys: int = 6
    p_match: float = 0.5
    n_train: int = 4_000
    n_test: int = 2_000
    d_model: int = 32
    num_heads: int = 2
    hidden: int = 64
    batch_size: int = 128
    epochs: int = 7
    lr: float = 1e-2
    seeds: tuple[int, ...] = (0, 1, 2)
    data_seed: int = 0
    threads: int = 1

    @classmethod
    def quick(cls) -> "SinksConfig":
        """The field defaults (4,000 training rows, 2,000 test rows, ``epochs`` passes, 3 seeds): every condition and
        seed in seconds on one CPU core."""
        return cls()

    @classmethod
    def full(cls) -> "SinksConfig":
        """The quick sizes with 20,000 training rows, 10,000 test rows, 20 epochs and 10 seeds (the paired seeds a
        verdict needs, :data:`attnbook.experiments.masking_report.MIN_PAIRS`)."""
        return cls(n_train=20_000, n_test=10_000, epochs=20, seeds=tuple(range(10)))


def make_data(cfg: SinksConfig, n: int, seed: int) -> dict[str, Tensor]:
    """``n`` rows of the retrieval task, drawn with NumPy's generator seeded with ``seed``.

    Returns:
        ``keys`` int64 ``(n, max_keys)`` (pad positions hold the pad symbol ``n_symbols``), ``values`` int64
        ``(n, max_keys)`` (pads hold ``n_values``), ``lengths`` int64 ``(n,)`` in ``1 .. max_keys``, ``query`` int64
        ``(n,)``, ``match`` bool ``(n,)``, ``target`` int64 ``(n,)``: the matched key's value, or ``n_values``
        (``"none"``) when no key matches.

    Raises:
        ValueError: ``n_symbols <= max_keys`` (no symbol would be left for a query that matches nothing).
    """
    if cfg.n_symbols <= cfg.max_keys:
        raise ValueError(f"n_symbols must exceed max_keys, got n_symbols={cfg.n_symbols}, max_keys={cfg.max_keys}")
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((n, cfg.n_symbols)), axis=1)  # a random permutation of the symbols per row
    lengths = rng.integers(1, cfg.max_keys + 1, size=n)
    real = np.arange(cfg.max_keys)[None, :] < lengths[:, None]
    keys = np.where(real, order[:, :cfg.max_keys], cfg.n_symbols)
    values = np.where(real, rng.integers(0, cfg.n_values, size=(n, cfg.max_keys)), cfg.n_values)
    match = rng.random(n) < cfg.p_match
    slot = (rng.random(n) * lengths).astype(np.int64)  # a real position, uniform over the row's keys
    rows = np.arange(n)
    query = np.where(match, keys[rows, slot], order[:, cfg.max_keys])  # order[:, max_keys] is in no row's keys
    target = np.where(match, values[rows, slot], cfg.n_values)
    return {name: torch.as_tensor(array) for name, array in dict(
        keys=keys, values=values, lengths=lengths, query=query, match=match, target=target).items()}


class RetrievalModel(nn.Module):
    """One attention from the query to the row's (key, value) pairs, and a class read from its output alone.

    Args:
        cfg: sizes (:class:`SinksConfig`).
        condition: one of :data:`CONDITIONS`.

    Call: ``(query (batch,), keys (batch, max_keys), values (batch, max_keys), lengths (batch,))`` ->
    ``(logits (batch, n_values + 1), weights (batch, heads, max_keys), sink (batch, heads) or None)``. The
    attention's mask is bool, True = a real key takes part (none for ``"softmax, pads unmasked"``).

    Raises:
        ValueError: an unknown ``condition``.

    Chapter 9, section "Attending to nowhere".
    """

    def __init__(self, cfg: SinksConfig, condition: str) -> None:
        super().__init__()
        if condition not in CONDITIONS:
            raise ValueError(f"condition must be one of {list(CONDITIONS)}, got {condition!r}")
        self.condition = condition
        self.symbols = nn.Embedding(cfg.n_symbols + 1, cfg.d_model)  # the query's and the keys'; last = pad
        self.values = nn.Embedding(cfg.n_values + 1, cfg.d_model)  # last = pad
        if condition in ("softmax_one", "learned sink"):
            self.attention = SinkMultiHeadAttention(cfg.d_model, cfg.num_heads, learn_sink=condition == "learned sink")
        else:
            self.attention = MultiHeadAttention(cfg.d_model, cfg.num_heads)
        self.readout = nn.Sequential(nn.Linear(cfg.d_model, cfg.hidden), nn.ReLU(),
                                     nn.Linear(cfg.hidden, cfg.n_values + 1))

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, lengths: Tensor
                ) -> tuple[Tensor, Tensor, Tensor | None]:
        real = torch.arange(keys.shape[1], device=keys.device) < lengths[:, None]  # (batch, max_keys)
        mask = None if self.condition == "softmax, pads unmasked" else real[:, None, :]
        out = self.attention(self.symbols(query)[:, None, :], self.symbols(keys), self.values(values), mask)
        sink = getattr(self.attention, "sink_weights", None)
        return (self.readout(out[:, 0]), self.attention.attention_weights[:, :, 0],
                None if sink is None else sink[:, :, 0])


@contextlib.contextmanager
def _threads(n: int):
    """Run the block on ``n`` torch threads, and restore the count after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_one(cfg: SinksConfig, train: dict, test: dict, condition: str, seed: int,
            device: torch.device | str = "cpu") -> pd.DataFrame:
    """Train one :class:`RetrievalModel` under ``condition`` with ``seed`` and measure it on ``test``.

    Training: ``seed_everything(seed)`` before the model is built, Adam, cross-entropy, ``cfg.epochs`` passes over
    ``train`` in a random order drawn from a generator seeded with ``seed``, on ``cfg.threads`` torch threads, on
    ``device`` (``train`` and ``test`` are :func:`make_data`'s dicts on the CPU; each batch is moved there).

    Returns:
        One row per group of test rows (``match`` True/False x ``n_keys`` 1 .. ``max_keys``), columns ``condition,
        seed, match, n_keys, padded, n, accuracy, key_mass, pad_mass, sink_weight, sink_logit, train_time_s``:
        ``padded`` is ``n_keys < max_keys``; the weights are means over the group's rows and the heads:
        ``key_mass`` on real keys, ``pad_mass`` on pads (0 under a mask), ``sink_weight`` on the sink (NaN without
        one), and per row they sum to 1; ``sink_logit`` is the sink logit after training, the mean over the heads
        (0 for ``"softmax_one"``, NaN without a sink); ``train_time_s`` in seconds of wall time.

    Raises:
        ValueError: an unknown ``condition``.
    """
    device = torch.device(device)
    inputs = ("query", "keys", "values", "lengths")
    with _threads(cfg.threads):
        seed_everything(seed)
        model = RetrievalModel(cfg, condition).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, foreach=True)
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        model.train()
        for _ in range(cfg.epochs):
            for index in torch.randperm(len(train["target"]), generator=generator).split(cfg.batch_size):
                logits, _, _ = model(*(train[name][index].to(device) for name in inputs))
                loss = F.cross_entropy(logits, train["target"][index].to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        train_time = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            logits, weights, sink = (None if t is None else t.cpu()
                                     for t in model(*(test[name].to(device) for name in inputs)))
    real = torch.arange(cfg.max_keys) < test["lengths"][:, None]
    frame = pd.DataFrame({
        "match": test["match"].numpy(), "n_keys": test["lengths"].numpy(),
        "correct": (logits.argmax(-1) == test["target"]).numpy(),
        "key_mass": (weights * real[:, None, :]).sum(-1).mean(1).double().numpy(),
        "pad_mass": (weights * ~real[:, None, :]).sum(-1).mean(1).double().numpy(),
        "sink_weight": sink.mean(1).double().numpy() if sink is not None else np.full(len(test["target"]), np.nan)})
    groups = frame.groupby(["match", "n_keys"], sort=True)
    table = groups[["key_mass", "pad_mass", "sink_weight"]].mean()
    table.insert(0, "accuracy", groups["correct"].mean())
    table.insert(0, "n", groups.size())
    table = table.reset_index()
    table.insert(2, "padded", table["n_keys"] < cfg.max_keys)
    table.insert(0, "seed", seed)
    table.insert(0, "condition", condition)
    sink_logits = getattr(model.attention, "sink_logits", None)
    table["sink_logit"] = float("nan") if sink_logits is None else float(sink_logits.detach().mean())
    table["train_time_s"] = train_time
    return table


#: The columns of a run's row in the store's main table, after ``condition`` and ``seed`` (:func:`per_run`).
RESULT_COLUMNS = tuple(f"{m}_{side}" for m in ("accuracy", "key_mass", "pad_mass", "sink_weight")
                       for side in ("match", "no_match")) + ("sink_logit", "train_time_s")
#: The columns of the side table ``groups``: :func:`run_one`'s tidy rows, with ``device``.
GROUP_COLUMNS = ("condition", "seed", "match", "n_keys", "padded", "n", "accuracy", "key_mass", "pad_mass",
                 "sink_weight", "sink_logit", "train_time_s", "device")
_KEYS = ("condition", "seed")

#: The results store of this experiment (:mod:`attnbook.store`): a run is a (condition, seed) on a kind of device;
#: its tidy rows are in the side table ``groups``.
LAYOUT = Layout("sinks", keys=_KEYS, columns=(*_KEYS, *RESULT_COLUMNS, "device"), tables={"groups": GROUP_COLUMNS},
                not_configuration=("threads", "seeds"), kind_column="device")


def _task(cfg: SinksConfig, train: dict, test: dict, condition: str, seed: int, device: str
          ) -> tuple[dict, dict[str, pd.DataFrame]]:
    """One run (in a joblib worker, or in this process): its main-table row and its ``groups`` rows."""
    with _threads(cfg.threads):  # the device description names the threads of the run
        groups = run_one(cfg, train, test, condition, seed, device)
        groups["device"] = describe_device(device)
    return per_run(groups).iloc[0].to_dict(), {"groups": groups}


def store_config(cfg: SinksConfig) -> dict:
    """The configuration recorded with the runs and checked on resume: every field of ``cfg``."""
    return asdict(cfg)


def open_store(out: str | Path, cfg: SinksConfig, device: torch.device | str | None = None) -> ResultsStore:
    """Open the results store ``out`` (a ``.csv`` path) for ``cfg`` (:class:`attnbook.store.ResultsStore` with
    :data:`LAYOUT`; ``device`` says which kind of runs :meth:`~attnbook.store.ResultsStore.has` asks about).

    Raises:
        attnbook.store.StoreError: see :class:`~attnbook.store.ResultsStore` (e.g. runs of another configuration:
            the message names the entries that differ).
        attnbook.store.StoreLocked: another process writes to ``out``.
    """
    return ResultsStore(out, LAYOUT, store_config(cfg), device=None if device is None else str(device)).open()


def _in_order(frame: pd.DataFrame, conditions: tuple[str, ...], seeds: tuple[int, ...] | None = None
              ) -> pd.DataFrame:
    """The tidy rows seed by seed (in the order of ``seeds``, default ascending), each seed's runs in the order of
    ``conditions``, each run's rows as they came."""
    ranks = {"_c": frame["condition"].map({c: i for i, c in enumerate(conditions)}),
             "_s": frame["seed"] if seeds is None else frame["seed"].map({s: i for i, s in enumerate(seeds)})}
    return frame.assign(**ranks).sort_values(["_s", "_c"], kind="stable").drop(columns=list(ranks)) \
        .reset_index(drop=True)


def run_grid(cfg: SinksConfig, conditions: tuple[str, ...] = CONDITIONS, show_progress: bool = True, *,
             workers: int = 1, out: str | Path | ResultsStore | None = None, device: torch.device | str | None = None,
             only: list[str] | None = None, on_run=None) -> pd.DataFrame:
    """Every (condition, seed of ``cfg.seeds``) run on one training and one test set (:func:`make_data` with
    ``cfg.data_seed`` and ``cfg.data_seed + 1``), as one tidy frame: the rows of :func:`run_one`, stacked seed by
    seed, each seed's runs in the order of ``conditions``.

    Args:
        cfg: the configuration (:meth:`SinksConfig.quick` or :meth:`SinksConfig.full`).
        conditions: the conditions to run (names of :data:`CONDITIONS`).
        show_progress: a progress bar over the runs.
        workers: local processes (joblib); each run uses ``cfg.threads`` torch threads.
        out: ``None`` (nothing stored), or a results store (a ``.csv`` path, opened with :func:`open_store` for one
            recorded session, or an open :class:`~attnbook.store.ResultsStore`): runs already in it are skipped,
            each finished run is appended at once, and the frame returned holds every stored run.
        device: where the runs train (default: the CPU, as the chapter's live run; the models are tiny); its kind
            is part of a run's identity in the store.
        only: names of conditions; runs only those of ``conditions`` that it names (the command line's ``--only``).
        on_run: called with the main table so far (:func:`per_run`'s rows) after every finished run.

    Returns:
        Columns ``condition, seed, match, n_keys, padded, n, accuracy, key_mass, pad_mass, sink_weight,
        sink_logit, train_time_s`` (:func:`run_one`), and ``device`` when ``out`` is given.

    Raises:
        ValueError: an unknown condition in ``conditions`` or ``only``.
        attnbook.store.StoreError: ``out`` cannot be resumed (another configuration, a locked store, ...).

    Chapter 9, section "Attending to nowhere".
    """
    unknown = [c for c in (*conditions, *(only or ())) if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown conditions {unknown}; the conditions are {list(CONDITIONS)}")
    device = torch.device(device if device is not None else "cpu")
    if out is not None and not isinstance(out, ResultsStore):
        def again(cfg, _data, **kwargs):
            return run_grid(cfg, conditions, **kwargs)

        return run_grid_in_session(again, open_store, cfg, None, out=out, device=device, workers=workers,
                                   only=only, show_progress=show_progress, on_run=on_run)
    store = out
    grid = [c for c in conditions if only is None or c in only]
    tasks = [(c, s) for s in cfg.seeds for c in grid if store is None or not store.has({"condition": c, "seed": s})]
    train, test = make_data(cfg, cfg.n_train, cfg.data_seed), make_data(cfg, cfg.n_test, cfg.data_seed + 1)
    arguments = ((cfg, train, test, c, s, str(device)) for c, s in tasks)
    _, tables = collect_runs(_task, arguments, len(tasks), workers=workers, store=store, keys=_KEYS,
                             show_progress=show_progress, on_run=on_run, tables=("groups",))
    groups = tables["groups"]
    if store is not None:
        return _in_order(groups, CONDITIONS)
    return _in_order(groups, tuple(conditions), cfg.seeds).drop(columns="device") if len(groups) else groups


_MEASURES = ["accuracy", "key_mass", "pad_mass", "sink_weight", "sink_logit"]


def _pooled(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The measures of a tidy frame per ``keys``, pooled over the other groups (weighted by their numbers of rows)."""
    weighted = frame.assign(**{m: frame[m] * frame["n"] for m in _MEASURES})
    pooled = weighted.groupby(keys)[[*_MEASURES, "n"]].sum(min_count=1)
    pooled[_MEASURES] = pooled[_MEASURES].div(pooled["n"], axis=0)
    return pooled


def summarize(frame: pd.DataFrame, by: tuple[str, ...] = ("match",)) -> pd.DataFrame:
    """Per condition and ``by`` (``("match",)``, or ``("match", "n_keys")`` to keep the numbers of keys apart): the
    measures of :func:`run_grid` pooled over the other groups of a run (weighted by their numbers of rows), then the
    mean over the seeds, and the standard deviation of the accuracy over the seeds.

    Args:
        frame: tidy rows of :func:`run_grid` (live, or read back from a store's ``groups`` table). Runs of one
            condition and seed on two kinds of device would be pooled as one: pass one kind (:func:`read_runs`).

    Returns:
        Columns ``condition, *by, n_seeds, accuracy, accuracy_sd, key_mass, pad_mass, sink_weight, sink_logit``, in
        the order of :data:`CONDITIONS`, match rows before no-match rows.

    Raises:
        ValueError: ``by`` names a column that is not ``"match"``, ``"n_keys"`` or ``"padded"``.
    """
    if not set(by) <= {"match", "n_keys", "padded"}:
        raise ValueError(f"by must name columns among 'match', 'n_keys' and 'padded', got {by!r}")
    groups = _pooled(frame, ["condition", "seed", *by]).groupby(["condition", *by])
    out = groups[_MEASURES].mean()
    out.insert(1, "accuracy_sd", groups["accuracy"].std())
    out.insert(0, "n_seeds", groups.size())
    out = out.reset_index()
    order = {c: i for i, c in enumerate(CONDITIONS)}
    out = out.assign(_c=out["condition"].map(order), _m=~out["match"] if "match" in by else 0)
    return out.sort_values(["_c", "_m", *[b for b in by if b != "match"]]).drop(columns=["_c", "_m"]) \
        .reset_index(drop=True)


def per_run(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a tidy frame (:func:`run_grid`): the rows of the store's main table.

    Returns:
        Columns ``condition, seed`` (and ``device`` if ``frame`` has it), then :data:`RESULT_COLUMNS`: for
        ``accuracy``, ``key_mass``, ``pad_mass`` and ``sink_weight``, the measure pooled over the run's match rows
        (``_match``) and over its no-match rows (``_no_match``), weighted by their numbers of rows (fractions; NaN
        where a run has no such rows, and the sink weight is NaN without a sink); ``sink_logit`` and
        ``train_time_s`` (seconds) of the run. Sorted by seed, then in the order of :data:`CONDITIONS`.

    Raises:
        KeyError: ``frame`` lacks a column of :func:`run_one`'s rows.

    Chapter 9, section "Attending to nowhere" (the paired comparisons).
    """
    keys = ["condition", "seed", *(["device"] if "device" in frame else [])]
    wide = _pooled(frame, [*keys, "match"]).unstack("match")
    out = frame.groupby(keys)[["sink_logit", "train_time_s"]].first()
    for measure in ("accuracy", "key_mass", "pad_mass", "sink_weight"):
        for match, side in ((True, "match"), (False, "no_match")):
            out[f"{measure}_{side}"] = wide[(measure, match)] if (measure, match) in wide else np.nan
    out = out.reset_index()[[*keys, *RESULT_COLUMNS]]
    return _in_order(out, CONDITIONS)


#: The paired comparisons of chapter 9 (no-match accuracy, condition minus baseline, over seeds).
COMPARISONS = (
    Comparison("softmax_one", "softmax_one against the masked softmax", "softmax_one", "softmax"),
    Comparison("learned sink", "the learned sink against the masked softmax", "learned sink", "softmax"),
    Comparison("pads unmasked", "unmasked pads against the masked softmax", "softmax, pads unmasked", "softmax"),
    Comparison("learned sink against softmax_one", "the learned sink against softmax_one", "learned sink",
               "softmax_one"),
)
_SIDES = {"pad_mass": "pad_mass_no_match", "sink_weight": "sink_weight_no_match"}


def compare_conditions(runs: pd.DataFrame, comparisons: tuple[Comparison, ...] = COMPARISONS, *,
                       value: str = "accuracy_no_match", min_pairs: int = MIN_PAIRS, n_resamples: int = 9999,
                       seed: int = 0) -> pd.DataFrame:
    """One row per comparison: the paired change in ``value`` over seeds, its statistics and a verdict word chosen
    from them, as :func:`attnbook.experiments.transformer_padding.compare_conditions`.

    Args:
        runs: one row per run (:func:`per_run`, or a store's main table), with ``condition``, ``seed``, ``value``
            and optionally ``device`` (runs pair only within one kind of device).
        comparisons: the comparisons (default :data:`COMPARISONS`).
        value: the compared result, a column of :data:`RESULT_COLUMNS` (accuracies are fractions).
        min_pairs: paired runs needed for a verdict (:data:`attnbook.evidence.MIN_PAIRS`).
        n_resamples, seed: of the bootstrap (:func:`attnbook.stats.bootstrap_ci`).

    Returns:
        Columns ``name, question, condition, baseline, primary`` (of the comparison), ``n_pairs, mean_baseline,
        mean_condition, mean_diff, ci_low, ci_high, n_better, n_worse, n_equal, p_value, p_holm, rank_biserial,
        verdict`` (statistics of :func:`attnbook.stats.compare_paired`, NaN with fewer than 2 paired seeds) and, for
        each side (``_condition``, ``_baseline``), the means over the paired seeds of ``pad_mass`` and
        ``sink_weight`` on no-match rows. ``verdict`` is :func:`attnbook.experiments.masking_report.verdict`:
        ``"higher"`` or ``"lower"`` (the bootstrap 95% interval excludes 0 and, for a comparison that is not
        ``primary``, as none of :data:`COMPARISONS` is, Holm's corrected p-value stays below 5%), ``"no difference
        resolved"`` (the interval includes 0), ``"not resolved after Holm's correction"`` or ``"not yet answered"``
        (fewer than ``min_pairs`` paired seeds).

    Raises:
        ValueError: ``runs`` lacks ``condition``, ``seed`` or ``value``, or a (condition, seed) run occurs twice on
            one kind of device.

    Chapter 9, section "Attending to nowhere"; the statistics are chapter 5's (section "Statistics for paired
    seeds").
    """
    frame = runs_by_kind(runs, ("condition",), lambda row: row["condition"], value)
    table = paired_table(frame, comparisons, _SIDES, value=value, min_pairs=min_pairs, n_resamples=n_resamples,
                         seed=seed).drop(columns=["condition", "baseline", "device_kind", "primary"])
    return pd.concat([pd.DataFrame([comp._asdict() for comp in comparisons]), table], axis=1)


def comparison_sentence(row: pd.Series, measure: str = "no-match accuracy", min_pairs: int = MIN_PAIRS) -> str:
    """One row of :func:`compare_conditions` as one plain sentence: the verdict with its one effect and the effect's
    95% interval ("Against the masked softmax, softmax_one raised no-match accuracy by 0.207 (95% interval 0.199 to
    0.213)."; a lowering is stated as a positive amount). Seed tallies and p-values are left to the table. The
    comparison's ``question`` ("X against Y") names both sides. Chapter 9, section "Attending to nowhere".

    Raises:
        ValueError: ``row["question"]`` does not read "X against Y", or ``row["verdict"]`` is not a verdict of
            :func:`attnbook.experiments.masking_report.verdict`.
    """
    subject, sep, baseline = str(row["question"]).partition(" against ")
    if not sep:
        raise ValueError(f"question must read 'X against Y', got {row['question']!r}")
    head = f"Against {baseline}, {subject}"
    verdict = row["verdict"]
    if verdict in ("higher", "lower"):
        diff, low, high = row["mean_diff"], row["ci_low"], row["ci_high"]
        if verdict == "lower":
            diff, low, high = -diff, -high, -low
        word = "raised" if verdict == "higher" else "lowered"
        interval = (f"both 95% bounds round to {low:.3f}" if f"{low:.3f}" == f"{high:.3f}"
                    else f"95% interval {low:.3f} to {high:.3f}")
        return f"{head} {word} {measure} by {diff:.3f} ({interval})."
    seeds = f"{int(row['n_pairs'])} paired run" + ("" if int(row["n_pairs"]) == 1 else "s")
    if verdict == "no difference resolved":
        return f"{head} changed {measure} by no amount that {seeds} resolve."
    if verdict == CORRECTED:
        return (f"{head} moved {measure} by an amount whose interval excludes zero, but Holm's correction over the "
                "comparisons does not confirm it.")
    if verdict == "not yet answered":
        return f"{head}: {seeds}, too few for a verdict (it needs {min_pairs})."
    raise ValueError(f"verdict must be a verdict of masking_report.verdict, got {verdict!r}")


class StoredRuns(NamedTuple):
    """Stored runs of one kind of device, read by :func:`read_runs`."""

    runs: pd.DataFrame        #: the main table: one row per run (:func:`per_run`'s columns, with ``device``)
    groups: pd.DataFrame      #: the side table: the runs' tidy rows (:func:`run_grid`'s, with ``device``)
    provenance: dict          #: the sidecar ``<name>.json``
    kind: str                 #: ``"cpu"`` or ``"gpu"`` (:func:`attnbook.store.device_kind`)


def read_runs(cfg: SinksConfig, name: str = "sinks_full", start: str | Path | None = None
              ) -> tuple[StoredRuns | None, str]:
    """The stored runs ``results/<name>.csv``, ``<name>_groups.csv`` and ``<name>.json``, found as
    :func:`attnbook.provenance.read_stored` finds them (from ``start`` upwards; on Colab from the book's
    repository), if their recorded configuration is ``cfg``'s (:func:`attnbook.store.config_differences`, leaving
    out :data:`LAYOUT`'s ``not_configuration``: threads and seeds).

    Where the store holds runs of both kinds of device, the kind with more runs is kept (GPU on a tie), since the
    same seed trains a different model on another device.

    Returns:
        ``(stored, status)``: ``stored`` is None unless ``status`` is ``"used"``; otherwise ``status`` says why:
        ``"missing"`` (a file is not there, or holds no run), ``"differs in [...]"`` (the entries of the
        configuration that differ) or ``"incomplete: no runs of [...]"`` (conditions of :data:`CONDITIONS` without a
        run on the kept kind of device).

    Chapter 9, section "Attending to nowhere".
    """
    stored = read_tables(name, ("groups",), start)
    if stored is None or "groups" not in stored.tables:
        return None, "missing"
    differs = stored.differences(store_config(cfg), LAYOUT)
    if differs:
        return None, f"differs in {differs}"
    runs, groups, meta = stored.runs, stored.tables["groups"], stored.provenance
    if runs.empty:
        return None, "missing"
    kinds = runs["device"].map(device_kind)
    kind = "gpu" if (kinds == "gpu").sum() >= (kinds == "cpu").sum() else "cpu"
    groups = groups[groups["device"].map(device_kind) == kind]
    absent = [c for c in CONDITIONS if c not in set(runs.loc[kinds == kind, "condition"])]
    if absent:
        return None, f"incomplete: no runs of {absent}"
    return StoredRuns(runs[kinds == kind].reset_index(drop=True), _in_order(groups, CONDITIONS), meta, kind), "used"


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """The command line (see the module docstring); writes ``--out``, its side table ``<name>_groups.csv`` and its
    provenance ``<name>.json``, and returns the tidy rows of every stored run. The arguments and the store are
    checked before any run starts: a store of another configuration is a usage error (exit status 2) that names
    the entries that differ. Makes chapter 9's stored runs (section "Attending to nowhere")."""
    parser = grid_parser("python -m attnbook.experiments.sinks", __doc__.split("\n")[0], "results/sinks_full.csv",
                         f"comma-separated conditions of {list(CONDITIONS)}", default_device="cpu")
    args = parser.parse_args(argv)
    cfg, only, device = grid_arguments(parser, args, SinksConfig.for_mode(args.mode), CONDITIONS)
    return run_grid_cli(parser, args, cfg, run_grid=run_grid, open_store=open_store, only=only, device=device)


if __name__ == "__main__":  # pragma: no cover
    main()
