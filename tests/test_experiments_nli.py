"""The command line of chapter 6's experiments as a results store (attnbook.store): a run is one model on one data
set; killed and cut runs, data sets checked before training, bad arguments. The CLI's basic output is tested in
tests/test_nli.py."""

import importlib.util
import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from test_store import check_resumed, cut_last_line, kill_after_rows

from attnbook.experiments import nli as ex

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ex.NLIConfig(n_train=90, n_valid=30, n_test=30, hidden_size=8, epochs=2, batch_size=32, pad_lengths=(7, 12))
KEYS = ["data", "model"]
MODELS = [name for name, _, _ in ex.MODELS]
FIXTURE = Path(__file__).parent / "fixtures" / "snli_tiny.jsonl"


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(ex.NLIConfig, "quick", classmethod(lambda cls: TINY))


@pytest.fixture()
def snli_dir(tmp_path):
    folder = tmp_path / "snli"
    folder.mkdir()
    for name in ("train", "dev", "test"):
        (folder / f"snli_1.0_{name}.jsonl").write_text(FIXTURE.read_text())
    return folder


def _argv(out, *more):
    return ["--mode", "quick", "--data", "generated", "--out", str(out), "--device", "cpu", *more]


def test_a_killed_run_resumes_without_losing_or_doubling_a_model(tmp_path, tiny):
    out = tmp_path / "n.csv"
    code, before = kill_after_rows("attnbook.experiments.nli", TINY, _argv(out), out, rows=1)
    assert code == -signal.SIGKILL
    ex.main(_argv(out))
    frame = check_resumed(out, before, KEYS, expected=3)
    assert sorted(frame.model) == sorted(MODELS)


def test_a_cut_last_row_is_set_aside_and_its_model_retrained(tmp_path, tiny, capsys):
    out = tmp_path / "n.csv"
    ex.main(_argv(out))
    whole = pd.read_csv(out)
    cut_last_line(out, keep=0.9)
    before = out.read_bytes()
    result = ex.main(_argv(out))
    assert "set aside a damaged last line" in capsys.readouterr().err
    frame = check_resumed(out, before, KEYS, expected=3)
    assert len(result) == 3 and frame.model.tolist() == MODELS
    pd.testing.assert_frame_equal(frame.drop(columns="train_seconds"), whole.drop(columns="train_seconds"))


def test_each_data_set_is_stored_as_it_finishes(tmp_path, tiny, monkeypatch, snli_dir):
    """--data all: the generated data's models are stored before SNLI is loaded; a failure there loses nothing."""
    out = tmp_path / "n.csv"
    real = ex.load_data

    def network_down(cfg):
        if cfg.data == "snli":
            raise ConnectionError("no network")
        return real(cfg)

    monkeypatch.setattr(ex, "load_data", network_down)
    with pytest.raises(ConnectionError):
        ex.main(["--mode", "quick", "--data", "all", "--snli-path", str(snli_dir), "--out", str(out),
                 "--device", "cpu"])
    assert pd.read_csv(out).model.tolist() == MODELS
    monkeypatch.setattr(ex, "load_data", real)
    result = ex.main(["--mode", "quick", "--data", "all", "--snli-path", str(snli_dir), "--out", str(out),
                      "--device", "cpu"])
    assert result.groupby("data").size().to_dict() == {"generated": 3, "snli": 3}
    sessions = json.loads((tmp_path / "n.json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["failed", "finished"] and sessions[1]["runs_added"] == 3


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="`datasets` is installed here")
def test_the_default_data_are_checked_before_training(tmp_path, monkeypatch, capsys):
    """The default --data all needs SNLI; without `datasets` (and without --snli-path) nothing is trained."""
    monkeypatch.setattr(ex, "load_data", lambda cfg: pytest.fail("data were loaded"))
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--mode", "quick", "--out", str(tmp_path / "n.csv")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "--data all: SNLI needs the `datasets` library (not installed" in err
    assert not list(tmp_path.iterdir())


def test_missing_snli_files_are_named(tmp_path, monkeypatch, capsys, snli_dir):
    (snli_dir / "snli_1.0_dev.jsonl").unlink()
    monkeypatch.setattr(ex, "load_data", lambda cfg: pytest.fail("data were loaded"))
    with pytest.raises(SystemExit):
        ex.main(["--mode", "quick", "--data", "snli", "--snli-path", str(snli_dir), "--out", str(tmp_path / "n.csv")])
    assert f"--data snli: SNLI: snli_1.0_dev.jsonl not found in {snli_dir}" in capsys.readouterr().err
    assert ex.missing_data("generated", TINY) is None


@pytest.mark.parametrize("argv,message", [
    (["--threads", "0"], "argument --threads: must be an integer >= 1, got '0'"),
    (["--device", "gpu"], "argument --device: 'gpu' is not a torch device"),
    (["--out", "n.json"], "argument --out: must name a .csv file"),
])
def test_bad_arguments_fail_before_training(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ex, "load_data", lambda cfg: pytest.fail("data were loaded"))
    with pytest.raises(SystemExit) as exit_info:
        ex.main(["--mode", "quick", "--data", "generated", "--out", "n.csv", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_sigterm_ends_the_command_line_with_143(tmp_path, tiny, monkeypatch):
    def terminated(*args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(ex, "run_model", terminated)
    with pytest.raises(SystemExit) as exit_info:
        ex.main(_argv(tmp_path / "n.csv"))
    assert exit_info.value.code == 143
    assert json.loads((tmp_path / "n.json").read_text())["sessions"][-1]["status"] == "interrupted"


def test_run_is_run_model_three_times(tmp_path):
    """run() and the command line's run_model give the same rows (seeded, order-independent models)."""
    cfg = TINY
    splits = ex.load_data(cfg)
    vocab = ex.build_vocab(splits["train"])
    one = pd.DataFrame([ex.run_model(cfg, name, splits, vocab, "cpu") for name in reversed(MODELS)])[::-1]
    together = ex.run(cfg, device="cpu")
    pd.testing.assert_frame_equal(one.reset_index(drop=True).drop(columns=["train_seconds", "confusion"]),
                                  together.drop(columns=["train_seconds", "confusion"]))
    with pytest.raises(ValueError, match=r"name must be one of \['masked', 'unmasked', 'hypothesis-only'\], got 'x'"):
        ex.run_model(cfg, "x", splits, vocab)
