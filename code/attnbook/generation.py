"""Decoder-side practice: the causal mask combined with a padding mask, a key/value cache, a small decoder-only
language model and batched greedy generation of left-padded prompts.

Explained in chapter 8, "Self-attention and the Transformer" (``chapters/08_self_attention_transformer``), sections
"The causal mask and the padding mask" (``sec-tf-causal-padding``), "A key/value cache" (``sec-tf-kv-cache``) and
"Batched generation of left-padded prompts" (``sec-tf-batched-generation``). The pieces:

- :func:`causal_padding_mask`: ``causal & key padding``, bool, True = takes part (the attnbook convention, that of
  ``F.scaled_dot_product_attention``'s bool ``attn_mask``);
- :class:`LayerCache` and :class:`KVCache`: per layer, the self-attention keys and values of every position fed so
  far, ``(batch, nhead, t, head_dim)``, and the padding mask of those positions. A decoding step projects only the
  new token and appends its key and value, instead of recomputing the whole prefix (the cache that Pope et al.
  2023, "Efficiently scaling Transformer inference", analyse);
- :func:`with_kv_cache`: the encoder-decoder :class:`attnbook.transformer.Transformer` with a cached decoder, which
  :func:`attnbook.seq2seq.greedy_decode` and :func:`attnbook.seq2seq.beam_search` decode unchanged; the
  cross-attention keys and values of the source are computed once per sentence (``project_keys``);
- :class:`DecoderOnlyLM`: a GPT-style causal language model built from
  :class:`attnbook.transformer.TransformerEmbedding`
  and :class:`attnbook.transformer.TransformerEncoderLayer` with a causal self-mask;
- :func:`generate`: greedy generation for :class:`DecoderOnlyLM`, with or without the cache, with positions counted
  from the padding mask (``cumsum(mask) - 1``, as Hugging Face's ``generate`` does) or taken as array indices, and an
  optional stop at an end-of-sequence token (``eos_id``). It refuses right-padded prompts (a pad after a real token):
  their next token would go after a pad, not after the prompt. :func:`left_pad` moves such a batch's real tokens to
  the end of each row.

Positions: :class:`DecoderOnlyLM`'s ``forward`` and ``forward_cached`` count positions from the padding mask when
none are given (``cumsum(mask) - 1``; for right padding these are the array indices of the real tokens), never from
the array index of a row with pads.

With the cache, every attention sees exactly the keys and values the full recomputation sees, so the tokens are the
same and the logits agree up to the order of floating-point sums (``tests/test_generation.py``). All modules run in
eval mode for decoding (dropout off).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from .masking import check_bool_mask, check_int, lengths_to_mask
from .seq2seq import EncoderOutput, Seq2Seq, _check_ids, _check_lengths
from .transformer import (
    RotaryMultiHeadAttention,
    Transformer,
    TransformerDecoderLayer,
    TransformerDecoderState,
    TransformerEmbedding,
    TransformerEncoder,
    TransformerEncoderLayer,
    TranslationDecoder,
    _reset_parameters,
    positions_from_mask,
    rotary_embedding,
)

__all__ = [
    "POSITION_RULES", "causal_padding_mask", "LayerCache", "KVCache", "CachedDecoderState",
    "CachedTranslationDecoder", "CachedTransformer", "with_kv_cache", "DecoderOnlyLM", "Generated", "generate",
    "is_left_padded", "left_pad",
]

#: How :func:`generate` numbers the positions of a left-padded row: counted from the padding mask
#: (``cumsum(mask) - 1``: the first real token is position 0), or the array index ``0 .. T - 1`` (pads counted).
POSITION_RULES = ("mask", "index")


def causal_padding_mask(padding_mask: Tensor, n_queries: int | None = None) -> Tensor:
    """The causal mask combined with a key padding mask: ``causal_mask(n_q, T) & padding_mask`` for each row.

    Args:
        padding_mask: bool ``(batch, T)``, True = a real token (the keys).
        n_queries: the queries are the *last* ``n_queries`` positions (``None`` = ``T``, self-attention over the
            whole row; ``1`` = one decoding step against a cache of ``T`` keys).

    Returns:
        bool ``(batch, n_queries, T)``, True where query ``i`` may attend to key ``j``: ``j`` is not later than
        ``i`` *and* is a real token. A query at a leading pad (left padding) has no valid key: its row is all
        False, and attention must give it a zero context rather than NaN (:func:`attnbook.attention.
        scaled_dot_product_attention` does).

    Raises:
        TypeError: ``padding_mask`` not bool. ValueError: not 2-D, or ``n_queries`` outside ``[0, T]``.

    Vaswani et al. (2017), section 3.2.3 (the causal mask). Chapter 8, section "The causal mask and the padding
    mask".
    """
    check_bool_mask(padding_mask, "padding_mask")
    if padding_mask.dim() != 2:
        raise ValueError(f"padding_mask must have shape (batch, T), got {tuple(padding_mask.shape)}")
    n_keys = padding_mask.shape[1]
    n_queries = n_keys if n_queries is None else check_int(n_queries, "n_queries", minimum=0)
    if n_queries > n_keys:
        raise ValueError(f"n_queries must be <= T={n_keys}, got {n_queries}")
    return causal_mask(n_queries, n_keys, device=padding_mask.device)[None] & padding_mask[:, None, :]


# ----------------------------------------------------------------------------------------------- the cache
class LayerCache(NamedTuple):
    """One layer's cached self-attention ``keys`` and ``values``, ``(batch, nhead, t, head_dim)`` each, after the
    projections (and after the rotation, for rotary layers)."""

    keys: Tensor
    values: Tensor

    def index_select(self, index: Tensor) -> "LayerCache":
        return LayerCache(self.keys.index_select(0, index), self.values.index_select(0, index))


class KVCache(NamedTuple):
    """The cache of a decoder stack: ``layers`` (one :class:`LayerCache` per layer), ``padding_mask`` ``(batch, t)``
    bool (True = a real token among the ``t`` cached positions) and ``next_positions`` ``(batch,)`` int64, the
    position the next token gets.

    Chapter 8, section "A key/value cache"."""

    layers: tuple[LayerCache, ...]
    padding_mask: Tensor
    next_positions: Tensor

    @property
    def length(self) -> int:
        """``t``, the number of cached positions."""
        return self.padding_mask.shape[1]

    def index_select(self, index: Tensor) -> "KVCache":
        """The caches of rows ``index`` (beam search follows the surviving hypotheses)."""
        return KVCache(tuple(layer.index_select(index) for layer in self.layers),
                       self.padding_mask.index_select(0, index), self.next_positions.index_select(0, index))


def _empty_layers(n_layers: int, batch: int, attn: MultiHeadAttention, like: Tensor) -> tuple[LayerCache, ...]:
    empty = like.new_zeros(batch, attn.num_heads, 0, attn.head_dim)
    return tuple(LayerCache(empty, empty) for _ in range(n_layers))


def _heads(attn: MultiHeadAttention, x: Tensor, proj: nn.Linear, positions: Tensor | None) -> Tensor:
    """``(batch, n, d)`` -> projected heads ``(batch, nhead, n, head_dim)``, rotated by ``positions`` ``(batch,
    n)`` for a rotary attention."""
    h = attn._split(proj(x))
    if isinstance(attn, RotaryMultiHeadAttention):
        h = rotary_embedding(h, positions[:, None, :], base=attn.rope_base)
    return h


def _checked_padding_mask(ids: Tensor, padding_mask: Tensor | None) -> Tensor:
    """``ids`` checked, and its bool ``padding_mask`` (True = a real token; all True when None) checked to match."""
    _check_ids("ids", ids)
    if padding_mask is None:
        padding_mask = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    check_bool_mask(padding_mask, "padding_mask")
    if padding_mask.shape != ids.shape:
        raise ValueError(f"padding_mask must have the shape of ids {tuple(ids.shape)}, got "
                         f"{tuple(padding_mask.shape)}")
    return padding_mask


def _attend(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Heads ``(batch, nhead, n, head_dim)`` and a mask broadcastable to ``(batch, nhead, n_q, n_k)`` -> the
    attention output ``(batch, n_q, d_model)``, as ``MultiHeadAttention.forward`` computes it (weights kept in
    ``attention_weights`` when the module keeps them)."""
    result = scaled_dot_product_attention(q, k, v, mask, return_weights=attn.need_weights)
    if attn.need_weights:
        result, weights = result
        attn.attention_weights = weights.detach()
    else:
        attn.attention_weights = None
    return attn.out_proj(result.transpose(1, 2).flatten(-2))


def _cached_self_attention(attn: MultiHeadAttention, x: Tensor, past: LayerCache, mask: Tensor | None,
                           positions: Tensor) -> tuple[Tensor, LayerCache]:
    """Self-attention of the new positions ``x`` ``(batch, n, d)`` over the cached keys and values and their own:
    project the new positions only, append their keys and values, attend. ``mask``: bool broadcastable to
    ``(batch, 1, n, t + n)``."""
    q = _heads(attn, x, attn.q_proj, positions)
    k = torch.cat([past.keys, _heads(attn, x, attn.k_proj, positions)], 2)
    v = torch.cat([past.values, attn._split(attn.v_proj(x))], 2)
    return _attend(attn, q, k, v, mask), LayerCache(k, v)


def _layer_step(layer: TransformerEncoderLayer | TransformerDecoderLayer, x: Tensor, past: LayerCache,
                self_mask: Tensor | None, positions: Tensor, cross: tuple[Tensor, Tensor] | None = None,
                cross_mask: Tensor | None = None) -> tuple[Tensor, LayerCache]:
    """One layer on the new positions, with the cache: the same sub-layers, residuals and LayerNorms as the
    layer's ``forward`` (post-LN or pre-LN), in eval mode."""
    def sa(h):
        out, cache = _cached_self_attention(layer.self_attn, h, past, self_mask, positions)
        return layer.dropout1(out), cache

    def ca(h):
        q = layer.multihead_attn._split(layer.multihead_attn.q_proj(h))
        return layer.dropout2(_attend(layer.multihead_attn, q, cross[0], cross[1], cross_mask))

    ff_norm = layer.norm3 if cross is not None else layer.norm2
    if layer.norm_first:
        out, cache = sa(layer.norm1(x))
        x = x + out
        if cross is not None:
            x = x + ca(layer.norm2(x))
        x = x + layer._ff_block(ff_norm(x))
    else:
        out, cache = sa(x)
        x = layer.norm1(x + out)
        if cross is not None:
            x = layer.norm2(x + ca(x))
        x = ff_norm(x + layer._ff_block(x))
    return x, cache


# ----------------------------------------------------------------------------------------------- translator
class CachedDecoderState(NamedTuple):
    """What :class:`CachedTranslationDecoder` carries between steps: the :class:`KVCache` of its self-attention.
    ``index_select`` follows the beam."""

    cache: KVCache

    def index_select(self, index: Tensor) -> "CachedDecoderState":
        return CachedDecoderState(self.cache.index_select(index))


class CachedTranslationDecoder(nn.Module):
    """:class:`attnbook.transformer.TranslationDecoder` with a key/value cache: the same modules and weights (shared,
    not copied), the decoder interface of :mod:`attnbook.seq2seq`.

    - :meth:`project_keys` ``(memory (batch, src_len, d_model))`` -> the cross-attention keys and values of every
      layer, computed once per sentence (``greedy_decode`` and ``beam_search`` call it once);
    - :meth:`step` ``(y_prev (batch,), state, memory, mask (batch, 1, src_len), keys)`` -> ``(logits (batch,
      vocab), new state, weights (batch, src_len))``: embeds the one new token at its position ``t``, and in each
      layer attends over the cached keys and values plus its own; the weights are the last layer's
      cross-attention averaged over the heads, as the uncached decoder reports them;
    - calling it (teacher forcing) delegates to the wrapped decoder, from an empty state only.

    Raises:
        TypeError: ``decoder`` is not a ``TranslationDecoder``, a state of the wrong type. ValueError: teacher
            forcing from a non-empty state.

    Chapter 8, section "A key/value cache".
    """

    def __init__(self, decoder: TranslationDecoder) -> None:
        super().__init__()
        if not isinstance(decoder, TranslationDecoder):
            raise TypeError(f"decoder must be an attnbook.transformer.TranslationDecoder, got "
                            f"{type(decoder).__name__}")
        self.inner = decoder
        self.memory_size = decoder.memory_size

    @property
    def out(self) -> nn.Linear:
        return self.inner.out

    @property
    def attention(self) -> MultiHeadAttention:
        return self.inner.attention

    def initial_state(self, batch: int, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None) -> CachedDecoderState:
        """An empty cache: no position fed yet."""
        like = torch.empty(0, device=device, dtype=dtype or self.inner.out.weight.dtype)
        layers = self.inner.stack.layers
        return CachedDecoderState(KVCache(_empty_layers(len(layers), batch, layers[0].self_attn, like),
                                          torch.zeros(batch, 0, dtype=torch.bool, device=device),
                                          torch.zeros(batch, dtype=torch.long, device=device)))

    def project_keys(self, memory: Tensor) -> tuple[tuple[Tensor, Tensor], ...]:
        """Each layer's cross-attention keys and values ``(batch, nhead, src_len, head_dim)``, computed once."""
        return tuple((layer.multihead_attn._split(layer.multihead_attn.k_proj(memory)),
                      layer.multihead_attn._split(layer.multihead_attn.v_proj(memory)))
                     for layer in self.inner.stack.layers)

    def forward(self, tgt_in: Tensor, state: CachedDecoderState, memory: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor]:
        if not isinstance(state, CachedDecoderState):
            raise TypeError(f"state must be a CachedDecoderState, got {type(state).__name__}")
        if state.cache.length:
            raise ValueError("teacher forcing starts from an empty state (initial_state)")
        empty = TransformerDecoderState(torch.zeros(tgt_in.shape[0], 0, dtype=torch.long, device=tgt_in.device))
        return self.inner(tgt_in, empty, memory, mask)

    def step(self, y_prev: Tensor, state: CachedDecoderState, memory: Tensor, mask: Tensor,
             keys: tuple[tuple[Tensor, Tensor], ...] | None = None
             ) -> tuple[Tensor, CachedDecoderState, Tensor]:
        _check_ids("y_prev", y_prev, dims=1)
        if not isinstance(state, CachedDecoderState):
            raise TypeError(f"state must be a CachedDecoderState, got {type(state).__name__}")
        keys = self.project_keys(memory) if keys is None else keys
        cache, dec = state.cache, self.inner
        t = cache.length
        positions = torch.full((y_prev.shape[0], 1), t, dtype=torch.long, device=y_prev.device)
        x = dec.embedding(y_prev[:, None], positions)
        cross_mask = mask[:, None]                                   # (batch, 1, 1, src_len)
        new_layers = []
        for layer, past, kv in zip(dec.stack.layers, cache.layers, keys):
            x, layer_cache = _layer_step(layer, x, past, None, positions, kv, cross_mask)
            new_layers.append(layer_cache)
        if dec.stack.norm is not None:
            x = dec.stack.norm(x)
        weights = dec.attention.attention_weights.mean(1)[:, 0]      # (batch, src_len)
        real = torch.ones(y_prev.shape[0], 1, dtype=torch.bool, device=y_prev.device)
        new = KVCache(tuple(new_layers), torch.cat([cache.padding_mask, real], 1), cache.next_positions + 1)
        return dec.out(x[:, 0]), CachedDecoderState(new), weights


class CachedTransformer(Seq2Seq):
    """An :class:`attnbook.transformer.Transformer` decoded with a key/value cache: the same encoder and weights
    (shared with ``model``), the decoder wrapped in :class:`CachedTranslationDecoder`. Pass it to
    :func:`attnbook.seq2seq.greedy_decode` or :func:`~attnbook.seq2seq.beam_search`; they give the tokens the
    uncached model gives. Build it with :func:`with_kv_cache`. Chapter 8, section "A key/value cache"."""

    def __init__(self, model: Transformer) -> None:
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be an attnbook.transformer.Transformer, got {type(model).__name__}")
        super().__init__(model.encoder, CachedTranslationDecoder(model.decoder))

    def encode(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        _check_ids("src", src)
        src_lengths = _check_lengths(src, src_lengths, "src_lengths")
        pad = lengths_to_mask(src_lengths.to(src.device), src.shape[1])
        memory = self.encoder(src, pad)
        state = self.decoder.initial_state(src.shape[0], src.device, memory.dtype)
        return EncoderOutput(memory, pad[:, None, :], state)


def with_kv_cache(model: Transformer) -> CachedTransformer:
    """``model`` decoded with a key/value cache (the weights are shared, not copied). Raises ``TypeError`` for
    anything but an :class:`attnbook.transformer.Transformer`. Chapter 8, section "A key/value cache"."""
    return CachedTransformer(model)


# ----------------------------------------------------------------------------------------------- decoder-only
class DecoderOnlyLM(nn.Module):
    """A decoder-only (GPT-style) causal language model: token embedding plus positions, a stack of self-attention
    layers under the causal mask (combined with the padding mask), a final LayerNorm for pre-LN, and an output
    layer.

    Args:
        vocab_size: number of token ids (id 0 = ``<pad>``, zero embedding).
        d_model, nhead, num_layers, dim_feedforward, dropout, norm_first: as in
            :class:`attnbook.transformer.TransformerEncoderLayer` (pre-LN by default, as GPT-2).
        positional: ``"sinusoidal"``, ``"learned"`` (added to the embedding) or ``"rope"`` (rotary, in every
            self-attention).
        max_len: the number of learned positions.

    Calls:

    - ``model(ids (batch, T) int64, padding_mask=None, positions=None)`` -> logits ``(batch, T, vocab_size)``:
      position ``i`` predicts token ``i + 1``. ``padding_mask``: bool ``(batch, T)``, True = a real token (``None``
      = all real); it is combined with the causal mask (:func:`causal_padding_mask`). ``positions``: int ``(T,)``
      or ``(batch, T)``; ``None`` = counted from the padding mask, ``cumsum(padding_mask) - 1``
      (:func:`attnbook.transformer.positions_from_mask`): ``0 .. T - 1`` without pads and for the real tokens of a
      right-padded row, and from the first real token of a left-padded row (never the array index of a row with
      pads, which would move a left-padded prompt's positions).
    - :meth:`forward_cached` ``(ids (batch, n), cache, padding_mask (batch, n), positions (batch, n))`` ->
      ``(logits (batch, n, vocab_size), new cache)``: the ``n`` new positions against the cached ones; positions
      default to ``cache.next_positions`` plus the count of the new real tokens before each.

    Raises:
        ValueError: bad sizes or options, ``positional="none"`` (a causal LM without positions is possible, but
            not the subject here), shapes that do not match. TypeError: bad ids, masks or positions.

    Radford et al. (2019), GPT-2 (a decoder-only Transformer, pre-LN); Vaswani et al. (2017), section 3.2.3.
    Chapter 8, section "A key/value cache".
    """

    def __init__(self, vocab_size: int, d_model: int = 64, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 128, dropout: float = 0.0, *, positional: str = "sinusoidal",
                 max_len: int = 512, norm_first: bool = True) -> None:
        super().__init__()
        if positional not in ("sinusoidal", "learned", "rope"):
            raise ValueError(f"positional must be 'sinusoidal', 'learned' or 'rope', got {positional!r}")
        self.positional = positional
        self.embedding = TransformerEmbedding(vocab_size, d_model, positional, max_len, dropout)
        layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, norm_first=norm_first,
                                        rotary=positional == "rope")
        self.stack = TransformerEncoder(layer, num_layers, nn.LayerNorm(d_model) if norm_first else None)
        self.out = nn.Linear(d_model, vocab_size)
        _reset_parameters(self.stack)

    @property
    def vocab_size(self) -> int:
        return self.out.out_features

    def _inputs(self, ids: Tensor, padding_mask: Tensor | None, positions: Tensor | None,
                start: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The checked padding mask and positions ``(batch, n)``; ``positions=None`` = counted from the mask
        (``cumsum(mask) - 1``), plus ``start`` ``(batch,)`` (the cache's next positions) when given."""
        padding_mask = _checked_padding_mask(ids, padding_mask)
        if positions is None:
            positions = positions_from_mask(padding_mask)
            if start is not None:
                positions = positions + start.to(ids.device)[:, None]
        positions = torch.as_tensor(positions, device=ids.device)
        return padding_mask, positions.expand(ids.shape).contiguous() if positions.dim() == 1 else positions

    def forward(self, ids: Tensor, padding_mask: Tensor | None = None, positions: Tensor | None = None) -> Tensor:
        padding_mask, positions = self._inputs(ids, padding_mask, positions)
        x = self.embedding(ids, positions)
        h = self.stack(x, self_mask=causal_padding_mask(padding_mask),
                       positions=positions if self.positional == "rope" else None)
        return self.out(h)

    def empty_cache(self, batch: int, device: torch.device | str | None = None) -> KVCache:
        """A cache with no position: the prompt is the first call of :meth:`forward_cached`."""
        like = torch.empty(0, device=device, dtype=self.out.weight.dtype)
        return KVCache(_empty_layers(len(self.stack.layers), batch, self.stack.layers[0].self_attn, like),
                       torch.zeros(batch, 0, dtype=torch.bool, device=device),
                       torch.zeros(batch, dtype=torch.long, device=device))

    def forward_cached(self, ids: Tensor, cache: KVCache, padding_mask: Tensor | None = None,
                       positions: Tensor | None = None) -> tuple[Tensor, KVCache]:
        """The new positions ``ids`` ``(batch, n)`` against ``cache``: logits ``(batch, n, vocab)`` and the cache
        with the ``n`` positions appended.

        ``positions`` default: ``cache.next_positions`` (0 for an empty cache) plus ``cumsum(padding_mask) - 1``,
        so that a left-padded prompt's first real token is position 0 and each later token continues from the
        last real one (array indices only where there is no pad). The returned cache's ``next_positions`` is one
        past the last real token's position (default positions) or one past the last given position."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        _check_ids("ids", ids)
        if cache.padding_mask.shape[0] != ids.shape[0]:
            raise ValueError(f"the cache holds batch {cache.padding_mask.shape[0]}, ids have batch {ids.shape[0]}")
        default = positions is None
        padding_mask, positions = self._inputs(ids, padding_mask, positions, cache.next_positions)
        keys_mask = torch.cat([cache.padding_mask, padding_mask], 1)
        mask = causal_padding_mask(keys_mask, ids.shape[1])[:, None]          # (batch, 1, n, t + n)
        x = self.embedding(ids, positions)
        layers = []
        for layer, past in zip(self.stack.layers, cache.layers):
            x, layer_cache = _layer_step(layer, x, past, mask, positions)
            layers.append(layer_cache)
        if self.stack.norm is not None:
            x = self.stack.norm(x)
        next_positions = cache.next_positions.to(ids.device) + padding_mask.sum(1) if default \
            else positions[:, -1] + 1
        return self.out(x), KVCache(tuple(layers), keys_mask, next_positions)


class Generated(NamedTuple):
    """The output of :func:`generate`: ``tokens`` ``(batch, n)`` int64 and the ``logits`` ``(batch, n, vocab)`` each
    token was chosen from; ``n = max_new_tokens``, or fewer when every row has stopped at ``eos_id``. After a row's
    end-of-sequence token its tokens are ``pad_id`` and its logits are those of the step, which chose nothing."""

    tokens: Tensor
    logits: Tensor


def is_left_padded(padding_mask: Tensor) -> Tensor:
    """Per row, whether every pad comes before every real token (no pad after a real token).

    Args:
        padding_mask: bool ``(batch, T)``, True = a real token.

    Returns:
        bool ``(batch,)``: True for a left-padded row and a row without pads (or without real tokens); False for a
        right-padded row or one with a pad between real tokens.

    Raises:
        TypeError: ``padding_mask`` not bool. ValueError: not 2-D.

    Chapter 8, section "Batched generation of left-padded prompts".
    """
    check_bool_mask(padding_mask, "padding_mask")
    if padding_mask.dim() != 2:
        raise ValueError(f"padding_mask must have shape (batch, T), got {tuple(padding_mask.shape)}")
    return (padding_mask[:, 1:] >= padding_mask[:, :-1]).all(1)


def left_pad(ids: Tensor, padding_mask: Tensor, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """The same prompts, left-padded: each row's real tokens moved, in order, to the end of the row.

    Args:
        ids: int64 ``(batch, T)`` prompts, padded on any side (right padding, as a training batch is).
        padding_mask: bool ``(batch, T)``, True = a real token.
        pad_id: the id written at the pads.

    Returns:
        ``(ids, padding_mask)``, both ``(batch, T)``: the real tokens of each row in their order, after its pads
        (:func:`generate` needs this layout).

    Raises:
        TypeError: bad ``ids`` or mask. ValueError: shapes that do not match.

    Chapter 8, section "Batched generation of left-padded prompts".
    """
    padding_mask = _checked_padding_mask(ids, padding_mask)
    # a stable sort of "is real" puts the pads first and keeps each group's order
    order = torch.sort(padding_mask.long(), dim=1, stable=True).indices
    mask = padding_mask.gather(1, order)
    return ids.gather(1, order).masked_fill(~mask, pad_id), mask


@torch.no_grad()
def generate(model: DecoderOnlyLM, ids: Tensor, padding_mask: Tensor | None = None, max_new_tokens: int = 10, *,
             use_cache: bool = True, positions: str = "mask", mask_pads: bool = True, eos_id: int | None = None,
             pad_id: int = 0) -> Generated:
    """Greedy generation: append the most probable next token ``max_new_tokens`` times, or until ``eos_id``.

    Args:
        model: a :class:`DecoderOnlyLM` (put in eval mode for the call, then restored).
        ids: ``(batch, T)`` int64 prompts, **left-padded** (the real tokens at the end of the row, so that every
            row's next token goes to the same column); :func:`left_pad` converts a right-padded batch.
        padding_mask: bool ``(batch, T)``, True = a real token (``None`` = no padding).
        max_new_tokens: the largest number of tokens generated per row (>= 1).
        use_cache: True = a :class:`KVCache`: the prompt is run once, then each step feeds one token; False =
            every step recomputes the whole row (prompt and tokens so far).
        positions: ``"mask"`` = counted from the padding mask, ``cumsum(mask) - 1``, so that the first real token
            has position 0 in every row (:func:`attnbook.transformer.positions_from_mask`); ``"index"`` = the
            array index ``0 .. T - 1``, which counts a row's pads and moves its tokens' positions.
        mask_pads: False = the pads take part as keys (the padding mask is dropped; only the causal mask stays).
        eos_id: the end-of-sequence token id (``None`` = no stop): a row that generates it is finished, its later
            tokens are ``pad_id``, and generation stops early once every row is finished.
        pad_id: the id written after a finished row's ``eos_id``.

    Returns:
        :class:`Generated`. A row generated alone (no padding) gets the same tokens as in a left-padded batch
        when ``positions="mask"`` and ``mask_pads=True`` (or with rotary positions, which see only offsets); with
        index positions or without the mask it can differ (chapter 8, section "Batched generation of left-padded
        prompts").

    Raises:
        TypeError: ``model`` not a :class:`DecoderOnlyLM`, bad ids or mask. ValueError: unknown ``positions``,
            ``max_new_tokens < 1``, ``eos_id`` outside the vocabulary, shapes that do not match, a prompt with a pad
            after a real token (right padding: the message names the rows and :func:`left_pad`), or a prompt with no
            real token.

    Chapter 8, sections "A key/value cache" and "Batched generation of left-padded prompts".
    """
    if not isinstance(model, DecoderOnlyLM):
        raise TypeError(f"model must be an attnbook.generation.DecoderOnlyLM, got {type(model).__name__}")
    if positions not in POSITION_RULES:
        raise ValueError(f"positions must be one of {list(POSITION_RULES)}, got {positions!r}")
    check_int(max_new_tokens, "max_new_tokens", minimum=1)
    if eos_id is not None:
        check_int(eos_id, "eos_id", minimum=0)
        if eos_id >= model.vocab_size:
            raise ValueError(f"eos_id must be < vocab_size={model.vocab_size}, got {eos_id}")
    check_int(pad_id, "pad_id", minimum=0)
    padding_mask = _checked_padding_mask(ids, padding_mask)
    not_left = (~is_left_padded(padding_mask)).nonzero().flatten().tolist()
    if not_left:
        raise ValueError(f"generate needs left-padded prompts (pads before the real tokens), but rows {not_left} "
                         "have a pad after a real token: their next token would follow a pad, not the prompt. "
                         "Left-pad them first (attnbook.generation.left_pad).")
    empty = (~padding_mask.any(1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"every prompt needs at least one real token; rows {empty} have none")
    batch = ids.shape[0]

    def numbered(mask: Tensor) -> Tensor:
        if positions == "mask":
            return positions_from_mask(mask)
        return torch.arange(mask.shape[1], device=mask.device).expand(mask.shape)

    def attended(mask: Tensor) -> Tensor:
        return mask if mask_pads else torch.ones_like(mask)

    was_training = model.training
    model.eval()
    try:
        tokens, logits = [], []
        real = torch.ones(batch, 1, dtype=torch.bool, device=ids.device)
        finished = torch.zeros(batch, dtype=torch.bool, device=ids.device)

        def choose(step_logits: Tensor) -> Tensor:
            """The next tokens (pad_id for finished rows); marks the rows that end here."""
            y = step_logits[:, -1].argmax(-1).masked_fill(finished, pad_id)
            tokens.append(y)
            logits.append(step_logits[:, -1])
            if eos_id is not None:
                finished.logical_or_(y == eos_id)
            return y

        if use_cache:
            step_logits, cache = model.forward_cached(ids, model.empty_cache(batch, ids.device),
                                                      attended(padding_mask), numbered(padding_mask))
            # the next position: one past the last real token ("mask"), or one past the last column ("index")
            next_pos = numbered(torch.cat([padding_mask, real], 1))[:, -1:]
            for step in range(max_new_tokens):
                y = choose(step_logits)
                if step + 1 == max_new_tokens or finished.all():
                    break
                step_logits, cache = model.forward_cached(y[:, None], cache, real, next_pos)
                next_pos = next_pos + 1
        else:
            seq, mask = ids, padding_mask
            for _ in range(max_new_tokens):
                y = choose(model(seq, attended(mask), numbered(mask)))
                if finished.all():
                    break
                seq, mask = torch.cat([seq, y[:, None]], 1), torch.cat([mask, real], 1)
    finally:
        model.train(was_training)
    return Generated(torch.stack(tokens, 1), torch.stack(logits, 1))
