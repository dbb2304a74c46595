"""Self-attention and the Transformer: positional encodings, encoder and decoder layers, a translation model and an
encoder classifier.

Explained in chapter 8, "Self-attention and the Transformer" (``chapters/08_self_attention_transformer``). The pieces:

- positions (section "Positional encodings"): the sinusoidal encoding of Vaswani et al. (2017, section 3.5),
  learned absolute positions, and rotary position embeddings (RoPE, Su et al. 2021), which rotate the queries and
  keys of each head so that their dot product depends only on the *relative* offset. Every function takes the
  ``positions`` explicitly, so that a caller can count them from the first real token under left padding
  (:func:`positions_from_mask`);
- :class:`TransformerEncoderLayer` and :class:`TransformerDecoderLayer` (sections "The encoder layer" and "The
  decoder layer"): multi-head self-attention (causal in the decoder), cross-attention on the encoder's output, the
  position-wise feed-forward layer (Vaswani et al. 2017, eq. 2), residual connections and LayerNorm, after each
  sub-layer (post-LN, the paper's ``LayerNorm(x + Sublayer(x))``, section 3.1) or before it (pre-LN,
  ``x + Sublayer(LayerNorm(x))``, Xiong et al. 2020). The attention is :class:`attnbook.attention.MultiHeadAttention`;
- :class:`TransformerEncoder`/:class:`TransformerDecoder`: stacks of ``N`` layers with an optional final LayerNorm
  (which pre-LN needs: its residual stream is never normalized otherwise);
- :class:`Transformer`: the encoder-decoder translation model (section "A Transformer translator"). It is an
  :class:`attnbook.seq2seq.Seq2Seq`, so chapter 4's :func:`~attnbook.seq2seq.greedy_decode` and
  :func:`~attnbook.seq2seq.beam_search` decode it unchanged;
- :class:`TransformerClassifier`: an encoder classifier for chapter 5's IMDB task, with the padding options the
  chapter compares (section "Padding in a Transformer classifier");
- :func:`copy_to_torch`/:func:`copy_from_torch`: weights to and from ``nn.TransformerEncoderLayer``,
  ``nn.TransformerDecoderLayer``, their stacks and ``nn.Transformer`` (section "Checking against torch").

Layers and arguments are named as in torch (``d_model``, ``nhead``, ``dim_feedforward``, ``dropout``,
``activation``, ``layer_norm_eps``, ``batch_first``, ``norm_first``, ``bias``; ``self_attn``, ``multihead_attn``,
``linear1``, ``linear2``, ``norm1``...), so that the weights map one to one; only ``batch_first=True`` exists.

Mask convention, as everywhere in attnbook (:mod:`attnbook.masking`): a **bool** tensor, **True = takes part**,
the convention of ``F.scaled_dot_product_attention``. A padding mask is ``(batch, length)``, True at real tokens;
an attention mask is broadcastable to ``(batch, n_queries, n_keys)`` (or 4-D, per head), True where query ``i`` may
attend to key ``j``. torch's ``src_key_padding_mask``, ``tgt_key_padding_mask``, ``memory_key_padding_mask``,
``key_padding_mask`` and boolean ``src_mask``/``tgt_mask``/``memory_mask`` have the **opposite** polarity (True =
ignored): pass ``~mask`` to torch. To keep the two apart the book's forward arguments have other names
(``padding_mask``, ``self_mask``, ``cross_mask``...).

Fully padded rows: a query with no valid key (a row whose padding mask is all False, or a fully masked attention
row) gets zero attention weights and a zero attention context in every head, so the attention sub-layer outputs
``out_proj``'s bias; the residual connection, LayerNorm and feed-forward layer then apply as usual, and the layer's
output is finite (never NaN), in training and in eval mode. torch's ``nn.MultiheadAttention`` gives NaN there with
``need_weights=True`` (pytorch issue #160064), in training and in eval mode, and so does its fast path (eval mode
without autograd, also with ``need_weights=False``, and in ``nn.TransformerEncoderLayer``); with
``need_weights=False`` otherwise it gives the zero context, as the book does. ``tests/test_transformer.py`` records
what the pinned torch does.
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention, _check_mask, _check_qkv, causal_mask, scaled_dot_product_attention
from .batching import check_document_ids, document_positions
from .masking import as_integer_tensor, check_bool_mask, check_int, check_lengths_for, check_mask_for, lengths_to_mask
from .models import padding_mask as side_padding_mask
from .seq2seq import EncoderOutput, Seq2Seq, _check_ids, _check_lengths
from .text import PAD_ID

__all__ = [
    "POSITIONAL_KINDS", "ACTIVATIONS", "READOUTS", "POSITION_MODES",
    "sinusoidal_encoding", "SinusoidalPositionalEncoding", "LearnedPositionalEncoding", "rotary_embedding",
    "positions_from_mask", "RotaryMultiHeadAttention", "TransformerEmbedding",
    "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder",
    "TranslationEncoder", "TranslationDecoder", "TransformerDecoderState", "Transformer",
    "TransformerClassifier", "pad_attention_mass", "copy_to_torch", "copy_from_torch",
]

#: Positional information: added sinusoids, added learned vectors, rotary embeddings in self-attention, or none.
POSITIONAL_KINDS = ("sinusoidal", "learned", "rope", "none")
#: The feed-forward activations (Vaswani et al. use ReLU; GELU, Hendrycks & Gimpel 2016, as in BERT).
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
#: Readouts of :class:`TransformerClassifier`: the first real token's output, or the masked mean over real tokens.
READOUTS = ("first", "mean")
#: Positions of :class:`TransformerClassifier`: the array index, or counted from the first real token.
POSITION_MODES = ("index", "first_token")


# ----------------------------------------------------------------------------------------------- checks
def _check_states(x: object, name: str, d_model: int) -> Tensor:
    """``x`` must be a floating ``(batch, length, d_model)`` tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (batch, length, d_model={d_model}), got {tuple(x.shape)} "
                         "(only batch_first=True exists)")
    return x


def _check_positions(positions: object, batch: int, length: int, name: str = "positions") -> Tensor:
    """Non-negative integer positions of shape ``(length,)`` or ``(batch, length)``."""
    positions = as_integer_tensor(positions, name)
    if tuple(positions.shape) not in ((length,), (batch, length)):
        raise ValueError(f"{name} must have shape (length,) = ({length},) or (batch, length) = ({batch}, {length}), "
                         f"got {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"{name} must be non-negative, got min {int(positions.min())}")
    return positions


def _padding_part(states: Tensor, mask: object, name: str, states_name: str) -> Tensor | None:
    """A ``(batch, n_keys)`` padding mask (True = real token) as ``(batch, 1, 1, n_keys)``, or None."""
    if mask is None:
        return None
    check_mask_for(states, mask, name, states_name=states_name)
    return mask[:, None, None, :]


def _attention_part(mask: object, name: str, batch: int, nhead: int, n_q: int, n_k: int) -> Tensor | None:
    """An attention mask broadcastable to ``(batch, n_q, n_k)`` (or 4-D ``(batch, nhead, n_q, n_k)``), as a mask
    that broadcasts against 4-D ``(batch, nhead, n_q, n_k)``; or None."""
    if mask is None:
        return None
    check_bool_mask(mask, name)
    target = (batch, nhead, n_q, n_k) if mask.dim() == 4 else (batch, n_q, n_k)
    try:
        ok = mask.dim() <= 4 and torch.broadcast_shapes(mask.shape, target) == torch.Size(target)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {tuple(mask.shape)} does not broadcast to (batch, n_queries, n_keys) = "
                         f"{(batch, n_q, n_k)} (or, 4-D, to (batch, nhead, n_queries, n_keys) = "
                         f"{(batch, nhead, n_q, n_k)})")
    return mask.unsqueeze(-3) if mask.dim() == 3 else mask


def _and(*masks: Tensor | None) -> Tensor | None:
    """The conjunction of the given masks (None = no restriction)."""
    result = None
    for m in masks:
        if m is not None:
            result = m if result is None else result & m
    return result


def _check_choice(value: object, name: str, choices: tuple[str, ...] | dict) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def _check_dropout(p: object) -> float:
    try:
        value = None if isinstance(p, bool) else float(p)
    except (TypeError, ValueError):
        value = None
    if value is None or not 0.0 <= value < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1), got {p!r}")
    return value


# ----------------------------------------------------------------------------------------------- positions
def sinusoidal_encoding(positions: Tensor, d_model: int, *, base: float = 10000.0,
                        dtype: torch.dtype = torch.float32) -> Tensor:
    """The sinusoidal positional encoding ``PE(pos, 2i) = sin(pos / base^(2i/d))``, ``PE(pos, 2i+1) =
    cos(pos / base^(2i/d))``.

    Args:
        positions: integer tensor of any shape ``(...)`` (token positions, >= 0); floats are refused, not rounded.
        d_model: ``d``, the encoding size; even and positive.
        base: the wavelength base (10000 in the paper): wavelengths run from ``2 pi`` to ``base * 2 pi``.
        dtype: the result's dtype. The angles are computed in fp64 and then cast.

    Returns:
        ``(..., d_model)`` encodings, on the device of ``positions``; every entry lies in ``[-1, 1]``.

    Raises:
        TypeError: ``positions`` is not of an integer dtype, ``d_model`` not an int.
        ValueError: ``d_model`` is odd or not positive, a position is negative, ``base`` is not > 1.

    Vaswani et al. (2017), section 3.5. ``PE(pos + k)`` is a linear function (a rotation) of ``PE(pos)`` for every
    offset ``k``, the property the paper gives for choosing it. Chapter 8, section "Positional encodings".
    """
    positions = as_integer_tensor(positions, "positions")
    d_model = check_int(d_model, "d_model", minimum=1)
    if d_model % 2:
        raise ValueError(f"d_model must be even for the sinusoidal encoding (sin/cos pairs), got {d_model}")
    if not float(base) > 1.0:
        raise ValueError(f"base must be > 1, got {base}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be non-negative, got min {int(positions.min())}")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)
    angles = positions.to(torch.float64).unsqueeze(-1) / float(base) ** (two_i / d_model)   # (..., d/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2).to(dtype)      # interleaved sin, cos


class SinusoidalPositionalEncoding(nn.Module):
    """Adds :func:`sinusoidal_encoding` to a batch of embeddings (no parameters, no length limit).

    Args:
        d_model: the embedding size, even.
        base: the wavelength base (10000).

    Call: ``(x (batch, length, d_model) float, positions=None)`` -> ``x + PE(positions)``, same shape and dtype.
    ``positions``: int ``(length,)`` or ``(batch, length)``, >= 0; ``None`` = ``0, 1, ..., length - 1``.

    Raises:
        ValueError, TypeError: bad sizes, shapes or dtypes (the messages name the argument).

    Vaswani et al. (2017), section 3.5. Chapter 8, section "Positional encodings".
    """

    def __init__(self, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        sinusoidal_encoding(torch.zeros(0, dtype=torch.long), d_model, base=base)   # validates d_model, base
        self.d_model, self.base = d_model, float(base)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        _check_states(x, "x", self.d_model)
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        positions = _check_positions(positions, x.shape[0], x.shape[1])
        return x + sinusoidal_encoding(positions.to(x.device), self.d_model, base=self.base, dtype=x.dtype)


class LearnedPositionalEncoding(nn.Module):
    """Adds a learned vector per absolute position, ``x + P[positions]`` (Gehring et al. 2017; BERT, GPT).

    Args:
        max_len: the number of positions, ``0 .. max_len - 1``; a longer input is an error (no extrapolation).
        d_model: the embedding size.

    The table ``embedding.weight`` ``(max_len, d_model)`` starts as ``N(0, 0.02^2)`` (BERT's initializer range).

    Call: ``(x (batch, length, d_model) float, positions=None)`` -> ``x + P[positions]``; ``positions`` as in
    :class:`SinusoidalPositionalEncoding`.

    Raises:
        ValueError: a position ``>= max_len`` (the message gives both), bad shapes; TypeError: non-integer
            positions.

    Vaswani et al. (2017, section 3.5 and table 3, row E) found learned positions about as good as sinusoids.
    Chapter 8, section "Positional encodings".
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = check_int(max_len, "max_len", minimum=1)
        self.d_model = check_int(d_model, "d_model", minimum=1)
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        _check_states(x, "x", self.d_model)
        if positions is None:
            positions = torch.arange(x.shape[1], device=x.device)
        positions = _check_positions(positions, x.shape[0], x.shape[1])
        if positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(f"positions must be < max_len={self.max_len} for learned positions, got max "
                             f"{int(positions.max())}")
        return x + self.embedding(positions.to(x.device)).to(x.dtype)


def rotary_embedding(x: Tensor, positions: Tensor, *, base: float = 10000.0) -> Tensor:
    """Rotary position embedding: rotate each pair ``(x_2i, x_2i+1)`` by the angle ``pos * theta_i``, with
    ``theta_i = base^(-2i/d)``.

    Args:
        x: queries or keys of one or more heads, ``(..., n, d)`` float with ``d`` even (e.g. ``(batch, heads, n,
            head_dim)``).
        positions: integer tensor, >= 0, broadcastable to ``x.shape[:-1]`` (e.g. ``(n,)``, or ``(batch, 1, n)`` for
            ``(batch, heads, n, d)``).
        base: ``10000`` as in the paper.

    Returns:
        The rotated ``x``, same shape and dtype. A rotation preserves norms: ``|R x| = |x|``. Since ``R_m^T R_n =
        R_(n-m)``, the score ``(R_m q) . (R_n k) = q . R_(n-m) k`` depends on the positions only through the offset
        ``n - m`` (Su et al. 2021, eq. 16). Angles are computed in fp64, the rotation in fp32 for fp16/bf16 inputs.

    Raises:
        TypeError: ``x`` not a floating tensor, ``positions`` not of an integer dtype.
        ValueError: ``d`` odd, ``positions`` does not broadcast to ``x.shape[:-1]`` or is negative.

    Su et al. (2021), RoFormer, eq. 13-14 and 34 (the pairs are adjacent dimensions, as in the paper; LLaMA-style
    code pairs ``i`` with ``i + d/2``, a fixed permutation of the same thing). Chapter 8, section "Rotary position
    embeddings".
    """
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating torch.Tensor, got {type(x).__name__}"
                        f"{' of dtype ' + str(x.dtype) if isinstance(x, Tensor) else ''}")
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x must have an even last dim (pairs of dimensions are rotated), got shape {tuple(x.shape)}")
    positions = as_integer_tensor(positions, "positions")
    try:
        ok = torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"positions of shape {tuple(positions.shape)} does not broadcast to x.shape[:-1] = "
                         f"{tuple(x.shape[:-1])}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be non-negative, got min {int(positions.min())}")
    d = x.shape[-1]
    theta = float(base) ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)   # (d/2,)
    angles = positions.to(device=x.device, dtype=torch.float64).unsqueeze(-1) * theta            # (..., d/2)
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    cos, sin = angles.cos().to(compute), angles.sin().to(compute)
    pairs = x.to(compute).unflatten(-1, (d // 2, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def positions_from_mask(mask: Tensor) -> Tensor:
    """Positions counted from the first real token: ``cumsum(mask) - 1``, clamped at 0.

    Args:
        mask: bool ``(..., length)``; True = a real token (the attnbook convention).

    Returns:
        int64 ``(..., length)``: the real tokens get ``0, 1, ..., L - 1`` in order (whatever the padding side, and
        also when pads sit between them); pads before the first real token get 0; pads after the last real token
        get ``L - 1``, the last real token's position. With right (post) padding the real tokens' positions are
        the array indices ``0 .. L - 1``; with left (pre) padding they are the indices minus the number of leading
        pads, so a sentence gets the same positions however much padding precedes it. A row without real tokens
        is all 0.

    Raises:
        TypeError: ``mask`` is not a bool tensor. ValueError: ``mask`` is 0-dimensional.

    Example: ``[[F, F, T, T, T]]`` -> ``[[0, 0, 0, 1, 2]]``; ``[[T, T, F]]`` -> ``[[0, 1, 1]]``. The same rule as
    Hugging Face's ``position_ids = attention_mask.cumsum(-1) - 1`` for left-padded generation. Chapter 8, section
    "Padding in a Transformer classifier".
    """
    check_bool_mask(mask)
    if mask.dim() == 0:
        raise ValueError("mask must have at least one dimension (length)")
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


class RotaryMultiHeadAttention(MultiHeadAttention):
    """:class:`attnbook.attention.MultiHeadAttention` with rotary position embeddings on each head's queries and
    keys (after the projections, before the scores); values are not rotated.

    Args:
        embed_dim, num_heads, dropout, bias, kdim, vdim, need_weights: as in ``MultiHeadAttention``; the head size
            ``embed_dim / num_heads`` must be even.
        rope_base: the base of :func:`rotary_embedding` (10000).

    Call: ``(queries (batch, n_queries, embed_dim), keys, values, mask=None, *, query_positions, key_positions=None)``
    -> ``(batch, n_queries, embed_dim)``. Positions: int ``(n,)`` or ``(batch, n)``, >= 0; ``key_positions=None``
    = ``query_positions`` (self-attention). ``mask``: bool, True = takes part, as in ``MultiHeadAttention``.

    Raises:
        ValueError: an odd head size; positions missing, of the wrong shape or negative; shapes and mask as in
            ``MultiHeadAttention``. TypeError: a non-bool mask, non-integer positions.

    Su et al. (2021), section 3.4.2 (RoPE in self-attention). Chapter 8, section "Rotary position embeddings".
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 kdim: int | None = None, vdim: int | None = None, need_weights: bool = True,
                 rope_base: float = 10000.0) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias, kdim, vdim, need_weights)
        if self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head size, got embed_dim={embed_dim} / num_heads="
                             f"{num_heads} = {self.head_dim}")
        self.rope_base = float(rope_base)

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None, *,
                query_positions: Tensor | None = None, key_positions: Tensor | None = None) -> Tensor:
        if query_positions is None:
            raise ValueError("RotaryMultiHeadAttention needs query_positions ((n_queries,) or (batch, n_queries) "
                             "integer positions)")
        key_positions = query_positions if key_positions is None else key_positions
        _check_qkv(queries, keys, values, same_d=False)
        for name, x, size in (("queries", queries, self.embed_dim), ("keys", keys, self.kdim),
                              ("values", values, self.vdim)):
            if x.dim() != 3 or x.shape[-1] != size:
                raise ValueError(f"{name} must have shape (batch, n, {size}), got {tuple(x.shape)}")
        q_pos = _check_positions(query_positions, queries.shape[0], queries.shape[1], "query_positions")
        k_pos = _check_positions(key_positions, keys.shape[0], keys.shape[1], "key_positions")
        if mask is not None and isinstance(mask, Tensor) and mask.dim() < 4:
            _check_mask(mask, (max(queries.shape[0], keys.shape[0]), queries.shape[1], keys.shape[1]))
            mask = mask.unsqueeze(-3)
        heads = lambda p: p if p.dim() == 1 else p[:, None, :]   # broadcast over (batch, heads, n)
        q = rotary_embedding(self._split(self.q_proj(queries)), heads(q_pos), base=self.rope_base)
        k = rotary_embedding(self._split(self.k_proj(keys)), heads(k_pos), base=self.rope_base)
        v = self._split(self.v_proj(values))
        result = scaled_dot_product_attention(q, k, v, mask, dropout_p=self.dropout if self.training else 0.0,
                                              return_weights=self.need_weights)
        if self.need_weights:
            result, weights = result
            self.attention_weights = weights.detach()
        else:
            self.attention_weights = None
        return self.out_proj(result.transpose(1, 2).flatten(-2))


# ----------------------------------------------------------------------------------------------- layers
class _Layer(nn.Module):
    """What the encoder and decoder layer share: validation, the feed-forward block, the configuration."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, activation: str,
                 layer_norm_eps: float, batch_first: bool, norm_first: bool, bias: bool, rotary: bool,
                 n_norms: int) -> None:
        super().__init__()
        d_model = check_int(d_model, "d_model", minimum=1)
        nhead = check_int(nhead, "nhead", minimum=1)
        dim_feedforward = check_int(dim_feedforward, "dim_feedforward", minimum=1)
        if d_model % nhead:
            raise ValueError(f"d_model must be divisible by nhead (each head has size d_model / nhead), got "
                             f"d_model={d_model}, nhead={nhead}")
        dropout = _check_dropout(dropout)
        _check_choice(activation, "activation", ACTIVATIONS)
        if batch_first is not True:
            raise ValueError(f"attnbook's layers are batch-first only (batch, length, d_model); got batch_first="
                             f"{batch_first!r}")
        if not float(layer_norm_eps) > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {layer_norm_eps}")
        if rotary and (d_model // nhead) % 2:
            raise ValueError(f"rotary embeddings need an even head size, got d_model={d_model} / nhead={nhead} = "
                             f"{d_model // nhead}")
        self.d_model, self.nhead, self.dim_feedforward = d_model, nhead, dim_feedforward
        self.activation, self.norm_first, self.rotary = activation, bool(norm_first), bool(rotary)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = nn.Dropout(dropout)                 # inside the feed-forward block, as torch names it
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias)
        for i in range(1, n_norms + 1):
            setattr(self, f"norm{i}", nn.LayerNorm(d_model, eps=float(layer_norm_eps), bias=bias))
            setattr(self, f"dropout{i}", nn.Dropout(dropout))

    def _attention(self, need_weights: bool) -> MultiHeadAttention:
        cls = RotaryMultiHeadAttention if self.rotary else MultiHeadAttention
        return cls(self.d_model, self.nhead, dropout=self.dropout.p, bias=self.linear1.bias is not None,
                   need_weights=need_weights)

    @property
    def layer_norm_eps(self) -> float:
        return self.norm1.eps

    @property
    def bias(self) -> bool:
        return self.linear1.bias is not None

    def _ff_block(self, x: Tensor) -> Tensor:
        """``FFN(x) = W_2 act(W_1 x + b_1) + b_2`` (Vaswani et al. 2017, eq. 2), with dropout after ``act`` and on
        the output."""
        last_dropout = self.dropout3 if isinstance(self, TransformerDecoderLayer) else self.dropout2
        return last_dropout(self.linear2(self.dropout(ACTIVATIONS[self.activation](self.linear1(x)))))

    def _sa_block(self, x: Tensor, mask: Tensor | None, positions: Tensor | None) -> Tensor:
        if self.rotary:
            return self.dropout1(self.self_attn(x, x, x, mask, query_positions=positions))
        return self.dropout1(self.self_attn(x, x, x, mask))

    def _check_positions_arg(self, positions: object, x: Tensor, name: str = "positions") -> Tensor | None:
        if not self.rotary:
            if positions is not None:
                raise ValueError(f"{name} is used by rotary layers only (rotary=False here); add absolute "
                                 "positions to the embeddings instead")
            return None
        if positions is None:
            raise ValueError(f"a rotary layer needs {name}: integer (length,) or (batch, length) positions")
        return _check_positions(positions, x.shape[0], x.shape[1], name).to(x.device)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, nhead={self.nhead}, dim_feedforward={self.dim_feedforward}, "
                f"activation={self.activation!r}, norm_first={self.norm_first}, rotary={self.rotary}")


class TransformerEncoderLayer(_Layer):
    """One encoder layer: multi-head self-attention and a position-wise feed-forward layer, each with a residual
    connection and LayerNorm.

    Args:
        d_model: model size; divisible by ``nhead``.
        nhead: number of heads ``h``; each has size ``d_model / h``.
        dim_feedforward: the inner size ``d_ff`` of the feed-forward layer (2048 in the paper for ``d_model=512``).
        dropout: on the attention weights, inside the feed-forward layer, and on each sub-layer's output before
            the residual sum (Vaswani et al. 2017, section 5.4), in training mode only.
        activation: ``"relu"`` (the paper) or ``"gelu"``.
        layer_norm_eps: LayerNorm's epsilon.
        batch_first: must be True (inputs are ``(batch, length, d_model)``); kept for torch's signature.
        norm_first: False = post-LN, ``x = LayerNorm(x + Sublayer(x))`` (Vaswani et al. 2017, section 3.1);
            True = pre-LN, ``x = x + Sublayer(LayerNorm(x))`` (Xiong et al. 2020), which trains without warm-up but
            needs a final LayerNorm after the stack.
        bias: biases in the linear layers and LayerNorms.
        rotary: apply rotary position embeddings in the self-attention (:class:`RotaryMultiHeadAttention`); the
            call then needs ``positions``.
        need_weights: keep the attention weights of the last call in ``self_attn.attention_weights`` ``(batch,
            nhead, length, length)`` (the explicit path); False = torch's fused kernel, faster.

    Call: ``layer(src (batch, length, d_model) float, *, padding_mask=None, self_mask=None, positions=None)`` ->
    ``(batch, length, d_model)``, same dtype.

    - ``padding_mask``: bool ``(batch, length)``, True = a real token; pads are masked as *keys* (their outputs as
      queries are computed but meaningless). torch's ``src_key_padding_mask`` is its negation.
    - ``self_mask``: bool, broadcastable to ``(batch, length, length)`` or 4-D ``(batch, nhead, length, length)``;
      True = query ``i`` may attend to key ``j``. torch's boolean ``src_mask`` is its negation. Both masks are
      combined with ``&``.
    - ``positions``: int ``(length,)`` or ``(batch, length)``, only (and always) for ``rotary=True``.

    A query with no valid key gets a zero attention context (see the module docstring): its output is finite.

    Equals ``nn.TransformerEncoderLayer(..., batch_first=True)`` with the same weights (:func:`copy_to_torch`) in
    eval mode, given ``src_key_padding_mask=~padding_mask`` and ``src_mask=~self_mask``.

    Raises:
        ValueError: ``d_model`` not divisible by ``nhead``; a size not positive; ``dropout`` outside ``[0, 1)``;
            an unknown ``activation``; ``batch_first=False``; an odd head size with ``rotary``; at the call, a
            shape that does not match (the messages give the shapes), ``positions`` given to a non-rotary layer or
            missing for a rotary one.
        TypeError: a non-float ``src``, a non-bool mask, non-integer positions or sizes.

    Vaswani et al. (2017), sections 3.1-3.3 and 5.4; Xiong et al. (2020) for ``norm_first=True``. Chapter 8,
    section "The encoder layer" (post-LN and pre-LN).
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True, *, rotary: bool = False,
                 need_weights: bool = False) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, rotary, n_norms=2)
        self.self_attn = self._attention(need_weights)


    def forward(self, src: Tensor, *, padding_mask: Tensor | None = None, self_mask: Tensor | None = None,
                positions: Tensor | None = None) -> Tensor:
        _check_states(src, "src", self.d_model)
        batch, n = src.shape[:2]
        mask = _and(_padding_part(src, padding_mask, "padding_mask", "src"),
                    _attention_part(self_mask, "self_mask", batch, self.nhead, n, n))
        positions = self._check_positions_arg(positions, src)
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), mask, positions)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, mask, positions))
            x = self.norm2(x + self._ff_block(x))
        return x


class TransformerDecoderLayer(_Layer):
    """One decoder layer: (causal) self-attention, cross-attention on the encoder's output ("memory"), and the
    feed-forward layer, each with a residual connection and LayerNorm.

    Args:
        d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first, norm_first, bias,
        need_weights: as in :class:`TransformerEncoderLayer` (``need_weights`` for both attentions).
        rotary: rotary position embeddings in the *self*-attention (the cross-attention compares target and source
            positions, which RoPE does not define; it stays position-free).

    Call: ``layer(tgt (batch, tgt_len, d_model), memory (batch, src_len, d_model), *, causal=True,
    tgt_padding_mask=None, memory_padding_mask=None, self_mask=None, cross_mask=None, positions=None)`` ->
    ``(batch, tgt_len, d_model)``.

    - ``causal``: True = target position ``i`` attends to ``j <= i`` only (Vaswani et al. 2017, section 3.2.3;
      :func:`attnbook.attention.causal_mask`); torch's equivalent is ``tgt_mask=~causal_mask(tgt_len)`` or
      ``nn.Transformer.generate_square_subsequent_mask(tgt_len)``.
    - ``tgt_padding_mask``: bool ``(batch, tgt_len)``, True = a real target token (torch:
      ``tgt_key_padding_mask=~tgt_padding_mask``). With right padding and ``causal`` it changes no real position.
    - ``memory_padding_mask``: bool ``(batch, src_len)``, True = a real source token (torch:
      ``memory_key_padding_mask=~memory_padding_mask``).
    - ``self_mask``: bool, broadcastable to ``(batch, tgt_len, tgt_len)`` (or 4-D per head), combined with the
      causal and padding masks by ``&`` (torch: ``tgt_mask=~(...)``); ``cross_mask``: broadcastable to ``(batch,
      tgt_len, src_len)`` (or 4-D), combined with ``memory_padding_mask`` (torch: ``memory_mask=~cross_mask``).
    - ``positions``: target positions, int ``(tgt_len,)`` or ``(batch, tgt_len)``, only for ``rotary=True``.

    A target query whose source row is fully padded gets a zero cross-attention context (finite output).

    Equals ``nn.TransformerDecoderLayer(..., batch_first=True)`` with the same weights in eval mode.

    Raises:
        ValueError, TypeError: as :class:`TransformerEncoderLayer`; also ``memory`` with another batch size or
            ``d_model``.

    Vaswani et al. (2017), sections 3.1, 3.2.3 and 5.4; Xiong et al. (2020) for ``norm_first=True``. Chapter 8,
    section "The decoder layer".
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str = "relu", layer_norm_eps: float = 1e-5, batch_first: bool = True,
                 norm_first: bool = False, bias: bool = True, *, rotary: bool = False,
                 need_weights: bool = False) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, rotary, n_norms=3)
        self.self_attn = self._attention(need_weights)
        self.multihead_attn = MultiHeadAttention(d_model, nhead, dropout=self.dropout.p, bias=bias,
                                                 need_weights=need_weights)


    def _mha_block(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        return self.dropout2(self.multihead_attn(x, memory, memory, mask))

    def forward(self, tgt: Tensor, memory: Tensor, *, causal: bool = True, tgt_padding_mask: Tensor | None = None,
                memory_padding_mask: Tensor | None = None, self_mask: Tensor | None = None,
                cross_mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        _check_states(tgt, "tgt", self.d_model)
        _check_states(memory, "memory", self.d_model)
        if memory.shape[0] != tgt.shape[0]:
            raise ValueError(f"tgt and memory must have the same batch size, got tgt {tuple(tgt.shape)} and memory "
                             f"{tuple(memory.shape)}")
        batch, n, s = tgt.shape[0], tgt.shape[1], memory.shape[1]
        self_m = _and(causal_mask(n, device=tgt.device) if causal else None,
                      _padding_part(tgt, tgt_padding_mask, "tgt_padding_mask", "tgt"),
                      _attention_part(self_mask, "self_mask", batch, self.nhead, n, n))
        cross_m = _and(_padding_part(memory, memory_padding_mask, "memory_padding_mask", "memory"),
                       _attention_part(cross_mask, "cross_mask", batch, self.nhead, n, s))
        positions = self._check_positions_arg(positions, tgt)
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), self_m, positions)
            x = x + self._mha_block(self.norm2(x), memory, cross_m)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, self_m, positions))
            x = self.norm2(x + self._mha_block(x, memory, cross_m))
            x = self.norm3(x + self._ff_block(x))
        return x


# ----------------------------------------------------------------------------------------------- stacks
def _check_stack_args(layer: object, cls: type, num_layers: object, norm: object) -> int:
    if not isinstance(layer, cls):
        raise TypeError(f"expected an attnbook.transformer.{cls.__name__}, got {type(layer).__name__}")
    num_layers = check_int(num_layers, "num_layers", minimum=1)
    if norm is not None and not isinstance(norm, nn.LayerNorm):
        raise TypeError(f"norm must be an nn.LayerNorm or None, got {type(norm).__name__}")
    return num_layers


class TransformerEncoder(nn.Module):
    """A stack of ``num_layers`` copies of ``encoder_layer`` (deep copies, as torch makes: they start equal), and an
    optional final LayerNorm.

    Args:
        encoder_layer: a :class:`TransformerEncoderLayer`, the template.
        num_layers: ``N`` (6 in the paper), >= 1.
        norm: a final ``nn.LayerNorm(d_model)`` or None. Pre-LN stacks need one (their output is otherwise an
            unnormalized residual sum); ``nn.Transformer`` puts one after post-LN stacks too.

    Call: ``(src (batch, length, d_model), *, padding_mask=None, self_mask=None, positions=None)`` ->
    ``(batch, length, d_model)``; the arguments go to every layer (see :class:`TransformerEncoderLayer`: masks are
    bool, True = takes part; torch's are the negation).

    Equals ``nn.TransformerEncoder`` with the same weights (:func:`copy_to_torch`) in eval mode.

    Raises:
        TypeError: ``encoder_layer`` is not a :class:`TransformerEncoderLayer`, ``norm`` not a LayerNorm.
        ValueError: ``num_layers < 1``; call errors as in the layer.

    Vaswani et al. (2017), section 3.1. Chapter 8, section "The encoder layer".
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: nn.LayerNorm | None = None
                 ) -> None:
        super().__init__()
        self.num_layers = _check_stack_args(encoder_layer, TransformerEncoderLayer, num_layers, norm)
        self.layers = nn.ModuleList(copy.deepcopy(encoder_layer) for _ in range(self.num_layers))
        self.norm = norm

    def forward(self, src: Tensor, *, padding_mask: Tensor | None = None, self_mask: Tensor | None = None,
                positions: Tensor | None = None) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, padding_mask=padding_mask, self_mask=self_mask, positions=positions)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(nn.Module):
    """A stack of ``num_layers`` copies of ``decoder_layer`` and an optional final LayerNorm.

    Args:
        decoder_layer: a :class:`TransformerDecoderLayer`, the template.
        num_layers, norm: as in :class:`TransformerEncoder`.

    Call: ``(tgt, memory, *, causal=True, tgt_padding_mask=None, memory_padding_mask=None, self_mask=None,
    cross_mask=None, positions=None)`` -> ``(batch, tgt_len, d_model)``; every layer attends to the same
    ``memory`` (see :class:`TransformerDecoderLayer`; masks are bool, True = takes part).

    Equals ``nn.TransformerDecoder`` with the same weights in eval mode.

    Raises:
        TypeError, ValueError: as :class:`TransformerEncoder`.

    Vaswani et al. (2017), section 3.1. Chapter 8, section "The decoder layer".
    """

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: nn.LayerNorm | None = None
                 ) -> None:
        super().__init__()
        self.num_layers = _check_stack_args(decoder_layer, TransformerDecoderLayer, num_layers, norm)
        self.layers = nn.ModuleList(copy.deepcopy(decoder_layer) for _ in range(self.num_layers))
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, *, causal: bool = True, tgt_padding_mask: Tensor | None = None,
                memory_padding_mask: Tensor | None = None, self_mask: Tensor | None = None,
                cross_mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, causal=causal, tgt_padding_mask=tgt_padding_mask,
                      memory_padding_mask=memory_padding_mask, self_mask=self_mask, cross_mask=cross_mask,
                      positions=positions)
        return x if self.norm is None else self.norm(x)


# ----------------------------------------------------------------------------------------------- models
def _reset_parameters(module: nn.Module) -> None:
    """Xavier-uniform initialization of every matrix, as ``nn.Transformer._reset_parameters`` does."""
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)


class TransformerEmbedding(nn.Module):
    """Token embedding scaled by ``sqrt(d_model)``, plus the positional encoding, then dropout.

    Args:
        vocab_size: number of token ids; ``padding_idx`` has a zero embedding.
        d_model: model size.
        positional: one of :data:`POSITIONAL_KINDS`: ``"sinusoidal"`` and ``"learned"`` add their encoding here;
            ``"rope"`` and ``"none"`` add nothing (rotary positions enter the attention instead).
        max_len: the number of learned positions (``"learned"`` only).
        dropout: on the sum (Vaswani et al. 2017, section 5.4).
        padding_idx: the pad id (``<pad>`` = 0).

    The embedding starts as ``N(0, 1 / d_model)``, so that the scaled embedding has unit variance per dimension,
    comparable to the sinusoids.

    Call: ``(ids (batch, length) int64, positions=None)`` -> ``(batch, length, d_model)`` in the embedding's dtype;
    ``positions`` int ``(length,)`` or ``(batch, length)`` (``None`` = ``0 .. length - 1``).

    Raises:
        ValueError: unknown ``positional``; bad sizes; TypeError/ValueError for bad ids or positions.

    Vaswani et al. (2017), sections 3.4 and 3.5. Chapter 8, section "Positional encodings".
    """

    def __init__(self, vocab_size: int, d_model: int, positional: str = "sinusoidal", max_len: int = 512,
                 dropout: float = 0.1, padding_idx: int = PAD_ID) -> None:
        super().__init__()
        _check_choice(positional, "positional", POSITIONAL_KINDS)
        vocab_size = check_int(vocab_size, "vocab_size", minimum=1)
        self.d_model = check_int(d_model, "d_model", minimum=1)
        self.kind = positional
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        nn.init.normal_(self.embedding.weight, std=d_model ** -0.5)
        with torch.no_grad():
            self.embedding.weight[padding_idx].zero_()
        self.positional: nn.Module | None = (
            SinusoidalPositionalEncoding(d_model) if positional == "sinusoidal"
            else LearnedPositionalEncoding(max_len, d_model) if positional == "learned" else None)
        self.dropout = nn.Dropout(_check_dropout(dropout))

    def forward(self, ids: Tensor, positions: Tensor | None = None) -> Tensor:
        _check_ids("ids", ids)
        x = self.embedding(ids) * math.sqrt(self.d_model)
        if self.positional is not None:
            x = self.positional(x, positions)
        elif positions is not None:
            _check_positions(positions, ids.shape[0], ids.shape[1])
        return self.dropout(x)


def _stack_kwargs(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, norm_first, bias,
                  positional) -> dict:
    return dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                activation=activation, layer_norm_eps=layer_norm_eps, norm_first=norm_first, bias=bias,
                rotary=positional == "rope")


def _final_norm(final_norm: bool | None, norm_first: bool, d_model: int, eps: float, bias: bool
                ) -> nn.LayerNorm | None:
    return nn.LayerNorm(d_model, eps=eps, bias=bias) if (norm_first if final_norm is None else final_norm) else None


class TranslationEncoder(nn.Module):
    """The source side of :class:`Transformer`: :class:`TransformerEmbedding` + :class:`TransformerEncoder`.

    Call: ``(src (batch, src_len) int64, padding_mask (batch, src_len) bool)`` -> memory ``(batch, src_len,
    d_model)``. ``padding_mask``: True = a real token (right padding; positions are the indices ``0, 1, ...``).
    Attributes: ``embedding``, ``stack`` (the :class:`TransformerEncoder`), ``output_size = d_model``.

    Chapter 8, section "A Transformer translator".
    """

    def __init__(self, vocab_size: int, d_model: int, nhead: int, num_layers: int, dim_feedforward: int,
                 dropout: float, activation: str, layer_norm_eps: float, norm_first: bool, bias: bool,
                 positional: str, max_len: int, final_norm: bool | None) -> None:
        super().__init__()
        self.embedding = TransformerEmbedding(vocab_size, d_model, positional, max_len, dropout)
        layer = TransformerEncoderLayer(**_stack_kwargs(d_model, nhead, dim_feedforward, dropout, activation,
                                                        layer_norm_eps, norm_first, bias, positional))
        self.stack = TransformerEncoder(layer, num_layers,
                                        _final_norm(final_norm, norm_first, d_model, layer_norm_eps, bias))
        self.output_size = d_model

    def forward(self, src: Tensor, padding_mask: Tensor) -> Tensor:
        positions = torch.arange(src.shape[1], device=src.device)
        x = self.embedding(src, positions)
        return self.stack(x, padding_mask=padding_mask, positions=positions if self.embedding.kind == "rope" else None)


class TransformerDecoderState(NamedTuple):
    """What :class:`TranslationDecoder` carries between decoding steps: ``tokens`` ``(batch, t)`` int64, the target
    prefix fed so far (``<bos>`` and the tokens chosen), from which every step recomputes the decoder (no key/value
    cache: simple and exact, ``O(t^2)`` per step; :func:`attnbook.generation.with_kv_cache` decodes the same model
    with one)."""

    tokens: Tensor

    def index_select(self, index: Tensor) -> "TransformerDecoderState":
        """The prefixes of rows ``index`` (beam search follows the surviving hypotheses)."""
        return TransformerDecoderState(self.tokens.index_select(0, index))


class TranslationDecoder(nn.Module):
    """The target side of :class:`Transformer`: :class:`TransformerEmbedding`, a causal :class:`TransformerDecoder`
    and the output layer, with the decoder interface of :mod:`attnbook.seq2seq`.

    Calls:

    - ``decoder(tgt_in (batch, tgt_len) int64, state, memory (batch, src_len, d_model), mask (batch, 1, src_len)
      bool)`` -> ``(logits (batch, tgt_len, vocab_size), weights (batch, tgt_len, src_len))``: teacher forcing on
      the target ``state.tokens + tgt_in`` (``state`` from :meth:`initial_state` holds no tokens), logits of the
      ``tgt_in`` positions. ``mask``: True = a real source token. ``weights``: the last layer's cross-attention,
      averaged over the heads (detached); pads get exactly 0.
    - :meth:`step` ``(y_prev (batch,), state, memory, mask, keys=None)`` -> ``(logits (batch, vocab), new state,
      weights (batch, src_len))``: one decoding step, as :func:`attnbook.seq2seq.greedy_decode` calls it.

    Target pads (right padding) need no mask: with the causal mask no real position attends to a later pad.
    Attributes: ``embedding``, ``stack``, ``out`` (``nn.Linear(d_model, vocab_size)``), ``memory_size = d_model``,
    ``attention`` (the last layer's cross-attention module, whose weights are reported).

    Raises:
        TypeError, ValueError: bad ids, state, memory or mask (the messages give the shapes).

    Chapter 8, section "A Transformer translator".
    """

    def __init__(self, vocab_size: int, d_model: int, nhead: int, num_layers: int, dim_feedforward: int,
                 dropout: float, activation: str, layer_norm_eps: float, norm_first: bool, bias: bool,
                 positional: str, max_len: int, final_norm: bool | None) -> None:
        super().__init__()
        self.embedding = TransformerEmbedding(vocab_size, d_model, positional, max_len, dropout)
        layer = TransformerDecoderLayer(**_stack_kwargs(d_model, nhead, dim_feedforward, dropout, activation,
                                                        layer_norm_eps, norm_first, bias, positional))
        self.stack = TransformerDecoder(layer, num_layers,
                                        _final_norm(final_norm, norm_first, d_model, layer_norm_eps, bias))
        self.stack.layers[-1].multihead_attn.need_weights = True      # the weights the decoders report
        self.out = nn.Linear(d_model, vocab_size)
        self.memory_size = d_model

    @property
    def attention(self) -> MultiHeadAttention:
        """The last layer's cross-attention (its weights, averaged over heads, are the ones reported)."""
        return self.stack.layers[-1].multihead_attn

    def initial_state(self, batch: int, device: torch.device | str | None = None) -> TransformerDecoderState:
        """An empty prefix ``(batch, 0)``; the first step feeds ``<bos>``."""
        return TransformerDecoderState(torch.zeros(batch, 0, dtype=torch.long, device=device))

    def project_keys(self, memory: Tensor) -> None:
        """None: no per-sentence precomputation (the interface of :class:`attnbook.seq2seq.AttentionDecoder`)."""
        return None

    def _check(self, state: object, memory: Tensor, mask: Tensor) -> None:
        if not isinstance(state, TransformerDecoderState):
            raise TypeError(f"state must be a TransformerDecoderState, got {type(state).__name__}")
        _check_states(memory, "memory", self.memory_size)
        check_bool_mask(mask)
        if tuple(mask.shape) != (memory.shape[0], 1, memory.shape[1]):
            raise ValueError(f"mask must have shape (batch, 1, src_len) = {(memory.shape[0], 1, memory.shape[1])}, "
                             f"got {tuple(mask.shape)}")
        if state.tokens.dim() != 2 or state.tokens.shape[0] != memory.shape[0]:
            raise ValueError(f"state.tokens must have shape (batch={memory.shape[0]}, t), got "
                             f"{tuple(state.tokens.shape)}")

    def forward(self, tgt_in: Tensor, state: TransformerDecoderState, memory: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor]:
        _check_ids("tgt_in", tgt_in)
        self._check(state, memory, mask)
        if tgt_in.shape[0] != memory.shape[0]:
            raise ValueError(f"tgt_in has batch {tgt_in.shape[0]} but memory has batch {memory.shape[0]} "
                             f"(shapes {tuple(tgt_in.shape)} and {tuple(memory.shape)})")
        n = tgt_in.shape[1]
        if n == 0:  # nothing to predict: the defined empty result
            return (memory.new_zeros(tgt_in.shape[0], 0, self.out.out_features),
                    memory.new_zeros(tgt_in.shape[0], 0, memory.shape[1]))
        tokens = torch.cat([state.tokens.to(tgt_in.device), tgt_in], 1)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embedding(tokens, positions)
        h = self.stack(x, memory, causal=True, memory_padding_mask=mask[:, 0],
                       positions=positions if self.embedding.kind == "rope" else None)
        weights = self.attention.attention_weights.mean(1)[:, -n:]        # (batch, n, src_len)
        return self.out(h[:, -n:]), weights

    def step(self, y_prev: Tensor, state: TransformerDecoderState, memory: Tensor, mask: Tensor,
             keys: None = None) -> tuple[Tensor, TransformerDecoderState, Tensor]:
        """One decoding step: previous tokens ``(batch,)`` -> ``(logits (batch, vocab), new state, weights
        (batch, src_len))``. ``keys`` is ignored (see :meth:`project_keys`)."""
        _check_ids("y_prev", y_prev, dims=1)
        logits, weights = self(y_prev[:, None], state, memory, mask)
        new_state = TransformerDecoderState(torch.cat([state.tokens.to(y_prev.device), y_prev[:, None]], 1))
        return logits[:, 0], new_state, weights[:, 0]


class Transformer(Seq2Seq):
    """The encoder-decoder Transformer for translation: embeddings scaled by ``sqrt(d_model)`` plus positions, an
    encoder stack, a causal decoder stack with cross-attention, and a linear output layer.

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (id 0 = ``<pad>``, zero embedding).
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout, activation,
        layer_norm_eps, norm_first, bias: as in ``nn.Transformer`` (the paper's base model: 512, 8, 6, 6, 2048,
            0.1, ReLU, post-LN).
        positional: one of :data:`POSITIONAL_KINDS` (``"rope"``: rotary embeddings in both self-attentions).
        max_len: the number of learned positions (``"learned"`` only), on each side.
        final_norm: a LayerNorm after each stack; ``None`` = only for pre-LN (the paper's post-LN model has none;
            ``nn.Transformer`` always has one).

    The stacks' matrices are initialized Xavier-uniform, as in ``nn.Transformer``; the two embeddings as in
    :class:`TransformerEmbedding`. Attributes: ``encoder`` (:class:`TranslationEncoder`), ``decoder``
    (:class:`TranslationDecoder`).

    It is an :class:`attnbook.seq2seq.Seq2Seq`: ``model(src (batch, src_len) int64, src_lengths (batch,) int64,
    tgt_in (batch, tgt_len) int64)`` -> ``(logits (batch, tgt_len, tgt_vocab_size), weights (batch, tgt_len,
    src_len))`` with teacher forcing (sources right-padded, ``tgt_in`` starting with ``<bos>``), :meth:`encode`
    gives what decoding needs, and :func:`attnbook.seq2seq.greedy_decode` and :func:`~attnbook.seq2seq.beam_search`
    decode it. The stacks equal ``nn.Transformer``'s with the same weights (:func:`copy_to_torch`).

    Raises:
        ValueError: bad sizes or options (the messages name them); call errors as :class:`attnbook.seq2seq.Seq2Seq`.

    Vaswani et al. (2017), sections 3 and 5.4, figure 1. Chapter 8, section "A Transformer translator".
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 512, nhead: int = 8,
                 num_encoder_layers: int = 6, num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation: str = "relu", layer_norm_eps: float = 1e-5,
                 norm_first: bool = False, bias: bool = True, *, positional: str = "sinusoidal", max_len: int = 512,
                 final_norm: bool | None = None) -> None:
        common = (d_model, nhead)
        encoder = TranslationEncoder(src_vocab_size, *common, num_encoder_layers, dim_feedforward, dropout,
                                     activation, layer_norm_eps, norm_first, bias, positional, max_len, final_norm)
        decoder = TranslationDecoder(tgt_vocab_size, *common, num_decoder_layers, dim_feedforward, dropout,
                                     activation, layer_norm_eps, norm_first, bias, positional, max_len, final_norm)
        super().__init__(encoder, decoder)
        _reset_parameters(self.encoder.stack)
        _reset_parameters(self.decoder.stack)

    def encode(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        """``EncoderOutput(memory (batch, src_len, d_model), mask (batch, 1, src_len) bool (True = real token),
        state)`` with an empty target prefix as ``state``."""
        _check_ids("src", src)
        src_lengths = _check_lengths(src, src_lengths, "src_lengths")
        pad = lengths_to_mask(src_lengths.to(src.device), src.shape[1])
        memory = self.encoder(src, pad)
        return EncoderOutput(memory, pad[:, None, :], self.decoder.initial_state(src.shape[0], src.device))


# ----------------------------------------------------------------------------------------------- classifier
class TransformerClassifier(nn.Module):
    """A Transformer encoder classifier for padded token sequences (chapter 5's IMDB reviews).

    Args:
        vocab_size: number of token ids; id 0 = ``<pad>`` (zero embedding).
        num_classes: outputs.
        d_model, nhead, num_layers, dim_feedforward, dropout, activation, layer_norm_eps, norm_first, bias: the
            encoder (see :class:`TransformerEncoderLayer`).
        positional: one of :data:`POSITIONAL_KINDS`.
        max_len: the number of learned positions (``"learned"`` only).
        masked: True = pads are masked as keys in every self-attention (a key padding mask); False = every
            position attends to the pads as to tokens (pad id 0 has a zero embedding, but it still carries its
            positional encoding and is transformed by every layer).
        padding_side: ``"post"`` (right padding: tokens, then pads) or ``"pre"`` (left padding), as in
            :func:`attnbook.models.padding_mask` and :func:`attnbook.batching.pad_to_batch`.
        positions: ``"index"`` = the array index ``0 .. length - 1``, whatever the padding; ``"first_token"`` =
            counted from the first real token (:func:`positions_from_mask`), so a review has the same positions
            however much left padding precedes it. With post padding the two give the real tokens the same
            positions.
        readout: ``"first"`` = the encoder's output at the **first real token** (index 0 under post padding,
            index ``length - L`` under pre padding; there is no ``[CLS]`` token, so this is the review's first
            word, which self-attention has mixed with the rest); ``"mean"`` = the mean of the outputs over the
            real tokens only (masked mean pooling, whatever ``masked`` says).
        final_norm: a LayerNorm after the stack; ``None`` = only for pre-LN.

    Call: ``model(ids (batch, length) int64, lengths (batch,) int, *, return_attention=False)`` -> ``(logits
    (batch, num_classes), attention)``. ``ids`` are padded with 0 on ``padding_side``; the padding mask (True = a
    real token) is built from ``lengths``. ``attention`` is None, or with ``return_attention=True`` the
    self-attention weights ``(batch, num_layers, nhead, length, length)`` (detached; rows = queries, columns =
    keys), for :func:`pad_attention_mass`. A row with ``L = 0`` is all pads: its pooled vector is 0 (logits = the
    classifier's bias), with no NaN.

    Raises:
        ValueError: unknown options (the messages list the valid ones), bad sizes; at the call, ``ids`` not 2-D,
            ``lengths`` not ``(batch,)`` or outside ``[0, length]``.
        TypeError: ``ids`` or ``lengths`` not integer tensors.

    Packed rows (several reviews in one row, chapter 9): :meth:`forward_packed`.

    Chapter 8, section "Padding in a Transformer classifier" (the padding experiments of chapter 5, now with
    self-attention).
    """

    def __init__(self, vocab_size: int, num_classes: int = 2, d_model: int = 64, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 256, dropout: float = 0.1, activation: str = "relu",
                 layer_norm_eps: float = 1e-5, norm_first: bool = False, bias: bool = True, *,
                 positional: str = "sinusoidal", max_len: int = 512, masked: bool = True, padding_side: str = "post",
                 positions: str = "index", readout: str = "first", final_norm: bool | None = None) -> None:
        super().__init__()
        self.padding_side = _check_choice(padding_side, "padding_side", ("post", "pre"))
        self.positions = _check_choice(positions, "positions", POSITION_MODES)
        self.readout = _check_choice(readout, "readout", READOUTS)
        self.masked = bool(masked)
        num_classes = check_int(num_classes, "num_classes", minimum=1)
        self.embedding = TransformerEmbedding(vocab_size, d_model, positional, max_len, dropout)
        layer = TransformerEncoderLayer(**_stack_kwargs(d_model, nhead, dim_feedforward, dropout, activation,
                                                        layer_norm_eps, norm_first, bias, positional))
        self.encoder = TransformerEncoder(layer, num_layers,
                                          _final_norm(final_norm, norm_first, d_model, layer_norm_eps, bias))
        _reset_parameters(self.encoder)
        self.classifier = nn.Linear(d_model, num_classes)

    def forward(self, ids: Tensor, lengths: Tensor, *, return_attention: bool = False
                ) -> tuple[Tensor, Tensor | None]:
        _check_ids("ids", ids)
        lengths = check_lengths_for(ids, lengths, x_name="ids").to(ids.device)
        batch, length = ids.shape
        real = side_padding_mask(lengths, length, self.padding_side)                  # True = real token
        positions = torch.arange(length, device=ids.device) if self.positions == "index" else positions_from_mask(real)
        x = self.embedding(ids, positions)
        for layer in self.encoder.layers:
            layer.self_attn.need_weights = return_attention
        h = self.encoder(x, padding_mask=real if self.masked else None,
                         positions=positions if self.embedding.kind == "rope" else None)
        has_token = (lengths > 0)[:, None]
        if self.readout == "first":
            first = torch.zeros_like(lengths) if self.padding_side == "post" else (length - lengths).clamp_max(
                max(length - 1, 0))
            pooled = h[torch.arange(batch, device=ids.device), first] if length else h.new_zeros(batch, h.shape[-1])
        else:
            pooled = (h * real[..., None]).sum(1) / lengths.clamp_min(1)[:, None].to(h.dtype)
        pooled = torch.where(has_token, pooled, torch.zeros((), dtype=h.dtype, device=h.device))
        attention = None
        if return_attention:
            attention = torch.stack([layer.self_attn.attention_weights for layer in self.encoder.layers], 1)
        return self.classifier(pooled), attention

    def forward_packed(self, ids: Tensor, doc_ids: Tensor, positions: Tensor | None = None, *,
                       isolate: bool = True, return_attention: bool = False) -> tuple[Tensor, Tensor | None]:
        """Classify every document of packed rows (several reviews one after another in a row).

        Args:
            ids: int64 ``(B, L)``, the packed token ids (pads 0), e.g. from :func:`attnbook.batching.pack_collate`.
            doc_ids: int ``(B, L)``: ``0, 0, 1, 1, 1, ..., -1`` (:func:`attnbook.batching.check_document_ids`;
                -1 = a pad at the end of the row).
            positions: int ``(B, L)`` or ``(L,)``, >= 0; ``None`` = restarting at 0 in every document
                (:func:`attnbook.batching.document_positions`), so each review gets the positions it has alone.
                Pass ``torch.arange(L)`` to see what positions that run on across documents do.
            isolate: True = the block-diagonal document mask in every self-attention (bool, True = takes part):
                :func:`attnbook.batching.document_mask`, except that the pads at the end of a row form a block of
                their own (they attend to each other, so that no query is fully masked and torch's fused kernel runs
                unguarded; no review sees a pad, and the pads' outputs are never read). No review attends to another
                and a packed review gets the logits it gets alone. False = reviews attend to each other
                (cross-contamination, for the chapter's demonstration), but still not to pads.
            return_attention: also return the weights ``(B, num_layers, nhead, L, L)`` (detached).

        Returns:
            ``(logits (N, num_classes), attention)``: one row per document, in row-major order (row 0's documents
            in order, then row 1's...): the order of ``PackedBatch.order``, so ``labels[order]`` lines up. The
            readout is per document: ``"mean"`` = the mean of the encoder's outputs over the document's tokens,
            ``"first"`` = the output at its first token. ``masked`` and ``padding_side`` do not apply here.

        Raises:
            TypeError: ``ids``, ``doc_ids`` or ``positions`` not integer tensors. ValueError: ``ids`` not 2-D,
                ``doc_ids`` not ``ids``' shape (the message gives both) or not valid document ids, ``positions`` of
                the wrong shape or negative.

        Krell et al. (2021), "Efficient sequence packing without cross-contamination", section 4. Chapter 9,
        section "Packing instead of padding".
        """
        _check_ids("ids", ids)
        check_document_ids(doc_ids)
        if doc_ids.shape != ids.shape:
            raise ValueError(f"doc_ids must have the shape of ids {tuple(ids.shape)}, got {tuple(doc_ids.shape)}")
        doc_ids = doc_ids.to(device=ids.device, dtype=torch.long)
        batch, length = ids.shape
        if positions is None:
            positions = document_positions(doc_ids)
        else:
            positions = _check_positions(positions, batch, length).to(ids.device)
        real = doc_ids >= 0
        # The pads at the end of a row form one more block (pads attend to pads only): no review attends to a pad or
        # a pad to a review, as with document_mask, but no query is left without a key, so torch's fused kernel runs
        # without attnbook's guard for fully masked rows (the pads' outputs are never read).
        same = doc_ids[:, :, None] == doc_ids[:, None, :]
        mask = same if isolate else same | (real[:, :, None] & real[:, None, :])
        x = self.embedding(ids, positions)
        for layer in self.encoder.layers:
            layer.self_attn.need_weights = return_attention
        h = self.encoder(x, self_mask=mask, positions=positions if self.embedding.kind == "rope" else None)
        n_docs = (doc_ids.max(1).values + 1).clamp_min(0) if length else doc_ids.new_zeros(batch)
        first = n_docs.cumsum(0) - n_docs                                  # flat number of each row's document 0
        flat = (first[:, None] + doc_ids)[real]                            # each real token's document, row-major
        total = int(n_docs.sum())
        if self.readout == "mean":
            sums = h.new_zeros(total, h.shape[-1]).index_add_(0, flat, h[real])
            pooled = sums / torch.bincount(flat, minlength=total).clamp_min(1)[:, None].to(h.dtype)
        else:
            starts = real.clone()
            starts[:, 1:] &= doc_ids[:, 1:] != doc_ids[:, :-1]             # each document's first token
            pooled = h[starts]
        attention = None
        if return_attention:
            attention = torch.stack([layer.self_attn.attention_weights for layer in self.encoder.layers], 1)
        return self.classifier(pooled), attention


def pad_attention_mass(attention: Tensor, padding_mask: Tensor) -> Tensor:
    """The attention mass that real tokens put on pads: for each row, layer and head, the mean over the real
    queries of the total weight on pad keys.

    Args:
        attention: ``(batch, num_layers, nhead, length, length)`` weights (rows = queries), as returned by
            :class:`TransformerClassifier` with ``return_attention=True``; or any ``(batch, ..., length, length)``.
        padding_mask: bool ``(batch, length)``, True = a real token.

    Returns:
        ``(batch, ...)`` (e.g. ``(batch, num_layers, nhead)``) in ``[0, 1]``: 0 with a key padding mask, the pads'
        share without one. A row without real tokens gives 0.

    Raises:
        TypeError: a non-bool mask or a non-float ``attention``. ValueError: shapes that do not match (the message
            gives both).

    Chapter 8, section "Padding in a Transformer classifier".
    """
    if not isinstance(attention, Tensor) or not attention.is_floating_point():
        raise TypeError(f"attention must be a floating torch.Tensor, got {type(attention).__name__}")
    check_bool_mask(padding_mask, "padding_mask")
    if (padding_mask.dim() != 2 or attention.dim() < 3 or attention.shape[0] != padding_mask.shape[0]
            or attention.shape[-2:] != (padding_mask.shape[1],) * 2):
        raise ValueError(f"attention must have shape (batch, ..., length, length) matching padding_mask (batch, "
                         f"length); got attention {tuple(attention.shape)} and padding_mask "
                         f"{tuple(padding_mask.shape)}")
    extra = attention.dim() - 3
    view = (padding_mask.shape[0],) + (1,) * extra
    on_pads = (attention * (~padding_mask).reshape(*view, 1, -1).to(attention.dtype)).sum(-1)  # (batch, ..., q)
    real_q = padding_mask.reshape(*view, -1).to(attention.dtype)
    return (on_pads * real_q).sum(-1) / real_q.sum(-1).clamp_min(1)


# ----------------------------------------------------------------------------------------------- torch
def _activation_name(torch_layer: nn.Module) -> str:
    act = torch_layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    raise ValueError(f"only relu and gelu activations can be copied, got {act!r}")


def _config(layer: nn.Module) -> dict:
    """The constructor arguments of a book or torch layer."""
    if isinstance(layer, _Layer):
        return dict(d_model=layer.d_model, nhead=layer.nhead, dim_feedforward=layer.dim_feedforward,
                    dropout=layer.dropout.p, activation=layer.activation, layer_norm_eps=layer.layer_norm_eps,
                    norm_first=layer.norm_first, bias=layer.bias)
    return dict(d_model=layer.self_attn.embed_dim, nhead=layer.self_attn.num_heads,
                dim_feedforward=layer.linear1.out_features, dropout=layer.dropout.p,
                activation=_activation_name(layer), layer_norm_eps=layer.norm1.eps, norm_first=layer.norm_first,
                bias=layer.linear1.bias is not None)


def _mha_pairs(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> list[tuple[Tensor, Tensor]]:
    """(book tensor, torch tensor) pairs; torch packs q, k, v into ``in_proj_weight`` (3E, E)."""
    e = ours.embed_dim
    pairs = [(getattr(ours, f"{n}_proj").weight, theirs.in_proj_weight[i * e:(i + 1) * e])
             for i, n in enumerate("qkv")]
    if ours.q_proj.bias is not None:
        pairs += [(getattr(ours, f"{n}_proj").bias, theirs.in_proj_bias[i * e:(i + 1) * e])
                  for i, n in enumerate("qkv")]
    return pairs + _module_pairs(ours.out_proj, theirs.out_proj)


def _module_pairs(ours: nn.Module, theirs: nn.Module) -> list[tuple[Tensor, Tensor]]:
    return [(ours.weight, theirs.weight)] + ([] if ours.bias is None else [(ours.bias, theirs.bias)])


def _layer_pairs(ours: _Layer, theirs: nn.Module) -> list[tuple[Tensor, Tensor]]:
    pairs = _mha_pairs(ours.self_attn, theirs.self_attn)
    if isinstance(ours, TransformerDecoderLayer):
        pairs += _mha_pairs(ours.multihead_attn, theirs.multihead_attn)
    names = ["linear1", "linear2", "norm1", "norm2"] + (["norm3"] if isinstance(ours, TransformerDecoderLayer) else [])
    for name in names:
        pairs += _module_pairs(getattr(ours, name), getattr(theirs, name))
    return pairs


def _stack_pairs(ours: nn.Module, theirs: nn.Module) -> list[tuple[Tensor, Tensor]]:
    if len(ours.layers) != len(theirs.layers):
        raise ValueError(f"the stacks differ in depth: {len(ours.layers)} and {len(theirs.layers)} layers")
    if (ours.norm is None) != (theirs.norm is None):
        raise ValueError(f"one stack has a final norm and the other not (book: {ours.norm is not None}, torch: "
                         f"{theirs.norm is not None})")
    pairs = [p for a, b in zip(ours.layers, theirs.layers) for p in _layer_pairs(a, b)]
    return pairs + ([] if ours.norm is None else _module_pairs(ours.norm, theirs.norm))


_KINDS = ((TransformerEncoderLayer, nn.TransformerEncoderLayer), (TransformerDecoderLayer, nn.TransformerDecoderLayer),
          (TransformerEncoder, nn.TransformerEncoder), (TransformerDecoder, nn.TransformerDecoder),
          (Transformer, nn.Transformer))


def _pairs(ours: nn.Module, theirs: nn.Module) -> list[tuple[Tensor, Tensor]]:
    """Check that the two modules correspond (kind and configuration) and list their matching tensors."""
    for book_cls, torch_cls in _KINDS:
        if isinstance(ours, book_cls):
            if not isinstance(theirs, torch_cls):
                raise TypeError(f"a book {book_cls.__name__} corresponds to torch's nn.{torch_cls.__name__}, got "
                                f"{type(theirs).__name__}")
            break
    else:
        raise TypeError(f"expected one of the book's {[c.__name__ for c, _ in _KINDS]}, got {type(ours).__name__}")
    if isinstance(ours, Transformer):
        return _pairs(ours.encoder.stack, theirs.encoder) + _pairs(ours.decoder.stack, theirs.decoder)
    layers = [(ours, theirs)] if isinstance(ours, _Layer) else list(zip(ours.layers, theirs.layers))
    for a, b in layers:
        if a.rotary:
            raise ValueError("a rotary layer has no torch counterpart (torch's layers have no rotary embeddings)")
        if _config(a) != _config(b):
            diff = {k: (v, _config(b)[k]) for k, v in _config(a).items() if _config(b)[k] != v}
            raise ValueError(f"the layers' configurations differ (book, torch): {diff}")
    return _layer_pairs(ours, theirs) if isinstance(ours, _Layer) else _stack_pairs(ours, theirs)


def _copy(pairs: list[tuple[Tensor, Tensor]], to_torch: bool) -> None:
    with torch.no_grad():
        for ours, theirs in pairs:
            dst, src = (theirs, ours) if to_torch else (ours, theirs)
            if dst.shape != src.shape:  # pragma: no cover - configurations were compared first
                raise ValueError(f"shape mismatch {tuple(src.shape)} -> {tuple(dst.shape)}")
            dst.copy_(src)


def _torch_layer(layer: _Layer) -> nn.Module:
    cls = nn.TransformerEncoderLayer if isinstance(layer, TransformerEncoderLayer) else nn.TransformerDecoderLayer
    ref = layer.linear1.weight
    return cls(**_config(layer), batch_first=True, device=ref.device, dtype=ref.dtype)


def _torch_norm(norm: nn.LayerNorm | None) -> nn.LayerNorm | None:
    if norm is None:
        return None
    return nn.LayerNorm(norm.normalized_shape, eps=norm.eps, bias=norm.bias is not None, device=norm.weight.device,
                        dtype=norm.weight.dtype)


def copy_to_torch(module: nn.Module) -> nn.Module:
    """A new torch module with the book module's configuration and weights, in the same mode (train/eval).

    ======================================  ==============================================================
    book module                             torch module (``batch_first=True``)
    ======================================  ==============================================================
    :class:`TransformerEncoderLayer`        ``nn.TransformerEncoderLayer``
    :class:`TransformerDecoderLayer`        ``nn.TransformerDecoderLayer``
    :class:`TransformerEncoder`             ``nn.TransformerEncoder(..., enable_nested_tensor=False)``
    :class:`TransformerDecoder`             ``nn.TransformerDecoder``
    :class:`Transformer`                    ``nn.Transformer``: the two stacks only (torch's model has no
                                            embeddings, positions or output layer); a stack without a final
                                            norm gets ``norm=None`` in torch
    ======================================  ==============================================================

    The book's ``q_proj``, ``k_proj``, ``v_proj`` become torch's packed ``in_proj_weight``/``in_proj_bias``; the
    other names are the same. In eval mode the two then compute the same function, given torch the negated masks
    (torch's are True = ignored): ``src_key_padding_mask=~padding_mask``, ``tgt_mask=~causal_mask(tgt_len)``, and
    so on. (The stacks are built without nested tensors, so that torch's outputs at padded positions are computed
    as the book's are, not zeroed.)

    Raises:
        TypeError: ``module`` is none of the above. ValueError: a rotary layer (torch has no rotary embeddings).

    Chapter 8, section "Checking against torch".
    """
    layers = (module.layers if isinstance(module, (TransformerEncoder, TransformerDecoder)) else
              [*module.encoder.stack.layers, *module.decoder.stack.layers] if isinstance(module, Transformer) else
              [module] if isinstance(module, _Layer) else [])
    if any(layer.rotary for layer in layers):
        raise ValueError("a rotary layer has no torch counterpart (torch's layers have no rotary embeddings)")
    if isinstance(module, _Layer):
        theirs = _torch_layer(module)
    elif isinstance(module, (TransformerEncoder, TransformerDecoder)):
        layer = _torch_layer(module.layers[0])
        if isinstance(module, TransformerEncoder):
            theirs = nn.TransformerEncoder(layer, module.num_layers, _torch_norm(module.norm),
                                           enable_nested_tensor=False)
        else:
            theirs = nn.TransformerDecoder(layer, module.num_layers, _torch_norm(module.norm))
    elif isinstance(module, Transformer):
        encoder, decoder = copy_to_torch(module.encoder.stack), copy_to_torch(module.decoder.stack)
        cfg = _config(module.encoder.stack.layers[0])
        # nn.Transformer re-initializes every matrix, custom stacks included: the weights are copied afterwards.
        theirs = nn.Transformer(cfg["d_model"], cfg["nhead"], custom_encoder=encoder, custom_decoder=decoder,
                                batch_first=True)
    else:
        raise TypeError(f"copy_to_torch expects one of the book's {[c.__name__ for c, _ in _KINDS]}, got "
                        f"{type(module).__name__}")
    _copy(_pairs(module, theirs), to_torch=True)
    return theirs.train(module.training)


def copy_from_torch(torch_module: nn.Module, into: nn.Module | None = None) -> nn.Module:
    """The book's module with the weights of ``torch_module``.

    Args:
        torch_module: an ``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``, ``nn.TransformerEncoder``,
            ``nn.TransformerDecoder`` or ``nn.Transformer`` (relu or gelu activation; any ``batch_first``: the
            weights are the same, and the book's module is batch-first).
        into: the book module to copy into (in place), of the matching kind and configuration; ``None`` = build a
            new one from ``torch_module``'s configuration (in its dtype, device and mode). ``nn.Transformer``
            needs ``into``: a :class:`Transformer`, whose two stacks receive the weights (its embeddings and output
            layer are kept).

    Returns:
        The book module (``into`` itself when given).

    Raises:
        TypeError: unsupported ``torch_module``, or ``into`` of the wrong kind. ValueError: ``nn.Transformer``
            without ``into``; configurations that differ (the message lists them: sizes, activation, norm_first,
            eps, bias, depth, final norm); a rotary ``into``; an unsupported activation.

    Chapter 8, section "Checking against torch".
    """
    if into is None:
        if isinstance(torch_module, nn.Transformer):
            raise ValueError("copying an nn.Transformer needs into=a book Transformer (torch's model has no "
                             "embeddings or output layer to build one from)")
        if isinstance(torch_module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            cls = TransformerEncoderLayer if isinstance(torch_module, nn.TransformerEncoderLayer) \
                else TransformerDecoderLayer
            into = cls(**_config(torch_module))
        elif isinstance(torch_module, (nn.TransformerEncoder, nn.TransformerDecoder)):
            first = torch_module.layers[0]
            cls, layer_cls = ((TransformerEncoder, TransformerEncoderLayer)
                              if isinstance(torch_module, nn.TransformerEncoder)
                              else (TransformerDecoder, TransformerDecoderLayer))
            norm = _torch_norm(torch_module.norm)
            into = cls(layer_cls(**_config(first)), len(torch_module.layers), norm)
        else:
            raise TypeError(f"copy_from_torch expects nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, "
                            f"nn.TransformerEncoder, nn.TransformerDecoder or nn.Transformer, got "
                            f"{type(torch_module).__name__}")
        ref = next(torch_module.parameters())
        into = into.to(device=ref.device, dtype=ref.dtype).train(torch_module.training)
    _copy(_pairs(into, torch_module), to_torch=False)
    return into
