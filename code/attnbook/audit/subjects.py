"""The subjects of the padding audit: small adapters around the attention implementations people use.

Chapter 10, "Padding bugs in the wild", shows the table that :func:`run_registry` makes of them, and
``python -m attnbook.audit`` stores it. Each :class:`Subject` builds a randomly initialized model from a config (no
download, no data: ``HF_HUB_OFFLINE=1`` is set before transformers is imported) and wraps it as
``forward(input_ids, attention_mask)`` in the book's convention (bool mask, True = a real token), doing exactly what
a user of that library would do: negate the mask for torch's ``key_padding_mask``, pass ``position_ids`` or not,
run in training or eval mode, under ``torch.no_grad`` or ``torch.inference_mode`` (the fast paths) or not.

Keras runs on its torch backend: :func:`_keras` sets ``KERAS_BACKEND=torch`` before importing it. Keras reads the
variable once, at its first import, so if something imported keras earlier with another backend, the adapter
raises instead of silently testing that backend (``os.environ.setdefault`` would not be enough).

Why a subject fails a check, and the upstream thread that reports it, is in :data:`CAUSES`; a failure that has no
entry there is new (or one that a new version brought), and :func:`explain` says so.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import CAUSAL_CHECK, CHECKS, OPTIONAL_CHECKS, audit
from .checks import NAN_PLACES

__all__ = ["Subject", "Cause", "SUBJECTS", "CAUSES", "MECHANISMS", "ROOT_CAUSES", "CATEGORIES", "NAN_RULE", "nan_rule", "LIBRARIES", "VOCAB", "subject_names", "select",
           "library_versions", "run_subject", "run_registry", "wide_table", "cell", "explain", "failures", "by_root_cause",
           "EXPLAIN_COLUMNS",
           "not_reproduced", "d2l_masked_softmax"]

Forward = Callable[[Tensor, Tensor], Tensor]
#: Token ids are drawn from ``[1, VOCAB)``; 0 is the pad id everywhere.
VOCAB = 100
#: Sizes of every model: tiny, so that the whole registry runs in seconds on a CPU.
D_MODEL, HEADS, LAYERS, FFN = 16, 2, 2, 32


@dataclass(frozen=True)
class Subject:
    """One audited implementation, wrapped as ``forward(input_ids, attention_mask)``.

    Attributes:
        key: a short unique id, e.g. ``"torch-mha-fastpath"`` (``--only`` selects by it).
        name: what a reader calls it, e.g. ``"nn.MultiheadAttention, need_weights=False, eval + no_grad"``.
        library: ``"torch"``, ``"transformers"``, ``"keras"``, ``"x-transformers"``, ``"d2l"`` or ``"attnbook"``.
        build: ``build(seed) -> forward``: a fresh model, initialized from ``seed``.
        padding_side, output: passed to :func:`attnbook.audit.audit`.
        adapter: one line on what the adapter does (positions, path, mode).
        mode: the one grad mode it is audited in (``"grad"``, ``"no_grad"`` or ``"inference_mode"``): the mode
            the adapter itself sets, as its user would, so that each subject is one configuration and its failures
            are counted once.
        causal: the model is causal; the audit adds ``causal_left_padding``.
    """

    key: str
    name: str
    library: str
    build: Callable[[int], Forward]
    padding_side: str = "right"
    output: str = "token"
    adapter: str = ""
    mode: str = "no_grad"
    causal: bool = False


@dataclass(frozen=True)
class Cause:
    """Why a subject fails a check.

    Attributes:
        kind: ``"bug"`` (reported upstream as a defect), ``"by design"`` (documented behaviour: the caller must do
            something) or ``"recipe"`` (a published recipe's limit).
        mechanism: a key of :data:`MECHANISMS`.
        why: what happens, in one sentence.
        url: the upstream thread (issue or pull request) that reports it; ``""`` for the book's own models, whose
            failures are the book's experiments (``ref`` names the section).
        ref: a label of the book's section that shows it (for the book's own models).
        root_cause: a key of :data:`ROOT_CAUSES`: failures of several subjects that one cause explains share it,
            so that a summary counts the cause once.
    """

    kind: str
    mechanism: str
    why: str
    url: str = ""
    ref: str = ""
    root_cause: str = ""


#: How padding bugs happen (chapter 10, section "Why padding bugs happen").
MECHANISMS = {
    "mask": "a mask applied in one place and not another",
    "positions": "positions that ignore the mask",
    "path": "a second code path that takes another road",
    "overflow": "a constant that overflows",
    "refusal": "a row without tokens refused",
}

#: What a failure says about whom: the caller's side of a documented requirement, a library's contract for an
#: input with no answer (the empty row), a library's or recipe's own behaviour, or one of the book's deliberately
#: broken conditions.
CATEGORIES = {
    "caller": "the caller's requirement, stated by the library (the adapter leaves it out)",
    "contract": "a contract for a row with no real token",
    "library": "library or recipe behaviour",
    "book": "the book's own conditions, broken on purpose",
}

#: The category of the root causes that chapter 10's NaN rule sorts failure by failure (:func:`nan_rule`).
NAN_RULE = "by the NaN rule"


def nan_rule(nan_in: str, half_precision_only: bool = False) -> str:
    """Chapter 10's rule for a NaN, the same for every library. It reads forward outputs, which is what the audit
    checks (not gradients). A NaN that stays in the row without tokens, and that is the path's answer in the model's
    own dtype, is a contract choice (``"contract"``: the row has no answer, and NaN says so). A NaN that reaches a
    real token's output, or that appears only in half precision (an overflow, not an answer: fp32 gave the row
    finite outputs), is library or recipe behaviour (``"library"``), as is any failure of such a cause without a NaN.

    Args:
        nan_in: where the failing runs gave NaN or infinite outputs, the worst of their
            :attr:`attnbook.audit.checks.Result.nan_in`: ``""``, ``"empty row"`` or ``"real tokens"``.
        half_precision_only: the failure is the ``low_precision`` check's, which includes the empty row only when
            fp32 gives it finite outputs.
    """
    return "contract" if nan_in == "empty row" and not half_precision_only else "library"


#: ``{root_cause: (category, summary)}``: one entry per cause, however many subjects and checks it fails. A
#: category of :data:`NAN_RULE` is decided for each failure by :func:`nan_rule`, from where its NaN was measured.
ROOT_CAUSES = {
    "empty-row-nan": (NAN_RULE, "the weights path's own softmax gives a query with no key NaN (0/0), where SDPA "
                                "gives zeros"),
    "left-padding-positions": ("caller", "left padding without position_ids from the mask: the pads shift "
                                         "every real token's position"),
    "fastpath-empty-row-nan": (NAN_RULE, "the fused fast path's masked softmax gives a query with no key NaN, "
                                         "where SDPA gives zeros"),
    "fastpath-causal-nan": (NAN_RULE, "under a causal mask with left padding a left pad's query has no key; the "
                                      "fast path's NaN for it reaches every real token in the next layer"),
    "cpu-autocast-fastpath": ("library", "the fast path runs under CPU autocast with fp32 weights and "
                                         "half-precision inputs, and raises"),
    "fp16-fill-overflow": (NAN_RULE, "the recipe's fill of -1e6 overflows fp16, and a row without tokens, "
                                     "uniform in fp32, becomes 0/0 (an overflow, not an answer)"),
    "book-index-positions": ("book", "index positions under left padding (chapter 8's condition)"),
    "book-unmasked": ("book", "no mask: the pads take part (chapters 5 and 8's condition)"),
    "book-packed-empty-row": ("book", "the packed BiGRU refuses a row without a token"),
}


# --- adapters -----------------------------------------------------------------------------------------------------

def _seed(seed: int) -> None:
    torch.manual_seed(seed)


def _key_padding(mask: Tensor) -> Tensor:
    """torch's ``key_padding_mask`` (True = ignore) from the book's mask (True = a real token)."""
    return ~mask


def _torch_mha(need_weights: bool, training: bool) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        _seed(seed)
        embed = nn.Embedding(VOCAB, D_MODEL)
        mha = nn.MultiheadAttention(D_MODEL, HEADS, dropout=0.0, batch_first=True).train(training)

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            x = embed(ids)
            with torch.set_grad_enabled(training):
                return mha(x, x, x, key_padding_mask=_key_padding(mask), need_weights=need_weights)[0]
        return forward
    return build


def _torch_layer(training: bool) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        _seed(seed)
        embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True).train(training)

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            x = embed(ids)
            if training:
                return layer(x, src_key_padding_mask=_key_padding(mask))
            with torch.inference_mode():  # eval mode without autograd: torch's fused fast path
                return layer(x, src_key_padding_mask=_key_padding(mask)).clone()
        return forward
    return build


def _torch_encoder(nested: bool) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        _seed(seed)
        embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "enable_nested_tensor is True, but ..." when it is turned off
            encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=nested).eval()

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            x = embed(ids)
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # nested tensors are a prototype: torch warns once
                return encoder(x, src_key_padding_mask=_key_padding(mask)).clone()
        return forward
    return build


def _torch_encoder_causal(seed: int) -> Forward:
    """nn.TransformerEncoder with the causal mask (``generate_square_subsequent_mask``) and the padding mask: a
    decoder-only stack as people build it from torch's encoder."""
    _seed(seed)
    embed = nn.Embedding(VOCAB, D_MODEL)
    layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).eval()

    def forward(ids: Tensor, mask: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "mismatched src_key_padding_mask and mask" (bool and float)
            return encoder(embed(ids), mask=causal, src_key_padding_mask=_key_padding(mask)).clone()
    return forward


def _torch_sdpa(seed: int) -> Forward:
    _seed(seed)
    embed, qkv = nn.Embedding(VOCAB, D_MODEL), nn.Linear(D_MODEL, 3 * D_MODEL)

    def forward(ids: Tensor, mask: Tensor) -> Tensor:
        q, k, v = (t.unflatten(-1, (HEADS, -1)).transpose(1, 2) for t in qkv(embed(ids)).chunk(3, -1))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
        return out.transpose(1, 2).flatten(2)
    return forward


def _transformers():
    """transformers, imported offline and quietly."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    return transformers


def _hf(kind: str, positions: bool) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        tf = _transformers()
        _seed(seed)
        common = dict(vocab_size=VOCAB, pad_token_id=0)
        if kind == "bert":
            config = tf.BertConfig(hidden_size=D_MODEL, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                   intermediate_size=FFN, max_position_embeddings=256, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0, **common)
            model = tf.BertModel(config, add_pooling_layer=False)
        elif kind == "gpt2":
            config = tf.GPT2Config(n_embd=D_MODEL, n_layer=LAYERS, n_head=HEADS, n_positions=256, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, **common)
            model = tf.GPT2Model(config)
        else:
            config = tf.LlamaConfig(hidden_size=D_MODEL, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, num_key_value_heads=1, max_position_embeddings=256,
                                    **common)
            model = tf.LlamaModel(config)
        model.eval()

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            extra = {}
            if positions:  # what generate() does: count positions from the first real token
                extra["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)
            with torch.no_grad():
                return model(input_ids=ids, attention_mask=mask.long(), **extra).last_hidden_state
        return forward
    return build


def _keras():
    """Keras 3 on its torch backend. The backend is read once, when keras is first imported."""
    if "keras" in sys.modules:
        import keras

        if keras.backend.backend() != "torch":
            raise RuntimeError(f"keras was imported earlier with the {keras.backend.backend()!r} backend; set "
                               "KERAS_BACKEND=torch before anything imports keras")
        return keras
    os.environ["KERAS_BACKEND"] = "torch"
    import keras

    return keras


def _keras_mha(causal: bool) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        keras = _keras()
        keras.utils.set_random_seed(seed)
        embed = nn.Embedding(VOCAB, D_MODEL)
        mha = keras.layers.MultiHeadAttention(num_heads=HEADS, key_dim=D_MODEL // HEADS)
        probe = torch.zeros(1, 2, D_MODEL)
        mha(probe, probe)  # build the weights now, from the seed

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            x = embed(ids)
            keys = mask[:, None, :].expand(-1, mask.shape[1], -1)  # (B, T, S): query t may attend to key s
            with torch.no_grad():
                return mha(x, x, attention_mask=keys, use_causal_mask=causal)
        return forward
    return build


def _x_transformers(decoder: bool, start_positions: bool) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # its import calls torch.jit.script
            from x_transformers import Decoder, Encoder, TransformerWrapper

        _seed(seed)
        layers = (Decoder if decoder else Encoder)(dim=D_MODEL, depth=LAYERS, heads=HEADS)
        model = TransformerWrapper(num_tokens=VOCAB, max_seq_len=256, attn_layers=layers).eval()

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            extra = {"seq_start_pos": (~mask).long().sum(-1)} if start_positions else {}
            with torch.no_grad():
                return model(ids, mask=mask, **extra)
        return forward
    return build


def d2l_masked_softmax(scores: Tensor, valid_lens: Tensor) -> Tensor:
    """The masked softmax of *Dive into Deep Learning* (section "Attention Scoring Functions"), written from its
    description: the scores of the keys at or after each row's valid length are replaced by -1e6, a large negative
    number whose exponential is 0, and the softmax is taken over the last axis. ``scores`` ``(B, T, S)``,
    ``valid_lens`` ``(B,)``."""
    batch, queries, keys = scores.shape
    lens = valid_lens.repeat_interleave(queries)
    flat = scores.reshape(-1, keys).clone()
    flat[torch.arange(keys, device=scores.device)[None, :] >= lens[:, None]] = -1e6
    return flat.reshape(batch, queries, keys).softmax(-1)


def _d2l(seed: int) -> Forward:
    _seed(seed)
    embed, qkv = nn.Embedding(VOCAB, D_MODEL), nn.Linear(D_MODEL, 3 * D_MODEL)

    def forward(ids: Tensor, mask: Tensor) -> Tensor:
        q, k, v = qkv(embed(ids)).chunk(3, -1)
        weights = d2l_masked_softmax(q @ k.transpose(1, 2) / math.sqrt(D_MODEL), mask.sum(-1))
        return weights @ v
    return forward


def _book_transformer(masked: bool, side: str, positions: str) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        from attnbook.transformer import TransformerClassifier

        _seed(seed)
        model = TransformerClassifier(VOCAB, d_model=D_MODEL, nhead=HEADS, num_layers=LAYERS,
                                      dim_feedforward=FFN, dropout=0.0, masked=masked,
                                      padding_side="post" if side == "right" else "pre", positions=positions,
                                      readout="mean").eval()

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            with torch.no_grad():
                return model(ids, mask.sum(-1))[0]
        return forward
    return build


def _book_layer(seed: int) -> Forward:
    from attnbook.transformer import TransformerEncoderLayer

    _seed(seed)
    embed = nn.Embedding(VOCAB, D_MODEL)
    layer = TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.0).eval()

    def forward(ids: Tensor, mask: Tensor) -> Tensor:
        with torch.no_grad():
            return layer(embed(ids), padding_mask=mask)
    return forward


def _book_bigru(masking: str) -> Callable[[int], Forward]:
    def build(seed: int) -> Forward:
        from attnbook.models import BiGRUClassifier

        _seed(seed)
        model = BiGRUClassifier(VOCAB, embed_size=D_MODEL, hidden_size=8, attention_size=8, masking=masking,
                                packed=True).eval()

        def forward(ids: Tensor, mask: Tensor) -> Tensor:
            with torch.no_grad():
                return model(ids, mask.sum(-1))[0]
        return forward
    return build


# --- the registry -------------------------------------------------------------------------------------------------

_MHA = "nn.MultiheadAttention"
SUBJECTS: tuple[Subject, ...] = (
    Subject("torch-mha-weights-train", f"{_MHA}, need_weights=True, training", "torch", _torch_mha(True, True),
            adapter="key_padding_mask=~mask; training mode, autograd on", mode="grad"),
    Subject("torch-mha-weights-eval", f"{_MHA}, need_weights=True, eval", "torch", _torch_mha(True, False),
            adapter="key_padding_mask=~mask; eval mode under no_grad"),
    Subject("torch-mha-train", f"{_MHA}, need_weights=False, training", "torch", _torch_mha(False, True),
            adapter="key_padding_mask=~mask; training mode: the SDPA path", mode="grad"),
    Subject("torch-mha-fastpath", f"{_MHA}, need_weights=False, eval + no_grad", "torch", _torch_mha(False, False),
            adapter="key_padding_mask=~mask; eval mode under no_grad: the fused fast path"),
    Subject("torch-layer-train", "nn.TransformerEncoderLayer, training", "torch", _torch_layer(True),
            adapter="src_key_padding_mask=~mask; training mode", mode="grad"),
    Subject("torch-layer-fastpath", "nn.TransformerEncoderLayer, eval + inference_mode", "torch",
            _torch_layer(False), adapter="src_key_padding_mask=~mask; the fused fast path", mode="inference_mode"),
    Subject("torch-encoder-nested", "nn.TransformerEncoder, eval + inference_mode, nested tensors", "torch",
            _torch_encoder(True), adapter="enable_nested_tensor=True: pads are dropped, then restored as zeros",
            mode="inference_mode"),
    Subject("torch-encoder-fastpath", "nn.TransformerEncoder, eval + inference_mode, no nested tensors", "torch",
            _torch_encoder(False), adapter="enable_nested_tensor=False: the fast path on the padded batch",
            mode="inference_mode"),
    Subject("torch-encoder-causal", "nn.TransformerEncoder, causal mask, eval, autograd on", "torch",
            _torch_encoder_causal, adapter="mask=generate_square_subsequent_mask(L), src_key_padding_mask=~mask",
            mode="grad", causal=True),
    Subject("torch-encoder-causal-fastpath", "nn.TransformerEncoder, causal mask, eval + inference_mode", "torch",
            _torch_encoder_causal, adapter="the same under inference_mode: the fused fast path",
            mode="inference_mode", causal=True),
    Subject("torch-sdpa", "F.scaled_dot_product_attention, bool mask", "torch", _torch_sdpa,
            adapter="attn_mask=mask[:, None, None, :] (True = takes part)", mode="grad"),
    Subject("hf-bert-right", "BERT, right padding", "transformers", _hf("bert", False),
            adapter="BertModel.from config; attention_mask=mask"),
    Subject("hf-bert-left", "BERT, left padding, no position_ids", "transformers", _hf("bert", False), "left",
            adapter="positions 0..L-1 by default, pads included"),
    Subject("hf-bert-left-positions", "BERT, left padding, position_ids from the mask", "transformers",
            _hf("bert", True), "left", adapter="position_ids = cumsum(mask) - 1"),
    Subject("hf-gpt2-right", "GPT-2, right padding", "transformers", _hf("gpt2", False),
            adapter="GPT2Model from config; attention_mask=mask"),
    Subject("hf-gpt2-left", "GPT-2, left padding, no position_ids", "transformers", _hf("gpt2", False), "left",
            adapter="positions 0..L-1 by default, pads included"),
    Subject("hf-gpt2-left-positions", "GPT-2, left padding, position_ids from the mask", "transformers",
            _hf("gpt2", True), "left", adapter="position_ids = cumsum(mask) - 1"),
    Subject("hf-llama-right", "Llama-style (RoPE), right padding", "transformers", _hf("llama", False),
            adapter="LlamaModel from config; attention_mask=mask"),
    Subject("hf-llama-left", "Llama-style (RoPE), left padding, no position_ids", "transformers",
            _hf("llama", False), "left", adapter="positions 0..L-1 by default, pads included"),
    Subject("hf-llama-left-positions", "Llama-style (RoPE), left padding, position_ids from the mask",
            "transformers", _hf("llama", True), "left", adapter="position_ids = cumsum(mask) - 1"),
    Subject("keras-mha", "keras.layers.MultiHeadAttention", "keras", _keras_mha(False),
            adapter="attention_mask (B, T, S) from the key mask; torch backend"),
    Subject("keras-mha-causal", "keras.layers.MultiHeadAttention, use_causal_mask=True", "keras", _keras_mha(True),
            adapter="attention_mask and the causal mask combined; torch backend"),
    Subject("xt-encoder-right", "x-transformers Encoder, right padding", "x-transformers",
            _x_transformers(False, False), adapter="TransformerWrapper(mask=mask); learned absolute positions"),
    Subject("xt-encoder-left", "x-transformers Encoder, left padding", "x-transformers",
            _x_transformers(False, False), "left", adapter="positions 0..L-1, pads included"),
    Subject("xt-decoder-right", "x-transformers Decoder, right padding", "x-transformers",
            _x_transformers(True, False), adapter="TransformerWrapper(mask=mask); causal"),
    Subject("xt-decoder-left", "x-transformers Decoder, left padding", "x-transformers",
            _x_transformers(True, False), "left", adapter="positions 0..L-1, pads included"),
    Subject("xt-decoder-left-start", "x-transformers Decoder, left padding, seq_start_pos", "x-transformers",
            _x_transformers(True, True), "left", adapter="seq_start_pos = number of leading pads"),
    Subject("d2l-masked-softmax", "d2l masked softmax (fill -1e6), self-attention", "d2l", _d2l,
            adapter="valid_lens = mask.sum(-1); right padding, as the recipe assumes", mode="grad"),
    Subject("book-transformer-right", "attnbook TransformerClassifier, masked, right padding", "attnbook",
            _book_transformer(True, "right", "index"), output="sequence", adapter="chapter 8's classifier"),
    Subject("book-transformer-left", "attnbook TransformerClassifier, masked, left padding, positions from "
            "the first token", "attnbook", _book_transformer(True, "left", "first_token"), "left", "sequence",
            adapter="positions_from_mask"),
    Subject("book-transformer-left-index", "attnbook TransformerClassifier, masked, left padding, index "
            "positions", "attnbook", _book_transformer(True, "left", "index"), "left", "sequence",
            adapter="chapter 8's left-padding condition"),
    Subject("book-transformer-unmasked", "attnbook TransformerClassifier, unmasked, right padding", "attnbook",
            _book_transformer(False, "right", "index"), output="sequence",
            adapter="chapter 8's unmasked condition"),
    Subject("book-encoder-layer", "attnbook TransformerEncoderLayer", "attnbook", _book_layer,
            adapter="padding_mask=mask (True = a real token)"),
    Subject("book-bigru-masked", "attnbook BiGRU + attention pooling, -inf mask", "attnbook",
            _book_bigru("neg_inf"), output="sequence", adapter="chapter 5's classifier, packed"),
    Subject("book-bigru-unmasked", "attnbook BiGRU + attention pooling, no mask", "attnbook", _book_bigru("none"),
            output="sequence", adapter="chapter 5's unmasked condition"),
)

#: The libraries in the order of the table, with the distribution whose version is reported.
LIBRARIES = {"torch": "torch", "transformers": "transformers", "keras": "keras",
             "x-transformers": "x-transformers", "d2l": None, "attnbook": "attnbook"}

_TORCH_NAN = ("the weights path takes a plain softmax of a row that is all -inf, 0/0 = NaN (the SDPA path, "
              "need_weights=False in training, returns zeros)")
_FASTPATH_NAN = ("the fused fast path's masked softmax gives NaN for a query with no key, where the SDPA "
                 "fallback gives zeros")
_CAUSAL_NAN = ("under the causal mask a left pad's query sees no key; the fused fast path gives it NaN, and in the "
               "next layer that NaN, a masked key's value, reaches every real token (0 * NaN = NaN); the SDPA path, "
               "with autograd on, gives zeros and passes")
_AUTOCAST = ("the fast-path check misses CPU autocast, so the fused kernel gets fp32 weights and half-precision "
             "inputs, and raises")
_ABSOLUTE = "absolute positions count the pads, so left padding shifts every real token's position"
_BERT_TIP = (_ABSOLUTE + "; BERT's documentation advises padding on the right")
_GPT2 = (_ABSOLUTE + "; GPT-2's documentation advises padding on the right, and generate() builds position_ids "
         "from the mask, which a direct call must do itself")
_XT = _ABSOLUTE + "; TransformerWrapper takes seq_start_pos (the number of leading pads) to shift them back"
_D2L_FP16 = ("-1e6 is below fp16's range (-65504): the fill becomes -inf, and the valid_len = 0 row, uniform in "
             "fp32, becomes 0/0 = NaN")
_UNMASKED_KEYS = "the pads take part in self-attention as keys"
_ZERO_STATES = "the zero states of the pads get attention weight, which shrinks the pooled vector"
_NO_PACK = ("the packed BiGRU cannot pack a sequence of length 0, so the classifier refuses a row without a token "
            "with a ValueError")
_PT, _HF, _XTURL = ("https://github.com/pytorch/pytorch/", "https://github.com/huggingface/transformers/",
                    "https://github.com/lucidrains/x-transformers/")
_BERT_DOCS = "https://huggingface.co/docs/transformers/model_doc/bert"
_D2L_BOOK = "https://d2l.ai/chapter_attention-mechanisms-and-transformers/attention-scoring-functions.html"


def _shifted(why: str = _ABSOLUTE, url: str = "", ref: str = "", kind: str = "by design",
             root_cause: str = "left-padding-positions") -> dict[str, Cause]:
    """Left padding with index positions: batch_equivalence and extra_padding fail."""
    cause = Cause(kind, "positions", why, url, ref, root_cause)
    return {"batch_equivalence": cause, "extra_padding": cause}


_EMPTY_ROW_WEIGHTS = Cause("by design", "path", _TORCH_NAN, _PT + "issues/41508", root_cause="empty-row-nan")
# one kernel, two symptoms, which the NaN rule sorts apart: the fast path's masked softmax (pytorch/pytorch#190486,
# "a silent divergence" from SDPA) gives an empty row NaN that stays there, and, under a causal mask with left
# padding, NaN that reaches the real tokens; the weights path's NaN (#41508) is a different softmax
_EMPTY_ROW_FASTPATH = Cause("by design", "path", _FASTPATH_NAN, _PT + "pull/190486",
                            root_cause="fastpath-empty-row-nan")
_CAUSAL = Cause("bug", "path", _CAUSAL_NAN, _PT + "pull/190486", root_cause="fastpath-causal-nan")

#: ``CAUSES[subject_key][check]``: why that subject fails that check, with the upstream thread (or, where none
#: exists, the documentation that states the requirement).
CAUSES: dict[str, dict[str, Cause]] = {
    "torch-mha-weights-train": {"empty_row": _EMPTY_ROW_WEIGHTS},
    "torch-mha-weights-eval": {"empty_row": _EMPTY_ROW_WEIGHTS},
    "torch-mha-fastpath": {"empty_row": _EMPTY_ROW_FASTPATH},
    "torch-layer-fastpath": {"empty_row": _EMPTY_ROW_FASTPATH},
    "torch-encoder-fastpath": {"empty_row": _EMPTY_ROW_FASTPATH},
    "torch-encoder-causal-fastpath": {"empty_row": _EMPTY_ROW_FASTPATH, CAUSAL_CHECK: _CAUSAL},
    "torch-encoder-nested": {"low_precision": Cause("bug", "path", _AUTOCAST, _PT + "issues/107663",
                                                    root_cause="cpu-autocast-fastpath")},
    "hf-bert-left": _shifted(_BERT_TIP, _BERT_DOCS),
    "hf-gpt2-left": _shifted(_GPT2, "https://huggingface.co/docs/transformers/v4.45.1/en/model_doc/gpt2"),
    "xt-encoder-left": _shifted(_XT, _XTURL + "blob/main/x_transformers/x_transformers.py"),
    "xt-decoder-left": _shifted(_XT, _XTURL + "issues/185"),
    "d2l-masked-softmax": {
        "low_precision": Cause("recipe", "overflow", _D2L_FP16, _D2L_BOOK, root_cause="fp16-fill-overflow")},
    "book-transformer-left-index": _shifted(ref="sec-tf-padding", root_cause="book-index-positions"),
    "book-transformer-unmasked": {
        check: Cause("by design", "mask", _UNMASKED_KEYS, ref="sec-tf-padding", root_cause="book-unmasked")
        for check in ("batch_equivalence", "extra_padding", "pad_content")},
    "book-bigru-masked": {"empty_row": Cause("by design", "refusal", _NO_PACK, ref="sec-masking-answer",
                                             root_cause="book-packed-empty-row")},
    "book-bigru-unmasked": {
        "batch_equivalence": Cause("by design", "mask", _ZERO_STATES, ref="sec-masking-answer",
                                   root_cause="book-unmasked"),
        "extra_padding": Cause("by design", "mask", _ZERO_STATES, ref="sec-masking-answer",
                               root_cause="book-unmasked"),
        "empty_row": Cause("by design", "refusal", _NO_PACK, ref="sec-masking-answer",
                           root_cause="book-packed-empty-row")},
}


def subject_names() -> list[str]:
    """The keys of :data:`SUBJECTS`, in order."""
    return [s.key for s in SUBJECTS]


def select(only: str | Iterable[str] | None = None) -> list[Subject]:
    """The subjects whose key equals, or starts with, one of ``only`` (comma-separated, or a list); all when
    ``None`` or empty. Raises ``ValueError`` for a name that matches none (the message lists the keys)."""
    if not only:
        return list(SUBJECTS)
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    chosen, unknown = [], []
    for name in names:
        found = [s for s in SUBJECTS if s.key == name or s.key.startswith(name)]
        if not found:
            unknown.append(name)
        chosen += [s for s in found if s not in chosen]
    if unknown:
        raise ValueError(f"unknown subject(s) {unknown}; the subjects are {subject_names()}")
    return chosen


def library_versions(libraries: Iterable[str] | None = None) -> dict[str, str]:
    """``{library: version}`` of the installed libraries (``"recipe"`` for d2l, which is not installed: its masked
    softmax is written out in :func:`d2l_masked_softmax`; ``"not installed"`` where the import fails)."""
    versions = {}
    for library in (libraries or LIBRARIES):
        distribution = LIBRARIES.get(library)
        if distribution is None:
            versions[library] = "recipe"
        elif distribution == "torch":
            versions[library] = torch.__version__.split("+")[0]
        elif distribution == "attnbook":
            import attnbook

            versions[library] = attnbook.__version__
        else:
            try:
                versions[library] = metadata.version(distribution)
            except metadata.PackageNotFoundError:
                versions[library] = "not installed"
    return versions


def run_subject(subject: Subject, *, seed: int = 0, lengths: Sequence[int] = (7, 3, 12, 1),
                optional: Iterable[str] = OPTIONAL_CHECKS, atol: float | None = None, rtol: float | None = None,
                modes: Sequence[str] | None = None, vocab_size: int = VOCAB, pad_id: int = 0) -> pd.DataFrame:
    """Build ``subject`` from ``seed`` and audit it in its mode (``subject.mode``, unless ``modes`` is given; with
    ``causal_left_padding`` when ``subject.causal``): one row per check and mode, with the columns of
    :attr:`attnbook.audit.AuditReport.checks` and ``subject, name, library, seed, lengths`` in front, ``seconds`` at
    the end. ``atol``/``rtol`` as in :func:`attnbook.audit.audit` (None: the output dtype's defaults)."""
    start = time.perf_counter()
    forward = subject.build(seed)
    report = audit(forward, list(lengths), vocab_size, padding_side=subject.padding_side, output=subject.output,
                   pad_id=pad_id, seed=seed, atol=atol, rtol=rtol, optional=list(optional),
                   modes=list(modes) if modes is not None else [subject.mode], causal=subject.causal)
    table = report.checks.copy()
    table.insert(0, "subject", subject.key)
    table.insert(1, "name", subject.name)
    table.insert(2, "library", subject.library)
    table.insert(3, "seed", seed)
    table.insert(4, "lengths", " ".join(str(n) for n in lengths))
    table["seconds"] = round(time.perf_counter() - start, 3)
    return table


def run_registry(subjects: Iterable[Subject] | None = None, *, seeds: Iterable[int] = (0,),
                 lengths: Iterable[Sequence[int]] = ((7, 3, 12, 1),), optional: Iterable[str] = OPTIONAL_CHECKS,
                 atol: float | None = None, rtol: float | None = None,
                 progress: Callable | None = None) -> pd.DataFrame:
    """Audit every subject (default: all of :data:`SUBJECTS`) for every seed and set of lengths; one row per
    subject, seed, lengths and check (see :func:`run_subject`)."""
    subjects = list(SUBJECTS if subjects is None else subjects)
    jobs = [(s, seed, tuple(ls)) for s in subjects for seed in seeds for ls in lengths]
    iterator = progress(jobs, desc="audit") if progress else jobs
    tables = [run_subject(s, seed=seed, lengths=ls, optional=optional, atol=atol, rtol=rtol)
              for s, seed, ls in iterator]
    return pd.concat(tables, ignore_index=True)


def cell(rows: pd.DataFrame) -> str:
    """The table's word for one subject and check over all its runs (rows): ``"pass"``; ``"error"`` (the forward
    raised), ``"NaN"`` (non-finite outputs), ``"ignored"`` (the mask was not read), ``"not deterministic"`` or
    ``"differs"`` (finite outputs off by more than the tolerance) for the first failing run; ``"-"`` when not
    run."""
    if rows.empty:
        return "-"
    failed = rows[~rows["passed"].astype(bool)]
    if failed.empty:
        return "pass"
    detail = str(failed["detail"].iloc[0])
    if "forward raised" in detail:
        return "error"
    if "NaN or infinite" in detail:
        return "NaN"
    if "not read" in detail:
        return "ignored"
    if "not deterministic" in detail:
        return "not deterministic"
    return "differs"


def _checks_run(results: pd.DataFrame) -> list[str]:
    ran = set(results["check"])
    return [c for c in ("deterministic", *CHECKS, CAUSAL_CHECK, *OPTIONAL_CHECKS) if c in ran]


def wide_table(results: pd.DataFrame, checks: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per subject (in the order of the results), one column per check, cells from :func:`cell` (``"-"``
    where a subject did not run a check, e.g. ``causal_left_padding`` for a model that is not causal); the
    subject's name and library in front (its grad mode is in ``results["mode"]``)."""
    checks = list(checks or _checks_run(results))
    rows = []
    for key, group in results.groupby("subject", sort=False):
        row = {"subject": group["name"].iloc[0], "library": group["library"].iloc[0]}
        for check in checks:
            row[check] = cell(group[group["check"] == check])
        rows.append(row)
    return pd.DataFrame(rows, columns=["subject", "library", *checks])


def failures(results: pd.DataFrame) -> pd.DataFrame:
    """One row per failed (subject, check), over all runs: ``subject, name, library, check, mode, runs_failed, runs,
    max_abs_diff, max_rel_diff, detail, nan_in`` (the largest differences of the failing runs, the detail of the
    first one, and the worst place a NaN reached in any of them; ``""`` for results stored without ``nan_in``)."""
    rows = []
    if "nan_in" not in results.columns:
        results = results.assign(nan_in="")
    for (key, check), group in results.groupby(["subject", "check"], sort=False):
        failed = group[~group["passed"].astype(bool)]
        if failed.empty:
            continue
        rows.append({"subject": key, "name": group["name"].iloc[0], "library": group["library"].iloc[0],
                     "check": check, "mode": ", ".join(dict.fromkeys(str(m) for m in failed["mode"])),
                     "runs_failed": len(failed), "runs": len(group), "max_abs_diff": failed["max_abs_diff"].max(),
                     "max_rel_diff": failed["max_rel_diff"].max(), "detail": failed["detail"].iloc[0],
                     "nan_in": max(failed["nan_in"].fillna("").astype(str), key=NAN_PLACES.index)})
    return pd.DataFrame(rows, columns=["subject", "name", "library", "check", "mode", "runs_failed", "runs",
                                       "max_abs_diff", "max_rel_diff", "detail", "nan_in"])


#: The columns of :func:`explain`.
EXPLAIN_COLUMNS = ["subject", "name", "library", "check", "mode", "kind", "mechanism", "root_cause", "category",
                   "nan_in", "why", "url", "ref", "known"]


def explain(results: pd.DataFrame) -> pd.DataFrame:
    """The failures (:func:`failures`) with their causes from :data:`CAUSES`: columns :data:`EXPLAIN_COLUMNS`.
    ``root_cause`` is a key of :data:`ROOT_CAUSES` and ``category`` one of :data:`CATEGORIES` (``"caller"``,
    ``"contract"``, ``"library"``, ``"book"``): the root cause's, or, for a root cause of :data:`NAN_RULE`, the
    one :func:`nan_rule` gives the failure's measured ``nan_in``. ``known`` is False (``kind`` and ``category`` "unexplained") for a
    failure that :data:`CAUSES` does not list."""
    table = failures(results)
    rows = []
    for row in table.itertuples(index=False):
        cause = CAUSES.get(row.subject, {}).get(row.check)
        root = cause.root_cause if cause else ""
        category = ROOT_CAUSES[root][0] if root else "unexplained"
        if category == NAN_RULE:
            category = nan_rule(row.nan_in, row.check == "low_precision")
        rows.append({"subject": row.subject, "name": row.name, "library": row.library, "check": row.check,
                     "mode": row.mode, "kind": cause.kind if cause else "unexplained",
                     "mechanism": cause.mechanism if cause else "", "root_cause": root,
                     "category": category, "nan_in": row.nan_in,
                     "why": cause.why if cause else row.detail, "url": cause.url if cause else "",
                     "ref": cause.ref if cause else "", "known": cause is not None})
    return pd.DataFrame(rows, columns=EXPLAIN_COLUMNS)


def by_root_cause(results: pd.DataFrame) -> pd.DataFrame:
    """The failures grouped by root cause, each counted once: ``category, root_cause, summary, subjects,
    checks, failures`` (the number of distinct subjects, of distinct checks, and of failed (subject, check)
    pairs), ordered by category (:data:`CATEGORIES`) and then by the number of subjects. Unexplained failures form
    one group per subject and check."""
    table = explain(results)
    rows = []
    for row in table.itertuples(index=False):
        root = row.root_cause or f"unexplained: {row.subject} / {row.check}"
        rows.append({"category": row.category, "root_cause": root, "subject": row.subject, "check": row.check,
                     "summary": ROOT_CAUSES[row.root_cause][1] if row.root_cause else row.why})
    columns = ["category", "root_cause", "summary", "subjects", "checks", "failures"]
    if not rows:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(rows)
    grouped = (frame.groupby(["category", "root_cause"], sort=False)
               .agg(summary=("summary", "first"), subjects=("subject", "nunique"), checks=("check", "nunique"),
                    failures=("subject", "size")).reset_index())
    order = {c: k for k, c in enumerate([*CATEGORIES, "unexplained"])}
    grouped["_order"] = grouped["category"].map(order)
    return grouped.sort_values(["_order", "subjects"], ascending=[True, False], kind="stable")[columns].reset_index(
        drop=True)


def not_reproduced(results: pd.DataFrame) -> list[tuple[str, str]]:
    """``(subject, check)`` pairs that :data:`CAUSES` lists but that passed in ``results`` (a fix, or a changed
    default, in the installed version); only subjects and checks that were run count."""
    ran = {(s, c) for s, c in zip(results["subject"], results["check"])}
    failed = {(r.subject, r.check) for r in failures(results).itertuples(index=False)}
    return [(s, c) for s, checks in CAUSES.items() for c in checks if (s, c) in ran and (s, c) not in failed]
