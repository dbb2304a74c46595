"""Digit captioning with soft, hard (REINFORCE) and straight-through Gumbel attention: training, accuracy, gradient
variance and wall time. Chapter 7, "Soft and hard attention", section "Digit captioning".

Use from Python (the chapter does)::

    cfg = HardAttentionConfig.quick()            # or .full(), or HardAttentionConfig.for_mode(get_mode())
    data = make_data(cfg)
    run = train_captioner(cfg, "hard", data, seed=0)   # dict: model, curve (DataFrame), metrics, wall time

or from the command line, for the full grid (every mode and seed) with provenance beside the CSV::

    python -m attnbook.experiments.hard_attention --mode full --out results/hard_attention_full.csv

which writes ``hard_attention_full.csv`` (one row per mode and seed), ``hard_attention_full_curves.csv``,
``hard_attention_full_gradvar.csv`` and ``hard_attention_full.json`` (provenance, one session per invocation). It
is a results store (:mod:`attnbook.store`): each run is stored as soon as it finishes, so a killed grid resumes
where it stopped (the same command again).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..data.digits import DIGIT_SIZE, DigitCanvases, make_canvases, split_digit_images
from ..hard_attention import MODES, DigitCaptioner, MovingAverageBaseline, captioning_loss
from ..runtime import ModeConfig, get_device, listing, plural, progress
from ..store import Layout, ResultsStore, Session, StoreError, csv_path, device_arg, positive_int

__all__ = [
    "HardAttentionConfig",
    "make_data",
    "build_model",
    "evaluate",
    "train_captioner",
    "gradient_estimates",
    "gradient_variance",
    "run_grid",
    "stored_summary",
    "main",
    "LAYOUT",
    "DECODER_NAMES",
    "ESTIMATOR_NAMES",
    "half_sentence",
    "own_digit_sentence",
    "captions_sentence",
    "agreement_phrase",
    "compare_estimators",
    "order_sentence",
    "paper_sentence",
]


@dataclass(frozen=True)
class HardAttentionConfig(ModeConfig):
    """Sizes and hyper-parameters of the digit-captioning experiment (quick: a 2-core CPU; full: a GPU)."""

    n_digits: int = 3
    width: int = 24
    height: int = 8
    n_train: int = 6000
    n_test: int = 1000
    n_curve_eval: int = 500
    steps: int = 800
    batch_size: int = 64
    lr: float = 3e-3
    channels: int = 16
    annotation_size: int = 32
    hidden_size: int = 64
    embed_size: int = 16
    attention_size: int = 32
    tau: float = 1.0
    entropy_weight: float = 0.01
    baseline_momentum: float = 0.9
    eval_every: int = 50
    grad_estimates: int = 32
    seeds: tuple[int, ...] = (0,)
    data_seed: int = 0
    device: str = "cpu"

    @classmethod
    def quick(cls) -> "HardAttentionConfig":
        """3 digits tiling an 8x24 canvas, 800 steps: every mode in about 15 s on one CPU core."""
        return cls()

    @classmethod
    def full(cls) -> "HardAttentionConfig":
        """4 digits placed at random on a 16x48 canvas, wider layers, 8,000 steps, 3 seeds, on the GPU if any."""
        return cls(n_digits=4, width=48, height=16, n_train=50_000, n_test=5_000, n_curve_eval=2_000, steps=8_000,
                   batch_size=128, lr=1e-3, channels=32, annotation_size=64, hidden_size=128, embed_size=32,
                   attention_size=64, eval_every=250, grad_estimates=64, seeds=(0, 1, 2), device=str(get_device()))



def make_data(cfg: HardAttentionConfig) -> dict[str, DigitCanvases]:
    """Train and test canvases from disjoint pools of digit images (``{"train": ..., "test": ...}``), seeded."""
    train_pool, test_pool = split_digit_images(test_fraction=0.3, seed=cfg.data_seed)
    kwargs = dict(n_digits=cfg.n_digits, width=cfg.width, height=cfg.height)
    return {"train": make_canvases(train_pool, cfg.n_train, seed=cfg.data_seed + 1, **kwargs),
            "test": make_canvases(test_pool, cfg.n_test, seed=cfg.data_seed + 2, **kwargs)}


def build_model(cfg: HardAttentionConfig, mode: str, seed: int = 0) -> DigitCaptioner:
    """A freshly initialized :class:`DigitCaptioner` (seeded: the same seed gives the same weights in every mode)."""
    torch.manual_seed(seed)
    return DigitCaptioner(mode, 10, cfg.channels, cfg.annotation_size, cfg.hidden_size, cfg.embed_size,
                          cfg.attention_size, cfg.tau).to(cfg.device)


@torch.no_grad()
def evaluate(model: DigitCaptioner, canvases: DigitCanvases, batch_size: int = 1000) -> dict[str, float]:
    """Greedy decoding with deterministic attention (arg max location for hard and gumbel).

    Returns ``token_acc`` (share of correct digits), ``seq_acc`` (share of canvases whose whole caption is right)
    and ``loc_acc`` (share of tokens whose most-attended grid cell lies inside the 8x8 box of the digit that the
    token should name: did the decoder look at the right digit?).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct, located = [], []
    for start in range(0, len(canvases), batch_size):
        images = canvases.images[start:start + batch_size].to(device)
        target = canvases.captions[start:start + batch_size].to(device)
        out = model(images, max_len=target.shape[1])
        correct.append((out.tokens == target).cpu())
        gh, gw = model.grid_shape
        cell = out.alpha.argmax(-1).cpu()                                       # (B, T)
        fy, fx = images.shape[-2] // gh, images.shape[-1] // gw                 # pixels per grid cell
        top, left = (cell // gw) * fy, (cell % gw) * fx
        rows, cols = canvases.offsets[start:start + batch_size, :, 0], canvases.offsets[start:start + batch_size, :, 1]
        located.append((top >= rows) & (top + fy <= rows + DIGIT_SIZE) & (left >= cols) & (left + fx <= cols + DIGIT_SIZE))
    model.train(was_training)
    correct, located = torch.cat(correct), torch.cat(located)
    return {"token_acc": correct.float().mean().item(), "seq_acc": correct.all(1).float().mean().item(),
            "loc_acc": located.float().mean().item()}


def train_captioner(cfg: HardAttentionConfig, mode: str, data: dict[str, DigitCanvases], seed: int = 0,
                    show_progress: bool = True) -> dict:
    """Train one captioner with Adam; return its model, learning curve, test metrics and wall time.

    Returns:
        dict with ``model`` (trained, eval mode), ``curve`` (DataFrame: ``step``, ``train_nll`` (mean over the
        last ``eval_every`` steps), ``test_token_acc`` on the first ``n_curve_eval`` test canvases, ``wall_s``),
        ``token_acc``, ``seq_acc``, ``loc_acc`` (all test canvases, :func:`evaluate`), ``wall_s`` (training only),
        ``ms_per_step``, ``mode``, ``seed``.
    """
    model = build_model(cfg, mode, seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator(device=cfg.device).manual_seed(seed)
    batch_gen = torch.Generator().manual_seed(seed)
    baseline = MovingAverageBaseline(cfg.baseline_momentum) if mode == "hard" else None
    train, curve_set = data["train"], _head(data["test"], cfg.n_curve_eval)
    images, captions = train.images.to(cfg.device), train.captions.to(cfg.device)
    rows, nll_window, train_time = [], [], 0.0
    steps = range(1, cfg.steps + 1)
    for step in progress(steps, desc=f"{mode} attention") if show_progress else steps:
        start = time.perf_counter()
        idx = torch.randint(len(train), (cfg.batch_size,), generator=batch_gen).to(cfg.device)
        out = model(images[idx], captions[idx], generator=gen)
        loss, stats = captioning_loss(out, captions[idx], mode, baseline=baseline,
                                      entropy_weight=cfg.entropy_weight if mode == "hard" else 0.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cfg.device.startswith("cuda"):
            torch.cuda.synchronize()
        train_time += time.perf_counter() - start
        nll_window.append(stats["nll"])
        if step % cfg.eval_every == 0 or step == cfg.steps:
            rows.append({"step": step, "train_nll": float(np.mean(nll_window)),
                         "test_token_acc": evaluate(model, curve_set)["token_acc"], "wall_s": train_time})
            nll_window = []
    model.eval()
    metrics = evaluate(model, data["test"])
    return {"model": model, "curve": pd.DataFrame(rows), "mode": mode, "seed": seed, "wall_s": train_time,
            "ms_per_step": 1000 * train_time / cfg.steps, **metrics}


def _head(canvases: DigitCanvases, n: int) -> DigitCanvases:
    return DigitCanvases(canvases.images[:n], canvases.captions[:n], canvases.offsets[:n])


#: The estimators compared in :func:`gradient_variance`: (label, mode, use a baseline).
ESTIMATORS = (("soft (exact)", "soft", False), ("REINFORCE", "hard", False),
              ("REINFORCE + baseline", "hard", True), ("Gumbel straight-through", "gumbel", False))


def gradient_estimates(cfg: HardAttentionConfig, state_dict: dict, mode: str, data: dict[str, DigitCanvases], *,
                       use_baseline: bool = False, fresh_batches: bool = True, seed: int = 0) -> torch.Tensor:
    """``cfg.grad_estimates`` gradient estimates of the attention scorer's parameters at one checkpoint.

    The decoder's ``attention`` parameters (``W_q``, ``W_k``, ``w_v``) are the group whose gradient each mode
    estimates differently: exactly by back-propagation (soft), by REINFORCE (hard; no gradient reaches them through
    the one-hot choice), or straight-through (gumbel). Each estimate is the gradient of :func:`captioning_loss`
    (entropy bonus off) on a minibatch of ``cfg.batch_size`` training canvases: a fresh minibatch each time
    (``fresh_batches=True``: data noise + sampling noise), or the same one (sampling noise only). With
    ``use_baseline``, the baseline is the per-step mean reward to go over 8 other minibatches, held fixed.

    Returns:
        float64 ``(cfg.grad_estimates, n_params)``, one flattened gradient per row.
    """
    model = build_model(cfg, mode, 0)
    model.load_state_dict(state_dict)
    model.train()
    params = list(model.decoder.attention.parameters())
    gen = torch.Generator(device=cfg.device).manual_seed(seed)
    batch_gen = torch.Generator().manual_seed(seed + 1)
    train = data["train"]

    def batch():
        idx = torch.randint(len(train), (cfg.batch_size,), generator=batch_gen)
        return train.images[idx].to(cfg.device), train.captions[idx].to(cfg.device)

    baseline = None
    if use_baseline:
        baseline = MovingAverageBaseline(momentum=0.0)
        with torch.no_grad():
            rewards = []
            for _ in range(8):
                x, y = batch()
                out = model(x, y, generator=gen)
                nll = torch.nn.functional.cross_entropy(out.logits.transpose(1, 2), y, reduction="none")
                rewards.append((-nll).flip(1).cumsum(1).flip(1))
            baseline.update(torch.cat(rewards))
    fixed = batch()
    grads = []
    for _ in range(cfg.grad_estimates):
        x, y = batch() if fresh_batches else fixed
        out = model(x, y, generator=gen)
        loss, _ = captioning_loss(out, y, mode, baseline=baseline, entropy_weight=0.0, update_baseline=False)
        grad = torch.autograd.grad(loss, params)
        grads.append(torch.cat([g.reshape(-1) for g in grad]).double().cpu())
    return torch.stack(grads)


def gradient_variance(cfg: HardAttentionConfig, state_dict: dict, data: dict[str, DigitCanvases],
                      checkpoint: str = "checkpoint", seed: int = 0, show_progress: bool = True) -> pd.DataFrame:
    """Variance and signal of each estimator's gradient of the attention scorer at one checkpoint (:data:`ESTIMATORS`).

    From ``K = cfg.grad_estimates`` estimates ``g_1..g_K`` (:func:`gradient_estimates`) it reports

    - ``total_variance``: the trace of their sample covariance, ``sum_j Var(g_j)``;
    - ``signal``: ``||mean g||^2 - total_variance / K``, an unbiased estimate of ``||E g||^2`` (the plain
      ``||mean g||^2`` is inflated by the noise of the mean; a negative value means that K estimates cannot tell the
      expected gradient from zero);
    - ``snr``: ``max(signal, 0) / total_variance``, the signal-to-noise ratio of a single estimate (inf when the
      variance is 0);
    - ``ms_per_estimate``,

    with fresh minibatches (``batches = "fresh"``: data noise + sampling noise) and with one fixed minibatch
    (``"fixed"``: sampling noise only; soft attention's gradient is then the same every time, variance 0).

    Returns:
        DataFrame with one row per estimator and batch setting.
    """
    rows = []
    settings = [(label, mode, use_baseline, fresh) for label, mode, use_baseline in ESTIMATORS
                for fresh in (True, False)]
    if show_progress:
        settings = progress(settings, desc=f"gradients at {checkpoint}")
    for label, mode, use_baseline, fresh in settings:
        start = time.perf_counter()
        g = gradient_estimates(cfg, state_dict, mode, data, use_baseline=use_baseline, fresh_batches=fresh, seed=seed)
        elapsed = time.perf_counter() - start
        total_var = g.var(dim=0, unbiased=True).sum().item()
        signal = g.mean(0).pow(2).sum().item() - total_var / g.shape[0]
        snr = max(signal, 0.0) / total_var if total_var > 0 else float("inf")
        rows.append({"checkpoint": checkpoint, "seed": seed, "estimator": label,
                     "batches": "fresh" if fresh else "fixed", "total_variance": total_var, "signal": signal,
                     "snr": snr, "ms_per_estimate": 1000 * elapsed / cfg.grad_estimates})
    return pd.DataFrame(rows)


#: The results store of the command line (:mod:`attnbook.store`): a run is one mode with one seed; its learning
#: curve goes into ``<name>_curves.csv``, and the soft run of a seed also stores the gradient variance at the initial
#: and at its trained checkpoint (both soft models, hence ``mode`` "soft") in ``<name>_gradvar.csv``. The device does
#: not count as configuration, and ``seeds`` only chooses runs.
LAYOUT = Layout(
    "hard_attention", keys=("mode", "seed"),
    columns=("mode", "seed", "token_acc", "seq_acc", "loc_acc", "wall_s", "ms_per_step"),
    tables={"curves": ("step", "train_nll", "test_token_acc", "wall_s", "mode", "seed"),
            "gradvar": ("checkpoint", "seed", "estimator", "batches", "total_variance", "signal", "snr",
                        "ms_per_estimate", "mode")},
    not_configuration=("device", "seeds"))


def run_grid(cfg: HardAttentionConfig, show_progress: bool = True, *, store: ResultsStore | None = None,
             on_run=None) -> dict[str, pd.DataFrame]:
    """Every mode x seed of ``cfg``: ``summary`` (one row each), ``curves`` and ``gradvar`` (at the initial and at the
    trained soft checkpoint of each seed, computed in that seed's soft run; ``mode`` is "soft") DataFrames.

    With ``store`` (an open :class:`attnbook.store.ResultsStore` with :data:`LAYOUT`, as the command line passes),
    runs already stored are skipped, each finished run is stored at once with its rows of curves and gradvar, then
    ``on_run()`` is called; the tables returned are then the stored ones, earlier runs included. The data are made
    only if a run is left to do."""
    data = None
    summary, curves, gradvar = [], [], []
    for seed in cfg.seeds:
        for mode in MODES:
            if store is not None and store.has({"mode": mode, "seed": seed}):
                continue
            data = make_data(cfg) if data is None else data
            run_gradvar = []
            if mode == "soft":
                run_gradvar.append(gradient_variance(cfg, build_model(cfg, "soft", seed).state_dict(), data,
                                                     "initial", seed, show_progress))
            result = train_captioner(cfg, mode, data, seed, show_progress)
            row = {k: result[k] for k in ("mode", "seed", "token_acc", "seq_acc", "loc_acc", "wall_s", "ms_per_step")}
            curve = result["curve"].assign(mode=mode, seed=seed)
            if mode == "soft":
                run_gradvar.append(gradient_variance(cfg, result["model"].state_dict(), data, "trained soft", seed,
                                                     show_progress))
            run_gradvar = [g.assign(mode=mode) for g in run_gradvar]
            if store is not None:
                store.append(row, {"curves": curve, "gradvar": pd.concat(run_gradvar) if run_gradvar else []})
                if on_run is not None:
                    on_run()
            summary.append(row)
            curves.append(curve)
            gradvar.extend(run_gradvar)
    if store is not None:
        return {"summary": store.frame(), "curves": store.frame("curves"), "gradvar": store.frame("gradvar")}
    return {"summary": pd.DataFrame(summary), "curves": pd.concat(curves, ignore_index=True),
            "gradvar": pd.concat(gradvar, ignore_index=True)}


#: The decoders as chapter 7's prose names them (by the way their gradient is made).
DECODER_NAMES = {"soft": "soft attention", "gumbel": "Gumbel", "hard": "REINFORCE"}


def stored_summary(runs: pd.DataFrame) -> str:
    """One sentence on stored runs of :func:`run_grid` (one row per mode and seed): the decoders ranked by their mean
    held-out token accuracy over the seeds, each with that mean. Chapter 7, section "Longer runs".

    Raises:
        ValueError: ``runs`` has no rows.
    """
    if runs.empty:
        raise ValueError("runs is empty: there is nothing to summarize")
    means = runs.groupby("mode").token_acc.mean()
    order = means.sort_values(ascending=False, kind="stable").index
    ranked = ", then ".join(f"{DECODER_NAMES.get(m, m)} ({means[m]:.3f})" for m in order)
    return (f"Over {plural(int(runs.seed.nunique()), 'seed')} (table above), mean held-out token accuracy ranks "
            f"the decoders {ranked}.")


def main(argv: list[str] | None = None) -> int:
    """CLI: run :func:`run_grid` into a results store (:mod:`attnbook.store`; resumable, each run stored as it
    finishes) with provenance beside it (see the module docstring). Returns 0; an interrupted run (Ctrl-C, SIGTERM)
    records its session as interrupted and exits with 130 or 143."""
    from ..provenance import provenance

    parser = argparse.ArgumentParser(prog="python -m attnbook.experiments.hard_attention",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("quick", "full"), default="full")
    parser.add_argument("--out", type=csv_path, default=Path("results/hard_attention_full.csv"))
    parser.add_argument("--device", type=device_arg, default=None, help="cpu or cuda (default: the config's)")
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help="number of seeds (0..N-1); default: the mode's")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    cfg = HardAttentionConfig.for_mode(args.mode)
    if args.device:
        cfg = replace(cfg, device=args.device)
    if args.seeds is not None:
        cfg = replace(cfg, seeds=tuple(range(args.seeds)))
    stem = args.out.with_suffix("")
    try:
        store = ResultsStore(args.out, LAYOUT, asdict(cfg)).open()
    except StoreError as err:
        parser.error(str(err))

    def describe(wall: float) -> dict:
        return provenance(wall, device=cfg.device, mode=args.mode,
                          files=[args.out.name, f"{stem.name}_curves.csv", f"{stem.name}_gradvar.csv"])

    with store, Session(store, describe) as session:
        tables = run_grid(cfg, show_progress=not args.no_progress, store=store, on_run=session.checkpoint)
    print(tables["summary"].to_string(index=False))
    return 0


# --- chapter 7's sentences, chosen by code (each tested at its edge values in tests/test_experiments_ch7.py) -------

#: What makes each decoder's gradient, as chapter 7's prose names the estimators.
ESTIMATOR_NAMES = {"soft": "the exact gradient", "gumbel": "the straight-through estimator",
                   "hard": "REINFORCE with a baseline"}


def half_sentence(half: dict[str, int | None], steps: int) -> str:
    """One or two sentences on the training step at which each decoder's held-out token accuracy first exceeds one
    half. Chapter 7, section "Digit captioning".

    Args:
        half: ``{mode: step or None}`` (None: the accuracy never exceeded one half), in the order to name them.
        steps: the number of training steps of the run (for the decoders that never exceeded one half).

    Returns:
        e.g. ``"Held-out token accuracy first exceeds one half at step 200 for soft attention. REINFORCE does not
        reach one half within 800 steps."``

    Raises:
        ValueError: ``half`` is empty.
    """
    if not half:
        raise ValueError("half is empty: there is no decoder to describe")
    reached = [f"step {step} for {DECODER_NAMES.get(m, m)}" for m, step in half.items() if step is not None]
    missed = [DECODER_NAMES.get(m, m) for m, step in half.items() if step is None]
    within = f"within {plural(int(steps), 'step')}"
    if not reached:
        return f"Held-out token accuracy does not exceed one half {within} for any decoder."
    parts = [f"Held-out token accuracy first exceeds one half at {listing(reached)}."]
    if missed:
        verb = "does" if len(missed) == 1 else "do"
        parts.append(f"{listing(missed)} {verb} not reach one half {within}.")
    return " ".join(parts)


def own_digit_sentence(shares, digits: int = 0, where: str = "On this canvas") -> str:
    """The sentence under chapter 7's heatmap: the share of each generated token's attention that lies on the grid
    columns of the digit it should name, as a percentage, one number when all shares print alike and a range
    otherwise.

    Args:
        shares: one share in [0, 1] per generated token (a sequence or a 1-d tensor).
        digits: decimals of the percentage shown.
        where: the sentence's opening phrase ("" for none).

    Raises:
        ValueError: ``shares`` is empty.
    """
    values = [float(s) for s in shares]
    if not values:
        raise ValueError("shares is empty: there is no token to describe")
    low, high = f"{min(values):.{digits}%}", f"{max(values):.{digits}%}"
    share = low if low == high else f"between {low} and {high}"
    who = "the generated token" if len(values) == 1 else "each generated token"
    opening = f"{where}, {who}" if where else who[0].upper() + who[1:]
    return f"{opening} puts {share} of its weight on the grid columns of the digit it should name."


def captions_sentence(truth: str, captions: dict[str, str]) -> str:
    """The sentence under chapter 7's attention maps: what the canvas reads and what each decoder writes, saying
    "all three" (or "both", "all N") when the decoders agree instead of repeating one caption.

    Args:
        truth: the canvas's caption, e.g. ``"4 4 6"``.
        captions: decoder name (``soft``, ``hard``, ``gumbel`` or any other) to the caption it writes, in the
            order to list them.

    Raises:
        ValueError: ``captions`` is empty.
    """
    if not captions:
        raise ValueError("captions is empty: there is no decoder to describe")
    names = {"soft": "soft", "hard": "hard", "gumbel": "Gumbel"}
    written = list(captions.values())
    if len(captions) == 1:
        mode = next(iter(captions))
        return f"The canvas reads {truth}; the {names.get(mode, mode)} decoder writes {written[0]}."
    if len(set(written)) == 1:
        who = "both" if len(written) == 2 else "all three" if len(written) == 3 else f"all {len(written)}"
        return f"The canvas reads {truth}, and {who} decoders write {written[0]}."
    parts = [f"the {names.get(m, m)} decoder {c}" for m, c in captions.items()]
    parts[0] = parts[0].replace(" decoder ", " decoder writes ", 1)
    return f"The canvas reads {truth}; {listing(parts)}."


def agreement_phrase(difference: float) -> str:
    """How closely the library agrees with an inline version, from the largest absolute difference: "exactly" at
    0, otherwise "to within 1.1e-16" (a phrase that follows "equals the inline one").

    Raises:
        ValueError: ``difference`` is negative or NaN.
    """
    difference = float(difference)
    if not difference >= 0:
        raise ValueError(f"difference must be at least 0, got {difference}")
    return "exactly" if difference == 0 else f"to within {difference:.1e}"


def compare_estimators(name_a: str, name_b: str, bias_a: float, bias_b: float, var_a: float, var_b: float) -> str:
    """Which of two gradient estimators has the smaller bias and which the smaller variance, as one clause (no full
    stop). Chapter 7, sections "The straight-through Gumbel-softmax" and "Digit captioning".

    e.g. ``"REINFORCE beats Gumbel on both bias and variance"`` or ``"REINFORCE has the smaller bias and Gumbel the
    smaller variance"``; equal values are said to be equal.
    """
    sb, sv = np.sign(bias_a - bias_b), np.sign(var_a - var_b)
    if sb == sv == 0:
        return f"{name_a} and {name_b} have the same bias and the same variance"
    if sb == sv:
        winner, loser = (name_a, name_b) if sb < 0 else (name_b, name_a)
        return f"{winner} beats {loser} on both bias and variance"
    if sb == 0:
        return f"{name_a} and {name_b} have the same bias, and {name_a if sv < 0 else name_b} the smaller variance"
    if sv == 0:
        return f"{name_a} and {name_b} have the same variance, and {name_a if sb < 0 else name_b} the smaller bias"
    low_bias, low_var = (name_a, name_b) if sb < 0 else (name_b, name_a)
    return f"{low_bias} has the smaller bias and {low_var} the smaller variance"


def order_sentence(order, toy_winner: str | None, quieter: str | None) -> str:
    """What the ranking of the decoders by held-out token accuracy says, set against the toy problem and the
    gradient noise measured on the captioner. Chapter 7, section "Digit captioning".

    Args:
        order: the modes (``"soft"``, ``"hard"``, ``"gumbel"``) from the most to the least accurate.
        toy_winner: the hard decoder (``"hard"`` or ``"gumbel"``) whose estimator beats the other's on both bias and
            variance on the toy problem at the captioner's temperature; None if neither does.
        quieter: the hard decoder whose estimator had the smaller gradient variance on the captioner at the initial
            parameters; None if not measured.

    Raises:
        ValueError: ``order`` does not contain both ``"hard"`` and ``"gumbel"``, or a mode is unknown.
    """
    order = list(order)
    if not {"hard", "gumbel"} <= set(order) or not set(order) <= set(DECODER_NAMES):
        raise ValueError(f"order must name 'hard' and 'gumbel' among {sorted(DECODER_NAMES)}, got {order}")
    for name, value in (("toy_winner", toy_winner), ("quieter", quieter)):
        if value not in (None, "hard", "gumbel"):
            raise ValueError(f"{name} must be 'hard', 'gumbel' or None, got {value!r}")
    ahead = "gumbel" if order.index("gumbel") < order.index("hard") else "hard"
    behind = "hard" if ahead == "gumbel" else "gumbel"
    parts = [f"By held-out token accuracy the decoders rank {', then '.join(DECODER_NAMES[m] for m in order)}."]
    if toy_winner is None:
        parts.append(f"The toy problem does not predict that {DECODER_NAMES[ahead]} comes before "
                     f"{DECODER_NAMES[behind]}: at the captioner's temperature neither estimator beats the other on "
                     "both bias and variance.")
    elif toy_winner == ahead:
        parts.append(f"That {DECODER_NAMES[ahead]} comes before {DECODER_NAMES[behind]} is what the toy problem "
                     "predicts, where its estimator beats the other on both bias and variance.")
    else:
        parts.append(f"The toy problem predicts the opposite order of the two: there {ESTIMATOR_NAMES[toy_winner]} "
                     "beats the other estimator on both bias and variance.")
    if quieter == ahead:
        parts.append(f"On the captioner itself, at the initial parameters, {ESTIMATOR_NAMES[ahead]} gives the less "
                     "noisy gradient, which fits the order.")
    elif quieter == behind:
        parts.append(f"On the captioner itself, at the initial parameters, {ESTIMATOR_NAMES[behind]} gives the "
                     "less noisy gradient, so gradient noise alone does not explain the order.")
    return " ".join(parts)



def paper_sentence(table: pd.DataFrame) -> str:
    """Which kind of attention leads on BLEU-4 and on METEOR in Xu et al. (2015), Table 1, data set by data set.
    Chapter 7, section "For scale: the numbers of Show, Attend and Tell".

    Args:
        table: indexed by ``(data set, attention)`` with ``attention`` in ``{"soft", "hard"}`` and columns
            ``"BLEU-4"`` and ``"METEOR"``.

    Returns:
        e.g. ``"In the paper, hard attention has the higher BLEU-4 on all three data sets, and soft attention the
        higher METEOR on Flickr30k and COCO."``
    """
    sets = list(dict.fromkeys(table.index.get_level_values(0)))

    def where(metric: str, kind: str) -> str:
        other = "soft" if kind == "hard" else "hard"
        ahead = [d for d in sets if table.loc[(d, kind), metric] > table.loc[(d, other), metric]]
        if not ahead:
            return "none of the data sets"
        if len(ahead) == len(sets) and len(sets) > 1:
            return "all three data sets" if len(sets) == 3 else f"all {len(sets)} data sets"
        return listing(ahead)

    return (f"In the paper, hard attention has the higher BLEU-4 on {where('BLEU-4', 'hard')}, and soft attention the "
            f"higher METEOR on {where('METEOR', 'soft')}.")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
