"""Attention pooling over a sequence of states (seq2vec), with the masking variants of the padding experiments.

Explained in chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``),
sections "Attention pooling" and "Four ways to treat the padding". The pooling is the word-level attention of the
Hierarchical Attention Network (Yang et al. 2016, eqs. 5-7)::

    u_t = tanh(W h_t + b)            (attention_size,)
    s_t = u_t . u_w                  the score of position t against the learned context vector u_w
    alpha = softmax_t(s_t)           over the positions, with one of the masking variants below
    c = sum_t alpha_t h_t            (input_size,)

Masks follow the book's convention everywhere: a bool tensor, True = the position takes part (as in
``torch.nn.functional.scaled_dot_product_attention``); :func:`attnbook.masking.lengths_to_mask` builds one from
lengths.

The masking variants (:data:`MASKINGS`), all from :mod:`attnbook.masking`:

- ``"none"``: plain softmax over every position, padding included (the practitioner's "unmasked" model);
- ``"renormalize"``: softmax over every position, zero the pads, divide by the new sum
  (:func:`~attnbook.masking.renormalized_softmax`);
- ``"additive"``: BERT's additive mask, ``softmax(s + (1 - mask) * -1e4)``
  (:func:`~attnbook.masking.additive_mask_softmax`);
- ``"neg_inf"``: pads set to ``-inf`` before the softmax, rows without any valid position all zeros
  (:func:`~attnbook.masking.masked_softmax`, the book's safe mask).

A fifth, :data:`UNSAFE`, is the common one-liner ``scores.masked_fill(~mask, -inf).softmax(-1)``: correct while every
row has a valid position, NaN for a row that has none (a padded sentence in a HAN). It exists to show that failure.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .masking import (BERT_MASK_VALUE, additive_mask_softmax, check_bool_mask, check_mask_for, masked_softmax,
                      renormalized_softmax)

__all__ = ["MASKINGS", "UNSAFE", "POOLINGS", "pool_weights", "AttentionPooling", "Pooling"]

#: The four treatments of padding compared in chapter 5 (section "Four ways to treat the padding").
MASKINGS = ("none", "renormalize", "additive", "neg_inf")
#: ``masked_fill(-inf)`` then softmax: NaN on a row with every position masked (chapter 5, section "HAN").
UNSAFE = "neg_inf_unsafe"
#: Pooling kinds of :class:`Pooling`: learned attention and the three baselines of chapter 5.
POOLINGS = ("attention", "mean", "uniform", "last")


def pool_weights(scores: Tensor, mask: Tensor, masking: str) -> Tensor:
    """Attention weights over positions from ``scores`` under one masking variant.

    Args:
        scores: float ``(batch, seq_len)`` (or any ``(..., seq_len)``), the scores ``s_t``.
        mask: bool, same shape as ``scores``; True = the position takes part (a real token), the convention of
            ``F.scaled_dot_product_attention``.
        masking: one of :data:`MASKINGS` or :data:`UNSAFE` (see the module docstring).

    Returns:
        Weights shaped like ``scores``, summing to 1 over the last axis. Under ``"neg_inf"`` and
        ``"renormalize"`` pads get exactly 0 and a row without any valid position is all zeros; under ``"none"``
        pads get their softmax share; under ``"additive"`` about ``exp(-1e4)`` relative weight (0 in practice),
        and an all-pad row gets ``softmax(scores)``; under :data:`UNSAFE` an all-pad row is NaN.

    Raises:
        ValueError: unknown ``masking``, or ``mask`` has another shape than ``scores`` (the message gives both).
        TypeError: ``mask`` is not bool.
    """
    check_bool_mask(mask)
    if mask.shape != scores.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal scores shape {tuple(scores.shape)}")
    if masking == "none":
        return torch.softmax(scores, dim=-1)
    if masking == "renormalize":
        return renormalized_softmax(scores, mask)
    if masking == "additive":
        return additive_mask_softmax(scores, mask, mask_value=BERT_MASK_VALUE)
    if masking == "neg_inf":
        return masked_softmax(scores, mask)
    if masking == UNSAFE:
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    raise ValueError(f"masking must be one of {MASKINGS + (UNSAFE,)}, got {masking!r}")


class AttentionPooling(nn.Module):
    """Attention pooling with a learned context vector (Yang et al. 2016, eqs. 5-7; chapter 5, "Attention pooling").

    Args:
        input_size: size ``D`` of the states ``h_t`` (``2 * hidden_size`` for a bidirectional GRU).
        attention_size: size of ``u_t`` and of the context vector ``u_w``.
        masking: one of :data:`MASKINGS` or :data:`UNSAFE`.

    Call: ``pool(states (B, T, D) float, mask (B, T) bool)`` -> ``(pooled (B, D), weights (B, T))``; True in the
    mask = the position takes part. The weights follow :func:`pool_weights`. ``T = 0`` gives zero vectors and
    ``(B, 0)`` weights (every row fully masked); ``B = 0`` gives empty outputs.

    Raises:
        ValueError: unknown ``masking``, or shapes that do not match (the message gives them).
        TypeError: ``mask`` is not bool.
    """

    def __init__(self, input_size: int, attention_size: int, masking: str = "neg_inf") -> None:
        super().__init__()
        if masking not in MASKINGS + (UNSAFE,):
            raise ValueError(f"masking must be one of {MASKINGS + (UNSAFE,)}, got {masking!r}")
        self.masking = masking
        self.proj = nn.Linear(input_size, attention_size)  # W, b
        self.context = nn.Parameter(torch.empty(attention_size))  # u_w
        nn.init.normal_(self.context, std=attention_size**-0.5)

    def scores(self, states: Tensor) -> Tensor:
        """``s_t = tanh(W h_t + b) . u_w`` for ``states`` ``(B, T, D)`` -> ``(B, T)``."""
        return torch.tanh(self.proj(states)) @ self.context

    def zero_state_score(self) -> float:
        """The score of an all-zero state, ``tanh(b) . u_w`` (argument 1 of the chapter: the bias can learn to
        make it low, so that zero pad states get little weight even without a mask)."""
        with torch.no_grad():
            return float(torch.tanh(self.proj.bias) @ self.context)

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        check_bool_mask(mask)
        if states.dim() != 3 or mask.shape != states.shape[:2]:
            raise ValueError(f"states must be (B, T, D) and mask (B, T), got {tuple(states.shape)} and "
                             f"{tuple(mask.shape)}")
        weights = pool_weights(self.scores(states), mask, self.masking)
        pooled = torch.einsum("bt,btd->bd", weights.to(states.dtype), states)
        return pooled, weights


class Pooling(nn.Module):
    """One of the pooling kinds compared in chapter 5 (section "Baselines"), behind one interface.

    Kinds (:data:`POOLINGS`):

    - ``"attention"``: :class:`AttentionPooling` with ``masking``;
    - ``"mean"``: mean of the valid states (uniform attention over the real tokens);
    - ``"uniform"``: mean over every position, pads included (uniform attention without a mask);
    - ``"last"``: the last valid state of each direction: for a bidirectional encoder, the forward half at the last
      real token and the backward half at the first real token (the mask says where the pads are; every row needs
      one real position).

    Call: ``pool(states (B, T, D), mask (B, T) bool)`` -> ``(pooled (B, D), weights (B, T))``; True in the mask =
    the position takes part. For ``"last"`` the weights are the one-hot positions of the forward half. The mask must
    have exactly the shape ``(B, T)`` of the states: it is never broadcast. Degenerate sizes: ``B = 0`` gives empty
    outputs; ``T = 0`` gives zero vectors and ``(B, 0)`` weights for ``"attention"``, ``"mean"`` and ``"uniform"``
    (as for a fully masked row), and raises for ``"last"``, which has no position to pick.

    Raises:
        ValueError: unknown ``kind``; ``states`` not 3-D; ``mask`` not of shape ``(B, T)`` (the message gives both
            shapes); for ``"last"``, a row of ``mask`` without any True position (the message lists the rows).
        TypeError: ``states`` is not a tensor, or ``mask`` is not bool.
    """

    def __init__(self, kind: str, input_size: int, attention_size: int = 100, masking: str = "neg_inf",
                 bidirectional: bool = True) -> None:
        super().__init__()
        if kind not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {kind!r}")
        self.kind = kind
        self.bidirectional = bidirectional
        self.attention = AttentionPooling(input_size, attention_size, masking) if kind == "attention" else None

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        if not isinstance(states, Tensor):
            raise TypeError(f"states must be a torch.Tensor, got {type(states).__name__}")
        if states.dim() != 3:
            raise ValueError(f"states must have shape (batch, length, size), got {tuple(states.shape)}")
        check_mask_for(states, mask)
        if self.attention is not None:
            return self.attention(states, mask)
        valid = mask.to(states.dtype)
        if self.kind == "mean":
            weights = valid / valid.sum(-1, keepdim=True).clamp_min(1.0)
        elif self.kind == "uniform":
            weights = torch.full_like(valid, 1.0 / max(valid.shape[-1], 1))  # T = 0: (B, 0) weights, zero vectors
        else:  # last
            empty = (~mask.any(-1)).nonzero().flatten()
            if empty.numel():
                raise ValueError(f"pooling 'last' needs at least one True position in every row of mask, but rows "
                                 f"{empty.tolist()[:10]} of mask (shape {tuple(mask.shape)}) have none")
            positions = torch.arange(mask.shape[-1], device=mask.device)
            last = torch.where(mask, positions, -1).amax(-1)  # index of the last real token
            first = torch.where(mask, positions, mask.shape[-1]).amin(-1)  # index of the first real token
            rows = torch.arange(states.shape[0], device=states.device)
            if not self.bidirectional:
                return states[rows, last], nn.functional.one_hot(last, mask.shape[-1]).to(states.dtype)
            half = states.shape[-1] // 2
            pooled = torch.cat([states[rows, last, :half], states[rows, first, half:]], dim=-1)
            return pooled, nn.functional.one_hot(last, mask.shape[-1]).to(states.dtype)
        return torch.einsum("bt,btd->bd", weights, states), weights
