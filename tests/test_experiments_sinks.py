"""Tests of the results store and the command line of chapter 9's sink experiment
(:mod:`attnbook.experiments.sinks`), on a tiny configuration: stored runs equal the in-memory grid exactly, an
interrupted grid resumes with only the missing runs, the command line refuses a store of another configuration and
runs the conditions of ``--only``, two workers give the numbers of one, and the chapter's reader of the stored
runs (:func:`read_runs`) and paired comparisons (:func:`compare_conditions`).

The module's own tests (the task, the model, the tidy frame) are in ``tests/test_sinks.py``."""

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from attnbook.evidence import MIN_PAIRS

from attnbook.experiments import sinks as ex
from attnbook.experiments.sinks import CONDITIONS, SinksConfig, run_grid

TINY = SinksConfig(n_symbols=8, n_values=3, max_keys=3, n_train=256, n_test=200, d_model=8, num_heads=2, hidden=8,
                   batch_size=64, epochs=1, seeds=(0, 1))
TIMING = ["train_time_s"]
KEYS = ["condition", "seed"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def live():
    """The in-memory grid of TINY: 4 conditions x 2 seeds."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    frame = run_grid(TINY, show_progress=False)
    torch.set_num_threads(before)
    return frame


@pytest.fixture()
def counted(monkeypatch):
    """The runs that train in this process, as (condition, seed)."""
    calls = []
    real = ex.run_one

    def counting(cfg, train, test, condition, seed, device="cpu"):
        calls.append((condition, seed))
        return real(cfg, train, test, condition, seed, device)

    monkeypatch.setattr(ex, "run_one", counting)
    return calls


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(SinksConfig, "quick", classmethod(lambda cls: TINY))


# ---------------------------------------------------------------- the store
def test_stored_runs_equal_the_in_memory_grid(tmp_path, live):
    out = tmp_path / "s.csv"
    stored = run_grid(TINY, out=out, device="cpu", show_progress=False)
    assert list(stored.columns) == [*live.columns, "device"] and stored["device"].str.startswith("CPU (1 thread,").all()
    pd.testing.assert_frame_equal(stored.drop(columns=[*TIMING, "device"]), live.drop(columns=TIMING),
                                  check_exact=True)
    runs = pd.read_csv(out)
    assert list(runs.columns) == list(ex.LAYOUT.columns) and len(runs) == len(CONDITIONS) * len(TINY.seeds)
    pd.testing.assert_frame_equal(runs.sort_values(KEYS).reset_index(drop=True).drop(columns=[*TIMING, "device"]),
                                  ex.per_run(live).sort_values(KEYS).reset_index(drop=True).drop(columns=TIMING),
                                  check_exact=True)
    # summarize works on what is read back: the side table
    groups = pd.read_csv(tmp_path / "s_groups.csv")
    assert list(groups.columns) == list(ex.GROUP_COLUMNS)
    pd.testing.assert_frame_equal(ex.summarize(groups), ex.summarize(live), check_exact=True)
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["config"] == json.loads(json.dumps(ex.store_config(TINY))) and meta["n_runs"] == 8
    assert meta["store"]["tables"] == {"groups": list(ex.GROUP_COLUMNS)}


def test_per_run_pools_match_and_no_match_rows(live):
    runs = ex.per_run(live)
    assert list(runs.columns) == [*KEYS, *ex.RESULT_COLUMNS] and len(runs) == 8
    one = live[(live.condition == "learned sink") & (live.seed == 1)]
    row = runs.set_index(KEYS).loc[("learned sink", 1)]
    for match, side in ((True, "match"), (False, "no_match")):
        part = one[one.match == match]
        assert row[f"accuracy_{side}"] == pytest.approx((part.accuracy * part.n).sum() / part.n.sum(), abs=1e-12)
        assert row[f"sink_weight_{side}"] == pytest.approx((part.sink_weight * part.n).sum() / part.n.sum())
    assert np.isnan(runs.set_index(KEYS).loc[("softmax", 0), "sink_weight_no_match"])


def test_an_interrupted_grid_resumes_with_only_the_missing_runs(tmp_path, counted, live):
    out = tmp_path / "s.csv"
    k = 3

    def stop_after_k(frame):
        if len(frame) == k:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(TINY, out=out, device="cpu", show_progress=False, on_run=stop_after_k)
    assert len(pd.read_csv(out)) == k and len(counted) == k
    first = list(counted)
    again = run_grid(TINY, out=out, device="cpu", show_progress=False)
    redone = counted[k:]
    everything = [(c, s) for s in TINY.seeds for c in CONDITIONS]
    assert sorted(first + redone) == sorted(everything)                 # only the missing ones, each once
    runs = pd.read_csv(out)
    assert not runs.duplicated(KEYS).any() and len(runs) == len(everything)
    groups = pd.read_csv(tmp_path / "s_groups.csv")
    assert len(groups) == len(live) and not groups.duplicated([*KEYS, "match", "n_keys"]).any()
    pd.testing.assert_frame_equal(again.drop(columns=[*TIMING, "device"]), live.drop(columns=TIMING),
                                  check_exact=True)
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [(s["status"], s["runs_added"]) for s in sessions] == [("interrupted", k), ("finished", 8 - k)]
    assert run_grid(TINY, out=out, device="cpu", show_progress=False).equals(again) and len(counted) == 8


def test_two_workers_give_the_numbers_of_one(live):
    only = ["softmax, pads unmasked", "learned sink"]      # two runs a worker: each in its own process
    two = run_grid(TINY, workers=2, only=only, show_progress=False)
    one = live[live.condition.isin(only)].reset_index(drop=True)
    assert len(two) == len(one) > 0
    pd.testing.assert_frame_equal(two.drop(columns=TIMING), one.drop(columns=TIMING), check_exact=True)


def test_conditions_and_only_choose_the_runs(live):
    both = run_grid(TINY, conditions=("learned sink", "softmax"), only=["softmax", "softmax_one"],
                    show_progress=False)
    assert both.condition.unique().tolist() == ["softmax"]
    with pytest.raises(ValueError, match=r"unknown conditions \['sparsemax'\]"):
        run_grid(TINY, only=["sparsemax"])


# ---------------------------------------------------------------- the command line
def test_main_writes_the_store_and_only_picks_conditions(tmp_path, tiny):
    out = tmp_path / "s.csv"
    frame = ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--seeds", "1",
                     "--only", "softmax_one,learned sink"])
    runs = pd.read_csv(out)
    assert sorted(runs.condition) == ["learned sink", "softmax_one"] and runs.seed.tolist() == [0, 0]
    assert runs.device.str.startswith("CPU (1 thread,").all()          # the CPU unless told otherwise
    assert set(frame.condition) == {"learned sink", "softmax_one"} and len(frame) == len(pd.read_csv(
        tmp_path / "s_groups.csv"))
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["n_runs"] == 2 and meta["sessions"][0]["status"] == "finished"
    assert meta["sessions"][0]["only"] == ["softmax_one", "learned sink"]


def test_main_refuses_unknown_conditions_and_a_store_of_another_configuration(tmp_path, tiny, monkeypatch,
                                                                              capsys):
    out = tmp_path / "s.csv"
    with pytest.raises(SystemExit) as stop:
        ex.main(["--only", "softmax,sparsemax", "--out", str(out)])
    assert stop.value.code == 2
    assert "--only names conditions that are not in the grid: ['sparsemax']" in capsys.readouterr().err
    ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu", "--seeds", "1",
             "--only", "softmax"])
    monkeypatch.setattr(SinksConfig, "quick", classmethod(lambda cls: replace(TINY, epochs=2, lr=0.1)))
    before = out.read_bytes()
    with pytest.raises(SystemExit) as stop:
        ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "another configuration (differs in ['epochs', 'lr'])" in err
    assert out.read_bytes() == before
    # threads and seeds only choose how and which runs are made: the same store resumes
    monkeypatch.setattr(SinksConfig, "quick", classmethod(lambda cls: TINY))
    ex.main(["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu", "--seeds", "2",
             "--threads", "2", "--only", "softmax"])
    assert sorted(pd.read_csv(out).seed) == [0, 1]


# ---------------------------------------------------------------- the chapter's reader and comparisons
def test_read_runs_uses_only_a_store_of_the_configuration(tmp_path):
    assert ex.read_runs(TINY, start=tmp_path) == (None, "missing")
    out = tmp_path / "results" / "sinks_full.csv"
    run_grid(replace(TINY, seeds=(0,)), only=["softmax"], out=out, device="cpu", show_progress=False)
    assert ex.read_runs(TINY, start=tmp_path) == (
        None, "incomplete: no runs of ['softmax, pads unmasked', 'softmax_one', 'learned sink']")
    run_grid(replace(TINY, seeds=(0,)), out=out, device="cpu", show_progress=False)
    stored, status = ex.read_runs(TINY, start=tmp_path / "chapters")      # found from a folder below, as a page
    assert status == "used" and stored.kind == "cpu" and len(stored.runs) == len(CONDITIONS)
    assert len(stored.groups) == len(CONDITIONS) * 2 * TINY.max_keys and stored.provenance["n_runs"] == 4
    assert stored.groups.condition.unique().tolist() == list(CONDITIONS)
    assert ex.read_runs(replace(TINY, seeds=(0, 1, 2), threads=2), start=tmp_path)[1] == "used"
    assert ex.read_runs(SinksConfig.full(), start=tmp_path) == (
        None, "differs in ['batch_size', 'd_model', 'epochs', 'hidden', 'max_keys', 'n_symbols', 'n_test', 'n_train', 'n_values']")
    (tmp_path / "results" / "sinks_full_groups.csv").unlink()
    assert ex.read_runs(TINY, start=tmp_path) == (None, "missing")


def test_read_runs_keeps_the_kind_of_device_with_more_runs(tmp_path):
    out = tmp_path / "results" / "sinks_full.csv"
    run_grid(TINY, out=out, device="cpu", show_progress=False)
    runs, groups = pd.read_csv(out), pd.read_csv(tmp_path / "results" / "sinks_full_groups.csv")
    gpu = "NVIDIA H100 80GB HBM3"
    pd.concat([runs, runs.iloc[:1].assign(device=gpu)]).to_csv(out, index=False)
    pd.concat([groups, groups[groups.seed == 0].assign(device=gpu)]).to_csv(out.with_name("sinks_full_groups.csv"),
                                                                              index=False)
    stored, _ = ex.read_runs(TINY, start=tmp_path)
    assert stored.kind == "cpu" and len(stored.runs) == 8 and (stored.groups.device != gpu).all()
    pd.concat([runs.iloc[:0], runs.iloc[:1].assign(device=gpu)]).to_csv(out, index=False)       # a GPU run only
    assert ex.read_runs(TINY, start=tmp_path)[1].startswith("incomplete: no runs of ['softmax, pads unmasked'")


def _runs(diff: float, n_seeds: int = 12) -> pd.DataFrame:
    """Synthetic runs: ``softmax_one`` and the learned sink are ``diff`` above the masked softmax on no-match
    rows, the unmasked pads equal it up to noise (differences that vary by seed: no ties)."""
    rng = np.random.default_rng(0)
    base = 0.6 + rng.normal(0, 0.03, n_seeds)
    lift = {"softmax": 0.0, "softmax, pads unmasked": 0.0, "softmax_one": diff, "learned sink": diff}
    return pd.DataFrame([{"condition": c, "seed": s, "device": "CPU (1 threads, x86_64)",
                          "accuracy_no_match": base[s] + lift[c] * (1 + 0.1 * s) + rng.normal(0, 0.003),
                          "pad_mass_no_match": 0.0, "sink_weight_no_match": 0.5 if lift[c] else np.nan}
                         for c in CONDITIONS for s in range(n_seeds)])


def test_compare_conditions_chooses_the_verdict_from_the_paired_interval():
    table = ex.compare_conditions(_runs(0.05), n_resamples=199).set_index("name")
    assert table.loc["softmax_one", "verdict"] == table.loc["learned sink", "verdict"] == "higher"
    assert table.loc["pads unmasked", "verdict"] == "no difference resolved"
    assert (table.n_pairs == 12).all() and table.loc["softmax_one", "sink_weight_condition"] == 0.5
    assert ex.compare_conditions(_runs(-0.05), n_resamples=199).set_index("name").loc[
        "learned sink", "verdict"] == "lower"
    few = ex.compare_conditions(_runs(0.05, n_seeds=3), min_pairs=4, n_resamples=199)
    assert set(few.verdict) == {"not yet answered"} and (few.n_pairs == 3).all()
    with pytest.raises(ValueError, match=r"frame lacks the columns \['accuracy_no_match'\]"):
        ex.compare_conditions(_runs(0.0).drop(columns="accuracy_no_match"))


def _row(verdict, n_pairs=10, diff=0.207, low=0.199, high=0.213, question="softmax_one against the masked softmax"):
    return pd.Series({"question": question, "verdict": verdict, "n_pairs": n_pairs, "mean_diff": diff,
                      "ci_low": low, "ci_high": high})


def test_comparison_sentence_gives_one_effect_and_its_interval():
    assert ex.comparison_sentence(_row("higher")) == (
        "Against the masked softmax, softmax_one raised no-match accuracy by 0.207 (95% interval 0.199 to 0.213).")
    lower = _row("lower", diff=-0.1, low=-0.15, high=-0.05, question="the learned sink against softmax_one")
    assert ex.comparison_sentence(lower) == (                                   # negated: a positive amount
        "Against softmax_one, the learned sink lowered no-match accuracy by 0.100 (95% interval 0.050 to 0.150).")
    equal = _row("higher", diff=0.02, low=0.02, high=0.02)                      # equal bounds
    assert ex.comparison_sentence(equal).endswith("by 0.020 (both 95% bounds round to 0.020).")
    zero = _row("no difference resolved", diff=0.0, low=0.0, high=0.0)         # zero
    assert ex.comparison_sentence(zero) == (
        "Against the masked softmax, softmax_one changed no-match accuracy by no amount that 10 paired runs resolve.")
    one = _row("not yet answered", n_pairs=1, diff=np.nan, low=np.nan, high=np.nan)   # one seed
    assert ex.comparison_sentence(one) == (
        f"Against the masked softmax, softmax_one: 1 paired run, too few for a verdict (it needs {MIN_PAIRS}).")
    holm = ex.comparison_sentence(_row("not resolved after Holm's correction", n_pairs=4), "accuracy")
    assert holm.startswith("Against the masked softmax, softmax_one moved accuracy by an amount whose interval")


def test_comparison_sentence_errors():
    with pytest.raises(ValueError, match="question must read 'X against Y'"):
        ex.comparison_sentence(_row("higher", question="softmax_one"))
    with pytest.raises(ValueError, match="verdict must be a verdict"):
        ex.comparison_sentence(_row("better"))
