"""What a Colab reader does, simulated offline: a fresh virtual environment with only what Colab ships
preinstalled (torch, Jupyter's kernel machinery), attnbook installed with the notebooks' own pip spec but from
this repository's path, one chapter notebook copied into an empty folder and executed there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT

COLAB_CELL = (ROOT / "tools" / "colab_cell.py").read_text()
NOTEBOOK = ROOT / "chapters" / "01_soft_lookup.ipynb"


def _run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _local_spec() -> str:
    """The first cell's ``attnbook[book] @ git+{REPO_URL}@main#subdirectory=code`` (the package with the book's
    extra), with this repository's path as REPO_URL."""
    template = re.search(r'f"((?:attnbook\[book\] @ )?git\+\{REPO_URL\}@[^"]+)"', COLAB_CELL).group(1)
    branch = "main"
    has_main = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "refs/heads/main"], cwd=ROOT,
                              capture_output=True).returncode == 0
    if not has_main:  # e.g. a detached checkout: use what is checked out
        branch = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return template.replace("{REPO_URL}", f"file://{ROOT}").replace("@main", f"@{branch}")


def test_a_chapter_runs_like_on_colab(tmp_path):
    venv = tmp_path / "colab-venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # Colab's pip is current; the pip that Python 3.11's venv bundles (23.2) rejects a git+file:/// URL with no
    # host in a named requirement ("Invalid URL"), so upgrade it first, as `make` does for .venv
    _run(pip + ["--upgrade", "pip"])
    # What Colab has before the reader's first cell runs: torch (here the local CPU wheel) and a Jupyter kernel.
    torch_pin = next(l for l in (ROOT / "requirements.txt").read_text().splitlines() if l.startswith("torch=="))
    _run(pip + [torch_pin, "ipykernel", "nbclient", "nbformat"])
    # The notebook's own install step, with the repository path instead of its URL.
    spec = _local_spec()
    _run(pip + [spec])
    workdir = tmp_path / "empty"
    workdir.mkdir()
    shutil.copy(NOTEBOOK, workdir / NOTEBOOK.name)
    runner = textwrap.dedent(f"""
        import nbformat
        from nbclient import NotebookClient
        nb = nbformat.read({str(workdir / NOTEBOOK.name)!r}, as_version=4)
        NotebookClient(nb, timeout=600, kernel_name="python3",
                       resources={{"metadata": {{"path": {str(workdir)!r}}}}}).execute()
        errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, errors
        print("executed", sum(c.cell_type == "code" for c in nb.cells), "code cells")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "JUPYTER"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["ATTNBOOK_MODE"] = "quick"
    result = _run([str(python), "-c", runner], cwd=workdir, env=env, timeout=900)
    assert "executed" in result.stdout
    # attnbook came from the install, not from the repository checkout
    where = _run([str(python), "-c", "import attnbook, sys; print(attnbook.__file__)"], cwd=workdir, env=env)
    assert str(venv) in where.stdout
