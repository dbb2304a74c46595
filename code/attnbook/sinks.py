"""Attending to nowhere: fully masked rows, softmax with one added, and attention sinks.

Explained in chapter 9, section "Attending to nowhere" (issue 21, section 4). A softmax row always sums to 1, so a
query must put all of its weight *somewhere*, even when no key is relevant. Two situations follow:

- **A fully masked row** (no key takes part) has no defined softmax. Implementations choose: torch's fused
  ``F.scaled_dot_product_attention`` returns 0 (pytorch PR #133882, torch >= 2.5), ``nn.MultiheadAttention``
  returns NaN on some of its paths (pytorch issue #160064), attnbook's attention returns zeros, and
  FlashAttention's epilogue returns 0 (its row sum is 0, so it divides by 1 instead). :func:`fully_masked_row`
  measures what each does in the installed torch; :func:`online_softmax_rule` is FlashAttention's rule in a few
  lines of torch.
- **A row whose keys are all uninformative** can only spread its weight over them. Two designs give the row a
  place to put weight that contributes nothing: softmax with one added to the denominator (Miller 2023, "Attention
  is off by one"), :func:`softmax_one`,

      softmax_one(s)_i = exp(s_i) / (1 + sum_j exp(s_j)),

  and a learned *sink logit* ``b_h`` per head (Xiao et al. 2023, "Efficient streaming language models with
  attention sinks"; OpenAI's gpt-oss, 2025): a softmax over ``[s_1, ..., s_n, b_h]`` whose last weight (the sink's)
  is dropped from the output, as if the sink were a key with logit ``b_h`` and a zero value,
  :func:`sink_softmax`, :func:`sink_attention`, :class:`SinkMultiHeadAttention`. ``softmax_one`` is the special
  case ``b_h = 0``.

Mask convention, as everywhere in attnbook: a **bool** tensor, **True = the key takes part** (as the boolean
``attn_mask`` of ``F.scaled_dot_product_attention``). ``nn.MultiheadAttention``'s ``key_padding_mask`` and boolean
``attn_mask`` use the opposite polarity (True = ignored). With a sink, a fully masked row puts all its weight on the
sink: zero weights on the keys, sink weight 1, zero output (and finite gradients), without any special case.

The experiment of the section (a small retrieval task with and without a sink) is
:mod:`attnbook.experiments.sinks`.

Windows and caches (chapter 9, section "Sliding windows, and sinks in a cache"): :func:`sliding_window_mask` is the
causal sliding-window mask (bool, True = takes part), combined with a key padding mask by ``&``;
:func:`streaming_cache_keep` says which cache entries to keep when a cache is trimmed to sinks plus a window
(StreamingLLM, Xiao et al.), counting the sinks from the first *real* token of each row, so that left padding does
not push them out. :class:`SinkCache` and :func:`streaming_generate` are StreamingLLM's cache for a rotary
decoder: keys stored *before* the rotation and rotated when they are read, by their slot in the trimmed cache
(``renumber=True``, what Xiao et al. do) or by their original position (``renumber=False``: what trimming a cache of
rotated keys, such as :class:`attnbook.generation.LayerCache`, amounts to).
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import (MultiHeadAttention, _check_dropout, _check_mask, _check_qkv, _check_scale, _compute_dtype,
                        causal_mask, scaled_dot_product_attention)
from .masking import check_bool_mask, check_int

__all__ = ["sink_softmax", "softmax_one", "sink_attention", "SinkMultiHeadAttention", "online_softmax_rule",
           "fully_masked_row", "sliding_window_mask", "streaming_cache_keep", "SinkCache", "streaming_step",
           "streaming_generate"]


# ----------------------------------------------------------------------------------------------- weighting
def _check_scores(scores: object) -> None:
    if not isinstance(scores, Tensor) or not scores.is_floating_point():
        kind = f"dtype {scores.dtype}" if isinstance(scores, Tensor) else type(scores).__name__
        raise TypeError(f"scores must be a floating torch.Tensor, got {kind}")
    if scores.dim() < 1:
        raise ValueError(f"scores must have at least 1 dim (..., n_keys), got shape {tuple(scores.shape)}")


def _sink_tensor(sink_logits: object, rows: tuple[int, ...], like: Tensor) -> Tensor:
    """``sink_logits`` as a tensor of ``like``'s dtype that broadcasts to ``rows`` = ``(..., n_queries)`` without
    growing it; ``None`` = 0 (softmax with one added)."""
    if sink_logits is None:
        return torch.zeros((), dtype=like.dtype, device=like.device)
    if isinstance(sink_logits, bool) or not isinstance(sink_logits, (int, float, Tensor)):
        raise TypeError(f"sink_logits must be a float tensor, a real number or None, got {type(sink_logits).__name__}")
    if isinstance(sink_logits, Tensor):
        if not sink_logits.is_floating_point():
            raise TypeError(f"sink_logits must have a floating dtype, got {sink_logits.dtype}")
        try:
            ok = torch.broadcast_shapes(sink_logits.shape, rows) == torch.Size(rows)
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"sink_logits of shape {tuple(sink_logits.shape)} does not broadcast to the rows "
                             f"(..., n_queries) = {tuple(rows)}; a per-head sink for (batch, heads, n_queries, "
                             f"n_keys) scores has shape (heads, 1)")
        value = sink_logits.to(like.dtype)
    else:
        value = torch.tensor(float(sink_logits), dtype=like.dtype, device=like.device)
    if not bool(torch.isfinite(value.detach()).all()):
        raise ValueError("sink_logits must be finite (a sink logit of -inf is no sink: use masked_softmax), got "
                         f"{value.detach().flatten()[:8].tolist()}")
    return value


def sink_softmax(scores: Tensor, mask: Tensor | None = None, sink_logits: Tensor | float | None = None
                 ) -> tuple[Tensor, Tensor]:
    """Softmax over the keys and one extra *sink* logit per row; the sink's weight is returned apart.

    ``w_j = exp(s_j) / (exp(b) + sum_k exp(s_k))`` over the keys ``k`` that take part, and the sink's weight
    ``w_sink = exp(b) / (exp(b) + sum_k exp(s_k))``, so that ``sum_j w_j + w_sink = 1``.

    Args:
        scores: ``(..., n_queries, n_keys)`` (or any ``(..., n_keys)``), any float dtype (fp16/bf16 are computed in
            fp32 and returned in their own dtype).
        mask: bool, broadcastable to ``scores``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``). ``None`` = every key takes part.
        sink_logits: the sink logit ``b``, broadcastable to ``scores.shape[:-1]`` = ``(..., n_queries)`` without
            growing it: a real number, a scalar tensor, or e.g. ``(heads, 1)`` for a per-head sink on
            ``(batch, heads, n_queries, n_keys)`` scores. ``None`` = 0, which is :func:`softmax_one`. Must be
            finite. Gradients flow into it.

    Returns:
        ``(weights, sink_weight)``: ``weights`` shaped like ``scores`` (sum over the keys ``<= 1``; masked weights
        exactly 0), ``sink_weight`` shaped ``scores.shape[:-1]``. A row with no valid key gets zero weights and sink
        weight 1, never NaN.

    Raises:
        TypeError: ``scores`` is not a floating tensor, ``mask`` is not bool, or ``sink_logits`` is not a real
            number, a float tensor or None.
        ValueError: ``scores`` is 0-dimensional, ``mask`` does not broadcast to ``scores``, ``sink_logits`` does
            not broadcast to ``(..., n_queries)`` (the messages give the shapes), or ``sink_logits`` is not finite.

    Computed stably: the reference of the exponentials is ``m = max(max_j s_j, b)`` over the valid keys, which is
    finite even in a fully masked row (``m = b``); masked scores become ``-inf`` (weight exactly 0). Xiao et al.
    (2023), section 3.3; Miller (2023). Chapter 9, section "Attending to nowhere".
    """
    _check_scores(scores)
    if mask is not None:
        check_bool_mask(mask)
        try:
            ok = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
        except RuntimeError:
            ok = False
        if not ok:
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape "
                             f"{tuple(scores.shape)}")
    dtype = scores.dtype
    s = scores.to(_compute_dtype(dtype))
    b = _sink_tensor(sink_logits, tuple(scores.shape[:-1]), s).unsqueeze(-1)  # (..., n_queries, 1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = torch.maximum(s.amax(-1, keepdim=True) if s.shape[-1] else torch.full_like(b, float("-inf")), b).detach()
    e, e_sink = torch.exp(s - m), torch.exp(b - m)  # masked keys: exp(-inf) = 0; no term exceeds 1
    denominator = e.sum(-1, keepdim=True) + e_sink
    weights, sink_weight = e / denominator, (e_sink / denominator).squeeze(-1)
    return weights.to(dtype), sink_weight.expand(scores.shape[:-1]).to(dtype)


def softmax_one(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax with one added to the denominator (Miller 2023, "Attention is off by one"):
    ``exp(s_i) / (1 + sum_j exp(s_j))`` over the keys that take part.

    Args:
        scores: ``(..., n_keys)``, any float dtype (fp16/bf16 computed in fp32, returned in their own dtype).
        mask: bool, broadcastable to ``scores``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``). ``None`` = every key takes part.

    Returns:
        Weights shaped like ``scores``, each row summing to less than 1 (the rest, ``1 / (1 + sum_j exp(s_j))``, is
        the weight of an implicit key with logit 0 and a zero value). Masked weights are exactly 0; a fully masked
        row is all zeros.

    Raises:
        TypeError, ValueError: as :func:`sink_softmax` (non-float scores, non-bool mask, shapes that do not
            broadcast).

    :func:`sink_softmax` with ``sink_logits = 0``, computed stably (the max includes the implicit 0 logit).
    Chapter 9, section "Attending to nowhere".
    """
    return sink_softmax(scores, mask, 0.0)[0]


# ----------------------------------------------------------------------------------------------- attention
def sink_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                   sink_logits: Tensor | float | None = None, scale: float | None = None, dropout_p: float = 0.0
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """Scaled dot-product attention with a sink: ``sink_softmax(q k^T * scale, mask, b) v``.

    Args:
        q: queries ``(..., n_queries, d_k)``, any float dtype (fp16/bf16: scores, softmax and weighted sum in fp32).
        k: keys ``(..., n_keys, d_k)``, same dtype.
        v: values ``(..., n_keys, d_v)``, same dtype. The batch dims of ``q``, ``k``, ``v`` broadcast, as in
            :func:`attnbook.attention.scaled_dot_product_attention`.
        mask: bool, broadcastable to ``(..., n_queries, n_keys)``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``). ``None`` = every key takes part.
        sink_logits: the sink logit ``b``, broadcastable to ``(..., n_queries)``: a real number, or e.g. a per-head
            ``(heads, 1)`` tensor for ``(batch, heads, n, d)`` inputs. ``None`` = 0 (:func:`softmax_one`).
        scale: multiplies the scores; ``None`` = ``1 / sqrt(d_k)``.
        dropout_p: dropout on the key weights (not on the sink's), whenever > 0.

    Returns:
        ``(output, weights, sink_weight)``: ``output`` ``(..., n_queries, d_v)``, ``weights``
        ``(..., n_queries, n_keys)`` (before dropout), ``sink_weight`` ``(..., n_queries)``, in the inputs' dtype.
        The output is ``sum_j w_j v_j``: the sink's value is zero. A query whose keys are all masked gets output 0,
        zero weights and sink weight 1.

    Raises:
        TypeError: an input is not a floating tensor, the dtypes differ, ``mask`` is not bool, ``sink_logits`` or
            ``scale`` has a wrong type.
        ValueError: shapes that do not match or broadcast (the messages give them), ``dropout_p`` outside
            ``[0, 1)``, a non-finite ``scale`` or ``sink_logits``.

    Equals ``F.scaled_dot_product_attention`` over the keys plus one extra key whose score is ``b`` and whose value
    is 0 (the tests check this). Xiao et al. (2023); OpenAI gpt-oss (2025), per-head sinks. Chapter 9, section
    "Attending to nowhere".
    """
    batch = _check_qkv(q, k, v)
    n_q, d_k, n_k = q.shape[-2], q.shape[-1], k.shape[-2]
    _check_mask(mask, (*batch, n_q, n_k))
    dropout_p = _check_dropout(dropout_p)
    scale = _check_scale(scale, d_k)
    compute = _compute_dtype(q.dtype)
    scores = (q.to(compute) * scale) @ k.to(compute).transpose(-1, -2)  # (*batch, n_q, n_k)
    scores = scores.expand(*batch, n_q, n_k)
    weights, sink_weight = sink_softmax(scores, mask, sink_logits)
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = dropped @ v.to(compute)
    return out.to(q.dtype), weights.to(q.dtype), sink_weight.to(q.dtype)


class SinkMultiHeadAttention(MultiHeadAttention):
    """:class:`attnbook.attention.MultiHeadAttention` with a sink logit per head (Xiao et al. 2023; gpt-oss 2025).

    Args:
        embed_dim, num_heads, dropout, bias, kdim, vdim, need_weights: as
            :class:`~attnbook.attention.MultiHeadAttention`.
        init_sink: the initial sink logit of every head (finite). ``0.0`` with ``learn_sink=False`` is softmax with
            one added (Miller 2023) in every head.
        learn_sink: learn the sink logits (an ``nn.Parameter`` ``sink_logits`` of shape ``(num_heads,)``); False =
            a fixed buffer.

    Call: as the parent, ``(queries (batch, n_queries, embed_dim), keys, values, mask=None)`` with ``mask`` bool,
    True = takes part, broadcastable to ``(batch, n_queries, n_keys)`` or 4-D ``(batch, heads, n_queries,
    n_keys)``. Only the weighting differs (:func:`sink_attention` in place of the softmax): after a call,
    ``attention_weights`` ``(batch, heads, n_queries, n_keys)`` (when ``need_weights``) and ``sink_weights``
    ``(batch, heads, n_queries)`` hold the last weights (detached). A query with no valid key puts all its weight on
    the sink in every head, so its output is ``out_proj``'s bias.

    Raises:
        ValueError: as the parent, or ``init_sink`` not finite.
        TypeError: a non-bool mask.

    Chapter 9, section "Attending to nowhere".
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, need_weights: bool = True, *,
                 init_sink: float = 0.0, learn_sink: bool = True) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias, kdim, vdim, need_weights)
        if not math.isfinite(float(init_sink)):
            raise ValueError(f"init_sink must be finite, got {init_sink}")
        sink = torch.full((num_heads,), float(init_sink))
        if learn_sink:
            self.sink_logits = nn.Parameter(sink)
        else:
            self.register_buffer("sink_logits", sink)
        self.sink_weights: Tensor | None = None

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
        out, weights, sink_weight = sink_attention(
            q, k, v, mask, sink_logits=self.sink_logits.to(q.dtype).unsqueeze(-1),
            dropout_p=self.dropout if self.training else 0.0)
        self.sink_weights = sink_weight.detach()
        return (out, weights) if self.need_weights else out


# ----------------------------------------------------------------------------------------------- fully masked rows
def online_softmax_rule(scores: Tensor, values: Tensor, mask: Tensor | None = None, block_size: int = 2
                        ) -> tuple[Tensor, Tensor]:
    """FlashAttention's online softmax over blocks of keys, with its guards for rows that have no valid key.

    Args:
        scores: ``(..., n_queries, n_keys)`` float scores (already scaled).
        values: ``(..., n_keys, d_v)``, same dtype.
        mask: bool, broadcastable to ``scores``; True = the key takes part (same convention as
            ``torch.nn.functional.scaled_dot_product_attention``).
        block_size: keys per block (> 0).

    Returns:
        ``(output (..., n_queries, d_v), lse (..., n_queries))``: the softmax-weighted values and the log-sum-exp
        of the valid scores. A row with no valid key gets output 0 and ``lse = -inf`` (= ``log 0``, the empty sum).

    Raises:
        TypeError: non-float scores or a non-bool mask. ValueError: ``block_size`` < 1.

    FlashAttention-2 (Dao 2023, algorithm 1) keeps per row a running max ``m`` and sum ``l``. Masked scores are
    ``-inf``; while every score seen is ``-inf``, the max used as the exponent's reference is replaced by 0 (its
    ``Check_inf``), so ``exp(-inf - 0) = 0`` and not ``exp(-inf + inf) = NaN``. At the end ``l = 0`` and the output
    accumulator (0) is divided by 1 instead of ``l``: output 0. The kernels of the flash-attn package write ``lse``
    for such a row as ``+inf`` (so that the backward pass's ``exp(s - lse)`` is 0). Only the partial ``lse`` of one
    key split is ``-inf`` (so that merging the splits gives it no weight), and the merged row gets ``+inf`` again
    (``csrc/flash_attn/src/softmax.h`` and ``flash_fwd_kernel.h``). This function returns the mathematical value
    ``-inf``. Chapter 9, section "Attending to nowhere".
    """
    _check_scores(scores)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if mask is not None:
        check_bool_mask(mask)
        scores = scores.masked_fill(~mask, float("-inf"))
    m = torch.full(scores.shape[:-1], float("-inf"), dtype=scores.dtype, device=scores.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(*scores.shape[:-1], values.shape[-1], dtype=scores.dtype, device=scores.device)
    for start in range(0, scores.shape[-1], block_size):
        s = scores[..., start:start + block_size]
        m_new = torch.maximum(m, s.amax(-1))
        m_ref = torch.where(torch.isinf(m_new) & (m_new < 0), 0.0, m_new)  # Check_inf: no -inf - (-inf)
        p = torch.exp(s - m_ref.unsqueeze(-1))
        correction = torch.exp(m - m_ref)
        l = l * correction + p.sum(-1)
        acc = acc * correction.unsqueeze(-1) + p @ values[..., start:start + block_size, :]
        m = m_new
    empty = (l == 0) | torch.isnan(l)
    out = acc / torch.where(empty, 1.0, l).unsqueeze(-1)
    m_ref = torch.where(torch.isinf(m) & (m < 0), 0.0, m)
    lse = torch.where(empty, float("-inf"), m_ref + torch.log(torch.where(empty, 1.0, l)))
    return out, lse


def _kind(t: Tensor | None) -> str:
    """One word for a measured tensor: ``"NaN"``, ``"zeros"``, ``"nonzero"`` or ``"not returned"``."""
    if t is None:
        return "not returned"
    t = t.detach()
    if bool(torch.isnan(t).any()):
        return "NaN"
    return "zeros" if bool((t == 0).all()) else "nonzero"


@contextlib.contextmanager
def _record_fast_path(calls: list):
    """Count the calls of ``torch._native_multi_head_attention`` (``nn.MultiheadAttention``'s fused fast path)."""
    original = torch._native_multi_head_attention

    def recording(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    torch._native_multi_head_attention = recording
    try:
        yield
    finally:
        torch._native_multi_head_attention = original


def fully_masked_row(seed: int = 0, embed_dim: int = 8, num_heads: int = 2, n_keys: int = 3) -> pd.DataFrame:
    """What each implementation gives for a query with no valid key, measured on this torch (fp32, CPU or not).

    One batch of ``n_keys`` positions in self-attention; query 0 may attend to no key (its mask row is all False),
    the other queries to every key. Each implementation is run and its output (and weights) for query 0 are
    described by a word: ``"zeros"``, ``"NaN"``, ``"nonzero"``, ``"not returned"``.

    Returns:
        One row per implementation and setting, columns ``implementation, mode, need_weights, grad, path, output,
        weights, sink_weight, lse`` (``mode``/``need_weights``/``grad`` are ``"-"`` where they do not apply; ``path``
        says which code ran; ``lse`` is the log-sum-exp where the implementation returns one, else NaN). The modules
        ``nn.MultiheadAttention`` and :class:`~attnbook.attention.MultiHeadAttention` share weights (their output
        projection has bias 0, so a zero context gives a zero output); ``grad`` is whether autograd was enabled
        (``nn.MultiheadAttention`` takes its fused fast path only in eval mode with autograd off).

    Chapter 9, section "Attending to nowhere"; pytorch PR #133882 (SDPA returns 0) and issue #160064
    (``nn.MultiheadAttention`` returns NaN).
    """
    g = torch.Generator().manual_seed(seed)
    head_dim = embed_dim // num_heads
    x = torch.randn(1, n_keys, embed_dim, generator=g)
    mask = torch.ones(1, n_keys, n_keys, dtype=torch.bool)
    mask[:, 0] = False  # query 0 has no key
    q, k, v = (torch.randn(1, num_heads, n_keys, head_dim, generator=g) for _ in range(3))
    rows = []

    def add(implementation, output, weights=None, *, mode="-", need_weights="-", grad="-", path="-",
            sink_weight=None, lse=float("nan")):
        rows.append(dict(implementation=implementation, mode=mode, need_weights=need_weights, grad=grad, path=path,
                         output=_kind(output), weights=_kind(weights),
                         sink_weight=float("nan") if sink_weight is None else float(sink_weight), lse=float(lse)))

    add("torch F.scaled_dot_product_attention", F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[..., 0, :],
        path="default dispatch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        add("torch F.scaled_dot_product_attention",
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[..., 0, :], path="math backend")
    if q.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf")).unsqueeze(1)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
        add("torch CPU flash kernel", out[..., 0, :], path="aten._scaled_dot_product_flash_attention_for_cpu",
            lse=lse[0, 0, 0])
    out, weights = scaled_dot_product_attention(q, k, v, mask.unsqueeze(1), return_weights=True)
    add("attnbook scaled_dot_product_attention", out[..., 0, :], weights[..., 0, :], path="explicit (weights)")
    add("attnbook scaled_dot_product_attention", scaled_dot_product_attention(q, k, v, mask.unsqueeze(1))[..., 0, :],
        path="fused (no weights)")
    scores = q @ k.mT / math.sqrt(head_dim)
    out, lse = online_softmax_rule(scores, v, mask.unsqueeze(1))
    add("FlashAttention's rule (online_softmax_rule)", out[..., 0, :], path="algorithm, in torch", lse=lse[0, 0, 0])
    out, weights, sink = sink_attention(q, k, v, mask.unsqueeze(1))
    add("softmax_one (sink_attention, b = 0)", out[..., 0, :], weights[..., 0, :], sink_weight=sink[0, 0, 0])

    torch_mha = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
    ours = MultiHeadAttention(embed_dim, num_heads)
    with torch.no_grad():
        for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
            proj.weight.copy_(torch_mha.in_proj_weight[i * embed_dim:(i + 1) * embed_dim])
            proj.bias.copy_(torch_mha.in_proj_bias[i * embed_dim:(i + 1) * embed_dim])
        ours.out_proj.load_state_dict(torch_mha.out_proj.state_dict())
    for mode in ("train", "eval"):
        for need_weights in (True, False):
            for grad in (True, False):
                torch_mha.train(mode == "train")
                calls: list = []
                with torch.set_grad_enabled(grad), _record_fast_path(calls):
                    out, weights = torch_mha(x, x, x, attn_mask=~mask[0], need_weights=need_weights)
                path = ("fused fast path (torch._native_multi_head_attention)" if calls
                        else "F.multi_head_attention_forward")
                add("torch nn.MultiheadAttention", out[:, 0], None if weights is None else weights[:, 0],
                    mode=mode, need_weights=need_weights, grad=grad, path=path)
    for mode in ("train", "eval"):
        for need_weights in (True, False):
            ours.train(mode == "train")
            ours.need_weights = need_weights
            out = ours(x, x, x, mask)
            weights = ours.attention_weights
            add("attnbook MultiHeadAttention", out[:, 0], None if weights is None else weights[:, :, 0],
                mode=mode, need_weights=need_weights, grad=True)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------------------------- windows and caches
def sliding_window_mask(n_queries: int, window: int, n_keys: int | None = None, *,
                        key_padding_mask: Tensor | None = None, device: torch.device | str | None = None) -> Tensor:
    """Causal sliding-window mask: each query sees itself and the ``window - 1`` keys before it.

    Args:
        n_queries: number of queries; they are the *last* ``n_queries`` of the ``n_keys`` positions (as in
            :func:`attnbook.attention.causal_mask`), so a decoding step with a cache works too.
        window: keys per query, ``>= 1`` (Mistral's ``sliding_window``): key ``j`` takes part for query ``i`` iff
            ``i' - window < j <= i'`` with ``i' = i + n_keys - n_queries``. ``window >= n_keys`` gives the causal
            mask.
        n_keys: number of keys; ``None`` = ``n_queries``.
        key_padding_mask: optional bool ``(B, n_keys)``, True = a real token. The window counts positions in the
            row; with left or right padding the real tokens are contiguous, so it also counts real tokens.
        device: of the result.

    Returns:
        bool ``(n_queries, n_keys)``, or ``(B, n_queries, n_keys)`` with ``key_padding_mask`` (window, causal and
        padding combined by ``&``); True = takes part, as ``F.scaled_dot_product_attention``'s ``attn_mask``.
        Queries at pads may be left with no key; attnbook's attention and SDPA give them zeros.

    Raises:
        TypeError: a size is not an int, ``key_padding_mask`` not bool. ValueError: ``window < 1``, a size < 0,
            ``n_keys < n_queries``, or ``key_padding_mask`` not ``(B, n_keys)``.

    Beltagy et al. (2020), Longformer's local window; Jiang et al. (2023), Mistral 7B. Chapter 9, section
    "Sliding windows, and sinks in a cache".
    """
    n_queries = check_int(n_queries, "n_queries", 0)
    window = check_int(window, "window", 1)
    n_keys = n_queries if n_keys is None else check_int(n_keys, "n_keys", 0)
    causal = causal_mask(n_queries, n_keys, device=device)
    mask = causal & ~torch.ones_like(causal).tril(n_keys - n_queries - window)
    if key_padding_mask is None:
        return mask
    check_bool_mask(key_padding_mask, "key_padding_mask")
    if key_padding_mask.dim() != 2 or key_padding_mask.shape[1] != n_keys:
        raise ValueError(f"key_padding_mask must be (batch, n_keys={n_keys}), got {tuple(key_padding_mask.shape)}")
    return mask[None] & key_padding_mask.to(mask.device)[:, None, :]


def streaming_cache_keep(padding_mask: Tensor, n_sink: int, window: int) -> Tensor:
    """Which entries of a key/value cache to keep when it is trimmed to sinks plus a window (StreamingLLM).

    Xiao et al. found that trained language models put a large share of their attention on the first few tokens,
    whatever those tokens are; a cache trimmed to the most recent ``window`` tokens drops them, and perplexity
    explodes. Keeping the first ``n_sink`` tokens as well repairs it. With left padding the first *positions* of
    a row are pads: the sinks are the first ``n_sink`` *real* tokens of each row, found from the mask.

    Args:
        padding_mask: bool ``(B, L)``, True = a real token in the cache (any padding side).
        n_sink: real tokens kept from the start of each row (Xiao et al. use 4), ``>= 0``.
        window: most recent real tokens kept per row, ``>= 0``.

    Returns:
        bool ``(B, L)``, True = keep: real tokens whose rank among the row's real tokens is below ``n_sink`` or
        among the last ``window``. Pads are never kept. A row with at most ``n_sink + window`` real tokens keeps
        all of them.

    Raises:
        TypeError: ``padding_mask`` not bool, sizes not ints. ValueError: ``padding_mask`` not 2-D, a size < 0.

    Xiao et al. (2024), "Efficient streaming language models with attention sinks", section 3. Chapter 9,
    section "Sliding windows, and sinks in a cache".
    """
    check_bool_mask(padding_mask, "padding_mask")
    if padding_mask.dim() != 2:
        raise ValueError(f"padding_mask must be (batch, length), got {tuple(padding_mask.shape)}")
    n_sink = check_int(n_sink, "n_sink", 0)
    window = check_int(window, "window", 0)
    rank = padding_mask.long().cumsum(1) - 1                        # rank of each real token in its row
    n_real = padding_mask.sum(1, keepdim=True)
    return padding_mask & ((rank < n_sink) | (rank >= n_real - window))


# ----------------------------------------------------------------------------------------------- StreamingLLM's cache
class SinkCache(NamedTuple):
    """StreamingLLM's cache for a rotary decoder: per layer the keys *before* the rotation and the values, ``(batch,
    nhead, t, head_dim)`` each, with the original ``positions`` ``(t,)`` int64 of the ``t`` cached tokens and the
    number of tokens ``seen`` so far. Rows have no padding (one stream per row, all of the same length).

    Chapter 9, section "Sliding windows, and sinks in a cache"."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    positions: Tensor
    seen: int


def _check_streaming_model(model: object) -> None:
    from .generation import DecoderOnlyLM

    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be an attnbook.generation.DecoderOnlyLM, got {type(model).__name__}")
    if model.positional != "rope":
        raise ValueError("StreamingLLM renumbers positions inside the cache, which only rotary positions allow "
                         f"(they enter at attention time); got positional={model.positional!r}")


def streaming_step(model: nn.Module, tokens: Tensor, cache: SinkCache | None, n_sink: int, window: int, *,
                   renumber: bool = True) -> tuple[Tensor, SinkCache]:
    """Feed one token per row to a rotary decoder through a cache trimmed to sinks plus a window (StreamingLLM).

    The new token's key and value (unrotated) are appended to each layer's cache, the cache is trimmed to its
    first ``n_sink`` and last ``window`` entries, and the new token's query attends to what is left. Queries and
    keys are rotated at this moment: with ``renumber=True`` by their slot in the trimmed cache (``0 .. t - 1``, the
    query last), as Xiao et al. do, so that no query-key distance exceeds ``n_sink + window - 1``; with
    ``renumber=False`` by their original positions, which is what trimming a cache of rotated keys gives.

    Args:
        model: an :class:`attnbook.generation.DecoderOnlyLM` with ``positional="rope"`` (put in eval mode).
        tokens: int64 ``(batch,)``, one new token per row.
        cache: from the previous step, or ``None`` for the first token.
        n_sink: first tokens kept (Xiao et al. use 4), ``>= 0``.
        window: most recent tokens kept, the new one included, ``>= 1``.
        renumber: see above.

    Returns:
        ``(logits (batch, vocab), cache)``. While at most ``n_sink + window`` tokens have been fed nothing is
        trimmed, and the logits are the model's ordinary ones.

    Raises:
        TypeError: ``model`` not a ``DecoderOnlyLM``, ``cache`` not a :class:`SinkCache`, ``renumber`` not a
            bool. ValueError: not rotary positions, ``tokens`` not ``(batch,)``, sizes out of range.

    Xiao et al. (2024), "Efficient streaming language models with attention sinks", section 3.2 ("when determining
    the relative distance and adding positional information to tokens, StreamingLLM focuses on positions within
    the cache rather than those in the original text"). Chapter 9, section "Sliding windows, and sinks in a cache".
    """
    from .transformer import rotary_embedding

    _check_streaming_model(model)
    n_sink = check_int(n_sink, "n_sink", 0)
    window = check_int(window, "window", 1)
    if not isinstance(renumber, bool):
        raise TypeError(f"renumber must be True or False, got {renumber!r}")
    if not isinstance(tokens, Tensor) or tokens.dim() != 1:
        raise ValueError(f"tokens must be (batch,) int64, one token per row, got "
                         f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__}")
    if cache is not None and not isinstance(cache, SinkCache):
        raise TypeError(f"cache must be a SinkCache or None, got {type(cache).__name__}")
    layers = model.stack.layers
    seen = 0 if cache is None else cache.seen
    old_positions = tokens.new_zeros(0) if cache is None else cache.positions
    positions = torch.cat([old_positions, torch.tensor([seen], device=tokens.device)])
    t = len(positions)
    keep = torch.tensor(sorted(set(range(min(n_sink, t))) | set(range(max(t - window, 0), t))), device=tokens.device)
    positions = positions[keep]
    rotate_by = torch.arange(len(keep), device=tokens.device) if renumber else positions
    x = model.embedding(tokens[:, None])                                         # rotary: no added positions
    keys, values = [], []
    for i, layer in enumerate(layers):
        attn = layer.self_attn

        def attend(h, i=i, attn=attn):
            k = attn._split(attn.k_proj(h))
            v = attn._split(attn.v_proj(h))
            if cache is not None:
                k, v = torch.cat([cache.keys[i], k], 2), torch.cat([cache.values[i], v], 2)
            k, v = k[:, :, keep], v[:, :, keep]
            keys.append(k)
            values.append(v)
            q = rotary_embedding(attn._split(attn.q_proj(h)), rotate_by[-1:], base=attn.rope_base)
            out = scaled_dot_product_attention(q, rotary_embedding(k, rotate_by, base=attn.rope_base), v)
            return layer.dropout1(attn.out_proj(out.transpose(1, 2).flatten(-2)))

        if layer.norm_first:
            x = x + attend(layer.norm1(x))
            x = x + layer._ff_block(layer.norm2(x))
        else:
            x = layer.norm1(x + attend(x))
            x = layer.norm2(x + layer._ff_block(x))
    if model.stack.norm is not None:
        x = model.stack.norm(x)
    return model.out(x)[:, 0], SinkCache(tuple(keys), tuple(values), positions, seen + 1)


@torch.no_grad()
def streaming_generate(model: nn.Module, ids: Tensor, max_new_tokens: int, n_sink: int, window: int, *,
                       renumber: bool = True) -> tuple[Tensor, Tensor]:
    """Greedy generation through StreamingLLM's cache: the prompt is fed one token at a time (so that it is
    trimmed as a stream is), then ``max_new_tokens`` tokens are generated (:func:`streaming_step`).

    Args:
        model: a rotary :class:`attnbook.generation.DecoderOnlyLM` (eval mode for the call, then restored).
        ids: int64 ``(batch, T)`` prompts, ``T >= 1``, no padding.
        max_new_tokens: ``>= 1``.
        n_sink, window, renumber: as in :func:`streaming_step`.

    Returns:
        ``(tokens (batch, max_new_tokens), logits (batch, T + max_new_tokens - 1, vocab))``: the logits after every
        token fed but the last generated one.

    Raises:
        as :func:`streaming_step`; ValueError: ``ids`` not ``(batch, T >= 1)``, ``max_new_tokens < 1``.

    Xiao et al. (2024), section 3.2. Chapter 9, section "Sliding windows, and sinks in a cache".
    """
    _check_streaming_model(model)
    max_new_tokens = check_int(max_new_tokens, "max_new_tokens", 1)
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] == 0:
        raise ValueError(f"ids must be (batch, T) with T >= 1, got "
                         f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    was_training = model.training
    model.eval()
    try:
        cache, logits, new = None, [], []
        for column in ids.unbind(1):
            step, cache = streaming_step(model, column, cache, n_sink, window, renumber=renumber)
            logits.append(step)
        for i in range(max_new_tokens):
            new.append(logits[-1].argmax(-1))
            if i + 1 < max_new_tokens:
                step, cache = streaming_step(model, new[-1], cache, n_sink, window, renumber=renumber)
                logits.append(step)
    finally:
        model.train(was_training)
    return torch.stack(new, 1), torch.stack(logits, 1)
