"""Where and how a result was produced: device, versions, commit, date and wall time.

Every file under ``results/`` is written with :func:`provenance` beside it (or in it), so that a reader can
tell a GPU run from a CPU run, and which commit of the code made the numbers.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

from . import __version__
from .runtime import describe_device, get_device, get_mode

__all__ = ["REPOSITORY_URL", "atomic_write", "atomic_write_text", "fsync_dir", "git_commit", "provenance", "read_stored",
           "write_provenance"]

#: The book's repository (the same URL as ``repository.url`` in ``_config.yml``; a test checks they agree).
REPOSITORY_URL = "https://github.com/attnbook/attention-masked-unmasked"
_RAW_RESULTS = REPOSITORY_URL.replace("github.com", "raw.githubusercontent.com") + "/main/results/"


def git_commit(path: str | Path = ".") -> str:
    """The ``git rev-parse HEAD`` of the repository containing ``path``, with ``+dirty`` if it has local
    changes to tracked files, or ``"unknown"`` outside a git checkout. The environment variable
    ``ATTNBOOK_COMMIT``, if set, is taken instead: a copy of the working tree on another machine (the GPU machine's)
    may carry no ``.git``, or a stale one, so the command that sends it there names the commit it sent."""
    if os.environ.get("ATTNBOOK_COMMIT"):
        return os.environ["ATTNBOOK_COMMIT"]
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=path, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def provenance(wall_time_s: float | None = None, device: torch.device | str | None = None,
               mode: str | None = None, **extra: Any) -> dict[str, Any]:
    """A dict describing this run: ``mode``, ``device``, ``device_type``, ``torch``, ``numpy``, ``python``,
    ``attnbook``, ``platform``, ``commit``, ``date_utc`` (ISO 8601) and ``wall_time_s`` (seconds, or None),
    plus any ``extra`` keys."""
    device = torch.device(device) if device is not None else get_device()
    record = {
        "mode": mode or get_mode(),
        "device": describe_device(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "attnbook": __version__,
        "platform": platform.platform(),
        "commit": git_commit(Path(__file__).resolve().parent),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": None if wall_time_s is None else round(float(wall_time_s), 2),
    }
    record.update(extra)
    return record


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(f)`` on a binary file so that a reader, a crash or a kill sees either the old ``path`` or the new
    one, never a part: ``write`` fills a temporary file in the same folder (parents created), which is flushed,
    fsynced and then renamed over ``path`` (``os.replace``, atomic on POSIX and Windows); the folder is fsynced too
    where the platform allows. The temporary file is removed if anything fails, Ctrl-C included. Returns the path.
    Used for the results stores' tables and sidecars (:func:`atomic_write_text`) and for training checkpoints
    (:func:`attnbook.checkpoint.save_checkpoint`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` atomically (:func:`atomic_write`). Returns the path."""
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def fsync_dir(folder: str | Path) -> None:
    """fsync a folder, so that a file created or renamed in it survives a crash (a no-op where folders cannot be
    opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse
        pass
    finally:
        os.close(fd)


def write_provenance(path: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as pretty JSON to ``path`` (parents created), atomically (:func:`atomic_write_text`: a kill
    leaves the old record or the new one, never a part); return the path."""
    return atomic_write_text(path, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def read_stored(name: str, start: str | Path | None = None, online: bool | None = None,
                timeout: float = 10.0) -> str | None:
    """The text of the stored result ``results/<name>``, or ``None`` if there is none.

    It looks for ``results/<name>`` in ``start`` (default: the working directory) and then in each of its parents,
    so it works from ``chapters/`` in a clone and from the repository root. If no local copy exists and ``online``
    is true, it downloads the file from the book's repository (:data:`REPOSITORY_URL`, branch ``main``).
    ``online=None`` (the default) means "only on Colab", where the notebook runs without a clone; the book build,
    the tests and a local run therefore never touch the network. A failed download (no network, no such file,
    ``timeout`` seconds passed) also gives ``None``.

    Chapters 3, 5, 6 and 7 use it to show the stored full-mode results beside the live run.
    """
    start = Path.cwd() if start is None else Path(start)
    for base in (start, *start.parents):
        path = base / "results" / name
        if path.is_file():
            return path.read_text()
    if online is None:
        online = "google.colab" in sys.modules
    if not online:
        return None
    from urllib.error import URLError
    from urllib.request import urlopen
    try:
        with urlopen(_RAW_RESULTS + name, timeout=timeout) as response:
            return response.read().decode()
    except (URLError, OSError, ValueError):
        return None
