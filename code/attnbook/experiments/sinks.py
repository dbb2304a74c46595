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
:func:`summarize` pools the groups into match / no match per condition, over the seeds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import MultiHeadAttention
from ..runtime import ModeConfig, progress, seed_everything
from ..sinks import SinkMultiHeadAttention

__all__ = ["SinksConfig", "CONDITIONS", "make_data", "RetrievalModel", "run_one", "run_grid", "summarize"]

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
        """4,000 training rows, 2,000 test rows, 8 epochs, 3 seeds: every condition and seed in seconds on one
        CPU core."""
        return cls()

    @classmethod
    def full(cls) -> "SinksConfig":
        """20,000 training rows, 10,000 test rows, 20 epochs, 10 seeds."""
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


def run_one(cfg: SinksConfig, train: dict, test: dict, condition: str, seed: int) -> pd.DataFrame:
    """Train one :class:`RetrievalModel` under ``condition`` with ``seed`` and measure it on ``test``.

    Training: ``seed_everything(seed)`` before the model is built, Adam, cross-entropy, ``cfg.epochs`` passes over
    ``train`` in a random order drawn from a generator seeded with ``seed``, on ``cfg.threads`` torch threads.

    Returns:
        One row per group of test rows (``match`` True/False x ``n_keys`` 1 .. ``max_keys``), columns ``condition,
        seed, match, n_keys, padded, n, accuracy, key_mass, pad_mass, sink_weight, sink_logit, train_time_s``:
        ``padded`` is ``n_keys < max_keys``; the weights are means over the group's rows and the heads:
        ``key_mass`` on real keys, ``pad_mass`` on pads (0 under a mask), ``sink_weight`` on the sink (NaN without
        one), and per row they sum to 1; ``sink_logit`` is the sink logit after training, the mean over the heads
        (0 for ``"softmax_one"``, NaN without a sink).

    Raises:
        ValueError: an unknown ``condition``.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        seed_everything(seed)
        model = RetrievalModel(cfg, condition)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, foreach=True)
        generator = torch.Generator().manual_seed(seed)
        inputs = ("query", "keys", "values", "lengths")
        start = time.perf_counter()
        model.train()
        for _ in range(cfg.epochs):
            for index in torch.randperm(len(train["target"]), generator=generator).split(cfg.batch_size):
                logits, _, _ = model(*(train[name][index] for name in inputs))
                loss = F.cross_entropy(logits, train["target"][index])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        train_time = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            logits, weights, sink = model(*(test[name] for name in inputs))
    finally:
        torch.set_num_threads(threads)
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


def run_grid(cfg: SinksConfig, conditions: tuple[str, ...] = CONDITIONS, show_progress: bool = True
             ) -> pd.DataFrame:
    """Every (condition, seed of ``cfg.seeds``) run on one training and one test set (:func:`make_data` with
    ``cfg.data_seed`` and ``cfg.data_seed + 1``), as one tidy frame: the rows of :func:`run_one`, stacked.

    Raises:
        ValueError: an unknown condition.
    """
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown:
        raise ValueError(f"unknown conditions {unknown}; the conditions are {list(CONDITIONS)}")
    train, test = make_data(cfg, cfg.n_train, cfg.data_seed), make_data(cfg, cfg.n_test, cfg.data_seed + 1)
    tasks = [(c, s) for s in cfg.seeds for c in conditions]
    frames = [run_one(cfg, train, test, c, s) for c, s in progress(tasks, desc="runs", disable=not show_progress)]
    return pd.concat(frames, ignore_index=True)


def summarize(frame: pd.DataFrame, by: tuple[str, ...] = ("match",)) -> pd.DataFrame:
    """Per condition and ``by`` (``("match",)``, or ``("match", "n_keys")`` to keep the numbers of keys apart): the
    measures of :func:`run_grid` pooled over the other groups of a run (weighted by their numbers of rows), then the
    mean over the seeds, and the standard deviation of the accuracy over the seeds.

    Returns:
        Columns ``condition, *by, n_seeds, accuracy, accuracy_sd, key_mass, pad_mass, sink_weight, sink_logit``, in
        the order of :data:`CONDITIONS`, match rows before no-match rows.

    Raises:
        ValueError: ``by`` names a column that is not ``"match"``, ``"n_keys"`` or ``"padded"``.
    """
    if not set(by) <= {"match", "n_keys", "padded"}:
        raise ValueError(f"by must name columns among 'match', 'n_keys' and 'padded', got {by!r}")
    measures = ["accuracy", "key_mass", "pad_mass", "sink_weight", "sink_logit"]
    weighted = frame.assign(**{m: frame[m] * frame["n"] for m in measures})
    pooled = weighted.groupby(["condition", "seed", *by])[[*measures, "n"]].sum(min_count=1)
    pooled[measures] = pooled[measures].div(pooled["n"], axis=0)
    groups = pooled.groupby(["condition", *by])
    out = groups[measures].mean()
    out.insert(1, "accuracy_sd", groups["accuracy"].std())
    out.insert(0, "n_seeds", groups.size())
    out = out.reset_index()
    order = {c: i for i, c in enumerate(CONDITIONS)}
    out = out.assign(_c=out["condition"].map(order), _m=~out["match"] if "match" in by else 0)
    return out.sort_values(["_c", "_m", *[b for b in by if b != "match"]]).drop(columns=["_c", "_m"]) \
        .reset_index(drop=True)
