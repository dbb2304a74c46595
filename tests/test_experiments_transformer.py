"""Tests of chapter 8's Transformer padding experiments (:mod:`attnbook.experiments.transformer_padding`) on a tiny
configuration: the grid, one run's metrics against what the model makes them (no attention on pads under a key
padding mask, no flips where the padding cannot reach a real token, real-token counts), paired seeds, the resumable
store of ``run_grid`` and the command line (a SIGKILLed run resumes, SIGTERM exits 143).

The real reviews are used, but only 60 + 40 + 40 Rotten Tomatoes sentences: they vary in length, so batches carry
padding."""

import json
import os
import signal
import time
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from attnbook.evidence import MIN_PAIRS
import torch
import torch.nn.functional as F

from test_store import check_resumed, cut_last_line, kill_after_rows

from attnbook.experiments import masking
from attnbook.experiments import transformer_padding as ex
from attnbook.experiments.transformer_padding import (FACTORS, RESULT_COLUMNS, TransformerPaddingConfig, condition_id,
                                                      conditions, prepare_data, run_grid, run_one)
from attnbook.runtime import seed_everything

TINY = replace(TransformerPaddingConfig.quick(), source="rotten_tomatoes", n_train=60, n_eval=40, max_len=40,
               vocab_size=500, d_model=8, nhead=2, num_layers=1, dim_feedforward=16, epochs=1, batch_size=20,
               seeds=(0, 1), eval_batch_size=40)
KEYS = [*FACTORS, "seed"]
TIMING = ["train_time_s", "tokens_per_s"]
REFERENCE = "masked/post/index/mean"
TWO = f"{REFERENCE},none/post/index/mean"

pytestmark = pytest.mark.usefixtures("one_thread")


def cond(mask="masked", padding="post", positions="index", readout="mean"):
    return dict(mask=mask, padding=padding, positions=positions, readout=readout)


@pytest.fixture(scope="module")
def data():
    return prepare_data(TINY)


@pytest.fixture(scope="module")
def rows(data):
    """One run per condition of the grid, seed 0 (shared by several tests)."""
    torch.set_num_threads(1)
    return {condition_id(c): run_one(TINY, data, c, seed=0, device="cpu") for c in conditions()}


# ---------------------------------------------------------------- the grid
def test_grid_ids_are_unique_and_hold_the_three_comparisons():
    ids = [condition_id(c) for c in conditions()]
    assert len(ids) == len(set(ids)) == 5 and ids[0] == REFERENCE == ex.REFERENCE
    assert set(ids) == {REFERENCE, "none/post/index/mean", "masked/pre/index/mean", "masked/pre/first_token/mean",
                        "masked/post/index/first"}
    assert {c for comp in ex.COMPARISONS for c in (comp.condition, comp.baseline)} == set(ids)
    for c in conditions():
        assert tuple(c) == FACTORS


@pytest.mark.parametrize("condition, message", [
    (dict(mask="masked"), r"condition must be a dict with the keys \['mask', 'padding', 'positions', 'readout'\]"),
    (cond(mask="yes"), r"condition\['mask'\] must be one of \['masked', 'none'\], got 'yes'"),
    (cond(padding="left"), r"condition\['padding'\] must be one of \['post', 'pre'\], got 'left'"),
    (cond(positions="rope"), r"condition\['positions'\] must be one of \['index', 'first_token'\], got 'rope'"),
    (cond(readout="cls"), r"condition\['readout'\] must be one of \['first', 'mean'\], got 'cls'"),
])
def test_run_one_refuses_a_bad_condition(condition, message):
    with pytest.raises(ValueError, match=message):
        run_one(TINY, {}, condition, seed=0)


def test_presets():
    quick, full = TransformerPaddingConfig.quick(), TransformerPaddingConfig.full()
    assert (quick.n_train, quick.max_len, quick.d_model, quick.num_layers, quick.nhead, quick.epochs,
            len(quick.seeds)) == (4000, 128, 32, 1, 2, 1, 2)
    assert (full.n_train, full.max_len, full.d_model, full.num_layers, full.nhead, full.dim_feedforward,
            full.batch_size, full.epochs) == (None, 400, 64, 2, 4, 256, 64, 1)
    assert quick.dropout == full.dropout == 0.0                           # torch's fused CPU kernel has no dropout
    assert len(full.seeds) == 20 and TransformerPaddingConfig.for_mode("full") == full


def test_data_are_chapter_5s(data):
    """The same reviews, split and encoding as chapter 5's experiments with the same settings."""
    same = masking.prepare_data(masking.MaskingConfig(source="rotten_tomatoes", n_train=60, n_eval=40, max_len=40,
                                                      vocab_size=500, normalize_apostrophes=True))
    assert data["vocab_size"] == same["vocab_size"]
    for name in ("train", "validation", "test"):
        for key in ("ids", "lengths", "labels"):
            np.testing.assert_array_equal(data[name][key], same[name][key])
    assert len(set(data["test"]["lengths"].tolist())) > 5                          # batches carry padding


# ---------------------------------------------------------------- one run
def test_a_row_has_every_column_in_range(rows, data):
    tokens = TINY.epochs * int(data["train"]["lengths"].sum())
    for cid, row in rows.items():
        assert list(row) == [*FACTORS, "seed", *RESULT_COLUMNS, "device"], cid
        assert condition_id(row) == cid and row["seed"] == 0 and row["device"].startswith("CPU")
        for key in ("test_accuracy", "val_accuracy", "pad_mass", "flip_rate_in"):
            assert 0 <= row[key] <= 1, (cid, key, row[key])
        assert row["nan_count"] == 0 and row["train_time_s"] > 0
        assert row["tokens_per_s"] * row["train_time_s"] == pytest.approx(tokens)     # real tokens, not pads


def test_a_key_padding_mask_gives_pads_no_attention(rows):
    for cid, row in rows.items():
        if cid.startswith("masked/"):
            assert row["pad_mass"] == 0, cid
    assert rows["none/post/index/mean"]["pad_mass"] > 0.01


def test_padding_that_cannot_reach_a_real_token_never_flips_a_prediction(rows):
    """Masked right padding leaves every real token's inputs and positions alone; so does masked left padding with
    positions counted from the first token."""
    for cid in (REFERENCE, "masked/post/index/first", "masked/pre/first_token/mean"):
        assert rows[cid]["flip_rate_in"] == 0, cid


def _model(data, condition, seed=0):
    seed_everything(seed)
    return ex._build(TINY, data["vocab_size"], condition).eval()


def test_a_seed_fixes_the_initialization_across_conditions(data):
    reference = _model(data, cond()).state_dict()
    for c in conditions()[1:]:
        other = _model(data, c).state_dict()
        assert other.keys() == reference.keys()
        assert all(torch.equal(other[k], reference[k]) for k in reference), condition_id(c)
    assert not torch.equal(_model(data, cond(), seed=1).classifier.weight, reference["classifier.weight"])


@torch.no_grad()
def test_left_padding_moves_index_positions_but_not_first_token_ones(data):
    """The same weights and reviews, left-padded to the batch's longest review and to ``max_len``: with index
    positions the logits change (the real tokens' positions move), with first-token positions they do not."""
    part = data["test"]
    index = np.flatnonzero(part["lengths"] < TINY.max_len - 5)[:20]                  # all shorter than max_len
    assert len(index) == 20
    logits = {}
    for positions in ("index", "first_token"):
        model = _model(data, cond(padding="pre", positions=positions))
        for length in (None, TINY.max_len):
            ids, lengths, _ = masking._batch(part, index, "pre", length)
            logits[positions, length] = model(ids, lengths)[0]
    torch.testing.assert_close(logits["first_token", None], logits["first_token", TINY.max_len])
    assert (logits["index", None] - logits["index", TINY.max_len]).abs().max() > 1e-4


def test_the_flip_test_compares_no_padding_with_padding_to_max_len(data, monkeypatch):
    """``flip_rate_in`` is the share of test reviews whose prediction differs between batches of one length and
    batches padded to ``max_len``: a model that answers by the batch width gives exactly the share of test reviews
    shorter than ``max_len``."""
    class ByWidth(torch.nn.Module):
        padding_side = "post"

        def forward(self, ids, lengths, return_attention=False):
            wide = float(ids.shape[1] == TINY.max_len)
            return torch.tensor([[wide, 1 - wide]]).expand(len(ids), 2), None

    model, part, device = ByWidth(), data["test"], torch.device("cpu")
    unpadded = ex._unpadded_predictions(model, part, TINY, device)
    at_max = ex._evaluate(model, part, TINY, device, length=TINY.max_len)["preds"]
    assert (unpadded != at_max).mean() == pytest.approx((part["lengths"] < TINY.max_len).mean())
    assert 0 < (part["lengths"] < TINY.max_len).mean() < 1


def test_same_seed_same_row_and_another_seed_another(rows, data):
    again = run_one(TINY, data, cond(mask="none"), seed=0, device="cpu")
    first = rows["none/post/index/mean"]
    assert {k: v for k, v in again.items() if k not in TIMING} == {k: v for k, v in first.items() if k not in TIMING}
    other = run_one(TINY, data, cond(mask="none"), seed=1, device="cpu")
    assert (other["pad_mass"], other["val_accuracy"]) != (first["pad_mass"], first["val_accuracy"])


# ---------------------------------------------------------------- the results store
@pytest.fixture()
def counted(monkeypatch):
    """Count the runs that ``run_grid`` trains."""
    calls = []
    real = ex.run_one

    def counting(cfg, data, condition, seed, device="cpu"):
        calls.append((condition_id(condition), seed))
        return real(cfg, data, condition, seed, device)

    monkeypatch.setattr(ex, "run_one", counting)
    return calls


def test_run_grid_stores_and_resumes(tmp_path, data, counted):
    out = tmp_path / "t.csv"
    only = TWO.split(",")
    first = run_grid(TINY, data, out=out, device="cpu", show_progress=False, only=only)
    assert len(first) == len(counted) == 4 and len(pd.read_csv(out)) == 4
    assert list(pd.read_csv(out).columns) == list(ex.LAYOUT.columns)
    second = run_grid(TINY, None, out=out, device="cpu", show_progress=False, only=only)   # nothing loaded either
    assert len(counted) == 4 and len(second) == 4
    pd.testing.assert_frame_equal(second, first.sort_values(KEYS).reset_index(drop=True), check_dtype=False)
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["runs_added"] for s in sessions] == [4, 0]


# ---------------------------------------------------------------- the command line
def _argv(out, *more):
    return ["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu", "--only", TWO, *more]


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(TransformerPaddingConfig, "quick", classmethod(lambda cls: TINY))


def test_main_writes_csv_and_provenance(tmp_path, tiny):
    out = tmp_path / "t.csv"
    frame = ex.main(_argv(out, "--seeds", "1"))
    assert len(frame) == 2 and len(pd.read_csv(out)) == 2
    meta = json.loads(out.with_suffix(".json").read_text())
    for key in ("device", "torch", "commit", "date_utc", "wall_time_s", "sessions", "n_seeds_complete", "config"):
        assert key in meta, key
    assert meta["n_runs"] == 2 and meta["n_seeds_complete"] == 1 and meta["sessions"][0]["status"] == "finished"
    assert meta["config"]["seeds"] == [0] and meta["config"]["d_model"] == 8


def test_main_checks_its_arguments_before_loading_data(tmp_path, tiny, monkeypatch, capsys):
    def refuse(cfg):
        raise AssertionError("the data were loaded")

    monkeypatch.setattr(ex, "prepare_data", refuse)
    with pytest.raises(SystemExit):
        ex.main(["--only", "masked/post/index/cls", "--out", str(tmp_path / "t.csv")])
    assert "--only names conditions that are not in the grid: ['masked/post/index/cls']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ex.main(["--seeds", "0", "--out", str(tmp_path / "t.csv")])
    assert "must be an integer >= 1, got '0'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ex.main(["--out", str(tmp_path / "t.json")])
    assert "must name a .csv file" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    out = tmp_path / "t.csv"
    out.with_suffix(".json").write_text(json.dumps({"config": {"max_len": 1, "seeds": [0]}}))
    with pytest.raises(SystemExit):
        ex.main(_argv(out))
    err = capsys.readouterr().err
    assert "another configuration" in err and "max_len" in err


def test_a_killed_run_resumes_without_losing_or_doubling_a_run(tmp_path, tiny):
    """A real command line, SIGKILLed once 1 of its 4 runs is stored, then resumed."""
    out = tmp_path / "t.csv"
    code, before = kill_after_rows("attnbook.experiments.transformer_padding", TINY, _argv(out), out, rows=1)
    assert code == -signal.SIGKILL
    assert [s["status"] for s in json.loads(out.with_suffix(".json").read_text())["sessions"]] == ["running"]
    ex.main(_argv(out))
    frame = check_resumed(out, before, KEYS, expected=4)
    assert set(frame.apply(condition_id, axis=1)) == set(TWO.split(","))
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "finished"]      # the SIGKILLed session, as the next saw it


def test_a_cut_last_row_is_set_aside_and_its_run_redone(tmp_path, tiny, capsys):
    out = tmp_path / "t.csv"
    ex.main(_argv(out, "--seeds", "1"))
    whole = pd.read_csv(out)
    cut_last_line(out)
    before = out.read_bytes()
    ex.main(_argv(out, "--seeds", "1"))
    assert "set aside a damaged last line" in capsys.readouterr().err
    frame = check_resumed(out, before, KEYS, expected=2)
    pd.testing.assert_frame_equal(frame.drop(columns=TIMING), whole.drop(columns=TIMING), check_dtype=False)


def test_sigterm_records_the_session_and_exits_143(tmp_path, tiny, monkeypatch):
    def terminated(cfg, data, condition, seed, device="cpu"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(ex, "run_one", terminated)
    monkeypatch.setattr(ex, "prepare_data", lambda cfg: {})
    with pytest.raises(SystemExit) as exit_info:
        ex.main(_argv(tmp_path / "t.csv"))
    assert exit_info.value.code == 143
    assert json.loads((tmp_path / "t.json").read_text())["sessions"][-1]["status"] == "interrupted"


# ---------------------------------------------------------------- the comparisons
def _runs(diffs: dict, n_seeds=12, device="CPU (1 threads, x86_64)", base=0.8):
    """Synthetic runs: every condition of the grid for ``n_seeds`` seeds; condition ``c`` has accuracy
    ``base + diffs.get(c, 0) + noise(seed)`` (the same noise for every condition of a seed)."""
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.02, n_seeds)
    rows = []
    for c in conditions():
        cid = condition_id(c)
        for s in range(n_seeds):
            rows.append({**c, "seed": s, "test_accuracy": base + noise[s] + diffs.get(cid, 0.0) * (1 + 0.1 * s),
                         "val_accuracy": 0.5, "pad_mass": 0.3 if c["mask"] == "none" else 0.0,
                         "flip_rate_in": 0.01 * (cid == "masked/pre/index/mean"), "nan_count": 0,
                         "tokens_per_s": 1000.0, "train_time_s": 1.0, "device": device})
    return pd.DataFrame(rows)


def test_compare_conditions_chooses_the_verdict_from_the_paired_interval():
    frame = _runs({"none/post/index/mean": -0.02, "masked/pre/index/mean": 0.0, "masked/post/index/first": 0.03})
    table = ex.compare_conditions(frame, n_resamples=199).set_index("name")
    assert list(table.index) == [c.name for c in ex.COMPARISONS]
    assert table.loc["mask", "verdict"] == "higher"                      # masked minus none = +0.02 per seed
    assert table.loc["mask", "n_better"] == 12 and table.loc["mask", "mean_diff"] > 0
    assert table.loc["first-token readout", "verdict"] == "higher"
    assert table.loc["left padding", "verdict"] == "no difference resolved"
    assert table.loc["left padding", "n_equal"] == 12 and table.loc["left padding", "ci_low"] == 0
    assert table.loc["mask", "pad_mass_baseline"] == pytest.approx(0.3) and table.loc["mask", "pad_mass_condition"] == 0
    assert table.loc["left padding", "flip_condition"] == pytest.approx(0.01)
    assert (table["p_holm"] >= table["p_value"]).all() and (table["n_pairs"] == 12).all()
    lower = ex.compare_conditions(_runs({"none/post/index/mean": 0.02}), n_resamples=199).set_index("name")
    assert lower.loc["mask", "verdict"] == "lower"


def test_compare_conditions_waits_for_enough_seeds_and_pairs_runs_on_one_kind_of_device():
    few = _runs({"none/post/index/mean": -0.02}, n_seeds=4)
    table = ex.compare_conditions(few, min_pairs=5, n_resamples=199)
    assert (table["verdict"] == "not yet answered").all() and table["p_holm"].isna().all()
    answered = ex.compare_conditions(few, min_pairs=4, n_resamples=199).set_index("name").loc["mask"]
    # answered, and the interval excludes zero, but four seeds cannot pass Holm's correction over the family (the
    # smallest Wilcoxon p on 4 pairs is 2 / 2^4); as the one comparison, primary, the interval decides
    assert answered["ci_low"] > 0 and answered["verdict"] == "not resolved after Holm's correction"
    alone = ex.compare_conditions(few, (ex.COMPARISONS[0]._replace(primary=True),), min_pairs=4, n_resamples=199)
    assert alone["verdict"].tolist() == ["higher"] and alone["p_holm"].isna().all()
    one = ex.compare_conditions(few[few.seed == 0], n_resamples=199)
    assert (one["n_pairs"] == 1).all() and one["mean_diff"].isna().all()
    gpu = _runs({}, n_seeds=3, device="NVIDIA H100 80GB HBM3")
    mixed = pd.concat([few, gpu], ignore_index=True)          # the same seeds on a GPU do not pair with CPU runs
    assert (ex.compare_conditions(mixed, n_resamples=199)["n_pairs"] == 4).all()


def test_compare_conditions_errors():
    frame = _runs({}, n_seeds=3)
    with pytest.raises(ValueError, match=r"frame lacks the columns \['readout'\]"):
        ex.compare_conditions(frame.drop(columns="readout"))
    with pytest.raises(ValueError, match=r"runs occur twice: \[\['masked/post/index/mean', 0\]\]"):
        ex.compare_conditions(pd.concat([frame, frame.iloc[:1]], ignore_index=True))


def _answer(*rows):
    return pd.DataFrame(rows, columns=["name", "verdict", "n_pairs", "mean_diff", "ci_low", "ci_high"])


def test_answer_text_gives_one_effect_and_its_interval_per_resolved_comparison():
    answer = _answer(("mask", "no difference resolved", 20, 0.0019, -0.0010, 0.0054),
                     ("left padding", "no difference resolved", 20, 0.0, 0.0, 0.0),        # zero, equal bounds
                     ("first-token readout", "lower", 20, -0.0177, -0.0282, -0.0095))
    assert ex.answer_text(answer) == (
        "The first-token readout lowered test accuracy by 1.77 points (95% interval 0.95 to 2.82). "   # negated
        "With 20 paired runs, no difference in test accuracy was resolved for the mask or left padding.")
    raised = ex.answer_text(_answer(("mask", "higher", 12, 0.01, 0.01, 0.01)))                # equal bounds
    assert raised == "The mask raised test accuracy by 1.00 points (95% interval 1.00 to 1.00)."
    mixed = ex.answer_text(_answer(("mask", "no difference resolved", 10, 0.0, -0.01, 0.01),
                                   ("position fix", "no difference resolved", 12, 0.0, -0.01, 0.01)))
    assert mixed.endswith("With 10 or more paired runs, no difference in test accuracy was resolved for the mask "
                          "or position fix.")
    one = ex.answer_text(_answer(("mask", "no difference resolved", 1, 0.0, 0.0, 0.0)))          # one seed, one name
    assert one == "With 1 paired run, no difference in test accuracy was resolved for the mask."


def test_answer_text_for_unanswered_and_corrected_comparisons():
    one_seed = _answer(("mask", "not yet answered", 1, np.nan, np.nan, np.nan))
    assert ex.answer_text(one_seed) == f"The mask has fewer than {MIN_PAIRS} paired runs, too few for a verdict."
    two = _answer(("mask", "not yet answered", 4, 0.01, 0.0, 0.02), ("readout", "not yet answered", 4, 0.0, 0, 0))
    assert ex.answer_text(two, min_pairs=5) == ("The mask and readout have fewer than 5 paired runs, too few for "
                                                "a verdict.")
    holm = _answer(("mask", "not resolved after Holm's correction", 4, 0.02, 0.01, 0.03))
    assert ex.answer_text(holm) == ("For the mask, the interval excludes zero, but the correction for several "
                                    "comparisons does not confirm a difference.")
    with pytest.raises(ValueError, match="answer is empty"):
        ex.answer_text(_answer())


def test_answer_text_names_no_test_and_no_seed():
    every = _answer(("mask", "higher", 20, 0.01, 0.005, 0.02), ("left padding", "no difference resolved", 20, 0, -1, 1),
                    ("position fix", "not resolved after Holm's correction", 4, 0.02, 0.01, 0.03),
                    ("readout", "not yet answered", 1, np.nan, np.nan, np.nan))
    text = ex.answer_text(every).lower()
    for word in ("seed", "holm", "wilcoxon", "bootstrap", "p-value", " ci "):
        assert word not in text


# ------------------------------------------------------------------------- the page's tables (chapter 8)
def test_condition_label_names_each_condition_once():
    labels = [ex.condition_label(c) for c in ex.conditions()]
    assert len(set(labels)) == len(labels) == 5
    assert ex.condition_label({"mask": "masked", "padding": "pre", "positions": "first_token", "readout": "mean"}) \
        == "mask, left padding, positions: from the mask"


def test_results_table_gives_mean_interval_flips_and_runs():
    runs = _runs({"masked/pre/index/mean": 0.01}, n_seeds=3)
    runs["flip_rate_in"] = np.where(runs.apply(ex.condition_id, axis=1) == "masked/pre/index/mean", 0.05, 0.0)
    table = ex.results_table(runs).set_index("condition")
    assert list(table.columns) == ["test accuracy (%)", "95% interval", "predictions that flip (%)", "runs"]
    assert table.index[0] == "mask, right padding" and (table["runs"] == 3).all()
    left = table.loc["mask, left padding, positions: array index"]
    want = 100 * runs[runs.apply(ex.condition_id, axis=1) == "masked/pre/index/mean"].test_accuracy.mean()
    assert left["test accuracy (%)"] == f"{want:.1f}" and left["predictions that flip (%)"] == "5.0"
    assert table.loc["mask, right padding", "predictions that flip (%)"] == "0"
    one = ex.results_table(runs[runs.seed == 0])                         # one run: no interval
    assert (one["95% interval"] == "–").all() and (one["runs"] == 1).all()
    with pytest.raises(ValueError, match=r"runs lacks the columns \['flip_rate_in'\]"):
        ex.results_table(runs.drop(columns="flip_rate_in"))
    with pytest.raises(ValueError, match="no runs"):
        ex.results_table(runs[runs["mask"] == "masked"])


def test_empty_row_word_at_its_edges():
    bias = torch.tensor([0.5, -1.0])
    assert ex.empty_row_word(torch.full((3, 2), float("nan"))) == "NaN"
    assert ex.empty_row_word(torch.tensor([[float("nan"), 0.0]])) == "partly NaN"
    assert ex.empty_row_word(torch.zeros(3, 2), bias) == "zeros"
    assert ex.empty_row_word(bias.expand(3, 2).clone(), bias) == "the output bias"
    assert ex.empty_row_word(bias.expand(3, 2).clone()) == "finite values"
    assert ex.empty_row_word(bias + 1e-3, bias) == "finite values"


def test_mha_empty_row_table_against_sdpa_and_the_bias():
    """Where the table says "the output bias", SDPA gives the empty row zeros and ``out_proj`` adds its bias;
    a real row never reads as the bias. The NaN cells are torch's own (pytorch issue #160064)."""
    table = ex.mha_empty_row_table()
    assert list(table.index) == ["training", "eval", "eval, no_grad (fast path)"]
    assert list(table.columns) == ["need_weights=True", "need_weights=False"]
    words = {"NaN", "partly NaN", "zeros", "the output bias", "finite values"}
    assert set(table.to_numpy().ravel()) <= words
    q = torch.randn(1, 1, 3, 4, dtype=torch.float64)
    empty = F.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(1, 1, 1, 3, dtype=torch.bool))
    assert (empty == 0).all()                      # the zeros that out_proj turns into its bias (PyTorch >= 2.5)
    assert table.loc["training", "need_weights=False"] == "the output bias"


def test_device_sentence_explains_a_machine_that_differs_from_each_run():
    text = ex.device_sentence(["CPU (1 threads, x86_64)"] * 3, 100, threads=1, workers=2,
                              machine="CPU (2 threads, x86_64)")
    assert text.startswith("All 100 runs ran on one kind of device (CPU (1 thread, x86_64))")
    assert "1 threads" not in text
    assert "Each run used 1 thread and 2 runs ran at a time" in text
    assert text.endswith("wrote the record, CPU (2 threads, x86_64).")


def test_device_sentence_edge_values():
    one = ex.device_sentence(["CPU (1 thread, x86_64)"], 1, threads=1, workers=1, machine="CPU (1 thread, x86_64)")
    assert one == ("The one run ran on one kind of device (CPU (1 thread, x86_64)), so every pair is a pair "
                   "on the same device.")
    unrecorded = ex.device_sentence(["CPU (1 thread, x86_64)"], 5, machine="CPU (2 threads, x86_64)")
    assert "Each run" not in unrecorded
    two = ex.device_sentence(["NVIDIA H100 80GB HBM3", "CPU (1 threads, x86_64)"], 10)
    assert two.startswith("The runs ran on 2 kinds of device (CPU (1 thread, x86_64) and NVIDIA H100 80GB HBM3)")


@pytest.mark.parametrize("devices, n_runs, message", [([], 3, "devices is empty"),
                                                      (["CPU (1 thread, x86_64)"], 0, "n_runs must be at least 1")])
def test_device_sentence_errors(devices, n_runs, message):
    with pytest.raises(ValueError, match=message):
        ex.device_sentence(devices, n_runs)
