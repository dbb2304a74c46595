"""Parametric attention: scaled dot-product attention and the learned scoring modules.

Explained in chapter 3, "Parametric attention: additive, scaled dot-product and cosine"
(``chapters/03_parametric_attention``). Every attention here computes

    output_i = sum_j  alpha_ij v_j,    alpha_i = masked_softmax(a(q_i, k_1..n), mask_i)

and differs only in the score ``a(q, k)`` (Murphy, PML 15.4.3):

- :func:`scaled_dot_product_attention` and :class:`DotProductAttention`: ``q . k / sqrt(d_k)`` (Vaswani et al.
  2017, eq. 1); unscaled, and Luong et al.'s (2015) "general" ``q^T W k``, as options of the module;
- :class:`AdditiveAttention`: ``w_v^T tanh(W_q q + W_k k)`` (Bahdanau et al. 2015, appendix A.1.2);
- :class:`CosineAttention`: ``beta * cos(q, k)`` with a learned scale ``beta`` (Graves et al. 2014, eq. 5-6);
- :class:`MultiHeadAttention`: ``h`` scaled dot-product heads on learned projections (Vaswani et al. 2017, 3.2.2).

:func:`blockwise_attention` computes the same output as :func:`scaled_dot_product_attention` one block of keys at
a time with the online softmax, without ever forming the full score matrix (chapter 9, section "The online
softmax").

Mask convention, as everywhere in attnbook (see :mod:`attnbook.masking`): a **bool** tensor, **True = the key
takes part**, broadcastable to ``(..., n_queries, n_keys)``; a key-padding mask is ``(batch, 1, n_keys)``, a causal
mask ``(n_queries, n_keys)`` (:func:`causal_mask`). A query whose keys are all masked gets zero weights and a zero
output, never NaN. ``torch.nn.MultiheadAttention``'s ``key_padding_mask`` and boolean ``attn_mask`` use the
opposite polarity (True = ignored): pass ``~mask`` to it.

Every module has the call signature ``(queries, keys, values, mask=None)``, keeps the weights of its last forward
pass in ``.attention_weights`` (detached) and exposes ``scores(queries, keys)``, so that a model (e.g. a seq2seq
decoder or an attention-pooling layer) can plug in any of them.

Dtypes: every function and module accepts fp16, bf16, fp32 and fp64 (queries, keys and values of one dtype). For
fp16/bf16 inputs the softmax and the weighted sum (and, in the dot-product attentions, the scores) are computed in
fp32, as the fused kernels do, and the results are cast back to the input dtype: finite inputs then give finite
outputs even where their scores exceed the fp16 range. ``scores(queries, keys)`` returns the input dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from .masking import check_bool_mask, masked_softmax

__all__ = [
    "scaled_dot_product_attention",
    "blockwise_attention",
    "causal_mask",
    "AdditiveAttention",
    "DotProductAttention",
    "CosineAttention",
    "MultiHeadAttention",
]


# ----------------------------------------------------------------------------------------------- checks
def _check_qkv(q: Tensor, k: Tensor, v: Tensor, same_d: bool = True) -> torch.Size:
    """Validate queries/keys/values; return the broadcast batch shape (everything before the last two dims)."""
    for name, x in (("queries", q), ("keys", k), ("values", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
        if x.dim() < 2:
            raise ValueError(f"{name} must have shape (..., n, d) with at least 2 dims, got {tuple(x.shape)}")
    for name, x in (("queries", q), ("keys", k)):
        if x.shape[-1] == 0:  # no feature to compare: every score would be 0 (torch gives uniform weights)
            raise ValueError(f"{name} have a zero-width last dim (d_k = 0) in shape {tuple(x.shape)}; "
                             "attention needs d_k >= 1")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"queries, keys and values must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if same_d and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"queries and keys must have the same size d_k in the last dim, got queries {tuple(q.shape)} "
            f"and keys {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"keys and values must have the same number of keys (dim -2), got keys {tuple(k.shape)} "
            f"and values {tuple(v.shape)}"
        )
    try:
        return torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"the batch dims of queries {tuple(q.shape)}, keys {tuple(k.shape)} and values {tuple(v.shape)} "
            "do not broadcast"
        ) from None


def _check_mask(mask: Tensor | None, target: tuple[int, ...]) -> None:
    """Validate that ``mask`` is bool and broadcasts to ``target`` = ``(..., n_queries, n_keys)`` without growing it."""
    if mask is None:
        return
    check_bool_mask(mask)
    try:
        ok = torch.broadcast_shapes(mask.shape, target) == torch.Size(target)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to (..., n_queries, n_keys) = {tuple(target)}"
        )


def _check_dropout(p: float) -> float:
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {p}")
    return float(p)


def _check_scale(scale: float | None, d_k: int) -> float:
    """The score scale as a finite float; ``None`` = ``1 / sqrt(d_k)`` (``1.0`` when ``d_k = 0``, where every
    score is the empty sum 0 and the scale does not matter)."""
    if scale is None:
        return 1.0 / math.sqrt(d_k) if d_k > 0 else 1.0
    try:
        value = float(scale)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"scale must be a real number or None, got {scale!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"scale must be a finite number, got {value}")
    return value


#: Dtypes whose scores and softmax are computed in fp32, as the fused kernels do.
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp16/bf16 (whose range a product of finite inputs easily exceeds), else ``dtype`` itself."""
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def causal_mask(n_queries: int, n_keys: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Bool mask ``(n_queries, n_keys)``, True where key ``j <= i + (n_keys - n_queries)``: each query sees itself
    and the past (True = takes part).

    With ``n_keys = None`` (= ``n_queries``) this is the lower triangle of decoder self-attention (Vaswani et al.
    2017, 3.2.3); with more keys than queries, the queries are the *last* ``n_queries`` positions. Combine it with a
    key-padding mask ``(batch, 1, n_keys)`` by ``&``. Chapter 3, section "Multi-head attention, self-attention and
    causal masks".

    Raises:
        ValueError: a size is negative, or ``n_keys < n_queries``.
    """
    n_keys = n_queries if n_keys is None else n_keys
    if n_queries < 0 or n_keys < 0:
        raise ValueError(f"sizes must be non-negative, got n_queries={n_queries}, n_keys={n_keys}")
    if n_keys < n_queries:
        raise ValueError(f"a causal mask needs n_keys >= n_queries, got n_queries={n_queries}, n_keys={n_keys}")
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)


# ----------------------------------------------------------------------------------------------- function
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``softmax(q k^T * scale, masked) v``, with zero output for a query whose keys are all masked.

    Args:
        q: queries ``(..., n_queries, d_k)``, any float dtype (fp16, bf16, fp32, fp64). Any size may be 0:
            no queries give an empty output, no keys make every row fully masked (zero output), and ``d_k = 0``
            makes every score the empty sum 0 (uniform weights over the valid keys), as in torch's function.
        k: keys ``(..., n_keys, d_k)``, same dtype.
        v: values ``(..., n_keys, d_v)``, same dtype. The batch dims ``...`` of ``q``, ``k``, ``v`` broadcast
            (e.g. one learned query ``(1, 1, d_k)`` against keys ``(batch, n_keys, d_k)``).
        mask: bool, broadcastable to ``(..., n_queries, n_keys)``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``). ``None`` = every key takes part. Typical
            shapes: ``(batch, 1, n_keys)`` (key padding), ``(n_queries, n_keys)`` (causal, :func:`causal_mask`).
        scale: a finite real number that multiplies the scores; ``None`` = ``1 / sqrt(d_k)`` (``1.0`` if
            ``d_k = 0``). ``1.0`` gives plain dot-product attention, ``0.0`` uniform weights over the valid keys,
            and a negative scale favours the least similar keys (all as in torch's function).
        dropout_p: probability of zeroing a weight (the rest are scaled by ``1 / (1 - dropout_p)``), applied
            whenever it is > 0, as in torch's function; modules pass 0 in eval mode.
        return_weights: False = the fast path, which delegates to the fused
            ``torch.nn.functional.scaled_dot_product_attention``; True = the explicit path, which also returns
            the weights (for plots and analysis).

    Returns:
        ``output`` of shape ``(..., n_queries, d_v)``, or ``(output, weights)`` with ``weights`` of shape
        ``(..., n_queries, n_keys)``: the weights before dropout, which equal
        ``attnbook.masking.masked_softmax(q @ k.mT * scale, mask)``. Weights sum to 1 over the keys, masked
        weights are exactly 0, and a query with no valid key gets all-zero weights and a zero output (and zero
        gradient), never NaN, in fp16, bf16, fp32 and fp64. Output and weights have the inputs' dtype.

    Raises:
        TypeError: an input is not a floating tensor, the dtypes differ, ``mask`` is not bool, or ``scale`` is
            not a real number.
        ValueError: ``q`` and ``k`` differ in ``d_k``, ``k`` and ``v`` in ``n_keys``, ``d_k`` is 0 (no feature
            to compare; torch's SDPA gives uniform weights), the batch dims do not broadcast, ``mask`` does not
            broadcast to ``(..., n_queries, n_keys)`` (the messages give the shapes), ``dropout_p`` is outside
            ``[0, 1)``, or ``scale`` is NaN or infinite. No query, no key or ``d_v = 0`` is not an error: an
            empty output, zeros (every key masked), or an output without features.

    Vaswani et al. (2017), eq. 1. Chapter 3, sections "Dot-product and scaled dot-product attention" and "Why
    divide by sqrt(d_k)". The explicit path folds the mask into the matrix product as an additive bias of 0 and
    ``-inf`` (not ``finfo.min``, which overflows to ``-inf`` in fp16 and turns a fully masked row into a uniform
    one). fp16/bf16 inputs: the scores, the softmax and the weighted sum are computed in fp32, as the fused kernels
    do, and the output and weights are cast back to the input dtype (scores of finite fp16 inputs can exceed the
    fp16 range, and ``inf - inf`` in the softmax would give NaN). Rows with no valid key are computed unmasked and
    then zeroed, in both paths.
    """
    batch = _check_qkv(q, k, v)
    n_q, d_k, n_k, d_v = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    _check_mask(mask, (*batch, n_q, n_k))
    dropout_p = _check_dropout(dropout_p)
    scale = _check_scale(scale, d_k)
    if not return_weights:
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        q, k, v = (x.expand(*batch, *x.shape[-2:]) for x in (q, k, v))
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
        row_has_key = mask.any(-1, keepdim=True)
        if bool(row_has_key.all()):  # the common case: no guard needed, the fused kernel alone
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        # Fully masked rows attend to every key (finite), then are zeroed: no NaN in either pass, in any torch.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~row_has_key, dropout_p=dropout_p,
                                             scale=scale)
        return torch.where(row_has_key, out, zero)

    # Explicit path: bmm over the flattened batch (of n_b elements, possibly 0), masked softmax, bmm; in fp32 for
    # fp16/bf16 inputs, whose range the scores of finite inputs easily exceed (inf - inf = NaN in the softmax).
    dtype, compute = q.dtype, _compute_dtype(q.dtype)
    n_b = math.prod(batch)
    q3 = q.expand(*batch, n_q, d_k).reshape(n_b, n_q, d_k).to(compute)
    k3 = k.expand(*batch, n_k, d_k).reshape(n_b, n_k, d_k).to(compute)
    v3 = v.expand(*batch, n_k, d_v).reshape(n_b, n_k, d_v).to(compute)
    if mask is None:
        weights = torch.softmax(torch.bmm(q3 * scale, k3.transpose(1, 2)), dim=-1)
    else:
        mask = mask.reshape((1,) * (len(batch) + 2 - mask.dim()) + tuple(mask.shape))
        row_has_key = mask.any(-1, keepdim=True)
        bias = torch.zeros(mask.shape, dtype=compute, device=q.device).masked_fill_(
            ~(mask | ~row_has_key), float("-inf"))
        bias = bias.reshape(1, *bias.shape[-2:]) if bias.shape[:-2].numel() == 1 else \
            bias.expand(*batch, *bias.shape[-2:]).reshape(n_b, *bias.shape[-2:])
        weights = torch.softmax(torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=scale), dim=-1)
        if not bool(row_has_key.all()):
            zero = torch.zeros((), dtype=compute, device=q.device)
            weights = torch.where(row_has_key, weights.reshape(*batch, n_q, n_k), zero).reshape(n_b, n_q, n_k)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = torch.bmm(dropped, v3).reshape(*batch, n_q, d_v)
    return out.to(dtype), weights.reshape(*batch, n_q, n_k).to(dtype)


# ----------------------------------------------------------------------------------------------- blockwise
def _check_block_size(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _online_softmax_step(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, m: Tensor, l: Tensor,
                         acc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One key block of the online softmax: ``(m, l, acc)`` of a query block updated by keys ``k`` and values ``v``.

    ``q`` (already multiplied by the scale) is ``(n_b, b_q, d_k)``, ``k`` ``(n_b, b_k, d_k)``, ``v``
    ``(n_b, b_k, d_v)``; ``bias`` is 0 where a key takes part and ``-inf`` where it is masked, broadcastable to
    ``(n_b, b_q, b_k)``, or None. ``m`` and ``l`` are ``(n_b, b_q, 1)``, ``acc`` ``(n_b, b_q, d_v)``. The only
    ``(b_q, b_k)`` tensor is the score tile, updated in place (no operation here saves a tensor that a later one
    overwrites, so autograd allows it).
    """
    s = torch.bmm(q, k.transpose(1, 2)) if bias is None else torch.baddbmm(bias, q, k.transpose(1, 2))
    # The running maximum carries no gradient: the softmax is invariant to the shift, so the gradient through it
    # is exactly zero, and detaching it saves the backward pass the work of computing that zero.
    m_new = torch.maximum(m, s.detach().amax(dim=-1, keepdim=True))
    shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # FlashAttention's guard: no (-inf) - (-inf)
    p = s.sub_(shift).exp_()  # exp(-inf) = 0 for masked keys
    alpha = (m - shift).exp()  # rescales the old sum and output; 0 while no key has been seen (m = -inf)
    return m_new, alpha * l + p.sum(dim=-1, keepdim=True), torch.baddbmm(alpha * acc, p, v)


def _bias_tile(mask: Tensor, batch: torch.Size, rows: slice, cols: slice, dtype: torch.dtype) -> Tensor:
    """The additive bias (0 = takes part, ``-inf`` = masked) of one tile of ``mask`` (bool, True = takes part,
    at least 2-D), shaped ``(n_b or 1, b_q or 1, b_k or 1)``: only the tile is copied, never the whole mask."""
    tile = mask[..., rows if mask.shape[-2] > 1 else slice(None), cols if mask.shape[-1] > 1 else slice(None)]
    bias = torch.zeros(tile.shape, dtype=dtype, device=mask.device).masked_fill_(~tile, float("-inf"))
    if bias.shape[:-2].numel() == 1:
        return bias.reshape(1, *bias.shape[-2:])
    return bias.expand(*batch, *bias.shape[-2:]).reshape(-1, *bias.shape[-2:])


def blockwise_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    block_size: int = 512,
    query_block_size: int | None = None,
    scale: float | None = None,
    checkpoint: bool = False,
) -> Tensor:
    """``softmax(q k^T * scale, masked) v`` computed one block of keys at a time (the online softmax), without
    ever forming the full ``(n_queries, n_keys)`` score matrix.

    The output equals :func:`scaled_dot_product_attention`'s (up to rounding), with the same shapes, mask
    convention, broadcasting rules and errors; only the memory differs. For each block of queries, the keys are
    visited in blocks ``B_1, B_2, ...`` of ``block_size`` keys, keeping per query the running maximum ``m``, the
    running sum ``l`` of exponentials and the running unnormalised output ``acc``:

        s_j     = q . k_j * scale   (-inf where the key is masked),   for the keys j in block B_t
        m_t     = max(m_{t-1}, max_{j in B_t} s_j)
        alpha_t = exp(m_{t-1} - m_t)
        l_t     = alpha_t * l_{t-1} + sum_{j in B_t} exp(s_j - m_t)
        acc_t   = alpha_t * acc_{t-1} + sum_{j in B_t} exp(s_j - m_t) v_j
        output  = acc_T / l_T

    starting from ``m_0 = -inf``, ``l_0 = 0``, ``acc_0 = 0``. Each step rescales the old sums to the new maximum,
    so after the last block ``l_T = sum_j exp(s_j - m_T)`` and ``acc_T / l_T`` is the softmax-weighted sum of all
    values. A query whose keys are all masked keeps ``m = -inf``; as in FlashAttention, a maximum of ``-inf`` is
    taken as ``0`` when shifting (so ``exp(-inf - 0) = 0``, never ``exp(-inf - (-inf)) = NaN``) and a zero sum
    gives a zero output (and zero gradients).

    Args:
        q: queries ``(..., n_queries, d_k)``, any float dtype (fp16, bf16, fp32, fp64).
        k: keys ``(..., n_keys, d_k)``, same dtype.
        v: values ``(..., n_keys, d_v)``, same dtype. The batch dims ``...`` of ``q``, ``k``, ``v`` broadcast.
        mask: bool, broadcastable to ``(..., n_queries, n_keys)`` without growing it; True = the key takes part
            (same convention as ``torch.nn.functional.scaled_dot_product_attention``). ``None`` = every key takes
            part. Typical shapes: ``(batch, 1, n_keys)`` (key padding), ``(n_queries, n_keys)`` (causal).
        block_size: the number of keys per block, an int >= 1; the last block may be shorter. A block at least as
            long as the keys gives a single pass (the plain softmax).
        query_block_size: the number of queries per block, an int >= 1; ``None`` = ``block_size``. The largest
            score tensor held at once is ``(..., query_block_size, block_size)``.
        scale: a finite real number that multiplies the scores; ``None`` = ``1 / sqrt(d_k)`` (``1.0`` if
            ``d_k = 0``), as in :func:`scaled_dot_product_attention`.
        checkpoint: True = run each (query block, key block) step under ``torch.utils.checkpoint`` (only when a
            gradient is needed), so that the backward pass recomputes each block's scores instead of keeping them.

    Returns:
        ``output`` of shape ``(..., n_queries, d_v)``, in the inputs' dtype. Finite inputs give a finite output; a
        query with no valid key gets a zero output and zero gradients, in fp16, bf16, fp32 and fp64. For
        fp16/bf16 inputs the scores, the running statistics and the sums are kept in fp32 (as the fused kernels
        do) and the output is cast back.

    Raises:
        TypeError: an input is not a floating tensor, the dtypes differ, ``mask`` is not bool, ``scale`` is not a
            real number, a block size is not an int, or ``checkpoint`` is not a bool.
        ValueError: ``q`` and ``k`` differ in ``d_k``, ``k`` and ``v`` in ``n_keys``, ``d_k`` is 0, the batch
            dims do not broadcast, ``mask`` does not broadcast to ``(..., n_queries, n_keys)`` (the
            messages give the shapes), a block size is < 1, or ``scale`` is NaN or infinite.

    Memory. The forward pass holds ``O(n_queries * d)`` running statistics plus one
    ``(query_block_size, block_size)`` score tile per batch element. Gradients come through autograd (there is no
    hand-written backward), and autograd keeps every block's exponentials for the backward pass, so *with*
    ``checkpoint=False`` training still stores ``O(n_queries * n_keys)`` numbers: the saving in training is much
    smaller than in inference (``benchmarks/bench_long_attention.py`` measures both). ``checkpoint=True`` keeps
    only each step's inputs, ``O(n_queries * d_v * n_keys / block_size)`` numbers, and pays with a second forward
    pass in the backward. FlashAttention avoids both costs with a hand-written backward that recomputes the
    scores block by block from the stored ``m`` and ``l`` (Dao et al. 2022, Algorithm 4).

    Sources: the online normaliser recurrence of Milakov & Gimelshein (2018), "Online normalizer calculation for
    softmax", Algorithm 3 (one pass for the maximum and the sum), extended to the weighted sum of values; Rabe &
    Staats (2021), "Self-attention does not need O(n^2) memory" (the same for attention in chunks of keys and
    queries, with the running maximum for numerical stability, and gradients through checkpointing, as the option
    here); Dao et al. (2022), "FlashAttention", Algorithm 1 (the block update of ``m``, ``l`` and ``O``).
    Chapter 9, section "The online softmax".
    """
    batch = _check_qkv(q, k, v)
    n_q, d_k, n_k, d_v = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    _check_mask(mask, (*batch, n_q, n_k))
    scale = _check_scale(scale, d_k)
    block_size = _check_block_size("block_size", block_size)
    q_block = block_size if query_block_size is None else _check_block_size("query_block_size", query_block_size)
    if not isinstance(checkpoint, bool):
        raise TypeError(f"checkpoint must be a bool, got {type(checkpoint).__name__} {checkpoint!r}")
    if n_q == 0 or n_k == 0:  # no score at all: the explicit path forms only empty matrices
        return scaled_dot_product_attention(q, k, v, mask, scale=scale, return_weights=True)[0]

    dtype, compute = q.dtype, _compute_dtype(q.dtype)
    # 3-D views (n_b, n, d) of the full batch shape; reshape copies only inputs whose batch dims were broadcast.
    n_b = math.prod(batch)
    qs = (q.to(compute) * scale).expand(*batch, n_q, d_k).reshape(n_b, n_q, d_k)
    k3 = k.to(compute).expand(*batch, n_k, d_k).reshape(n_b, n_k, d_k)
    v3 = v.to(compute).expand(*batch, n_k, d_v).reshape(n_b, n_k, d_v)
    if mask is not None:
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    use_checkpoint = checkpoint and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    outputs = []
    for i in range(0, n_q, q_block):
        rows = slice(i, min(i + q_block, n_q))
        m = torch.full((n_b, rows.stop - i, 1), float("-inf"), dtype=compute, device=q.device)
        l = torch.zeros((n_b, rows.stop - i, 1), dtype=compute, device=q.device)
        acc = torch.zeros((n_b, rows.stop - i, d_v), dtype=compute, device=q.device)
        for j in range(0, n_k, block_size):
            cols = slice(j, min(j + block_size, n_k))
            bias = None if mask is None else _bias_tile(mask, batch, rows, cols, compute)
            args = (qs[:, rows], k3[:, cols], v3[:, cols], bias, m, l, acc)
            if use_checkpoint:
                m, l, acc = torch.utils.checkpoint.checkpoint(_online_softmax_step, *args, use_reentrant=False)
            else:
                m, l, acc = _online_softmax_step(*args)
        outputs.append(acc / l.masked_fill(l == 0, 1.0))  # acc is exactly 0 where l is: zero output, no 0/0
    return torch.cat(outputs, dim=-2).reshape(*batch, n_q, d_v).to(dtype)


# ----------------------------------------------------------------------------------------------- modules
class _ScoredAttention(nn.Module):
    """Shared forward: ``masked_softmax(self.scores(queries, keys), mask)``, dropout, weighted sum of values."""

    same_d = True

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = _check_dropout(dropout)
        self.attention_weights: Tensor | None = None

    def scores(self, queries: Tensor, keys: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
        batch = _check_qkv(queries, keys, values, same_d=self.same_d)
        _check_mask(mask, (*batch, queries.shape[-2], keys.shape[-2]))
        scores = self.scores(queries, keys)
        weights = masked_softmax(scores.to(_compute_dtype(scores.dtype)), mask)  # fp32 for fp16/bf16
        self.attention_weights = weights.detach().to(values.dtype)
        out = F.dropout(weights, self.dropout, self.training) @ values.to(weights.dtype)
        return out.to(values.dtype)


class AdditiveAttention(_ScoredAttention):
    """Additive (MLP) attention: ``a(q, k) = w_v^T tanh(W_q q + W_k k)`` (Bahdanau et al. 2015, appendix A.1.2).

    Args:
        query_size: ``d_q``, the last dim of the queries.
        key_size: ``d_k``, the last dim of the keys (may differ from ``d_q``).
        hidden_size: ``h``, the size of the tanh layer.
        dropout: dropout on the weights in training mode.
        bias: add a learned bias inside the tanh (``W_k k + b``), as in HAN's ``tanh(W h + b)`` (Yang et al.
            2016); Bahdanau et al. use none.

    Call: ``(queries (..., n_queries, d_q), keys (..., n_keys, d_k), values (..., n_keys, d_v), mask=None)``
    -> ``(..., n_queries, d_v)``; ``mask`` is bool, True = takes part, broadcastable to
    ``(..., n_queries, n_keys)``, e.g. a source key-padding mask ``(batch, 1, n_keys)``. After the call,
    ``attention_weights`` holds the ``(..., n_queries, n_keys)`` weights (detached). fp16/bf16 inputs: softmax and
    weighted sum in fp32, results in the input dtype.

    Raises:
        ValueError: a size is not positive, the inputs' last dims differ from ``query_size``/``key_size``, or
            the shapes and mask do not match (as in :func:`scaled_dot_product_attention`).
        TypeError: a non-bool mask.

    Chapter 3, section "Additive attention". Memory is ``O(n_queries * n_keys * h)``.
    """

    same_d = False

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0,
                 bias: bool = False) -> None:
        super().__init__(dropout)
        if min(query_size, key_size, hidden_size) <= 0:
            raise ValueError(f"sizes must be positive, got query_size={query_size}, key_size={key_size}, "
                             f"hidden_size={hidden_size}")
        self.query_size, self.key_size = query_size, key_size
        self.W_q = nn.Linear(query_size, hidden_size, bias=False)
        self.W_k = nn.Linear(key_size, hidden_size, bias=bias)
        self.w_v = nn.Linear(hidden_size, 1, bias=False)

    def scores(self, queries: Tensor, keys: Tensor) -> Tensor:
        """Raw scores ``(..., n_queries, n_keys)``; queries ``(..., n_queries, d_q)``, keys ``(..., n_keys, d_k)``."""
        if queries.shape[-1] != self.query_size or keys.shape[-1] != self.key_size:
            raise ValueError(
                f"AdditiveAttention expects queries (..., {self.query_size}) and keys (..., {self.key_size}), "
                f"got queries {tuple(queries.shape)} and keys {tuple(keys.shape)}"
            )
        features = torch.tanh(self.W_q(queries).unsqueeze(-2) + self.W_k(keys).unsqueeze(-3))
        return self.w_v(features).squeeze(-1)


class DotProductAttention(_ScoredAttention):
    """Dot-product attention ``a(q, k) = q . k * scale``, optionally Luong's "general" ``q^T W k``.

    Args:
        scaled: True = ``scale = 1 / sqrt(d)`` (Vaswani et al. 2017, eq. 1); False = ``1`` (Luong et al. 2015,
            "dot").
        dropout: dropout on the weights in training mode.
        query_size, key_size: give both for Luong's "general" score ``q^T W_a k`` with a learned
            ``W_a: key_size -> query_size`` applied to the keys (then ``d = query_size``); ``None`` = plain dot.
        need_weights: False = use the fused fast path and leave ``attention_weights`` as ``None``.

    Call: ``(queries (..., n_queries, d), keys (..., n_keys, d or key_size), values (..., n_keys, d_v),
    mask=None)`` -> ``(..., n_queries, d_v)``; ``mask`` is bool, True = takes part, broadcastable to
    ``(..., n_queries, n_keys)``. Computed by :func:`scaled_dot_product_attention` (fp16/bf16 inputs: scores,
    softmax and weighted sum in fp32, results in the input dtype). ``d = 0`` gives uniform weights over the valid
    keys, as in torch's function.

    Raises:
        ValueError: only one of ``query_size``/``key_size`` given, or shapes and mask do not match.
        TypeError: a non-bool mask.

    Chapter 3, section "Dot-product and scaled dot-product attention".
    """

    def __init__(self, scaled: bool = True, dropout: float = 0.0, query_size: int | None = None,
                 key_size: int | None = None, need_weights: bool = True) -> None:
        super().__init__(dropout)
        if (query_size is None) != (key_size is None):
            raise ValueError(f"give both query_size and key_size for the 'general' score, or neither; "
                             f"got query_size={query_size}, key_size={key_size}")
        self.scaled, self.need_weights = scaled, need_weights
        self.W_a = None if query_size is None else nn.Linear(key_size, query_size, bias=False)

    def _keys(self, keys: Tensor) -> Tensor:
        if self.W_a is not None and keys.shape[-1] != self.W_a.in_features:
            raise ValueError(f"DotProductAttention expects keys (..., {self.W_a.in_features}), "
                             f"got {tuple(keys.shape)}")
        return keys if self.W_a is None else self.W_a(keys)

    def _scale(self, d: int) -> float:
        return 1.0 / math.sqrt(d) if self.scaled and d > 0 else 1.0

    def scores(self, queries: Tensor, keys: Tensor) -> Tensor:
        """Raw scores ``(..., n_queries, n_keys)`` = ``queries @ W(keys).mT * scale``."""
        keys = self._keys(keys)
        if queries.shape[-1] != keys.shape[-1]:
            raise ValueError(f"queries and keys must have the same size d_k in the last dim, got queries "
                             f"{tuple(queries.shape)} and keys {tuple(keys.shape)}")
        return (queries * self._scale(queries.shape[-1])) @ keys.transpose(-1, -2)  # scaled first: less overflow

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
        _check_qkv(queries, keys, values, same_d=False)
        keys = self._keys(keys)
        result = scaled_dot_product_attention(
            queries, keys, values, mask, scale=self._scale(queries.shape[-1]),
            dropout_p=self.dropout if self.training else 0.0, return_weights=self.need_weights)
        if not self.need_weights:
            self.attention_weights = None
            return result
        out, weights = result
        self.attention_weights = weights.detach()
        return out


class CosineAttention(_ScoredAttention):
    """Cosine-similarity (content-based) attention: ``a(q, k) = beta * cos(q, k)`` with a learned ``beta > 0``.

    Args:
        init_scale: the initial ``beta``, finite and > 0. With ``beta = 1`` the scores lie in ``[-1, 1]`` and no
            key can get more than ``e / (e + (n_keys - 1) / e)`` of the weight (chapter 3, eq. ``eq-cosine-cap``).
        learn_scale: learn ``beta`` (stored as ``log_scale``, so it stays positive); False = fixed.
        eps: lower bound on the norms, so that an all-zero query or key (a padding state) scores 0, not NaN.
        dropout: dropout on the weights in training mode.

    Call: ``(queries (..., n_queries, d), keys (..., n_keys, d), values (..., n_keys, d_v), mask=None)`` ->
    ``(..., n_queries, d_v)``; ``mask`` is bool, True = takes part, broadcastable to ``(..., n_queries, n_keys)``.
    fp16/bf16 inputs: softmax and weighted sum in fp32, results in the input dtype (the scores ``beta * cos`` are
    computed in the input dtype, so ``beta`` must stay within its range).

    Raises:
        ValueError: ``init_scale`` is not positive and finite (NaN and ``inf`` included), or shapes and mask do
            not match.
        TypeError: a non-bool mask.

    Graves et al. (2014), Neural Turing Machines, eq. 5-6 (``beta`` is their key strength). Chapter 3, section
    "Cosine-similarity attention".
    """

    def __init__(self, init_scale: float = 1.0, learn_scale: bool = True, eps: float = 1e-8,
                 dropout: float = 0.0) -> None:
        super().__init__(dropout)
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError(f"init_scale must be positive and finite, got {init_scale}")
        log_scale = torch.tensor(math.log(init_scale))
        if learn_scale:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)
        self.eps = eps

    @property
    def scale(self) -> Tensor:
        """``beta = exp(log_scale)``, a scalar tensor."""
        return self.log_scale.exp()

    def scores(self, queries: Tensor, keys: Tensor) -> Tensor:
        """Raw scores ``beta * cos(q_i, k_j)``, ``(..., n_queries, n_keys)``, in ``[-beta, beta]``."""
        q = F.normalize(queries, dim=-1, eps=self.eps)
        k = F.normalize(keys, dim=-1, eps=self.eps)
        return self.scale.to(q.dtype) * (q @ k.transpose(-1, -2))


class MultiHeadAttention(nn.Module):
    """Multi-head attention: ``Concat(head_1, ..., head_h) W^O`` with ``head_i = SDPA(Q W_i^Q, K W_i^K, V W_i^V)``.

    Args:
        embed_dim: model size ``d_model`` (size of the queries and of the output); divisible by ``num_heads``.
        num_heads: ``h``; each head has size ``d_model / h``.
        dropout: dropout on the weights in training mode.
        bias: biases in the four projections.
        kdim, vdim: sizes of keys and values (``None`` = ``embed_dim``).
        need_weights: False = fused fast path, ``attention_weights`` stays ``None``.

    Call: ``(queries (batch, n_queries, embed_dim), keys (batch, n_keys, kdim), values (batch, n_keys, vdim),
    mask=None)`` -> ``(batch, n_queries, embed_dim)``. ``mask`` is bool, True = takes part, broadcastable to
    ``(batch, n_queries, n_keys)`` (the same mask for every head), or 4-D, broadcastable to
    ``(batch, num_heads, n_queries, n_keys)``. After the call ``attention_weights`` is
    ``(batch, num_heads, n_queries, n_keys)`` (detached). ``batch``, ``n_queries`` and ``n_keys`` may be 0 (no
    keys: every query fully masked). fp16/bf16 inputs: scores, softmax and weighted sum in fp32 (the projections
    in the input dtype), results in the input dtype.

    Equals ``torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)`` with the same weights and
    ``key_padding_mask = ~mask`` (its masks are True = ignored). A query with no valid key gets zero weights and
    a zero context in every head, so its output is ``out_proj``'s bias; torch's module gives NaN there.

    Raises:
        ValueError: ``embed_dim`` not divisible by ``num_heads``, inputs not 3-D, sizes or mask do not match.
        TypeError: a non-bool mask.

    Vaswani et al. (2017), section 3.2.2. Chapter 3, section "Multi-head attention, self-attention and causal masks".
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, need_weights: bool = True) -> None:
        super().__init__()
        if num_heads <= 0 or embed_dim <= 0 or embed_dim % num_heads:
            raise ValueError(f"embed_dim must be a positive multiple of num_heads, got embed_dim={embed_dim}, "
                             f"num_heads={num_heads}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.dropout, self.need_weights = _check_dropout(dropout), need_weights
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.attention_weights: Tensor | None = None

    def _split(self, x: Tensor) -> Tensor:
        """``(batch, n, embed_dim)`` -> ``(batch, heads, n, head_dim)``."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        """The weighting of the heads on projected ``(batch, heads, n, head_dim)`` inputs and a checked ``mask``
        (bool, True = takes part): the context ``(batch, heads, n_queries, head_dim)``, with the weights
        ``(batch, heads, n_queries, n_keys)`` when ``need_weights``. A subclass that weighs differently (e.g.
        :class:`attnbook.sinks.SinkMultiHeadAttention`) overrides this alone."""
        return scaled_dot_product_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0,
                                            return_weights=self.need_weights)

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
        _check_qkv(queries, keys, values, same_d=False)
        for name, x, size in (("queries", queries, self.embed_dim), ("keys", keys, self.kdim),
                              ("values", values, self.vdim)):
            if x.dim() != 3 or x.shape[-1] != size:
                raise ValueError(f"{name} must have shape (batch, n, {size}), got {tuple(x.shape)}")
        if mask is not None and isinstance(mask, Tensor) and mask.dim() < 4:
            _check_mask(mask, (max(queries.shape[0], keys.shape[0]), queries.shape[1], keys.shape[1]))
            mask = mask.unsqueeze(-3)  # the same mask for every head
        q, k, v = self._split(self.q_proj(queries)), self._split(self.k_proj(keys)), self._split(self.v_proj(values))
        result = self._attend(q, k, v, mask)
        if self.need_weights:
            result, weights = result
            self.attention_weights = weights.detach()
        else:
            self.attention_weights = None
        return self.out_proj(result.transpose(1, 2).flatten(-2))
