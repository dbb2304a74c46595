"""Masks and masked softmax.

Explained in chapter 1, "Attention as soft dictionary lookup" (``chapters/01_soft_lookup``), sections
"Masked attention" and "Numerical pitfalls".

Mask convention, everywhere in attnbook: a **bool** tensor in which **True means "takes part"**, the same
convention as the boolean ``attn_mask`` of :func:`torch.nn.functional.scaled_dot_product_attention`. Note that
:class:`torch.nn.MultiheadAttention`'s ``key_padding_mask`` uses the opposite polarity (True = ignored).

The input checks shared by the whole package live here, so that a bad argument gets the same message everywhere:
:func:`check_bool_mask` (a bool tensor), :func:`check_mask_for` (a ``(batch, length)`` mask that matches its states,
never broadcast), :func:`check_lengths_for` (one integer length per row, within the padded length),
:func:`check_int` and :func:`as_integer_tensor` (integers, never rounded floats or bools read as 0 and 1).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = [
    "check_bool_mask",
    "check_mask_for",
    "check_lengths_for",
    "check_int",
    "as_integer_tensor",
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


def check_int(value: object, name: str, minimum: int | None = None) -> int:
    """Return ``value`` as a Python ``int``, or raise.

    Accepts ``int``, NumPy integers and one-element integer tensors (anything with ``__index__``); ``bool`` is
    refused, since ``True`` is an int in Python but never a size.

    Raises:
        TypeError: ``value`` is not an integer (e.g. ``2.5``, ``"3"``, ``True``); the message names ``name``.
        ValueError: ``value < minimum`` (the message gives both).
    """
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def as_integer_tensor(values: object, name: str) -> Tensor:
    """``values`` (tensor, array or sequence of ints) as a tensor of an integer dtype.

    Nothing is rounded or cast: a float, bool or complex dtype raises (``[1.5, 2]`` is not read as ``[1, 2]``, nor
    ``[True, False]`` as ``[1, 0]``). A tensor is returned as it is; an empty sequence gives an empty int64 tensor.

    Raises:
        TypeError: ``values`` is not a tensor or sequence of ints (the message names ``name`` and gives the dtype
            and, for up to 10 values, the values).
    """
    if isinstance(values, Tensor):
        t = values
    else:
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"{name} must be an integer tensor or a sequence of ints, got {type(values).__name__}")
        try:
            t = torch.as_tensor(values if hasattr(values, "__len__") else list(values))
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{name} must be an integer tensor or a sequence of ints ({err})") from None
        if t.numel() == 0 and t.dtype.is_floating_point:  # torch.as_tensor([]) is float32
            t = t.long()
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        shown = t.tolist() if t.numel() <= 10 else f"{t.numel()} values"
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype} ({shown}); nothing is rounded or cast")
    return t


def check_mask_for(states: Tensor, mask: object, name: str = "mask", *, states_name: str = "states") -> Tensor:
    """Raise unless ``mask`` is a bool ``(batch, length)`` tensor matching ``states`` ``(batch, length, ...)``.

    The shared check of every function that takes a mask beside the states it masks (pooling, the NLI model, ...):
    nothing is broadcast, so a mask of another batch size or length is an error, not a silent repeat.

    Args:
        states: the tensor the mask belongs to; its first two axes are ``(batch, length)``.
        mask: bool, True = the position takes part (the convention of
            ``torch.nn.functional.scaled_dot_product_attention``).
        name, states_name: the arguments' names, for the messages.

    Returns:
        ``mask``, unchanged.

    Raises:
        TypeError: ``states`` is not a tensor, or ``mask`` is not a bool tensor (:func:`check_bool_mask`).
        ValueError: ``states`` has fewer than two axes, or ``mask.shape != states.shape[:2]`` (the message gives
            both shapes).
    """
    if not isinstance(states, Tensor):
        raise TypeError(f"{states_name} must be a torch.Tensor, got {type(states).__name__}")
    if states.dim() < 2:
        raise ValueError(f"{states_name} must have at least two axes (batch, length, ...), got shape "
                         f"{tuple(states.shape)}")
    check_bool_mask(mask, name)
    expected = tuple(states.shape[:2])
    if tuple(mask.shape) != expected:
        raise ValueError(f"{name} must have shape (batch, length) = {expected}, got {tuple(mask.shape)} "
                         f"({states_name} has shape {tuple(states.shape)}; masks are not broadcast)")
    return mask


def check_lengths_for(x: Tensor, lengths: object, name: str = "lengths", *, x_name: str = "states",
                      min_length: int = 0, batch_dims: int = 1) -> Tensor:
    """Validate ``lengths`` against the padded tensor ``x`` and return them as an integer tensor.

    ``x`` has shape ``(*batch, length, ...)`` with ``batch_dims`` batch axes (1 for ``(B, T, ...)``; 2 for HAN's
    ``(B, S, T)`` word lengths). ``lengths`` must have shape ``x.shape[:batch_dims]``, an integer dtype, and
    entries in ``[min_length, length]``, where ``length = x.shape[batch_dims]``: so no row is dropped, no length
    is broadcast, and no float is rounded.

    Args:
        x: the padded tensor (token ids or states).
        lengths: integer tensor, array or sequence; the number of valid positions of each row.
        name, x_name: the arguments' names, for the messages.
        min_length: the smallest allowed length (1 where a packed RNN reads the row).
        batch_dims: the number of leading batch axes of ``x``.

    Returns:
        ``lengths`` as a tensor (the caller's tensor itself when it was one; a new int64 tensor otherwise).

    Raises:
        TypeError: ``x`` is not a tensor; ``lengths`` is not of an integer dtype (e.g. ``[1.5, 2]``).
        ValueError: ``x`` has too few axes, ``lengths`` has the wrong shape (the message gives both shapes), or a
            length lies outside ``[min_length, length]`` (the message gives the range, the shape of ``x`` and the
            smallest and largest length).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{x_name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < batch_dims + 1:
        raise ValueError(f"{x_name} must have at least {batch_dims + 1} axes, got shape {tuple(x.shape)}")
    lengths = as_integer_tensor(lengths, name)
    expected = tuple(x.shape[:batch_dims])
    if tuple(lengths.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} (one length per row of {x_name} of shape "
                         f"{tuple(x.shape)}), got {tuple(lengths.shape)}")
    longest = x.shape[batch_dims]
    if lengths.numel() and (int(lengths.min()) < min_length or int(lengths.max()) > longest):
        raise ValueError(f"{name} must lie in [{min_length}, {longest}] for {x_name} of shape {tuple(x.shape)}, "
                         f"got min {int(lengths.min())} and max {int(lengths.max())}")
    return lengths


def _check_scores(scores: object, dim: object) -> int:
    """Validate ``scores`` (a floating tensor with at least one axis) and ``dim`` (an axis of it); return ``dim``."""
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating torch.Tensor (a floating dtype, got {scores.dtype})")
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension (the keys)")
    dim = check_int(dim, "dim")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"dim={dim} is out of range for scores of shape {tuple(scores.shape)}: scores have "
                         f"{scores.dim()} dims, so dim must lie in [{-scores.dim()}, {scores.dim() - 1}]")
    return dim


def _check_scores_and_mask(scores: Tensor, mask: Tensor, dim: int) -> tuple[Tensor, int]:
    """Validate ``scores``/``mask``/``dim``; return ``mask`` expanded (as a view) to ``scores.shape``, and ``dim``."""
    dim = _check_scores(scores, dim)
    check_bool_mask(mask)
    try:
        broadcast = torch.broadcast_shapes(mask.shape, scores.shape)
    except RuntimeError:
        broadcast = None
    if broadcast != scores.shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {tuple(scores.shape)}"
        )
    return mask.expand(scores.shape), dim


def lengths_to_mask(lengths: Tensor | Iterable[int], max_len: int | None = None) -> Tensor:
    """Bool mask ``(batch, max_len)`` that is True at the first ``lengths[b]`` positions of row ``b``.

    Args:
        lengths: integer tensor or sequence of shape ``(batch,)``; the number of valid (non-pad) positions
            of each sequence, in tokens. Zero is allowed (an all-False row). Floats are refused, not truncated.
        max_len: the padded length, an int. ``None`` = ``max(lengths)`` (0 for an empty batch).

    Returns:
        Bool tensor ``(batch, max_len)`` on the device of ``lengths``; True = the position takes part
        (same convention as ``torch.nn.functional.scaled_dot_product_attention``).

    Raises:
        TypeError: ``lengths`` is not of an integer dtype (e.g. ``[1.5, 2]`` or ``[True, False]``), or
            ``max_len`` is not an int (e.g. ``2.5``).
        ValueError: ``lengths`` is not one-dimensional, has negative entries, or has entries greater than
            ``max_len``, or ``max_len`` is negative (the message gives the offending values).

    Example: ``lengths_to_mask([2, 0, 3], max_len=4)`` is
    ``[[T, T, F, F], [F, F, F, F], [T, T, T, F]]``. Chapter 1, section "Masked attention".
    """
    lengths = as_integer_tensor(lengths, "lengths")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional (batch,), got shape {tuple(lengths.shape)}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    else:
        max_len = check_int(max_len, "max_len")
        if max_len < 0:
            raise ValueError(f"max_len must be non-negative, got {max_len}")
        if longest > max_len:
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
        TypeError: ``scores`` is not a floating tensor, ``mask`` is not bool, or ``dim`` is not an int.
        ValueError: ``scores`` is 0-dimensional; ``mask`` does not broadcast to ``scores`` (the message gives both
            shapes); ``dim`` is out of range (the message gives ``dim``, the shape and the number of dims; also
            with ``mask=None``, where torch itself would raise ``IndexError``).

    Equivalent to renormalizing ``softmax(scores) * mask`` (chapter 1, "Attention as soft dictionary lookup",
    section "Masked attention", eq. ``eq-masked-softmax``). Masked scores are replaced by ``-inf`` (not by a
    large negative constant, which fails when real scores are lower still); rows with no valid key are
    computed on zeros and then zeroed, so no ``-inf - (-inf)`` NaN arises in the forward or backward pass.
    Does not modify ``scores``. NaN or ``+inf`` in unmasked ``scores`` propagate, as in ``torch.softmax``.
    """
    if mask is None:
        return torch.softmax(scores, dim=_check_scores(scores, dim))
    mask, dim = _check_scores_and_mask(scores, mask, dim)
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
        TypeError: ``scores`` is not a floating tensor, ``mask`` is not bool, or ``dim`` is not an int.
        ValueError: ``scores`` is 0-dimensional; ``mask`` does not broadcast to ``scores`` (the message gives both
            shapes); ``dim`` is out of range (the message gives ``dim``, the shape and the number of dims).
    """
    mask, dim = _check_scores_and_mask(scores, mask, dim)
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
        TypeError: ``scores`` is not a floating tensor, ``mask`` is not bool, or ``dim`` is not an int.
        ValueError: ``scores`` is 0-dimensional; ``mask`` does not broadcast to ``scores`` (the message gives both
            shapes); ``dim`` is out of range (the message gives ``dim``, the shape and the number of dims).
    """
    mask, dim = _check_scores_and_mask(scores, mask, dim)
    bias = (~mask).to(scores.dtype) * mask_value
    return torch.softmax(scores + bias, dim=dim)
