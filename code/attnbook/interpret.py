"""Is attention an explanation? Importance measures, rank correlation, the permutation test, uniform attention.

Explained in chapter 7, "Soft and hard attention" (``chapters/07_soft_hard_attention``), section "Is attention an
explanation?". The tests follow Jain and Wallace (2019): Kendall's tau between the attention weights and two
importance measures (:func:`gradient_importance`, :func:`leave_one_out_importance`; :func:`kendall_tau`), and the
change in output when the attention weights are randomly permuted (:func:`permutation_effect`); and Wiegreffe and
Pinter (2019): a baseline whose attention is frozen to uniform weights (``AttentionClassifier(uniform=True)``,
:func:`uniform_weights`).

The chapter runs them on chapter 5's classifier, :class:`attnbook.models.BiGRUClassifier` (a packed BiGRU with
attention pooling), seen through :class:`BinaryView`.

The functions work with any binary classifier that follows the protocol of :class:`AttentionClassifier`:

- ``model.embed(ids) -> (B, T, d)`` token embeddings;
- ``model(ids, lengths, *, embeddings=None, weights=None) -> (logits (B,), weights (B, T))``, where ``embeddings``
  replaces ``model.embed(ids)`` and ``weights`` replaces the attention weights (rows summing to 1 over the valid
  positions, 0 on padding).

The output compared is the predicted probability of the positive class, ``sigmoid(logit)``. Masks follow the book's
convention: bool, True = the position takes part.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import kendalltau
from torch import Tensor, nn

from .attention import AdditiveAttention
from .masking import check_bool_mask, check_lengths_for, lengths_to_mask, masked_softmax
from .models import BiGRUClassifier, padding_mask

__all__ = [
    "AttentionClassifier",
    "BinaryView",
    "uniform_weights",
    "gradient_importance",
    "leave_one_out_importance",
    "kendall_tau",
    "permutation_effect",
]


class AttentionClassifier(nn.Module):
    """Embedding -> bidirectional GRU -> attention pooling with a learned query -> one logit (Jain and Wallace 2019).

    The pooling is additive attention with a single learned query, ``alpha_t = softmax_t(w^T tanh(W h_t + b))``
    (Yang et al. 2016; chapter 3's exercise on HAN pooling), masked so that padding gets weight 0; the logit is
    ``v^T sum_t alpha_t h_t + c``.

    Args:
        vocab_size: number of token ids (id 0 = ``<pad>``).
        embed_size, hidden_size, attention_size: layer sizes (the GRU has ``hidden_size`` per direction).
        uniform: freeze the attention to uniform weights over the valid tokens (the baseline of Wiegreffe and
            Pinter 2019); the scorer is then unused.
        encoder: ``"bigru"`` (default), ``"cnn"`` (one 1-D convolution of width 5 and a ReLU, ``2 * hidden_size``
            channels: context from two tokens on each side, much faster on a CPU) or ``"none"`` (attention
            directly over the embeddings).

    Call: ``model(ids (B, T) int64, lengths (B,) int64, *, embeddings=None, weights=None)`` ->
    ``(logits (B,), weights (B, T))``. ``lengths`` must have one entry per row of ``ids``, each in ``[1, T]`` for
    the ``"bigru"`` encoder (which packs the batch) and in ``[0, T]`` otherwise (a length-0 row gets zero weights);
    the padding mask built from them is bool, True = the position takes part. ``embeddings``, if given, must be
    ``(B, T, embed_size)``; ``weights``, if given, ``(B, T)``. An empty batch (``B = 0``) gives empty outputs.

    Raises:
        ValueError: a size is not positive or ``encoder`` is unknown; at the call, ``ids`` not 2-D, ``lengths`` not
            of shape ``(B,)`` or out of range, or ``embeddings``/``weights`` of another shape (the message gives
            the shapes and values).
        TypeError: at the call, ``ids`` (or ``embeddings``) not a tensor, or ``lengths`` not of an integer dtype.
    """

    def __init__(self, vocab_size: int, embed_size: int = 64, hidden_size: int = 32, attention_size: int = 32,
                 uniform: bool = False, encoder: str = "bigru") -> None:
        super().__init__()
        if min(vocab_size, embed_size, hidden_size, attention_size) <= 0:
            raise ValueError("all sizes must be positive")
        if encoder not in ("bigru", "cnn", "none"):
            raise ValueError(f"encoder must be 'bigru', 'cnn' or 'none', got {encoder!r}")
        self.uniform, self.encoder_kind = uniform, encoder
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.rnn = nn.GRU(embed_size, hidden_size, batch_first=True, bidirectional=True) if encoder == "bigru" \
            else None
        self.conv = nn.Conv1d(embed_size, 2 * hidden_size, 5, padding=2) if encoder == "cnn" else None
        state_size = embed_size if encoder == "none" else 2 * hidden_size
        self.attention = AdditiveAttention(query_size=1, key_size=state_size, hidden_size=attention_size, bias=True)
        self.out = nn.Linear(state_size, 1)

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings ``(B, T, embed_size)``."""
        return self.embedding(ids)

    @property
    def direction(self) -> Tensor:
        """``v`` ``(state_size,)``: the logit is ``v . c + b`` for the pooled vector ``c = sum_t alpha_t h_t``, as
        :attr:`BinaryView.direction` (chapter 7, section "The same prediction from different weights")."""
        return self.out.weight[0]

    @property
    def bias(self) -> Tensor:
        """``b`` (a 0-d tensor): the logit's constant."""
        return self.out.bias[0]

    def _check_lengths(self, x: Tensor, lengths: object, x_name: str) -> Tensor:
        """``lengths`` checked against the rows of ``x`` (``(B, T, ...)``): shape ``(B,)``, integers in ``[1, T]``
        (``"bigru"``: packing needs a token) or ``[0, T]``."""
        return check_lengths_for(x, lengths, x_name=x_name, min_length=1 if self.rnn is not None else 0)

    def states(self, embeddings: Tensor, lengths: Tensor) -> Tensor:
        """Encoder states ``(B, T, state_size)`` of ``embeddings`` ``(B, T, embed_size)``; padding positions are
        zeros for the ``"bigru"`` and ``"cnn"`` encoders. ``lengths``: as in the call (raises the same errors)."""
        if not isinstance(embeddings, Tensor):
            raise TypeError(f"embeddings must be a torch.Tensor, got {type(embeddings).__name__}")
        if embeddings.dim() != 3 or embeddings.shape[-1] != self.embedding.embedding_dim:
            raise ValueError(f"embeddings must have shape (batch, length, {self.embedding.embedding_dim}), got "
                             f"{tuple(embeddings.shape)}")
        lengths = self._check_lengths(embeddings, lengths, "embeddings")
        if self.rnn is not None and embeddings.shape[0] == 0:  # pack_padded_sequence refuses an empty batch
            return embeddings.new_zeros(0, embeddings.shape[1], 2 * self.rnn.hidden_size)
        if self.conv is not None:
            mask = lengths_to_mask(lengths, embeddings.shape[1]).to(embeddings.device)
            states = torch.relu(self.conv((embeddings * mask.unsqueeze(-1)).transpose(1, 2))).transpose(1, 2)
            return states * mask.unsqueeze(-1)
        if self.rnn is None:
            return embeddings
        packed = nn.utils.rnn.pack_padded_sequence(embeddings, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=embeddings.shape[1])[0]

    def forward(self, ids: Tensor, lengths: Tensor, *, embeddings: Tensor | None = None,
                weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (batch, length), got {tuple(ids.shape)}")
        lengths = self._check_lengths(ids, lengths, "ids")
        if embeddings is not None and tuple(embeddings.shape[:2]) != tuple(ids.shape):
            raise ValueError(f"embeddings must have shape {tuple(ids.shape) + (self.embedding.embedding_dim,)} "
                             f"to match ids of shape {tuple(ids.shape)}, got {tuple(embeddings.shape)}")
        if weights is not None and tuple(weights.shape) != tuple(ids.shape):
            raise ValueError(f"weights must have the shape of ids {tuple(ids.shape)}, got {tuple(weights.shape)}")
        mask = lengths_to_mask(lengths, ids.shape[1]).to(ids.device)
        h = self.states(self.embed(ids) if embeddings is None else embeddings, lengths)
        if weights is None:
            if self.uniform:
                weights = uniform_weights(mask).to(h.dtype)
            else:
                query = torch.ones(h.shape[0], 1, 1, dtype=h.dtype, device=h.device)
                weights = masked_softmax(self.attention.scores(query, h).squeeze(1), mask)
        pooled = torch.bmm(weights.unsqueeze(1), h).squeeze(1)
        return self.out(pooled).squeeze(-1), weights


class BinaryView(nn.Module):
    """A two-class :class:`attnbook.models.BiGRUClassifier` seen through this module's protocol: one logit, and the
    embeddings and pooling weights replaceable.

    The wrapped model's two logits ``l_0, l_1`` become the single logit ``l_1 - l_0``, so that
    ``sigmoid(l_1 - l_0) = softmax(l)_1``, the probability of class 1 (a positive review). Pooling is a weighted
    sum ``c = sum_t alpha_t h_t`` of the encoder states, so the logit is ``v . c + b`` with :attr:`direction`
    ``v = w_1 - w_0`` and :attr:`bias` ``b = b_1 - b_0`` of the model's classifier (chapter 7, section "The same
    prediction from different weights"). The view shares the model's parameters; it copies nothing.

    Args:
        model: a :class:`attnbook.models.BiGRUClassifier` with ``num_classes=2`` and a weighted-sum pooling
            (``"attention"``, ``"mean"`` or ``"uniform"``).

    Call: ``view(ids (B, T) int64, lengths (B,) int64, *, embeddings=None, weights=None)`` ->
    ``(logits (B,), weights (B, T))``, where ``weights`` are the pooling's (for attention pooling, masked so that
    pads get 0; the mask is bool, True = a real token, built from ``lengths`` on the model's padding side).
    ``embeddings`` ``(B, T, embed_size)`` replace ``model.embedding(ids)``; ``weights`` ``(B, T)`` replace the
    pooling weights. Lengths must lie in ``[1, T]`` when the model's encoder is packed.

    Raises:
        TypeError: ``model`` is not a ``BiGRUClassifier``; at the call, as the model.
        ValueError: ``model`` has another number of classes or pools by ``"last"``; at the call, ``embeddings`` or
            ``weights`` of another shape (the message gives the shapes), and the model's own errors.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not isinstance(model, BiGRUClassifier):
            raise TypeError(f"model must be an attnbook.models.BiGRUClassifier, got {type(model).__name__}")
        if model.classifier.out_features != 2:
            raise ValueError(f"model must have 2 classes, got {model.classifier.out_features}")
        if model.pooling.kind == "last":
            raise ValueError("model must pool by a weighted sum ('attention', 'mean' or 'uniform'), got 'last'")
        self.model = model

    @property
    def direction(self) -> Tensor:
        """``v = w_1 - w_0`` ``(state_size,)``: the logit is ``v . c + b`` for the pooled vector ``c``."""
        weight = self.model.classifier.weight
        return weight[1] - weight[0]

    @property
    def bias(self) -> Tensor:
        """``b = b_1 - b_0`` (a 0-d tensor)."""
        bias = self.model.classifier.bias
        return bias[1] - bias[0]

    def embed(self, ids: Tensor) -> Tensor:
        """Token embeddings ``(B, T, embed_size)``."""
        return self.model.embedding(ids)

    def states(self, embeddings: Tensor, lengths: Tensor) -> Tensor:
        """Encoder states ``(B, T, 2 * hidden_size)`` of ``embeddings`` (zeros at pads when packed)."""
        return self.model.encoder(embeddings, lengths)

    def forward(self, ids: Tensor, lengths: Tensor, *, embeddings: Tensor | None = None,
                weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (batch, length), got {tuple(ids.shape)}")
        lengths = check_lengths_for(ids, lengths, x_name="ids", min_length=1 if self.model.encoder.packed else 0)
        size = self.model.embedding.embedding_dim
        if embeddings is not None and tuple(embeddings.shape) != tuple(ids.shape) + (size,):
            raise ValueError(f"embeddings must have shape {tuple(ids.shape) + (size,)} to match ids of shape "
                             f"{tuple(ids.shape)}, got {tuple(embeddings.shape)}")
        if weights is not None and tuple(weights.shape) != tuple(ids.shape):
            raise ValueError(f"weights must have the shape of ids {tuple(ids.shape)}, got {tuple(weights.shape)}")
        h = self.states(self.embed(ids) if embeddings is None else embeddings, lengths)
        if weights is None:
            mask = padding_mask(lengths.to(ids.device), ids.shape[1], self.model.padding_side)
            pooled, weights = self.model.pooling(h, mask)
        else:
            pooled = torch.einsum("bt,btd->bd", weights.to(h.dtype), h)
        logits = self.model.classifier(pooled)
        return logits[:, 1] - logits[:, 0], weights


def uniform_weights(mask: Tensor) -> Tensor:
    """Weights ``1 / n_valid`` on the valid positions of each row of a bool ``mask`` ``(B, T)`` (True = takes part),
    0 elsewhere; an all-False row gives zeros.

    Raises:
        TypeError: ``mask`` is not bool.
    """
    check_bool_mask(mask)
    counts = mask.sum(-1, keepdim=True).clamp(min=1)
    return mask.float() / counts


def gradient_importance(model: nn.Module, ids: Tensor, lengths: Tensor, detach_attention: bool = False) -> Tensor:
    """Gradient importance ``|| d sigmoid(logit) / d e_t ||_2`` of every token embedding ``e_t``; 0 on padding.

    Args:
        model: a classifier following the module's protocol (e.g. :class:`AttentionClassifier`).
        ids: int64 ``(B, T)``; lengths: int64 ``(B,)``.
        detach_attention: compute the weights first and hold them fixed, so that the gradient does not flow
            through the attention scores (only through the values).

    Returns:
        float32 ``(B, T)``. The model's mode (train/eval) is left as it is; call ``model.eval()`` first.
    """
    embeddings = model.embed(ids).detach().requires_grad_(True)
    weights = None
    if detach_attention:
        with torch.no_grad():
            _, weights = model(ids, lengths)
    logits, _ = model(ids, lengths, embeddings=embeddings, weights=weights)
    (grad,) = torch.autograd.grad(torch.sigmoid(logits).sum(), embeddings)
    mask = lengths_to_mask(lengths, ids.shape[1]).to(ids.device)
    return grad.norm(dim=-1) * mask


def _leave_one_out_batches(ids: Tensor, lengths: Tensor, batch_size: int):
    """Yield ``(rows, cols, variants, new_lengths)`` for the shortened sequences, at most ``batch_size`` at a time.

    Variant ``v`` is row ``rows[v]`` of ``ids`` without token ``cols[v]`` (the rest shift left), padded with 0 to
    width ``T``; its length is one less. Only one batch of ``(batch_size, T)`` ids exists at a time, so the memory
    is ``O(B * T + batch_size * T)``, not the ``O(B * T**2)`` of building every variant first.
    """
    lengths = torch.as_tensor(lengths, device=ids.device)
    n_tokens = ids.shape[1]
    scored = torch.nonzero(lengths >= 2).flatten()                                 # rows with something to drop
    counts = lengths[scored]
    all_rows = scored.repeat_interleave(counts)                                    # (n_variants,) in row order
    starts = torch.cumsum(counts, 0) - counts
    all_cols = torch.arange(len(all_rows), device=ids.device) - starts.repeat_interleave(counts)
    positions = torch.arange(max(n_tokens - 1, 0), device=ids.device)
    for s in range(0, len(all_rows), batch_size):
        rows, cols = all_rows[s:s + batch_size], all_cols[s:s + batch_size]
        new_lengths = (lengths[rows] - 1).long()
        source = positions + (positions >= cols[:, None])                          # skip the dropped token
        shortened = torch.gather(ids[rows], 1, source)
        shortened = torch.where(positions < new_lengths[:, None], shortened, torch.zeros((), dtype=ids.dtype,
                                                                                         device=ids.device))
        yield rows, cols, torch.nn.functional.pad(shortened, (0, 1)), new_lengths


@torch.no_grad()
def leave_one_out_importance(model: nn.Module, ids: Tensor, lengths: Tensor, batch_size: int = 512) -> Tensor:
    """Leave-one-out importance ``|p(x) - p(x without token t)|`` for every valid position; 0 on padding.

    Token ``t`` is deleted (the rest shift left, the length drops by one), not masked, so that the encoder never
    sees it. A sequence of length 1 gets importance 0.

    Args:
        model: a classifier following the module's protocol; ids: int64 ``(B, T)``; lengths: int64 ``(B,)``.
        batch_size: how many shortened sequences to score at once (>= 1). The shortened sequences are generated
            batch by batch, so the model never sees more than ``(batch_size, T)`` ids at a time and the memory
            grows as ``B * T + batch_size * T``, not as ``B * T**2``.

    Returns:
        float32 ``(B, T)``.

    Raises:
        ValueError: ``batch_size < 1``.
    """
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    probs = torch.sigmoid(model(ids, lengths)[0])
    out = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    for rows, cols, variants, new_lengths in _leave_one_out_batches(ids, lengths, int(batch_size)):
        new_probs = torch.sigmoid(model(variants, new_lengths)[0])
        out[rows, cols] = (new_probs - probs[rows]).abs().float()
    return out


def kendall_tau(a: Tensor | np.ndarray, b: Tensor | np.ndarray, lengths: Tensor | np.ndarray) -> np.ndarray:
    """Kendall's tau-b between ``a[i, :lengths[i]]`` and ``b[i, :lengths[i]]`` for every row ``i``.

    Uses ``scipy.stats.kendalltau`` (tau-b, which corrects for ties). Rows with fewer than two positions, or where
    one of the two is constant, give NaN.

    Args:
        a, b: ``(B, T)`` arrays or tensors, e.g. attention weights and an importance measure.
        lengths: ``(B,)`` valid lengths.

    Returns:
        float64 ``(B,)``.

    Raises:
        ValueError: ``a`` and ``b`` have different shapes, or ``lengths`` does not have one entry per row.
    """
    a = a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)
    b = b.detach().cpu().numpy() if isinstance(b, Tensor) else np.asarray(b)
    lengths = lengths.cpu().numpy() if isinstance(lengths, Tensor) else np.asarray(lengths)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"a and b must be 2-D of the same shape, got {a.shape} and {b.shape}")
    if lengths.shape != (a.shape[0],):
        raise ValueError(f"lengths must have shape ({a.shape[0]},), got {lengths.shape}")
    taus = np.full(a.shape[0], np.nan)
    for i, n in enumerate(lengths.astype(int)):
        x, y = a[i, :n], b[i, :n]
        if n >= 2 and np.ptp(x) > 0 and np.ptp(y) > 0:
            taus[i] = kendalltau(x, y).statistic
    return taus


@torch.no_grad()
def permutation_effect(model: nn.Module, ids: Tensor, lengths: Tensor, n_permutations: int = 100,
                       generator: torch.Generator | None = None) -> Tensor:
    """Median ``|p(x; permuted weights) - p(x)|`` over random permutations of each example's attention weights.

    The weights of the valid positions are shuffled among those positions (padding keeps weight 0), the encoder
    states stay as they are, and the output is recomputed (Jain and Wallace 2019, section 4.2). A small median
    means the prediction does not depend on *which* token got *which* weight.

    Args:
        model: a classifier following the module's protocol; ids: int64 ``(B, T)``; lengths: int64 ``(B,)``.
        n_permutations: permutations per example (>= 1).
        generator: seeded generator for the permutations.

    Returns:
        float32 ``(B,)``.

    Raises:
        ValueError: ``n_permutations < 1``.
    """
    if n_permutations < 1:
        raise ValueError(f"n_permutations must be >= 1, got {n_permutations}")
    logits, weights = model(ids, lengths)
    probs = torch.sigmoid(logits)
    mask = lengths_to_mask(lengths, ids.shape[1]).to(ids.device)
    changes = torch.empty(n_permutations, ids.shape[0])
    for k in range(n_permutations):
        # Random keys, +inf on padding: sorting them gives a random order of the valid positions first.
        keys = torch.rand(ids.shape, generator=generator).to(ids.device).masked_fill(~mask, float("inf"))
        order = keys.argsort(dim=-1)
        permuted = torch.zeros_like(weights)
        permuted[mask] = torch.gather(weights, 1, order)[mask]
        changes[k] = (torch.sigmoid(model(ids, lengths, weights=permuted)[0]) - probs).abs().cpu()
    return changes.median(dim=0).values
