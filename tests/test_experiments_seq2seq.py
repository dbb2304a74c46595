"""The command line of chapter 4's translation experiment as a results store (attnbook.store): a run is one model
with one seed, stored with its per-length rows and its history as soon as it is evaluated; killed, cut or refused
runs; seeds added later. The CLI's basic output is tested in tests/test_translation.py."""

import json
import os
import signal
import time
from dataclasses import asdict, replace

import numpy as np
import pandas as pd
import pytest

from test_store import check_resumed, cut_last_line, kill_after_rows

from attnbook.experiments import seq2seq as ex
from attnbook.seq2seq import MODEL_KINDS

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = replace(ex.Seq2SeqConfig.quick(), n_train=300, n_valid=20, n_test=30, epochs=1, hidden_size=16, embed_size=8,
               max_decode_len=8, beam_size=2)
N_BUCKETS = len(TINY.length_edges) + 1


_DATA = {}


@pytest.fixture()
def tiny(monkeypatch):
    """Tiny models; the prepared data are made once per data configuration (3 s each on a busy 2-core machine)."""
    monkeypatch.setattr(ex.Seq2SeqConfig, "quick", classmethod(lambda cls: TINY))
    real = ex.Seq2SeqConfig.data

    def cached(cfg):
        key = (cfg.max_src_len, cfg.max_tgt_len, cfg.n_train, cfg.n_valid, cfg.n_test, cfg.min_freq,
               cfg.max_src_vocab, cfg.max_tgt_vocab, cfg.covered_only, cfg.split_seed)
        if key not in _DATA:
            _DATA[key] = real(cfg)
        return _DATA[key]

    monkeypatch.setattr(ex.Seq2SeqConfig, "data", cached)


def _argv(out, *more):
    return ["--mode", "quick", "--out", str(out), "--device", "cpu", *more]


def _check_side_tables(out, models, seeds=(0,)):
    """Every run's side rows are there exactly once."""
    by_length = pd.read_csv(out.with_name(out.stem + "_by_length.csv"))
    history = pd.read_csv(out.with_name(out.stem + "_history.csv"))
    runs = {(m, s) for m in models for s in seeds}
    assert by_length.groupby(["model", "seed"]).size().to_dict() == {r: N_BUCKETS for r in runs}
    assert not by_length.duplicated(["model", "seed", "length"]).any()
    assert history.groupby(["model", "seed"]).size().to_dict() == {r: TINY.epochs for r in runs}


def test_a_killed_run_resumes_without_losing_or_doubling_a_model(tmp_path, tiny):
    out = tmp_path / "s.csv"
    code, before = kill_after_rows("attnbook.experiments.seq2seq", TINY, _argv(out), out, rows=2)
    assert code == -signal.SIGKILL
    ex.main(_argv(out))
    frame = check_resumed(out, before, ["model", "seed"], expected=len(MODEL_KINDS))
    assert sorted(frame.model) == sorted(MODEL_KINDS)
    _check_side_tables(out, MODEL_KINDS)
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "finished"]      # the SIGKILLed session, as the next saw it


def test_a_cut_last_row_is_set_aside_and_its_model_retrained(tmp_path, tiny, capsys):
    out = tmp_path / "s.csv"
    models = ["none", "bahdanau"]
    ex.main(_argv(out, "--models", *models))
    whole = pd.read_csv(out)
    cut_last_line(out)
    before = out.read_bytes()
    ex.main(_argv(out, "--models", *models))
    err = capsys.readouterr().err
    assert "set aside a damaged last line" in err and "dropped" in err     # bahdanau's side rows go, then return
    frame = check_resumed(out, before, ["model", "seed"], expected=2)
    _check_side_tables(out, models)
    columns = ["model", "parameters", "valid_loss", "token_acc", "bleu_greedy", "bleu_beam"]
    pd.testing.assert_frame_equal(frame[columns], whole[columns])       # seeded: the same model, retrained


def test_models_and_threads_choose_runs_without_changing_the_configuration(tmp_path, tiny, monkeypatch):
    out = tmp_path / "s.csv"
    ex.main(_argv(out, "--models", "none"))
    monkeypatch.setattr(ex.Seq2SeqConfig, "quick", classmethod(lambda cls: replace(TINY, num_threads=None)))
    ex.main(_argv(out, "--models", "none", "bahdanau"))
    assert pd.read_csv(out).model.tolist() == ["none", "bahdanau"]
    _check_side_tables(out, ["none", "bahdanau"])
    with pytest.raises(SystemExit):
        ex.main(_argv(out, "--models", "none", "--epochs", "2"))


def test_seeds_are_runs_and_more_can_be_added(tmp_path, tiny):
    """The chapter's stored comparison: several models at several seeds, BLEU per length bucket for every run; a
    later call with more seeds trains only the new runs, and a seed is a different model, not a copy."""
    out = tmp_path / "s.csv"
    ex.main(_argv(out, "--models", "none", "bahdanau", "--seeds", "2"))
    first = pd.read_csv(out)
    assert list(zip(first.model, first.seed)) == [("none", 0), ("bahdanau", 0), ("none", 1), ("bahdanau", 1)]
    ex.main(_argv(out, "--models", "none", "bahdanau", "--seeds", "3", "--workers", "2"))
    frame = pd.read_csv(out)
    pd.testing.assert_frame_equal(frame.iloc[:4], first)                       # the stored runs stay as they were
    assert sorted(zip(frame.model, frame.seed)) == sorted((m, s) for m in ("none", "bahdanau") for s in range(3))
    _check_side_tables(out, ["none", "bahdanau"], seeds=range(3))
    by_length = pd.read_csv(out.with_name("s_by_length.csv"))
    assert by_length.length.unique().tolist()[-1] == f"{TINY.length_edges[-1] + 1}+"   # the longest sentences
    none = frame[frame.model == "none"].set_index("seed")
    assert none.valid_loss.nunique() == 3                                      # seeded differently
    record = json.loads(out.with_suffix(".json").read_text())
    assert [s["status"] for s in record["sessions"]] == ["finished", "finished"]
    assert record["config"]["luong_scaled"] is True and record["config"]["lr_schedule"] == "constant"


@pytest.mark.parametrize("argv,message", [
    (["--epochs", "0"], "argument --epochs: must be an integer >= 1, got '0'"),
    (["--n-train", "-5"], "argument --n-train: must be an integer >= 1, got '-5'"),
    (["--workers", "0"], "argument --workers: must be an integer >= 1, got '0'"),
    (["--seeds", "0"], "argument --seeds: must be an integer >= 1, got '0'"),
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    (["--device", "gpu"], "argument --device: 'gpu' is not a torch device"),
    (["--out", "s.json"], "argument --out: must name a .csv file"),
])
def test_bad_arguments_fail_before_the_data_load(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ex.Seq2SeqConfig, "data", lambda self: pytest.fail("the data were loaded"))
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--mode", "quick", "--out", "s.csv", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_sigterm_ends_the_command_line_with_143(tmp_path, tiny, monkeypatch):
    def terminated(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(ex, "_store_task", terminated)
    with pytest.raises(SystemExit) as exit_info:
        ex.main(_argv(tmp_path / "s.csv"))
    assert exit_info.value.code == 143
    assert json.loads((tmp_path / "s.json").read_text())["sessions"][-1]["status"] == "interrupted"


def test_cpu_preset_is_full_modes_data_at_smaller_sizes(tmp_path, monkeypatch):
    full, cpu = ex.Seq2SeqConfig.full(), ex.Seq2SeqConfig.cpu()
    # the same pairs, split, test sentences and length groups as full mode: only the sizes differ
    data_fields = ("max_src_len", "max_tgt_len", "n_train", "n_valid", "n_test", "min_freq", "covered_only",
                   "split_seed", "length_edges", "beam_size", "length_penalty", "max_decode_len", "seeds",
                   "luong_scaled")
    assert all(getattr(cpu, k) == getattr(full, k) for k in data_fields)
    assert (cpu.max_src_vocab, cpu.max_tgt_vocab, cpu.embed_size, cpu.hidden_size, cpu.attention_size) == \
        (6_000, 8_000, 128, 256, 256)
    assert (cpu.epochs, cpu.lr, cpu.lr_schedule, cpu.batch_size, cpu.num_threads) == (3, 3e-3, "constant", 64, 1)
    # a preset by name, and a class variable rather than a field: no part of a run's configuration
    assert ex.Seq2SeqConfig.for_mode("cpu") == cpu and "extra_presets" not in asdict(cpu)
    # --mode cpu chooses it, and the data are not loaded before the arguments are checked
    monkeypatch.chdir(tmp_path)
    seen = {}

    def record(self):
        seen["cfg"] = self
        raise SystemExit(7)

    monkeypatch.setattr(ex.Seq2SeqConfig, "data", record)
    with pytest.raises(SystemExit):
        ex.main(["--mode", "cpu", "--out", "s.csv", "--device", "cpu", "--models", "none"])
    assert replace(seen["cfg"], models=cpu.models, seeds=cpu.seeds) == cpu


def test_stored_status_says_missing_used_or_which_entries_differ():
    cfg = ex.Seq2SeqConfig.quick()
    assert ex.stored_status(None, asdict(cfg)) == "missing"
    made = {**asdict(cfg), "seeds": [0, 1, 2], "num_threads": 2}        # entries that only choose runs or threads
    stored = ex.StoredRuns(pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), {"config": made})
    assert ex.stored_status(stored, asdict(cfg)) == "used"
    assert ex.stored_status(stored, asdict(replace(cfg, hidden_size=96, lr=1e-3))) == \
        "differs in ['hidden_size', 'lr']"
    assert stored.usable_for(asdict(replace(cfg, epochs=3))) == "differs in ['epochs']"


# ------------------------------------------------------------------------------------------------- length gap
def _by_length(values: dict) -> pd.DataFrame:
    """by_length rows from {(model, seed): [value of group 1-4, 5-9, 10+]}; the 10+ group of seed 9 is empty."""
    rows = []
    for (model, seed), row in values.items():
        for group, value in zip(("1-4", "5-9", "10+"), row):
            rows.append({"length": group, "sentences": 5, "bleu_greedy": value, "token_acc": value / 100,
                         "model": model, "seed": seed})
    return pd.DataFrame(rows)


def test_length_gap_change_is_the_change_of_the_paired_advantage():
    by_length = _by_length({("none", 0): [40, 30, 10], ("bahdanau", 0): [45, 40, 30],
                            ("none", 1): [42, 31, 20], ("bahdanau", 1): [44, 35, 21],
                            ("luong-general", 0): [0, 0, 0], ("bahdanau", 2): [50, 40, 30]})
    change = ex.length_gap_change(by_length, "bleu_greedy")
    # seed 0: (30 - 10) - (45 - 40) = 15; seed 1: (21 - 20) - (44 - 42) = -1; seed 2 has no baseline
    assert change.to_dict() == {0: 15, 1: -1} and change.name == "bleu_greedy"
    # the same number is none's drop from the first to the last group minus Bahdanau's: (40 - 10) - (45 - 30)
    assert change[0] == (40 - 10) - (45 - 30)
    assert ex.length_gap_change(by_length, first="5-9", last="10+").round(6).to_dict() == {0: 0.1, 1: -0.03}
    # luong-general's (0, 0, 0) against Bahdanau's (45, 40, 30): (0 - 30) - (0 - 45), in token accuracy
    change = ex.length_gap_change(by_length, model="luong-general", baseline="bahdanau")
    assert change.to_dict() == {0: pytest.approx(0.15)}


def test_length_gap_change_skips_empty_groups_and_missing_models():
    by_length = _by_length({("none", 0): [40, 30, 10], ("bahdanau", 0): [45, 40, 30]})
    by_length.loc[by_length["length"] == "10+", "sentences"] = 0
    assert ex.length_gap_change(by_length, "bleu_greedy").to_dict() == {0: (40 - 30) - (45 - 40)}
    only = by_length[by_length["model"] == "bahdanau"]
    assert ex.length_gap_change(only, "bleu_greedy").empty


def test_length_gap_change_is_empty_without_two_groups_to_compare():
    by_length = _by_length({("none", 0): [40, 30, 10], ("bahdanau", 0): [45, 40, 30]})
    assert ex.length_gap_change(by_length.iloc[:0]).empty
    none_filled = by_length.assign(sentences=0)
    assert ex.length_gap_change(none_filled).empty
    one_filled = by_length.assign(sentences=(by_length["length"] == "5-9").astype(int))
    assert ex.length_gap_change(one_filled).empty                  # first == last: nothing to measure
    assert ex.length_gap_change(by_length, first="5-9", last="5-9").empty


def test_length_gap_change_refuses_bad_input():
    by_length = _by_length({("none", 0): [40, 30, 10], ("bahdanau", 0): [45, 40, 30]})
    with pytest.raises(ValueError, match=r"lacks the columns \['sentences'\]"):
        ex.length_gap_change(by_length.drop(columns="sentences"))
    with pytest.raises(ValueError, match="rows twice"):
        ex.length_gap_change(pd.concat([by_length, by_length.iloc[:1]]))
    with pytest.raises(ValueError, match=r"last='31\+' is not a length group"):
        ex.length_gap_change(by_length, last="31+")


NAN = float("nan")
CORRECTED, NOT_YET = "not resolved after Holm's correction", "not yet answered"


@pytest.mark.parametrize("verdict, diff, words", [
    ("higher", 6.7, "higher than the baseline"),
    ("lower", -1.0, "lower than the baseline"),
    ("no difference resolved", 0.0, "within the run-to-run noise of the baseline"),
    (CORRECTED, 3.3, "higher than the baseline on average (shown for information, not tested)"),
    (CORRECTED, -0.2, "lower than the baseline on average (shown for information, not tested)"),
    (NOT_YET, NAN, "not yet compared with the baseline"),
])
def test_verdict_words_name_no_test_and_no_seed(verdict, diff, words):
    assert ex.verdict_words(verdict, diff, "the baseline") == words
    assert "seed" not in words and "Holm" not in words


def test_verdict_words_refuse_an_unknown_verdict_or_a_missing_difference():
    with pytest.raises(ValueError, match="verdict must be one of"):
        ex.verdict_words("beyond seed noise", 1.0, "B")
    with pytest.raises(ValueError, match="mean_diff is NaN"):
        ex.verdict_words(CORRECTED, NAN, "B")


def _row(verdict, diff, low, high, n=3):
    return {"verdict": verdict, "mean_diff": diff, "ci_low": low, "ci_high": high, "n_pairs": n}


def test_paired_sentence_carries_one_effect_and_its_interval():
    assert ex.paired_sentence("bahdanau's model", "the model without attention", _row("higher", 6.72, 6.51, 6.84)) == (
        "Bahdanau's model scores higher than the model without attention: +6.7 BLEU (95% interval +6.5 to +6.8).")
    assert ex.paired_sentence("Luong general", "Bahdanau's model", _row("lower", -1.0, -1.7, -0.6)) == (
        "Luong general scores lower than Bahdanau's model: -1.0 BLEU (95% interval -1.7 to -0.6).")
    # a value that rounds to zero is +0.0, never -0.0
    assert ex.paired_sentence("A", "B", _row("no difference resolved", -0.04, -0.3, 0.2)) == (
        "A scores within the run-to-run noise of B: +0.0 BLEU (95% interval -0.3 to +0.2).")
    assert ex.paired_sentence("A", "B", _row("higher", 0.0123, 0.0104, 0.0141), unit="", digits=3) == (
        "A scores higher than B: +0.012 (95% interval +0.010 to +0.014).")
    assert ex.paired_sentence("A", "B", _row("higher", 2.0, 2.0, 2.0)) == (            # equal bounds
        "A scores higher than B: +2.0 BLEU (both 95% bounds round to +2.0).")
    assert ex.paired_sentence("A", "B", _row(NOT_YET, 2.0, NAN, NAN, n=1)) == (
        "A is not yet compared with B: 1 paired run, too few.")
    assert ex.paired_sentence("A", "B", _row(NOT_YET, NAN, NAN, NAN, n=0)) == (
        "A is not yet compared with B: no paired run, too few.")


def test_interval_words():
    assert ex.interval_words(6.5, 6.8) == "95% interval +6.5 to +6.8"
    assert ex.interval_words(0.0, 0.0) == "both 95% bounds round to +0.0"
    assert ex.interval_words(6.71, 6.74) == "both 95% bounds round to +6.7"
    assert ex.interval_words(-0.0123, 0.0456, digits=3) == "95% interval -0.012 to +0.046"
    assert ex.interval_words(NAN, NAN) == "no interval from one run"


@pytest.mark.parametrize("change, low, high, n, words", [
    (0.08, 0.07, 0.11, 3, "grows"),
    (-0.5, -0.9, -0.1, 3, "shrinks"),
    (-1.3, -5.4, 0.9, 3, "does not change resolvably"),
    (0.0, 0.0, 0.0, 3, "does not change resolvably"),
    (0.2, 0.2, 0.2, 3, "grows"),                                  # equal bounds above zero
    (0.2, 0.1, 0.3, 2, "is not yet measured over enough runs"),   # below the rule's three runs
    (0.2, NAN, NAN, 1, "is not yet measured over enough runs"),
])
def test_change_verdict_follows_the_one_rule_at_its_edges(change, low, high, n, words):
    assert ex.change_verdict(change, low, high, n) == words


@pytest.mark.parametrize("call", [
    lambda: ex.paired_sentence("A", "B", _row("higher", NAN, NAN, NAN)),
    lambda: ex.change_verdict(NAN, NAN, NAN, 3),
])
def test_templates_refuse_a_missing_difference(call):
    with pytest.raises(ValueError, match="mean_diff is NaN"):
        call()


def test_templates_refuse_half_an_interval_or_reversed_bounds():
    with pytest.raises(ValueError, match="give both bounds or neither"):
        ex.paired_sentence("A", "B", _row("higher", 1.0, NAN, 2.0))
    with pytest.raises(ValueError, match="give both bounds or neither"):
        ex.interval_words(0.5, NAN)
    with pytest.raises(ValueError, match=r"ci_low=2.0 is above ci_high=1.0"):
        ex.change_verdict(1.5, 2.0, 1.0, 3)


# ----------------------------------------------------------------------------------------------- comparisons
def _runs(values):
    """{model: [value per seed]} as one row per model and seed."""
    return pd.DataFrame([{"model": m, "seed": s, "bleu_greedy": v, "bleu_beam": v + 1.0}
                         for m, vs in values.items() for s, v in enumerate(vs)])


def test_compare_decides_by_the_one_rule():
    """The primary pair by its 95% interval; a secondary pair with three runs cannot pass Holm's correction
    (Wilcoxon's smallest two-sided p on three pairs is 0.25); two runs are too few."""
    import scipy.stats

    runs = _runs({"none": [30.0, 31.0, 29.5], "bahdanau": [41.0, 40.5, 41.5], "luong-dot": [44.0, 43.0, 45.0]})
    table = ex.compare(runs, ex.ATTENTION_PAIRS[:2] + (ex.Pair("luong-dot", "bahdanau"),)).set_index("condition")
    row = table.loc["bahdanau"]
    assert row.verdict == "higher" and row.n_pairs == 3 and row.primary
    assert row.mean_diff == pytest.approx(np.mean([11.0, 9.5, 12.0]))
    assert row.p_value == pytest.approx(scipy.stats.wilcoxon([11.0, 9.5, 12.0]).pvalue)
    assert (table.loc[["luong-dot"], "verdict"] == CORRECTED).all()
    two = ex.compare(runs[runs.seed < 2], ex.LAYER_PAIRS[:0] + (ex.Pair("bahdanau", "none", True),))
    assert two.verdict.iloc[0] == NOT_YET


def test_decoding_runs_pairs_beam_with_greedy():
    runs = _runs({"none": [30.0, 31.0, 29.5], "bahdanau": [41.0, 40.5, 41.5]})
    long = ex.decoding_runs(runs)
    assert len(long) == 12 and set(long.model) == {"none, greedy", "none, beam", "bahdanau, greedy", "bahdanau, beam"}
    table = ex.compare(long, ex.BEAM_PAIRS[:2], value="bleu")
    assert table.mean_diff.tolist() == pytest.approx([1.0, 1.0])
    assert table.verdict.iloc[0] == "higher"
    with pytest.raises(ValueError, match=r"lacks the columns \['bleu_beam'\]"):
        ex.decoding_runs(runs.drop(columns="bleu_beam"))


def test_runs_behind_chapter_refuse_a_missing_or_different_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="no stored runs 'nothing'"):
        ex.runs_behind_chapter("nothing", start=tmp_path)
    with pytest.raises(ValueError, match="made with another configuration: differs in"):
        ex.runs_behind_chapter(config=replace(ex.Seq2SeqConfig.quick(), epochs=3))


def test_paper_tables_show_the_papers_numbers_and_ours():
    table = ex.paper_bleu_table({"none": 30.0, "bahdanau": 41.0})
    assert table.loc[table.model == "RNNsearch-50", "BLEU"].item() == 26.75
    assert table.model.tolist()[-2:] == ["no attention", "Bahdanau"]
    sizes = {"train_pairs": 35_000, "src_vocab": 1000, "tgt_vocab": 1500, "test_pairs": 900, "test_sources": 600}
    settings = ex.settings_table(ex.Seq2SeqConfig.quick(), sizes, 1.04)
    assert settings.loc["training", "this chapter"].startswith("about 1.0 minutes per model on a CPU")


# ----------------------------------------------------------------------------------------------- figures
def test_figures_use_the_readers_names_and_the_runs_spread():
    import matplotlib

    matplotlib.use("Agg")
    runs = _runs({"none": [30.0, 31.0, 29.5], "bahdanau": [41.0, 40.5, 41.5]})
    ax = ex.plot_bleu(runs, beam_size=4, order=["none", "bahdanau"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["no attention", "Bahdanau"]
    from matplotlib.container import BarContainer

    greedy = [c for c in ax.containers if isinstance(c, BarContainer)][0]
    assert [b.get_height() for b in greedy.patches] == pytest.approx([30.166667, 41.0])
    segments = np.array(greedy.errorbar.lines[2][0].get_segments())      # (bar, [low, high], [x, y])
    assert segments[:, 0, 1].tolist() == pytest.approx([29.5, 40.5])        # the lowest run
    assert segments[:, 1, 1].tolist() == pytest.approx([31.0, 41.5])        # the highest run
    by_length = pd.DataFrame([{"model": m, "seed": s, "length": g, "sentences": n, "bleu_greedy": v}
                              for m in ("none", "bahdanau") for s in range(2)
                              for g, n, v in (("1-4", 10, 40.0 + s), ("5+", 0, 0.0))])
    ax = ex.plot_by_length(by_length, order=["none", "bahdanau"])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["no attention", "Bahdanau"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1-4\n(10)"]          # the empty group left out


def test_beam_tree_refuses_labels_that_do_not_match():
    steps = pd.DataFrame({"step": [1, 1], "rank": [0, 1], "parent": [0, 0], "score": [-0.1, -2.0],
                          "chosen": [True, False]})
    with pytest.raises(ValueError, match="1 labels for 2 rows of steps"):
        ex.beam_tree(steps, ["a"])
    with pytest.raises(ValueError, match=r"steps lacks the columns \['chosen'\]"):
        ex.beam_tree(steps.drop(columns="chosen"), ["a", "b"])
