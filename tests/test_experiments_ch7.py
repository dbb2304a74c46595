"""Smoke tests of chapter 7's experiment modules on tiny configurations: the digit-captioning grid and its CLI
(CSV files and provenance), the localization metric against a stub model that looks exactly at the right digit, and
the explanation experiment's data flow."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from attnbook.experiments import attention_explanation as ex
from attnbook.experiments import hard_attention as ha
from attnbook.hard_attention import DecoderOutput
from attnbook.interpret import AttentionClassifier
from attnbook.models import BiGRUClassifier

pytestmark = pytest.mark.usefixtures("one_thread")


TINY = replace(ha.HardAttentionConfig.quick(), n_train=64, n_test=32, n_curve_eval=16, steps=4, batch_size=8,
               eval_every=2, grad_estimates=3, seeds=(0,))


def test_configs_and_errors():
    assert ha.HardAttentionConfig.for_mode("quick") == ha.HardAttentionConfig.quick()
    assert ha.HardAttentionConfig.full().seeds == (0, 1, 2)
    with pytest.raises(ValueError, match="mode must be 'quick' or 'full', got 'fast'"):
        ha.HardAttentionConfig.for_mode("fast")
    with pytest.raises(ValueError, match="mode must be 'quick' or 'full', got 'slow'"):
        ex.ExplanationConfig.for_mode("slow")


def test_run_grid_tables():
    tables = ha.run_grid(TINY, show_progress=False)
    assert list(tables["summary"]["mode"]) == ["soft", "hard", "gumbel"]
    assert tables["summary"][["token_acc", "seq_acc", "loc_acc"]].apply(lambda c: c.between(0, 1).all()).all()
    assert set(tables["curves"]["step"]) == {2, 4}
    gv = tables["gradvar"]
    assert len(gv) == 2 * 2 * len(ha.ESTIMATORS)
    fixed_soft = gv[(gv.estimator == "soft (exact)") & (gv.batches == "fixed")]
    assert (fixed_soft.total_variance.abs() < 1e-12).all()          # the exact gradient on one minibatch is fixed


def test_cli_writes_results_and_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(ha.HardAttentionConfig, "quick", classmethod(lambda cls: TINY))
    out = tmp_path / "res" / "hard_attention_quick.csv"
    assert ha.main(["--mode", "quick", "--out", str(out), "--device", "cpu"]) == 0
    summary = pd.read_csv(out)
    assert len(summary) == 3 and {"mode", "seed", "token_acc", "ms_per_step"} <= set(summary.columns)
    assert (tmp_path / "res" / "hard_attention_quick_curves.csv").exists()
    assert (tmp_path / "res" / "hard_attention_quick_gradvar.csv").exists()
    prov = json.loads(out.with_suffix(".json").read_text())
    assert prov["mode"] == "quick" and prov["device_type"] == "cpu" and prov["config"]["steps"] == TINY.steps


class _Oracle(torch.nn.Module):
    """Attends exactly at the top-left grid cell of each digit (or one cell to the left of it, if shifted)."""

    def __init__(self, offsets, shift=0):
        super().__init__()
        self.offsets, self.shift, self.dummy = offsets, shift, torch.nn.Parameter(torch.zeros(1))
        self.grid_shape = None

    def forward(self, images, captions=None, max_len=None, **_):
        b, _, h, w = images.shape
        self.grid_shape = (h // 2, w // 2)
        offs = self.offsets[: b]
        cell = (offs[..., 0] // 2) * (w // 2) + (offs[..., 1] // 2 - self.shift).clamp(min=0)
        alpha = torch.nn.functional.one_hot(cell, (h // 2) * (w // 2)).float()
        tokens = torch.zeros(b, max_len, dtype=torch.long)
        return DecoderOutput(logits=None, alpha=alpha, weights=alpha, log_prob=None, entropy=None, tokens=tokens)


@pytest.mark.parametrize("width,height", [(24, 8), (40, 16)])
def test_localization_metric(width, height):
    from attnbook.data.digits import make_canvases, split_digit_images
    canvases = make_canvases(split_digit_images(seed=0)[0], 50, 3, width, height, seed=1)
    # Digits start at even or odd pixel columns; the cell containing the top-left pixel lies inside the digit only
    # when the offset is even, so compare with that count.
    even = ((canvases.offsets % 2) == 0).all(-1).float().mean().item()
    assert ha.evaluate(_Oracle(canvases.offsets), canvases)["loc_acc"] == pytest.approx(even)
    if width == 24:       # tiling canvas: offsets 0, 8, 16; four cells to the left is the previous digit or column 0
        assert ha.evaluate(_Oracle(canvases.offsets, shift=4), canvases)["loc_acc"] == pytest.approx(1 / 3)


EX_CFG = replace(ex.ExplanationConfig.quick(), n_train=300, n_test=60, n_analyse=5, max_len=24, vocab_size=500,
                 epochs=1, n_permutations=3)


@pytest.fixture(scope="module")
def ex_data():
    return ex.prepare_reviews(EX_CFG)


def test_explanation_pipeline_runs(ex_data):
    data = ex_data
    assert data["n_reviews"] < 25_000 and data["train"]["ids"].shape == (300, 24) and len(data["test"]["ids"]) == 60
    assert data["train"]["ids"].dtype == "int32" and set(data["train"]["labels"]) == {0, 1}
    model, history = ex.train_classifier(EX_CFG, data, show_progress=False)
    assert isinstance(model, BiGRUClassifier) and model.pooling.kind == "attention" and model.encoder.packed
    assert model.pooling.attention.masking == "neg_inf" and not model.training
    assert list(history.epoch) == [1] and history.test_acc.iloc[0] == ex.accuracy(model, data["test"])
    result = ex.explanation_tests(EX_CFG, model, data)
    per = result["per_example"]
    assert len(per) == 5 and per.tau_grad.between(-1, 1).all() and (per.perm_median_change >= 0).all()
    # the probabilities are the BiGRU's own softmax on the first five test reviews
    with torch.no_grad():
        logits, weights = model(result["ids"], result["lengths"])
    assert np.allclose(per.prob, torch.softmax(logits, -1)[:, 1].numpy(), atol=1e-6)
    assert torch.allclose(result["weights"], weights) and list(per.length) == result["lengths"].tolist()


@pytest.mark.parametrize("uniform", [False, True])
def test_training_is_chapter_5s(ex_data, uniform):
    """The same seed and sizes through attnbook.experiments.masking.run_one give the same classifier: its test
    accuracy (measured by masking's own evaluation) equals ours."""
    from attnbook.experiments import masking

    mcfg = replace(masking.MaskingConfig.quick(), n_train=300, max_len=24, embed_size=EX_CFG.embed_size,
                   hidden_size=EX_CFG.hidden_size, attention_size=EX_CFG.attention_size,
                   batch_size=EX_CFG.batch_size, epochs=EX_CFG.epochs, lr=EX_CFG.lr, repad_to=48, threads=1)
    mdata = {"vocab_size": ex_data["vocab_size"], "train": ex_data["train"], "validation": ex_data["test"],
             "test": ex_data["test"]}
    condition = ex._condition(EX_CFG, uniform)
    row = masking.run_one(mcfg, mdata, condition, seed=EX_CFG.seed)
    model, history = ex.train_classifier(EX_CFG, ex_data, uniform=uniform, show_progress=False)
    assert model.pooling.kind == ("mean" if uniform else "attention")
    assert history.test_acc.iloc[-1] == pytest.approx(row["test_accuracy"])


def test_twins_side_by_side_equal_one_after_the_other(ex_data):
    """Two worker processes give bitwise the same two classifiers and histories (bar wall_s) as this process."""
    here = ex.train_twins(EX_CFG, ex_data, workers=1, show_progress=False)
    apart = ex.train_twins(EX_CFG, ex_data, workers=2, show_progress=False)
    for (model_a, history_a), (model_b, history_b), kind in zip(here, apart, ("attention", "mean")):
        assert model_a.pooling.kind == model_b.pooling.kind == kind
        state_a, state_b = model_a.state_dict(), model_b.state_dict()
        assert state_a.keys() == state_b.keys()
        assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
        pd.testing.assert_frame_equal(history_a.drop(columns="wall_s"), history_b.drop(columns="wall_s"))
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        ex.train_twins(EX_CFG, ex_data, workers=0)


def test_predict_and_accuracy_for_both_kinds_of_model(ex_data):
    test = ex_data["test"]
    model, _ = ex.train_classifier(EX_CFG, ex_data, show_progress=False)
    ids, lengths = torch.from_numpy(test["ids"]).long(), torch.from_numpy(test["lengths"])
    with torch.no_grad():
        expected = model(ids, lengths)[0].argmax(-1).numpy()
    assert np.array_equal(ex.predict(model, test, batch_size=7), expected)
    torch.manual_seed(0)
    bag = AttentionClassifier(ex_data["vocab_size"], 8, 4, 4, encoder="none").eval()
    with torch.no_grad():
        expected = (bag(ids, lengths)[0] > 0).long().numpy()
    assert np.array_equal(ex.predict(bag, test), expected)
    assert ex.accuracy(bag, test) == pytest.approx((expected == test["labels"]).mean())
    per = ex.explanation_tests(EX_CFG, bag, ex_data)["per_example"]      # a protocol model is tested as it is
    assert len(per) == 5 and per.tau_loo.between(-1, 1).all()


def test_accuracy_difference():
    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 1])
    a = labels.copy()
    b = labels.copy()
    b[:3] = 1 - b[:3]                                              # b gets three reviews wrong
    out = ex.accuracy_difference(a, b, labels)
    assert (out["acc_a"], out["acc_b"], out["difference"], out["n"]) == (1.0, 0.7, pytest.approx(0.3), 10)
    assert 0 <= out["low"] <= 0.3 <= out["high"] <= 0.6
    assert ex.accuracy_difference(a, b, labels) == out                # seeded: the same interval again
    same = ex.accuracy_difference(a, a, labels)
    assert (same["difference"], same["low"], same["high"]) == (0, 0, 0)
    swapped = ex.accuracy_difference(b, a, labels)
    assert swapped["difference"] == pytest.approx(-0.3) and swapped["high"] <= 0
    with pytest.raises(ValueError, match=r"must have the same length, got \(10,\), \(9,\) and \(10,\)"):
        ex.accuracy_difference(a, b[:9], labels)
    with pytest.raises(ValueError, match="needs at least 2 reviews, got 1"):
        ex.accuracy_difference(a[:1], b[:1], labels[:1])


# ---------------------------------------------------------------- the command lines as results stores
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

from test_store import check_resumed, cut_last_line, kill_after_rows  # noqa: E402

from attnbook.hard_attention import MODES  # noqa: E402

EX_TINY = replace(ex.ExplanationConfig.quick(), n_train=300, n_test=60, n_analyse=5, max_len=24, vocab_size=500,
                  epochs=1, n_permutations=3)


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(ha.HardAttentionConfig, "quick", classmethod(lambda cls: TINY))
    monkeypatch.setattr(ex.ExplanationConfig, "quick", classmethod(lambda cls: EX_TINY))


def _argv(out, *more):
    return ["--mode", "quick", "--out", str(out), "--device", "cpu", "--no-progress", *more]


def _check_hard_attention_tables(out, seeds):
    curves = pd.read_csv(out.with_name(out.stem + "_curves.csv"))
    gradvar = pd.read_csv(out.with_name(out.stem + "_gradvar.csv"))
    assert curves.groupby(["mode", "seed"]).size().to_dict() == {(m, s): 2 for m in MODES for s in seeds}
    assert not curves.duplicated(["mode", "seed", "step"]).any()
    assert gradvar.groupby(["seed", "checkpoint"]).size().to_dict() == {
        (s, c): 2 * len(ha.ESTIMATORS) for s in seeds for c in ("initial", "trained soft")}
    assert set(gradvar["mode"]) == {"soft"}


def test_hard_attention_killed_run_resumes_without_losing_or_doubling_a_run(tmp_path, tiny):
    out = tmp_path / "h.csv"
    code, before = kill_after_rows("attnbook.experiments.hard_attention", TINY, _argv(out, "--seeds", "2"), out, rows=2)
    assert code == -signal.SIGKILL
    assert ha.main(_argv(out, "--seeds", "2")) == 0
    check_resumed(out, before, ["mode", "seed"], expected=6)
    _check_hard_attention_tables(out, [0, 1])
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "finished"]      # the SIGKILLed session, as the next saw it


def test_hard_attention_cut_last_row_is_set_aside_and_its_run_redone(tmp_path, tiny, capsys):
    out = tmp_path / "h.csv"
    ha.main(_argv(out))
    cut_last_line(out)
    before = out.read_bytes()
    ha.main(_argv(out))
    assert "set aside a damaged last line" in capsys.readouterr().err
    frame = check_resumed(out, before, ["mode", "seed"], expected=3)
    assert frame["mode"].tolist() == list(MODES)
    _check_hard_attention_tables(out, [0])


def test_hard_attention_more_seeds_resume_and_the_device_is_not_configuration(tmp_path, tiny, capsys):
    from dataclasses import asdict

    from attnbook.store import ResultsStore

    out = tmp_path / "h.csv"
    ha.main(_argv(out))
    assert ha.main(_argv(out, "--seeds", "2")) == 0 and len(pd.read_csv(out)) == 6
    _check_hard_attention_tables(out, [0, 1])
    ResultsStore(out, ha.LAYOUT, asdict(replace(TINY, device="cuda", seeds=(0, 1, 2)))).open().close()
    with pytest.raises(SystemExit):
        ha.main(["--mode", "full", "--out", str(out), "--device", "cpu"])
    assert "another configuration" in capsys.readouterr().err


@pytest.mark.parametrize("module,argv,message", [
    (ha, ["--seeds", "0"], "argument --seeds: must be an integer >= 1, got '0'"),
    (ha, ["--device", "gpu"], "argument --device: 'gpu' is not a torch device"),
    (ha, ["--out", "h.json"], "argument --out: must name a .csv file"),
    (ex, ["--seeds", "-1"], "argument --seeds: must be an integer >= 1, got '-1'"),
    (ex, ["--epochs", "0"], "argument --epochs: must be an integer >= 1, got '0'"),
    (ex, ["--out", "e.json"], "argument --out: must name a .csv file"),
])
def test_bad_arguments_fail_before_the_data_are_made(tmp_path, monkeypatch, capsys, module, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ha, "make_data", lambda cfg: pytest.fail("data were made"))
    monkeypatch.setattr(ex, "prepare_reviews", lambda cfg: pytest.fail("data were loaded"))
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--mode", "quick", "--out", "x.csv", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("module,function", [(ha, "train_captioner"), (ex, "run_one")])
def test_sigterm_ends_the_command_line_with_143(tmp_path, tiny, monkeypatch, module, function):
    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(ha, "make_data", lambda cfg: None)
    monkeypatch.setattr(ha, "gradient_variance", lambda *args: pd.DataFrame())
    monkeypatch.setattr(ex, "prepare_reviews", lambda cfg: None)
    monkeypatch.setattr(module, function, terminated)
    with pytest.raises(SystemExit) as exit_info:
        module.main(_argv(tmp_path / "x.csv"))
    assert exit_info.value.code == 143
    assert json.loads((tmp_path / "x.json").read_text())["sessions"][-1]["status"] == "interrupted"


def _check_explanation_tables(out, seeds):
    frame = pd.read_csv(out)
    history = pd.read_csv(out.with_name(out.stem + "_history.csv"))
    per_example = pd.read_csv(out.with_name(out.stem + "_per_example.csv"))
    assert history.groupby(["attention", "seed"]).size().to_dict() == {
        (a, s): EX_TINY.epochs for a in ex.ATTENTIONS for s in seeds}
    assert per_example.groupby(["attention", "seed"]).size().to_dict() == {("learned", s): 5 for s in seeds}
    learned = frame[frame.attention == "learned"].set_index("seed")
    means = per_example.groupby("seed").tau_grad.mean()
    assert learned.mean_tau_grad.values == pytest.approx(means.loc[learned.index].values)
    assert frame[frame.attention == "uniform"].mean_tau_grad.isna().all()


def test_explanation_cli_stores_runs_with_provenance(tmp_path, tiny):
    out = tmp_path / "e.csv"
    assert ex.main(_argv(out)) == 0
    frame = pd.read_csv(out)
    assert frame[["attention", "seed"]].values.tolist() == [["learned", 0], ["uniform", 0]]
    assert frame.test_acc.between(0, 1).all() and (frame.n_train == 300).all()
    _check_explanation_tables(out, [0])
    prov = json.loads(out.with_suffix(".json").read_text())
    assert prov["mode"] == "quick" and prov["device_type"] == "cpu" and prov["config"]["seeds"] == [0]
    assert "seed" not in prov["config"] and prov["sessions"][0]["status"] == "finished"


def test_explanation_killed_run_resumes_without_losing_or_doubling_a_run(tmp_path, tiny):
    out = tmp_path / "e.csv"
    code, before = kill_after_rows("attnbook.experiments.attention_explanation", EX_TINY,
                                   _argv(out, "--seeds", "2"), out, rows=1)
    assert code == -signal.SIGKILL
    ex.main(_argv(out, "--seeds", "2"))
    check_resumed(out, before, ["attention", "seed"], expected=4)
    _check_explanation_tables(out, [0, 1])


def test_explanation_cut_last_row_is_set_aside_and_its_run_redone(tmp_path, tiny, capsys):
    out = tmp_path / "e.csv"
    ex.main(_argv(out))
    whole = pd.read_csv(out)
    cut_last_line(out)
    before = out.read_bytes()
    ex.main(_argv(out))
    assert "set aside a damaged last line" in capsys.readouterr().err
    frame = check_resumed(out, before, ["attention", "seed"], expected=2)
    pd.testing.assert_frame_equal(frame.drop(columns="wall_s"), whole.drop(columns="wall_s"))
    _check_explanation_tables(out, [0])


def test_explanation_run_one_errors():
    with pytest.raises(ValueError, match=r"attention must be one of \('learned', 'uniform'\), got 'hard'"):
        ex.run_one(EX_TINY, {}, "hard")


# --- the sentences chapter 7 glues from stored runs ------------------------------------------------------------

def test_hard_attention_stored_summary_ranks_the_decoders():
    runs = pd.DataFrame({"mode": ["soft", "hard", "gumbel"] * 2, "seed": [0, 0, 0, 1, 1, 1],
                         "token_acc": [0.9, 0.5, 0.7, 0.8, 0.5, 0.7]})
    assert ha.stored_summary(runs) == ("Over 2 seeds (table above), mean held-out token accuracy ranks the decoders "
                                       "soft attention (0.850), then Gumbel (0.700), then REINFORCE (0.500).")
    one = runs[runs.seed == 0]
    assert ha.stored_summary(one).startswith("Over 1 seed (table above)")
    # equal means keep the order of the grouped modes (alphabetical), never a random one
    assert ha.stored_summary(one.assign(token_acc=0.0)).endswith(
        "Gumbel (0.000), then REINFORCE (0.000), then soft attention (0.000).")
    with pytest.raises(ValueError, match="runs is empty"):
        ha.stored_summary(runs.iloc[:0])


def test_explanation_stored_summary_gives_both_means():
    runs = pd.DataFrame({"attention": ["learned", "uniform"] * 2, "seed": [0, 0, 1, 1],
                         "test_acc": [0.8, 0.82, 0.9, 0.84]})
    assert ex.stored_summary(runs) == ("Over 2 seeds at full size (table above), mean test accuracy is 0.850 for "
                                       "learned attention and 0.830 for the uniform twin; the rest here is the "
                                       "quick run.")
    only = runs[(runs.seed == 0) & (runs.attention == "learned")]
    assert ex.stored_summary(only).startswith("Over 1 seed at full size (table above), mean test accuracy is 0.800 "
                                              "for learned attention;")
    with pytest.raises(ValueError, match="runs is empty"):
        ex.stored_summary(runs.iloc[:0])


# --- chapter 7's sentences at their edge values ----------------------------------------------------------------

def test_half_sentence_at_its_edges():
    assert ha.half_sentence({"soft": 200, "gumbel": 400, "hard": None}, 800) == (
        "Held-out token accuracy first exceeds one half at step 200 for soft attention and step 400 for Gumbel. "
        "REINFORCE does not reach one half within 800 steps.")
    assert ha.half_sentence({"soft": 200, "gumbel": None, "hard": None}, 800).endswith(
        "Gumbel and REINFORCE do not reach one half within 800 steps.")
    assert ha.half_sentence({"soft": 0, "hard": 1}, 1) == (
        "Held-out token accuracy first exceeds one half at step 0 for soft attention and step 1 for REINFORCE.")
    assert ha.half_sentence({"soft": None, "hard": None}, 1) == (
        "Held-out token accuracy does not exceed one half within 1 step for any decoder.")
    for half in ({"soft": None}, {"soft": 5, "hard": None}):
        text = ha.half_sentence(half, 800)
        assert "at not" not in text and "None" not in text
    with pytest.raises(ValueError, match="half is empty"):
        ha.half_sentence({}, 800)


def test_own_digit_sentence_at_its_edges():
    assert ha.own_digit_sentence([0.99, 0.9904]) == (
        "On this canvas, each generated token puts 99% of its weight on the grid columns of the digit it should name.")
    assert "between 95% and 99% of" in ha.own_digit_sentence(torch.tensor([0.95, 0.99, 0.97]))
    assert "between" not in ha.own_digit_sentence([0.0, 0.0])
    assert ha.own_digit_sentence([1.0], where="") == (
        "The generated token puts 100% of its weight on the grid columns of the digit it should name.")
    assert ha.own_digit_sentence([0.5]).startswith("On this canvas, the generated token puts 50%")
    with pytest.raises(ValueError, match="shares is empty"):
        ha.own_digit_sentence([])


def test_captions_sentence_says_all_three_when_the_decoders_agree():
    same = {"soft": "4 4 6", "hard": "4 4 6", "gumbel": "4 4 6"}
    assert ha.captions_sentence("4 4 6", same) == "The canvas reads 4 4 6, and all three decoders write 4 4 6."
    assert ha.captions_sentence("1 2 3", same) == "The canvas reads 1 2 3, and all three decoders write 4 4 6."
    assert ha.captions_sentence("4 4 6", {"soft": "4 4 6", "hard": "4 1 6", "gumbel": "4 4 6"}) == (
        "The canvas reads 4 4 6; the soft decoder writes 4 4 6, the hard decoder 4 1 6 and the Gumbel decoder 4 4 6.")
    assert ha.captions_sentence("7", {"soft": "7", "gumbel": "7"}) == "The canvas reads 7, and both decoders write 7."
    assert ha.captions_sentence("7", {"hard": "1"}) == "The canvas reads 7; the hard decoder writes 1."
    with pytest.raises(ValueError, match="captions is empty"):
        ha.captions_sentence("7", {})


def test_agreement_phrase_at_zero():
    assert ha.agreement_phrase(0.0) == "exactly"
    assert ha.agreement_phrase(torch.tensor(1.1e-16)) == "to within 1.1e-16"
    for bad in (-1e-9, float("nan")):
        with pytest.raises(ValueError, match="at least 0"):
            ha.agreement_phrase(bad)


@pytest.mark.parametrize("bias_a, bias_b, var_a, var_b, expected", [
    (0.1, 0.2, 1.0, 2.0, "A beats B on both bias and variance"),
    (0.3, 0.2, 3.0, 2.0, "B beats A on both bias and variance"),
    (0.1, 0.2, 3.0, 2.0, "A has the smaller bias and B the smaller variance"),
    (0.3, 0.2, 1.0, 2.0, "B has the smaller bias and A the smaller variance"),
    (0.2, 0.2, 2.0, 2.0, "A and B have the same bias and the same variance"),
    (0.0, 0.0, 1.0, 2.0, "A and B have the same bias, and A the smaller variance"),
    (0.1, 0.2, 0.0, 0.0, "A and B have the same variance, and A the smaller bias"),
])
def test_compare_estimators_names_each_case(bias_a, bias_b, var_a, var_b, expected):
    assert ha.compare_estimators("A", "B", bias_a, bias_b, var_a, var_b) == expected


def test_order_sentence_never_claims_what_the_toy_problem_does_not_show():
    text = ha.order_sentence(["soft", "gumbel", "hard"], None, "gumbel")
    assert text.startswith("By held-out token accuracy the decoders rank soft attention, then Gumbel, then REINFORCE.")
    assert "does not predict that Gumbel comes before REINFORCE" in text and "which fits the order" in text
    assert "matches" not in text
    assert "is what the toy problem predicts" in ha.order_sentence(["gumbel", "soft", "hard"], "gumbel", None)
    opposite = ha.order_sentence(["soft", "gumbel", "hard"], "hard", "hard")
    assert "predicts the opposite order" in opposite and "does not explain the order" in opposite
    assert "REINFORCE comes before Gumbel" in ha.order_sentence(["hard", "gumbel", "soft"], None, None)
    with pytest.raises(ValueError, match="must name 'hard' and 'gumbel'"):
        ha.order_sentence(["soft", "hard"], None, None)
    with pytest.raises(ValueError, match="toy_winner must be"):
        ha.order_sentence(["soft", "hard", "gumbel"], "soft", None)


def test_paper_sentence_counts_the_data_sets():
    index = pd.MultiIndex.from_product([["A", "B", "C"], ["soft", "hard"]], names=["data set", "attention"])
    table = pd.DataFrame({"BLEU-4": [1, 2, 1, 2, 1, 2], "METEOR": [2, 1, 1, 1, 1, 2]}, index=index)
    assert ha.paper_sentence(table) == ("In the paper, hard attention has the higher BLEU-4 on all three data sets, "
                                        "and soft attention the higher METEOR on A.")
    table["BLEU-4"] = 1
    table["METEOR"] = [2, 1, 2, 1, 1, 2]
    assert ha.paper_sentence(table).endswith("BLEU-4 on none of the data sets, and soft attention the higher METEOR "
                                             "on A and B.")


def test_uniformity_sentence_and_its_threshold():
    text, flat = ex.uniformity_sentence(0.0085, 0.005, 1.7)
    assert flat and text == ("This model's attention is nearly uniform: the largest weight in the median test review "
                             "is 0.009, where uniform weights would give every token 0.005.")
    assert ex.uniformity_sentence(0.0051, 0.005, 1.0)[0].endswith(
        "is 0.005, the same as uniform weights would give every token.")
    assert ex.uniformity_sentence(0.005, 0.005, 1.0)[1]
    text, flat = ex.uniformity_sentence(0.9, 0.01, 90.0)
    assert not flat and text.startswith("This model's attention is peaked:")
    assert not ex.uniformity_sentence(0.03, 0.01, ex.NEARLY_UNIFORM_RATIO)[1]
    with pytest.raises(ValueError, match="at least 1"):
        ex.uniformity_sentence(0.004, 0.005, 0.8)
    with pytest.raises(ValueError, match="positive"):
        ex.uniformity_sentence(0.0, 0.005, 1.0)


def test_attention_peaks_of_uniform_and_learned_attention(ex_data):
    test = ex_data["test"]
    torch.manual_seed(0)
    uniform = ex.attention_peaks(AttentionClassifier(ex_data["vocab_size"], embed_size=8, encoder="none",
                                                     uniform=True), test, batch_size=7)
    assert len(uniform) == len(test["labels"]) and np.allclose(uniform.uniform, 1 / test["lengths"])
    assert np.allclose(uniform.ratio, 1.0, atol=1e-5) and np.allclose(uniform.max_weight, uniform.uniform)
    model, _ = ex.train_classifier(EX_CFG, ex_data, show_progress=False)
    peaks = ex.attention_peaks(model, test)
    assert (peaks.ratio >= 1 - 1e-5).all() and (peaks.ratio <= peaks.length + 1e-5).all()


def test_percent_of_at_its_edges():
    assert [ex.percent_of(x) for x in (0, 0.001, 0.0051, 0.51, 0.92, 0.9949, 0.996, 1)] == [
        "none", "under 1%", "1%", "51%", "92%", "99%", "over 99%", "all"]
    for bad in (-0.1, 1.1, float("nan")):
        with pytest.raises(ValueError, match="share must lie"):
            ex.percent_of(bad)


def test_twin_verdict_and_meaning():
    assert ex.twin_verdict(0.01, 0.03)[1] == "learned attention ahead beyond test-set noise"
    assert ex.twin_verdict(-0.03, -0.01)[1] == "the uniform twin ahead beyond test-set noise"
    for low, high in ((-0.01, 0.01), (0.0, 0.0), (0.0, 0.02), (-0.02, 0.0)):
        assert ex.twin_verdict(low, high)[1] == "within test-set noise"
    with pytest.raises(ValueError, match="low must not exceed high"):
        ex.twin_verdict(0.1, 0.0)
    assert "this model only" in ex.twin_meaning(False, True)
    assert "this model only" in ex.twin_meaning(True, True)
    assert "this model only" not in ex.twin_meaning(True, False)
    assert ex.twin_meaning(False, False).startswith("So this task can be solved without choosing tokens")


def test_interval_phrase_at_equal_bounds():
    assert ex.interval_phrase(-0.0301, -0.0084) == "(95% interval over the test reviews -0.030 to -0.008)"
    assert ex.interval_phrase(0.0, 0.0) == "(the same, +0.000, on every resample of the test reviews)"
    assert ex.interval_phrase(0.01, 0.0104) == "(the same, +0.010, on every resample of the test reviews)"
    with pytest.raises(ValueError, match="low must not exceed high"):
        ex.interval_phrase(0.1, 0.0)


def test_tau_word_and_tau_above_half_sentence():
    assert [ex.tau_word(t) for t in (-0.5, 0.0, 0.1, 0.3, 0.6, 1.0, float("nan"))] == [
        "hardly", "hardly", "loosely", "moderately", "closely", "closely", "hardly"]
    assert ex.tau_bands_sentence() == (
        "We say that two scores rank the tokens hardly alike when the median τ is below 0.1, loosely alike below "
        "0.3, moderately alike below 0.6, and closely alike above that.")
    assert ex.tau_above_half_sentence(0, 0, 50) == (
        "τ exceeds one half in no review, neither for attention against gradient nor for gradient against "
        "leave-one-out.")
    assert ex.tau_above_half_sentence(1, 1, 1) == (
        "τ exceeds one half in every review, both for attention against gradient and for gradient against "
        "leave-one-out.")
    assert ex.tau_above_half_sentence(1, 0, 50) == (
        "τ exceeds one half in 1 of 50 reviews for attention against gradient, and in no review for gradient "
        "against leave-one-out.")
    assert "in every review for gradient" in ex.tau_above_half_sentence(0, 2, 2)
    with pytest.raises(ValueError, match="counts <= total"):
        ex.tau_above_half_sentence(3, 0, 2)
    with pytest.raises(ValueError, match="counts <= total"):
        ex.tau_above_half_sentence(0, 0, 0)


def test_explanation_verdict_is_limited_to_the_model_tested():
    text = ex.explanation_verdict(False, True, "loosely", True, True)
    assert text.startswith("The verdict holds for this model, whose attention is nearly uniform.")
    assert "its uniform twin is more accurate" in text and "not, by themselves, a faithful account" in text
    assert "rank the tokens only loosely alike." in text
    tie = ex.explanation_verdict(False, False, "hardly", False, False)
    assert tie.startswith("The verdict holds for this model.") and "as accurate, within test-set noise" in tie
    assert "Very different weights" not in tie and "rank the tokens hardly alike." in tie
    good = ex.explanation_verdict(True, False, "closely", True, False)
    assert "it beats its uniform twin" in good and "point to tokens that matter" in good
    with pytest.raises(ValueError, match="cannot both hold"):
        ex.explanation_verdict(True, True, "loosely", True, True)
    with pytest.raises(ValueError, match="word of tau_word"):
        ex.explanation_verdict(False, False, "somewhat", True, True)


def test_explanation_verdict_with_reliance():
    relies = ex.explanation_verdict(False, False, "closely", True, False, relies=True)
    assert "Its predictions rest on its weights." in relies
    assert "The task does not need them: its uniform twin is as accurate, within test-set noise." in relies
    assert "point to tokens that matter, but they are not the only weights" in relies
    worse = ex.explanation_verdict(False, True, "moderately", False, False, relies=True)
    assert "its uniform twin is more accurate." in worse and "Very different weights" not in worse
    idle = ex.explanation_verdict(False, False, "hardly", True, True, relies=False)
    assert "do not rest on its weights" in idle and "not, by themselves, a faithful account" in idle
    ahead = ex.explanation_verdict(True, False, "loosely", True, False, relies=True)
    assert "it beats its uniform twin" in ahead and "The task does not need" not in ahead


def test_embedding_twins_start_alike_and_the_twin_is_uniform(ex_data):
    cfg = replace(EX_CFG, bag_epochs=1, bag_batch_size=20)
    (model, history), (uniform, uniform_history) = ex.train_embedding_twins(cfg, ex_data)
    assert isinstance(model, AttentionClassifier) and model.encoder_kind == "none" and uniform.uniform
    assert list(history.epoch) == [1] and history.test_acc.iloc[0] == ex.accuracy(model, ex_data["test"])
    ids = torch.from_numpy(ex_data["test"]["ids"][:4]).long()
    lengths = torch.from_numpy(ex_data["test"]["lengths"][:4])
    with torch.no_grad():
        _, weights = uniform(ids, lengths)
    expected = (torch.arange(ids.shape[1])[None] < lengths[:, None]) / lengths[:, None]
    assert torch.allclose(weights, expected.float())
    again, _ = ex.train_embedding_classifier(cfg, ex_data)                # seeded: the same model again
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_uniform_reliance_against_a_direct_count(ex_data):
    torch.manual_seed(0)
    model = AttentionClassifier(ex_data["vocab_size"], embed_size=8, attention_size=4, encoder="none").eval()
    with torch.no_grad():
        model.attention.w_v.weight.mul_(50)                               # peaked weights
    part = ex_data["test"]
    got = ex.uniform_reliance(model, part, batch_size=7)
    ids, lengths = torch.from_numpy(part["ids"]).long(), torch.from_numpy(part["lengths"])
    with torch.no_grad():
        own, _ = model(ids, lengths)
        mean = (model.embed(ids) * (torch.arange(ids.shape[1])[None] < lengths[:, None])[..., None]).sum(1)
        even = model.out(mean / lengths[:, None]).squeeze(-1)             # the mean of the real embeddings
    assert got["n"] == len(lengths)
    assert got["flip_share"] == pytest.approx(((own > 0) != (even > 0)).float().mean().item())
    assert got["mean_abs_change"] == pytest.approx((own.sigmoid() - even.sigmoid()).abs().mean().item(), abs=1e-6)
    twin = AttentionClassifier(ex_data["vocab_size"], embed_size=8, encoder="none", uniform=True)
    assert ex.uniform_reliance(twin, part) == {"flip_share": 0.0, "mean_abs_change": 0.0, "n": len(lengths)}


def test_reliance_sentence_at_its_edges():
    assert ex.reliance_sentence(0.0).endswith("of none of the test reviews: its predictions do not rest on where "
                                              "its attention goes.")
    assert "of all of the test reviews: its predictions rest" in ex.reliance_sentence(1.0)
    assert ex.reliance_sentence(0.001).endswith("of under 1% of the test reviews: few of its predictions rest on "
                                                "where its attention goes.")
    assert "few of its" in ex.reliance_sentence(ex.RELIES_SHARE - 0.001)
    assert "few of its" not in ex.reliance_sentence(ex.RELIES_SHARE)
    assert ex.relies_on_weights(ex.RELIES_SHARE) and not ex.relies_on_weights(0.03)
    assert "of 41% of the test reviews" in ex.reliance_sentence(0.412)
    with pytest.raises(ValueError, match="share must lie in"):
        ex.reliance_sentence(1.5)


def test_two_token_alternative_keeps_the_prediction(ex_data):
    torch.manual_seed(1)
    model = AttentionClassifier(ex_data["vocab_size"], embed_size=8, attention_size=4, encoder="none").eval()
    ids = torch.from_numpy(ex_data["test"]["ids"][:1]).long()
    lengths = torch.from_numpy(ex_data["test"]["lengths"][:1])
    with torch.no_grad():
        _, weights = model(ids, lengths)
    alt = ex.two_token_alternative(model, ids, lengths, weights[0])
    assert alt["p_alt"] == pytest.approx(alt["p_orig"], abs=1e-6)
    assert int((alt["alternative"] > 0).sum()) <= 2 and alt["alternative"].sum() == pytest.approx(1.0)
    assert alt["tv"] == pytest.approx(0.5 * (alt["alternative"][: int(lengths)] - weights[0, : int(lengths)])
                                      .abs().sum().item())
    with pytest.raises(ValueError, match=r"ids must be one review \(1, T\)"):
        ex.two_token_alternative(model, ids.repeat(2, 1), lengths.repeat(2), weights)
    same = torch.full_like(ids, int(ids[0, 0]))
    with pytest.raises(ValueError, match="every token has the same u_t"):
        ex.two_token_alternative(model, same, lengths, weights[0])


@pytest.mark.parametrize("ratio, words", [(1.0, "equal"), (5.0, "less than one order of magnitude"),
                                          (10.0, "about 1 order of magnitude"), (38479.0, "4 to 5 orders of magnitude"),
                                          (1.2e5, "about 5 orders of magnitude"), (900.0, "about 3 orders of magnitude")])
def test_orders_of_magnitude(ratio, words):
    assert ex.orders_of_magnitude(ratio) == words


def test_orders_of_magnitude_refuses_bad_ratios():
    for bad in (0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="ratio must be a finite number >= 1"):
            ex.orders_of_magnitude(bad)
