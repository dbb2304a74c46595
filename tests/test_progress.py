"""attnbook.runtime.progress: a bar in Jupyter and on the command line, nothing in the book build."""

import importlib.util
import os
import sys

import pytest
from tqdm.std import tqdm as std_tqdm

from attnbook import runtime

BUILD = [["/repo/.venv/bin/python", "/repo/.venv/bin/jupyter-book", "build", ".", "-W"], ["make", "book"]]
PYTEST = [["/repo/.venv/bin/python", "-m", "pytest", "tests"], ["bash"]]


@pytest.fixture
def plain(monkeypatch):
    """No override in the environment, started by pytest, no ipywidgets (as in the book's environment)."""
    monkeypatch.delenv(runtime.NO_PROGRESS_ENV, raising=False)
    monkeypatch.setattr(runtime, "_process_commands", lambda max_depth=8: PYTEST)
    _ipywidgets(monkeypatch, installed=False)
    return monkeypatch


def _ipywidgets(monkeypatch, installed):
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "ipywidgets":
            return real("tqdm") if installed else None  # any spec stands for "installed"
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("command,expected", [
    (["/repo/.venv/bin/python", "/repo/.venv/bin/jupyter-book", "build", "."], True),
    (["/usr/local/bin/jb", "build", "."], True),
    (["python", "-m", "sphinx", "-b", "html", ".", "_build"], True),
    (["/usr/bin/sphinx-build", "-b", "html"], True),
    (["python", "-m", "jupyter_book", "build", "."], True),
    (["python", "-m", "pytest", "chapters"], False),
    (["python", "-m"], False),
    (["/usr/bin/jupyter-lab"], False),
    (["bash", "/work/build-the-book.sh"], False),
    ([], False),
])
def test_book_builders_are_recognised_by_their_command_line(command, expected):
    assert runtime._is_book_builder(command) is expected


def test_the_modes(plain):
    assert runtime.progress_mode() == "text"
    _ipywidgets(plain, installed=True)
    assert runtime.progress_mode() == "auto"
    plain.setattr(runtime, "_process_commands", lambda max_depth=8: BUILD)
    assert runtime.progress_mode() == "off", "a kernel started by jupyter-book is the book build"
    _ipywidgets(plain, installed=False)
    assert runtime.progress_mode() == "off"


@pytest.mark.parametrize("value,off", [("1", True), ("yes", True), ("0", False), ("", False), (" ", False)])
def test_environment_variable_turns_bars_off(plain, value, off):
    plain.setenv(runtime.NO_PROGRESS_ENV, value)
    assert runtime.in_book_build() is off
    assert (runtime.progress_mode() == "off") is off


def test_book_build_prints_nothing_and_still_iterates(plain, capsys):
    plain.setattr(runtime, "_process_commands", lambda max_depth=8: BUILD)
    assert list(runtime.progress(range(5), desc="loop")) == list(range(5))
    bar = runtime.progress(total=4, desc="manual")
    bar.update(3)
    bar.set_postfix(loss=0.5)
    bar.close()
    assert bar.disable
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_with_ipywidgets_the_bar_is_tqdm_auto(plain, capsys):
    from tqdm.auto import tqdm as auto_tqdm

    _ipywidgets(plain, installed=True)
    bar = runtime.progress(range(3), desc="loop", mininterval=0)
    assert isinstance(bar, auto_tqdm)
    assert list(bar) == [0, 1, 2]
    out, err = capsys.readouterr()
    assert "loop" in out + err and "3/3" in out + err


def test_without_ipywidgets_a_plain_bar_goes_to_stdout(plain, capsys):
    bar = runtime.progress(range(2), desc="loop")
    assert isinstance(bar, std_tqdm) and bar.mininterval == 5.0 and bar.ascii is True
    list(bar)
    out, err = capsys.readouterr()
    assert "loop" in out and "2/2" in out and err == ""


def test_disable_is_respected_in_every_mode(plain, capsys):
    list(runtime.progress(range(3), desc="quiet", disable=True))
    assert capsys.readouterr() == ("", "")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_ancestors_are_read_with_and_without_psutil(monkeypatch):
    pytest.importorskip("psutil")
    with_psutil = runtime._process_commands()
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    from_proc = runtime._process_commands()
    assert with_psutil and with_psutil[0], "the parent's command line is readable"
    assert from_proc[: len(with_psutil)] == with_psutil[: len(from_proc)]
