"""Benchmark: the cost of one run of chapter 8's Transformer padding experiment on one CPU core.

A script, not a test (timings depend on the machine and its load). Usage, from the repository root:

    .venv/bin/python benchmarks/bench_transformer_padding.py                  # full mode, 8 timed steps
    .venv/bin/python benchmarks/bench_transformer_padding.py --mode quick --steps 20
    .venv/bin/python benchmarks/bench_transformer_padding.py --out results/bench_transformer_padding.json

It prepares the mode's data (:func:`attnbook.experiments.transformer_padding.prepare_data`), builds the reference
condition's model (``masked/post/index/mean``) with one torch thread, and times, after one untimed step each:

- ``--steps`` training steps (forward, backward, Adam) on the first batches of seed 0's sampler, as
  :func:`~attnbook.experiments.transformer_padding.run_one` makes them (padded to the longest review of the batch:
  with random batches of IMDB reviews cut to 400 tokens that is nearly always 400);
- the four evaluation passes of a run on the first ``--eval-reviews`` test reviews (validation order; test with
  attention weights, which takes the unfused path; test re-padded to ``max_len``; test without padding, in batches
  of reviews of one length), scaled to the sizes of the validation and test splits.

It prints the seconds per training step and the estimate of one run: ``steps per epoch * epochs * step time +
evaluation``. With ``--out`` it writes the numbers and their provenance as JSON. The chapter quotes the estimate
of the configuration's docstring; this script is what backs it.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from attnbook.batching import RandomBatchSampler
from attnbook.experiments import transformer_padding as tp
from attnbook.experiments.masking import _batch
from attnbook.provenance import provenance, write_provenance


def _subset(part: dict, n: int) -> dict:
    return {k: v[:n] for k, v in part.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("quick", "full"), default="full")
    parser.add_argument("--steps", type=int, default=8, help="timed training steps")
    parser.add_argument("--eval-reviews", type=int, default=300, help="test reviews in the timed evaluation")
    parser.add_argument("--out", type=Path, default=None, help="write the result and provenance (JSON)")
    parser.add_argument("--note", default="", help="a remark for the record, e.g. the machine's load")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    load_before = os.getloadavg()[0]
    cfg = tp.TransformerPaddingConfig.for_mode(args.mode)
    torch.set_num_threads(1)
    data = tp.prepare_data(cfg)
    train, n_val, n_test = data["train"], len(data["validation"]["labels"]), len(data["test"]["labels"])
    torch.manual_seed(0)
    condition = dict(zip(tp.FACTORS, tp.REFERENCE.split("/")))
    model = tp._build(cfg, data["vocab_size"], condition)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    sampler = RandomBatchSampler(train["lengths"], cfg.batch_size, shuffle=True, seed=0)
    batches = [b for b, _ in zip(sampler, range(args.steps + 1))]
    widths, times = [], []
    model.train()
    for i, index in enumerate(batches):
        ids, lengths, labels = _batch(train, index, "post")
        t = time.perf_counter()
        loss = F.cross_entropy(model(ids, lengths)[0], labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i:                                                   # the first step warms up
            times.append(time.perf_counter() - t)
            widths.append(ids.shape[1])
    step_s = float(np.median(times))
    steps_per_epoch = math.ceil(len(train["labels"]) / cfg.batch_size)
    test = _subset(data["test"], args.eval_reviews)
    n = len(test["labels"])
    device = torch.device("cpu")
    tp._evaluate(model, test, cfg, device)                      # warm-up
    eval_s = {}
    for name, call in (("plain", lambda: tp._evaluate(model, test, cfg, device)),
                       ("with attention weights", lambda: tp._evaluate(model, test, cfg, device, attention=True)),
                       ("padded to max_len", lambda: tp._evaluate(model, test, cfg, device, length=cfg.max_len)),
                       ("without padding", lambda: tp._unpadded_predictions(model, test, cfg, device))):
        t = time.perf_counter()
        call()
        eval_s[name] = (time.perf_counter() - t) / n            # seconds per review
    evaluation = eval_s["plain"] * n_val + (eval_s["with attention weights"] + eval_s["padded to max_len"]
                                            + eval_s["without padding"]) * n_test
    training = steps_per_epoch * cfg.epochs * step_s
    result = {"mode": args.mode, "step_s": step_s, "step_s_min": float(min(times)), "steps": len(times),
              "batch_width": int(np.median(widths)), "steps_per_epoch": steps_per_epoch, "epochs": cfg.epochs,
              "training_s": training, "evaluation_s": evaluation, "run_s": training + evaluation,
              "eval_s_per_review": eval_s, "n_validation": n_val, "n_test": n_test, "eval_reviews_timed": n}
    print(f"{args.mode} mode: {step_s:.3f} s per training step (median of {len(times)}, batch {cfg.batch_size} x "
          f"{result['batch_width']} tokens), {steps_per_epoch} steps per epoch x {cfg.epochs} epoch(s) = "
          f"{training / 60:.1f} min; evaluation {evaluation / 60:.1f} min; one run about {result['run_s'] / 60:.1f} "
          f"min on one core")
    if args.out is not None:
        record = provenance(wall_time_s=time.perf_counter() - start, device="cpu", threads=1, note=args.note,
                            cpu_count=os.cpu_count(), load_average=[load_before, os.getloadavg()[0]],
                            config={k: v for k, v in asdict(cfg).items() if k != "extra"}, **result)
        write_provenance(args.out, record)
        print(f"written to {args.out}")
    return result


if __name__ == "__main__":
    main()
