"""Why a classifier initialized with standard deviation 200 stays at chance: saturation, or steps too small?

Explained in chapter 3, "Parametric attention" (``chapters/03_parametric_attention``), section "Why initial
weights of size 200 leave a classifier at chance" (one paragraph and a results table), and in full on its evidence
page (``evidence/ch03``). The model is a one-hidden-layer tanh network on MNIST (:mod:`attnbook.data.mnist`),
``784 -> hidden -> 10``, whose weights are drawn from ``N(0, std^2)`` (or Xavier's normal initialization, Glorot and
Bengio 2010), biases 0.

Two mechanisms can stop it from learning at a large ``std``, and the *arms* of the experiment separate them:

- **saturation**: ``|tanh z| -> 1``, so ``d tanh / dz = 1 - tanh^2 z -> 0`` and the first layer gets no gradient
  (in float32, ``tanh z`` rounds to exactly 1 for ``|z| > 9``, so the gradient is exactly 0);
- **step size**: Adam moves every weight by about its learning rate per step whatever the gradient's size
  (Kingma and Ba 2015, section 2.1), so with weights of size 200 each step changes them by a fraction
  ``lr / 200`` only, 2,000 times less than at ``std = 0.1``.

An arm is ``(init, optimizer)``: Adam at every ``std`` of the sweep; SGD at the reference and the large ``std``;
and ``"adam-scaled"``, Adam at the large ``std`` with its learning rate multiplied by ``large_std / reference_std``.
That arm matches the *nominal* step: ``lr / std`` is the same as at the reference ``std``. It does not match the
steps actually taken. Adam's step is ``lr * m / (sqrt(v) + eps)``: a full ``lr`` only for a weight whose gradient
keeps its sign, and nothing for a weight whose gradient is exactly zero, as a saturated unit's is. So the gap between
the scaled arm and the reference run is what a saturated network loses at a matched learning rate, the steps that
saturation takes away from the first layer included; it is not the cost of saturation at equal realized steps
(the evidence page of chapter 3 compares the realized relative updates of both layers).

Every training step records, before the update, the share of saturated hidden units (``|tanh z| > saturation``)
and the mean largest softmax probability on the minibatch, and after it the relative update
``||W_after - W_before|| / ||W_before||`` of each layer. :func:`mechanism_verdict` turns the test accuracies into
the answer.

Use from Python (the chapter does)::

    cfg = InitScaleConfig.for_mode(get_mode())
    data = load_data(cfg)
    summary, steps = run_arms(cfg, data)
    verdict = mechanism_verdict(summary, cfg)

From the command line, into a results store (:mod:`attnbook.store`; resumable, on the CPU)::

    python -m attnbook.experiments.init_scale --mode full --workers 2 --out results/init_scale_full.csv

The store (:data:`LAYOUT`) holds one row per run (an arm and a seed, on a kind of device: ``kind_column="device"``)
with the run's summary (:data:`SUMMARY_COLUMNS`, as :func:`run_arms` gives it, plus ``device``), the side table
``<name>_steps.csv`` with every :data:`STEP_EVERY`-th step record of each run (steps 30, 60, ...: once per epoch at
these sizes, so a full run's 1,200 steps keep 40 rows; all of them would make the table some 14 MB), and its
provenance in ``<name>.json``. Chapter 3 and its evidence page (``evidence/ch03``) read it with :func:`read_runs`,
and refuse it unless the configuration is :meth:`InitScaleConfig.full`'s and every run is there
(:meth:`StoredRuns.status`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from ..data.digits import split_digit_images
from ..data.mnist import load_mnist_sample
from ..runtime import ModeConfig, describe_device
from ..store import (Layout, ResultsStore, collect_runs, config_differences, grid_parser, read_tables,
                     run_grid_cli, run_grid_in_session)

__all__ = ["InitScaleConfig", "OPTIMIZERS", "MECHANISMS", "arms", "arm_id", "learning_rate", "load_data",
           "make_classifier", "train_run", "INIT_LABELS", "init_question_table", "MECHANISM_ARMS", "arm_means",
           "plot_init_scale", "per_step_means", "plot_mechanisms", "comparison_sentence", "saturation_profile",
           "run_arms", "paired_interval", "mechanism_verdict", "effect_text", "verdict_sentences", "step_size_sentence", "SUMMARY_COLUMNS",
           "STEP_COLUMNS", "STEP_EVERY", "LAYOUT", "store_config", "open_store", "run_grid", "StoredRuns",
           "read_runs", "main"]

#: The optimizers of the arms: plain SGD, Adam, and Adam with its learning rate scaled to the weights' size.
OPTIMIZERS = ("sgd", "adam", "adam-scaled")
#: The answers of :func:`mechanism_verdict`.
MECHANISMS = ("both", "step size", "saturation", "neither")


@dataclass(frozen=True)
class InitScaleConfig(ModeConfig):
    """Initializations, model, training and arms of the experiment (quick: seconds on a 2-core CPU).

    ``stds`` are the standard deviations of the sweep (``"xavier"`` = Xavier's normal initialization), each trained
    with Adam at ``lr``; ``sgd_lr`` is SGD's learning rate; ``reference_std`` and ``large_std`` are the two
    initializations of the question (0.1 and 200); ``saturation`` is the threshold on ``|tanh z|``. ``threads``
    is the number of torch threads of each run of :func:`run_grid` (:func:`run_arms` uses the caller's).
    """

    stds: tuple = (0.1, 1.0, 10.0, 200.0, "xavier")
    hidden_size: int = 64
    seeds: int = 3
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-2
    sgd_lr: float = 0.1
    reference_std: float = 0.1
    large_std: float = 200.0
    saturation: float = 0.99
    test_fraction: float = 0.25
    split_seed: int = 0
    threads: int = 1

    @classmethod
    def quick(cls) -> "InitScaleConfig":
        """3 seeds of 10 epochs per arm (8 arms, 24 runs of 300 steps on 3,750 training images)."""
        return cls()

    @classmethod
    def full(cls) -> "InitScaleConfig":
        """10 seeds of 40 epochs per arm."""
        return cls(seeds=10, epochs=40)


def arms(cfg: InitScaleConfig) -> list[tuple[object, str]]:
    """The ``(init, optimizer)`` pairs of the experiment: Adam at every ``cfg.stds``, SGD at ``reference_std`` and
    ``large_std``, and ``"adam-scaled"`` at ``large_std`` (module docstring)."""
    out = [(std, "adam") for std in cfg.stds]
    out += [(cfg.reference_std, "sgd"), (cfg.large_std, "sgd"), (cfg.large_std, "adam-scaled")]
    return out


def arm_id(init: object, optimizer: str) -> str:
    """An arm's name, ``"<init>/<optimizer>"`` with ``init`` as :func:`train_run` records it, e.g.
    ``"200.0/adam-scaled"`` or ``"xavier/adam"`` (the command line's ``--only`` takes these)."""
    return f"{init}/{optimizer}"


def learning_rate(cfg: InitScaleConfig, init: object, optimizer: str) -> float:
    """The learning rate of an arm: ``sgd_lr`` for SGD, ``lr`` for Adam, and ``lr * init / reference_std`` for
    ``"adam-scaled"`` (so that every Adam step changes the weights by the same fraction as at ``reference_std``).

    Raises:
        ValueError: unknown ``optimizer``, or ``"adam-scaled"`` with an ``init`` that is not a positive number.
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if optimizer == "sgd":
        return cfg.sgd_lr
    if optimizer == "adam":
        return cfg.lr
    if isinstance(init, str) or not init > 0:
        raise ValueError(f"'adam-scaled' needs a positive standard deviation as init, got {init!r}")
    return cfg.lr * float(init) / cfg.reference_std


def load_data(cfg: InitScaleConfig) -> dict[str, torch.Tensor]:
    """MNIST's 5,000-image sample (:func:`attnbook.data.mnist.load_mnist_sample`), split stratified by class and
    seeded (``cfg.test_fraction``, ``cfg.split_seed``), flattened to 784 pixels and standardized with the training
    images' mean and standard deviation over all pixels.

    Returns:
        ``X_train``, ``X_test`` float32 ``(n, 784)``; ``y_train``, ``y_test`` int64 ``(n,)``.
    """
    train, test = split_digit_images(load_mnist_sample(), test_fraction=cfg.test_fraction, seed=cfg.split_seed)
    x_train, x_test = train.images.flatten(1), test.images.flatten(1)
    mean, std = x_train.mean(), x_train.std()
    return {"X_train": (x_train - mean) / std, "y_train": train.labels,
            "X_test": (x_test - mean) / std, "y_test": test.labels}


def make_classifier(init: object, seed: int, n_inputs: int = 784, hidden_size: int = 64, n_classes: int = 10
                    ) -> nn.Sequential:
    """``Linear(n_inputs, hidden_size) -> Tanh -> Linear(hidden_size, n_classes)``, weights drawn from
    ``N(0, init^2)`` (``init`` a positive number) or with ``nn.init.xavier_normal_`` (``init = "xavier"``), biases 0,
    with torch's global seed set to ``seed``.

    Raises:
        ValueError: ``init`` is neither ``"xavier"`` nor a positive number.
    """
    if init != "xavier" and (isinstance(init, str) or not init > 0):
        raise ValueError(f"init must be 'xavier' or a positive standard deviation, got {init!r}")
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(n_inputs, hidden_size), nn.Tanh(), nn.Linear(hidden_size, n_classes))
    for layer in (model[0], model[2]):
        if init == "xavier":
            nn.init.xavier_normal_(layer.weight)
        else:
            nn.init.normal_(layer.weight, 0.0, float(init))
        nn.init.zeros_(layer.bias)
    return model


def _forward(model: nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    z = model[0](x)
    h = torch.tanh(z)
    return z, h, model[2](h)


def train_run(cfg: InitScaleConfig, data: dict, init: object, optimizer: str, seed: int,
              keep: dict | None = None) -> tuple[dict, pd.DataFrame]:
    """Train one arm with one seed (a seed fixes the initialization and the minibatch order) and measure it.

    Returns:
        ``(summary, steps)``. ``summary``: ``init`` (str), ``optimizer``, ``lr``, ``seed``; at initialization on
        the training set, ``loss at init``, ``pre-activation std``, ``saturated tanh`` (share of ``|tanh z| >
        cfg.saturation``), ``max softmax prob`` and ``grad/weight (layer 1)``, ``grad/weight (layer 2)`` (gradient
        norm over weight norm); over training, the median ``relative update (layer 1)`` and ``(layer 2)``; after
        training, ``saturated tanh (end)`` and ``test accuracy``. ``steps``: one row per training step with
        ``step``, ``loss``, ``saturated``, ``max_prob`` (on the minibatch, before the update) and
        ``rel_update_1``, ``rel_update_2`` (``||W_after - W_before|| / ||W_before||``). If ``keep`` is a dict,
        the trained model is put in it as ``keep["model"]`` (for :func:`saturation_profile`); results are the same.

    Raises:
        ValueError: see :func:`learning_rate` and :func:`make_classifier`.
    """
    lr = learning_rate(cfg, init, optimizer)
    model = make_classifier(init, seed, data["X_train"].shape[1], cfg.hidden_size)
    x_train, y_train = data["X_train"], data["y_train"]
    z, h, logits = _forward(model, x_train)
    loss0 = F.cross_entropy(logits, y_train)
    loss0.backward()
    w1, w2 = model[0].weight, model[2].weight
    summary = {"init": str(init), "optimizer": optimizer, "lr": lr, "seed": seed, "loss at init": loss0.item(),
               "pre-activation std": z.std().item(),
               "saturated tanh": (h.abs() > cfg.saturation).float().mean().item(),
               "max softmax prob": torch.softmax(logits, -1).max(-1).values.mean().item(),
               "grad/weight (layer 1)": (w1.grad.norm() / w1.norm()).item(),
               "grad/weight (layer 2)": (w2.grad.norm() / w2.norm()).item()}
    model.zero_grad(set_to_none=True)
    opt = torch.optim.SGD(model.parameters(), lr=lr) if optimizer == "sgd" else \
        torch.optim.Adam(model.parameters(), lr=lr)
    shuffle = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(cfg.epochs):
        for batch in torch.randperm(len(x_train), generator=shuffle).split(cfg.batch_size):
            _, h, logits = _forward(model, x_train[batch])
            loss = F.cross_entropy(logits, y_train[batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            before = (w1.detach().clone(), w2.detach().clone())
            opt.step()
            with torch.no_grad():
                rows.append((len(rows) + 1, loss.item(), (h.abs() > cfg.saturation).float().mean().item(),
                             torch.softmax(logits, -1).max(-1).values.mean().item(),
                             ((w1 - before[0]).norm() / before[0].norm()).item(),
                             ((w2 - before[1]).norm() / before[1].norm()).item()))
    steps = pd.DataFrame(rows, columns=["step", "loss", "saturated", "max_prob", "rel_update_1", "rel_update_2"])
    with torch.no_grad():
        _, h, _ = _forward(model, x_train)
        _, _, test_logits = _forward(model, data["X_test"])
    summary.update({"relative update (layer 1)": float(steps.rel_update_1.median()),
                    "relative update (layer 2)": float(steps.rel_update_2.median()),
                    "saturated tanh (end)": (h.abs() > cfg.saturation).float().mean().item(),
                    "test accuracy": (test_logits.argmax(-1) == data["y_test"]).float().mean().item()})
    if keep is not None:
        keep["model"] = model
    return summary, steps


def saturation_profile(model: nn.Sequential, x: torch.Tensor, saturation: float = 0.99) -> dict[str, float]:
    """How saturated the hidden layer of :func:`make_classifier`'s ``model`` is on the images ``x`` (float32
    ``(n, n_inputs)``), over all (image, unit) pairs. Evidence for chapter 3, section "Inside the trained
    networks": "saturated" is a threshold, not a switch.

    Returns:
        ``saturated``: share with ``|tanh z| > saturation``; ``flat``: share whose derivative ``1 - tanh^2 z`` is
        exactly 0 in the model's dtype (``tanh z`` rounds to +-1, so no gradient passes at all); ``median |z|
        saturated``: the median ``|z|`` of the saturated pairs (NaN if there are none).

    Raises:
        ValueError: ``saturation`` is not in (0, 1).
    """
    if not 0 < saturation < 1:
        raise ValueError(f"saturation must be in (0, 1), got {saturation}")
    with torch.no_grad():
        z, h, _ = _forward(model, x)
        saturated = h.abs() > saturation
        flat = (1 - h * h) == 0
        median = z.abs()[saturated].median().item() if saturated.any() else float("nan")
    return {"saturated": saturated.float().mean().item(), "flat": flat.float().mean().item(),
            "median |z| saturated": median}


def run_arms(cfg: InitScaleConfig, data: dict, seeds: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every arm of :func:`arms` with seeds ``0 .. cfg.seeds - 1`` (or ``seeds``), one after the other.

    Returns:
        ``(summary, steps)``: one row per run (:func:`train_run`'s summary), and every run's steps with ``init``,
        ``optimizer`` and ``seed`` added.
    """
    summaries, all_steps = [], []
    for init, optimizer in arms(cfg):
        for seed in range(cfg.seeds if seeds is None else seeds):
            summary, steps = train_run(cfg, data, init, optimizer, seed)
            summaries.append(summary)
            all_steps.append(steps.assign(init=str(init), optimizer=optimizer, seed=seed))
    return pd.DataFrame(summaries), pd.concat(all_steps, ignore_index=True)


def paired_interval(differences, confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of per-seed ``differences`` and its Student-t confidence interval ``(mean, low, high)``.

    With one difference the interval is ``(nan, nan)``; with differences that are all equal it is the point itself.

    Raises:
        ValueError: ``differences`` is empty or holds NaN, or ``confidence`` is not in (0, 1).
    """
    d = np.asarray(differences, dtype=float).ravel()
    if d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"differences must be a non-empty array of finite numbers, got {d.tolist()[:10]}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    mean = float(d.mean())
    if d.size == 1:
        return mean, float("nan"), float("nan")
    sem = float(d.std(ddof=1)) / np.sqrt(d.size)
    if sem == 0:
        return mean, mean, mean
    low, high = stats.t.interval(confidence, d.size - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def mechanism_verdict(summary: pd.DataFrame, cfg: InitScaleConfig, confidence: float = 0.95) -> dict:
    """Which mechanism the test accuracies support, from paired seeds (module docstring).

    Three per-seed differences of test accuracy, each with :func:`paired_interval`:

    - ``step``: Adam with scaled learning rate minus Adam, both at ``large_std`` (what larger steps recover);
    - ``saturation``: Adam at ``reference_std`` minus Adam scaled at ``large_std`` (what remains at a matched
      learning rate ``lr / std``; the realized steps still differ, module docstring);
    - ``sgd``: SGD at ``reference_std`` minus SGD at ``large_std``.

    A mechanism counts when :func:`attnbook.evidence.verdict` (the book's one rule) says "higher": at least
    :data:`attnbook.evidence.MIN_PAIRS` paired seeds and an interval above zero. Returns a dict with ``mechanism``
    (one of :data:`MECHANISMS`), ``n_seeds``, and for each difference ``{name}_mean``, ``{name}_low``,
    ``{name}_high``, plus
    the mean accuracy of the arms used (``acc_adam_large``, ``acc_scaled_large``, ``acc_adam_reference``,
    ``acc_sgd_large``, ``acc_sgd_reference``).

    Raises:
        ValueError: an arm is missing from ``summary``, or the arms do not share their seeds (the message names
            them).
    """
    def acc(init, optimizer) -> pd.Series:
        part = summary[(summary["init"] == str(init)) & (summary["optimizer"] == optimizer)]
        if part.empty:
            raise ValueError(f"summary has no runs of the arm init={init!r}, optimizer={optimizer!r}")
        return part.set_index("seed")["test accuracy"].sort_index()

    series = {"adam_large": acc(cfg.large_std, "adam"), "scaled_large": acc(cfg.large_std, "adam-scaled"),
              "adam_reference": acc(cfg.reference_std, "adam"), "sgd_large": acc(cfg.large_std, "sgd"),
              "sgd_reference": acc(cfg.reference_std, "sgd")}
    seeds = list(series["adam_large"].index)
    unpaired = [name for name, s in series.items() if list(s.index) != seeds]
    if unpaired:
        raise ValueError(f"the arms {unpaired} do not have the seeds {seeds} of the others")
    out: dict = {"n_seeds": len(seeds)}
    out.update({f"acc_{name}": float(s.mean()) for name, s in series.items()})
    for name, (a, b) in {"step": ("scaled_large", "adam_large"), "saturation": ("adam_reference", "scaled_large"),
                         "sgd": ("sgd_reference", "sgd_large")}.items():
        mean, low, high = paired_interval(series[a] - series[b], confidence)
        out.update({f"{name}_mean": mean, f"{name}_low": low, f"{name}_high": high})
    from ..evidence import verdict   # the book's one rule: MIN_PAIRS paired runs, then the interval decides

    step, saturation = (verdict(len(seeds), out[f"{name}_low"], out[f"{name}_high"]) == "higher"
                        for name in ("step", "saturation"))
    out["mechanism"] = ("both" if step and saturation else "step size" if step else "saturation" if saturation
                        else "neither")
    return out


#: The reader's words for the initializations of the sweep (chapter 3's results table).
INIT_LABELS = {"0.1": "N(0, 0.1²)", "1.0": "N(0, 1²)", "10.0": "N(0, 10²)", "200.0": "N(0, 200²)",
               "xavier": "Xavier (normal)"}


def init_question_table(runs: pd.DataFrame, order: tuple = ("0.1", "200.0", "xavier")) -> pd.DataFrame:
    """Chapter 3's results table for the question "why does a scale of 200 stay at chance?" (section "Why initial
    weights of size 200 leave a classifier at chance"): one row per initialization in ``order``, with the mean test
    accuracy over its runs, the 95% interval of that mean and the number of runs
    (:func:`attnbook.evidence.summary_table`, three decimals). Columns: ``initialization, mean test accuracy,
    95% interval, runs``; the interval is ``"–"`` for a single run.

    Args:
        runs: one row per run with ``init`` (text, as :func:`read_runs` gives it), ``optimizer`` and ``test
            accuracy``; every run must use one optimizer, so that the rows differ only in their initialization.
        order: the initializations to show, as text.

    Raises:
        ValueError: ``runs`` mixes optimizers, or lacks a column or an initialization of ``order``.
    """
    from ..evidence import summary_table

    if "optimizer" not in runs.columns:
        raise ValueError("runs lacks the column 'optimizer'")
    optimizers = sorted(runs["optimizer"].unique())
    if len(optimizers) != 1:
        raise ValueError(f"runs must use one optimizer, got {optimizers}")
    runs = runs.astype({"init": str})
    table = summary_table(runs, "init", "test accuracy", digits=3, order=list(order), labels=INIT_LABELS)
    return table.rename(columns={"condition": "initialization", "mean": "mean test accuracy"})


def _signed(x: float) -> str:
    """``x`` with three decimals and its sign; a value that rounds to zero reads ``0.000``, not ``-0.000``."""
    text = f"{x:+.3f}"
    return "0.000" if text in ("+0.000", "-0.000") else text


def effect_text(mean: float, low: float, high: float) -> str:
    """One paired effect and its 95% interval, as prose gives it: ``"+0.226 (95% CI +0.195 to +0.258)"``.

    An interval of NaN (one seed, :func:`paired_interval`) reads ``"(one seed: no interval)"``; equal bounds (every
    seed gave the same difference) read ``"on every seed"``; bounds that print the same read ``"(both 95% bounds
    round to +0.226)"``."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return f"{_signed(mean)} (one seed: no interval)"
    if low == high:
        return f"{_signed(mean)} on every seed"
    if _signed(low) == _signed(high):  # "95% CI 0.000 to 0.000" would read as a slip
        return f"{_signed(mean)} (both 95% bounds round to {_signed(low)})"
    return f"{_signed(mean)} (95% CI {_signed(low)} to {_signed(high)})"


def verdict_sentences(v: dict) -> dict[str, str]:
    """The sentences the evidence page of chapter 3 shows for a :func:`mechanism_verdict` ``v`` (section
    "Saturation, or steps too small?").

    Returns ``"verdict"``: three short sentences, each with at most one effect and its interval (what scaling Adam's
    steps changed; what separates the scaled run from the run at the reference scale; what that means), and
    ``"verdict_short"``: one clause for the chapter's summary. The words are chosen by ``v["mechanism"]``; with one
    seed there is no interval, and the sentences say so."""
    n = v["n_seeds"]
    before, after = f"{v['acc_adam_large']:.3f}", f"{v['acc_scaled_large']:.3f}"
    moved = (f"changed the test accuracy at standard deviation 200 from {before} to {after}" if before != after
             else f"left the mean test accuracy at standard deviation 200 at {before}")
    step = (f"Scaling Adam's learning rate to the weights {moved}: a paired difference of "
            f"{effect_text(v['step_mean'], v['step_low'], v['step_high'])}.")
    gap = (f"The run at 0.1 reached {v['acc_adam_reference']:.3f}, a paired difference from the scaled run of "
           f"{effect_text(v['saturation_mean'], v['saturation_low'], v['saturation_high'])}.")
    from ..evidence import MIN_PAIRS

    if n == 1:
        meaning = "With one seed there is no interval, so the two mechanisms cannot be told apart."
    elif n < MIN_PAIRS:
        meaning = (f"With {n} seeds the question is not yet answered: a verdict needs at least {MIN_PAIRS} paired "
                   "runs.")
    else:
        meaning = {
            "both": "Both intervals lie above zero: larger steps recover part of the accuracy, and at a matched "
                    "learning rate the saturated network still falls short.",
            "step size": "Only the first interval lies above zero: under Adam the failure is the step size, not "
                         "the saturation.",
            "saturation": "Only the second interval lies above zero: the failure is the saturation, not the step "
                          "size.",
            "neither": "Neither interval lies above zero, so these seeds do not tell the two mechanisms apart.",
        }[v["mechanism"]]
    short = {
        "both": "both mechanisms act: Adam's steps are too small for weights of size 200, and with its learning "
                "rate scaled to the weights the saturated network still falls short",
        "step size": "under Adam the step size, too small for weights of size 200, is the mechanism; with its "
                     "learning rate scaled to the weights the saturated network learns as well as at 0.1",
        "saturation": "saturation is the mechanism; scaling Adam's steps to the weights did not help",
        "neither": f"{'one seed does' if n == 1 else f'{n} seeds do'} not separate the two mechanisms",
    }[v["mechanism"]]
    return {"verdict": f"{step} {gap} {meaning}", "verdict_short": short}


def step_size_sentence(v: dict) -> str:
    """Chapter 3's sentence on the step size (section "Why initial weights of size 200 leave a classifier at
    chance"), for a :func:`mechanism_verdict` ``v``: what scaling Adam's learning rate to the weights did at standard
    deviation 200, with one effect and its 95% interval, in words chosen by ``v["mechanism"]`` (the book's one rule,
    :func:`attnbook.evidence.verdict`). No test names and no run tallies: those stay on the evidence page.

    Raises:
        ValueError: ``v["mechanism"]`` is not one of :data:`MECHANISMS`, or it says that larger steps helped while
            the interval of the step effect does not lie above zero (the words would contradict the data).
    """
    mechanism = v["mechanism"]
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    mean, low, high = v["step_mean"], v["step_low"], v["step_high"]
    if mechanism in ("both", "step size") and not (np.isfinite(low) and low > 0):
        raise ValueError(f"mechanism {mechanism!r} needs a step interval above zero, got {low} to {high}")
    if not (np.isfinite(low) and np.isfinite(high)):
        effect = f"{_signed(mean)} (a single run: no interval)"
    elif _signed(low) == _signed(high):
        effect = f"{_signed(mean)} (both 95% bounds round to {_signed(low)})"
    else:
        effect = f"{_signed(mean)} (95% interval {_signed(low)} to {_signed(high)})"
    change = f"Scaling Adam's learning rate to the weights changes the accuracy at 200 by {effect}"
    return {
        "both": f"Saturation is not the whole story. {change}: larger steps recover part of the loss, but the "
                "network still falls short of the run at 0.1.",
        "step size": f"Saturation is not the story under Adam. {change}, and the runs show no remaining gap to "
                     "the run at 0.1: the steps were too small for the weights.",
        "saturation": f"{change}: larger steps do not recover the loss, so saturation is what stops it.",
        "neither": f"{change}, and the runs do not yet tell saturation from steps too small for the weights.",
    }[mechanism]


# ------------------------------------------------------------------------------------------------- evidence page
#: The arms that :func:`plot_mechanisms` draws: ``(init, optimizer, label, colour, line style)``.
MECHANISM_ARMS = (("0.1", "adam", "0.1, Adam", "C0", "-"), ("0.1", "sgd", "0.1, SGD", "C0", ":"),
                  ("200.0", "adam", "200, Adam", "C3", "-"), ("200.0", "sgd", "200, SGD", "C3", ":"),
                  ("200.0", "adam-scaled", "200, Adam, scaled lr", "C2", "--"))


def arm_means(runs: pd.DataFrame) -> pd.DataFrame:
    """The mean over seeds of every numeric column of ``runs`` (one row per run), one row per arm, indexed by
    ``(init, optimizer)`` in the order the arms first occur (evidence page of chapter 3)."""
    return (runs.drop(columns=["seed", "device"], errors="ignore").astype({"init": str})
            .groupby(["init", "optimizer"], sort=False).mean(numeric_only=True))


def plot_init_scale(init_table: pd.DataFrame):
    """Two bar charts over the initializations of ``init_table`` (:func:`arm_means` of the Adam arms, indexed by
    ``init``): the test accuracy (dotted line: chance, 0.1) and the first layer's gradient norm over its weight norm
    at initialization (log scale). Returns the figure."""
    import matplotlib.pyplot as plt

    labels = [INIT_LABELS.get(str(s), str(s)) for s in init_table.index]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    axes[0].bar(labels, init_table["test accuracy"], color="C0")
    axes[0].axhline(0.1, color="0.3", ls=":", lw=1)
    axes[0].set(ylabel="test accuracy", ylim=(0, 1))
    axes[1].bar(labels, init_table["grad/weight (layer 1)"], color="C1")
    axes[1].set(ylabel="‖∇W₁‖ / ‖W₁‖ at init", yscale="log")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    return fig


def per_step_means(steps: pd.DataFrame) -> pd.DataFrame:
    """The step records of ``steps`` (:func:`read_runs`' side table) averaged over seeds, indexed by ``(init,
    optimizer, step)``: ``saturated``, ``rel_update_1``, ``rel_update_2``."""
    return steps.astype({"init": str}).groupby(["init", "optimizer", "step"])[
        ["saturated", "rel_update_1", "rel_update_2"]].mean()


def plot_mechanisms(per_step: pd.DataFrame):
    """Three panels against the training step for the arms of :data:`MECHANISM_ARMS` (:func:`per_step_means`): the
    saturated share on the minibatch, and the relative update of the first and the last layer (log scale; steps
    that did not move a layer are left out). Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for init, optimizer, label, color, style in MECHANISM_ARMS:
        curve = per_step.loc[(init, optimizer)]
        axes[0].plot(curve.index, curve.saturated, style, color=color, label=label)
        for ax, column in zip(axes[1:], ("rel_update_1", "rel_update_2")):
            ax.plot(curve.index, curve[column].where(curve[column] > 0), style, color=color, label=label)
    axes[0].set(xlabel="training step", ylabel="saturated share", ylim=(0, 1.02))
    axes[1].set(xlabel="training step", ylabel="‖ΔW₁‖ / ‖W₁‖", yscale="log")
    axes[2].set(xlabel="training step", ylabel="‖ΔW₂‖ / ‖W₂‖", yscale="log")
    axes[2].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    return fig


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def comparison_sentence(pairs: dict[str, tuple[float, float]], digits: int = 3,
                        reference: str = "the means of the full-scale runs", lead: str | None = None) -> str:
    """How single values compare with reference means, in one sentence whose words follow the numbers.

    Args:
        pairs: a label (e.g. ``"the accuracy at 0.1 with Adam"``) -> ``(value, reference mean)``, finite floats.
        digits: the precision at which the two are compared (as the table prints them): values that print the same
            are "equal".
        reference: what the means are, in words.
        lead: the sentence's opening words before the directions; default ``"Against <reference>, this build's
            single runs come out"``.

    Returns e.g. ``"Against the means of the full-scale runs, this build's single runs come out higher for A,
    lower for B and C, and equal to 3 decimals for D."``; each direction appears only if some pair takes it.

    Raises:
        ValueError: ``pairs`` is empty or holds a value that is not finite.
    """
    if not pairs:
        raise ValueError("pairs must name at least one value")
    groups: dict[str, list[str]] = {"higher": [], "lower": [], f"equal to {digits} decimals": []}
    for label, (value, mean) in pairs.items():
        if not (np.isfinite(value) and np.isfinite(mean)):
            raise ValueError(f"pairs[{label!r}] must be two finite numbers, got {(value, mean)}")
        a, b = round(float(value), digits), round(float(mean), digits)
        groups["higher" if a > b else "lower" if a < b else f"equal to {digits} decimals"].append(label)
    parts = [f"{word} for {_join(labels)}" for word, labels in groups.items() if labels]
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]
    if lead is None:
        lead = f"Against {reference}, this build's single runs come out"
    return f"{lead} {joined}."


# ------------------------------------------------------------------------------------------------- the results store
#: A run's summary (:func:`train_run`), column by column: what :func:`run_arms` gives per run.
SUMMARY_COLUMNS = ("init", "optimizer", "lr", "seed", "loss at init", "pre-activation std", "saturated tanh",
                   "max softmax prob", "grad/weight (layer 1)", "grad/weight (layer 2)", "relative update (layer 1)",
                   "relative update (layer 2)", "saturated tanh (end)", "test accuracy")
#: A step record (:func:`train_run`), column by column.
STEP_COLUMNS = ("step", "loss", "saturated", "max_prob", "rel_update_1", "rel_update_2")
#: The stored side table keeps the records of steps ``STEP_EVERY``, ``2 * STEP_EVERY``, ... of each run.
STEP_EVERY = 30
_KEYS = ("init", "optimizer", "seed")

#: The results store of this experiment (:mod:`attnbook.store`): a run is an arm (``init``, ``optimizer``) with a
#: ``seed``, on a kind of device; ``threads`` does not change results and ``seeds`` only chooses runs.
LAYOUT = Layout("init_scale", keys=_KEYS, columns=(*SUMMARY_COLUMNS, "device"),
                tables={"steps": (*STEP_COLUMNS, *_KEYS, "device")},
                not_configuration=("threads", "seeds"), kind_column="device")


def store_config(cfg: InitScaleConfig) -> dict:
    """The configuration recorded with stored runs and checked on resume: the fields of ``cfg`` and the side
    table's ``step_every`` (:data:`STEP_EVERY`)."""
    return {**asdict(cfg), "step_every": STEP_EVERY}


def _cpu(device: torch.device | str | None) -> torch.device:
    """``device`` (default the CPU) if it is the CPU.

    Raises:
        ValueError: another device (the runs are CPU-sized: a 784-64-10 network on 3,750 images).
    """
    device = torch.device("cpu" if device is None else device)
    if device.type != "cpu":
        raise ValueError(f"the initialization experiment runs on the CPU only (a 784-64-10 network), got {device}")
    return device


def open_store(out: str | Path, cfg: InitScaleConfig, device: torch.device | str | None = None) -> ResultsStore:
    """Open the results store ``out`` for ``cfg`` (:class:`attnbook.store.ResultsStore` with :data:`LAYOUT`).

    Raises:
        ValueError: ``device`` is not the CPU.
        attnbook.store.StoreError: see :class:`~attnbook.store.ResultsStore` (another configuration: the message
            names the entries that differ).
    """
    return ResultsStore(out, LAYOUT, store_config(cfg), device=str(_cpu(device))).open()


def _task(cfg: InitScaleConfig, data: dict, init: object, optimizer: str, seed: int
          ) -> tuple[dict, dict[str, pd.DataFrame]]:
    """One stored run (in a worker process or here) on ``cfg.threads`` torch threads: its summary with ``device``,
    and ``{"steps": ...}``, its every :data:`STEP_EVERY`-th step record with the run's key and device (the side
    table, as :func:`attnbook.store.collect_runs` takes it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        summary, steps = train_run(cfg, data, init, optimizer, seed)
        device = describe_device("cpu")
    finally:
        torch.set_num_threads(threads)
    kept = steps[steps["step"] % STEP_EVERY == 0]
    return {**summary, "device": device}, {
        "steps": kept.assign(init=summary["init"], optimizer=optimizer, seed=seed, device=device)}


def _in_arm_order(frame: pd.DataFrame, cfg: InitScaleConfig) -> pd.DataFrame:
    """``frame`` with ``init`` as text, sorted as :func:`run_arms` orders its runs: by arm, then seed."""
    if frame.empty:
        return frame
    frame = frame.astype({"init": str})
    order = {arm_id(init, optimizer): i for i, (init, optimizer) in enumerate(arms(cfg))}
    rank = [order.get(arm_id(i, o), len(order)) for i, o in zip(frame["init"], frame["optimizer"])]
    return frame.assign(_rank=rank).sort_values(["_rank", "seed"], kind="stable").drop(columns="_rank") \
        .reset_index(drop=True)


def run_grid(cfg: InitScaleConfig, data: dict | None = None, *, workers: int = 1,
             out: str | Path | ResultsStore | None = None, device: torch.device | str | None = None,
             show_progress: bool = True, only: list[str] | None = None, on_run=None) -> pd.DataFrame:
    """Every run of :func:`run_arms` (each arm of :func:`arms` with seeds ``0 .. cfg.seeds - 1``), on ``workers``
    processes with ``cfg.threads`` torch threads each, into a results store.

    Args:
        cfg: the configuration.
        data: :func:`load_data`'s tensors, or None to load them (only if a run is left to make).
        workers: local processes (:func:`attnbook.runtime.run_tasks`).
        out: a store path (``.csv``; opened, resumed and recorded as one session, as chapters 5, 8 and 9 do), an open
            :class:`~attnbook.store.ResultsStore` (:func:`open_store`), or None to store nothing. Runs already in
            the store are skipped; each finished run is appended at once (its step records first, then its row).
        device: the CPU (the default); the experiment runs nowhere else.
        show_progress: a progress bar over the runs.
        only: arm names (:func:`arm_id`) to run, or None for all.
        on_run: called with every run so far after each finished run.

    Returns:
        One row per run, stored ones included, in :func:`run_arms`' order: the columns of :data:`SUMMARY_COLUMNS`
        (floats; ``init`` as text, ``seed`` int) and ``device``. For the same ``cfg`` and ``data``, a run's row
        equals :func:`run_arms`' on a CPU with ``cfg.threads`` threads, bitwise.

    Raises:
        ValueError: ``device`` is not the CPU.
        attnbook.store.StoreError: ``out`` cannot be resumed (another configuration, another process holds it).
    """
    device = _cpu(device)
    if out is not None and not isinstance(out, ResultsStore):
        return run_grid_in_session(run_grid, open_store, cfg, data, out=out, device=device, workers=workers,
                                   only=only, show_progress=show_progress, on_run=on_run)
    store = out
    tasks = [(init, optimizer, seed) for init, optimizer in arms(cfg)
             if only is None or arm_id(init, optimizer) in only for seed in range(cfg.seeds)
             if store is None or not store.has({"init": str(init), "optimizer": optimizer, "seed": seed})]
    if tasks and data is None:
        data = load_data(cfg)
    arguments = ((cfg, data, *task) for task in tasks)
    frame, _ = collect_runs(_task, arguments, len(tasks), workers=workers, store=store, tables=("steps",),
                            show_progress=show_progress, on_run=on_run)
    return _in_arm_order(frame, cfg)


# ------------------------------------------------------------------------------------------------- stored runs
@dataclass
class StoredRuns:
    """A store of this experiment as read back by :func:`read_runs`: ``runs`` (the main table: one row per run,
    :data:`SUMMARY_COLUMNS` and ``device``), ``steps`` (the side table; empty if its file is missing) and
    ``provenance`` (the sidecar: ``config``, ``mode``, ``device``, ``date_utc``, ``sessions``, ...)."""

    runs: pd.DataFrame
    steps: pd.DataFrame
    provenance: dict

    def status(self, cfg: InitScaleConfig) -> str:
        """Whether these runs can stand for the runs of ``cfg``: ``"used"`` if they were made with ``cfg``'s
        configuration (:func:`store_config`, up to :data:`LAYOUT`'s ``not_configuration``, compared with
        :func:`attnbook.store.config_differences`) and every arm has every seed of ``cfg``; else
        ``"differs in [...]"``, naming the entries that differ, or ``"incomplete: N of M runs missing"``.
        Chapter 3, section "Why initial weights of size 200 leave a classifier at chance"."""
        differs = config_differences(self.provenance.get("config", {}), store_config(cfg), LAYOUT.not_configuration)
        if differs:
            return f"differs in {differs}"
        have = set(zip(self.runs["init"], self.runs["optimizer"], self.runs["seed"]))
        want = {(str(init), optimizer, seed) for init, optimizer in arms(cfg) for seed in range(cfg.seeds)}
        missing = len(want - have)
        return f"incomplete: {missing} of {len(want)} runs missing" if missing else "used"


def read_runs(name: str = "init_scale_full", start: str | Path | None = None) -> StoredRuns | None:
    """The stored runs ``results/<name>.csv`` with ``<name>_steps.csv`` and ``<name>.json``, found as
    :func:`attnbook.provenance.read_stored` finds them (from ``start`` upwards; on Colab from the book's repository),
    or None if the main table or the provenance is missing. ``init`` is read as text. Chapter 3 and its
    evidence page."""
    stored = read_tables(name, ("steps",), start, dtype={"init": str})
    if stored is None:
        return None
    return StoredRuns(stored.runs, stored.tables.get("steps", pd.DataFrame()), stored.provenance)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """The command line (module docstring): every run of ``--mode`` into the store ``--out`` with its provenance
    ``<name>.json``; resumable, and it refuses a store of another configuration, naming the entries that differ.
    The arguments and the store are checked before the data are loaded."""
    parser = grid_parser("python -m attnbook.experiments.init_scale", __doc__.split("\n")[0],
                         "results/init_scale_full.csv",
                         "comma-separated arms, e.g. 200.0/adam,200.0/adam-scaled (default: all)")
    args = parser.parse_args(argv)
    cfg = InitScaleConfig.for_mode(args.mode)
    changes = {"threads": args.threads} if args.threads is not None else {}
    if args.seeds is not None:
        changes["seeds"] = args.seeds
    cfg = replace(cfg, **changes)
    only = args.only.split(",") if args.only else None
    names = [arm_id(init, optimizer) for init, optimizer in arms(cfg)]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        parser.error(f"--only names arms that are not in the experiment: {unknown}; the arms are {names}")
    try:
        device = _cpu(args.device)
    except ValueError as err:
        parser.error(str(err))
    return run_grid_cli(parser, args, cfg, run_grid=run_grid, open_store=open_store, only=only, device=device)


if __name__ == "__main__":  # pragma: no cover
    main()
