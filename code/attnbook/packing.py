"""Attention over packed rows, three ways: a dense bool mask, FlexAttention's block mask, and variable-length kernels.

Explained in chapter 9, section "Packing instead of padding". A packed row holds several documents one after another
(:func:`attnbook.batching.pack_collate`); its document ids ``doc_ids`` (int ``(B, L)``, ``0, 0, 1, 1, 1, ..., -1``;
-1 = a pad at the end of the row) say which positions may attend to which. Every function here computes the same
thing, each document's own attention as if it stood alone, and returns it in the packed layout:

- :func:`document_attention`: scaled dot-product attention with the dense block-diagonal bool mask of
  :func:`attnbook.batching.document_mask` (``(B, L, L)``, True = takes part, the convention of
  ``F.scaled_dot_product_attention``), through :func:`attnbook.attention.scaled_dot_product_attention` (torch's
  fused kernel). It still computes every score of the ``L x L`` square and throws most of them away;
- :func:`flex_document_attention`: ``torch.nn.attention.flex_attention`` with a ``mask_mod`` and a ``BlockMask``,
  which skips the blocks of the square that no document covers (Dong et al. 2024, "Flex Attention");
- :func:`varlen_attention`: the documents as one flat sequence of tokens with cumulative offsets (``cu_seqlens``,
  :func:`attnbook.batching.document_offsets`), the interface of FlashAttention-2's varlen kernels (Dao 2023): torch's
  ``torch.nn.attention.varlen.varlen_attn`` (CUDA only) or a jagged nested tensor through
  ``F.scaled_dot_product_attention`` (which also runs on a CPU).

What runs where, with the pinned torch 2.13 (:func:`backend_status` says it for the current machine): on a CPU the
dense mask, FlexAttention in eager mode (its unfused reference implementation, which materializes the scores; the
first call takes several seconds to set up), FlexAttention under ``torch.compile`` (the inductor backend compiles a
C++ kernel with the system's C compiler: about 40 seconds on a busy 2-core machine for the first call; fp32, fp16
and bf16 only: in fp64 inductor raises ``LoweringException: NotImplementedError``) and the
nested-tensor varlen path; ``varlen_attn`` raises ``NotImplementedError`` on a CPU (``aten::_flash_attention_forward``
has no CPU kernel), so :func:`varlen_attention` with ``backend="varlen"`` raises :class:`BackendUnavailable` there.

The flattened batch (chapter 9, section "The flattened batch"): all documents in one row of ``T`` tokens, described
by ``cu_seqlens`` alone (:func:`cu_seqlens_from_lengths`), with position ids restarting per document
(:func:`position_ids_from_cu_seqlens`, what Hugging Face's ``DataCollatorWithFlattening`` returns;
:func:`cu_seqlens_from_position_ids` goes back) and, for kernels that need a mask, the block-diagonal causal mask
:func:`flat_document_mask`.

Every attention function takes ``causal=True`` for a decoder: each token then sees only the tokens of its own
document at or before it (:func:`document_causal_mask`), as ``F.scaled_dot_product_attention(..., is_causal=True)``
gives each document run alone.

Language-model training on packed rows (chapter 9, section "Packing for a language model"): :func:`lm_labels` (the
ids, with -100 at pads and at every document's first token), :func:`count_targets` and :func:`lm_loss` (the summed
next-token loss divided by the step's count of predicted tokens, across micro-batches), and
:func:`packed_lm_logits` (chapter 8's decoder-only model with the document causal mask and restarting positions).

Every output is ``(B, H, L, D)`` with zeros at the pads' positions (a query that may attend to nothing gets a zero
output, attnbook's convention for fully masked rows).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import scaled_dot_product_attention
from .batching import check_document_ids, document_mask, document_offsets

__all__ = ["BACKENDS", "BackendUnavailable", "backend_status", "document_attention", "flex_document_attention",
           "varlen_attention", "document_causal_mask", "IGNORE_INDEX", "lm_labels", "count_targets", "lm_loss",
           "packed_lm_logits",
           "cu_seqlens_from_lengths", "position_ids_from_cu_seqlens", "cu_seqlens_from_position_ids",
           "flat_document_mask"]

#: The backends of :func:`varlen_attention` (``"auto"`` chooses between them).
BACKENDS = ("varlen", "nested")

_EAGER_FLEX_WARNING = "flex_attention called without torch.compile"


class BackendUnavailable(RuntimeError):
    """A packed-attention backend does not run here (this device, dtype or torch build); the message says why."""


def _check_flag(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def document_causal_mask(doc_ids: Tensor) -> Tensor:
    """The document causal mask of packed rows: block-diagonal *and* causal.

    Args:
        doc_ids: int ``(B, L)`` document ids (:func:`attnbook.batching.check_document_ids`; -1 = pad).

    Returns:
        bool ``(B, L, L)``, True = takes part: ``mask[b, i, j]`` where ``i`` and ``j`` are real tokens of the same
        document and ``j <= i``; :func:`attnbook.batching.document_mask` ``&`` the causal mask. Every real token
        sees at least itself; a pad's row is all False.

    Raises:
        TypeError, ValueError: ``doc_ids`` invalid, as in :func:`attnbook.batching.check_document_ids`.

    Krell et al. (2021), section 4; Vaswani et al. (2017), section 3.2.3. Chapter 9, section "Packing for a
    language model".
    """
    mask = document_mask(doc_ids)
    return mask & torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()


def _check_packed(q: Tensor, k: Tensor, v: Tensor, doc_ids: Tensor) -> None:
    """``q``, ``k``, ``v`` floating ``(B, H, L, D)`` of one dtype and device; ``doc_ids`` valid ``(B, L)``."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor, got "
                            f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (batch, heads, length, head_dim), got {tuple(x.shape)}")
        if x.shape[-1] == 0 and name in ("q", "k"):
            raise ValueError(f"{name} has a zero-width head_dim in shape {tuple(x.shape)}; attention needs head_dim >= 1")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[:3] != k.shape[:3] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k, v must be (batch, heads, length, head_dim) with one batch, heads and length (and q, k "
                         f"one head_dim), got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    check_document_ids(doc_ids)
    if tuple(doc_ids.shape) != (q.shape[0], q.shape[2]):
        raise ValueError(f"doc_ids must have shape (batch, length) = {(q.shape[0], q.shape[2])}, got "
                         f"{tuple(doc_ids.shape)}")


def document_attention(q: Tensor, k: Tensor, v: Tensor, doc_ids: Tensor, *, scale: float | None = None,
                       causal: bool = False) -> Tensor:
    """Attention within each document of packed rows, with the dense block-diagonal mask.

    Args:
        q, k, v: ``(B, H, L, D)`` (``v`` may have another last size), one floating dtype and device.
        doc_ids: int ``(B, L)`` document ids (:func:`attnbook.batching.check_document_ids`; -1 = pad).
        scale: of the scores; ``None`` = ``1 / sqrt(D)``.
        causal: False = each token sees its whole document (an encoder); True = only the tokens of its document
            at or before it (a decoder: :func:`document_causal_mask`), what ``F.scaled_dot_product_attention(...,
            is_causal=True)`` gives each document run alone.

    Returns:
        ``(B, H, L, D_v)``: at each real token, softmax over the keys of its own document only; zeros at the pads.
        The mask is :func:`attnbook.batching.document_mask` (bool, True = takes part, as
        ``F.scaled_dot_product_attention``'s ``attn_mask``), or :func:`document_causal_mask` with ``causal``.

    Raises:
        TypeError: non-float or mixed dtypes, bad ``doc_ids``. ValueError: shapes that do not match (the message
            gives them), bad ``doc_ids``.

    Krell et al. (2021), section 4; Vaswani et al. (2017), eq. 1. Chapter 9, section "Packing instead of padding".
    """
    _check_packed(q, k, v, doc_ids)
    _check_flag(causal, "causal")
    doc_ids = doc_ids.to(q.device)
    mask = document_causal_mask(doc_ids) if causal else document_mask(doc_ids)
    return scaled_dot_product_attention(q, k, v, mask[:, None], scale=scale)   # (B, 1, L, L): every head


_compiled_flex = None


def flex_document_attention(q: Tensor, k: Tensor, v: Tensor, doc_ids: Tensor, *, compile: bool = False,
                            scale: float | None = None, causal: bool = False) -> Tensor:
    """Attention within each document of packed rows, with FlexAttention: a ``mask_mod`` and its ``BlockMask``.

    The ``mask_mod`` is ``doc[b, q_idx] == doc[b, kv_idx] & doc[b, q_idx] >= 0`` (True = the pair takes part,
    the dense mask of :func:`attnbook.batching.document_mask`); ``create_block_mask`` evaluates it once per
    ``128 x 128`` block, so that a fused kernel skips the blocks no document covers.

    Args:
        q, k, v: ``(B, H, L, D)``, one floating dtype and device (all of ``D``, ``D_v`` equal).
        doc_ids: int ``(B, L)`` document ids (-1 = pad).
        compile: False = FlexAttention's eager path: its reference implementation, which materializes the
            ``L x L`` scores and so saves no work (torch warns about it; the warning is silenced here, since the
            eager path is chosen on purpose); its first call in a process takes several seconds (imports and
            tracing). True = ``torch.compile(flex_attention)``, a fused kernel; on a CPU inductor compiles C++ with
            the system's compiler (about 40 s for the first call on a busy 2-core machine, cached afterwards;
            fp32 checked here). Compiled on a CPU, FlexAttention takes fp32, fp16 and bf16 only: fp64 raises
            (inductor's ``LoweringException: NotImplementedError``, reported as :class:`BackendUnavailable`).
        scale: of the scores; ``None`` = ``1 / sqrt(D)``.
        causal: True = the ``mask_mod`` also requires ``kv_idx <= q_idx`` (torch's "causal document masking"
            example): the blocks above the diagonal are skipped too.

    Returns:
        ``(B, H, L, D_v)``: the same as :func:`document_attention` (with the same ``causal``), zeros at the pads
        (FlexAttention gives a query with no allowed key a zero output).

    Raises:
        TypeError, ValueError: as :func:`document_attention`.
        BackendUnavailable: this torch has no ``torch.nn.attention.flex_attention``, or it fails here (the message
            gives torch's error).

    Dong et al. (2024), "Flex Attention: a programming model for generating optimized attention kernels"; the
    document mask as in torch's FlexAttention examples ("document masking / jagged sequences"). Chapter 9, section
    "Packing instead of padding".
    """
    global _compiled_flex
    _check_packed(q, k, v, doc_ids)
    _check_flag(causal, "causal")
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:  # pragma: no cover - torch < 2.5
        raise BackendUnavailable(f"torch {torch.__version__} has no FlexAttention ({err})") from None
    doc = doc_ids.to(device=q.device, dtype=torch.long)

    def same_document(b, h, q_idx, kv_idx):
        allowed = (doc[b, q_idx] == doc[b, kv_idx]) & (doc[b, q_idx] >= 0)
        return allowed & (kv_idx <= q_idx) if causal else allowed

    batch, _, length, _ = q.shape
    try:
        block_mask = create_block_mask(same_document, batch, None, length, length, device=q.device)
        if compile:
            if _compiled_flex is None:
                _compiled_flex = torch.compile(flex_attention)
            return _compiled_flex(q, k, v, block_mask=block_mask, scale=scale)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EAGER_FLEX_WARNING)
            return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    except (RuntimeError, NotImplementedError, ImportError, AssertionError) as err:
        raise BackendUnavailable(f"FlexAttention ({'compiled' if compile else 'eager'}) failed on {q.device} with "
                                 f"{q.dtype}: {type(err).__name__}: {str(err)[:300]}") from err


def _scatter(flat: Tensor, doc_ids: Tensor, like: Tensor) -> Tensor:
    """Flat ``(T, H, D_v)`` outputs of the real tokens back into the packed layout ``(B, H, L, D_v)``, zero pads."""
    out = like.new_zeros(like.shape[0], like.shape[2], flat.shape[1], flat.shape[2])   # (B, L, H, D_v)
    out[doc_ids >= 0] = flat.to(like.dtype)
    return out.transpose(1, 2)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, doc_ids: Tensor, *, backend: str = "auto",
                     scale: float | None = None, causal: bool = False) -> Tensor:
    """Attention within each document of packed rows, with a variable-length interface: no mask at all.

    The real tokens of all rows are gathered into one flat sequence ``(T, H, D)`` (``T`` = the number of real
    tokens), cut into documents by the cumulative offsets of :func:`attnbook.batching.document_offsets`, and each
    document attends only to itself; the pads never enter.

    Args:
        q, k, v: ``(B, H, L, D)``, one floating dtype and device.
        doc_ids: int ``(B, L)`` document ids (-1 = pad).
        backend: ``"varlen"`` = ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2's varlen kernel with
            int32 ``cu_seqlens``): CUDA only, fp16 or bf16; ``"nested"`` = a jagged nested tensor
            (``torch.nested.nested_tensor_from_jagged`` with the offsets) through ``F.scaled_dot_product_attention``,
            which runs on a CPU too and in any float dtype; ``"auto"`` = ``"varlen"`` for fp16/bf16 on CUDA, else
            ``"nested"``.
        scale: of the scores; ``None`` = ``1 / sqrt(D)``.
        causal: True = causal within each document. ``"varlen"`` passes ``window_size=(-1, 0)`` (no limit to the
            left, none to the right of the diagonal: "(-1, 0) for causal attention", says ``varlen_attn``'s
            docstring); ``"nested"`` cannot be causal
            (torch 2.13's jagged SDPA refuses ``is_causal=True``, "Nested tensors for query / key are not supported
            when is_causal=True") and raises :class:`BackendUnavailable`.

    Returns:
        ``(B, H, L, D_v)``: the same as :func:`document_attention` (with the same ``causal``), zeros at the pads.

    Raises:
        TypeError, ValueError: as :func:`document_attention`; ValueError: an unknown ``backend``.
        BackendUnavailable: the backend does not run here; on a CPU, ``"varlen"`` (``varlen_attn`` raises
            ``NotImplementedError``: ``aten::_flash_attention_forward`` has no CPU kernel in torch 2.13; the message
            gives torch's error); ``"nested"`` with ``causal``.

    Dao (2023), "FlashAttention-2", its variable-length (``cu_seqlens``) interface; Krell et al. (2021). Chapter 9,
    section "Packing instead of padding".
    """
    if backend not in (*BACKENDS, "auto"):
        raise ValueError(f"backend must be one of {[*BACKENDS, 'auto']}, got {backend!r}")
    _check_packed(q, k, v, doc_ids)
    _check_flag(causal, "causal")
    if backend == "auto":
        backend = "varlen" if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) else "nested"
    if backend == "nested" and causal:
        raise BackendUnavailable("backend='nested' cannot be causal: torch's jagged nested-tensor SDPA refuses "
                                 "is_causal=True; use document_attention(..., causal=True) or, on CUDA, "
                                 "backend='varlen'")
    doc_ids = doc_ids.to(q.device)
    offsets, longest = document_offsets(doc_ids)
    real = doc_ids >= 0
    flat = [x.transpose(1, 2)[real] for x in (q, k, v)]                  # (T, H, D): real tokens, row-major
    if len(offsets) == 1:                                                  # no document at all
        return q.new_zeros(*q.shape[:3], v.shape[-1])
    if backend == "varlen":
        try:
            from torch.nn.attention.varlen import varlen_attn
            cu = offsets.to(torch.int32)
            window = (-1, 0) if causal else (-1, -1)
            out = varlen_attn(*flat, cu, cu, longest, longest, scale=scale, window_size=window)
        except (ImportError, RuntimeError, NotImplementedError) as err:
            raise BackendUnavailable(
                f"backend='varlen' (torch.nn.attention.varlen.varlen_attn, FlashAttention-2's kernel) failed on "
                f"{q.device} with {q.dtype}: {type(err).__name__}: {str(err).splitlines()[0][:200]}; it needs CUDA "
                "and fp16 or bf16 (on a CPU use backend='nested')") from err
        return _scatter(out, doc_ids, q)
    nested = [torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2) for x in flat]  # (N, H, j, D)
    with warnings.catch_warnings():   # torch's CPU path builds a strided nested tensor inside and warns about it
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
        out = F.scaled_dot_product_attention(*nested, scale=scale).transpose(1, 2)               # (N, j, H, D_v)
    return _scatter(out.values(), doc_ids, q)


def backend_status(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, *,
                   compile: bool = False) -> dict[str, str | None]:
    """Which packed-attention backends run on ``device`` with ``dtype``: try each on two tiny documents.

    Args:
        device, dtype: where and in which dtype to try.
        compile: also try compiled FlexAttention (slow the first time: a C++ compilation on a CPU).

    Returns:
        ``{"dense": None, "flex": None, "flex_compiled": ..., "varlen": "...", "nested": None}``: None where the
        backend runs and agrees with :func:`document_attention` (fp64: to 1e-10; else to the dtype's tolerance
        of ``torch.testing.assert_close``), else the reason as one line. ``"flex_compiled"`` only with ``compile``.

    Chapter 9, section "Packing instead of padding".
    """
    generator = torch.Generator().manual_seed(0)
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, -1]])
    q, k, v = (torch.randn(1, 2, 6, 4, generator=generator).to(device=device, dtype=dtype) for _ in range(3))
    reference = document_attention(q, k, v, doc_ids)
    tries = {"dense": lambda: reference, "flex": lambda: flex_document_attention(q, k, v, doc_ids),
             "varlen": lambda: varlen_attention(q, k, v, doc_ids, backend="varlen"),
             "nested": lambda: varlen_attention(q, k, v, doc_ids, backend="nested")}
    if compile:
        tries["flex_compiled"] = lambda: flex_document_attention(q, k, v, doc_ids, compile=True)
    status: dict[str, str | None] = {}
    for name, attempt in tries.items():
        try:
            out = attempt()
            tolerance = dict(atol=1e-10, rtol=1e-10) if dtype == torch.float64 else {}
            torch.testing.assert_close(out, reference, **tolerance)
            status[name] = None
        except Exception as err:  # noqa: BLE001 - a report of what fails, whatever it is
            status[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return status


# ----------------------------------------------------------------------------------------------- the flattened batch
def _check_cu_seqlens(cu_seqlens: object) -> Tensor:
    """``cu_seqlens`` as an int64 tensor ``(N + 1,)``: starts at 0, never decreases; else raise."""
    if not isinstance(cu_seqlens, Tensor):
        cu_seqlens = torch.as_tensor(cu_seqlens) if isinstance(cu_seqlens, (list, tuple)) else cu_seqlens
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"cu_seqlens must be an integer tensor (N + 1,), got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must have an integer dtype, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or len(cu_seqlens) == 0:
        raise ValueError(f"cu_seqlens must have shape (N + 1,) with N >= 0, got {tuple(cu_seqlens.shape)}")
    cu = cu_seqlens.long()
    if int(cu[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[:10].tolist()}")
    if bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must never decrease (they are cumulative lengths), got {cu[:10].tolist()}")
    return cu


def cu_seqlens_from_lengths(lengths: Sequence[int] | Tensor) -> Tensor:
    """The cumulative offsets ``cu_seqlens`` of documents laid end to end in one flat row.

    Args:
        lengths: the ``N`` documents' lengths, ints ``>= 0``.

    Returns:
        int32 ``(N + 1,)``: ``[0, l_0, l_0 + l_1, ..., T]``, document ``d`` occupying ``[cu[d], cu[d + 1])``; the
        ``cu_seqlens_q`` / ``cu_seqlens_k`` of FlashAttention's ``flash_attn_varlen_func`` (int32 is what it takes).

    Raises:
        TypeError: not integers. ValueError: a negative length.

    Dao (2023), FlashAttention-2, variable-length interface. Chapter 9, section "The flattened batch".
    """
    lengths = torch.as_tensor(lengths if isinstance(lengths, Tensor) else list(lengths), dtype=None)
    if lengths.numel() == 0:
        lengths = lengths.long()
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be integers, got dtype {lengths.dtype}")
    if bool((lengths < 0).any()):
        raise ValueError(f"lengths must be >= 0, got {lengths[:10].tolist()}")
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    return cu


def position_ids_from_cu_seqlens(cu_seqlens: Tensor) -> Tensor:
    """Position ids that restart at 0 at every document of a flattened batch.

    Args:
        cu_seqlens: integer ``(N + 1,)`` cumulative offsets (:func:`cu_seqlens_from_lengths`).

    Returns:
        int64 ``(T,)``, ``T = cu_seqlens[-1]``: ``0, 1, ..., l_0 - 1, 0, 1, ..., l_1 - 1, ...``, the
        ``position_ids`` that Hugging Face's ``DataCollatorWithFlattening`` returns (shape ``(1, T)`` there).

    Raises:
        TypeError: not an integer tensor. ValueError: not 1-D, empty, not starting at 0, or decreasing.

    Krell et al. (2021), section 4. Chapter 9, section "The flattened batch".
    """
    cu = _check_cu_seqlens(cu_seqlens)
    total = int(cu[-1])
    lengths = cu[1:] - cu[:-1]
    starts = torch.repeat_interleave(cu[:-1], lengths)                    # each token's document start
    return torch.arange(total, dtype=torch.long, device=cu.device) - starts


def cu_seqlens_from_position_ids(position_ids: Tensor) -> Tensor:
    """Recover ``cu_seqlens`` from restarting position ids: a new document begins wherever the position is 0.

    This is how Hugging Face's flash-attention path finds the documents of a ``DataCollatorWithFlattening``
    batch, which carries no mask at all.

    Args:
        position_ids: integer ``(T,)`` or ``(1, T)``, each document ``0, 1, ..., l - 1``.

    Returns:
        int32 ``(N + 1,)``. ``position_ids_from_cu_seqlens`` of it gives ``position_ids`` back.

    Raises:
        TypeError: not an integer tensor. ValueError: more than one row, or positions that do not start at 0 or
            do not count up by one within a document (the message gives the first values).

    Chapter 9, section "The flattened batch".
    """
    if (not isinstance(position_ids, Tensor) or position_ids.dtype.is_floating_point
            or position_ids.dtype == torch.bool):
        raise TypeError("position_ids must be an integer tensor (T,) or (1, T)")
    pos = position_ids.reshape(-1) if position_ids.dim() == 2 and position_ids.shape[0] == 1 else position_ids
    if pos.dim() != 1:
        raise ValueError(f"position_ids must have shape (T,) or (1, T), got {tuple(position_ids.shape)}")
    pos = pos.long()
    ok = (pos[1:] == 0) | (pos[1:] == pos[:-1] + 1)
    if len(pos) and (int(pos[0]) != 0 or not bool(ok.all())):
        raise ValueError(f"position_ids must restart at 0 and count up by one, got {pos[:20].tolist()}")
    starts = (pos == 0).nonzero().squeeze(1)
    cu = torch.zeros(len(starts) + 1, dtype=torch.int32, device=pos.device)
    cu[:-1] = starts
    cu[-1] = len(pos)
    return cu


def flat_document_mask(cu_seqlens: Tensor, *, causal: bool = True) -> Tensor:
    """The block-diagonal (document) mask of a flattened batch, causal within each document by default.

    Args:
        cu_seqlens: integer ``(N + 1,)`` cumulative offsets.
        causal: True = token ``i`` sees token ``j`` of its own document only if ``j <= i`` (a decoder);
            False = the whole document (an encoder).

    Returns:
        bool ``(T, T)``, True = takes part (``F.scaled_dot_product_attention``'s ``attn_mask``): the dense form of
        what a varlen kernel does without any mask. Every row has at least its own token when ``causal``.

    Raises:
        as :func:`position_ids_from_cu_seqlens`.

    Krell et al. (2021), section 4. Chapter 9, section "The flattened batch".
    """
    cu = _check_cu_seqlens(cu_seqlens)
    lengths = cu[1:] - cu[:-1]
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths)   # (T,)
    mask = doc[:, None] == doc[None, :]
    if causal:
        mask &= torch.ones_like(mask).tril()
    return mask


# ----------------------------------------------------------------------------------------------- a language model
#: The label that ``F.cross_entropy`` skips (its default ``ignore_index``, and Hugging Face's).
IGNORE_INDEX = -100


def lm_labels(ids: Tensor, doc_ids: Tensor) -> Tensor:
    """The labels of packed rows for next-token training: the ids, with :data:`IGNORE_INDEX` where nothing is to be
    predicted.

    Args:
        ids: int ``(B, L)`` token ids of packed rows.
        doc_ids: int ``(B, L)`` their document ids (:func:`attnbook.batching.check_document_ids`; -1 = pad).

    Returns:
        int64 ``(B, L)``, aligned with ``ids`` as Hugging Face's ``labels`` are (the loss shifts them: position
        ``t`` predicts ``labels[t + 1]``, :func:`lm_loss`): ``ids`` everywhere except -100 at every pad and at the
        first token of every document. The -100 at a document's first token stops the last token of the document
        before it from being trained to predict it, a pair that never occurs when each document stands alone
        (``DataCollatorWithFlattening`` puts -100 there too).

    Raises:
        TypeError, ValueError: invalid ``doc_ids``, or ``ids`` not an integer tensor of the same shape.

    Krell et al. (2021), section 4. Chapter 9, section "Packing for a language model".
    """
    check_document_ids(doc_ids)
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor (batch, length), got "
                        f"{ids.dtype if isinstance(ids, Tensor) else type(ids).__name__}")
    if ids.shape != doc_ids.shape:
        raise ValueError(f"ids and doc_ids must have one shape, got {tuple(ids.shape)} and {tuple(doc_ids.shape)}")
    doc_ids = doc_ids.to(ids.device)
    start = torch.ones_like(doc_ids, dtype=torch.bool)
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return ids.long().masked_fill(start | (doc_ids < 0), IGNORE_INDEX)


def count_targets(labels: Tensor) -> int:
    """The number of tokens :func:`lm_loss` predicts in ``labels`` ``(B, L)``: labels after the first column that
    are not :data:`IGNORE_INDEX`. Sum it over every micro-batch of an optimizer step and pass the total to
    :func:`lm_loss` as ``n_targets``. Chapter 9, section "Packing for a language model"."""
    if not isinstance(labels, Tensor) or labels.dim() != 2:
        raise ValueError(f"labels must be a (batch, length) tensor, got "
                         f"{tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__}")
    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def lm_loss(logits: Tensor, labels: Tensor, n_targets: int | None = None) -> Tensor:
    """Next-token cross-entropy summed over the predicted tokens and divided by ``n_targets``.

    Args:
        logits: float ``(B, L, V)``; ``logits[:, t]`` predicts ``labels[:, t + 1]``.
        labels: int ``(B, L)`` (:func:`lm_labels`; :data:`IGNORE_INDEX` = not predicted).
        n_targets: the number of predicted tokens to divide by; ``None`` = this batch's (:func:`count_targets`).
            With gradient accumulation pass the total over all micro-batches of the step: then the sum of the
            micro-batches' losses is the mean over every real token of the step, whatever the micro-batches'
            sizes. The mean of per-micro-batch means weighs a token of a short micro-batch more.

    Returns:
        A scalar: ``F.cross_entropy(..., reduction="sum", ignore_index=-100) / n_targets`` (0 when nothing is
        predicted).

    Raises:
        ValueError: shapes that do not match, or ``n_targets`` < 1 while there are targets.

    Chapter 9, section "Packing for a language model".
    """
    if not isinstance(logits, Tensor) or logits.dim() != 3 or logits.shape[:2] != labels.shape:
        raise ValueError(f"logits must be (batch, length, vocab) matching labels {tuple(labels.shape)}, got "
                         f"{tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__}")
    here = count_targets(labels)
    n_targets = here if n_targets is None else int(n_targets)
    if here and n_targets < 1:
        raise ValueError(f"n_targets must be >= 1 when there are targets, got {n_targets}")
    total = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    return total / max(n_targets, 1)


def packed_lm_logits(model: torch.nn.Module, ids: Tensor, doc_ids: Tensor) -> Tensor:
    """Chapter 8's decoder-only language model run on packed rows: the document causal mask and positions that
    restart in every document.

    Args:
        model: an :class:`attnbook.generation.DecoderOnlyLM` (sinusoidal, learned or rotary positions).
        ids: int ``(B, L)`` token ids of packed rows (pads: any id, 0 by convention).
        doc_ids: int ``(B, L)`` their document ids (-1 = pad).

    Returns:
        float ``(B, L, V)``: at each real token, the logits the model gives it when its document is run alone
        (up to rounding); pads' rows are computed but see no key.

    Raises:
        TypeError: ``model`` not a ``DecoderOnlyLM``; invalid ``ids`` or ``doc_ids``. ValueError: shapes.

    Krell et al. (2021), section 4. Chapter 9, section "Packing for a language model".
    """
    from .batching import document_positions
    from .generation import DecoderOnlyLM

    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be an attnbook.generation.DecoderOnlyLM, got {type(model).__name__}")
    check_document_ids(doc_ids)
    if not isinstance(ids, Tensor) or ids.shape != doc_ids.shape:
        raise ValueError(f"ids must be a tensor of doc_ids' shape {tuple(doc_ids.shape)}, got "
                         f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    doc_ids = doc_ids.to(ids.device)
    positions = document_positions(doc_ids)
    x = model.embedding(ids, positions)
    h = model.stack(x, self_mask=document_causal_mask(doc_ids),
                    positions=positions if model.positional == "rope" else None)
    return model.out(h)
