"""attnbook.attention.blockwise_attention (the online softmax) against independent references: torch's fused
F.scaled_dot_product_attention (outputs and gradients; its rows with no valid key compared with zeros), finite
differences (gradcheck), hypothesis properties over sizes, masks and block sizes, and a spy on every tensor an
operation creates, to show that no (n_queries, n_keys) score matrix is formed. Also runs
benchmarks/bench_long_attention.py end to end at tiny sizes."""

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attnbook.attention import blockwise_attention, causal_mask, scaled_dot_product_attention

ROOT = Path(__file__).resolve().parents[1]
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-12, rtol=1e-10)}


def _qkv(dtype=torch.float64, batch=(3,), n_q=50, n_k=50, d_k=8, d_v=5, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
    return make(*batch, n_q, d_k), make(*batch, n_k, d_k), make(*batch, n_k, d_v)


def _reference(q, k, v, mask, scale=None):
    """torch's fused kernel, with rows that have no valid key set to zero (what blockwise_attention promises;
    torch 2.13's CPU kernel already returns zeros there, which test_torch_gives_zeros_for_fully_masked_rows checks)."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (x.expand(*batch, *x.shape[-2:]) for x in (q, k, v))
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    row_has_key = mask.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~row_has_key, scale=scale)
    return torch.where(row_has_key, out, torch.zeros((), dtype=out.dtype))


def _out_and_grads(fn, q, k, v, seed=1):
    out = fn(q, k, v)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    grads = torch.autograd.grad((out * upstream.to(out.dtype)).sum(), (q, k, v))
    return out, grads


def _padding_mask(n_k, lengths=(50, 13, 0)):
    """Key padding ``(batch, 1, n_k)``; the last batch element has no valid key (every query fully masked)."""
    return (torch.arange(n_k)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]


def _random_mask(batch, n_q, n_k, p=0.6, seed=5):
    """Full ``(batch, n_q, n_k)`` mask with about 1 - p of the keys masked and a few fully masked rows."""
    mask = torch.rand(batch, n_q, n_k, generator=torch.Generator().manual_seed(seed)) < p
    mask[0, 3] = False
    mask[1, -1] = False
    mask[2, 10:20] = False
    return mask


MASKS = {
    "none": lambda n_q, n_k: None,
    "padding": lambda n_q, n_k: _padding_mask(n_k),
    "full": lambda n_q, n_k: _random_mask(3, n_q, n_k),
    "causal": lambda n_q, n_k: causal_mask(n_q, n_k),
    "broadcast_1d": lambda n_q, n_k: torch.arange(n_k) % 3 != 0,
}


# ---------------------------------------------------------------- against torch's fused kernel
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("block_size, query_block_size", [(7, None), (7, 11), (1, 50), (50, 7), (64, None)])
def test_matches_torch_sdpa_fp64(mask_name, block_size, query_block_size):
    q, k, v = _qkv()
    mask = MASKS[mask_name](50, 50)
    out, grads = _out_and_grads(
        lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=block_size, query_block_size=query_block_size),
        q, k, v)
    ref, ref_grads = _out_and_grads(lambda q, k, v: _reference(q, k, v, mask), q, k, v)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL[torch.float64])


@pytest.mark.parametrize("checkpoint", [False, True])
@pytest.mark.parametrize("d_k, d_v", [(1, 1), (8, 5), (64, 64)])  # d_k = 0 is rejected (test_attention.py)
def test_head_dims_and_checkpoint_fp32(checkpoint, d_k, d_v):
    q, k, v = _qkv(torch.float32, batch=(2, 3), n_q=20, n_k=23, d_k=d_k, d_v=d_v)
    mask = (torch.arange(23) < torch.tensor([23, 5])[:, None])[:, None, None, :]  # (batch, 1, 1, n_k)
    out, grads = _out_and_grads(lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=6, checkpoint=checkpoint),
                                q, k, v)
    ref, ref_grads = _out_and_grads(lambda q, k, v: _reference(q, k, v, mask), q, k, v)
    assert out.shape == (2, 3, 20, d_v) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL[torch.float32])


def test_checkpoint_gives_the_same_gradients_exactly_as_without():
    q, k, v = _qkv()
    mask = _random_mask(3, 50, 50)
    plain = _out_and_grads(lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=7), q, k, v)
    ckpt = _out_and_grads(lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=7, checkpoint=True), q, k, v)
    for a, b in zip((plain[0], *plain[1]), (ckpt[0], *ckpt[1])):
        assert torch.equal(a, b)


def test_scale_and_broadcast_batch_dims():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 6, dtype=torch.float64, generator=g)  # one set of queries for every batch element
    k = torch.randn(3, 9, 6, dtype=torch.float64, generator=g)
    v = torch.randn(1, 9, 2, dtype=torch.float64, generator=g)
    mask = _padding_mask(9, (9, 4, 1))
    for scale in (None, 1.0, 0.0, -0.7):
        out = blockwise_attention(q, k, v, mask, block_size=4, query_block_size=3, scale=scale)
        torch.testing.assert_close(out, _reference(q, k, v, mask, scale=scale), **TOL[torch.float64])


def test_torch_gives_zeros_for_fully_masked_rows():
    """What torch 2.13 returns for a query with no valid key (the reference relies on it being zeros or on the
    where() in _reference; here we record which, so that a change in torch shows up)."""
    q, k, v = _qkv(batch=(2,), n_q=4, n_k=6)
    mask = torch.ones(2, 4, 6, dtype=torch.bool)
    mask[1, 2] = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[1, 2], torch.zeros(5, dtype=torch.float64))
    ours = blockwise_attention(q, k, v, mask, block_size=4)
    assert torch.equal(ours[1, 2], torch.zeros(5, dtype=torch.float64))


def test_gradcheck_with_a_fully_masked_row():
    q, k, v = _qkv(batch=(2,), n_q=3, n_k=5, d_k=2, d_v=2)
    mask = _padding_mask(5, (5, 0))
    for checkpoint in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=3, query_block_size=2, checkpoint=checkpoint),
            (q, k, v), fast_mode=True)


# ---------------------------------------------------------------- low precision
@pytest.mark.parametrize("dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("mask_name", ["padding", "full"])
def test_half_precision_finite_and_close_to_fp32(dtype, tol, mask_name):
    q32, k32, v32 = _qkv(torch.float32)
    mask = MASKS[mask_name](50, 50)
    rows_without_key = ~mask.any(-1)
    for spread in (1.0, 60.0):  # 60: scores of ~1e4 * 60^2 / sqrt(8), far beyond fp16's range of 65504
        q, k, v = (x.detach().mul(s).to(dtype).requires_grad_() for x, s in ((q32, spread), (k32, spread), (v32, 1)))
        out, grads = _out_and_grads(lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=7), q, k, v)
        assert out.dtype == dtype
        assert all(bool(t.isfinite().all()) for t in (out, *grads))
        expanded = rows_without_key.expand(out.shape[:-1])
        assert bool((out[expanded] == 0).all())
        # the same computation on the same (rounded) inputs in fp32
        ref = blockwise_attention(*(x.detach().float() for x in (q, k, v)), mask, block_size=7)
        torch.testing.assert_close(out.float(), ref, atol=tol * 4, rtol=tol)


def test_fully_masked_rows_are_zero_in_every_dtype():
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        q, k, v = _qkv(dtype, batch=(3,), n_q=6, n_k=9)
        mask = torch.zeros(3, 6, 9, dtype=torch.bool)
        mask[0] = True
        out, grads = _out_and_grads(lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=4), q, k, v)
        assert bool((out[1:] == 0).all()) and bool(out[0].abs().sum() > 0)
        assert all(bool(g.isfinite().all()) for g in grads)
        assert bool((grads[0][1:] == 0).all())


def test_empty_sizes():
    q, k, v = _qkv(n_q=4, n_k=0)
    out = blockwise_attention(q, k, v)
    assert out.shape == (3, 4, 5) and bool((out == 0).all())
    q, k, v = _qkv(n_q=0, n_k=4)
    assert blockwise_attention(q, k, v, block_size=2).shape == (3, 0, 5)


# ---------------------------------------------------------------- hypothesis
@settings(max_examples=25, deadline=None)
@given(n_q=st.integers(1, 12), n_k=st.integers(1, 12), batch=st.integers(1, 3), block=st.integers(1, 13),
       q_block=st.one_of(st.none(), st.integers(1, 13)), p=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_property_matches_torch_for_any_sizes_masks_and_blocks(n_q, n_k, batch, block, q_block, p, seed):
    q, k, v = _qkv(batch=(batch,), n_q=n_q, n_k=n_k, d_k=3, d_v=2, seed=seed)
    mask = torch.rand(batch, n_q, n_k, generator=torch.Generator().manual_seed(seed)) < p
    out, grads = _out_and_grads(
        lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=block, query_block_size=q_block), q, k, v)
    ref, ref_grads = _out_and_grads(lambda q, k, v: _reference(q, k, v, mask), q, k, v)
    torch.testing.assert_close(out, ref, **TOL[torch.float64])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL[torch.float64])


@settings(max_examples=15, deadline=None)
@given(n_k=st.integers(2, 30), block=st.integers(1, 31), seed=st.integers(0, 2**16))
def test_property_block_size_does_not_change_the_result(n_k, block, seed):
    q, k, v = _qkv(batch=(2,), n_q=5, n_k=n_k, d_k=4, d_v=3, seed=seed, requires_grad=False)
    mask = _padding_mask(n_k, (n_k, max(1, n_k // 3)))
    one_block = blockwise_attention(q, k, v, mask, block_size=n_k)
    torch.testing.assert_close(blockwise_attention(q, k, v, mask, block_size=block), one_block,
                               **TOL[torch.float64])


# ---------------------------------------------------------------- the score matrix is never formed
class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest, self.shape = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel() > self.largest:
                self.largest, self.shape = t.numel(), tuple(t.shape)
        return out


@pytest.mark.parametrize("checkpoint", [False, True])
def test_no_tensor_as_large_as_the_score_matrix(checkpoint):
    n, block, batch = 96, 16, 2
    q, k, v = _qkv(torch.float32, batch=(batch,), n_q=n, n_k=n, d_k=4, d_v=4)
    mask = _padding_mask(n, (n, 40))
    with _LargestTensor() as blockwise:
        blockwise_attention(q, k, v, mask, block_size=block, checkpoint=checkpoint).sum().backward()
    with _LargestTensor() as explicit:  # the spy can fail: the explicit path forms (batch, n, n)
        scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0].sum().backward()
    assert explicit.largest >= batch * n * n
    # the largest tensors are the inputs' size (batch, n, d) and one (batch, block, block) tile
    assert blockwise.largest <= max(batch * n * 4, batch * block * block), blockwise.shape


# ---------------------------------------------------------------- errors
def test_errors_name_the_argument():
    q, k, v = _qkv(batch=(2,), n_q=3, n_k=5, d_k=4, d_v=2, requires_grad=False)
    with pytest.raises(TypeError, match="queries must be a torch.Tensor, got list"):
        blockwise_attention([1.0], k, v)
    with pytest.raises(TypeError, match="keys must have a floating dtype, got torch.int64"):
        blockwise_attention(q, k.long(), v)
    with pytest.raises(TypeError, match="share one dtype, got torch.float64, torch.float64, torch.float32"):
        blockwise_attention(q, k, v.float())
    with pytest.raises(ValueError, match=r"values must have shape \(\.\.\., n, d\) with at least 2 dims, got \(4,\)"):
        blockwise_attention(q, k, torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"same size d_k in the last dim, got queries \(2, 3, 4\) and keys "
                                         r"\(2, 5, 3\)"):
        blockwise_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"same number of keys \(dim -2\), got keys \(2, 5, 4\) and values "
                                         r"\(2, 4, 2\)"):
        blockwise_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"batch dims of queries \(2, 3, 4\), keys \(3, 5, 4\) .* do not broadcast"):
        blockwise_attention(q, torch.zeros(3, 5, 4, dtype=torch.float64), torch.zeros(3, 5, 2, dtype=torch.float64))


def test_mask_errors():
    q, k, v = _qkv(batch=(2,), n_q=3, n_k=5, d_k=4, d_v=2, requires_grad=False)
    with pytest.raises(TypeError, match=r"mask must be a bool tensor \(True = takes part\), got dtype torch.int64"):
        blockwise_attention(q, k, v, torch.ones(2, 1, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="mask must be a bool torch.Tensor, got list"):
        blockwise_attention(q, k, v, [True] * 5)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 4\) does not broadcast to "
                                         r"\(\.\.\., n_queries, n_keys\) = \(2, 3, 5\)"):
        blockwise_attention(q, k, v, torch.ones(2, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 3, 5\) does not broadcast"):  # would grow the batch
        blockwise_attention(q, k, v, torch.ones(4, 3, 5, dtype=torch.bool))


@pytest.mark.parametrize("name", ["block_size", "query_block_size"])
def test_block_size_errors(name):
    q, k, v = _qkv(batch=(2,), n_q=3, n_k=5, d_k=4, d_v=2, requires_grad=False)
    with pytest.raises(ValueError, match=rf"{name} must be >= 1, got 0"):
        blockwise_attention(q, k, v, **{name: 0})
    with pytest.raises(TypeError, match=rf"{name} must be an int, got float 2.5"):
        blockwise_attention(q, k, v, **{name: 2.5})
    with pytest.raises(TypeError, match=rf"{name} must be an int, got bool True"):
        blockwise_attention(q, k, v, **{name: True})


def test_scale_and_checkpoint_errors():
    q, k, v = _qkv(batch=(2,), n_q=3, n_k=5, d_k=4, d_v=2, requires_grad=False)
    with pytest.raises(ValueError, match="scale must be a finite number, got nan"):
        blockwise_attention(q, k, v, scale=math.nan)
    with pytest.raises(TypeError, match="scale must be a real number or None, got 'a'"):
        blockwise_attention(q, k, v, scale="a")
    with pytest.raises(TypeError, match="checkpoint must be a bool, got str 'yes'"):
        blockwise_attention(q, k, v, checkpoint="yes")


# ---------------------------------------------------------------- the benchmark script
def test_benchmark_runs_end_to_end_at_tiny_sizes(tmp_path, monkeypatch):
    # importable by name (the memory children unpickle bench_long_attention.child), as a script's module would be
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_long_attention", ROOT / "benchmarks" /
                                                  "bench_long_attention.py")
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_long_attention", bench)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.md"
    bench.main(["--lengths", "32", "64", "--rounds", "1", "--block-size", "16", "--query-block-size", "16",
                "--max-gib", "0.0001", "--out", str(out)])
    table = pd.read_csv(out.with_suffix(".csv"))
    assert len(table) == 2 * len(bench.TIMED + bench.MEMORY_ONLY)
    assert set(table["method"]) == set(bench.TIMED + bench.MEMORY_ONLY)
    sdpa = table[table["method"] == "torch SDPA"]
    assert (sdpa["forward_ratio"] == 1).all() and (sdpa["mem_fwd_mib"] >= 0).all()
    # --max-gib 0.0001 (about 100 KiB) skips the explicit path at L = 64 (2 fp32 (1, 4, 64, 64) matrices = 128 KiB)
    explicit = table[table["method"] == "attnbook explicit"].set_index("L")
    assert explicit.loc[64, "note"].startswith("forward skipped") and math.isnan(explicit.loc[64, "mem_fwd_mib"])
    assert not math.isnan(explicit.loc[32, "mem_fwd_mib"])
    assert (table.loc[table["method"] == "blockwise", "max_abs_err"] < 1e-5).all()
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["lengths"] == [32, 64] and len(record["targets"]) == 6
    assert re.search(r"So torch's CPU kernel (forms|does not form) the full score matrix",
                     record["sdpa_mask_conclusion"])
    text = out.read_text()
    assert "## Targets" in text and "## Provenance" in text and "torch's CPU kernel and masks" in text


# ---------------------------------------------------------------- chapter 9's memory table and figure
def test_memory_table_says_why_a_cell_is_missing():
    import pandas as pd

    from attnbook.plotting import long_attention_figure, long_attention_memory_table

    rows = []
    for method in ("torch SDPA", "attnbook explicit", "blockwise", "blockwise + checkpoint"):
        for n in (512, 1024):
            skipped = method == "attnbook explicit" and n == 1024
            rows.append({"method": method, "L": n, "score_matrix_mib": 1.0, "forward_ratio": 1.0,
                         "backward_ratio": 1.0,
                         "mem_fwd_mib": float("nan") if skipped or method.endswith("checkpoint") else 2.0,
                         "mem_fwd_bwd_mib": float("nan") if skipped else 3.0,
                         "note": "forward skipped (estimated > 6 GiB)" if skipped else ""})
    bench = pd.DataFrame(rows)
    table = long_attention_memory_table(bench, 6.0)
    assert table.loc[1024, ("forward", "attnbook explicit")] == "over 6 GiB"
    assert table.loc[1024, ("forward + backward", "attnbook explicit")] == "over 6 GiB"
    assert table.loc[512, ("forward", "blockwise + checkpoint")] == "as blockwise"
    assert table.loc[512, ("forward", "torch SDPA")] == "2.0"
    assert not table.isna().any().any()
    long_attention_figure(bench)
    bench.loc[0, ["mem_fwd_mib", "note"]] = [float("nan"), ""]
    with pytest.raises(ValueError, match="torch SDPA at L=512: forward was not measured, for no reason"):
        long_attention_memory_table(bench, 6.0)
