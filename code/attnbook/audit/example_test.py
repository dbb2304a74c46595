"""A test file that a library can copy: the padding audit of a model in its own test suite (chapter 10, section
"The audit in your own test suite").

Replace ``build_model`` and ``forward`` with your model and the way your users call it (their mask, their position
ids, eval mode), and run ``pytest``. ``assert_padding_safe`` fails the test with the audit's report: which check, in
which grad mode, by how much. A behaviour you accept and document (here, torch's fast path gives NaN for a row with
no real token) stays visible as a test that asserts exactly that failure, and tells you when it changes.

Needs only ``pip install attnbook pytest`` (torch, numpy, pandas).
"""

import pytest
import torch
from torch import nn

from attnbook.audit import assert_padding_safe, audit

VOCAB, PAD_ID = 100, 0


def build_model(seed: int = 0) -> nn.Module:
    """Your model. Here: token embeddings and two layers of torch's Transformer encoder, in eval mode."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return nn.ModuleDict({"embed": nn.Embedding(VOCAB, 16, padding_idx=PAD_ID), "encoder": encoder}).eval()


def forward(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """How your users call it. The audit's mask is True for a real token; torch's key_padding_mask is the opposite."""
    return model["encoder"](model["embed"](input_ids), src_key_padding_mask=~attention_mask)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_padding_does_not_change_real_outputs(padding_side):
    model = build_model()
    assert_padding_safe(lambda ids, mask: forward(model, ids, mask), vocab_size=VOCAB, pad_id=PAD_ID,
                        output="token", padding_side=padding_side, modes=["grad"], lengths=[7, 3, 12, 1])


def test_without_autograd_a_row_with_no_token_is_nan_on_torchs_fast_path():
    """Discussed upstream (pytorch/pytorch#41508); asserted exactly, so that the test tells you when it changes."""
    model = build_model()
    report = audit(lambda ids, mask: forward(model, ids, mask), vocab_size=VOCAB, pad_id=PAD_ID, output="token",
                   modes=["no_grad"])
    assert report.failed == ["empty_row"], report
    with pytest.raises(AssertionError, match="empty_row"):
        assert_padding_safe(report)
