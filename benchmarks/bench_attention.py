"""Benchmark: attnbook.attention.scaled_dot_product_attention against torch's fused kernel (CPU, fwd + bwd).

A script, not a test (timings depend on the machine). Usage, from the repository root:

    .venv/bin/python benchmarks/bench_attention.py            # batch 64, 512 queries and keys, d 64, 15 rounds
    .venv/bin/python benchmarks/bench_attention.py --rounds 5 --out /tmp/bench.md

Setup (issue "Chapter 3", section "Benchmark"): the same inputs for every method; random key lengths in
[1, n] with a key-padding mask ``(batch, 1, n_keys)``; one timed call = forward plus backward (to q, k, v);
rounds are interleaved (every round runs every method once, in a shuffled order) and each method's time is
divided by the fused kernel's time *in the same round*; we report the median of these ratios.

Methods:
- ``torch fused``: ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``, the reference (ratio 1).
- ``attnbook fast``: ``scaled_dot_product_attention(q, k, v, mask)`` (delegates, plus the fully-masked-row guard).
- ``attnbook explicit``: ``scaled_dot_product_attention(..., return_weights=True)`` (returns the weights).
- for context: ``masked_softmax (unfused)`` = ``masked_softmax(q k^T / sqrt(d), mask) @ v``;
  ``masked_fill + softmax`` = the plain implementation; ``d2l masked_softmax`` = d2l's approach (replace masked
  scores by -1e6 through a flattened sequence mask, softmax, bmm).

Writes a markdown table with provenance to ``--out`` (default ``results/bench_attention.md``), the same table
as CSV beside it (``.csv``) and the provenance as JSON (``.json``). Chapter 3 shows the stored table; it never
runs this script.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from attnbook.attention import scaled_dot_product_attention
from attnbook.masking import masked_softmax
from attnbook.provenance import provenance, write_provenance

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"attnbook fast": 1.05, "attnbook explicit": 1.2}


def make_inputs(batch: int, n: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, n, d, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    lengths = torch.randint(1, n + 1, (batch,), generator=g)
    mask = (torch.arange(n)[None, :] < lengths[:, None])[:, None, :]  # (batch, 1, n_keys), True = takes part
    upstream = torch.randn(batch, n, d, generator=g, dtype=dtype)
    return q, k, v, mask, lengths, upstream


def methods(mask: torch.Tensor, lengths: torch.Tensor):
    def fused(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def fast(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask)

    def explicit(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0]

    def unfused_masked_softmax(q, k, v):
        return masked_softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), mask) @ v

    def masked_fill(q, k, v):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    def d2l(q, k, v):  # d2l.ai's masked_softmax(X, valid_lens) + DotProductAttention, for comparison
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        shape = scores.shape
        flat = scores.reshape(-1, shape[-1])
        valid = torch.repeat_interleave(lengths, shape[1])
        seq_mask = torch.arange(shape[-1])[None, :] < valid[:, None]
        flat = flat.masked_fill(~seq_mask, -1e6)  # out of place (d2l writes in place)
        return torch.bmm(torch.softmax(flat.reshape(shape), dim=-1), v)

    return {"torch fused": fused, "attnbook fast": fast, "attnbook explicit": explicit,
            "masked_softmax (unfused)": unfused_masked_softmax, "masked_fill + softmax": masked_fill,
            "d2l masked_softmax": d2l}


def time_once(fn, q, k, v, upstream) -> float:
    for t in (q, k, v):
        t.grad = None
    start = time.perf_counter()
    fn(q, k, v).backward(upstream)
    return time.perf_counter() - start


def run(batch=64, n=512, d=64, dtype=torch.float32, rounds=15, warmup=2, seed=0) -> pd.DataFrame:
    q, k, v, mask, lengths, upstream = make_inputs(batch, n, d, dtype, seed)
    fns = methods(mask, lengths)
    # correctness on these very inputs: max |difference| of output and of dq from the fused kernel
    ref = fns["torch fused"](q, k, v)
    (ref_dq,) = torch.autograd.grad((ref * upstream).sum(), q)
    err = {}
    for name, fn in fns.items():
        out = fn(q, k, v)
        (dq,) = torch.autograd.grad((out * upstream).sum(), q)
        err[name] = max(float((out - ref).abs().max().detach()), float((dq - ref_dq).abs().max()))
    for _ in range(warmup):
        for fn in fns.values():
            time_once(fn, q, k, v, upstream)
    order, rng = list(fns), random.Random(seed)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            times[name].append(time_once(fns[name], q, k, v, upstream))
    rows = []
    for name in fns:
        ratios = [t / r for t, r in zip(times[name], times["torch fused"])]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        target = TARGETS.get(name)
        rows.append({
            "method": name,
            "median_ms": 1e3 * statistics.median(times[name]),
            "median_ratio": statistics.median(ratios),
            "ratio_q1": q1,
            "ratio_q3": q3,
            "target": target,
            "met": None if target is None else statistics.median(ratios) <= target,
            "max_abs_err": err[name],
        })
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--n", type=int, default=512, help="number of queries = number of keys")
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="a sentence about the machine, written into the file")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_attention.md")
    args = parser.parse_args()
    start = time.perf_counter()
    table = run(args.batch, args.n, args.d, getattr(torch, args.dtype), args.rounds, seed=args.seed)
    record = provenance(wall_time_s=time.perf_counter() - start, device="cpu", batch=args.batch, n=args.n,
                        d=args.d, dtype=args.dtype, rounds=args.rounds, note=args.note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.4g")
    write_provenance(args.out.with_suffix(".json"), record)
    lines = [
        "# Benchmark: attnbook.attention.scaled_dot_product_attention vs torch's fused kernel",
        "",
        f"CPU, forward + backward, batch {args.batch}, {args.n} queries and keys, d {args.d}, {args.dtype}, "
        f"random key lengths with a padding mask; {args.rounds} interleaved rounds; ratio = time / fused time in "
        "the same round (median, with quartiles). Written by `benchmarks/bench_attention.py`.",
        "",
        table.to_markdown(index=False, floatfmt=".3g"),
        "",
        "## Provenance",
        "",
        *[f"- {key}: {value}" for key, value in record.items()],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
