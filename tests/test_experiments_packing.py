"""Tests of chapter 9's packing experiment (:mod:`attnbook.experiments.packing`) on a tiny configuration: the grid,
that a packed epoch holds every token of every review exactly once (and the same reviews per step as random padded
batches), that tokens per second count real tokens only, that a trained model reads packed rows as padded batches, the
resumable store of ``run_grid``, the command line and the paired comparisons.

The real reviews are used, but only 60 + 40 + 40 Rotten Tomatoes sentences (as chapter 8's tests)."""

import json
from dataclasses import fields, replace

import numpy as np
import pandas as pd
import pytest
import torch

from attnbook.batching import document_offsets
from attnbook.experiments import packing as ex
from attnbook.experiments.packing import (CONDITIONS, COMPARISONS, RESULT_COLUMNS, PackingConfig, condition_id,
                                          conditions, epoch_batches, prepare_data, run_grid, run_one)
from attnbook.experiments.transformer_padding import TransformerPaddingConfig

TINY = replace(PackingConfig.quick(), source="rotten_tomatoes", n_train=60, n_eval=40, max_len=40, vocab_size=500,
               d_model=8, nhead=2, num_layers=1, dim_feedforward=16, epochs=2, batch_size=20, seeds=(0, 1),
               eval_batch_size=40)
KEYS = ["condition", "seed"]
TIMING = ["train_time_s", "tokens_per_s"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data():
    return prepare_data(TINY)


@pytest.fixture(scope="module")
def rows(data):
    torch.set_num_threads(1)
    return {condition_id(c): run_one(TINY, data, c, seed=0, device="cpu") for c in conditions()}


# ---------------------------------------------------------------- the grid
def test_grid_and_comparisons():
    assert [condition_id(c) for c in conditions()] == list(CONDITIONS) == ["padded/random", "padded/bucketed",
                                                                           "packed"]
    assert all({c.condition, c.baseline} <= set(CONDITIONS) for c in COMPARISONS)
    assert ("packed", "padded/random") in {(c.condition, c.baseline) for c in COMPARISONS}


def test_presets():
    quick, full, chapter8 = PackingConfig.quick(), PackingConfig.full(), TransformerPaddingConfig.full()
    assert (quick.max_len, quick.n_train, quick.epochs, quick.seeds) == (256, 2_000, 1, (0, 1))
    assert all(getattr(full, f.name) == getattr(chapter8, f.name) for f in fields(chapter8))


@pytest.mark.parametrize("condition", [{"condition": "packed/bucketed"}, {"layout": "packed"}, "packed"])
def test_run_one_refuses_a_bad_condition(data, condition):
    with pytest.raises(ValueError, match="condition must be one of"):
        run_one(TINY, data, condition, seed=0)


# ---------------------------------------------------------------- the batches
def test_a_packed_epoch_holds_every_token_of_every_review_once(data):
    part = data["train"]
    for epoch in range(2):
        seen = {}
        for (ids, doc_ids), labels, n_tokens, n_slots in epoch_batches(part, {"condition": "packed"}, TINY, 3,
                                                                      epoch):
            assert ids.shape[1] <= TINY.max_len and n_slots == ids.numel()
            offsets, _ = document_offsets(doc_ids)
            tokens = ids[doc_ids >= 0]
            assert n_tokens == len(tokens) and len(labels) == len(offsets) - 1
            assert (ids[doc_ids < 0] == 0).all()
            # labels line up with the documents: recover each document's review by its tokens
            for d in range(len(offsets) - 1):
                piece = tokens[offsets[d] : offsets[d + 1]].tolist()
                match = [i for i in range(len(part["labels"])) if part["lengths"][i] == len(piece)
                         and part["ids"][i, : len(piece)].tolist() == piece and i not in seen]
                assert match, "a packed document is no review"
                seen[match[0]] = True
                assert labels[d] == part["labels"][match[0]]
        assert sorted(seen) == list(range(len(part["labels"])))       # every review, once


def test_packed_and_random_padded_batches_hold_the_same_reviews_per_step(data):
    part = data["train"]
    packed = list(epoch_batches(part, {"condition": "packed"}, TINY, 5, 1))
    padded = list(epoch_batches(part, {"condition": "padded/random"}, TINY, 5, 1))
    assert len(packed) == len(padded)
    for (_, p_labels, p_tokens, p_slots), ((ids, lengths), labels, tokens, slots) in zip(packed, padded):
        assert p_tokens == tokens == int(lengths.sum()) and sorted(p_labels.tolist()) == sorted(labels.tolist())
        assert p_slots <= slots == ids.numel()


# ---------------------------------------------------------------- one run
def test_a_row_has_every_column_and_counts_real_tokens_only(rows, data):
    tokens = TINY.epochs * int(data["train"]["lengths"].sum())
    for cid, row in rows.items():
        assert list(row) == ["condition", "seed", *RESULT_COLUMNS, "device"], cid
        assert row["condition"] == cid and row["device"].startswith("CPU") and row["nan_count"] == 0
        for key in ("test_accuracy", "val_accuracy"):
            assert 0 <= row[key] <= 1
        assert row["tokens_per_s"] * row["train_time_s"] == pytest.approx(tokens)     # real tokens, not pads
        assert 0 < row["pad_fraction"] < 1
        assert row["layout_logit_diff"] < 1e-4      # packed rows and padded batches: the same logits (fp32 rounding)
    assert rows["padded/bucketed"]["pad_fraction"] < rows["padded/random"]["pad_fraction"]
    assert rows["packed"]["pad_fraction"] < rows["padded/random"]["pad_fraction"]


def test_pad_fraction_is_the_share_of_pad_slots(rows, data):
    slots = sum(s for *_, s in epoch_batches(data["train"], {"condition": "packed"}, TINY, 0, 0))
    slots += sum(s for *_, s in epoch_batches(data["train"], {"condition": "packed"}, TINY, 0, 1))
    tokens = TINY.epochs * int(data["train"]["lengths"].sum())
    assert rows["packed"]["pad_fraction"] == pytest.approx(1 - tokens / slots)


# ---------------------------------------------------------------- the results store and the command line
@pytest.fixture()
def counted(monkeypatch):
    calls = []
    real = ex.run_one

    def counting(cfg, data, condition, seed, device="cpu"):
        calls.append((condition_id(condition), seed))
        return real(cfg, data, condition, seed, device)

    monkeypatch.setattr(ex, "run_one", counting)
    return calls


def test_run_grid_stores_and_resumes(tmp_path, data, counted):
    out = tmp_path / "p.csv"
    only = ["padded/random", "packed"]
    first = run_grid(TINY, data, out=out, device="cpu", show_progress=False, only=only)
    assert len(first) == len(counted) == 4 and list(pd.read_csv(out).columns) == list(ex.LAYOUT.columns)
    second = run_grid(TINY, None, out=out, device="cpu", show_progress=False)      # nothing loaded for the stored
    assert sorted(counted[4:]) == [("padded/bucketed", 0), ("padded/bucketed", 1)] and len(second) == 6
    pd.testing.assert_frame_equal(second[second.condition != "padded/bucketed"].reset_index(drop=True),
                                  first.sort_values(KEYS).reset_index(drop=True), check_dtype=False)
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["runs_added"] for s in sessions] == [4, 2]


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(PackingConfig, "quick", classmethod(lambda cls: TINY))


def test_main_writes_csv_and_provenance(tmp_path, tiny):
    out = tmp_path / "p.csv"
    frame = ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu", "--seeds", "1",
                     "--only", "packed"])
    assert len(frame) == 1 and frame.condition.tolist() == ["packed"] and len(pd.read_csv(out)) == 1
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["n_runs"] == 1 and meta["sessions"][0]["status"] == "finished" and meta["config"]["max_len"] == 40


def test_main_checks_its_arguments_before_loading_data(tmp_path, tiny, monkeypatch, capsys):
    def refuse(cfg):
        raise AssertionError("the data were loaded")

    monkeypatch.setattr(ex, "prepare_data", refuse)
    with pytest.raises(SystemExit):
        ex.main(["--only", "packed/greedy", "--out", str(tmp_path / "p.csv")])
    assert "--only names conditions that are not in the grid: ['packed/greedy']" in capsys.readouterr().err
    out = tmp_path / "p.csv"
    out.with_suffix(".json").write_text(json.dumps({"config": {"max_len": 1, "seeds": [0]}}))
    with pytest.raises(SystemExit):
        ex.main(["--mode", "quick", "--out", str(out), "--device", "cpu"])
    assert "another configuration" in capsys.readouterr().err


# ---------------------------------------------------------------- the comparisons
def _runs(diff: float, n_seeds=12, device="CPU (1 threads, x86_64)"):
    """Synthetic runs; paired differences that vary by seed (no ties: scipy's Wilcoxon stays exact and fast)."""
    rng = np.random.default_rng(0)
    noise, jitter = rng.normal(0, 0.02, n_seeds), rng.normal(0, 0.004, (len(CONDITIONS), n_seeds))
    return pd.DataFrame([{"condition": c, "seed": s,
                          "test_accuracy": 0.8 + noise[s] + jitter[k, s] + diff * (c == "packed") * (1 + 0.1 * s),
                          "tokens_per_s": 1000.0 * (1 + (c == "packed") + jitter[k, s]), "pad_fraction": 0.1,
                          "device": device}
                         for k, c in enumerate(CONDITIONS) for s in range(n_seeds)])


def test_compare_conditions_chooses_the_verdict_from_the_paired_interval():
    table = ex.compare_conditions(_runs(0.03), n_resamples=199).set_index("condition")
    assert table.loc["padded/bucketed", "verdict"] == "no difference resolved"
    packed = table.loc["packed"]
    assert (packed.verdict == ["higher", "higher"]).all() and (packed.n_pairs == 12).all()
    assert packed.tokens_per_s_condition.tolist() == [pytest.approx(2000, abs=5)] * 2
    speed = ex.compare_conditions(_runs(0.0), value="tokens_per_s", n_resamples=199)
    assert speed.verdict.tolist() == ["higher", "higher", "no difference resolved"]
    few = ex.compare_conditions(_runs(0.03, n_seeds=3), min_pairs=4, n_resamples=199)
    assert set(few.verdict) == {"not yet answered"}
    with pytest.raises(ValueError, match=r"frame lacks the columns \['test_accuracy'\]"):
        ex.compare_conditions(_runs(0.0).drop(columns="test_accuracy"))
