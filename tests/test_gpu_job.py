"""tools/gpu_masking_job.sh, chapter 5's one-call GPU job, run on the CPU at a tiny size: it writes its store and
provenance into the folder it is given, a second call resumes, and `attnbook.store merge` brings the runs into
another store made with the same settings (skipping the runs that store has)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--mode", "quick", "--source", "rotten_tomatoes", "--only", "attention/neg_inf/packed/random/fp32"]


def job(out_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "JOB_DEVICE": "cpu", "JOB_WORKERS": "1", "JOB_MINUTES": "10"}
    return subprocess.run(["bash", str(ROOT / "tools" / "gpu_masking_job.sh"), str(out_dir), *TINY, *extra],
                          env=env, capture_output=True, text=True, timeout=900)


def test_the_gpu_job_writes_resumes_and_merges(tmp_path):
    first = job(tmp_path / "a", "--seeds", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "1 runs in" in first.stdout
    out_a = tmp_path / "a" / "masking_gpu.csv"
    record = json.loads(out_a.with_suffix(".json").read_text())
    assert record["sessions"][-1]["status"] == "finished" and record["config"]["source"] == "rotten_tomatoes"
    again = job(tmp_path / "a", "--seeds", "1")                  # resumes: nothing left to run
    assert again.returncode == 0 and len(pd.read_csv(out_a)) == 1
    second = job(tmp_path / "b", "--seeds", "2")
    assert second.returncode == 0, second.stderr[-2000:]
    merged = subprocess.run([sys.executable, "-m", "attnbook.store", "merge", str(tmp_path / "b" / "masking_gpu.csv"),
                             str(out_a)], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "code")})
    assert merged.returncode == 0, merged.stderr[-2000:]
    rows = pd.read_csv(out_a)
    assert sorted(rows.seed) == [0, 1] and not rows.duplicated(["masking", "seed"]).any()


def test_the_gpu_job_refuses_a_bad_argument_at_once(tmp_path):
    result = job(tmp_path / "c", "--seeds", "0")
    assert result.returncode != 0 and "--seeds" in result.stderr
