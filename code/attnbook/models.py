"""Document classifiers of chapter 5: a BiGRU with attention pooling, and the Hierarchical Attention Network.

Explained in chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``),
sections "The model" and "HAN: fully padded sentences". Both follow Yang et al. (2016): word embeddings, a
bidirectional GRU, attention pooling with a learned context vector (:class:`attnbook.pooling.AttentionPooling`), and
a linear classifier on the pooled vector. HAN applies the same encoder-and-pool twice: words -> sentence vectors,
sentences -> document vector.

The encoder reads the padded batch in one of two ways (``packed``):

- packed (``nn.utils.rnn.pack_padded_sequence``): the GRU never sees a pad, and the states at pad positions are
  exactly zero (``pad_packed_sequence`` fills them with 0);
- unpacked: the GRU runs over the pads as if they were tokens (pad id 0 has a zero embedding, but the GRU's biases
  still move the state). With post-padding the backward direction reads every pad before the first real token;
  with pre-padding (``padding_side="pre"``) the forward direction does.

Masks follow the book's convention: a bool tensor, True = the position takes part (as in
``torch.nn.functional.scaled_dot_product_attention``).
"""

from __future__ import annotations

from torch import Tensor, nn

from .masking import check_lengths_for, lengths_to_mask
from .pooling import Pooling

__all__ = ["BiGRUEncoder", "BiGRUClassifier", "HAN", "padding_mask"]


def padding_mask(lengths: Tensor, max_len: int, padding_side: str = "post") -> Tensor:
    """Bool ``(B, max_len)`` mask, True = a real token: the first ``lengths[b]`` positions for ``"post"``
    padding, the last ``lengths[b]`` for ``"pre"`` padding. Lengths may be 0 (an all-False row).

    Raises:
        ValueError: unknown ``padding_side``; lengths outside ``[0, max_len]`` (from ``lengths_to_mask``).
    """
    if padding_side not in ("post", "pre"):
        raise ValueError(f"padding_side must be 'post' or 'pre', got {padding_side!r}")
    mask = lengths_to_mask(lengths, max_len)
    return mask if padding_side == "post" else mask.flip(-1)


class BiGRUEncoder(nn.Module):
    """Bidirectional GRU over ``inputs`` ``(B, T, input_size)`` -> states ``(B, T, 2 * hidden_size)``.

    Args:
        input_size, hidden_size: sizes (``hidden_size`` per direction).
        packed: pack the batch with ``lengths`` (post-padding only), so pad states are exactly 0; otherwise run over
            the pads.

    Call: ``encoder(inputs, lengths (B,) int64)``. Lengths must lie in ``[1, T]`` when ``packed`` (callers clamp
    empty rows), in ``[0, T]`` otherwise (then they are only checked, not used). An empty batch (``B = 0``) gives
    empty states ``(0, T, 2 * hidden_size)``.

    Raises:
        TypeError: ``inputs`` is not a tensor, or ``lengths`` is not of an integer dtype.
        ValueError: ``inputs`` is not 3-D; ``lengths`` is not of shape ``(B,)`` or outside the range above (the
            message gives the shapes and values).
    """

    def __init__(self, input_size: int, hidden_size: int, packed: bool = True) -> None:
        super().__init__()
        self.packed = packed
        self.gru = nn.GRU(input_size, hidden_size, batch_first=True, bidirectional=True)

    def forward(self, inputs: Tensor, lengths: Tensor) -> Tensor:
        if not isinstance(inputs, Tensor):
            raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__name__}")
        if inputs.dim() != 3:
            raise ValueError(f"inputs must have shape (batch, length, input_size), got {tuple(inputs.shape)}")
        lengths = check_lengths_for(inputs, lengths, x_name="inputs", min_length=1 if self.packed else 0)
        if inputs.shape[0] == 0:  # pack_padded_sequence refuses an empty batch
            return inputs.new_zeros(0, inputs.shape[1], 2 * self.gru.hidden_size)
        if not self.packed:
            return self.gru(inputs)[0]
        packed = nn.utils.rnn.pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = self.gru(packed)
        return nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=inputs.shape[1])[0]


class BiGRUClassifier(nn.Module):
    """Embedding -> BiGRU -> pooling -> linear: the word-level model of chapter 5 (Yang et al. 2016, eqs. 1-7 at
    the word level only).

    Args:
        vocab_size: number of token ids; id 0 is ``<pad>`` (zero embedding).
        embed_size, hidden_size, attention_size: layer sizes (Yang et al.: 200, 50 per direction, 100).
        num_classes: outputs.
        pooling: ``"attention"``, ``"mean"``, ``"uniform"`` or ``"last"`` (:class:`attnbook.pooling.Pooling`).
        masking: the masking variant of attention pooling (:data:`attnbook.pooling.MASKINGS`).
        packed: see the module docstring.
        padding_side: ``"post"`` (pads after the tokens) or ``"pre"``; packing needs ``"post"``.

    Call: ``model(ids (B, T) int64, lengths (B,) int64)`` -> ``(logits (B, num_classes), weights (B, T))``.
    ``ids`` must be padded on ``padding_side`` with id 0. The mask (True = a real token) is built from
    ``lengths``.

    Raises:
        ValueError: ``packed`` with ``padding_side="pre"``; unknown options; at the call, ``ids`` not 2-D, ``lengths``
            not of shape ``(B,)`` or outside ``[1, T]`` (the message gives the shapes and values).
        TypeError: at the call, ``ids`` not a tensor or ``lengths`` not of an integer dtype.
    """

    def __init__(self, vocab_size: int, embed_size: int = 200, hidden_size: int = 50, attention_size: int = 100,
                 num_classes: int = 2, pooling: str = "attention", masking: str = "neg_inf", packed: bool = True,
                 padding_side: str = "post") -> None:
        super().__init__()
        if padding_side not in ("post", "pre"):
            raise ValueError(f"padding_side must be 'post' or 'pre', got {padding_side!r}")
        if packed and padding_side != "post":
            raise ValueError("a packed encoder needs padding_side='post' (pack_padded_sequence expects trailing pads)")
        self.padding_side = padding_side
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.encoder = BiGRUEncoder(embed_size, hidden_size, packed)
        # The classifier is built before the pooling, so that one seed gives the same embedding, GRU and classifier
        # in every pooling and masking condition (paired seeds).
        self.classifier = nn.Linear(2 * hidden_size, num_classes)
        self.pooling = Pooling(pooling, 2 * hidden_size, attention_size, masking)

    def forward(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (batch, length), got {tuple(ids.shape)}")
        lengths = check_lengths_for(ids, lengths, x_name="ids", min_length=1)
        states = self.encoder(self.embedding(ids), lengths)
        mask = padding_mask(lengths.to(ids.device), ids.shape[1], self.padding_side)
        pooled, weights = self.pooling(states, mask)
        return self.classifier(pooled), weights


class HAN(nn.Module):
    """Hierarchical Attention Network (Yang et al. 2016): words -> sentence vectors -> document vector -> logits.

    Both levels are a packed BiGRU and :class:`attnbook.pooling.AttentionPooling` with the same ``masking``.
    Documents are padded with empty sentences (word length 0): their word-level attention row has no valid
    position. Under ``"neg_inf"`` (:func:`attnbook.masking.masked_softmax`) that row is all zeros and the sentence
    vector is 0, which the sentence-level mask then excludes. Under ``"neg_inf_unsafe"`` it is NaN; the packed
    sentence GRU never reads those vectors, so the first loss is finite, but the backward pass puts NaN into the word
    encoder's gradients and the loss is NaN from the next step on (chapter 5, section "HAN: fully padded
    sentences").

    Args:
        vocab_size, embed_size, hidden_size, attention_size, num_classes: as :class:`BiGRUClassifier`.
        masking: one of :data:`attnbook.pooling.MASKINGS` or ``"neg_inf_unsafe"``.

    Call: ``model(ids (B, S, T) int64, word_lengths (B, S) int64, sentence_lengths (B,) int64)`` ->
    ``(logits (B, num_classes), word_weights (B, S, T), sentence_weights (B, S))``. Sentence ``s`` of document
    ``b`` is real when ``s < sentence_lengths[b]``; its words are the first ``word_lengths[b, s]`` positions.

    Raises:
        ValueError: shapes that do not match (the message gives them); a word length outside ``[0, T]`` or a
            sentence length outside ``[0, S]`` (the message gives the range and the values).
        TypeError: lengths not of an integer dtype.
    """

    def __init__(self, vocab_size: int, embed_size: int = 200, hidden_size: int = 50, attention_size: int = 100,
                 num_classes: int = 2, masking: str = "neg_inf") -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_size, padding_idx=0)
        self.word_encoder = BiGRUEncoder(embed_size, hidden_size, packed=True)
        self.word_pooling = Pooling("attention", 2 * hidden_size, attention_size, masking)
        self.sentence_encoder = BiGRUEncoder(2 * hidden_size, hidden_size, packed=True)
        self.sentence_pooling = Pooling("attention", 2 * hidden_size, attention_size, masking)
        self.classifier = nn.Linear(2 * hidden_size, num_classes)

    def forward(self, ids: Tensor, word_lengths: Tensor, sentence_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if ids.dim() != 3 or word_lengths.shape != ids.shape[:2] or sentence_lengths.shape != ids.shape[:1]:
            raise ValueError(f"ids must be (B, S, T), word_lengths (B, S) and sentence_lengths (B,), got "
                             f"{tuple(ids.shape)}, {tuple(word_lengths.shape)} and {tuple(sentence_lengths.shape)}")
        word_lengths = check_lengths_for(ids, word_lengths, "word_lengths", x_name="ids", batch_dims=2)
        sentence_lengths = check_lengths_for(ids, sentence_lengths, "sentence_lengths", x_name="ids")
        batch, n_sentences, n_words = ids.shape
        flat_ids, flat_lengths = ids.reshape(batch * n_sentences, n_words), word_lengths.reshape(-1)
        # Empty sentences are packed with length 1 (pack_padded_sequence refuses 0); the mask still says "no word".
        states = self.word_encoder(self.embedding(flat_ids), flat_lengths.clamp_min(1))
        word_mask = lengths_to_mask(flat_lengths.to(ids.device), n_words)
        sentence_vectors, word_weights = self.word_pooling(states, word_mask)
        sentence_vectors = sentence_vectors.reshape(batch, n_sentences, -1)
        sentence_states = self.sentence_encoder(sentence_vectors, sentence_lengths.clamp_min(1))
        sentence_mask = lengths_to_mask(sentence_lengths.to(ids.device), n_sentences)
        document, sentence_weights = self.sentence_pooling(sentence_states, sentence_mask)
        return self.classifier(document), word_weights.reshape(batch, n_sentences, n_words), sentence_weights
