"""GRU encoder–decoder for translation, with and without attention; greedy decoding and beam search.

Explained in chapter 4, "Sequence to sequence with attention" (``chapters/04_seq2seq_attention``). The models:

- **No attention** (Cho et al. 2014; Sutskever et al. 2014): the decoder sees one fixed context vector, the
  encoder's final state ``c``, at every step: ``s_t = GRU([e(y_{t-1}); c], s_{t-1})``.
- **Bahdanau (additive) attention** (Bahdanau et al. 2015, eq. 4-6): the context is recomputed at every step,
  ``c_t = sum_i alpha_ti h_i`` with ``alpha_t = softmax(a(s_{t-1}, h_i))``: the *query* is the decoder's previous
  state, the keys and values are the encoder states. ``s_t = GRU([e(y_{t-1}); c_t], s_{t-1})``.
- **Luong attention** (Luong et al. 2015, eq. 5, 7, 8 and section 3.3): the query is the *current* state
  ``h_t = GRU([e(y_{t-1}); h~_{t-1}], h_{t-1})`` (input feeding), ``c_t`` as above with a "dot" or "general"
  score, divided by ``sqrt(d)`` by default (``make_seq2seq(..., scaled=False)`` gives the paper's unscaled
  scores, which collapse in training; chapter 4 shows it), and the attentional hidden state
  ``h~_t = tanh(W_c [c_t; h_t])``, of size ``attention_layer_size``. With ``attention_layer_size=None`` the
  attention output is the context itself, ``h~_t = c_t``, as in TensorFlow's ``AttentionWrapper`` (whose attention
  layer, when present, is linear: no tanh, no bias).

In all of them ``p(y_t | ...) = softmax(W_o o_t)``, with ``o_t = s_t`` (no attention, Bahdanau) or ``o_t = h~_t``
(Luong); the decoder's first state is ``s_0 = tanh(W_s [h->_n; h<-_1])`` from the encoder's final states (Bahdanau
et al., appendix A, use the backward state only). The scorer is pluggable: any module with the call
``(queries, keys, values, mask)`` of :mod:`attnbook.attention` (``AdditiveAttention``, ``DotProductAttention``...).

Masks follow the book's convention: bool, **True = takes part**; the source padding mask has shape
``(batch, 1, src_len)`` and broadcasts over the single query of each decoding step. Source padding changes neither
the encoder states (``pack_padded_sequence``) nor the attention (masked softmax), so a sentence decodes the same
whatever it is padded to.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .attention import AdditiveAttention, DotProductAttention
from .masking import check_bool_mask, check_int, check_lengths_for, lengths_to_mask, masked_softmax
from .text import BOS_ID, EOS_ID, PAD_ID

__all__ = [
    "Encoder", "AttentionDecoder", "Seq2Seq", "DecoderState", "EncoderOutput", "Decoded", "make_seq2seq",
    "MODEL_KINDS", "greedy_decode", "beam_search", "beam_steps",
]


# --------------------------------------------------------------------------------------------------- checks
def _check_ids(name: str, ids: Tensor, dims: int = 2) -> None:
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold integer token ids (int64), got dtype {ids.dtype}")
    if ids.dim() != dims:
        shape = "(batch, length)" if dims == 2 else "(batch,)"
        raise ValueError(f"{name} must have shape {shape}, got {tuple(ids.shape)}")


def _check_lengths(src: Tensor, lengths: Tensor, name: str = "lengths") -> Tensor:
    """Source lengths ``(batch,)``, integers in ``[1, src_len]`` (:func:`attnbook.masking.check_lengths_for`)."""
    if src.shape[0] > 0 and src.shape[1] == 0:
        raise ValueError(f"src must have at least one position (src_len >= 1) for a non-empty batch, got shape "
                         f"{tuple(src.shape)}")
    return check_lengths_for(src, lengths, name, x_name="src", min_length=1)


# --------------------------------------------------------------------------------------------------- encoder
class Encoder(nn.Module):
    """Embedding + (bidirectional) GRU over a padded batch of source sentences, padding skipped by packing.

    Args:
        vocab_size: source vocabulary size (id 0 = ``<pad>``, whose embedding is fixed at zero).
        embed_size: embedding size ``m``.
        hidden_size: GRU size per direction.
        bidirectional: read the sentence both ways and concatenate, ``h_i = [h->_i; h<-_i]`` (Bahdanau et al.
            2015, section 3.2); then :attr:`output_size` is ``2 * hidden_size``.
        num_layers, dropout: of ``nn.GRU`` (dropout between layers, and on the embeddings).

    Call: ``(src (batch, src_len) int64, lengths (batch,) int64)`` -> ``(outputs, final)``:
    ``outputs`` ``(batch, src_len, output_size)`` are the annotations ``h_i`` (exactly zero at padded positions),
    ``final`` ``(batch, output_size)`` the last layer's final states (forward state after the last real token,
    backward state after reading back to the first token). Both are unchanged when more padding is appended. An
    empty batch (``batch = 0``) gives empty outputs ``(0, src_len, output_size)`` and ``(0, output_size)``.

    Raises:
        TypeError: ``src`` is not an integer tensor, or ``lengths`` is not of an integer dtype.
        ValueError: ``src`` not 2-D; ``src_len = 0`` with a non-empty batch; ``lengths`` not of shape ``(batch,)``
            or a length outside ``[1, src_len]`` (the messages give the shapes and values).

    Chapter 4, section "The encoder".
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, *, bidirectional: bool = True,
                 num_layers: int = 1, dropout: float = 0.0) -> None:
        super().__init__()
        if min(vocab_size, embed_size, hidden_size, num_layers) <= 0:
            raise ValueError(f"sizes must be positive, got vocab_size={vocab_size}, embed_size={embed_size}, "
                             f"hidden_size={hidden_size}, num_layers={num_layers}")
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=PAD_ID)
        self.rnn = nn.GRU(embed_size, hidden_size, num_layers=num_layers, batch_first=True,
                          bidirectional=bidirectional, dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.num_directions = 2 if bidirectional else 1
        self.output_size = hidden_size * self.num_directions

    def forward(self, src: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        _check_ids("src", src)
        lengths = _check_lengths(src, lengths)
        if src.shape[0] == 0:  # pack_padded_sequence refuses an empty batch
            weight = self.embedding.weight
            return (weight.new_zeros(0, src.shape[1], self.output_size), weight.new_zeros(0, self.output_size))
        embedded = self.dropout(self.embedding(src))
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        packed_out, h_n = self.rnn(packed)
        outputs, _ = pad_packed_sequence(packed_out, batch_first=True, total_length=src.shape[1])
        last = h_n.view(self.rnn.num_layers, self.num_directions, src.shape[0], -1)[-1]  # (dirs, batch, hidden)
        return outputs, last.transpose(0, 1).reshape(src.shape[0], self.output_size)


# --------------------------------------------------------------------------------------------------- decoder
class DecoderState(NamedTuple):
    """What the decoder carries from one step to the next; every field is ``(batch, size)`` or ``None``.

    ``hidden``: the GRU state ``s_t`` (or ``h_t``). ``feed``: Luong's previous attentional state ``h~_{t-1}``
    (input feeding), else ``None``. ``context``: the fixed context ``c`` of the model without attention, else
    ``None``.
    """

    hidden: Tensor
    feed: Tensor | None = None
    context: Tensor | None = None

    def index_select(self, index: Tensor) -> "DecoderState":
        """The states of rows ``index`` (used by beam search to follow the surviving hypotheses)."""
        return DecoderState(*(None if x is None else x.index_select(0, index) for x in self))


class AttentionDecoder(nn.Module):
    """GRU decoder with pluggable attention over the encoder states, or with a fixed context (``attention=None``).

    Args:
        vocab_size: target vocabulary size.
        embed_size: target embedding size.
        hidden_size: decoder GRU size ``n`` (the query size).
        memory_size: size of the encoder states (keys and values), ``Encoder.output_size``.
        attention: a scoring module from :mod:`attnbook.attention` called as ``attention(queries (batch, 1,
            hidden_size), keys, values, mask)`` with keys = values = encoder states ``(batch, src_len,
            memory_size)`` and mask ``(batch, 1, src_len)``; ``None`` = no attention (fixed context).
        style: ``"bahdanau"`` (the query is the previous state ``s_{t-1}``; the context enters the GRU) or
            ``"luong"`` (the query is the current state ``h_t``; the context enters the output through the
            attentional state, which is fed to the next step). ``"luong"`` needs an ``attention`` module.
        attention_layer_size: Luong only. An int ``d`` = the attentional hidden state ``tanh(W_c [c_t; h_t])``
            of size ``d`` (Luong et al. 2015, eq. 5); ``None`` = the context ``c_t`` itself is the attention output
            (TensorFlow ``AttentionWrapper``'s default), so the output layer sees no decoder state directly.
        dropout: on the embeddings and before the output layer.

    Call (teacher forcing): ``(tgt_in (batch, tgt_len) int64, state, memory, mask)`` -> ``(logits (batch, tgt_len,
    vocab_size), weights)``, where ``weights`` is ``(batch, tgt_len, src_len)`` (detached; ``None`` without
    attention) and ``state`` comes from :meth:`Seq2Seq.encode`. :meth:`step` does one step, for decoding. An empty
    target (``tgt_len = 0``) gives logits ``(batch, 0, vocab_size)`` and weights ``(batch, 0, src_len)``; an empty
    batch gives empty outputs.

    Raises:
        ValueError: an unknown ``style``; ``"luong"`` without attention; ``attention_layer_size`` with
            ``"bahdanau"`` or not positive; sizes not positive.
        TypeError: ``attention`` is neither ``None`` nor an ``nn.Module``.

    Chapter 4, sections "Bahdanau attention" and "Luong attention and attention_layer_size".
    """

    def __init__(self, vocab_size: int, embed_size: int, hidden_size: int, memory_size: int,
                 attention: nn.Module | None = None, *, style: str = "bahdanau",
                 attention_layer_size: int | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        if min(vocab_size, embed_size, hidden_size, memory_size) <= 0:
            raise ValueError(f"sizes must be positive, got vocab_size={vocab_size}, embed_size={embed_size}, "
                             f"hidden_size={hidden_size}, memory_size={memory_size}")
        if style not in ("bahdanau", "luong"):
            raise ValueError(f"style must be 'bahdanau' or 'luong', got {style!r}")
        if attention is not None and not isinstance(attention, nn.Module):
            raise TypeError(f"attention must be an nn.Module from attnbook.attention or None, got "
                            f"{type(attention).__name__}")
        if style == "luong" and attention is None:
            raise ValueError("style='luong' needs an attention module (its output is built from the context)")
        if attention_layer_size is not None:
            if style != "luong":
                raise ValueError("attention_layer_size is a Luong option (h~_t = tanh(W_c[c_t; h_t])); "
                                 "use style='luong' or leave it None")
            if attention_layer_size <= 0:
                raise ValueError(f"attention_layer_size must be positive or None, got {attention_layer_size}")
        self.style, self.attention = style, attention
        self.hidden_size, self.memory_size = hidden_size, memory_size
        self.attention_layer_size = attention_layer_size
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=PAD_ID)
        self.init_state = nn.Linear(memory_size, hidden_size)  # s_0 = tanh(W_s final)
        if style == "bahdanau":
            self.feed_size = 0
            self.cell = nn.GRUCell(embed_size + memory_size, hidden_size)  # input [e(y_{t-1}); c_t]
            self.output_size = hidden_size
            self.W_c = None
        else:
            self.feed_size = attention_layer_size or memory_size
            self.cell = nn.GRUCell(embed_size + self.feed_size, hidden_size)  # input [e(y_{t-1}); h~_{t-1}]
            self.W_c = None if attention_layer_size is None else \
                nn.Linear(memory_size + hidden_size, attention_layer_size, bias=False)
            self.output_size = self.feed_size
        self.out = nn.Linear(self.output_size, vocab_size)
        self.dropout = nn.Dropout(dropout)

    # ----------------------------------------------------------------------------------------- state
    def initial_state(self, final: Tensor) -> DecoderState:
        """``s_0 = tanh(W_s final)`` from the encoder's final states ``(batch, memory_size)``, plus a zero
        ``h~_0`` (Luong) or the fixed context ``c = final`` (no attention)."""
        hidden = torch.tanh(self.init_state(final))
        feed = final.new_zeros(final.shape[0], self.feed_size) if self.style == "luong" else None
        context = final if self.attention is None else None
        return DecoderState(hidden, feed, context)

    def project_keys(self, memory: Tensor) -> Tensor | None:
        """The part of the score that depends on the keys only, computed once per sentence instead of once per
        step: ``U_a h_i`` for :class:`~attnbook.attention.AdditiveAttention` (Bahdanau et al. 2015, appendix
        A.1.2, make the same remark), ``W_a h_i`` for Luong's general score; ``None`` for other modules, which are
        then called as they are, ``attention(query, keys, values, mask)``, at every step."""
        att = self.attention
        if type(att) is AdditiveAttention:
            return att.W_k(memory)
        if type(att) is DotProductAttention and att.W_a is not None:
            return att.W_a(memory)
        return None

    def _attend(self, query: Tensor, memory: Tensor, mask: Tensor, keys: Tensor | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """Context ``c_t`` ``(batch, memory_size)`` and weights ``(batch, src_len)`` for a query ``(batch, n)``.

        With ``keys`` from :meth:`project_keys`, the module's score is computed here on the projected keys
        (the same arithmetic as the module's forward; ``tests/test_seq2seq.py`` checks that both agree)."""
        att = self.attention
        if keys is None:
            context = att(query.unsqueeze(1), memory, memory, mask).squeeze(1)
            weights = getattr(att, "attention_weights", None)
            return context, None if weights is None else weights.squeeze(1)
        if type(att) is AdditiveAttention:
            scores = att.w_v(torch.tanh(att.W_q(query).unsqueeze(1) + keys)).squeeze(-1)      # (batch, src_len)
        else:
            scale = 1.0 / math.sqrt(query.shape[-1]) if att.scaled else 1.0
            scores = torch.bmm(keys, query.unsqueeze(-1)).squeeze(-1) * scale               # (batch, src_len)
        weights = masked_softmax(scores, mask.squeeze(1))
        att.attention_weights = weights.detach().unsqueeze(1)
        dropped = F.dropout(weights, att.dropout, att.training) if att.dropout > 0 else weights
        return torch.bmm(dropped.unsqueeze(1), memory).squeeze(1), weights.detach()

    def _features(self, embedded: Tensor, state: DecoderState, memory: Tensor, mask: Tensor,
                  keys: Tensor | None = None) -> tuple[Tensor, DecoderState, Tensor | None]:
        """One step on an embedded input ``(batch, embed)``: output features ``o_t``, new state, weights."""
        if self.style == "bahdanau":
            if self.attention is None:
                context, weights = state.context, None
            else:
                context, weights = self._attend(state.hidden, memory, mask, keys)   # query = s_{t-1}
            hidden = self.cell(torch.cat([embedded, context], -1), state.hidden)   # s_t
            return hidden, DecoderState(hidden, None, state.context), weights
        hidden = self.cell(torch.cat([embedded, state.feed], -1), state.hidden)    # h_t (input feeding)
        context, weights = self._attend(hidden, memory, mask, keys)                # query = h_t
        attentional = context if self.W_c is None else torch.tanh(self.W_c(torch.cat([context, hidden], -1)))
        return attentional, DecoderState(hidden, attentional, None), weights

    def _check(self, memory: Tensor, mask: Tensor, state: DecoderState) -> None:
        if memory.dim() != 3 or memory.shape[-1] != self.memory_size:
            raise ValueError(f"memory must have shape (batch, src_len, {self.memory_size}), got "
                             f"{tuple(memory.shape)}")
        check_bool_mask(mask)
        if tuple(mask.shape) != (memory.shape[0], 1, memory.shape[1]):
            raise ValueError(f"mask must have shape (batch, 1, src_len) = {(memory.shape[0], 1, memory.shape[1])}, "
                             f"got {tuple(mask.shape)}")
        if state.hidden.shape != (memory.shape[0], self.hidden_size):
            raise ValueError(f"state.hidden must have shape {(memory.shape[0], self.hidden_size)}, got "
                             f"{tuple(state.hidden.shape)}")

    # ----------------------------------------------------------------------------------------- calls
    def step(self, y_prev: Tensor, state: DecoderState, memory: Tensor, mask: Tensor, keys: Tensor | None = None
             ) -> tuple[Tensor, DecoderState, Tensor | None]:
        """One decoding step: previous tokens ``(batch,)`` -> ``(logits (batch, vocab), new state, weights
        (batch, src_len) or None)``. ``keys``: :meth:`project_keys` of ``memory``, if the caller has computed it
        once for all steps; ``None`` = computed here."""
        _check_ids("y_prev", y_prev, dims=1)
        self._check(memory, mask, state)
        if keys is None and self.attention is not None:
            keys = self.project_keys(memory)
        features, state, weights = self._features(self.dropout(self.embedding(y_prev)), state, memory, mask, keys)
        return self.out(self.dropout(features)), state, weights

    def forward(self, tgt_in: Tensor, state: DecoderState, memory: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor | None]:
        _check_ids("tgt_in", tgt_in)
        self._check(memory, mask, state)
        if tgt_in.shape[0] != memory.shape[0]:
            raise ValueError(f"tgt_in has batch {tgt_in.shape[0]} but memory has batch {memory.shape[0]} "
                             f"(shapes {tuple(tgt_in.shape)} and {tuple(memory.shape)})")
        if tgt_in.shape[1] == 0:  # nothing to predict: the defined empty result
            logits = memory.new_zeros(tgt_in.shape[0], 0, self.out.out_features)
            return logits, None if self.attention is None else memory.new_zeros(tgt_in.shape[0], 0, memory.shape[1])
        embedded = self.dropout(self.embedding(tgt_in))
        keys = None if self.attention is None else self.project_keys(memory)   # once, not once per step
        features, weights = [], []
        for t in range(tgt_in.shape[1]):  # teacher forcing: the input at step t is the reference token y_{t-1}
            f, state, w = self._features(embedded[:, t], state, memory, mask, keys)
            features.append(f)
            weights.append(w)
        logits = self.out(self.dropout(torch.stack(features, 1)))  # one matrix product for all steps
        return logits, None if weights[0] is None else torch.stack(weights, 1)


# --------------------------------------------------------------------------------------------------- model
class EncoderOutput(NamedTuple):
    """``memory`` ``(batch, src_len, memory_size)`` (keys and values), ``mask`` ``(batch, 1, src_len)`` bool (True =
    real source token), ``state`` the decoder's initial :class:`DecoderState`."""

    memory: Tensor
    mask: Tensor
    state: DecoderState


class Seq2Seq(nn.Module):
    """Encoder + decoder. ``forward(src, src_lengths, tgt_in)`` -> ``(logits (batch, tgt_len, vocab), weights)``
    with teacher forcing; ``tgt_in`` starts with ``<bos>``. :meth:`encode` gives what decoding needs.

    Raises ``ValueError`` when ``encoder.output_size`` differs from ``decoder.memory_size``, or when ``src`` and
    ``tgt_in`` differ in batch size; ``TypeError``/``ValueError`` for bad ids or lengths, as :class:`Encoder`. An
    empty batch or an empty target (``tgt_len = 0``) gives empty logits ``(batch, tgt_len, vocab)`` and weights
    (see :class:`AttentionDecoder`). Chapter 4, section "Five models, one training loop" (teacher forcing).
    """

    def __init__(self, encoder: Encoder, decoder: AttentionDecoder) -> None:
        super().__init__()
        if encoder.output_size != decoder.memory_size:
            raise ValueError(f"encoder.output_size={encoder.output_size} must equal decoder.memory_size="
                             f"{decoder.memory_size}")
        self.encoder, self.decoder = encoder, decoder

    def encode(self, src: Tensor, src_lengths: Tensor) -> EncoderOutput:
        _check_ids("src", src)
        src_lengths = _check_lengths(src, src_lengths, "src_lengths")
        memory, final = self.encoder(src, src_lengths)
        mask = lengths_to_mask(src_lengths.to(src.device), src.shape[1])[:, None, :]
        return EncoderOutput(memory, mask, self.decoder.initial_state(final))

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        _check_ids("tgt_in", tgt_in)
        if tgt_in.shape[0] != src.shape[0]:
            raise ValueError(f"src has batch {src.shape[0]} but tgt_in has batch {tgt_in.shape[0]}")
        enc = self.encode(src, src_lengths)
        return self.decoder(tgt_in, enc.state, enc.memory, enc.mask)


#: The models the chapter compares: kind -> (style, score, uses attention_layer_size).
MODEL_KINDS = {
    "none": "GRU encoder–decoder without attention (fixed context)",
    "bahdanau": "Bahdanau (additive) attention",
    "luong-dot": "Luong dot attention (scaled by 1/sqrt(d) unless scaled=False), attention_layer_size = hidden",
    "luong-general": "Luong general attention (scaled unless scaled=False), attention_layer_size = hidden",
    "luong-general-context": "Luong general attention (scaled unless scaled=False), attention_layer_size = None "
                             "(context as output)",
}


def make_seq2seq(kind: str, src_vocab_size: int, tgt_vocab_size: int, embed_size: int = 64,
                 hidden_size: int = 128, attention_size: int | None = None, dropout: float = 0.0, *,
                 scaled: bool = True) -> Seq2Seq:
    """Build one of the chapter's models (:data:`MODEL_KINDS`).

    The encoder is a bidirectional GRU with ``hidden_size // 2`` units per direction, so the encoder states have
    the decoder's size ``hidden_size`` (which Luong's "dot" score needs). ``attention_size`` is the tanh layer of
    the additive score (default ``hidden_size``) and, for ``"luong-dot"``/``"luong-general"``, the
    ``attention_layer_size``.

    ``scaled`` (Luong models only) divides the dot and general scores by ``sqrt(d)``, ``d = hidden_size`` (the
    query size): ``h_t . h_i / sqrt(d)`` and ``h_t^T W_a h_i / sqrt(d)``, the scaling of Vaswani et al. (2017,
    eq. 1) applied to Luong et al.'s (2015, eq. 8) scores. ``False`` gives Luong et al.'s unscaled scores, which
    collapse onto a few source positions within the first Adam steps (chapter 4, section "The unscaled Luong
    scores collapse"; chapter 3 explains the saturated softmax). It does not change Bahdanau's additive score or
    the model without attention.

    Raises:
        ValueError: unknown ``kind`` (the message lists the known ones), or an odd ``hidden_size``.
        TypeError: ``scaled`` is not a bool.

    Chapter 4, section "Five models, one training loop".
    """
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {list(MODEL_KINDS)}")
    if not isinstance(scaled, bool):
        raise TypeError(f"scaled must be a bool, got {type(scaled).__name__} {scaled!r}")
    if hidden_size % 2:
        raise ValueError(f"hidden_size must be even (two encoder directions of hidden_size // 2), got {hidden_size}")
    attention_size = attention_size or hidden_size
    encoder = Encoder(src_vocab_size, embed_size, hidden_size // 2, bidirectional=True, dropout=dropout)
    memory = encoder.output_size
    if kind == "none":
        attention, style, layer = None, "bahdanau", None
    elif kind == "bahdanau":
        attention, style, layer = AdditiveAttention(hidden_size, memory, attention_size), "bahdanau", None
    elif kind == "luong-dot":
        attention, style, layer = DotProductAttention(scaled=scaled), "luong", attention_size
    else:
        attention = DotProductAttention(scaled=scaled, query_size=hidden_size, key_size=memory)
        style, layer = "luong", (None if kind == "luong-general-context" else attention_size)
    decoder = AttentionDecoder(tgt_vocab_size, embed_size, hidden_size, memory, attention, style=style,
                               attention_layer_size=layer, dropout=dropout)
    return Seq2Seq(encoder, decoder)


# --------------------------------------------------------------------------------------------------- decoding
class Decoded(NamedTuple):
    """Decoder output for a batch: ``tokens`` (one list of ids per sentence, without ``<bos>`` and ``<eos>``),
    ``scores`` (``(batch,)`` float: total log-probability, or its length-normalized value for beam search),
    ``weights`` (one ``(n_steps, src_len)`` tensor per sentence, rows = generated tokens including ``<eos>`` when
    produced, ``None`` without attention)."""

    tokens: list[list[int]]
    scores: Tensor
    weights: list[Tensor] | None


def _check_decode_args(model: Seq2Seq, src: Tensor, src_lengths: Tensor, max_len: int) -> Tensor:
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"model must be an attnbook.seq2seq.Seq2Seq, got {type(model).__name__}")
    _check_ids("src", src)
    check_int(max_len, "max_len", minimum=1)
    return _check_lengths(src, src_lengths, "src_lengths")


def _empty_decoded(model: Seq2Seq) -> Decoded:
    """The result of decoding an empty batch: no sentences, ``scores`` of shape ``(0,)``."""
    dtype = _score_dtype(model.decoder.out.weight)
    return Decoded([], torch.zeros(0, dtype=dtype), None if model.decoder.attention is None else [])


def _log_probs(logits: Tensor) -> Tensor:
    """Log-softmax in fp32 or fp64 (half-precision logits are promoted to fp32)."""
    return torch.log_softmax(logits if logits.dtype in (torch.float32, torch.float64) else logits.float(), -1)


def _score_dtype(memory: Tensor) -> torch.dtype:
    return memory.dtype if memory.dtype in (torch.float32, torch.float64) else torch.float32


def _cut(ids: list[int], eos_id: int) -> tuple[list[int], int]:
    """Tokens before the first ``<eos>``, and the number of decoding steps they used (including ``<eos>``)."""
    return (ids[: ids.index(eos_id)], ids.index(eos_id) + 1) if eos_id in ids else (ids, len(ids))


@torch.no_grad()
def greedy_decode(model: Seq2Seq, src: Tensor, src_lengths: Tensor, max_len: int = 50, *, bos_id: int = BOS_ID,
                  eos_id: int = EOS_ID) -> Decoded:
    """Decode a batch by taking the most probable token at every step, until ``<eos>`` or ``max_len`` steps.

    Args:
        model: a :class:`Seq2Seq` (put in eval mode for the call, then restored).
        src: ``(batch, src_len)`` int64 source ids, right-padded; ``src_lengths``: ``(batch,)`` int64.
        max_len: the most tokens generated per sentence (including ``<eos>``).
        bos_id, eos_id: the start and end tokens.

    Returns:
        :class:`Decoded` with the summed log-probabilities of the chosen tokens as ``scores``.

    An empty batch (``batch = 0``) gives ``Decoded([], scores of shape (0,), [] or None)``.

    Raises:
        TypeError: ``model`` is not a :class:`Seq2Seq`, ids or lengths are not integer tensors, or ``max_len`` is
            not an int.
        ValueError: bad shapes or lengths (as in :class:`Encoder`), or ``max_len < 1``.

    Chapter 4, section "Greedy decoding and beam search".
    """
    src_lengths = _check_decode_args(model, src, src_lengths, max_len)
    if src.shape[0] == 0:
        return _empty_decoded(model)
    was_training = model.training
    model.eval()
    try:
        enc = model.encode(src, src_lengths)
        state, batch = enc.state, src.shape[0]
        keys = None if model.decoder.attention is None else model.decoder.project_keys(enc.memory)
        y = torch.full((batch,), bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(batch, dtype=torch.bool, device=src.device)
        score = torch.zeros(batch, device=src.device, dtype=_score_dtype(enc.memory))
        steps, weights = [], []
        for _ in range(max_len):
            logits, state, w = model.decoder.step(y, state, enc.memory, enc.mask, keys)
            logp = _log_probs(logits)
            y = logp.argmax(-1)
            score += torch.where(done, 0.0, logp.gather(1, y[:, None]).squeeze(1))
            steps.append(y)
            weights.append(w)
            done |= y == eos_id
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    ids = torch.stack(steps, 1).tolist()
    tokens, used = zip(*(_cut(row, eos_id) for row in ids))
    attn = None
    if weights[0] is not None:
        stacked = torch.stack(weights, 1)  # (batch, steps, src_len)
        attn = [stacked[b, : used[b], : int(src_lengths[b])].cpu() for b in range(batch)]
    return Decoded([list(t) for t in tokens], score.cpu(), attn)


@torch.no_grad()
def beam_search(model: Seq2Seq, src: Tensor, src_lengths: Tensor, beam_size: int = 4, max_len: int = 50, *,
                length_penalty: float = 1.0, bos_id: int = BOS_ID, eos_id: int = EOS_ID,
                pad_id: int = PAD_ID, trace: list | None = None) -> Decoded:
    """Batched beam search: keep the ``beam_size`` most probable partial translations of each sentence.

    At every step each live hypothesis is extended by every token, and the ``beam_size`` best extensions (by
    total log-probability) survive. A hypothesis that has produced ``<eos>`` stays in the beam with its score
    frozen (it is extended by ``<pad>`` at no cost). The search stops when all hypotheses have ended or after
    ``max_len`` steps; the winner maximizes ``log p / n**length_penalty``, with ``n`` the number of generated
    tokens including ``<eos>`` (``length_penalty=0``: raw log-probability, which favours short output;
    ``1``: the mean log-probability per token). With ``beam_size=1`` this is exactly :func:`greedy_decode`.

    Args:
        model, src, src_lengths, max_len, bos_id, eos_id: as in :func:`greedy_decode`.
        beam_size: number of hypotheses kept per sentence (>= 1); the chapter uses 4.
        length_penalty: exponent of the length normalization of the final choice (>= 0).
        pad_id: the token that extends finished hypotheses.
        trace: a list to which every step appends a dict of ``(batch, beam_size)`` CPU tensors: ``parent`` (the
            rank, in the previous step's beam, of the hypothesis each one extends), ``token``, ``score`` (total
            log-probability), ``done`` and ``n_tokens``; ``None`` (default) records nothing. :func:`beam_steps`
            reads it.

    Returns:
        :class:`Decoded` with the best hypothesis per sentence; ``scores`` are the normalized scores.

    An empty batch gives ``Decoded([], scores of shape (0,), [] or None)``, as in :func:`greedy_decode`.

    Raises:
        TypeError, ValueError: as in :func:`greedy_decode`; also ``beam_size`` not an int or ``< 1``, or
            ``length_penalty < 0``.

    Chapter 4, section "Greedy decoding and beam search".
    """
    src_lengths = _check_decode_args(model, src, src_lengths, max_len)
    check_int(beam_size, "beam_size", minimum=1)
    if length_penalty < 0:
        raise ValueError(f"length_penalty must be >= 0, got {length_penalty}")
    if src.shape[0] == 0:
        return _empty_decoded(model)
    was_training = model.training
    model.eval()
    try:
        enc = model.encode(src, src_lengths)
        batch, k, device = src.shape[0], beam_size, src.device
        expand = torch.arange(batch, device=device).repeat_interleave(k)
        memory, mask, state = enc.memory[expand], enc.mask[expand], enc.state.index_select(expand)
        keys = None if model.decoder.attention is None else model.decoder.project_keys(memory)
        scores = torch.full((batch, k), float("-inf"), device=device, dtype=_score_dtype(enc.memory))
        scores[:, 0] = 0.0                                    # only one live hypothesis at the start
        history = torch.full((batch * k, 0), bos_id, dtype=torch.long, device=device)
        done = torch.zeros(batch * k, dtype=torch.bool, device=device)
        n_tokens = torch.zeros(batch * k, device=device, dtype=scores.dtype)
        attn_history = None
        y = torch.full((batch * k,), bos_id, dtype=torch.long, device=device)
        for _ in range(max_len):
            logits, state, w = model.decoder.step(y, state, memory, mask, keys)
            logp = _log_probs(logits)
            vocab = logp.shape[-1]
            frozen = torch.full_like(logp, float("-inf"))
            frozen[:, pad_id] = 0.0
            logp = torch.where(done[:, None], frozen, logp)
            candidates = (scores.reshape(-1, 1) + logp).reshape(batch, k * vocab)
            scores, index = candidates.topk(k, dim=1)         # (batch, k)
            parent = (index // vocab + torch.arange(batch, device=device)[:, None] * k).reshape(-1)
            y = (index % vocab).reshape(-1)
            state = state.index_select(parent)
            history = torch.cat([history[parent], y[:, None]], 1)
            n_tokens = n_tokens[parent] + (~done[parent]).to(n_tokens.dtype)
            done = done[parent] | (y == eos_id)
            if trace is not None:
                trace.append({"parent": (index // vocab).cpu(), "token": y.reshape(batch, k).cpu(),
                              "score": scores.cpu(), "done": done.reshape(batch, k).cpu(),
                              "n_tokens": n_tokens.reshape(batch, k).cpu()})
            if w is not None:
                step_w = w[parent][:, None, :]
                attn_history = step_w if attn_history is None else torch.cat([attn_history[parent], step_w], 1)
            if bool(done.all()):
                break
    finally:
        model.train(was_training)
    normalized = scores / n_tokens.reshape(batch, k).clamp_min(1.0) ** length_penalty
    best = normalized.argmax(1) + torch.arange(batch, device=device) * k
    tokens, used = zip(*(_cut(history[b].tolist(), eos_id) for b in best.tolist()))
    attn = None
    if attn_history is not None:
        attn = [attn_history[b, : used[i], : int(src_lengths[i])].cpu() for i, b in enumerate(best.tolist())]
    return Decoded([list(t) for t in tokens], normalized.max(1).values.cpu(), attn)


def beam_steps(model: Seq2Seq, src: Tensor, src_lengths: Tensor, beam_size: int = 4, max_len: int = 50, *,
               length_penalty: float = 1.0, bos_id: int = BOS_ID, eos_id: int = EOS_ID, pad_id: int = PAD_ID):
    """The beam of :func:`beam_search` at every step, for one sentence: what a figure of the search draws.

    Args:
        model, src, src_lengths, beam_size, max_len, length_penalty, bos_id, eos_id, pad_id: as in
            :func:`beam_search`; ``src`` must hold exactly one sentence, shape ``(1, src_len)``.

    Returns:
        A pandas DataFrame with one row per step (1, 2, ...) and rank in the beam (0 = the highest total
        log-probability): ``step, rank, parent`` (the rank at the previous step of the hypothesis it extends; at
        step 1 all extend ``<bos>``, parent 0), ``token`` (id; ``pad_id`` for a finished hypothesis carried
        along), ``score`` (total log-probability, natural log), ``done`` (it has produced ``<eos>``),
        ``n_tokens`` (generated tokens, ``<eos>`` included) and ``chosen`` (on the path of the translation that
        :func:`beam_search` returns). Ranks with a score of ``-inf`` (a beam wider than the candidates) are left
        out.

    Raises:
        ValueError: ``src`` does not hold exactly one sentence; otherwise as :func:`beam_search`.

    Chapter 4, section "Beam search".
    """
    import pandas as pd

    if src.dim() != 2 or src.shape[0] != 1:
        raise ValueError(f"src must hold exactly one sentence, shape (1, src_len), got {tuple(src.shape)}")
    trace: list = []
    beam_search(model, src, src_lengths, beam_size, max_len, length_penalty=length_penalty, bos_id=bos_id,
                eos_id=eos_id, pad_id=pad_id, trace=trace)
    rows = [{"step": step, "rank": rank, "parent": int(t["parent"][0, rank]), "token": int(t["token"][0, rank]),
             "score": float(t["score"][0, rank]), "done": bool(t["done"][0, rank]),
             "n_tokens": int(t["n_tokens"][0, rank])}
            for step, t in enumerate(trace, start=1) for rank in range(t["score"].shape[1])]
    frame = pd.DataFrame(rows)
    last = frame[frame.step == frame.step.max()]
    normalized = last.score / last.n_tokens.clip(lower=1) ** length_penalty
    rank, chosen = int(last.loc[normalized.idxmax(), "rank"]), set()
    for step in range(int(frame.step.max()), 0, -1):
        chosen.add((step, rank))
        rank = int(frame.loc[(frame.step == step) & (frame["rank"] == rank), "parent"].iloc[0])
    frame["chosen"] = [(s, r) in chosen for s, r in zip(frame.step, frame["rank"])]
    return frame[frame.score > float("-inf")].reset_index(drop=True)
