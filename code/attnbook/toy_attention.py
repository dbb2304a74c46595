"""A one-head self-attention model small enough to train in seconds, on a task whose answer is checkable.

Explained in chapter 3, "Parametric attention" (``chapters/03_parametric_attention``), section "A trained head:
the largest digit so far". The task: read a sequence of digits and, at every position, output the largest digit
seen so far (the running maximum). One head of causal self-attention solves it exactly when each query puts its
weight on the earlier positions that hold that digit, so the trained weights can be checked against the answer
(:func:`share_on_running_max`):

- the **query** of every position can ask the same question ("which digit is largest?");
- the **key** of a digit says how large it is: its score against a query should rise with the digit
  (:func:`score_table`);
- the **value** carries which digit it is, and a linear read-out turns the weighted values into a prediction;
- the **causal mask** keeps the later digits out; without it the head finds the largest digit of the whole
  sequence instead.

The task needs no positions: the running maximum does not depend on the order of the digits before it, which
suits self-attention, which ignores order (chapter 8 adds positions). The model has no residual connection, so
everything it predicts passes through the attention weights.

Use::

    cfg = RunningMaxConfig()
    model, losses = train_running_max(cfg)
    tokens = running_max_batch(cfg.n_test, cfg, torch.Generator().manual_seed(cfg.test_seed))
    report = evaluate(model, tokens)          # accuracy and share on the running maximum, with and without mask
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import causal_mask
from .masking import masked_softmax

__all__ = ["RunningMaxConfig", "running_max_batch", "running_max", "TinySelfAttention", "make_model",
           "train_running_max", "share_on_running_max", "evaluate", "REPORT_LABELS", "report_table", "score_table",
           "value_table", "key_ranking", "share_words", "start_spread_words", "scale_comparison",
           "scale_sentence", "plot_scale_comparison"]


@dataclass(frozen=True)
class RunningMaxConfig:
    """The task, the model and its training (about two seconds on one CPU thread).

    ``n_digits`` tokens 0..n_digits-1, sequences of ``seq_len``; embeddings of ``d_model``, queries, keys and values
    of ``d_k``; ``steps`` Adam steps at ``lr`` on fresh batches of ``batch_size``; ``seed`` fixes the initial weights
    and the training data, ``test_seed`` the ``n_test`` test sequences. Training runs on ``threads`` torch threads,
    so that two builds give identical numbers. ``scaled``: divide the scores by ``sqrt(d_k)`` (Eq. eq-sdpa); False
    only to show what the factor does (chapter 3, "The scale in training").
    """

    n_digits: int = 10
    seq_len: int = 8
    d_model: int = 16
    d_k: int = 16
    steps: int = 400
    batch_size: int = 64
    lr: float = 0.01
    seed: int = 0
    test_seed: int = 1
    n_test: int = 1000
    threads: int = 1
    scaled: bool = True

    def __post_init__(self):
        for name in ("n_digits", "seq_len", "d_model", "d_k", "steps", "batch_size", "n_test", "threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.n_digits < 2:
            raise ValueError(f"n_digits must be at least 2, got {self.n_digits}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")


def running_max_batch(batch: int, cfg: RunningMaxConfig, generator: torch.Generator) -> Tensor:
    """``batch`` sequences of uniformly drawn digits: int64 ``(batch, cfg.seq_len)`` in ``0..cfg.n_digits - 1``."""
    return torch.randint(cfg.n_digits, (batch, cfg.seq_len), generator=generator)


def running_max(tokens: Tensor) -> Tensor:
    """The target: at each position, the largest digit up to and including it. ``(batch, n)`` int64 in and out."""
    return tokens.cummax(dim=-1).values


class TinySelfAttention(nn.Module):
    """Embedding, one head of self-attention ({eq}`eq-sdpa` with {eq}`eq-qkv-projections`), a linear read-out.

    ``forward(tokens, causal=True)``: int64 ``(batch, n)`` -> logits float32 ``(batch, n, n_digits)``. The weights
    of the last call are kept in ``attention_weights`` ``(batch, n, n)``. No positions, no residual connection:
    the prediction at position i is ``out(sum_j a_ij v_j)``.
    """

    def __init__(self, n_digits: int, d_model: int, d_k: int, scaled: bool = True):
        super().__init__()
        self.scaled = scaled
        self.embed = nn.Embedding(n_digits, d_model)
        self.W_Q = nn.Linear(d_model, d_k, bias=False)
        self.W_K = nn.Linear(d_model, d_k, bias=False)
        self.W_V = nn.Linear(d_model, d_k, bias=False)
        self.out = nn.Linear(d_k, n_digits)
        self.attention_weights: Tensor | None = None

    def scores(self, tokens: Tensor) -> Tensor:
        """``Q K^T / sqrt(d_k)`` of ``tokens`` ``(batch, n)`` (``Q K^T`` when built with ``scaled=False``): float32
        ``(batch, n, n)``, before any mask."""
        x = self.embed(tokens)
        q, k = self.W_Q(x), self.W_K(x)
        scores = q @ k.transpose(-1, -2)
        return scores / math.sqrt(q.shape[-1]) if self.scaled else scores

    def forward(self, tokens: Tensor, causal: bool = True) -> Tensor:
        scores = self.scores(tokens)
        mask = causal_mask(tokens.shape[-1], device=tokens.device) if causal else None
        self.attention_weights = masked_softmax(scores, mask)
        return self.out(self.attention_weights @ self.W_V(self.embed(tokens)))


def make_model(cfg: RunningMaxConfig) -> TinySelfAttention:
    """The untrained model of ``cfg``: torch's default initialization after ``torch.manual_seed(cfg.seed)`` (the
    starting point of :func:`train_running_max`)."""
    torch.manual_seed(cfg.seed)
    return TinySelfAttention(cfg.n_digits, cfg.d_model, cfg.d_k, scaled=cfg.scaled)


def train_running_max(cfg: RunningMaxConfig) -> tuple[TinySelfAttention, list[float]]:
    """Train :class:`TinySelfAttention` with the causal mask on fresh batches (cross-entropy at every position).

    Returns the model (in eval mode) and the loss of every step. Deterministic: the same ``cfg`` gives the same
    weights, bitwise, on the same machine (``cfg.threads`` torch threads during training; the caller's number is
    restored).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        model = make_model(cfg)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        data = torch.Generator().manual_seed(cfg.seed)
        losses = []
        for _ in range(cfg.steps):
            tokens = running_max_batch(cfg.batch_size, cfg, data)
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), running_max(tokens).flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return model.eval(), losses


def share_on_running_max(weights: Tensor, tokens: Tensor, skip_first: bool = True) -> float:
    """The mean share of each query's weight that lies on the positions holding the running maximum.

    Args:
        weights: ``(batch, n, n)`` attention weights, rows = queries.
        tokens: int64 ``(batch, n)``, the digits.
        skip_first: leave out the first query, whose only allowed key under the causal mask is itself.

    For query i the expected keys are the positions ``j <= i`` whose digit equals the running maximum at i (several
    when the largest digit occurs more than once). Returns a float in ``[0, 1]``.

    Raises:
        ValueError: the shapes do not fit (the message gives both), or ``skip_first`` leaves no query.
    """
    if weights.dim() != 3 or tokens.shape != weights.shape[:2] or weights.shape[1] != weights.shape[2]:
        raise ValueError(f"weights must be (batch, n, n) and tokens (batch, n); got weights {tuple(weights.shape)}"
                         f" and tokens {tuple(tokens.shape)}")
    n = tokens.shape[1]
    if skip_first and n < 2:
        raise ValueError("skip_first needs sequences of at least 2 tokens")
    target = running_max(tokens)                                       # (batch, n)
    expected = (tokens[:, None, :] == target[:, :, None]) & causal_mask(n, device=tokens.device)
    share = (weights * expected).sum(-1)                               # (batch, n)
    return float(share[:, 1:].mean() if skip_first else share.mean())


@torch.no_grad()
def evaluate(model: TinySelfAttention, tokens: Tensor) -> dict[str, float]:
    """Accuracy (share of positions whose running maximum is predicted) and :func:`share_on_running_max`, with the
    causal mask the model was trained with and without it. Keys: ``accuracy``, ``share``, ``accuracy_no_mask``,
    ``share_no_mask``."""
    target = running_max(tokens)
    out = {}
    for suffix, causal in (("", True), ("_no_mask", False)):
        logits = model(tokens, causal=causal)
        out[f"accuracy{suffix}"] = float((logits.argmax(-1) == target).float().mean())
        out[f"share{suffix}"] = share_on_running_max(model.attention_weights, tokens)
    model(tokens)  # leave the weights of the masked call behind
    return out


@torch.no_grad()
def score_table(model: TinySelfAttention) -> np.ndarray:
    """The trained scores ``q(a)^T k(b) / sqrt(d_k)`` of a query digit ``a`` (rows) against a key digit ``b``
    (columns): float64 ``(n_digits, n_digits)``. Without positions, a score depends on the two digits only."""
    digits = torch.arange(model.embed.num_embeddings)
    return model.scores(digits[None])[0].double().numpy()


@torch.no_grad()
def value_table(model: TinySelfAttention) -> np.ndarray:
    """What the read-out makes of each digit's value alone: ``out(v(b))``, the logits of every predicted digit
    (columns) for the value of digit ``b`` (rows), float64 ``(n_digits, n_digits)``.

    When a query puts all its weight on positions holding digit ``b``, the head's output is ``v(b)`` and the
    prediction is this row, so a head that passes the winning digit on through its values has its largest entry
    of each row on the diagonal. Chapter 3, section "A trained head: the largest digit so far"."""
    values = model.W_V(model.embed(torch.arange(model.embed.num_embeddings)))
    return model.out(values).double().numpy()


def share_words(share: float) -> str:
    """A share in words for prose: "all", "nearly all" (>= 0.95), "most" (> 0.5), "about half" (0.45 to 0.5),
    "less than half", or "none".

    Raises:
        ValueError: ``share`` is not in [0, 1].
    """
    if not 0 <= share <= 1:
        raise ValueError(f"share must be in [0, 1], got {share}")
    if share == 1:
        return "all"
    if share >= 0.95:
        return "nearly all"
    if share > 0.5:
        return "most"
    if share >= 0.45:
        return "about half"
    return "none" if share == 0 else "less than half"


def start_spread_words(q_var: float, k_var: float, score_std: float) -> str:
    """Why the scaled scores of an untrained head need not have unit variance, in words for chapter 3's prose.

    ``q_var`` and ``k_var`` are the variances of the query and key components at initialization, ``score_std`` the
    standard deviation of the scaled scores ``q.k / sqrt(d_k)``. Unit variance needs components of variance 1
    (chapter 3, eq-var-dot and exercise ex-var-sigma). Returns ``"below 1, so the scaled scores start with a
    smaller spread"`` when both variances are below 1, ``"above 1, so ... a larger spread"`` when both are above 1,
    and ``"not both 1, so the scaled scores need not start with unit variance"`` otherwise.

    Raises:
        ValueError: a variance or ``score_std`` is not positive and finite, or the words would contradict
            ``score_std`` (a smaller spread with ``score_std >= 1``, a larger one with ``score_std <= 1``).
    """
    for name, value in (("q_var", q_var), ("k_var", k_var), ("score_std", score_std)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value}")
    if q_var < 1 and k_var < 1:
        if score_std >= 1:
            raise ValueError(f"components of variance below 1 ({q_var:.3g}, {k_var:.3g}) but scores of standard "
                             f"deviation {score_std:.3g}: the words would contradict the data")
        return "below 1, so the scaled scores start with a smaller spread"
    if q_var > 1 and k_var > 1:
        if score_std <= 1:
            raise ValueError(f"components of variance above 1 ({q_var:.3g}, {k_var:.3g}) but scores of standard "
                             f"deviation {score_std:.3g}: the words would contradict the data")
        return "above 1, so the scaled scores start with a larger spread"
    return "not both 1, so the scaled scores need not start with unit variance"


def key_ranking(table: np.ndarray) -> dict[str, float]:
    """What a :func:`score_table` says about the keys, for the chapter's sentences.

    Returns ``rising``: the number of query digits ``a`` for which the score rises strictly with the key's digit
    from ``a`` up to the largest digit (the keys a running maximum can choose between); ``n_queries``: the number
    of query digits; ``top_gap``: the mean, over query digits below the largest, of the score of the largest digit
    minus that of the next one (in the units of the scaled scores).

    Raises:
        ValueError: ``table`` is not square, or smaller than 2 x 2.
    """
    table = np.asarray(table, dtype=float)
    if table.ndim != 2 or table.shape[0] != table.shape[1] or table.shape[0] < 2:
        raise ValueError(f"table must be square and at least 2 x 2, got shape {table.shape}")
    n = table.shape[0]
    rising = sum(bool(np.all(np.diff(table[a, a:]) > 0)) for a in range(n))
    return {"rising": rising, "n_queries": n, "top_gap": float(np.mean(table[:-1, -1] - table[:-1, -2]))}


#: The reader's words for the entries of :func:`evaluate`.
REPORT_LABELS = {"accuracy": "accuracy", "share": "weight on the largest digit so far",
                 "accuracy_no_mask": "accuracy, mask removed",
                 "share_no_mask": "weight on the largest digit so far, mask removed"}


def report_table(report: dict[str, float], digits: int = 3):
    """:func:`evaluate`'s ``report`` as a one-column table in the reader's words (:data:`REPORT_LABELS`), labelled
    as a small demonstration (chapter 3, section "A trained head")."""
    import pandas as pd

    return pd.Series(report).rename(REPORT_LABELS).round(digits).to_frame("small demonstration")


def scale_comparison(cfg: RunningMaxConfig, seeds=(0, 1, 2)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train the head of ``cfg`` with and without the ``1/sqrt(d_k)`` factor, once per seed (the seed fixes the
    initial weights and the data, the same for both). Chapter 3, section "The scale in training".

    Returns ``(losses, summary)``: ``losses`` has columns ``scaled`` (bool), ``seed``, ``step`` and ``loss``;
    ``summary`` one row per run with ``scaled``, ``seed``, ``start_sd`` (the standard deviation of the untrained
    head's scores on the test sequences), ``loss_end`` (mean loss of the last 20 steps) and ``accuracy`` (on the
    ``n_test`` test sequences, causal mask on).

    Raises:
        ValueError: ``seeds`` is empty.
    """
    import pandas as pd

    seeds = tuple(seeds)
    if not seeds:
        raise ValueError("seeds must not be empty")
    test = running_max_batch(cfg.n_test, cfg, torch.Generator().manual_seed(cfg.test_seed))
    losses, rows = [], []
    for scaled in (True, False):
        for seed in seeds:
            run = replace(cfg, scaled=scaled, seed=seed)
            with torch.no_grad():
                start_sd = float(make_model(run).scores(test).std())
            model, curve = train_running_max(run)
            with torch.no_grad():
                accuracy = evaluate(model, test)["accuracy"]
            losses.append(pd.DataFrame({"scaled": scaled, "seed": seed, "step": np.arange(1, len(curve) + 1),
                                        "loss": curve}))
            rows.append({"scaled": scaled, "seed": seed, "start_sd": start_sd,
                         "loss_end": float(np.mean(curve[-20:])), "accuracy": accuracy})
    return pd.concat(losses, ignore_index=True), pd.DataFrame(rows)


def scale_sentence(summary: pd.DataFrame, d_k: int) -> str:
    """What :func:`scale_comparison`'s ``summary`` shows, in one or two sentences chosen by the data: the scores'
    spread at the start, and the accuracies reached with and without the factor.

    Raises:
        ValueError: ``summary`` lacks the scaled or the unscaled runs.
    """
    by = {k: g for k, g in summary.groupby("scaled")}
    if set(by) != {True, False}:
        raise ValueError("summary needs runs with and without the factor")
    on, off = by[True], by[False]
    start = (f"At d_k = {d_k} the unscaled scores start with a standard deviation of about "
             f"{off.start_sd.mean():.1f}, against {on.start_sd.mean():.1f} with the factor.")

    def span(acc):
        lo, hi = acc.min(), acc.max()
        return f"{lo:.3f}" if lo == hi else f"{lo:.3f} to {hi:.3f}"

    if off.accuracy.max() < on.accuracy.min():
        return (start + f" With the factor every run reached accuracy {span(on.accuracy)}; without it, the same "
                f"steps reached only {span(off.accuracy)}.")
    if off.accuracy.min() > on.accuracy.max():
        return start + (f" Here the unscaled runs did better: accuracy {span(off.accuracy)}, against "
                        f"{span(on.accuracy)} with the factor.")
    return start + (f" The accuracies overlap: {span(on.accuracy)} with the factor, {span(off.accuracy)} without "
                    "it.")


def plot_scale_comparison(losses: pd.DataFrame, d_k: int):
    """The training loss of every run of :func:`scale_comparison`, with and without the factor (log scale)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for scaled, color, label in ((True, "C0", "scaled by 1/√d_k"), (False, "C3", "unscaled")):
        for k, (_, run) in enumerate(losses[losses.scaled == scaled].groupby("seed")):
            ax.plot(run.step, run.loss.clip(lower=1e-6), color=color, lw=1, alpha=0.8,
                    label=label if k == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("training loss")
    ax.set_title(f"one head, d_k = {d_k}")
    ax.legend()
    fig.tight_layout()
    return fig
