"""Causal packing for language-model training (chapter 9, section "Packing for a language model"): the causal option
of :mod:`attnbook.packing`'s attention functions against torch's ``F.scaled_dot_product_attention(...,
is_causal=True)`` on every document alone; and the packed loss and gradients of chapter 8's
:class:`attnbook.generation.DecoderOnlyLM` against an independent reference: every document run alone through the
model's ordinary ``forward`` (no mask, no pads, positions 0 .. n - 1), its next-token loss from
``F.cross_entropy``, summed over documents and divided by the number of predicted tokens."""

import inspect

import pytest
import torch
import torch.nn.functional as F

from attnbook.batching import document_ids
from attnbook.generation import DecoderOnlyLM
from attnbook.packing import (IGNORE_INDEX, BackendUnavailable, count_targets, document_attention,
                              document_causal_mask, flex_document_attention, lm_labels, lm_loss, packed_lm_logits,
                              varlen_attention)

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = [[4, 3, 2], [6], [1, 1, 5], [9]]          # documents' lengths per packed row of 10 (pads at the end)


def _doc_ids():
    return document_ids(ROWS, 10)


def _qkv(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(len(ROWS), 2, 10, 4, generator=g, dtype=dtype) for _ in range(3))


def _alone_causal(q, k, v, doc):
    """Each document cut out and attended alone by torch's SDPA with ``is_causal=True``; zeros at pads."""
    out = torch.zeros_like(q)
    for b in range(len(doc)):
        for d in range(int(doc[b].max()) + 1):
            where = (doc[b] == d).nonzero().flatten()
            out[b][:, where] = F.scaled_dot_product_attention(q[b][:, where], k[b][:, where], v[b][:, where],
                                                              is_causal=True)
    return out


# ---------------------------------------------------------------- the causal option
def test_document_causal_mask_by_hand():
    doc = torch.tensor([[0, 0, 1, 1, -1]])
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [0, 0, 1, 0, 0],
                             [0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 0]], dtype=torch.bool)
    assert torch.equal(document_causal_mask(doc)[0], expected)


def test_causal_dense_mask_equals_each_document_alone_with_is_causal():
    q, k, v = _qkv()
    doc = _doc_ids()
    expected = _alone_causal(q, k, v, doc)
    torch.testing.assert_close(document_attention(q, k, v, doc, causal=True), expected, atol=1e-12, rtol=1e-12)
    # not causal is not the same: a causal option that did nothing would fail here
    assert (document_attention(q, k, v, doc) - expected).abs().max() > 0.1


def test_causal_flex_equals_each_document_alone_with_is_causal():
    q, k, v = _qkv()
    doc = _doc_ids()
    try:
        out = flex_document_attention(q, k, v, doc, causal=True)
    except BackendUnavailable as err:  # pragma: no cover - runs with the pinned torch on a CPU
        pytest.skip(f"FlexAttention does not run here: {err}")
    torch.testing.assert_close(out, _alone_causal(q, k, v, doc), atol=1e-12, rtol=1e-12)


def test_nested_varlen_cannot_be_causal():
    q, k, v = _qkv()
    with pytest.raises(BackendUnavailable, match="backend='nested' cannot be causal: torch's jagged nested-tensor "
                                                 "SDPA refuses is_causal=True"):
        varlen_attention(q, k, v, _doc_ids(), backend="nested", causal=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="varlen_attn needs CUDA")
def test_causal_varlen_on_cuda_equals_each_document_alone():  # pragma: no cover - GPU only
    q, k, v = (x.to("cuda", torch.float16) for x in _qkv())
    doc = _doc_ids().cuda()
    expected = _alone_causal(*(x.float() for x in (q, k, v)), doc)
    torch.testing.assert_close(varlen_attention(q, k, v, doc, backend="varlen", causal=True).float(), expected,
                               atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("function", [document_attention, flex_document_attention, varlen_attention])
def test_causal_must_be_a_bool(function):
    with pytest.raises(TypeError, match="causal must be True or False, got 1"):
        function(*_qkv(), _doc_ids(), causal=1)


# ---------------------------------------------------------------- labels and the loss
def test_lm_labels_by_hand():
    ids = torch.tensor([[5, 6, 7, 8, 9, 0]])
    doc = torch.tensor([[0, 0, 0, 1, 1, -1]])
    assert lm_labels(ids, doc).tolist() == [[-100, 6, 7, -100, 9, -100]]
    assert count_targets(lm_labels(ids, doc)) == 3            # 6, 7 and 9: (3 - 1) + (2 - 1)
    assert IGNORE_INDEX == inspect.signature(F.cross_entropy).parameters["ignore_index"].default == -100


def _model(positional, seed=0, layers=2):
    torch.manual_seed(seed)
    return DecoderOnlyLM(23, d_model=16, nhead=2, num_layers=layers, dim_feedforward=24, positional=positional,
                         max_len=16).double()


def _packed_batch(seed=1):
    """Documents of random tokens (ids 1..22) packed into rows; the documents, and the rows' ids and doc ids."""
    g = torch.Generator().manual_seed(seed)
    doc = _doc_ids()
    ids = torch.zeros(doc.shape, dtype=torch.long)
    docs = []
    for b, row in enumerate(ROWS):
        for d in range(len(row)):
            where = (doc[b] == d).nonzero().flatten()
            tokens = torch.randint(1, 23, (len(where),), generator=g)
            ids[b, where] = tokens
            docs.append(tokens)
    return docs, ids, doc


def _reference_loss(model, docs):
    """The independent reference: each document alone through the model's ordinary forward, torch's cross-entropy
    summed over the document's next-token predictions, then divided by the number of predictions of all."""
    total = sum(F.cross_entropy(model(t[None])[0, :-1], t[1:], reduction="sum") for t in docs)
    return total / sum(len(t) - 1 for t in docs)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_packed_loss_and_gradients_equal_the_per_document_ones(positional):
    """Two micro-batches (rows 0-1 and rows 2-3) with the loss normalized by the step's real targets and the
    gradients accumulated: the same loss and the same gradients as every document alone."""
    docs, ids, doc = _packed_batch()
    model = _model(positional)
    reference = _reference_loss(model, docs)
    expected = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)

    labels = lm_labels(ids, doc)
    micro = [slice(0, 2), slice(2, 4)]
    n_targets = sum(count_targets(labels[m]) for m in micro)
    assert n_targets == sum(len(t) - 1 for t in docs)
    model.zero_grad()
    packed = 0.0
    for m in micro:
        loss = lm_loss(packed_lm_logits(model, ids[m], doc[m]), labels[m], n_targets)
        loss.backward()
        packed = packed + loss.detach()
    torch.testing.assert_close(packed, reference.detach(), atol=1e-12, rtol=1e-12)
    for p, g in zip(model.parameters(), expected):
        if g is None:       # e.g. the pad's embedding row: no gradient either way
            assert p.grad is None or p.grad.abs().max() == 0
        else:
            torch.testing.assert_close(p.grad, g, atol=1e-12, rtol=1e-10)


def test_each_missing_ingredient_changes_the_loss():
    """The document mask, the restarting positions, the -100 at document starts and the normalization across
    micro-batches each matter: leave one out and the loss is no longer the per-document one."""
    docs, ids, doc = _packed_batch()
    model = _model("sinusoidal")
    with torch.no_grad():
        reference = _reference_loss(model, docs)
        labels = lm_labels(ids, doc)
        right = lm_loss(packed_lm_logits(model, ids, doc), labels)
        torch.testing.assert_close(right, reference, atol=1e-12, rtol=1e-12)

        # one causal mask across the row: documents read each other
        real = doc >= 0
        causal_only = model(ids, real, torch.arange(10).expand(4, 10).contiguous())
        assert abs(lm_loss(causal_only, labels) - reference) > 1e-3
        # the document mask but index positions (no restart)
        x = model.embedding(ids, torch.arange(10).expand(4, 10))
        no_restart = model.out(model.stack(x, self_mask=document_causal_mask(doc)))
        assert abs(lm_loss(no_restart, labels) - reference) > 1e-3
        # labels without -100 at document starts: the last token of a document predicts the next document's first
        naive = ids.masked_fill(~real, IGNORE_INDEX)
        assert count_targets(naive) > count_targets(labels)
        assert abs(lm_loss(packed_lm_logits(model, ids, doc), naive) - reference) > 1e-3
        # the mean of per-micro-batch means: rows 0-1 and 2-3 have different numbers of targets
        micro = [slice(0, 1), slice(1, 4)]
        means = [lm_loss(packed_lm_logits(model, ids[m], doc[m]), labels[m]) for m in micro]
        assert abs(sum(means) / 2 - reference) > 1e-3


def test_lm_loss_and_labels_errors():
    ids, doc = torch.tensor([[5, 6, 0]]), torch.tensor([[0, 0, -1]])
    with pytest.raises(ValueError, match=r"ids and doc_ids must have one shape, got \(1, 2\) and \(1, 3\)"):
        lm_labels(ids[:, :2], doc)
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        lm_labels(ids.float(), doc)
    with pytest.raises(ValueError, match="doc_ids row 0 does not start with document 0"):
        lm_labels(ids, doc + 1)
    labels = lm_labels(ids, doc)
    with pytest.raises(ValueError, match=r"logits must be \(batch, length, vocab\) matching labels \(1, 3\)"):
        lm_loss(torch.zeros(1, 2, 7), labels)
    with pytest.raises(ValueError, match="n_targets must be >= 1 when there are targets, got 0"):
        lm_loss(torch.zeros(1, 3, 7), labels, 0)
    with pytest.raises(ValueError, match=r"labels must be a \(batch, length\) tensor, got \(3,\)"):
        count_targets(labels[0])
    assert lm_loss(torch.zeros(1, 3, 7), torch.full((1, 3), IGNORE_INDEX)).item() == 0.0   # nothing to predict
    with pytest.raises(TypeError, match="model must be an attnbook.generation.DecoderOnlyLM, got Linear"):
        packed_lm_logits(torch.nn.Linear(2, 2), ids, doc)
    with pytest.raises(ValueError, match=r"ids must be a tensor of doc_ids' shape \(1, 3\), got \(1, 2\)"):
        packed_lm_logits(_model("rope"), ids[:, :2], doc)
