"""The experiments on a real distributed engine: a Dask ``LocalCluster`` of 2 worker processes (README, "Experiment
grids on a cluster"). The same runs as the local backend, bit for bit on the CPU; a resume after an interrupted
grid; a worker killed in the middle of a run, with nothing lost or duplicated in the store."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbook import runtime
from attnbook.experiments import masking as ex
from attnbook.experiments.masking import MaskingConfig
from attnbook.runtime import parallel_backend, run_tasks
from attnbook.store import Layout, ResultsStore, collect_runs

from test_experiments_masking import KEYS, TIMING, TINY
from test_store import check_resumed, kill_after_rows

pytestmark = pytest.mark.usefixtures("one_thread")


# Task functions live at module level: the workers import this module (its folder is on their sys.path, which
# dask's spawned workers inherit from this process).
def _sum_with(big: np.ndarray, i: int) -> tuple[int, float]:
    return i, float(big.sum()) + i


def _value_or_die_once(marker: str, name: str, seed: int) -> dict:
    """A run that kills its own worker process (SIGKILL, as a machine that goes away) the first time it runs for
    ``name == "b"``; the scheduler runs it again elsewhere."""
    if name == "b" and not os.path.exists(marker):
        Path(marker).write_text("died once")
        os.kill(os.getpid(), signal.SIGKILL)
    return {"name": name, "seed": seed, "value": seed * 10 + ord(name)}


def test_dask_runs_the_same_tasks_as_local_and_in_order():
    big = np.arange(100_000, dtype=np.float64)
    arguments = [(big, i) for i in range(5)]
    local = list(run_tasks(_sum_with, arguments, workers=2))
    with parallel_backend("dask"):
        ordered = list(run_tasks(_sum_with, arguments, workers=2))
        unordered = sorted(run_tasks(_sum_with, arguments, workers=2, ordered=False))
    assert ordered == local == unordered


def test_shared_arguments_are_scattered_once(monkeypatch):
    """An argument object that several tasks share goes to the workers once (``Client.scatter``), not per task."""
    from distributed import Client

    scattered = []
    real = Client.scatter

    def counting(self, data, *args, **kwargs):
        scattered.append(len(data))
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(Client, "scatter", counting)
    big = np.ones(200_000)
    with parallel_backend("dask"):
        results = list(run_tasks(_sum_with, [(big, i) for i in range(4)], workers=2))
    assert scattered == [1] and [r[0] for r in results] == [0, 1, 2, 3]


def test_backend_arguments_are_checked():
    with pytest.raises(ValueError, match=r"backend must be one of \['local', 'dask'\], got 'ray'"):
        with parallel_backend("ray"):
            pass
    with pytest.raises(ValueError, match="needs the dask backend"):
        with parallel_backend("local", scheduler="tcp://127.0.0.1:8786"):
            pass
    assert runtime.current_backend() == {"name": "local", "scheduler": None}


def test_a_killed_worker_loses_only_its_attempt(tmp_path):
    """SIGKILL a worker in the middle of a run: the run is made again on another worker, and the store holds every
    run exactly once."""
    layout = Layout("toy", keys=("name", "seed"), columns=("name", "seed", "value"))
    marker = str(tmp_path / "died")
    arguments = [(marker, name, seed) for name in "abc" for seed in (0, 1)]
    with ResultsStore(tmp_path / "toy.csv", layout, {"toy": 1}) as store, parallel_backend("dask"):
        frame = collect_runs(_value_or_die_once, arguments, len(arguments), workers=2, store=store,
                             keys=["name", "seed"], show_progress=False)
    assert Path(marker).exists(), "no worker was killed"
    stored = pd.read_csv(tmp_path / "toy.csv")
    assert len(frame) == len(stored) == 6 and not stored.duplicated(["name", "seed"]).any()
    assert sorted(stored.value) == sorted(seed * 10 + ord(name) for _, name, seed in arguments)


# ------------------------------------------------------------------------ chapter 5's command line on the cluster
def _argv(out, *more):
    return ["--mode", "quick", "--out", str(out), "--no-progress", "--device", "cpu", "--seeds", "1", *more]


def _metrics(frame):
    return frame.drop(columns=TIMING).sort_values(KEYS).reset_index(drop=True)


@pytest.fixture()
def tiny(monkeypatch):
    monkeypatch.setattr(MaskingConfig, "quick", classmethod(lambda cls: TINY))


def test_the_masking_grid_on_dask_equals_the_local_runs_bitwise(tmp_path, tiny):
    local = ex.main(_argv(tmp_path / "local.csv", "--workers", "2"))
    dask = ex.main(_argv(tmp_path / "dask.csv", "--workers", "2", "--backend", "dask"))
    pd.testing.assert_frame_equal(_metrics(dask), _metrics(local), check_exact=True)
    a = pd.read_csv(tmp_path / "local.csv").drop(columns=TIMING).sort_values(KEYS).reset_index(drop=True)
    b = pd.read_csv(tmp_path / "dask.csv").drop(columns=TIMING).sort_values(KEYS).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    record = json.loads((tmp_path / "dask.json").read_text())
    assert [s["backend"] for s in record["sessions"]] == ["dask"] and record["sessions"][0]["workers"] == 2
    assert record["backend"] == "dask"
    assert json.loads((tmp_path / "local.json").read_text())["sessions"][0]["backend"] == "local"


def test_an_interrupted_dask_grid_resumes_without_losing_or_doubling_a_run(tmp_path):
    """The command line on a LocalCluster, SIGKILLed once 2 of its 5 runs are stored, then resumed on dask."""
    out = tmp_path / "m.csv"
    argv = _argv(out, "--workers", "2", "--backend", "dask")
    code, before = kill_after_rows("attnbook.experiments.masking", TINY, argv, out, rows=2)
    assert code == -signal.SIGKILL
    import attnbook.experiments.masking as masking

    original = MaskingConfig.quick
    MaskingConfig.quick = classmethod(lambda cls: TINY)
    try:
        masking.main(argv)
    finally:
        MaskingConfig.quick = original
    frame = check_resumed(out, before, KEYS, expected=5)
    assert len(frame) == 5
    sessions = json.loads(out.with_suffix(".json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["killed", "finished"]


def test_scheduler_needs_the_dask_backend(tmp_path, tiny, capsys):
    with pytest.raises(SystemExit) as info:
        ex.main(_argv(tmp_path / "m.csv", "--scheduler", "tcp://127.0.0.1:8786"))
    assert info.value.code == 2
    assert "argument --scheduler: needs --backend dask, got --backend local" in capsys.readouterr().err


# ------------------------------------------------------------------------ chapter 4's translation command line
def test_the_translation_runs_on_dask_equal_the_local_runs(tmp_path, monkeypatch):
    """Chapter 4's command line (and chapter 8's, which shares its store half) on a LocalCluster: the same tiny
    models, metric for metric, as joblib's processes; the session records the backend."""
    from attnbook.experiments import seq2seq

    from test_experiments_seq2seq import TINY as SEQ_TINY

    monkeypatch.setattr(seq2seq.Seq2SeqConfig, "quick", classmethod(lambda cls: SEQ_TINY))
    frames = {}
    for backend in ("local", "dask"):
        out = tmp_path / f"{backend}.csv"
        seq2seq.main(["--mode", "quick", "--out", str(out), "--device", "cpu", "--models", "none", "bahdanau",
                      "--workers", "2", "--backend", backend])
        frames[backend] = pd.read_csv(out)
        record = json.loads(out.with_suffix(".json").read_text())
        assert record["sessions"][-1]["backend"] == backend
    columns = ["model", "seed", "parameters", "valid_loss", "token_acc", "bleu_greedy", "bleu_beam"]
    pd.testing.assert_frame_equal(frames["dask"][columns], frames["local"][columns], check_exact=True)
