"""Packing instead of padding (chapter 9): :func:`attnbook.batching.pack_documents` and the document ids, masks,
positions, offsets and collate of :mod:`attnbook.batching`; the three ways of :mod:`attnbook.packing` (dense bool
mask, FlexAttention, variable-length) against each other and against every document run alone, unpadded, with torch's
own ``F.scaled_dot_product_attention`` (the test of no cross-contamination); and
:meth:`attnbook.transformer.TransformerClassifier.forward_packed` against the classifier's ordinary forward, one review
at a time."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.batching import (check_document_ids, document_ids, document_mask, document_offsets, document_positions,
                               pack_collate, pack_documents)
from attnbook.packing import (BackendUnavailable, backend_status, document_attention, flex_document_attention,
                              varlen_attention)
from attnbook.transformer import TransformerClassifier

pytestmark = pytest.mark.usefixtures("one_thread")

lengths_strategy = st.lists(st.integers(1, 12), min_size=1, max_size=30)


# ---------------------------------------------------------------- pack_documents
def test_first_fit_decreasing_by_hand():
    # decreasing: 6 (doc 4), 5 (0), 4 (2), 3 (1), 2 (3), 1 (5); 3 goes beside 4, 2 beside 5, 1 beside 6.
    assert pack_documents([5, 3, 4, 2, 6, 1], 7) == [[4, 5], [0, 3], [2, 1]]
    assert pack_documents([4, 4, 4], 8) == [[0, 1], [2]]                            # ties: by index
    assert pack_documents(torch.tensor([3]), 3) == [[0]]


def test_greedy_fills_rows_in_the_seeded_order():
    lengths = [5, 3, 4, 2, 6, 1]
    order = torch.randperm(6, generator=torch.Generator().manual_seed(7)).tolist()
    rows = pack_documents(lengths, 7, method="greedy", seed=7)
    assert [i for row in rows for i in row] == order                                # the order, cut into rows
    for row, following in zip(rows, rows[1:]):                                       # a row ends only when full
        assert sum(lengths[i] for i in row) + lengths[following[0]] > 7
    assert rows == pack_documents(lengths, 7, method="greedy", seed=7)
    assert any(pack_documents(lengths, 7, method="greedy", seed=s) != rows for s in range(3))


@settings(max_examples=40, deadline=None)
@given(lengths_strategy, st.integers(12, 30), st.sampled_from(["first_fit_decreasing", "greedy"]), st.integers(0, 5))
def test_every_document_goes_into_one_row_that_holds_it(lengths, max_len, method, seed):
    rows = pack_documents(lengths, max_len, method=method, seed=seed)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(row and sum(lengths[i] for i in row) <= max_len for row in rows)
    assert len(rows) >= math.ceil(sum(lengths) / max_len)
    if method == "first_fit_decreasing":      # first fit: no two rows could have been one
        loads = sorted(sum(lengths[i] for i in row) for row in rows)
        assert len(rows) == 1 or loads[0] + loads[1] > max_len


@pytest.mark.parametrize("args, kwargs, error, message", [
    (([3, 9, 2, 10], 8), {}, ValueError, "document 1 has length 9 > max_len=8 (2 documents too long)"),
    (([3], 0), {}, ValueError, "max_len must be >= 1, got 0"),
    (([3], 4), {"method": "best_fit"}, ValueError, "method must be one of ['first_fit_decreasing', 'greedy']"),
    (([], 4), {}, ValueError, "lengths must not be empty"),
    (([3, 0], 4), {}, ValueError, "every length must be >= 1"),
    (([1.5], 4), {}, TypeError, "lengths must have an integer dtype"),
    (([3], 4.0), {}, TypeError, "max_len must be an int"),
])
def test_pack_documents_errors(args, kwargs, error, message):
    with pytest.raises(error) as info:
        pack_documents(*args, **kwargs)
    assert message in str(info.value)


# ---------------------------------------------------------------- document ids, mask, positions, offsets
def test_document_ids_mask_positions_offsets_by_hand():
    doc = document_ids([[3, 2], [4]])
    assert doc.tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 0, -1]] and doc.dtype == torch.long
    assert document_ids([[2]], width=4).tolist() == [[0, 0, -1, -1]]
    assert document_positions(doc).tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
    offsets, longest = document_offsets(doc)
    assert offsets.tolist() == [0, 3, 5, 9] and longest == 4
    mask = document_mask(doc)
    assert mask.dtype == torch.bool and mask.shape == (2, 5, 5)
    assert mask[0].int().tolist() == [[1, 1, 1, 0, 0]] * 3 + [[0, 0, 0, 1, 1]] * 2
    assert mask[1].int().tolist() == [[1, 1, 1, 1, 0]] * 4 + [[0] * 5]               # the pad takes part in nothing
    empty = torch.full((1, 3), -1)
    assert not document_mask(empty).any() and document_offsets(empty) == (torch.zeros(1, dtype=torch.long), 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(1, 5), max_size=4), min_size=1, max_size=4), st.integers(0, 3))
def test_mask_positions_and_offsets_against_brute_force(rows, extra):
    width = max(sum(r) for r in rows) + extra
    doc = document_ids(rows, width)
    mask, positions = document_mask(doc), document_positions(doc)
    for b, row in enumerate(rows):
        owner = [d for d, n in enumerate(row) for _ in range(n)] + [None] * (width - sum(row))
        place = [p for n in row for p in range(n)] + [0] * (width - sum(row))
        assert positions[b].tolist() == place
        for i in range(width):
            for j in range(width):
                assert bool(mask[b, i, j]) == (owner[i] is not None and owner[i] == owner[j])
    offsets, longest = document_offsets(doc)
    flat = [n for row in rows for n in row]
    assert torch.diff(offsets).tolist() == flat and longest == max(flat, default=0)


@pytest.mark.parametrize("doc, error, message", [
    ([[0, 0, 1]], TypeError, "doc_ids must be an integer torch.Tensor"),
    (torch.tensor([[0.0, 1.0]]), TypeError, "doc_ids must have an integer dtype"),
    (torch.tensor([[True, False]]), TypeError, "doc_ids must have an integer dtype"),
    (torch.tensor([0, 0, 1]), ValueError, "doc_ids must have shape (batch, length), got (3,)"),
    (torch.tensor([[0, -2]]), ValueError, "doc_ids must be >= -1 (-1 = pad), got min -2"),
    (torch.tensor([[0, 0], [0, -1], [-1, 0]]), ValueError, "doc_ids row 2 has a pad (-1) before a real token"),
    (torch.tensor([[1, 1, -1]]), ValueError, "doc_ids row 0 does not start with document 0"),
    (torch.tensor([[0, 0], [0, 2]]), ValueError, "doc_ids row 1 skips or repeats a document id"),
    (torch.tensor([[0, 1, 0]]), ValueError, "doc_ids row 0 skips or repeats a document id"),
])
def test_document_ids_are_checked(doc, error, message):
    for function in (check_document_ids, document_mask, document_positions, document_offsets):
        with pytest.raises(error) as info:
            function(doc)
        assert message in str(info.value), function.__name__


def test_document_ids_errors():
    with pytest.raises(ValueError, match=r"row 1 holds 5 tokens, more than width=4"):
        document_ids([[2], [3, 2]], width=4)
    with pytest.raises(ValueError, match="row_lengths must hold at least one row"):
        document_ids([])
    with pytest.raises(ValueError, match=r"row_lengths\[0\] must be >= 1, got 0"):
        document_ids([[0]])


# ---------------------------------------------------------------- pack_collate
def test_pack_collate_by_hand():
    ids = torch.arange(1, 31).reshape(5, 6)
    lengths = torch.tensor([2, 6, 3, 1, 4])
    batch = pack_collate(ids, lengths, [[0, 2], [1], [4, 3]])
    assert batch.ids.tolist() == [[1, 2, 13, 14, 15, 0], [7, 8, 9, 10, 11, 12], [25, 26, 27, 28, 19, 0]]
    assert batch.doc_ids.tolist() == [[0, 0, 1, 1, 1, -1], [0] * 6, [0, 0, 0, 0, 1, -1]]
    assert batch.positions.tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 0]]
    assert batch.order.tolist() == [0, 2, 1, 4, 3] and batch.lengths.tolist() == [2, 3, 6, 4, 1]
    assert pack_collate(ids, lengths, [[3]], width=3).ids.tolist() == [[19, 0, 0]]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=20), st.integers(8, 20), st.integers(0, 3))
def test_pack_collate_holds_every_token_once_in_order(lengths, max_len, seed):
    """Every real token of every document appears exactly once, in its document's order, and pads are 0."""
    n = len(lengths)
    ids = torch.randint(1, 100, (n, 8), generator=torch.Generator().manual_seed(seed))
    lengths_t = torch.tensor(lengths)
    ids = ids * (torch.arange(8) < lengths_t[:, None])                               # storage: right-padded with 0
    batch = pack_collate(ids, lengths_t, pack_documents(lengths, max_len, method="greedy", seed=seed))
    offsets, _ = document_offsets(batch.doc_ids)
    tokens = batch.ids[batch.doc_ids >= 0]
    assert sorted(batch.order.tolist()) == list(range(n))
    for d, i in enumerate(batch.order.tolist()):
        assert tokens[offsets[d] : offsets[d + 1]].tolist() == ids[i, : lengths[i]].tolist()
    assert (batch.ids[batch.doc_ids < 0] == 0).all()


@pytest.mark.parametrize("args, error, message", [
    (([[0, 1]], torch.tensor([1])), TypeError, "ids must be a torch.Tensor"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([1])), ValueError,
     "expected ids (n, max_len) and lengths (n,), got ids (2, 3) and lengths (1,)"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([1.0, 2.0])), TypeError, "lengths must have an integer dtype"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 2]), [[0, 2]]), ValueError,
     "index 2 is out of range for 2 documents"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 2]), [[0, 1], [1]]), ValueError,
     "document 1 appears 2 times in rows"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 2]), [[0, 1]]), ValueError,
     "the packed documents' lengths must lie in [1, max_len=3], got min 0 and max 2"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 2]), [[True]]), TypeError,
     "rows must hold int indices, got bools"),
    ((torch.zeros(2, 3, dtype=torch.long), torch.tensor([1, 2]), []), ValueError, "rows must hold at least one row"),
])
def test_pack_collate_errors(args, error, message):
    ids, lengths, *rest = args
    with pytest.raises(error) as info:
        pack_collate(ids, lengths, rest[0] if rest else [[0]])
    assert message in str(info.value)
    with pytest.raises(ValueError, match="row 0 holds 3 tokens, more than width=2"):
        pack_collate(torch.ones(2, 3, dtype=torch.long), torch.tensor([1, 2]), [[0, 1]], width=2)


# ---------------------------------------------------------------- three ways, and each document alone
ROWS = [[5, 3], [9], [2, 2, 4], [1]]       # lengths of the documents of each row; width 10, so every row has pads


def _packed(dtype=torch.float64, heads=2, d=4, seed=0):
    doc = document_ids(ROWS, 10)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(len(ROWS), heads, 10, d, generator=g, dtype=dtype) for _ in range(3))
    return q, k, v, doc


def _alone(q, k, v, doc):
    """Each document's tokens cut out and attended on their own with torch's SDPA (no mask, no pads), put back."""
    out = torch.zeros_like(q)
    for b in range(len(doc)):
        for d in range(int(doc[b].max()) + 1):
            where = (doc[b] == d).nonzero().flatten()
            out[b][:, where] = F.scaled_dot_product_attention(q[b][:, where], k[b][:, where], v[b][:, where])
    return out


def test_dense_mask_equals_each_document_alone():
    q, k, v, doc = _packed()
    expected = _alone(q, k, v, doc)
    torch.testing.assert_close(document_attention(q, k, v, doc), expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(doc)[:, None]
                                                              | ~(doc >= 0)[:, None, :, None]
                                                              ).masked_fill(~(doc >= 0)[:, None, :, None], 0),
                               expected, atol=1e-12, rtol=1e-12)                # torch's own, pads guarded by hand
    unmasked = F.scaled_dot_product_attention(q, k, v)                           # without the mask: contamination
    assert (unmasked - expected)[(doc >= 0)[:, None, :, None].expand_as(q)].abs().max() > 0.1


def test_nested_varlen_equals_each_document_alone():
    q, k, v, doc = _packed()
    expected = _alone(q, k, v, doc)
    for backend in ("nested", "auto"):
        torch.testing.assert_close(varlen_attention(q, k, v, doc, backend=backend), expected, atol=1e-12,
                                   rtol=1e-12)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    torch.testing.assert_close(varlen_attention(q32, k32, v32, doc), expected.float())


@pytest.mark.skipif(torch.cuda.is_available(), reason="records what torch 2.13 does on a CPU")
def test_torch_varlen_attn_does_not_run_on_a_cpu():
    """``torch.nn.attention.varlen.varlen_attn`` exists in torch 2.13 but calls ``aten::_flash_attention_forward``,
    which has no CPU kernel: a NotImplementedError, which ``varlen_attention`` reports as BackendUnavailable."""
    q, k, v, doc = _packed(torch.float16)
    with pytest.raises(BackendUnavailable) as info:
        varlen_attention(q, k, v, doc, backend="varlen")
    assert "NotImplementedError" in str(info.value) and "_flash_attention_forward" in str(info.value)
    assert "use backend='nested'" in str(info.value)
    assert isinstance(info.value.__cause__, NotImplementedError)


@pytest.fixture(scope="module")
def flex():
    """FlexAttention's eager path on this machine, or a skip with torch's reason (its first call takes seconds)."""
    q, k, v, doc = _packed()
    try:
        return flex_document_attention(q, k, v, doc)
    except BackendUnavailable as err:  # pragma: no cover - runs with the pinned torch 2.13 on a CPU
        pytest.skip(f"FlexAttention does not run here: {err}")


def test_flex_attention_block_mask_equals_each_document_alone(flex):
    q, k, v, doc = _packed()
    torch.testing.assert_close(flex, _alone(q, k, v, doc), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(flex, document_attention(q, k, v, doc), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(flex, varlen_attention(q, k, v, doc), atol=1e-12, rtol=1e-12)


def test_backend_status_on_this_machine(flex):
    status = backend_status("cpu", torch.float64)
    assert status["dense"] is None and status["nested"] is None and status["flex"] is None
    if not torch.cuda.is_available():
        assert "NotImplementedError" in status["varlen"]


@pytest.mark.parametrize("function", [document_attention, flex_document_attention, varlen_attention])
def test_attention_errors(function):
    q, k, v, doc = _packed()
    with pytest.raises(ValueError, match=r"doc_ids must have shape \(batch, length\) = \(4, 10\), got \(4, 9\)"):
        function(q, k, v, doc[:, :9])
    with pytest.raises(TypeError, match="q must be a floating torch.Tensor, got torch.int64"):
        function(q.long(), k, v, doc)
    with pytest.raises(ValueError, match=r"k must have shape \(batch, heads, length, head_dim\), got \(4, 10, 4\)"):
        function(q, k[:, 0], v, doc)
    with pytest.raises(ValueError, match="q, k, v must be"):
        function(q, k[:, :, :9], v, doc)
    with pytest.raises(TypeError, match="q, k and v must have one dtype"):
        function(q, k.float(), v, doc)
    with pytest.raises(ValueError, match="doc_ids row 0 does not start with document 0"):
        function(q, k, v, doc + 1)


def test_varlen_backend_error():
    with pytest.raises(ValueError, match=r"backend must be one of \['varlen', 'nested', 'auto'\], got 'flash'"):
        varlen_attention(*_packed(), backend="flash")


# ---------------------------------------------------------------- the classifier reads packed rows
def _classifier(readout, positional, seed=0):
    torch.manual_seed(seed)
    return TransformerClassifier(60, 3, d_model=8, nhead=2, num_layers=2, dim_feedforward=16, dropout=0.0,
                                 readout=readout, positional=positional, max_len=16).double().eval()


@torch.no_grad()
@pytest.mark.parametrize("readout", ["mean", "first"])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_a_packed_review_gets_the_logits_it_gets_alone(readout, positional):
    model = _classifier(readout, positional)
    lengths = torch.tensor([3, 7, 12, 1, 5, 4])
    ids = torch.randint(1, 60, (6, 12), generator=torch.Generator().manual_seed(1)) * (
        torch.arange(12) < lengths[:, None])
    batch = pack_collate(ids, lengths, [[0, 1], [2], [3, 4, 5]], width=14)
    logits, attention = model.forward_packed(batch.ids, batch.doc_ids, return_attention=True)
    alone = torch.cat([model(ids[i : i + 1, : lengths[i]], lengths[i : i + 1])[0] for i in batch.order.tolist()])
    torch.testing.assert_close(logits, alone, atol=1e-12, rtol=1e-12)
    assert attention.shape == (3, 2, 2, 14, 14)
    same = batch.doc_ids[:, :, None] == batch.doc_ids[:, None, :]                # pads form one more block
    assert attention[~same[:, None, None].expand_as(attention)].abs().max() == 0   # no weight across documents
    real = (batch.doc_ids >= 0)[:, None, None, :, None].expand_as(attention)
    torch.testing.assert_close(attention.sum(-1)[real[..., 0]], torch.ones(int(real[..., 0].sum()), dtype=torch.double))
    contaminated, _ = model.forward_packed(batch.ids, batch.doc_ids, isolate=False)
    assert (contaminated - alone).abs().max() > 1e-3
    running, _ = model.forward_packed(batch.ids, batch.doc_ids, torch.arange(14))  # positions run on across reviews
    if positional != "rope":      # rotary positions are relative: a shift inside one document changes nothing
        assert (running - alone).abs().max() > 1e-3
    else:
        torch.testing.assert_close(running, alone, atol=1e-12, rtol=1e-12)


def test_forward_packed_errors():
    model = _classifier("mean", "sinusoidal")
    doc = document_ids([[2, 1]])
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"doc_ids must have the shape of ids \(1, 3\), got \(1, 2\)"):
        model.forward_packed(ids, doc[:, :2])
    with pytest.raises(ValueError, match="doc_ids row 0 skips or repeats"):
        model.forward_packed(ids, torch.tensor([[0, 2, 2]]))
    with pytest.raises(TypeError, match="doc_ids must have an integer dtype"):
        model.forward_packed(ids, doc.float())
    with pytest.raises(ValueError, match=r"positions must have shape \(length,\) = \(3,\)"):
        model.forward_packed(ids, doc, torch.arange(4))
    with pytest.raises(ValueError, match="positions must be non-negative"):
        model.forward_packed(ids, doc, torch.tensor([0, -1, 0]))


def test_packed_attention_rejects_a_zero_width_head_dim():
    from attnbook.packing import document_attention

    q = torch.randn(1, 2, 4, 0)
    doc_ids = torch.tensor([[0, 0, 1, 1]])
    with pytest.raises(ValueError, match=r"q has a zero-width head_dim in shape \(1, 2, 4, 0\)"):
        document_attention(q, torch.randn(1, 2, 4, 0), torch.randn(1, 2, 4, 3), doc_ids)


# ---------------------------------------------------------------- the flattened batch (cu_seqlens)
from attnbook.packing import (cu_seqlens_from_lengths, cu_seqlens_from_position_ids,  # noqa: E402
                              flat_document_mask, position_ids_from_cu_seqlens)


def test_cu_seqlens_by_hand():
    cu = cu_seqlens_from_lengths([3, 2, 4])
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 9]
    assert position_ids_from_cu_seqlens(cu).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert cu_seqlens_from_lengths([]).tolist() == [0]
    assert position_ids_from_cu_seqlens(torch.tensor([0])).tolist() == []


def _flat_reference(q, k, v, lengths, causal):
    """Each document alone, with torch's own SDPA (is_causal), concatenated: loops, no mask of ours."""
    outs, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(q[:, sl], k[:, sl], v[:, sl], is_causal=causal))
        start += n
    return torch.cat(outs, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=6), st.booleans())
def test_flat_mask_equals_per_document_attention(lengths, causal):
    cu = cu_seqlens_from_lengths(lengths)
    total = int(cu[-1])
    g = torch.Generator().manual_seed(len(lengths))
    q, k, v = (torch.randn(2, total, 4, generator=g, dtype=torch.float64) for _ in range(3))   # (heads, T, d)
    mask = flat_document_mask(cu, causal=causal)
    flat = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(flat, _flat_reference(q, k, v, lengths, causal), atol=1e-12, rtol=1e-12)
    # the loop reference of the mask itself
    doc = [d for d, n in enumerate(lengths) for _ in range(n)]
    for i in range(total):
        for j in range(total):
            assert bool(mask[i, j]) == (doc[i] == doc[j] and (j <= i or not causal))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=8))
def test_position_ids_round_trip_and_match_document_positions(lengths):
    cu = cu_seqlens_from_lengths(lengths)
    pos = position_ids_from_cu_seqlens(cu)
    assert pos.tolist() == [i for n in lengths for i in range(n)]
    assert cu_seqlens_from_position_ids(pos[None]).tolist() == cu.tolist()
    ids = document_ids([lengths], sum(lengths))
    assert document_positions(ids)[0].tolist() == pos.tolist()
    assert document_offsets(ids)[0].tolist() == cu.tolist()


def test_flat_errors():
    with pytest.raises(ValueError, match="start at 0"):
        position_ids_from_cu_seqlens(torch.tensor([1, 3]))
    with pytest.raises(ValueError, match="never decrease"):
        flat_document_mask(torch.tensor([0, 3, 2]))
    with pytest.raises(TypeError, match="integer dtype"):
        flat_document_mask(torch.tensor([0.0, 3.0]))
    with pytest.raises(ValueError, match=r"shape \(N \+ 1,\)"):
        flat_document_mask(torch.tensor([[0, 3]]))
    with pytest.raises(ValueError, match="restart at 0"):
        cu_seqlens_from_position_ids(torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="restart at 0"):
        cu_seqlens_from_position_ids(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="integer tensor"):
        cu_seqlens_from_position_ids(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"\(T,\) or \(1, T\)"):
        cu_seqlens_from_position_ids(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=">= 0"):
        cu_seqlens_from_lengths([2, -1])
    with pytest.raises(TypeError, match="integers"):
        cu_seqlens_from_lengths([2.5])
