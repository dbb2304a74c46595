"""CITATION.cff validates with cffconvert (installed into its own throw-away environment, because cffconvert 2
pins an old jsonschema that the book's environment must not have)."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_citation_cff_validates_with_cffconvert(tmp_path):
    venv = tmp_path / "cff"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "cffconvert==2.0.0"],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    result = subprocess.run([str(venv / "bin" / "cffconvert"), "--validate", "-i", str(ROOT / "CITATION.cff")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid" in (result.stdout + result.stderr).lower()
