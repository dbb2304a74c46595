"""Smoke and consistency tests of chapter 5's masking experiments on a tiny configuration: the grids, one run's
metrics against what the model makes them (zero pad states, exact zero pad weights, token counts), determinism of
a seed, the resumable CSV of ``run_grid`` (skips, re-runs), the command line with its provenance, and joblib workers.

The real reviews are used, but only 60 + 40 + 40 Rotten Tomatoes sentences (they vary in length, so batches carry
padding; IMDB reviews cut to a few tokens would not)."""

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
import torch

from attnbook.experiments import masking as ex
from attnbook.experiments.masking import (RESULT_COLUMNS, MaskingConfig, condition_id, conditions, prepare_data,
                                          run_grid, run_one)
from attnbook.store import device_kind

TINY = replace(MaskingConfig.quick(), source="rotten_tomatoes", n_train=60, n_eval=40, max_len=40, epochs=1,
               batch_size=20, seeds=(0, 1), embed_size=8, hidden_size=4, attention_size=4, repad_to=60,
               eval_batch_size=40)
TIMING = ["train_time_s", "tokens_per_s"]
KEYS = ["pooling", "masking", "rnn_input", "batching", "precision", "seed"]


def cond(pooling="attention", masking="neg_inf", rnn_input="packed", batching="random", precision="fp32"):
    return dict(pooling=pooling, masking=masking, rnn_input=rnn_input, batching=batching, precision=precision)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return prepare_data(TINY)


@pytest.fixture(scope="module")
def rows(data):
    """One run per condition of interest, seed 0 (shared by several tests)."""
    wanted = [cond(), cond(masking="none"), cond(masking="additive"), cond(masking="renormalize"),
              cond(rnn_input="unpacked"), cond(pooling="mean", masking="-")]
    return {condition_id(c): run_one(TINY, data, c, seed=0, device="cpu") for c in wanted}


# ---------------------------------------------------------------- grids
def test_grid_sizes():
    assert len(conditions("chapter")) == 5
    assert len(conditions("core")) == 20
    assert len(conditions("full")) == 90  # 4 x 3 x 2 x 3 attention + 3 x 3 x 2 baselines


@pytest.mark.parametrize("grid", ["chapter", "core", "full"])
def test_grid_has_no_duplicates_and_valid_factors(grid):
    ids = [condition_id(c) for c in conditions(grid)]
    assert len(ids) == len(set(ids))
    for c in conditions(grid):
        assert set(c) == {"pooling", "masking", "rnn_input", "batching", "precision"}
        assert (c["masking"] == "-") == (c["pooling"] != "attention")
        assert c["pooling"] == "attention" or c["precision"] == "fp32"


def test_chapter_and_core_are_subsets_of_full():
    full = {condition_id(c) for c in conditions("full")}
    assert {condition_id(c) for c in conditions("core")} <= full
    assert {condition_id(c) for c in conditions("chapter")} <= full
    assert condition_id(cond()) == "attention/neg_inf/packed/random/fp32"


def test_unknown_grid():
    with pytest.raises(ValueError, match="grid must be 'chapter', 'core' or 'full', got 'tiny'"):
        conditions("tiny")


# ---------------------------------------------------------------- data
def test_prepare_data_shapes_and_padding(data):
    assert data["vocab_size"] > 4
    for name, n in [("train", 60), ("validation", 40), ("test", 40)]:
        part = data[name]
        assert part["ids"].shape == (n, 40) and part["ids"].dtype.name == "int32"
        assert part["lengths"].shape == part["labels"].shape == (n,)
        assert ((1 <= part["lengths"]) & (part["lengths"] <= 40)).all()
        assert set(part["labels"]) <= {0, 1}
        real = torch.arange(40) < torch.from_numpy(part["lengths"]).unsqueeze(1)
        assert torch.equal(torch.from_numpy(part["ids"]) != 0, real)  # right-padded with 0, no 0 inside a review
    assert data["train"]["lengths"].min() < data["train"]["lengths"].max()  # the batches carry padding


# ---------------------------------------------------------------- one run
def test_run_one_row_has_every_column(rows):
    for cid, row in rows.items():
        assert list(row)[:6] == KEYS and set(RESULT_COLUMNS) <= set(row) and "device" in row
        for column in ("test_accuracy", "val_accuracy", "pad_mass", "flip_rate", "padding_fraction", "tokens_per_s",
                       "train_time_s"):
            assert math.isfinite(row[column]), (cid, column)
        assert 0 <= row["test_accuracy"] <= 1 and 0 <= row["val_accuracy"] <= 1 and 0 <= row["flip_rate"] <= 1
        assert row["nan_count"] == 0
        assert 0 < row["padding_fraction"] < 1


def test_tokens_per_second_counts_the_real_training_tokens(rows, data):
    tokens = TINY.epochs * int(data["train"]["lengths"].sum())
    for row in rows.values():
        assert row["tokens_per_s"] * row["train_time_s"] == pytest.approx(tokens, rel=1e-9)


def test_masked_packed_run_gives_pads_nothing_and_never_flips(rows):
    for masking in ("neg_inf", "additive", "renormalize"):
        row = rows[condition_id(cond(masking=masking))]
        assert row["pad_mass"] == pytest.approx(0, abs=1e-12) and row["flip_rate"] == 0
    assert rows[condition_id(cond())]["pad_mass"] == 0  # exactly, for -inf


def test_in_distribution_flip_rate(rows):
    """No pads against pads up to the training maximum: a packed encoder with any correct mask (and the masked mean)
    never flips, while the stress test and the in-distribution test are both shares of the test set."""
    for masking in ("neg_inf", "additive", "renormalize"):
        assert rows[condition_id(cond(masking=masking))]["flip_rate_in"] == 0
    assert rows[condition_id(cond(pooling="mean", masking="-"))]["flip_rate_in"] == 0
    for row in rows.values():
        assert 0 <= row["flip_rate_in"] <= 1


def test_exact_length_batches_hold_no_pad():
    import numpy as np

    lengths = np.array([3, 1, 3, 2, 3, 1, 3])
    batches = ex._exact_length_batches(lengths, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(7))
    assert all(len(set(lengths[b])) == 1 and len(b) <= 3 for b in batches)
    assert [lengths[b[0]] for b in batches] == [1, 2, 3, 3]


def test_store_upgrades_a_file_without_the_added_columns(tmp_path, data, two_conditions):
    """A file written before ``flip_rate_in`` existed is rewritten with the column (NaN for its runs), its runs are
    kept byte for byte in value, and the new runs append under the one header."""
    out = tmp_path / "r.csv"
    first = run_grid(replace(TINY, seeds=(0,)), data, out=out, device="cpu", show_progress=False)
    pd.read_csv(out).drop(columns=list(ex.ADDED_COLUMNS)).to_csv(out, index=False)
    calls = len(two_conditions)
    frame = run_grid(TINY, data, out=out, device="cpu", show_progress=False)
    stored = pd.read_csv(out)
    assert len(two_conditions) == calls + 2 and len(frame) == len(stored) == 4
    assert list(stored.columns) == ex._columns()
    assert stored[stored.seed == 0].flip_rate_in.isna().all() and stored[stored.seed == 1].flip_rate_in.notna().all()
    old = stored[stored.seed == 0].drop(columns=["flip_rate_in"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(old, first.drop(columns=["flip_rate_in"]).reset_index(drop=True),
                                  check_dtype=False)


def test_store_refuses_a_file_with_another_header(tmp_path, data, two_conditions):
    out = tmp_path / "r.csv"
    pd.DataFrame({"pooling": ["attention"], "seed": [0], "accuracy": [0.5]}).to_csv(out, index=False)
    with pytest.raises(ValueError, match=r"header that does not match.*unknown \['accuracy'\]"):
        run_grid(TINY, data, out=out, device="cpu", show_progress=False)
    assert not two_conditions


def test_unmasked_run_puts_attention_on_pads(rows):
    assert rows[condition_id(cond(masking="none"))]["pad_mass"] > 0.01


def test_packed_pad_score_is_the_zero_state_score(rows):
    """Pad states of a packed encoder are exactly 0, so every pad scores tanh(b) . u_w."""
    for masking in ("none", "neg_inf"):
        row = rows[condition_id(cond(masking=masking))]
        assert math.isfinite(row["zero_state_score"])
        assert row["pad_score_mean"] == pytest.approx(row["zero_state_score"], abs=1e-6)
        assert 0 <= row["real_below_zero_state"] <= 1 and row["real_score_std"] > 0
    unpacked = rows[condition_id(cond(rnn_input="unpacked"))]
    assert unpacked["pad_mass"] == 0  # masked
    assert abs(unpacked["pad_score_mean"] - unpacked["zero_state_score"]) > 1e-4  # the GRU moved the pad states


@pytest.mark.parametrize("rnn_input", ["packed", "unpacked"])
def test_score_statistics_come_from_the_evaluated_states(data, rnn_input):
    """``_evaluate`` catches the encoder states of its forward pass with a hook: the score statistics equal those of
    an explicit second encoder pass, the predictions are the model's, and no hook is left on the model."""
    import numpy as np

    from attnbook.models import BiGRUClassifier, padding_mask

    condition = cond(masking="none", rnn_input=rnn_input)
    side = ex._side(condition)
    torch.manual_seed(0)
    model = BiGRUClassifier(data["vocab_size"], TINY.embed_size, TINY.hidden_size, TINY.attention_size,
                            masking="none", packed=rnn_input == "packed", padding_side=side).eval()
    out = ex._evaluate(model, data["test"], condition, TINY, torch.device("cpu"))
    assert not model.encoder._forward_hooks
    ids, lengths, _ = ex._batch(data["test"], np.arange(len(data["test"]["labels"])), side, None)
    with torch.no_grad():
        scores = model.pooling.attention.scores(model.encoder(model.embedding(ids), lengths))
        preds = model(ids, lengths)[0].argmax(-1).numpy()
    real = scores[padding_mask(lengths, ids.shape[1], side)]
    assert out["real_score_mean"] == pytest.approx(float(real.mean()), rel=1e-5)
    assert out["real_score_std"] == pytest.approx(float(real.std(unbiased=False)), rel=1e-5)
    assert (out["preds"] == preds).all()


def test_baseline_has_no_score_statistics(rows):
    row = rows[condition_id(cond(pooling="mean", masking="-"))]
    assert row["pad_mass"] == 0 and row["flip_rate"] == 0
    for column in ("zero_state_score", "pad_score_mean", "real_score_mean", "real_score_std", "real_below_zero_state"):
        assert math.isnan(row[column])


def test_equivalent_masks_give_paired_runs(rows):
    """Same seed, same initial weights and batches: -inf, additive and renormalized masks train the same model up to
    rounding."""
    reference = rows[condition_id(cond())]
    for masking in ("additive", "renormalize"):
        row = rows[condition_id(cond(masking=masking))]
        assert row["real_score_mean"] == pytest.approx(reference["real_score_mean"], rel=1e-4)
        assert row["padding_fraction"] == reference["padding_fraction"]


def test_same_seed_same_row(rows, data):
    again = run_one(TINY, data, cond(masking="none"), seed=0, device="cpu")
    first = rows[condition_id(cond(masking="none"))]
    for key, value in first.items():
        if key not in TIMING:
            same = again[key] == value or (isinstance(value, float) and math.isnan(value) and math.isnan(again[key]))
            assert same, key
    other = run_one(TINY, data, cond(masking="none"), seed=1, device="cpu")
    assert other["real_score_mean"] != first["real_score_mean"]


# ---------------------------------------------------------------- run_grid: resumable CSV
@pytest.fixture()
def two_conditions(monkeypatch):
    """A grid of 2 conditions (one with masking 'none', one baseline with '-': both must survive the CSV round trip)
    and a counter of the runs actually trained."""
    chosen = [cond(masking="none"), cond(pooling="mean", masking="-")]
    monkeypatch.setattr(ex, "conditions", lambda grid: [dict(c) for c in chosen])
    calls = []
    real_run_one = ex.run_one

    def counting(cfg, data, condition, seed, device="cpu"):
        calls.append((condition_id(condition), seed))
        return real_run_one(cfg, data, condition, seed, device)

    monkeypatch.setattr(ex, "run_one", counting)
    return calls


def _metrics(frame):
    return frame.drop(columns=TIMING).sort_values(KEYS).reset_index(drop=True)


def test_run_grid_writes_skips_and_resumes(tmp_path, data, two_conditions):
    calls, out = two_conditions, tmp_path / "r.csv"
    first = run_grid(TINY, data, out=out, device="cpu", show_progress=False)
    assert len(calls) == 4 and len(first) == 4
    order = list(first[KEYS].itertuples(index=False, name=None))
    assert order == sorted(order)
    stored = pd.read_csv(out)
    assert len(stored) == 4 and not stored.duplicated(["pooling", "masking", "seed"]).any()
    assert set(stored.masking) == {"none", "-"}

    second = run_grid(TINY, data, out=out, device="cpu", show_progress=False)
    assert len(calls) == 4  # nothing new trained
    assert len(second) == 4 and len(pd.read_csv(out)) == 4
    pd.testing.assert_frame_equal(_metrics(second), _metrics(first), check_dtype=False)

    kept = stored[~((stored.masking == "none") & (stored.seed == 1))]  # lose one run
    kept.to_csv(out, index=False)
    third = run_grid(TINY, data, out=out, device="cpu", show_progress=False)
    assert calls[4:] == [(condition_id(cond(masking="none")), 1)]
    final = pd.read_csv(out)
    assert len(third) == len(final) == 4 and not final.duplicated(["pooling", "masking", "seed"]).any()
    pd.testing.assert_frame_equal(_metrics(third), _metrics(first), check_dtype=False)


def test_a_gpu_twin_does_not_stand_in_for_a_cpu_run(tmp_path, data, two_conditions):
    """A run is (condition, seed, kind of device): runs stored from a GPU do not make a CPU resume skip its own."""
    calls, out, cfg = two_conditions, tmp_path / "r.csv", replace(TINY, seeds=(0,))
    run_grid(cfg, data, out=out, device="cpu", show_progress=False)
    pd.read_csv(out).assign(device="NVIDIA H100 80GB HBM3").to_csv(out, index=False)   # as if made on a GPU
    frame = run_grid(cfg, data, out=out, device="cpu", show_progress=False)
    assert len(calls) == 4 and len(frame) == len(pd.read_csv(out)) == 4
    assert sorted(frame.device.map(device_kind)) == ["cpu", "cpu", "gpu", "gpu"]


def test_run_grid_with_two_workers_matches_one(tmp_path, data, two_conditions):
    """joblib (loky) workers: the same rows as in this process. Most of the time is the workers' start-up."""
    cfg = replace(TINY, seeds=(1,))
    one = run_grid(cfg, data, device="cpu", show_progress=False)
    two = run_grid(cfg, data, workers=2, out=tmp_path / "w.csv", device="cpu", show_progress=False)
    assert len(two) == len(pd.read_csv(tmp_path / "w.csv")) == 2
    pd.testing.assert_frame_equal(_metrics(two), _metrics(one), check_dtype=False)


# ---------------------------------------------------------------- the command line
def test_main_writes_csv_and_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(MaskingConfig, "quick", classmethod(lambda cls: TINY))
    out = tmp_path / "m.csv"
    argv = ["--mode", "quick", "--seeds", "1", "--out", str(out), "--no-progress", "--device", "cpu"]
    frame = ex.main(argv)
    assert len(frame) == 5 and set(frame.seed) == {0}
    stored = pd.read_csv(out)
    assert len(stored) == 5
    assert set(stored.apply(condition_id, axis=1)) == {condition_id(c) for c in conditions("chapter")}
    meta = json.loads(out.with_suffix(".json").read_text())
    for key in ("device", "torch", "commit", "date_utc", "wall_time_s", "sessions", "n_seeds_complete"):
        assert key in meta, key
    assert meta["n_seeds_complete"] == 1 and meta["n_runs"] == 5 and meta["torch"] == torch.__version__
    assert meta["config"]["seeds"] == [0] and meta["config"]["source"] == "rotten_tomatoes"
    assert len(meta["sessions"]) == 1 and meta["sessions"][0]["date_utc"] == meta["date_utc"]
    assert meta["sessions"][0]["status"] == "finished" and meta["sessions"][0]["interrupted"] is False

    again = ex.main(argv)  # resumes: nothing new, one more session
    meta = json.loads(out.with_suffix(".json").read_text())
    assert len(again) == 5 and len(pd.read_csv(out)) == 5
    assert len(meta["sessions"]) == 2
    assert meta["total_wall_time_s"] == pytest.approx(sum(s["wall_time_s"] for s in meta["sessions"]), abs=0.02)


def test_main_only_rejects_conditions_outside_the_grid(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ex.main(["--mode", "quick", "--only", "attention/none/packed/bucketed/fp32", "--out", str(tmp_path / "m.csv")])
    assert "not in the 'chapter' grid" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_main_refuses_to_resume_with_another_configuration(tmp_path, capsys):
    out = tmp_path / "m.csv"
    out.with_suffix(".json").write_text(json.dumps({"config": {"max_len": 1, "seeds": [0]}}))
    with pytest.raises(SystemExit):
        ex.main(["--mode", "quick", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert "another configuration" in err and "max_len" in err


def test_main_writes_provenance_when_interrupted_and_exits_130(tmp_path, monkeypatch):
    out = tmp_path / "m.csv"

    def interrupted_grid(cfg, *, out, **kwargs):
        out.append({"pooling": "mean", "masking": "-", "rnn_input": "packed", "batching": "random",
                    "precision": "fp32", "seed": 0, "test_accuracy": 0.5})
        raise KeyboardInterrupt

    monkeypatch.setattr(ex, "run_grid", interrupted_grid)
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu"])
    assert exit_info.value.code == 130
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["n_runs"] == 1 and meta["sessions"][-1]["interrupted"] is True
    assert meta["sessions"][-1]["status"] == "interrupted" and meta["sessions"][-1]["runs_added"] == 1
    assert len(pd.read_csv(out)) == 1


def test_main_checkpoints_provenance_after_every_run(tmp_path, monkeypatch):
    """A run killed without notice (SIGKILL, a machine that goes away) still leaves a record of its session, up to
    its last finished run, marked as running; a session that fails is recorded as failed."""
    out = tmp_path / "m.csv"
    out.with_suffix(".json").write_text(json.dumps({"sessions": [{"wall_time_s": 10.0, "note": "an earlier one"}]}))
    row = {"pooling": "mean", "masking": "-", "rnn_input": "packed", "batching": "random", "precision": "fp32",
           "test_accuracy": 0.5}
    seen = []

    def failing_grid(cfg, *, out, on_run, **kwargs):
        for seed in (0, 1):
            out.append(dict(row, seed=seed))
            on_run(out.frame())
            seen.append(json.loads(out.sidecar.read_text()))
        raise RuntimeError("the GPU fell off the bus")

    monkeypatch.setattr(ex, "run_grid", failing_grid)
    with pytest.raises(RuntimeError, match="the GPU fell off the bus"):
        ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu"])
    assert [m["n_runs"] for m in seen] == [1, 2]
    for meta in seen:
        assert len(meta["sessions"]) == 2 and meta["sessions"][0]["note"] == "an earlier one"
        assert meta["sessions"][-1]["status"] == "running" and meta["sessions"][-1]["interrupted"] is True
        assert meta["total_wall_time_s"] == pytest.approx(10.0 + meta["sessions"][-1]["wall_time_s"], abs=0.02)
    final = json.loads(out.with_suffix(".json").read_text())
    assert final["sessions"][-1]["status"] == "failed" and final["n_runs"] == 2
    assert final["sessions"][-1]["error"] == "RuntimeError: the GPU fell off the bus"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith((".partial", ".tmp"))]


def test_run_grid_reports_every_finished_run(tmp_path, data, two_conditions):
    counts = []
    run_grid(replace(TINY, seeds=(0,)), data, out=tmp_path / "r.csv", device="cpu", show_progress=False,
             on_run=lambda frame: counts.append(len(frame)))
    assert counts == [1, 2]


def test_worker_task_runs_on_writable_copies(monkeypatch):
    """joblib gives workers read-only memory maps; each run gets writable copies (torch.from_numpy warns otherwise)."""
    import numpy as np

    ids = np.arange(6, dtype=np.int32).reshape(2, 3)
    ids.flags.writeable = False
    data = {"vocab_size": 7, "train": {"ids": ids, "lengths": np.array([3, 2])}}
    seen = {}
    monkeypatch.setattr(ex, "run_one", lambda cfg, d, condition, seed, device: seen.setdefault("data", d))
    ex._task(None, data, {}, 0, "cpu")
    copied = seen["data"]["train"]["ids"]
    assert copied.flags.writeable and (copied == ids).all() and seen["data"]["vocab_size"] == 7
    assert not ids.flags.writeable          # the caller's array is left alone


def test_complete_seeds_count_the_only_conditions_when_given():
    """With ``--only`` a seed is complete when it ran in every named condition, not in every condition of the grid."""
    none, neg = cond(masking="none"), cond(masking="neg_inf")
    frame = pd.DataFrame([dict(none, seed=0), dict(neg, seed=0), dict(none, seed=1)])
    only = [condition_id(none), condition_id(neg)]
    assert ex._complete_seeds(frame, TINY, only) == 1
    assert ex._complete_seeds(frame, TINY) == 0                # the "chapter" grid has 5 conditions
    assert ex._complete_seeds(frame.iloc[:0], TINY, only) == 0


@pytest.mark.parametrize("masking", ["none", "neg_inf"])
def test_packed_unpadded_predictions_equal_batches_of_one_length(data, masking):
    """The packed shortcut (encoder on sorted batches, pooling per review) predicts as the unpacked path's batches
    of reviews of one length, which hold no pad at all (for "none" the pads would change the pooled vector)."""
    from attnbook.models import BiGRUClassifier

    condition = cond(masking=masking)
    torch.manual_seed(0)
    model = BiGRUClassifier(data["vocab_size"], TINY.embed_size, TINY.hidden_size, TINY.attention_size,
                            masking=masking).eval()
    fast = ex._unpadded_predictions(model, data["test"], condition, TINY, torch.device("cpu"))
    model.encoder.packed = False  # same weights, exact-length batches: no pad is ever read
    slow = ex._unpadded_predictions(model, data["test"], condition, TINY, torch.device("cpu"))
    model.encoder.packed = True
    assert (fast == slow).all() and len(fast) == len(data["test"]["labels"])


def test_masking_data_pins_the_legacy_tokenization(monkeypatch):
    """MaskingConfig.normalize_apostrophes (default False, the value of the stored runs) reaches the tokenizer, and a
    provenance record written before the setting existed counts as that legacy value on resume."""
    seen = []
    real = ex.encode

    def spy(texts, vocab, max_len, *, normalize_apostrophes=True):
        seen.append(normalize_apostrophes)
        return real(texts, vocab, max_len, normalize_apostrophes=normalize_apostrophes)

    monkeypatch.setattr(ex, "encode", spy)
    prepare_data(TINY)
    assert seen == [False, False, False]
    prepare_data(replace(TINY, normalize_apostrophes=True))
    assert seen[3:] == [True, True, True]
    assert ex.LEGACY_CONFIG == {"normalize_apostrophes": False} and not MaskingConfig().normalize_apostrophes


# ---------------------------------------------------------------- the results store of the command line
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from test_store import check_resumed, cut_last_line, kill_after_rows  # noqa: E402

from attnbook.store import merge  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CENTRAL = "attention/none/packed/random/fp32,attention/neg_inf/packed/random/fp32"


def _argv(out, *more):
    return ["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu", *more]


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(MaskingConfig, "quick", classmethod(lambda cls: TINY))


@pytest.fixture()
def no_data(monkeypatch):
    """Fail the test if a run would load the reviews."""
    def refuse(cfg):
        raise AssertionError("the data were loaded")

    monkeypatch.setattr(ex, "prepare_data", refuse)


def test_a_killed_run_resumes_without_losing_or_doubling_a_run(tmp_path, tiny):
    """A real command line, SIGKILLed once 2 of its 10 runs are stored, then resumed."""
    out = tmp_path / "m.csv"
    code, before = kill_after_rows("attnbook.experiments.masking", TINY, _argv(out), out, rows=2)
    assert code == -signal.SIGKILL
    killed = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in killed] == ["running"]
    ex.main(_argv(out))
    frame = check_resumed(out, before, KEYS, expected=10)
    assert set(frame.apply(condition_id, axis=1)) == {condition_id(c) for c in conditions("chapter")}
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "finished"]      # the SIGKILLed session, as the next saw it
    assert sessions[1]["runs_added"] == 10 - (before.count(b"\n") - 1)      # the runs that were not stored


def test_a_cut_last_row_is_set_aside_and_its_run_redone(tmp_path, tiny, capsys):
    out = tmp_path / "m.csv"
    ex.main(_argv(out, "--seeds", "1"))
    whole = pd.read_csv(out)
    line = cut_last_line(out)
    before = out.read_bytes()
    ex.main(_argv(out, "--seeds", "1"))
    assert "set aside a damaged last line" in capsys.readouterr().err
    frame = check_resumed(out, before, KEYS, expected=5)
    (aside,) = tmp_path.glob("m.csv.damaged-*")
    assert aside.read_bytes() == line[: len(line) // 2]
    pd.testing.assert_frame_equal(_metrics(frame), _metrics(whole), check_dtype=False)   # the same run, redone


def test_an_interrupted_command_line_exits_143(tmp_path):
    """``python -m`` itself, stopped with SIGTERM while it works: exit status 143, the session recorded."""
    out = tmp_path / "m.csv"
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO / "code")}
    process = subprocess.Popen([sys.executable, "-m", "attnbook.experiments.masking", *_argv(out),
                                "--source", "rotten_tomatoes", "--seeds", "1", "--threads", "1"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not out.with_suffix(".json").exists():
            assert process.poll() is None, process.stderr.read().decode()
            __import__("time").sleep(0.01)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 143
    finally:
        if process.poll() is None:
            process.kill()
    assert "interrupted (SIGTERM)" in process.stderr.read().decode()
    assert json.loads(out.with_suffix(".json").read_text())["sessions"][-1]["status"] == "interrupted"


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "-1"], "argument --seeds: must be an integer >= 1, got '-1'"),
    (["--seeds", "0"], "argument --seeds: must be an integer >= 1, got '0'"),
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    (["--workers", "0"], "argument --workers: must be an integer >= 1, got '0'"),
    (["--device", "gpu"], "argument --device: 'gpu' is not a torch device"),
    (["--out", "results.json"], "argument --out: must name a .csv file"),
])
def test_bad_arguments_fail_at_once_with_one_line(tmp_path, monkeypatch, capsys, no_data, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--mode", "quick", "--out", "m.csv", "--no-progress", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.strip().splitlines()[-1].startswith("python -m")
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_fails_at_once(tmp_path, capsys, no_data):
    with pytest.raises(SystemExit):
        ex.main(_argv(tmp_path / "m.csv")[:-2] + ["--device", "cuda"])
    assert "argument --device: 'cuda': CUDA is not available on this machine" in capsys.readouterr().err


def test_threads_workers_and_device_do_not_count_as_configuration(tmp_path, tiny):
    out = tmp_path / "m.csv"
    ex.main(_argv(out, "--seeds", "1", "--threads", "1", "--only", CENTRAL))
    frame = ex.main(_argv(out, "--seeds", "1", "--threads", "2", "--workers", "2", "--only", CENTRAL))
    assert len(frame) == len(pd.read_csv(out)) == 2
    assert len(json.loads(out.with_suffix(".json").read_text())["sessions"]) == 2


def test_runs_without_their_record_are_not_resumed(tmp_path, monkeypatch, capsys, no_data):
    """The sidecar is the only record of the configuration: without it, a file made from Rotten Tomatoes would be
    resumed with IMDB."""
    out = tmp_path / "m.csv"
    pd.DataFrame([dict(cond(), seed=0, test_accuracy=0.5)]).reindex(columns=ex._columns()).to_csv(out, index=False)
    with pytest.raises(SystemExit):
        ex.main(_argv(out, "--source", "imdb"))
    assert "holds 1 finished runs but their provenance record m.json is missing" in capsys.readouterr().err


def test_a_second_process_on_the_same_out_is_refused(tmp_path, capsys, no_data):
    out = tmp_path / "m.csv"
    with ex.open_store(out, MaskingConfig.quick()):
        with pytest.raises(SystemExit):
            ex.main(_argv(out))
    assert "another process is writing to" in capsys.readouterr().err


def _committed(tmp_path):
    for suffix in (".csv", ".json"):
        shutil.copy(REPO / "results" / f"masking_full{suffix}", tmp_path / f"masking_full{suffix}")
    return tmp_path / "masking_full.csv"


def test_the_committed_results_open_and_resume(tmp_path, no_data):
    """results/masking_full.csv and .json, as stored, pass the guard with --mode full --grid core (their sidecar
    records threads=1, which does not count), keep every value and session, and gain one session."""
    out = _committed(tmp_path)
    original = pd.read_csv(out, dtype=str, keep_default_na=False)
    meta = json.loads(out.with_suffix(".json").read_text())
    with ex.open_store(out, replace(MaskingConfig.full(), grid="core", threads=4)) as store:
        assert store.n_runs == len(original)
    stored = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(stored.columns) == ex._columns()
    pd.testing.assert_frame_equal(stored[list(original.columns)], original)
    frame = ex.main(["--mode", "full", "--grid", "core", "--only", CENTRAL, "--out", str(out), "--device", "cpu",
                     "--no-progress"])                  # every central run is stored: nothing to train
    assert len(frame) == len(original) and len(pd.read_csv(out)) == len(original)
    after = json.loads(out.with_suffix(".json").read_text())
    # every earlier session is kept; one left "running" by a killed process is now recorded as "killed"
    earlier = [dict(x, status="killed", interrupted=True) if x.get("status") == "running" else x
               for x in meta["sessions"]]
    assert after["sessions"][:-1] == earlier and after["sessions"][-1]["runs_added"] == 0
    legacy = {**ex.LEGACY_CONFIG, **meta["config"]}      # settings added since read as their legacy value
    assert after["config"] == {k: legacy[k] for k in after["config"]}
    assert after["total_wall_time_s"] == pytest.approx(meta["total_wall_time_s"] + after["sessions"][-1]["wall_time_s"],
                                                       abs=0.02)


def test_runs_made_elsewhere_are_merged(tmp_path, tiny):
    gpu, main_out = tmp_path / "gpu.csv", tmp_path / "main.csv"
    ex.main(_argv(main_out, "--seeds", "1", "--only", CENTRAL))
    ex.main(_argv(gpu, "--seeds", "2", "--only", CENTRAL))
    assert merge(gpu, main_out) == {"added": 2, "skipped": 2, "sessions": 1}
    stored = pd.read_csv(main_out)
    assert len(stored) == 4 and not stored.duplicated(KEYS).any()
    pd.testing.assert_frame_equal(_metrics(stored), _metrics(pd.read_csv(gpu)), check_dtype=False)
    sessions = json.loads(main_out.with_suffix(".json").read_text())["sessions"]
    assert len(sessions) == 2 and sessions[1]["merged_from"] == str(gpu.resolve())
    with pytest.raises(ValueError, match=r"another configuration \(differs in \[.*'max_len'"):
        merge(gpu, _committed(tmp_path))               # tiny runs never join the full-mode results


def test_gpu_runs_merge_into_the_committed_results(tmp_path):
    """What merge is for: runs of the full-mode core grid made elsewhere join results/masking_full.csv (a copy);
    the run both hold is skipped, the new one and the GPU twin of a stored CPU run are appended (a run's kind of
    device is part of its identity), and the other store's session is recorded."""
    from attnbook.store import Session

    out = _committed(tmp_path)
    committed = pd.read_csv(out)
    gpu = tmp_path / "masking_gpu.csv"
    cpu_only = committed.device.map(device_kind).eq("cpu") & committed.seed.eq(19)     # no GPU twin stored
    shared = committed[cpu_only].iloc[0].to_dict()
    new = {**shared, "masking": "additive", "rnn_input": "unpacked", "batching": "bucketed", "seed": 19,
           "device": "NVIDIA H100 80GB HBM3"}
    with ex.open_store(gpu, replace(MaskingConfig.full(), grid="core")) as store, \
            Session(store, lambda wall: {"device": "NVIDIA H100 80GB HBM3"}, cli=False):
        store.append(shared)
        store.append({**shared, "device": "NVIDIA H100 80GB HBM3"})
        store.append(new)
    assert merge(gpu, out) == {"added": 2, "skipped": 1, "sessions": 1}
    merged = pd.read_csv(out)
    merged["kind"] = merged.device.map(device_kind)
    assert len(merged) == len(committed) + 2 and not merged.duplicated([*KEYS, "kind"]).any()
    assert merged.duplicated(KEYS).sum() == committed.duplicated(KEYS).sum() + 1          # one more twin
    assert merged.iloc[-2].device == "NVIDIA H100 80GB HBM3"
    assert merged.iloc[-1].device == "NVIDIA H100 80GB HBM3" and merged.iloc[-1].seed == 19
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert sessions[-1]["device"] == "NVIDIA H100 80GB HBM3" and sessions[-1]["merged_from"] == str(gpu.resolve())


# ---------------------------------------------------------------- train_model and padding_sweep (the mechanism)
def test_train_model_is_the_model_run_one_measures(data):
    """The same seed gives the same weights as run_one's model: its zero-state score is the row's."""
    model = ex.train_model(TINY, data, cond(masking="none"), seed=0)
    row = run_one(TINY, data, cond(masking="none"), seed=0, device="cpu")
    assert not model.training
    assert model.pooling.attention.zero_state_score() == pytest.approx(row["zero_state_score"])


def test_padding_sweep_shrinks_by_one_minus_pi_and_masked_never_flips(data):
    """Unmasked: pad mass grows with the width and the pooled vector's length is (1 - pi) of the unpadded one
    (Eq. eq-pad-mass); masked: no pad weight, no length change, no flip."""
    widths = [TINY.max_len, 4 * TINY.max_len, 64 * TINY.max_len]
    none = ex.padding_sweep(ex.train_model(TINY, data, cond(masking="none"), seed=0), data["test"], widths)
    assert none.width.tolist() == [0, *widths]
    assert none.pad_mass.is_monotonic_increasing and none.pad_mass.iloc[-1] > 0.5
    assert none.max_shrink_error.max() < 1e-4
    assert none.norm_ratio.tolist() == pytest.approx(none.one_minus_pi.tolist(), abs=1e-4)
    assert none.flip_rate.iloc[0] == 0.0
    masked = ex.padding_sweep(ex.train_model(TINY, data, cond(), seed=0), data["test"], widths)
    assert (masked.pad_mass == 0).all() and (masked.flip_rate == 0).all()
    assert masked.norm_ratio.tolist() == pytest.approx([1.0] * 4, abs=1e-5)


def test_padding_sweep_refuses_unpacked_models_and_short_widths(data):
    unpacked = ex.train_model(TINY, data, cond(rnn_input="unpacked"), seed=0)
    with pytest.raises(ValueError, match="packed encoder"):
        ex.padding_sweep(unpacked, data["test"], [TINY.max_len])
    packed = ex.train_model(TINY, data, cond(), seed=0)
    longest = int(data["test"]["lengths"].max())
    with pytest.raises(ValueError, match=f"longest review \\({longest}\\)"):
        ex.padding_sweep(packed, data["test"], [longest - 1])
