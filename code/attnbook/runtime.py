"""Run mode, device, seeding, glue and wall time: what every chapter states about the run it shows.

The book runs in one of two modes (see the README, section "Two modes"):

- ``quick``: sized for a 2-core CPU, every chapter in at most a few minutes.
- ``full``: sized as the papers do, for a GPU.

The mode comes from the environment variable ``ATTNBOOK_MODE`` (``quick`` or ``full``). When it is unset,
the default is ``full`` if CUDA is available and ``quick`` otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Number
from typing import Any, ClassVar

import numpy as np
import torch

MODES = ("quick", "full")
MODE_ENV = "ATTNBOOK_MODE"


def get_mode() -> str:
    """Return the run mode, ``"quick"`` or ``"full"``.

    Reads ``ATTNBOOK_MODE``; when it is unset or empty, returns ``"full"`` if CUDA is available and
    ``"quick"`` otherwise.

    Raises:
        ValueError: ``ATTNBOOK_MODE`` is set to something other than ``quick`` or ``full`` (the message
            quotes the value).
    """
    value = os.environ.get(MODE_ENV, "").strip().lower()
    if value == "":
        return "full" if torch.cuda.is_available() else "quick"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {MODES}, got {os.environ[MODE_ENV]!r}")
    return value


def get_device() -> torch.device:
    """Return ``cuda`` when a GPU is available, else ``cpu``. Independent of the mode."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device(device: torch.device | str | None = None) -> str:
    """A human-readable name for ``device``, e.g. ``"CPU (2 threads, x86_64)"``, ``"CPU (1 thread, x86_64)"`` or
    ``"NVIDIA H100 80GB HBM3"``. Runs stored before 2026-11-24 spell one thread ``"1 threads"``
    (:func:`device_label` mends that for prose); both begin with ``"CPU"``, which is all
    :func:`attnbook.store.device_kind` reads (case-insensitively)."""
    device = torch.device(device) if device is not None else get_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({plural(torch.get_num_threads(), 'thread')}, {platform.machine()})"


def device_label(device: object) -> str:
    """A stored run's ``device`` entry, as prose shows it: :func:`describe_device`'s current spelling, so that a
    record written before 2026-11-24 (``"CPU (1 threads, x86_64)"``) reads ``"CPU (1 thread, x86_64)"``. The
    stored record itself is left as it is. Anything else is returned as ``str(device)``."""
    return re.sub(r"\b1 threads\b", "1 thread", str(device))


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's, NumPy's and torch's global generators, and return a fresh seeded ``torch.Generator``.

    Also asks torch for deterministic algorithms (warning, not failing, where one has none), so that two
    quick builds on the same CPU give identical numbers.

    Raises:
        ValueError: ``seed`` is negative.
    """
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.Generator().manual_seed(seed)


def _plain(value: Any) -> Any:
    """Turn NumPy and torch scalars into Python numbers, so glue shows ``0.48`` and not ``np.float64(0.48)``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


def glue(name: str, value: Any, display: bool = False) -> Any:
    """Glue ``value`` under ``name`` for the book's prose (myst-nb ``glue``); return the value.

    NumPy and torch scalars are converted to Python numbers first, so that ``{glue:text}`name:.3f``` formats
    them. Outside a myst-nb build (e.g. on Colab without myst-nb installed) nothing is glued; with
    ``display=True`` the value is still displayed.
    """
    value = _plain(value)
    try:
        from myst_nb import glue as _myst_glue
    except ImportError:  # pragma: no cover - only without myst-nb
        if display:
            from IPython.display import display as _display

            _display(value)
        return value
    _myst_glue(name, value, display=display)
    return value


@dataclass
class RunInfo:
    """The mode, device and start time of a chapter's run; :meth:`glue_end` glues them with the wall time.

    Use one per chapter: ``run = RunInfo.start()`` in the first code cell, ``run.glue_end()`` in the last.
    The glued names are ``{prefix}_mode``, ``{prefix}_device`` and ``{prefix}_wall_s`` (seconds, float).
    """

    mode: str
    device: torch.device
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def start(cls) -> "RunInfo":
        """Read the mode and the device now, and start the wall clock."""
        return cls(mode=get_mode(), device=get_device())

    @property
    def device_name(self) -> str:
        return describe_device(self.device)

    def wall_time_s(self) -> float:
        """Seconds since :meth:`start`."""
        return time.perf_counter() - self.started

    def glue_start(self, prefix: str = "run") -> None:
        """Glue ``{prefix}_mode`` and ``{prefix}_device``."""
        glue(f"{prefix}_mode", self.mode)
        glue(f"{prefix}_device", self.device_name)

    def glue_end(self, prefix: str = "run") -> float:
        """Glue ``{prefix}_mode``, ``{prefix}_device`` and ``{prefix}_wall_s``; return the wall time in seconds."""
        self.glue_start(prefix)
        wall = self.wall_time_s()
        glue(f"{prefix}_wall_s", wall)
        return wall


#: Set to anything but ``""`` or ``"0"`` to turn :func:`progress` bars off everywhere.
NO_PROGRESS_ENV = "ATTNBOOK_NO_PROGRESS"
#: Programs that build the book by executing its notebooks: a kernel started by one of them is a book build.
BOOK_BUILDERS = ("jupyter-book", "jupyter_book", "jb", "sphinx-build", "sphinx")


def _process_commands(max_depth: int = 8) -> list[list[str]]:
    """The command lines of this process's ancestors, parent first (empty where they cannot be read).

    Uses psutil when it is installed and ``/proc`` otherwise (Linux); elsewhere returns ``[]``.
    """
    commands: list[list[str]] = []
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            for parent in psutil.Process().parents()[:max_depth]:
                try:
                    commands.append(parent.cmdline())
                except psutil.Error:
                    commands.append([])
        except psutil.Error:
            pass
        return commands
    pid = os.getppid()
    for _ in range(max_depth):
        proc = f"/proc/{pid}"
        try:
            with open(f"{proc}/cmdline", "rb") as fh:
                commands.append([a.decode(errors="replace") for a in fh.read().split(b"\0") if a])
            with open(f"{proc}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if pid <= 1:
            break
    return commands


def _is_book_builder(command: list[str]) -> bool:
    """Whether a command line runs Jupyter Book or Sphinx (``jupyter-book build``, ``python -m sphinx``, ...)."""
    names = [os.path.basename(arg) for arg in command[:3]]
    if "-m" in command[:3]:
        module = command[command.index("-m") + 1] if command.index("-m") + 1 < len(command) else ""
        names.append(module.split(".")[0])
    return any(name in BOOK_BUILDERS for name in names)


def in_book_build() -> bool:
    """True when the code runs while the book is built: ``ATTNBOOK_NO_PROGRESS`` is set (not ``""``/``"0"``), or
    this process was started by ``jupyter-book``/``jb`` or Sphinx, which execute every notebook of the book (the
    kernel is their child process; ancestors are checked, so a build through ``make book`` counts too)."""
    if os.environ.get(NO_PROGRESS_ENV, "").strip() not in ("", "0"):
        return True
    return any(_is_book_builder(command) for command in _process_commands())


def progress_mode() -> str:
    """How :func:`progress` shows a loop here: ``"off"``, ``"auto"`` or ``"text"``.

    - ``"off"``: the book build (:func:`in_book_build`): the built pages show no bar, and nothing goes to stderr.
    - ``"auto"``: ipywidgets is installed: ``tqdm.auto``, a widget in Jupyter and Colab, tqdm's bar on stderr on the
      command line.
    - ``"text"``: no ipywidgets (e.g. nbval, or the command line in the book's environment): a plain text bar on
      stdout, refreshed at most every 5 s, since ``tqdm.auto`` would warn on stderr in a kernel.
    """
    if in_book_build():
        return "off"
    return "auto" if importlib.util.find_spec("ipywidgets") is not None else "text"


def progress(iterable: Iterable | None = None, *, desc: str | None = None, total: int | None = None, **kwargs: Any):
    """A progress bar over ``iterable`` (or a manual one, with ``total`` and ``update``) that suits where it runs.

    Returns a ``tqdm`` object in each mode of :func:`progress_mode`: with ipywidgets ``tqdm.auto`` (a widget in
    Jupyter and Colab); without, a plain text bar on stdout that shows the loop's final count and time; and in the
    book build a disabled bar, which iterates (``update``, ``close`` and the like do nothing) but prints nothing:
    the built pages show no bars, and no warning goes to stderr. Other keyword arguments are passed on to
    ``tqdm``; ``disable=True`` turns a bar off in every mode.
    """
    mode = progress_mode()
    if mode == "auto":
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm

        if mode == "off":
            kwargs["disable"] = True
        else:
            kwargs.setdefault("file", sys.stdout)
            kwargs.setdefault("mininterval", 5.0)
            kwargs.setdefault("ascii", True)
    return tqdm(iterable, desc=desc, total=total, **kwargs)


#: The engines that run an experiment's tasks: ``"local"`` (joblib's loky processes on this machine, or this
#: process for one worker) and ``"dask"`` (a Dask cluster: a ``LocalCluster`` here, or an existing scheduler).
BACKENDS = ("local", "dask")
_BACKEND: dict[str, Any] = {"name": "local", "scheduler": None}


@contextmanager
def parallel_backend(name: str = "local", scheduler: str | None = None) -> Iterator[None]:
    """Run the :func:`run_tasks` calls inside the ``with`` block on the engine ``name`` (one of :data:`BACKENDS`).

    ``"dask"`` with ``scheduler=None`` starts a ``distributed.LocalCluster`` for each :func:`run_tasks` call, with
    as many single-threaded worker processes as the call's ``workers``; with a scheduler address (``tcp://host:8786``,
    as printed by ``dask scheduler`` or a ``dask_jobqueue.SLURMCluster``) it sends the tasks there. The experiments'
    command lines set it from ``--backend`` and ``--scheduler`` (README, "Experiment grids on a cluster").

    Raises:
        ValueError: an unknown backend, or a scheduler address without the dask backend.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {name!r}")
    if scheduler is not None and name != "dask":
        raise ValueError(f"a scheduler address ({scheduler!r}) needs the dask backend, got backend {name!r}")
    before = dict(_BACKEND)
    _BACKEND.update(name=name, scheduler=scheduler)
    try:
        yield
    finally:
        _BACKEND.update(before)


def current_backend() -> dict[str, Any]:
    """The engine :func:`run_tasks` uses now: ``{"name": ..., "scheduler": ...}`` (see :func:`parallel_backend`)."""
    return dict(_BACKEND)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, bytes, torch.device, torch.dtype))


def _dask_tasks(function: Any, arguments: list[tuple], workers: int, ordered: bool,
                scheduler: str | None) -> Iterator:
    """:func:`run_tasks` on Dask. An argument object that several tasks share (the encoded data, the configuration)
    is sent to every worker once (``Client.scatter(..., broadcast=True)``), not once per task. A worker that dies
    mid-task loses only that task's attempt: the scheduler runs it again on another worker (``allowed-failures``),
    and its result comes back here once."""
    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler is None:
        cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                               dashboard_address=None)
    client = Client(cluster if cluster is not None else scheduler)
    try:
        # every non-scalar argument object that more than one task shares, by identity
        counts = Counter(id(v) for args in arguments for v in args if not _is_scalar(v))
        shared = {id(v): v for args in arguments for v in args if counts[id(v)] > 1}
        scattered = {}
        if shared:
            scattered = dict(zip(shared, client.scatter(list(shared.values()), broadcast=True, hash=False)))
        futures = [client.submit(function, *(scattered.get(id(v), v) for v in args), pure=False)
                   for args in arguments]
        finished = futures if ordered else as_completed(futures)
        for future in finished:
            yield future.result()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_tasks(function: Any, arguments: Iterable[tuple], workers: int = 1, ordered: bool = True) -> Iterator:
    """Yield ``function(*args)`` for each ``args`` of ``arguments``; the experiments' ``--workers`` and
    ``--backend`` options go through here (chapters 3, 4, 5, 8 and 9).

    Args:
        function: a module-level function when the tasks leave this process (it is pickled for the workers).
        arguments: tuples of positional arguments, one tuple per task.
        workers: on the local backend, 1 runs the tasks one after another in this process, lazily, and more runs
            them in that many joblib processes (``loky``); on the dask backend without a scheduler, the number of
            worker processes of the ``LocalCluster``.
        ordered: yield in the order of ``arguments`` (default) or, if False, as each task finishes.

    The engine is the one set by :func:`parallel_backend` (default: local). The results always come back to this
    process, which alone writes a results store.

    Returns:
        an iterator over the results. Exceptions raised in a task are raised again here.
    """
    backend = current_backend()
    if backend["name"] == "dask":
        return _dask_tasks(function, list(arguments), workers, ordered, backend["scheduler"])
    if workers <= 1:
        return (function(*args) for args in arguments)
    from joblib import Parallel, delayed

    return Parallel(n_jobs=workers, backend="loky", return_as="generator" if ordered else "generator_unordered")(
        delayed(function)(*args) for args in arguments)


def print_estimate(seconds: float | None, what: str = "the next cell") -> None:
    """Print an estimate of a long cell's run time before it starts (the book's convention), e.g.
    ``print_estimate(40, "training 3 models")`` prints ``Estimated run time of training 3 models: about 40 s``.

    ``seconds=None`` says that no estimate has been measured for this kind of machine (e.g. full mode on a GPU,
    which the authors could not time), rather than printing a guess."""
    if seconds is None:
        print(f"Run time of {what}: not yet measured on this kind of machine; the progress bar shows the time left")
    elif seconds >= 90:
        print(f"Estimated run time of {what}: about {seconds / 60:.0f} min")
    else:
        print(f"Estimated run time of {what}: about {seconds:.0f} s")


class ModeConfig:
    """Mixin for an experiment's config dataclass that defines ``quick()`` and ``full()`` classmethods, and may
    define more presets: each is a classmethod named in the class variable ``extra_presets`` (e.g. chapter 4's
    ``Seq2SeqConfig.cpu()``, ``extra_presets = ("cpu",)``), which :meth:`for_mode` and the command lines'
    ``--mode`` accept. A class variable, not a dataclass field: it is not part of a run's configuration."""

    extra_presets: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """The names :meth:`for_mode` accepts: ``("quick", "full")`` and then ``extra_presets``; the command
        lines' ``--mode`` choices."""
        return (*MODES, *cls.extra_presets)

    @classmethod
    def for_mode(cls, mode: str | None = None):
        """The preset named ``mode`` (default: :func:`get_mode`): ``quick()``, ``full()`` or one of
        ``extra_presets``.

        Raises:
            ValueError: ``mode`` names no preset of this class (the message lists those it has).
        """
        mode = mode or get_mode()
        names = cls.presets()
        if mode not in names:
            raise ValueError(f"mode must be {listing([repr(n) for n in names], 'or')}, got {mode!r}")
        return getattr(cls, mode)()


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """``n`` and ``noun``, in the plural unless ``n`` is 1: ``plural(1, "seed")`` is ``"1 seed"``,
    ``plural(3, "seed")`` is ``"3 seeds"``, ``plural(2, "child", "children")`` is ``"2 children"``. For glued
    prose, so that no page reads "1 runs" or "run(s)".

    Raises:
        TypeError: ``n`` is not an integer (a bool, a float or a string): a count is needed.
        ValueError: ``n`` is negative.
    """
    if isinstance(_plain(n), bool) or not isinstance(_plain(n), int):
        raise TypeError(f"n must be an integer count, got {n!r} ({type(n).__name__})")
    n = int(_plain(n))
    if n < 0:
        raise ValueError(f"n must be a count >= 0, got {n}")
    return f"{n} {noun if n == 1 else plural_form or noun + 's'}"


def listing(items: Iterable[Any], conjunction: str = "and") -> str:
    """The items as English prose: ``"a"``, ``"a and b"``, ``"a, b and c"`` (no serial comma, as in the book's
    prose). Each item is written with ``str``. For glued prose that names seeds, arms or models.

    Raises:
        ValueError: ``items`` is empty: a sentence that lists nothing needs other words, which the caller chooses.
    """
    words = [str(item) for item in items]
    if not words:
        raise ValueError("items is empty: there is nothing to list")
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def is_number(value: Any) -> bool:
    """True for Python, NumPy and one-element torch numbers (used by tests of glued values)."""
    return isinstance(_plain(value), Number)
