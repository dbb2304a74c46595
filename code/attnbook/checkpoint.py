"""Resumable training: the whole state of one training run in one file, written atomically.

The full-size translation runs of chapter 4 (``attnbook.experiments.seq2seq``) and chapter 8
(``attnbook.experiments.transformer_translation``) train for longer than one call of the lent GPU machine may run
(10 minutes; see the README's GPU paragraph). With ``--checkpoint-dir DIR`` their command lines save a run's
training state after every epoch (and, with ``--checkpoint-minutes M``, also every ``M`` minutes inside an epoch, at
a batch boundary), and a run started again with the same identity and configuration continues from its last
checkpoint instead of from the start. The resumed run computes exactly what the uninterrupted one computes: the
model, the optimizer and the learning-rate scheduler, the random generators (Python's, NumPy's, torch's CPU one and
the CUDA one of the device: dropout draws from them), the position in the batch order (epoch and batches done; the
batches of an epoch are made again from their seed) and the running loss sums are all restored
(``tests/test_checkpoint.py`` checks that the parameters are bitwise equal on the CPU).

A checkpoint file holds a dict (:func:`torch.save`, read back with ``weights_only=True``): ``format``,
``experiment``, ``identity`` (the run's key, e.g. ``{"model": "bahdanau", "seed": 0}``), ``config`` (the
configuration that must match to resume), ``epoch`` (1-based epoch to continue with; ``epochs + 1`` when training
is complete), ``step`` (batches of that epoch already done), ``epochs``, ``steps_per_epoch``, ``state`` (the
experiment's own: model, optimizer, scheduler, running sums, history rows), ``rng`` (:func:`rng_states`),
``resumes`` (one entry per earlier resume) and ``saved_utc``.

Nothing here is in the paper trail of a result: a checkpoint is deleted once its run's row is in the results store,
and the store's provenance records which runs were resumed (the session's ``resumed_runs``).
"""

from __future__ import annotations

import datetime as _dt
import random
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .provenance import atomic_write
from .store import _json_plain, config_differences

__all__ = ["FORMAT", "rng_states", "set_rng_states", "checkpoint_file", "save_checkpoint", "load_checkpoint",
           "Checkpointer", "add_checkpoint_arguments", "checkpoint_every_s", "record_resumes", "describe", "main"]

#: The version of the file layout; a file of another version is refused.
FORMAT = 1


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def rng_states(device: torch.device | str = "cpu") -> dict:
    """The states of the random generators a training run draws from: Python's ``random``, NumPy's global one,
    torch's CPU generator and, for a CUDA ``device``, that device's generator (plain lists and uint8 tensors, so
    that :func:`torch.load` reads them with ``weights_only=True``)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states = {"python": [version, list(internal), gauss_next],
              "numpy": [kind, key.tolist(), int(pos), int(has_gauss), float(gauss)],
              "torch": torch.get_rng_state()}
    device = torch.device(device)
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device)
    return states


def set_rng_states(states: Mapping, device: torch.device | str = "cpu") -> None:
    """Restore the generators saved by :func:`rng_states`; the CUDA one only for a CUDA ``device`` and only if it was
    saved (a run moved from the CPU to a GPU keeps the GPU generator as it is, and is not bitwise reproducible
    across that move anyway)."""
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, key, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(states["torch"].cpu())
    device = torch.device(device)
    if device.type == "cuda" and states.get("cuda") is not None:
        torch.cuda.set_rng_state(states["cuda"].cpu(), device)


def checkpoint_file(directory: str | Path, experiment: str, identity: Mapping[str, Any]) -> Path:
    """The checkpoint of one run: ``DIR/<experiment>-<key>=<value>-....pt`` in the order of ``identity``, e.g.
    ``seq2seq-model=bahdanau-seed=0.pt``, so that runs trained side by side (several workers) never share a file.

    Raises:
        ValueError: an empty ``identity``, or a value that is not made of letters, digits, ``.``, ``_`` or ``-``.
    """
    if not identity:
        raise ValueError("identity must name the run, e.g. {'model': 'bahdanau', 'seed': 0}; got none")
    parts = []
    for key, value in identity.items():
        if not re.fullmatch(r"[A-Za-z0-9._-]+", f"{key}{value}"):
            raise ValueError(f"identity entries must be letters, digits, '.', '_' or '-', got {key!r}: {value!r}")
        parts.append(f"{key}={value}")
    return Path(directory) / f"{experiment}-{'-'.join(parts)}.pt"


def save_checkpoint(path: str | Path, checkpoint: Mapping) -> Path:
    """Write ``checkpoint`` (a dict, see the module docstring) to ``path`` atomically: whole into a temporary file
    in the same folder (created if needed), flushed and fsynced, then renamed over ``path`` with :func:`os.replace`,
    so a kill at any moment leaves the previous checkpoint or the new one, never a part. Returns the path."""
    return atomic_write(path, lambda f: torch.save(dict(checkpoint), f))


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu", mmap: bool = False) -> dict | None:
    """The checkpoint at ``path`` with its tensors on ``device``, or None if there is none. ``mmap=True`` maps the
    tensors from the file instead of reading them (quick, for a look at the metadata; never train with them).

    Raises:
        ValueError: the file is not a checkpoint of this format (the message names the file; delete it to start
            the run afresh).
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        checkpoint = torch.load(path, map_location=torch.device(device), weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ValueError(f"{path} is not a readable checkpoint ({type(err).__name__}: {err}); delete it to train "
                         "its run from the start") from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        found = checkpoint.get("format") if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"{path} is not a checkpoint of format {FORMAT} (found {found!r}); delete it to train its "
                         "run from the start")
    return checkpoint


class Checkpointer:
    """The checkpoint of one training run: where it lives, what it must match, and when to save.

    Args:
        directory: the checkpoint folder (``--checkpoint-dir``).
        experiment: the experiment's name (``"seq2seq"``, ``"transformer_translation"``).
        identity: the run's key in the results store, e.g. ``{"model": "bahdanau", "seed": 0}``.
        config: the run's configuration (JSON-like; leave out what does not change results, such as threads). A
            checkpoint made with another configuration is refused.
        every_s: save also inside an epoch once this many seconds (wall clock) have passed since the last save or
            the start; ``None`` saves only at the end of each epoch.

    Raises:
        ValueError: ``every_s`` is not positive, or see :func:`checkpoint_file`.
    """

    def __init__(self, directory: str | Path, experiment: str, identity: Mapping[str, Any], config: Mapping,
                 every_s: float | None = None):
        if every_s is not None and not every_s > 0:
            raise ValueError(f"every_s must be positive seconds or None, got {every_s!r}")
        self.path = checkpoint_file(directory, experiment, identity)
        self.experiment, self.identity, self.every_s = experiment, dict(identity), every_s
        self.config = _json_plain(dict(config))
        self.resumes: list[dict] = []
        self._last = time.monotonic()

    def load(self, device: torch.device | str = "cpu") -> dict | None:
        """The run's checkpoint, or None; a loaded one is recorded as a resume on ``device`` (:attr:`resumes`, kept
        in the next save). Its tensors stay on the CPU: ``load_state_dict`` moves them to the model's device, and
        an optimizer keeps Adam's ``step`` counts on the CPU, as torch expects without ``capturable``.

        Raises:
            ValueError: the file belongs to another experiment or run, or was made with another configuration (the
                message names the entries that differ), or see :func:`load_checkpoint`.
        """
        checkpoint = load_checkpoint(self.path)
        if checkpoint is None:
            return None
        if checkpoint.get("experiment") != self.experiment or _json_plain(checkpoint.get("identity")) != \
                _json_plain(self.identity):
            raise ValueError(f"{self.path} holds the run {checkpoint.get('experiment')} {checkpoint.get('identity')}, "
                             f"not {self.experiment} {self.identity}; delete or move it")
        differ = config_differences(checkpoint.get("config") or {}, self.config)
        if differ:
            raise ValueError(f"{self.path} was made with another configuration (entries {differ} differ); delete it "
                             "to train the run from the start with this one, or resume with the old configuration")
        self.resumes = list(checkpoint.get("resumes", [])) + [{
            "from_epoch": int(checkpoint["epoch"]), "from_step": int(checkpoint["step"]),
            "saved_utc": checkpoint.get("saved_utc"), "resumed_utc": _now(), "device": str(device)}]
        print(f"attnbook.checkpoint: {self.path.name}: resuming at epoch {checkpoint['epoch']}, step "
              f"{checkpoint['step']}", file=sys.stderr, flush=True)
        return checkpoint

    def due(self) -> bool:
        """Whether ``every_s`` seconds have passed since the last save (always False when ``every_s`` is None)."""
        return self.every_s is not None and time.monotonic() - self._last >= self.every_s

    def save(self, *, epoch: int, step: int, epochs: int, steps_per_epoch: int, state: Mapping,
             device: torch.device | str = "cpu") -> Path:
        """Save the run at this batch boundary: ``epoch`` (1-based) to continue with and ``step`` batches of it done
        (``epoch = epochs + 1, step = 0`` once training is complete); ``state`` is the experiment's own (module,
        optimizer and scheduler state dicts, running sums, history rows); the random generators are read here."""
        path = save_checkpoint(self.path, {
            "format": FORMAT, "experiment": self.experiment, "identity": self.identity, "config": self.config,
            "epoch": int(epoch), "step": int(step), "epochs": int(epochs), "steps_per_epoch": int(steps_per_epoch),
            "state": dict(state), "rng": rng_states(device), "resumes": self.resumes, "saved_utc": _now()})
        self._last = time.monotonic()
        return path

    def remove(self) -> None:
        """Delete the checkpoint (once its run is stored)."""
        self.path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------- command lines
def _positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        import argparse

        raise argparse.ArgumentTypeError(f"must be a positive number of minutes, got {text!r}")
    return value


def add_checkpoint_arguments(parser) -> None:
    """Add ``--checkpoint-dir DIR`` and ``--checkpoint-minutes M`` to an experiment's ``argparse`` parser (the
    translation experiments of chapters 4 and 8; read them back with :func:`checkpoint_every_s`)."""
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="save each run's training state there after every epoch and resume a run from it "
                             "(default: no checkpoints); a run's checkpoint is deleted once the run is stored")
    parser.add_argument("--checkpoint-minutes", type=_positive_minutes, default=None,
                        help="also save a checkpoint inside an epoch every M minutes (needs --checkpoint-dir)")


def checkpoint_every_s(parser, args) -> float | None:
    """Seconds between checkpoints inside an epoch (``--checkpoint-minutes`` times 60), or None; a
    ``--checkpoint-minutes`` without ``--checkpoint-dir`` is a usage error (``parser.error``, exit status 2)."""
    if args.checkpoint_minutes is not None and args.checkpoint_dir is None:
        parser.error(f"--checkpoint-minutes {args.checkpoint_minutes:g} needs --checkpoint-dir")
    return 60 * args.checkpoint_minutes if args.checkpoint_minutes is not None else None


def record_resumes(session, identity: Mapping[str, Any], resumes: list[dict]) -> None:
    """Note in a store session's record (:class:`attnbook.store.Session`) that the run ``identity`` was resumed
    from checkpoints: an entry of ``resumed_runs`` with the run's key, ``sessions`` (training sessions it took) and
    ``resumes`` (where each resume began: ``from_epoch``, ``from_step``, times and device). Runs trained in one go
    add nothing."""
    if resumes:
        session.extra.setdefault("resumed_runs", []).append(
            {**identity, "sessions": len(resumes) + 1, "resumes": list(resumes)})


def describe(directory: str | Path) -> list[dict]:
    """One entry per checkpoint in ``directory`` (sorted by file name): ``file``, ``experiment``, ``identity``,
    ``epoch``, ``step``, ``epochs``, ``steps_per_epoch``, ``done`` (fraction of the training steps), ``resumes``,
    ``saved_utc``; an unreadable file gets ``error`` instead. The GPU job prints this at its end."""
    out = []
    for path in sorted(Path(directory).glob("*.pt")):
        try:
            ck = load_checkpoint(path, mmap=True)
        except ValueError as err:
            out.append({"file": path.name, "error": str(err)})
            continue
        total = ck["epochs"] * ck["steps_per_epoch"]
        done = (ck["epoch"] - 1) * ck["steps_per_epoch"] + ck["step"]
        out.append({"file": path.name, "experiment": ck["experiment"], "identity": ck["identity"],
                    "epoch": ck["epoch"], "step": ck["step"], "epochs": ck["epochs"],
                    "steps_per_epoch": ck["steps_per_epoch"], "done": done / total if total else 1.0,
                    "resumes": len(ck.get("resumes", [])), "saved_utc": ck.get("saved_utc")})
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    """``python -m attnbook.checkpoint DIR``: one line per checkpoint in ``DIR`` (how far each run has trained)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m attnbook.checkpoint",
                                     description="List the training checkpoints in a folder.")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    entries = describe(args.directory) if args.directory.is_dir() else []
    for e in entries:
        if "error" in e:
            print(f"{e['file']}: {e['error']}")
        else:
            print(f"{e['file']}: epoch {e['epoch']} of {e['epochs']}, step {e['step']} of {e['steps_per_epoch']} "
                  f"({100 * e['done']:.0f}% trained), resumed {e['resumes']} times, saved {e['saved_utc']}")
    print(f"{len(entries)} checkpoints in {args.directory}")
    return entries


if __name__ == "__main__":  # pragma: no cover
    main()
