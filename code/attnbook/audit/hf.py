"""The padding audit for a Hugging Face transformers model: :func:`audit_hf` (chapter 10, "Padding bugs in the wild").

:func:`attnbook.audit.audit` sees a model only through ``forward(input_ids, attention_mask)``. For a transformers
``PreTrainedModel`` this module writes that forward the way the library's documentation asks a caller to: the
mask as ``attention_mask`` (1 = a real token), ``position_ids`` counted from the first real token when the model
takes them, a fixed decoder prefix for an encoder-decoder model. It reads the pad id and the vocabulary size from
``model.config``, so that the caller does not have to know that RoBERTa pads with id 1.

Only torch is imported here; transformers is the caller's (the model is already built).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from . import AuditReport, audit

__all__ = ["audit_hf", "POSITION_IDS", "model_kind", "positions_from_mask", "NO_PAD_TOKEN"]

#: The values of ``audit_hf(position_ids=...)``.
POSITION_IDS = ("from_mask", "none")
#: The warning :func:`audit_hf` gives when the config has no pad token id (and ``pad_id`` was not passed).
NO_PAD_TOKEN = ("model.config.pad_token_id is None; the audit pads with id 0 (pass pad_id=... to choose the id the "
                "model is padded with in use)")
#: The decoder prefix's length for an encoder-decoder model.
DECODER_LENGTH = 3


def positions_from_mask(mask: Tensor) -> Tensor:
    """Position ids that count from each row's first real token: ``cumsum(mask) - 1``, clamped at 0.

    Args:
        mask: bool or int ``(B, L)``, True/1 = a real token.

    Returns:
        int64 ``(B, L)``: 0, 1, 2, ... over the real tokens; the pads before the first real token get 0, those after
        the last keep counting from the last real position (they are masked, so their value does not matter). This is
        what transformers' ``generate`` computes for left-padded prompts (chapter 10, "Left padding and positions").
    """
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def _config_value(config: Any, name: str) -> Any:
    """``config.name``, or the text config's (``config.get_text_config()``) when the top level lacks it."""
    value = getattr(config, name, None)
    if value is None and hasattr(config, "get_text_config"):
        value = getattr(config.get_text_config(), name, None)
    return value


def model_kind(model: nn.Module) -> str:
    """``"encoder-decoder"``, ``"decoder"`` (causal: each token sees the tokens before it) or ``"encoder"``.

    Read from ``model.config``: ``is_encoder_decoder``, then ``is_decoder`` (BERT-like models built as decoders),
    then whether the model's type is in transformers' causal-LM auto mapping and not in the masked-LM one.
    """
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if getattr(config, "is_decoder", False):
        return "decoder"
    try:
        from transformers.models.auto import modeling_auto as auto
    except ImportError:  # pragma: no cover - a PreTrainedModel implies transformers
        return "encoder"
    model_type = getattr(config, "model_type", None)
    causal = model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return "decoder" if causal and not masked else "encoder"


def _takes(model: nn.Module, name: str) -> bool:
    """Whether ``model.forward`` has a parameter called ``name`` (by its signature)."""
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin forward
        return False


def _output(out: Any) -> Tensor:
    """The logits when the model returns them, else the last hidden state."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, Tensor):
            return value
    if isinstance(out, Tensor):
        return out
    raise TypeError(f"the model returned {type(out).__name__} without logits or last_hidden_state; audit it with "
                    f"attnbook.audit.audit and a forward that returns the output tensor")


def audit_hf(model: nn.Module, *, padding_side: str = "right", position_ids: str = "from_mask",
             **audit_kwargs: Any) -> AuditReport:
    """Audit a transformers ``PreTrainedModel``'s padding behaviour (any model with a ``config``), as its
    documentation asks a caller to use it.

    The forward it builds passes ``attention_mask`` (int64, 1 = a real token) and, for each kind of model
    (:func:`model_kind`):

    - encoder and decoder-only: ``input_ids`` and, when the model's ``forward`` takes ``position_ids`` and
      ``position_ids="from_mask"``, :func:`positions_from_mask` (what ``generate`` does for left-padded prompts);
      the output is per token (``output="token"``): ``logits`` when the model returns them, else
      ``last_hidden_state``. A decoder-only model is audited with ``causal=True`` (the ``causal_left_padding``
      check).
    - encoder-decoder: the padded batch goes to the encoder, and a fixed decoder prefix of
      ``DECODER_LENGTH`` ids (the decoder start id, then ids drawn once) to the decoder, the same for every row; the
      output is the decoder's (``logits`` or ``last_hidden_state``, ``(B, 3, ...)``, ``output="sequence"``), which
      reads the encoder through cross-attention under the padding mask. ``position_ids`` apply to the encoder when
      its model takes them (BART's and T5's do not).

    The model is put in eval mode for the audit (dropout would make two calls differ) and restored afterwards. The
    inputs are made on the device of the model's first parameter.

    Args:
        model: a transformers ``PreTrainedModel`` (an ``nn.Module`` with a ``config``), e.g. from
            ``AutoModelForCausalLM.from_config(config)``.
        padding_side: ``"right"`` or ``"left"``, as in :func:`attnbook.audit.audit`.
        position_ids: ``"from_mask"`` or ``"none"`` (the model's default positions, which count the pads under left
            padding). Ignored, and recorded as ``"not taken"`` in ``report.settings["position_ids"]``, when the
            model's ``forward`` has no ``position_ids`` parameter.
        **audit_kwargs: the other arguments of :func:`attnbook.audit.audit` (``lengths``, ``seed``, ``atol``,
            ``rtol``, ``modes``, ``optional``, ``causal``, ...). ``vocab_size`` and ``pad_id`` default to the
            config's ``vocab_size`` and ``pad_token_id`` (from ``config.get_text_config()`` when the top level lacks
            them); ``output`` defaults as above; ``device`` to the model's.

    Returns:
        The :class:`attnbook.audit.AuditReport`; ``report.settings`` also holds ``"model"`` (the class name),
        ``"kind"`` and ``"position_ids"`` (``"from_mask"``, ``"none"`` or ``"not taken"``).

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` with a ``config``; ``forward`` is passed in ``audit_kwargs``;
            the model's output has neither ``logits`` nor ``last_hidden_state``.
        ValueError: ``position_ids`` is not one of :data:`POSITION_IDS`; the config has no ``vocab_size`` and none
            was passed; the errors of :func:`attnbook.audit.audit`.

    Warns:
        UserWarning: the config's ``pad_token_id`` is None and ``pad_id`` was not passed (:data:`NO_PAD_TOKEN`): the
            audit pads with id 0. A correct model's outputs do not depend on the pad id (the ``pad_content`` check
            tests that), so the verdict holds for any pad id.
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model must be a transformers PreTrainedModel (an nn.Module with a config), got "
                        f"{type(model).__name__}; for another model, use attnbook.audit.audit with a forward")
    if position_ids not in POSITION_IDS:
        raise ValueError(f"position_ids must be one of {list(POSITION_IDS)}, got {position_ids!r}")
    if "forward" in audit_kwargs:
        raise TypeError("audit_hf builds the forward itself; pass the model, or use attnbook.audit.audit(forward)")
    config = model.config
    kwargs = dict(audit_kwargs)
    if kwargs.get("vocab_size") is None:
        vocab = _config_value(config, "vocab_size")
        if vocab is None:
            raise ValueError(f"model.config ({type(config).__name__}) has no vocab_size; pass vocab_size=...")
        kwargs["vocab_size"] = int(vocab)
    if kwargs.get("pad_id") is None:
        pad = _config_value(config, "pad_token_id")
        if pad is None:
            warnings.warn(NO_PAD_TOKEN, UserWarning, stacklevel=2)
            pad = 0
        kwargs["pad_id"] = int(pad)
    kind = model_kind(model)
    encoder_decoder = kind == "encoder-decoder"
    kwargs.setdefault("output", "sequence" if encoder_decoder else "token")
    if kind == "decoder":
        kwargs.setdefault("causal", True)
    parameter = next(iter(model.parameters()), None)
    kwargs.setdefault("device", parameter.device if parameter is not None else "cpu")
    device = torch.device(kwargs["device"])
    takes_positions = _takes(model, "position_ids")
    positions = position_ids if takes_positions else "not taken"

    decoder_ids = None
    if encoder_decoder:
        start = _config_value(config, "decoder_start_token_id")
        start = int(start) if start is not None else kwargs["pad_id"]
        generator = torch.Generator().manual_seed(int(kwargs.get("seed", 0)) + 1)
        rest = torch.randint(0, kwargs["vocab_size"] - 1, (DECODER_LENGTH - 1,), generator=generator)
        rest = rest + (rest >= kwargs["pad_id"]).long()
        decoder_ids = torch.cat([torch.tensor([start]), rest]).to(device)

    def forward(input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        extra: dict[str, Tensor] = {}
        if positions == "from_mask":
            extra["position_ids"] = positions_from_mask(attention_mask)
        if decoder_ids is not None:
            extra["decoder_input_ids"] = decoder_ids.expand(input_ids.shape[0], -1)
        out = model(input_ids=input_ids, attention_mask=attention_mask.long(), return_dict=True, **extra)
        return _output(out)

    was_training = model.training
    model.eval()
    try:
        report = audit(forward, padding_side=padding_side, **kwargs)
    finally:
        model.train(was_training)
    report.settings.update(model=type(model).__name__, kind=kind, position_ids=positions)
    return report
