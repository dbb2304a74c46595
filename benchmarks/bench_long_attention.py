"""Benchmark: memory and time of attention as the length grows (CPU): torch SDPA, the explicit path, blockwise.

A script, not a test (memory and times depend on the machine and its load). Usage, from the repository root:

    .venv/bin/python benchmarks/bench_long_attention.py           # L = 512 ... 16384, batch 1, 4 heads, d_k 64
    .venv/bin/python benchmarks/bench_long_attention.py --lengths 64 128 --rounds 1 --out /tmp/bench.md

Setup (issue 21, chapter 9, section 2): fp32 self-attention inputs ``(batch, heads, L, d_k)`` with a bool
key-padding mask ``(batch, 1, 1, L)`` (True = takes part) that masks the last eighth of the keys.

Methods:
- ``torch SDPA``: ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)``, the reference (ratio 1);
- ``attnbook explicit``: ``attnbook.attention.scaled_dot_product_attention(..., return_weights=True)``, which
  forms the full ``(L, L)`` weights;
- ``blockwise``: ``attnbook.attention.blockwise_attention`` (the online softmax, ``--block-size`` keys and
  ``--query-block-size`` queries per tile), and ``blockwise + checkpoint`` (the same with ``checkpoint=True``:
  its forward pass is the same computation; only forward + backward differs);
- forward memory only, to see what torch's CPU kernel does with a mask: ``SDPA, float mask`` (the same mask as
  an additive fp32 mask of 0 and -inf), ``SDPA, no mask``, and ``SDPA, bool mask (L, L)`` (the key-padding mask
  materialised as a full ``(batch, 1, L, L)`` bool tensor). The notes of the markdown file state the conclusion,
  chosen by code from these peaks.

Memory: each (method, L, pass) runs in a new process, forked (``multiprocessing``'s forkserver) from a server
that has only imported torch and this script and never run an operation. The child sets glibc's mmap threshold
to 64 KiB (so that large blocks are mapped and unmapped, and the resident size follows the live tensors), runs
the method once at L = 64 to initialise the libraries, allocates the inputs (and the upstream gradient), reads its
resident set size (``VmRSS``), resets the kernel's peak (writing 5 to ``/proc/self/clear_refs``), makes the one
call (forward only, with inputs that need no gradient; or forward + backward to q, k, v) and reads the peak
``VmHWM``. The number is that peak minus the resident size before the call: what the call adds beyond its inputs,
in whole pages, including temporaries, saved tensors, the gradients (forward + backward) and any allocator or
library overhead. Linux only.

Time: in this process, after one untimed call per method (which also checks the output and dq against SDPA),
``--rounds`` interleaved rounds (every round runs every timed method once, in a shuffled order); forward and
backward are timed separately and divided by SDPA's times in the same round; we report the medians. Lengths above
``--time-max-length`` (default 8,192) are measured for memory only, to keep the whole run within minutes on a
busy CPU. One torch thread by default (``--threads``): on a shared 2-core machine two threads wait for each other
and make small operations many times slower. The machine may be shared, so only the ratios mean much.

A (method, L, pass) whose estimated memory exceeds ``--max-gib`` is skipped (the table says so): the explicit
path holds about 2 (forward) or 4 (forward + backward) fp32 ``(batch, heads, L, L)`` matrices, blockwise
without checkpoint about 1.25 in forward + backward.

Writes a markdown table with the targets, the conclusion about torch's kernel and the provenance to ``--out``
(default ``results/bench_long_attention.md``), the table as CSV beside it (``.csv``) and the provenance, the
targets and the conclusion as JSON (``.json``). Chapter 9 shows the stored table; it never runs this script.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from attnbook.attention import blockwise_attention, scaled_dot_product_attention
from attnbook.provenance import provenance, write_provenance

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
TIMED = ["torch SDPA", "attnbook explicit", "blockwise", "blockwise + checkpoint"]
MEMORY_ONLY = ["SDPA, float mask", "SDPA, no mask", "SDPA, bool mask (L, L)"]
PASSES = ["forward", "forward+backward"]
#: Estimated peak, in fp32 (batch, heads, L, L) matrices, of the methods that form or keep O(L^2) numbers.
MATRICES = {("attnbook explicit", "forward"): 2.0, ("attnbook explicit", "forward+backward"): 4.0,
            ("blockwise", "forward+backward"): 1.25}
TARGET_MEMORY, TARGET_TIME, TARGET_L = 1 / 8, 2.0, 8192


def make_inputs(batch: int, heads: int, n: int, d: int, seed: int, requires_grad: bool):
    """q, k, v ``(batch, heads, n, d)`` fp32, the key-padding mask ``(batch, 1, 1, n)`` (the last eighth of the keys
    masked; True = takes part) and an upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, generator=g).requires_grad_(requires_grad) for _ in range(3))
    mask = (torch.arange(n) < n - n // 8).expand(batch, 1, 1, n).clone()
    upstream = torch.randn(batch, heads, n, d, generator=g)
    return q, k, v, mask, upstream


def make_method(name: str, mask: torch.Tensor, block_size: int, query_block_size: int):
    """The function ``(q, k, v) -> output`` of a method; any extra mask it needs is allocated here (an input)."""
    if name == "torch SDPA":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if name == "attnbook explicit":
        return lambda q, k, v: scaled_dot_product_attention(q, k, v, mask, return_weights=True)[0]
    if name in ("blockwise", "blockwise + checkpoint"):
        ckpt = name.endswith("checkpoint")
        return lambda q, k, v: blockwise_attention(q, k, v, mask, block_size=block_size,
                                                   query_block_size=query_block_size, checkpoint=ckpt)
    if name == "SDPA, float mask":
        additive = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    if name == "SDPA, no mask":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    if name == "SDPA, bool mask (L, L)":
        n = mask.shape[-1]
        full = mask.expand(mask.shape[0], 1, n, n).contiguous()
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    raise ValueError(f"unknown method {name!r}")


def estimated_gib(name: str, pass_: str, batch: int, heads: int, n: int) -> float:
    return MATRICES.get((name, pass_), 0.0) * batch * heads * n * n * 4 / 2**30


# ----------------------------------------------------------------------------------------------- memory
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(name: str, n: int, pass_: str, args) -> float:
    """In a fresh process: the peak resident memory one call of ``name`` adds beyond its inputs, in MiB."""
    ctypes.CDLL(None).mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: blocks >= 64 KiB are mapped and unmapped
    torch.set_num_threads(args.threads)
    backward = pass_ == "forward+backward"
    for size in (64, n):  # the first call, at L = 64, only initialises the libraries
        q, k, v, mask, upstream = make_inputs(args.batch, args.heads, size, args.d, args.seed, backward)
        fn = make_method(name, mask, args.block_size, args.query_block_size)
        before = _status_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM (the peak resident size) to the current resident size
        if backward:
            fn(q, k, v).backward(upstream)
        else:
            out = fn(q, k, v)
            del out
        peak = _status_kib("VmHWM")
    return (peak - before) / 1024


def memory_pool() -> ProcessPoolExecutor:
    """A pool that runs each task in a new process, forked from a server that has only imported this module
    (torch included) and never run an operation: no start-up cost per measurement, no inherited heap."""
    context = multiprocessing.get_context("forkserver")
    # '__main__' when run as a script; Python 3.11's server ignores sys.path, hence the modules named first.
    # torch's backward imports symbolic_shapes (and sympy, seconds) the first time it is given a gradient.
    context.set_forkserver_preload(["torch", "torch.fx.experimental.symbolic_shapes", "pandas",
                                    "attnbook.attention", child.__module__])
    return ProcessPoolExecutor(max_workers=1, mp_context=context, max_tasks_per_child=1)


# ----------------------------------------------------------------------------------------------- time
def measure_time(n: int, names: list[str], args) -> dict:
    """Medians of forward and backward milliseconds, their ratios to SDPA within a round, and max |error|."""
    q, k, v, mask, upstream = make_inputs(args.batch, args.heads, n, args.d, args.seed, True)
    fns = {name: make_method(name, mask, args.block_size, args.query_block_size) for name in names}

    def once(fn):
        for t in (q, k, v):
            t.grad = None
        start = time.perf_counter()
        out = fn(q, k, v)
        middle = time.perf_counter()
        out.backward(upstream)
        return out.detach(), q.grad.clone(), middle - start, time.perf_counter() - middle

    ref, ref_dq, _, _ = once(fns["torch SDPA"])
    error = {}
    for name, fn in fns.items():  # the untimed call: a warm-up and a check of output and dq against SDPA
        out, dq, _, _ = once(fn)
        error[name] = max(float((out - ref).abs().max()), float((dq - ref_dq).abs().max()))
    times = {name: {"forward": [], "backward": []} for name in fns}
    order, rng = list(fns), random.Random(args.seed + n)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            _, _, forward, backward = once(fns[name])
            times[name]["forward"].append(forward)
            times[name]["backward"].append(backward)
    result = {}
    for name in fns:
        row = {"max_abs_err": error[name]}
        for part in ("forward", "backward"):
            ratios = [t / r for t, r in zip(times[name][part], times["torch SDPA"][part])]
            row[f"{part}_ms"] = 1e3 * statistics.median(times[name][part])
            row[f"{part}_ratio"] = statistics.median(ratios)
        result[name] = row
    return result


# ----------------------------------------------------------------------------------------------- run
def run(args) -> tuple[pd.DataFrame, list[dict], str]:
    rows, pool = [], memory_pool()
    for n in args.lengths:
        skipped = {(name, pass_) for name in TIMED + MEMORY_ONLY for pass_ in PASSES
                   if estimated_gib(name, pass_, args.batch, args.heads, n) > args.max_gib}
        timed = [name for name in TIMED if (name, "forward+backward") not in skipped]
        times = measure_time(n, timed, args) if n <= args.time_max_length else {}
        for name in TIMED + MEMORY_ONLY:
            row, notes = {"L": n, "method": name}, []
            for pass_ in PASSES:
                key = "mem_fwd_mib" if pass_ == "forward" else "mem_fwd_bwd_mib"
                row[key] = float("nan")
                if (name, pass_) in skipped:
                    notes.append(f"{pass_} skipped (estimated > {args.max_gib:g} GiB)")
                elif name in MEMORY_ONLY and pass_ != "forward":
                    pass  # the question about torch's kernel concerns the forward pass; saves run time
                elif name == "blockwise + checkpoint" and pass_ == "forward":
                    notes.append("forward memory: as blockwise (the same computation)")
                else:
                    row[key] = pool.submit(child, name, n, pass_, args).result()
            row.update(times.get(name, {}))
            if name in TIMED and n > args.time_max_length:
                notes.append("not timed (L > --time-max-length)")
            row["note"] = "; ".join(notes)
            rows.append(row)
            print(f"L={n:>6} {name:<24} " + " ".join(f"{key}={value:.4g}" for key, value in row.items()
                                                       if isinstance(value, float)), flush=True)
    pool.shutdown()
    table = pd.DataFrame(rows)
    columns = ["L", "method", "mem_fwd_mib", "mem_fwd_bwd_mib", "forward_ms", "backward_ms", "forward_ratio",
               "backward_ratio", "max_abs_err", "note"]
    table = table.reindex(columns=columns)
    table["score_matrix_mib"] = args.batch * args.heads * table["L"] ** 2 * 4 / MIB
    return table, targets(table, args), sdpa_conclusion(table, args)


def _value(table: pd.DataFrame, n: int, method: str, column: str) -> float:
    cell = table.loc[(table["L"] == n) & (table["method"] == method), column]
    return float(cell.iloc[0]) if len(cell) else float("nan")


def targets(table: pd.DataFrame, args) -> list[dict]:
    """The issue's targets at L = 8,192 (or the largest length measured, if smaller)."""
    n = TARGET_L if TARGET_L in set(table["L"]) else int(table["L"].max())
    checks = [
        ("memory, forward: blockwise / explicit", "blockwise", "attnbook explicit", "mem_fwd_mib", TARGET_MEMORY),
        ("memory, forward+backward: blockwise / explicit", "blockwise", "attnbook explicit", "mem_fwd_bwd_mib",
         TARGET_MEMORY),
        ("memory, forward+backward: blockwise + checkpoint / explicit", "blockwise + checkpoint",
         "attnbook explicit", "mem_fwd_bwd_mib", TARGET_MEMORY),
        ("time, forward: blockwise / SDPA", "blockwise", None, "forward_ratio", TARGET_TIME),
        ("time, backward: blockwise / SDPA", "blockwise", None, "backward_ratio", TARGET_TIME),
        ("time, backward: blockwise + checkpoint / SDPA", "blockwise + checkpoint", None, "backward_ratio",
         TARGET_TIME),
    ]
    result = []
    for label, method, reference, column, target in checks:
        value = _value(table, n, method, column)
        if reference is not None:
            value = value / _value(table, n, reference, column)
        result.append({"L": n, "quantity": label, "value": value, "target": f"<= {target:.3g}",
                       "met": bool(value <= target) if value == value else None})
    return result


def sdpa_conclusion(table: pd.DataFrame, args) -> str:
    """What torch's CPU kernel allocates with a bool mask, chosen from the forward peaks at the largest length."""
    n = int(table["L"].max())
    score = args.batch * args.heads * n * n * 4 / MIB  # one fp32 (batch, heads, L, L) score matrix
    float_full = args.batch * n * n * 4 / MIB  # the (batch, 1, L, L) bool mask as an fp32 mask
    peak = {name: _value(table, n, name, "mem_fwd_mib") for name in
            ("torch SDPA", "SDPA, float mask", "SDPA, no mask", "SDPA, bool mask (L, L)")}
    forms_scores = peak["torch SDPA"] >= 0.5 * score
    bool_extra = peak["torch SDPA"] - peak["SDPA, no mask"]
    full_extra = peak["SDPA, bool mask (L, L)"] - peak["SDPA, no mask"]
    text = [f"At L = {n:,} (forward, beyond the inputs): SDPA with the bool key-padding mask adds "
            f"{peak['torch SDPA']:.1f} MiB, with the same mask as a float mask {peak['SDPA, float mask']:.1f} MiB, "
            f"with no mask {peak['SDPA, no mask']:.1f} MiB, and with the mask as a full (L, L) bool tensor "
            f"{peak['SDPA, bool mask (L, L)']:.1f} MiB; one fp32 score matrix would be {score:.0f} MiB."]
    text.append("So torch's CPU kernel " + ("forms" if forms_scores else "does not form") + " the full score matrix"
                + (" with a bool key-padding mask" if forms_scores else "") + ", and a bool key-padding mask "
                + ("costs the same as no mask (difference "
                   f"{bool_extra:+.1f} MiB)" if abs(bool_extra) < 0.05 * score else
                   f"adds {bool_extra:.1f} MiB over no mask") + ".")
    if full_extra >= 0.5 * float_full:
        text.append(f"A full (L, L) bool mask adds {full_extra:.0f} MiB over no mask, about the {float_full:.0f} "
                    "MiB of an fp32 copy of that mask: the bool mask is converted to a float mask of its own shape "
                    "(cheap for a key-padding mask, L^2 floats for a full one).")
    else:
        text.append(f"A full (L, L) bool mask adds {full_extra:.1f} MiB over no mask, less than half of the "
                    f"{float_full:.0f} MiB of an fp32 copy: no full float mask is formed.")
    return " ".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**p for p in range(9, 15)])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--query-block-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-max-length", type=int, default=8192,
                        help="time only lengths up to this (longer ones: memory only, to keep the run short)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    parser.add_argument("--max-gib", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="a sentence about the machine, written into the file")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_long_attention.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    table, checks, conclusion = run(args)
    record = provenance(wall_time_s=time.perf_counter() - start, device="cpu", batch=args.batch,
                        heads=args.heads, d=args.d, lengths=args.lengths, dtype="float32",
                        block_size=args.block_size, query_block_size=args.query_block_size, rounds=args.rounds,
                        time_max_length=args.time_max_length,
                        threads=args.threads, max_gib=args.max_gib, note=args.note, targets=checks,
                        sdpa_mask_conclusion=conclusion)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.4g")
    write_provenance(args.out.with_suffix(".json"), record)
    lines = [
        "# Benchmark: memory and time of attention as the length grows (CPU)",
        "",
        f"fp32, batch {args.batch}, {args.heads} heads, d_k {args.d}, self-attention with a bool key-padding mask "
        f"(the last eighth of the keys masked); blockwise tiles of {args.query_block_size} queries x "
        f"{args.block_size} keys; {args.threads} torch thread(s). Memory: the peak resident memory one call adds "
        "beyond its inputs (MiB), each in a fresh process (VmHWM reset before the call, glibc mmap threshold 64 "
        f"KiB). Time: {args.rounds} interleaved rounds after one untimed call; ratio = time / SDPA's time in the "
        "same round (median); forward with inputs that need gradients. `score_matrix_mib` = one fp32 "
        "(batch, heads, L, L) matrix. Written by `benchmarks/bench_long_attention.py`.",
        "",
        table.to_markdown(index=False, floatfmt=".4g"),
        "",
        "## Targets",
        "",
        pd.DataFrame(checks).to_markdown(index=False, floatfmt=".3g"),
        "",
        "## Notes",
        "",
        f"- torch's CPU kernel and masks: {conclusion}",
        "- Skipped cells: a (method, pass) whose estimated peak exceeds the limit of "
        f"{args.max_gib:g} GiB is not run (column `note`); its time is then not measured either.",
        "- Blockwise + checkpoint computes the same forward pass as blockwise; only its forward+backward differs, "
        "so its forward memory is not measured again. The SDPA mask variants are measured in the forward pass "
        f"only. Lengths above {args.time_max_length:,} are not timed (memory only), to keep the run short.",
        "",
        "## Provenance",
        "",
        *[f"- {key}: {value}" for key, value in record.items() if key not in ("targets", "sdpa_mask_conclusion")],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
