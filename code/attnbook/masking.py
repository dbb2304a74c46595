"""Masks and masked softmax.

Explained in chapter 1, "Attention as soft dictionary lookup" (``chapters/01_soft_lookup``), sections
"Masked attention" and "Numerical pitfalls".

Mask convention, everywhere in attnbook: a **bool** tensor in which **True means "takes part"**, the same
convention as the boolean ``attn_mask`` of :func:`torch.nn.functional.scaled_dot_product_attention`. Note that
:class:`torch.nn.MultiheadAttention`'s ``key_padding_mask`` uses the opposite polarity (True = ignored).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "check_bool_mask",
    "lengths_to_mask",
    "masked_softmax",
    "renormalized_softmax",
    "additive_mask_softmax",
    "BERT_MASK_VALUE",
]

#: The additive constant of BERT's attention mask (Devlin et al. 2019; ``(1 - mask) * -10000.0``).
BERT_MASK_VALUE = -10_000.0


def check_bool_mask(mask: object, name: str = "mask") -> None:
    """Raise ``TypeError`` unless ``mask`` is a bool tensor (the attnbook convention: True = takes part).

    Shared by every function that takes a mask, so that the message is the same everywhere; ``name`` is the
    argument's name in the message (e.g. ``"premise_mask"``).
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a bool tensor (True = takes part), got dtype {mask.dtype}; "
            f"convert with {name}.bool() only if 1 means 'takes part'"
        )


def _check_scores_and_mask(scores: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Validate ``scores``/``mask`` and return ``mask`` expanded (as a view) to ``scores.shape``."""
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must have a floating dtype, got {scores.dtype}")
    check_bool_mask(mask)
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension (the keys)")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"dim={dim} is out of range for scores of shape {tuple(scores.shape)}")
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores.shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {tuple(scores.shape)}"
        )
    return mask.expand(scores.shape)


def lengths_to_mask(lengths: Tensor | Sequence[int], max_len: int | None = None) -> Tensor:
    """Bool mask ``(batch, max_len)`` that is True at the first ``lengths[b]`` positions of row ``b``.

    Args:
        lengths: integer tensor or sequence of shape ``(batch,)``; the number of valid (non-pad) positions
            of each sequence, in tokens. Zero is allowed (an all-False row).
        max_len: the padded length. ``None`` = ``max(lengths)`` (0 for an empty batch).

    Returns:
        Bool tensor ``(batch, max_len)`` on the device of ``lengths``; True = the position takes part
        (same convention as ``torch.nn.functional.scaled_dot_product_attention``).

    Raises:
        TypeError: ``lengths`` is not of an integer dtype.
        ValueError: ``lengths`` is not one-dimensional, has negative entries, or has entries greater than
            ``max_len``, or ``max_len`` is negative (the message gives the offending values).

    Example: ``lengths_to_mask([2, 0, 3], max_len=4)`` is
    ``[[T, T, F, F], [F, F, F, F], [T, T, T, F]]``. Chapter 1, section "Masked attention".
    """
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(list(lengths), dtype=torch.long)
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must have an integer dtype, got {lengths.dtype}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional (batch,), got shape {tuple(lengths.shape)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    elif max_len < 0:
        raise ValueError(f"max_len must be non-negative, got {max_len}")
    elif longest > max_len:
        raise ValueError(f"lengths must be <= max_len={max_len}, got {lengths.tolist()}")
    positions = torch.arange(max_len, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


def masked_softmax(scores: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
    """Softmax over ``dim`` that gives zero weight where ``mask`` is False.

    Args:
        scores: attention scores, any float dtype, e.g. ``(batch, n_queries, n_keys)``.
        mask: bool, broadcastable to ``scores``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``). ``None`` = plain softmax.
        dim: the axis of keys.

    Returns:
        Weights shaped like ``scores``, same dtype. They sum to 1 along ``dim``, or to 0 where every key is
        masked (such rows are all zeros, never NaN, in fp16, bf16, fp32 and fp64, and their gradient is zero).
        Masked weights are exactly 0.

    Raises:
        TypeError: ``scores`` is not floating point, or ``mask`` is not bool.
        ValueError: ``mask`` does not broadcast to ``scores`` (the message gives both shapes), or ``dim`` is
            out of range.

    Equivalent to renormalizing ``softmax(scores) * mask`` (chapter 1, "Attention as soft dictionary lookup",
    section "Masked attention", eq. ``eq-masked-softmax``). Masked scores are replaced by ``-inf`` (not by a
    large negative constant, which fails when real scores are lower still); rows with no valid key are
    computed on zeros and then zeroed, so no ``-inf - (-inf)`` NaN arises in the forward or backward pass.
    Does not modify ``scores``. NaN or ``+inf`` in unmasked ``scores`` propagate, as in ``torch.softmax``.
    """
    if mask is None:
        if not isinstance(scores, Tensor) or not scores.is_floating_point():
            raise TypeError(f"scores must be a floating torch.Tensor, got {getattr(scores, 'dtype', type(scores))}")
        return torch.softmax(scores, dim=dim)
    mask = _check_scores_and_mask(scores, mask, dim)
    row_has_key = mask.any(dim=dim, keepdim=True)
    neg_inf = torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    zero = torch.zeros((), dtype=scores.dtype, device=scores.device)
    # Masked keys -> -inf; rows without any valid key -> all zeros (a harmless uniform softmax, zeroed below).
    filled = torch.where(mask, scores, torch.where(row_has_key, neg_inf, zero))
    weights = torch.softmax(filled, dim=dim)
    return torch.where(mask, weights, zero)


def renormalized_softmax(scores: Tensor, mask: Tensor, dim: int = -1) -> Tensor:
    """Teaching variant: softmax over *all* keys, multiply by ``mask``, then renormalize.

    Args:
        scores: attention scores, any float dtype, e.g. ``(batch, n_queries, n_keys)``.
        mask: bool, broadcastable to ``scores``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``).
        dim: the axis of keys.

    Returns:
        Weights shaped like ``scores``: ``w = softmax(scores) * mask; w / w.sum(dim)``. Rows with no valid key
        are all zeros. Mathematically equal to :func:`masked_softmax` (chapter 1, section "Masked attention",
        eq. ``eq-renormalize``); numerically it can differ, and it **fails** when the valid keys' softmax mass
        underflows to 0 because masked keys score far higher: such rows come out NaN. The book uses it to show
        that renormalizing is the same operation; use :func:`masked_softmax` in models.

    Raises:
        TypeError: ``scores`` is not floating point, or ``mask`` is not bool.
        ValueError: ``mask`` does not broadcast to ``scores`` (the message gives both shapes).
    """
    mask = _check_scores_and_mask(scores, mask, dim)
    weights = torch.softmax(scores, dim=dim) * mask
    total = weights.sum(dim=dim, keepdim=True)
    row_has_key = mask.any(dim=dim, keepdim=True)
    # Only rows with no valid key are defined as zeros; an underflowed mass (0/0) stays NaN on purpose.
    safe_total = torch.where(row_has_key, total, torch.ones_like(total))
    return weights / safe_total


def additive_mask_softmax(
    scores: Tensor, mask: Tensor, dim: int = -1, mask_value: float = BERT_MASK_VALUE
) -> Tensor:
    """Teaching variant: BERT-style additive mask, ``softmax(scores + (1 - mask) * mask_value)``.

    Args:
        scores: attention scores, any float dtype, e.g. ``(batch, n_queries, n_keys)``.
        mask: bool, broadcastable to ``scores``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``).
        dim: the axis of keys.
        mask_value: the additive constant for masked keys; BERT uses ``-10000``.

    Returns:
        Weights shaped like ``scores``. An **approximation** of :func:`masked_softmax` (chapter 1, section
        "Numerical pitfalls"): a masked key gets weight ``exp(s_masked + mask_value - max_valid)``, which
        underflows to 0 while real scores lie within a few thousand of the pads', and the approximation fails
        outright when real scores are themselves below about ``mask_value`` (the pads then win). A row with
        every key masked gets ``softmax(scores)`` of that row (the constant cancels, up to rounding), not zeros:
        uniform weights ``1 / n_keys`` only when its scores are equal, or when ``mask_value`` swamps their
        differences in fp16 or bf16 (BERT's behaviour).

    Raises:
        TypeError: ``scores`` is not floating point, or ``mask`` is not bool.
        ValueError: ``mask`` does not broadcast to ``scores`` (the message gives both shapes).
    """
    mask = _check_scores_and_mask(scores, mask, dim)
    bias = (~mask).to(scores.dtype) * mask_value
    return torch.softmax(scores + bias, dim=dim)
