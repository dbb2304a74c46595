"""Benchmark: real tokens per second of chapter 8's IMDB classifier trained on packed rows or on padded batches (CPU).

A script, not a test (timings depend on the machine and its load). Usage, from the repository root:

    .venv/bin/python benchmarks/bench_packing.py                     # full-size model, 8 steps a layout, 5 rounds
    .venv/bin/python benchmarks/bench_packing.py --steps 4 --rounds 3 --out /tmp/bench_packing.md
    .venv/bin/python benchmarks/bench_packing.py --quick --out /tmp/bench_packing.md   # tiny, a few seconds

Setup (issue 21, section 3; chapter 9, section "Packing instead of padding"). The model is chapter 8's full-mode
classifier (:meth:`attnbook.experiments.packing.PackingConfig.full`: d_model 64, 2 layers, 4 heads, feed-forward
256, reviews cut to ``max_len`` 400 tokens, no dropout; masked mean readout, :func:`attnbook.experiments.
transformer_padding._build`), fp32, on the CPU with **one torch thread**, in training mode. One timed *step* =
forward + cross-entropy + backward + Adam step, as in :func:`attnbook.experiments.transformer_padding.train_model`;
building the batch (padding, or packing by first-fit decreasing) is not in the step time (it is timed apart, as
``prep_ms``). The data are the real training reviews of chapter 5's split (token ids and lengths from
:func:`attnbook.experiments.packing.prepare_data` with the full configuration; the speed depends on the lengths only).

Layouts, each a copy of one initialized model with its own Adam:

- ``padded/random``: the first ``--steps`` batches of ``batch_size`` reviews of :class:`attnbook.batching.
  RandomBatchSampler` (seed 0), right-padded to the batch's longest review, a key padding mask (bool, True = a real
  token): chapter 8's reference and the baseline of every ratio;
- ``padded/bucketed``: the first ``--steps`` batches (as many reviews per step) of :class:`attnbook.batching.
  BucketBatchSampler` (seed 0): other reviews, of similar length within a batch, so narrower batches;
- ``packed``: the reviews of the ``padded/random`` steps, each step's reviews packed by first-fit decreasing into
  rows of at most ``max_len`` tokens (:func:`attnbook.experiments.packing._packed_batch`, as the experiment does),
  through :meth:`~attnbook.transformer.TransformerClassifier.forward_packed` with its dense ``(B, L, L)`` document
  mask (bool, True = takes part, as ``F.scaled_dot_product_attention``'s ``attn_mask``);
- ``packed/nested``: the same reviews with no pad at all: every per-token layer runs on the flat ``(T, d_model)``
  real tokens and self-attention on jagged nested tensors (``torch.nested.nested_tensor_from_jagged`` with the
  documents' offsets, :func:`attnbook.batching.document_offsets`) through ``F.scaled_dot_product_attention``, the
  model's own weights (:func:`nested_forward`). On a CPU torch 2.13 runs that attention by an unfused path that
  copies the documents into padded blocks (``masked_select``, ``cat``, ``bmm``), several times slower than the dense
  mask, so a full training step with it is far too slow to put in the rounds: it is timed once on the first step
  (``nested_step``, beside one ``packed`` step) and otherwise only as an attention op.

Rounds are interleaved: every round runs every layout's ``--steps`` steps once, the layouts in a shuffled order; a
layout's real tokens per second in a round = its real (non-pad) tokens over those steps / their summed time; its
ratio = that / ``padded/random``'s in the same round. We report the median over rounds (ratios: median, min and
max). ``pad_fraction`` = the share of the computed token slots (rows x width) that hold pads; ``score_fraction`` =
the share of the computed attention scores (rows x width x width per head) that pair a token with a key of its own
review (the rest are masked and thrown away; for ``packed/nested`` nominally 1: see below); ``mean_width`` = the
mean width of a step's rows (for ``packed/nested``: its longest review); ``rows_per_step`` (for ``packed/nested``:
its reviews); ``prep_ms`` = building one step's batch (median; for ``packed``, first-fit decreasing and
:func:`~attnbook.batching.pack_collate`, which the experiment counts as training time and this table does not).

Attention op only (``--attention-steps``, default 2): for the first steps' shapes, one multi-head self-attention
(fwd + bwd to q, k, v, random inputs) as each layout computes it: :func:`attnbook.attention.
scaled_dot_product_attention` with the key padding mask ``(B, 1, 1, L)`` (padded) or the dense document mask
``(B, 1, L, L)`` (packed, as ``forward_packed`` builds it), and the jagged nested tensors of ``packed/nested``;
interleaved rounds as well; ``attn_ratio`` = time / ``padded/random``'s time in the same round (lower is faster).

Writes a markdown table with notes and provenance to ``--out`` (default ``results/bench_packing.md``), the table as
CSV beside it (``.csv``) and the provenance, the notes and the table as JSON (``.json``). Chapter 9 quotes the ratio
from the stored files; it never runs this script.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from attnbook.attention import scaled_dot_product_attention
from attnbook.batching import BucketBatchSampler, RandomBatchSampler, document_offsets
from attnbook.experiments import packing as ex
from attnbook.experiments.masking import _batch
from attnbook.provenance import provenance, write_provenance
from attnbook.transformer import TransformerClassifier, sinusoidal_encoding

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("padded/random", "padded/bucketed", "packed")          # full training steps, in the rounds
ATTENTION_LAYOUTS = (*LAYOUTS, "packed/nested")                   # the attention op alone
BASELINE = "padded/random"
COLUMNS = ["layout", "tokens_per_s", "ratio", "ratio_min", "ratio_max", "step_ms", "pad_fraction", "score_fraction",
           "mean_width", "rows_per_step", "real_tokens_per_step", "prep_ms", "attn_ms", "attn_ratio",
           "max_abs_logit_diff"]
_NJT_WARNING = "The PyTorch API of nested tensors is in prototype stage"


def quick_config() -> ex.PackingConfig:
    """A tiny configuration for tests: 200 Rotten Tomatoes sentences cut to 40 tokens, d_model 8, 1 layer."""
    return replace(ex.PackingConfig.quick(), source="rotten_tomatoes", n_train=200, n_eval=20, max_len=40,
                   vocab_size=500, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, batch_size=16)


# ----------------------------------------------------------------------------------------------- the layouts
def nested_forward(model: TransformerClassifier, ids: torch.Tensor, positions: torch.Tensor,
                   offsets: torch.Tensor) -> torch.Tensor:
    """``model``'s logits for documents given as flat real tokens, with jagged nested-tensor self-attention.

    Args:
        model: a post-LN, sinusoidal, mean-readout :class:`~attnbook.transformer.TransformerClassifier` (chapter 8's
            reference; checked).
        ids: int64 ``(T,)``, the real tokens of all documents one after another (no pads).
        positions: int64 ``(T,)``, each token's position in its document (restarting at 0).
        offsets: int64 ``(N + 1,)``, the documents' cumulative offsets (:func:`attnbook.batching.document_offsets`).

    Returns:
        ``(N, num_classes)`` logits, those of ``model.forward_packed`` on the same documents (to fp32 rounding).

    Raises:
        ValueError: a model of another kind (pre-LN, other positions or readout, a final norm).
    """
    emb = model.embedding
    if (emb.kind != "sinusoidal" or model.readout != "mean" or model.encoder.norm is not None
            or any(layer.norm_first or layer.rotary for layer in model.encoder.layers)):
        raise ValueError("nested_forward needs a post-LN classifier with sinusoidal positions and a mean readout, "
                         f"got positional={emb.kind!r}, readout={model.readout!r}")
    x = emb.dropout(emb.embedding(ids) * emb.d_model ** 0.5 + sinusoidal_encoding(positions, emb.d_model,
                                                                                  dtype=emb.embedding.weight.dtype))
    for layer in model.encoder.layers:
        attn = layer.self_attn
        q, k, v = (torch.nested.nested_tensor_from_jagged(proj(x).unflatten(-1, (attn.num_heads, attn.head_dim)),
                                                          offsets).transpose(1, 2)
                   for proj in (attn.q_proj, attn.k_proj, attn.v_proj))                    # (N, H, j, Dh)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_NJT_WARNING)
            context = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).values().flatten(-2)   # (T, d)
        x = layer.norm1(x + layer.dropout1(attn.out_proj(context)))
        x = layer.norm2(x + layer._ff_block(x))
    sizes = offsets.diff()
    doc = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    pooled = x.new_zeros(len(sizes), x.shape[-1]).index_add_(0, doc, x) / sizes[:, None].to(x.dtype)
    return model.classifier(pooled)


def make_steps(train: dict, cfg: ex.PackingConfig, steps: int, seed: int = 0) -> dict[str, list[dict]]:
    """Each layout's ``steps`` batches: ``{"inputs", "labels", "tokens", "slots", "width", "rows", "prep_s",
    "order", "pairs", "useful_pairs"}`` (``order``: the dataset index of each review, in the order of the model's
    outputs; ``pairs``: the (query, key) scores an attention head computes, ``useful_pairs``: those of a token and a
    key of its own review).

    ``packed/nested`` has the reviews of ``packed``, as flat tokens with positions and offsets.

    Raises:
        ValueError: ``steps`` larger than an epoch's number of batches.
    """
    random_batches = list(RandomBatchSampler(train["lengths"], cfg.batch_size, shuffle=True, seed=seed))
    bucket_batches = list(BucketBatchSampler(train["lengths"], cfg.batch_size, shuffle=True, seed=seed))
    if steps > min(len(random_batches), len(bucket_batches)):
        raise ValueError(f"steps must be at most the batches of an epoch ({len(random_batches)}), got {steps}")
    out: dict[str, list[dict]] = {name: [] for name in ATTENTION_LAYOUTS}
    for name, batches in (("padded/random", random_batches), ("padded/bucketed", bucket_batches)):
        for index in batches[:steps]:
            start = time.perf_counter()
            ids, lengths, labels = _batch(train, index, "post")
            prep = time.perf_counter() - start
            out[name].append({"inputs": (ids, lengths), "labels": labels, "tokens": int(lengths.sum()),
                              "slots": ids.numel(), "width": ids.shape[1], "rows": ids.shape[0], "prep_s": prep,
                              "order": list(index), "pairs": ids.shape[0] * ids.shape[1] ** 2,
                              "useful_pairs": int((lengths ** 2).sum())})
    for index in random_batches[:steps]:
        start = time.perf_counter()
        batch = ex._packed_batch(train, index, cfg.max_len)
        prep = time.perf_counter() - start
        labels = torch.from_numpy(train["labels"][batch.order.numpy()])
        tokens = int(batch.lengths.sum())
        out["packed"].append({"inputs": (batch.ids, batch.doc_ids), "labels": labels, "tokens": tokens,
                              "slots": batch.ids.numel(), "width": batch.ids.shape[1], "rows": batch.ids.shape[0],
                              "prep_s": prep, "order": batch.order.tolist(),
                              "pairs": batch.ids.shape[0] * batch.ids.shape[1] ** 2,
                              "useful_pairs": int((batch.lengths ** 2).sum())})
        start = time.perf_counter()
        real = batch.doc_ids >= 0
        flat = (batch.ids[real], batch.positions[real], document_offsets(batch.doc_ids)[0])
        out["packed/nested"].append({"inputs": flat, "labels": labels, "tokens": tokens, "slots": tokens,
                                     "width": int(flat[2].diff().max()), "rows": len(index),
                                     "prep_s": prep + time.perf_counter() - start,
                                     "order": batch.order.tolist(), "pairs": int((batch.lengths ** 2).sum()),
                                     "useful_pairs": int((batch.lengths ** 2).sum())})
    return out


def forward_for(model: TransformerClassifier, layout: str):
    """The call that gives ``layout``'s logits from its inputs."""
    if layout == "packed":
        return lambda ids, doc_ids: model.forward_packed(ids, doc_ids)[0]
    if layout == "packed/nested":
        return lambda ids, positions, offsets: nested_forward(model, ids, positions, offsets)
    return lambda ids, lengths: model(ids, lengths)[0]


def train_steps(model, optimizer, forward, batches: list[dict]) -> float:
    """Forward, cross-entropy, backward and Adam step on each batch; the summed seconds."""
    total = 0.0
    model.train()
    for batch in batches:
        start = time.perf_counter()
        loss = F.cross_entropy(forward(*batch["inputs"]), batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += time.perf_counter() - start
    return total


def logit_differences(model: TransformerClassifier, steps: dict[str, list[dict]]) -> dict[str, float]:
    """On the first step's reviews, max |logit - padded/random's logit| of each layout of the same reviews (the
    same model in eval mode; ``padded/bucketed`` holds other reviews: NaN)."""
    model.eval()
    with torch.no_grad():
        reference = forward_for(model, BASELINE)(*steps[BASELINE][0]["inputs"])
        where = {i: j for j, i in enumerate(steps[BASELINE][0]["order"])}   # dataset index -> row of reference
        diffs = {BASELINE: 0.0, "padded/bucketed": float("nan")}
        for name in ("packed", "packed/nested"):
            logits = forward_for(model, name)(*steps[name][0]["inputs"])
            perm = torch.tensor([where[i] for i in steps[name][0]["order"]])
            diffs[name] = float((logits - reference[perm]).abs().max())
    return diffs


# ----------------------------------------------------------------------------------------------- attention op
def attention_inputs(steps: dict[str, list[dict]], nhead: int, head_dim: int, n: int, seed: int) -> dict:
    """Random q, k, v (``requires_grad``) and masks of each layout's first ``n`` steps' attention shapes."""
    g = torch.Generator().manual_seed(seed)
    out = {name: [] for name in ATTENTION_LAYOUTS}
    for name in ATTENTION_LAYOUTS:
        for batch in steps[name][:n]:
            if name == "packed/nested":
                offsets = batch["inputs"][2]
                shape = (int(offsets[-1]), nhead, head_dim)                                  # (T, H, Dh)
                mask = offsets
            else:
                ids, second = batch["inputs"]
                shape = (ids.shape[0], nhead, ids.shape[1], head_dim)                       # (B, H, L, Dh)
                if name == "packed":
                    mask = (second[:, :, None] == second[:, None, :])[:, None]               # (B, 1, L, L)
                else:
                    mask = (torch.arange(ids.shape[1])[None, :] < second[:, None])[:, None, None, :]  # (B,1,1,L)
            qkv = [torch.randn(shape, generator=g).requires_grad_() for _ in range(3)]
            out[name].append((qkv, mask, torch.randn(shape, generator=g)))
    return out


def attention_time(name: str, items: list) -> float:
    """Summed seconds of fwd + bwd of the attention op over ``items`` (see :func:`attention_inputs`)."""
    total = 0.0
    for (q, k, v), mask, upstream in items:
        for t in (q, k, v):
            t.grad = None
        start = time.perf_counter()
        if name == "packed/nested":
            nested = [torch.nested.nested_tensor_from_jagged(t, mask).transpose(1, 2) for t in (q, k, v)]
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_NJT_WARNING)
                out = F.scaled_dot_product_attention(*nested).transpose(1, 2).values()
        else:
            out = scaled_dot_product_attention(q, k, v, mask)
        out.backward(upstream)
        total += time.perf_counter() - start
    return total


# ----------------------------------------------------------------------------------------------- the benchmark
def run(cfg: ex.PackingConfig, train: dict, vocab_size: int, *, steps: int = 8, rounds: int = 5,
        attention_steps: int = 2, nested_step: bool = True, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """The table (one row per layout of :data:`ATTENTION_LAYOUTS`, columns :data:`COLUMNS`) and the extra record
    (per-round values, the one-off nested step). See the module docstring."""
    torch.manual_seed(seed)
    steps_ = make_steps(train, cfg, steps, seed)
    model = ex._build(cfg, vocab_size, ex._MODEL)
    diffs = logit_differences(model, steps_)
    models = {name: copy.deepcopy(model) for name in LAYOUTS}
    optimizers = {name: torch.optim.Adam(m.parameters(), lr=cfg.lr) for name, m in models.items()}
    forwards = {name: forward_for(m, name) for name, m in models.items()}
    for name in LAYOUTS:                                                     # warm-up: one step each
        train_steps(models[name], optimizers[name], forwards[name], steps_[name][:1])
    order, rng = list(LAYOUTS), random.Random(seed)
    times = {name: [] for name in LAYOUTS}
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            times[name].append(train_steps(models[name], optimizers[name], forwards[name], steps_[name]))
    extra: dict = {"step_times_s": times}
    if nested_step:                                      # one full step with nested attention, beside one packed step
        nested_model = copy.deepcopy(model)
        nested_opt = torch.optim.Adam(nested_model.parameters(), lr=cfg.lr)
        first = steps_["packed/nested"][:1]
        t_nested = train_steps(nested_model, nested_opt, forward_for(nested_model, "packed/nested"), first)
        t_packed = train_steps(models["packed"], optimizers["packed"], forwards["packed"], steps_["packed"][:1])
        extra["nested_step"] = {"nested_s": t_nested, "packed_s": t_packed, "tokens": first[0]["tokens"],
                                "ratio_time": t_nested / t_packed}
    # the attention op alone
    head_dim = cfg.d_model // cfg.nhead
    items = attention_inputs(steps_, cfg.nhead, head_dim, attention_steps, seed)
    for name in ATTENTION_LAYOUTS:
        attention_time(name, items[name][:1])                               # warm-up
    attn = {name: [] for name in ATTENTION_LAYOUTS}
    order = list(ATTENTION_LAYOUTS)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            attn[name].append(attention_time(name, items[name]))
    extra["attention_times_s"] = attn
    rows = []
    for name in ATTENTION_LAYOUTS:
        batches = steps_[name]
        tokens, slots = sum(b["tokens"] for b in batches), sum(b["slots"] for b in batches)
        row = {"layout": name, "pad_fraction": 1 - tokens / slots,
               "score_fraction": sum(b["useful_pairs"] for b in batches) / sum(b["pairs"] for b in batches),
               "mean_width": float(np.mean([b["width"] for b in batches])),
               "rows_per_step": float(np.mean([b["rows"] for b in batches])), "real_tokens_per_step": tokens / steps,
               "prep_ms": 1e3 * statistics.median(b["prep_s"] for b in batches),
               "max_abs_logit_diff": diffs[name]}
        if name in times:
            tps = [tokens / t for t in times[name]]
            base = [sum(b["tokens"] for b in steps_[BASELINE]) / t for t in times[BASELINE]]
            ratios = [a / b for a, b in zip(tps, base)]
            row.update(tokens_per_s=statistics.median(tps), ratio=statistics.median(ratios), ratio_min=min(ratios),
                       ratio_max=max(ratios), step_ms=1e3 * statistics.median(times[name]) / steps)
        else:
            row.update(tokens_per_s=float("nan"), ratio=float("nan"), ratio_min=float("nan"),
                       ratio_max=float("nan"), step_ms=float("nan"))
        n_attn = len(items[name])
        row.update(attn_ms=1e3 * statistics.median(attn[name]) / n_attn,
                   attn_ratio=statistics.median(a / b for a, b in zip(attn[name], attn[BASELINE])))
        rows.append(row)
    return pd.DataFrame(rows)[COLUMNS], extra


def notes(table: pd.DataFrame, extra: dict) -> list[str]:
    """Sentences about the table, their verdicts chosen from its numbers."""
    row = table.set_index("layout")

    def verdict(ratio: float, lo: float, hi: float) -> str:
        if lo > 1:
            return "faster (in every round)"
        if hi < 1:
            return "slower (in every round)"
        return "faster (median; not in every round)" if ratio > 1 else "slower (median; not in every round)"

    def why(packed, bucketed, packing_wins: bool) -> str:
        square = (f"packed rows are {packed['mean_width']:.0f} slots wide and each attention computes the dense "
                  f"{packed['mean_width']:.0f} x {packed['mean_width']:.0f} square of scores under the document mask, "
                  f"of which only {packed['score_fraction']:.3g} pair a token with its own review")
        narrow = (f"bucketed batches are narrow (mean width {bucketed['mean_width']:.0f}, pad fraction "
                  f"{bucketed['pad_fraction']:.3g}) and {bucketed['score_fraction']:.3g} of their scores are used")
        lead = ("packing leaves fewer pad slots in the per-token layers, which outweighs that " if packing_wins
                else "bucketing wins because ")
        return (f"- Why: {lead}{square}, while {narrow}. The attention op alone takes {packed['attn_ratio']:.3g} "
                f"times random padding's time for packed rows and {bucketed['attn_ratio']:.3g} times for bucketed "
                "batches (medians of within-round ratios; lower is faster).")

    packed, bucketed = row.loc["packed"], row.loc["padded/bucketed"]
    vs_bucket = packed["tokens_per_s"] / bucketed["tokens_per_s"]
    lines = [
        f"- Packing is {verdict(packed['ratio'], packed['ratio_min'], packed['ratio_max'])} than random padding on "
        f"this CPU: {packed['ratio']:.3g} times its real tokens per second (rounds: {packed['ratio_min']:.3g} to "
        f"{packed['ratio_max']:.3g}), with a pad fraction of {packed['pad_fraction']:.3g} against "
        f"{row.loc[BASELINE, 'pad_fraction']:.3g}.",
        f"- Packing is {'faster' if vs_bucket > 1 else 'slower'} than bucketing: {vs_bucket:.3g} times its real "
        f"tokens per second (medians; bucketing is {bucketed['ratio']:.3g} times random padding, rounds "
        f"{bucketed['ratio_min']:.3g} to {bucketed['ratio_max']:.3g}).",
        why(packed, bucketed, vs_bucket > 1),
    ]
    nested = row.loc["packed/nested"]
    lines.append(
        f"- Jagged nested tensors (`packed/nested`, no pad slot at all) cost {nested['attn_ratio']:.3g} times random "
        f"padding's attention time on this CPU: torch's CPU path for them is unfused (it copies the documents into "
        f"padded blocks), so the saving in slots does not reach the clock.")
    if "nested_step" in extra:
        ns = extra["nested_step"]
        lines.append(f"- One full training step with nested attention (first step, outside the rounds) took "
                     f"{ns['nested_s']:.3g} s against {ns['packed_s']:.3g} s for the dense-mask packed step "
                     f"({ns['ratio_time']:.3g} times as long); it is not in the rounds.")
    diff = max(row.loc["packed", "max_abs_logit_diff"], row.loc["packed/nested", "max_abs_logit_diff"])
    lines.append(f"- Check: on the first step's reviews the packed and nested layouts give the padded logits to "
                 f"{diff:.2g} (max absolute difference, fp32, the same weights).")
    return lines


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny configuration and size, for tests")
    parser.add_argument("--steps", type=int, default=None, help="training steps per layout and round (default 8)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5)")
    parser.add_argument("--attention-steps", type=int, default=2, help="steps whose attention op is timed")
    parser.add_argument("--n-train", type=int, default=None, help="use the first N training reviews (default: all)")
    parser.add_argument("--no-nested-step", action="store_true", help="skip the one-off nested training step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="a sentence about the machine, written into the file")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_packing.md")
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (2 if args.quick else 8)
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 5)
    for name, value in (("--steps", steps), ("--rounds", rounds), ("--attention-steps", args.attention_steps)):
        if value < 1:
            parser.error(f"{name} must be >= 1, got {value}")
    attention_steps = min(args.attention_steps, steps)
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    torch.set_num_threads(1)
    cfg = quick_config() if args.quick else ex.PackingConfig.full()
    data = ex.prepare_data(cfg)
    train = data["train"]
    if args.n_train is not None:
        train = {k: v[: args.n_train] for k, v in train.items()}
    table, extra = run(cfg, train, data["vocab_size"], steps=steps, rounds=rounds, attention_steps=attention_steps,
                       nested_step=not args.no_nested_step, seed=args.seed)
    text_notes = notes(table, extra)
    record = provenance(wall_time_s=time.perf_counter() - start, device="cpu", mode="quick" if args.quick else "full",
                        threads=1, quick=args.quick,
                        steps=steps, rounds=rounds, attention_steps=attention_steps, batch_size=cfg.batch_size,
                        n_train_reviews=len(train["labels"]), data="real reviews (token ids and lengths) of chapter "
                        "5's training split", cpu_count=os.cpu_count(), load_average=[load_before, os.getloadavg()[0]],
                        note=args.note, config={k: v for k, v in asdict(cfg).items() if k not in ("extra", "seeds")},
                        notes=text_notes, table=table.to_dict(orient="records"), **extra)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out.with_suffix(".csv"), index=False, float_format="%.4g")
    write_provenance(args.out.with_suffix(".json"), record)
    lines = [
        "# Benchmark: packing against padding, real tokens per second (chapter 8's IMDB classifier)",
        "",
        f"CPU, one torch thread, fp32, training mode; one step = forward + backward + Adam step of the classifier "
        f"(d_model {cfg.d_model}, layers {cfg.num_layers}, heads {cfg.nhead}, feed-forward {cfg.dim_feedforward}, "
        f"max_len {cfg.max_len}), batch {cfg.batch_size} reviews, {steps} steps per layout and round, {rounds} "
        f"interleaved rounds in shuffled order; data: the real training reviews of chapter 5's split "
        f"({len(train['labels'])} reviews, their token ids and lengths). tokens_per_s = real (non-pad) tokens per "
        "second (median over rounds); ratio = tokens_per_s / padded/random's in the same round (median, min, max); "
        "pad_fraction = pads among the computed token slots; score_fraction = the share of computed attention "
        "scores that pair a token with its own review; prep_ms (batch building) is not in the step time; "
        f"attn_ms = one self-attention op, fwd + bwd, on the first {attention_steps} step(s)' shapes (median per "
        "step), attn_ratio = its time / padded/random's in the same round. packed/nested runs only in the attention "
        "op (see the notes). Written by `benchmarks/bench_packing.py`.",
        "",
        table.to_markdown(index=False, floatfmt=".4g"),
        "",
        "## Notes",
        "",
        *text_notes,
        "",
        "## Provenance",
        "",
        *[f"- {key}: {value}" for key, value in record.items() if key not in ("notes", "table", "step_times_s",
                                                                          "attention_times_s")],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return table


if __name__ == "__main__":
    main()
