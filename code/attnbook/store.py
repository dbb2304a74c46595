"""The results store of the experiment command lines (``python -m attnbook.experiments.*``).

Stored results are the book's evidence: a crash, a kill or a mistake must never lose a finished run, duplicate one,
or mix two configurations. Every experiment CLI (masking, seq2seq, nli, hard_attention, attention_explanation)
keeps its results in one store, built from these files beside each other:

- ``<name>.csv``, the *main table*: one row per finished run, identified by the run's key columns
  (:attr:`Layout.keys`, e.g. the condition and the seed);
- ``<name>_<table>.csv``, *side tables* (e.g. per-epoch histories), whose rows carry the key of their run;
- ``<name>.json``, the provenance record (the *sidecar*): the configuration, versions, device and commit, and
  one entry per invocation in ``sessions``;
- ``<name>.csv.lock``, the lock file.

What it guarantees:

1. **One row per finished run, written whole.** A run's row is formatted completely, then written with one
   ``write`` to the file opened for appending, flushed and fsynced. Its side-table rows are written the same way
   *before* its row, so a run counts as finished exactly when its row is in the main table; side-table rows of a
   run without a row (killed in between) are dropped when the store is opened again. Resuming skips finished runs
   and never writes a run twice.
2. **Damaged tails are set aside.** On opening, a last line without its newline (a write cut by a crash), or one
   with the wrong number of fields or that is not CSV, is moved into ``<file>.damaged-<UTC time>`` with one line on
   stderr and cut from the file; its run then runs again. A damaged line *followed* by good ones is not a cut write:
   the store refuses to open and names the line.
3. **The header is checked** against the columns a run writes. A file that lacks only columns added since it was
   written (:attr:`Layout.added_columns`) is upgraded in place (written whole, then renamed): its runs get empty
   cells (NaN) there, since they never measured them. Any other mismatch is refused.
4. **One writer at a time.** Opening takes ``filelock.FileLock`` on ``<name>.csv.lock`` without waiting; a second
   process refuses to start (:class:`StoreLocked`).
5. **Configuration guard.** The sidecar's ``config`` must equal this invocation's, except for the settings that
   do not change results or only choose which runs to make (:attr:`Layout.not_configuration`: threads, workers,
   device, seeds, ...). A store that holds runs without its sidecar (or whose sidecar has no ``config``) is refused,
   since what made them cannot be checked.
6. **Provenance is written atomically** (whole into a temporary file, then ``os.replace``): :class:`Session` records
   one entry per invocation, rewritten after every run (status ``"running"``, so a killed run still leaves one)
   and ending ``"finished"``, ``"interrupted"`` or ``"failed"``. An interrupted command line exits non-zero: 130
   after Ctrl-C, 143 after SIGTERM.
7. :func:`merge` brings the finished runs of one store (e.g. made on a GPU elsewhere) into another made with the
   same configuration, under the destination's lock; also from the shell:
   ``python -m attnbook.store merge SRC.csv DST.csv``.
8. **Twins on another kind of device are other runs.** Where the layout names a :attr:`Layout.kind_column` (the
   ``device`` column of a run), the kind of device (:func:`device_kind`: ``"cpu"`` or ``"gpu"``) is part of a run's
   identity: a GPU run of a condition and seed does not stand in for its CPU twin, so a merge keeps both, and a CPU
   resume still makes the CPU run. The two are never averaged together (chapter 5 pairs runs within one kind).

The README's "Contributing" section summarises these rules.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .provenance import atomic_write_text, fsync_dir, git_commit, provenance, read_stored
from .runtime import get_mode, progress, run_tasks

__all__ = ["StoreError", "StoreLocked", "Layout", "ResultsStore", "Session", "check_out", "sidecar_path",
           "lock_path", "merge", "device_kind", "collect_runs", "StoredTables", "read_tables", "positive_int", "device_arg", "csv_path", "main"]


class StoreError(ValueError):
    """A store that cannot be opened or written as asked (the message says why and what to do)."""


class StoreLocked(StoreError):
    """Another process holds the store's lock."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _say(message: str) -> None:
    print(f"attnbook.store: {message}", file=sys.stderr, flush=True)


def device_kind(device: object) -> str:
    """The kind of device a run's ``device`` entry names: ``"cpu"`` for a CPU (``"CPU (1 threads, x86_64)"``,
    ``"cpu"``), ``"gpu"`` for anything else (``"NVIDIA H100 80GB HBM3"``, ``"cuda:0"``); ``"cpu"`` where none is
    recorded (an empty entry or NaN, as in runs stored before devices were recorded)."""
    return "gpu" if isinstance(device, str) and device.strip() and not device.strip().upper().startswith("CPU") \
        else "cpu"


def check_out(out: str | Path) -> Path:
    """``out`` as a Path, if it names a ``.csv`` file.

    Raises:
        StoreError: any other suffix (a ``.json`` name would be overwritten by its own provenance record).
    """
    path = Path(out)
    if path.suffix != ".csv":
        raise StoreError(f"--out must name a .csv file (its provenance record goes beside it as <name>.json), "
                         f"got {str(out)!r}")
    return path


def sidecar_path(out: str | Path) -> Path:
    """The provenance record of the store ``out``: ``<name>.json`` beside ``<name>.csv``."""
    return Path(out).with_suffix(".json")


def lock_path(out: str | Path) -> Path:
    """The lock file of the store ``out``: ``<name>.csv.lock``."""
    out = Path(out)
    return out.with_name(out.name + ".lock")


# ------------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Layout:
    """What a store of one experiment holds.

    Attributes:
        experiment: a name (``"masking"``, ...), recorded in the sidecar.
        keys: the columns that identify a run; every table has them.
        columns: the main table's header (the keys included), in the order new files are written.
        added_columns: columns added after runs were first stored; a file without them is upgraded (NaN).
        tables: side tables, ``{name: header}``; each lives in ``<stem>_<name>.csv``.
        not_configuration: entries of the configuration that the guard ignores: settings that do not change results
            (threads, device, workers) and those that only choose runs (seeds, the grid).
        legacy_config: settings added to the configuration after runs were first stored, with the value those runs
            had: a record that lacks such an entry is read as having that value.
        kind_column: a column naming the device a run ran on (``"device"``), or None. If set, the kind of that
            device (:func:`device_kind`) is part of a run's identity besides :attr:`keys` (guarantee 8 of the
            module docstring); every side table must have the column too.

    Raises:
        ValueError: a key (or the kind column) missing from the columns or from a side table, an added column not
            among the columns, or a column named twice.
    """

    experiment: str
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    added_columns: tuple[str, ...] = ()
    tables: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    not_configuration: tuple[str, ...] = ()
    legacy_config: Mapping[str, Any] = field(default_factory=dict)
    kind_column: str | None = None

    def __post_init__(self):
        for name, header in {"": self.columns, **self.tables}.items():
            where = f"table {name!r}" if name else "columns"
            if len(set(header)) != len(header):
                raise ValueError(f"Layout {where} name a column twice: {list(header)}")
            missing = [k for k in self.keys if k not in header]
            if missing:
                raise ValueError(f"Layout {where} lack the key columns {missing}")
            if self.kind_column is not None and self.kind_column not in header:
                raise ValueError(f"Layout {where} lack the kind_column {self.kind_column!r}")
        if set(self.added_columns) - set(self.columns):
            raise ValueError(f"added_columns {sorted(set(self.added_columns) - set(self.columns))} are not columns")

    def table_path(self, out: str | Path, table: str | None = None) -> Path:
        """The file of the main table (``table=None``: ``out`` itself) or of a side table (``<stem>_<table>.csv``)."""
        out = Path(out)
        return out if table is None else out.with_name(f"{out.stem}_{table}.csv")

    def to_json(self) -> dict:
        return {"experiment": self.experiment, "keys": list(self.keys), "columns": list(self.columns),
                "added_columns": list(self.added_columns), "tables": {k: list(v) for k, v in self.tables.items()},
                "not_configuration": list(self.not_configuration), "legacy_config": dict(self.legacy_config),
                "kind_column": self.kind_column}

    @classmethod
    def from_json(cls, data: Mapping) -> "Layout":
        return cls(data["experiment"], tuple(data["keys"]), tuple(data["columns"]), tuple(data["added_columns"]),
                   {k: tuple(v) for k, v in data.get("tables", {}).items()}, tuple(data["not_configuration"]),
                   dict(data.get("legacy_config", {})), data.get("kind_column"))


def _json_plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists, unknown objects strings)."""
    return json.loads(json.dumps(value, default=str))


def config_differences(stored: Mapping, config: Mapping, ignore: Iterable[str] = ()) -> list[str]:
    """The entries (sorted) in which two configurations differ, leaving out ``ignore``; an entry present in only
    one of them differs."""
    ignore, missing = set(ignore), object()
    a, b = _json_plain(dict(stored)), _json_plain(dict(config))
    return sorted(k for k in (a.keys() | b.keys()) - ignore if a.get(k, missing) != b.get(k, missing))


# ------------------------------------------------------------------------------------------------- one CSV file
def _parse_line(raw: bytes) -> list[str] | None:
    """The fields of one CSV line, or None if it is not UTF-8 or not CSV (an unclosed quote, say)."""
    try:
        rows = list(csv.reader([raw.decode("utf-8")], strict=True))
    except (UnicodeDecodeError, csv.Error):
        return None
    return rows[0] if len(rows) == 1 else None


def _serialize(records: Iterable[list[str]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(records)
    return buffer.getvalue()


def _append_bytes(path: Path, data: bytes) -> None:
    """Append ``data`` with one ``write`` (repeated only if the system wrote less), then fsync."""
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(path.parent)


class _TableFile:
    """One CSV file of a store: its header, its good lines and their fields."""

    def __init__(self, path: Path, columns: tuple[str, ...], added: tuple[str, ...], keys: tuple[str, ...],
                 kind_column: str | None = None):
        self.path, self.columns, self.added, self.keys = path, columns, added, keys
        self.kind_column = kind_column
        self.header: list[str] | None = None     # None: no file yet, or an empty one
        self.lines: list[bytes] = []             # the data lines, without their newline
        self.records: list[list[str]] = []

    def key(self, record: list[str], header: list[str] | None = None) -> tuple[str, ...]:
        """A run's identity: its key fields, and the kind of its device if the layout names a kind column."""
        header = header or self.header
        key = tuple(record[header.index(k)] for k in self.keys)
        return key if self.kind_column is None else key + (device_kind(record[header.index(self.kind_column)]),)

    def load(self, repair: bool) -> None:
        """Read the file; set aside (``repair``) or leave out a damaged tail; check and upgrade the header."""
        data = self.path.read_bytes() if self.path.exists() else b""
        self.header, self.lines, self.records = None, [], []
        if not data:
            return
        parts = data.split(b"\n")
        complete, partial = parts[:-1], parts[-1]
        starts = [0]
        for line in complete:
            starts.append(starts[-1] + len(line) + 1)
        damaged_from = None
        if not complete:                                     # the header itself was cut
            damaged_from = 0
        else:
            header = _parse_line(complete[0])
            if not header or header == [""]:
                raise StoreError(f"{self.path}: its first line is not a CSV header; move the file away, or write to "
                                 "another --out")
            records = [_parse_line(line) for line in complete[1:]]
            bad = [i for i, r in enumerate(records) if r is None or len(r) != len(header)]
            if bad and bad[0] != len(records) - 1:
                raise StoreError(f"{self.path}, line {bad[0] + 2}: damaged (not CSV, or {len(header)} fields "
                                 "expected), with more lines after it: not a cut write; repair the file by hand, or "
                                 "write to another --out")
            if bad:
                records.pop()
                damaged_from = starts[len(complete) - 1]
            elif partial:
                damaged_from = starts[len(complete)]
            self.header, self.records = header, records
            self.lines = complete[1:1 + len(records)]
        if damaged_from is not None:
            tail = data[damaged_from:]
            if repair:
                stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
                aside = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
                _append_bytes(aside, tail)
                with open(self.path, "r+b") as f:
                    f.truncate(damaged_from)
                    f.flush()
                    os.fsync(f.fileno())
                _say(f"{self.path}: set aside a damaged last line ({len(tail)} bytes, from a write that was cut) in "
                     f"{aside.name}; its run will run again")
            else:
                _say(f"{self.path}: left out a damaged last line ({len(tail)} bytes, from a write that was cut)")
        self._check_header(repair)

    def _check_header(self, repair: bool) -> None:
        if self.header is None:
            return
        missing = [c for c in self.columns if c not in self.header]
        unknown = [c for c in self.header if c not in self.columns]
        if unknown or set(missing) - set(self.added) or len(set(self.header)) != len(self.header):
            raise StoreError(f"{self.path} has a header that does not match the results of a run: missing {missing}, "
                             f"unknown {unknown}; write to another --out")
        if missing and repair:  # written before the added columns existed: upgrade, whole and then renamed
            records = [self._reorder(r, self.header, list(self.columns)) for r in self.records]
            atomic_write_text(self.path, _serialize([list(self.columns), *records]))
            _say(f"{self.path}: added the columns {missing} (empty for its {len(records)} stored runs)")
            self.load(repair)

    @staticmethod
    def _reorder(record: list[str], header: list[str], target: list[str]) -> list[str]:
        by_name = dict(zip(header, record))
        return [by_name.get(c, "") for c in target]

    def format(self, rows: list[dict]) -> list[list[str]]:
        """The fields of ``rows`` in this file's column order, as pandas writes them."""
        header = self.header or list(self.columns)
        unknown = sorted({c for row in rows for c in row} - set(header))
        if unknown:
            raise StoreError(f"{self.path}: a run gave the columns {unknown}, which its header lacks")
        text = pd.DataFrame(rows).reindex(columns=header).to_csv(None, header=False, index=False, lineterminator="\n")
        lines = text.split("\n")[:-1]
        records = [_parse_line(line.encode()) for line in lines]
        if len(lines) != len(rows) or any(r is None or len(r) != len(header) for r in records):
            raise StoreError(f"{self.path}: a value holds a line break; a row must stay on one line")
        return records

    def append(self, records: list[list[str]], header: list[str] | None = None) -> None:
        """Append ``records`` (fields in ``header`` order, default this file's) with one write, fsynced."""
        if not records:
            return
        target = self.header or list(self.columns)
        if header is not None:
            records = [self._reorder(r, header, target) for r in records]
        text = _serialize(records)
        if self.header is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            text = _serialize([target]) + text
        _append_bytes(self.path, text.encode("utf-8"))
        self.header = target
        self.records.extend(records)
        self.lines.extend(line.encode() for line in _serialize(records).split("\n")[:-1])

    def keep(self, keys: set, repair: bool) -> int:
        """Drop the lines whose run is not in ``keys`` (rewritten whole if ``repair``); return how many."""
        keep = [self.key(r) in keys for r in self.records]
        dropped = keep.count(False)
        if dropped:
            self.records = [r for r, k in zip(self.records, keep) if k]
            self.lines = [line for line, k in zip(self.lines, keep) if k]
            if repair:
                header = _serialize([self.header]).encode()
                atomic_write_text(self.path, (header + b"".join(line + b"\n" for line in self.lines)).decode())
        return dropped


# ------------------------------------------------------------------------------------------------- the store
class ResultsStore:
    """The store ``out`` (see the module docstring), opened with :meth:`open` or ``with``.

    Args:
        out: the main table, a ``.csv`` path (its parents are created).
        layout: the experiment's :class:`Layout`.
        config: this invocation's configuration (JSON-able), checked against the sidecar's and written into it.
        read_only: take the lock and read, but repair nothing (a damaged tail is left out, not set aside) and write
            nothing (what :func:`merge` does with its source).
        device: the device this invocation runs on (``"cpu"``, ``"cuda:0"``), for a layout with a
            :attr:`Layout.kind_column`: :meth:`has` asks about runs on this kind of device unless told another.

    Raises (from :meth:`open`):
        StoreError: ``out`` is not a ``.csv`` path, a header does not match, a damaged line is not the last one, the
            runs have no sidecar, or the sidecar's configuration differs (the message names the entries).
        StoreLocked: another process holds the lock.
    """

    def __init__(self, out: str | Path, layout: Layout, config: Mapping | None = None, *, read_only: bool = False,
                 device: str | None = None):
        from filelock import FileLock

        self.out = check_out(out)
        self.layout = layout
        self.config = _json_plain(dict(config)) if config is not None else None
        self.sidecar = sidecar_path(self.out)
        self.read_only = read_only
        self.device = device
        self._lock = FileLock(str(lock_path(self.out)))
        self.previous: dict = {}
        self.done: set[tuple[str, ...]] = set()
        self.main = _TableFile(self.out, layout.columns, layout.added_columns, layout.keys, layout.kind_column)
        self.tables = {name: _TableFile(layout.table_path(self.out, name), header, (), layout.keys,
                                        layout.kind_column)
                       for name, header in layout.tables.items()}
        self.is_open = False

    # -- opening and closing
    def open(self) -> "ResultsStore":
        from filelock import Timeout

        if not self.read_only:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise StoreLocked(f"another process is writing to {self.out} (it holds {lock_path(self.out).name}); "
                              "wait until it ends, or write to another --out") from None
        try:
            self._load()
        except BaseException:
            self._lock.release()
            raise
        self.is_open = True
        return self

    def close(self) -> None:
        if self.is_open:
            self._lock.release()
            self.is_open = False

    def __enter__(self) -> "ResultsStore":
        return self if self.is_open else self.open()

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    def _load(self) -> None:
        repair = not self.read_only
        for table in (self.main, *self.tables.values()):
            table.load(repair)
        self.previous = read_record(self.sidecar)
        n = len(self.main.records)
        if n and not self.sidecar.exists():
            raise StoreError(f"{self.out} holds {n} finished runs but their provenance record {self.sidecar.name} is "
                             "missing, so the configuration that made them cannot be checked; restore it (e.g. with "
                             "git checkout), or write to another --out")
        stored = self.previous.get("config")
        if n and stored is None:
            raise StoreError(f"{self.out} holds {n} finished runs but {self.sidecar.name} records no configuration, "
                             "so it cannot be checked; write to another --out")
        if stored is not None and self.config is not None:
            stored = {**self.layout.legacy_config, **stored}
            changed = config_differences(stored, self.config, self.layout.not_configuration)
            if changed:
                raise StoreError(f"{self.out} holds runs made with another configuration (differs in {changed}); "
                                 "resume only with the same settings, or write to another --out")
        keys = [self.main.key(r) for r in self.main.records]
        self.done = set(keys)
        if len(self.done) < len(keys):
            same = [*self.layout.keys] + ([f"kind of {self.layout.kind_column}"] if self.layout.kind_column else [])
            _say(f"{self.out} holds {len(keys) - len(self.done)} duplicate runs (same {same}); "
                 "they are kept, and no further copy is written")
        for name, table in self.tables.items():
            dropped = table.keep(self.done, repair)
            if dropped and repair:
                _say(f"{table.path}: dropped {dropped} rows of runs that did not finish; they will run again")

    # -- reading
    @property
    def n_runs(self) -> int:
        """The finished runs stored (rows of the main table)."""
        return len(self.main.records)

    def key_of(self, values: Mapping) -> tuple[str, ...]:
        """The stored form of a run's identity, from its values (e.g. ``{"model": "bahdanau"}``): its key fields,
        and for a layout with a :attr:`Layout.kind_column` the kind of device of ``values[kind_column]``, or of
        the store's ``device`` if ``values`` has none.

        Raises:
            StoreError: the layout has a kind column, and neither ``values`` nor the store names a device.
        """
        fields = _TableFile(self.out, self.layout.keys, (), self.layout.keys).format([{k: values[k] for k in
                                                                                       self.layout.keys}])
        kind = self.layout.kind_column
        if kind is None:
            return tuple(fields[0])
        device = values.get(kind, self.device)
        if device is None:
            raise StoreError(f"{self.out}: a run is identified by its {kind!r} too; pass it in the values, or open "
                             "the store with device=...")
        return tuple(fields[0]) + (device_kind(str(device)),)

    def has(self, values: Mapping) -> bool:
        """Whether the run with these key values (and on this kind of device, for a layout with a
        :attr:`Layout.kind_column`) is stored."""
        return self.key_of(values) in self.done

    def frame(self, table: str | None = None) -> pd.DataFrame:
        """The main table (``table=None``) or a side table as a DataFrame (no rows, with the header, if empty)."""
        t = self.main if table is None else self.tables[table]
        if not t.records:
            return pd.DataFrame(columns=list(t.header or t.columns))
        return pd.read_csv(t.path)

    # -- writing
    def append(self, row: Mapping, tables: Mapping[str, pd.DataFrame | list[dict]] | None = None) -> tuple[str, ...]:
        """Store one finished run: its side-table rows first, then its row (each table with one fsynced write).

        Args:
            row: the run's main-table row (a dict; missing columns are left empty).
            tables: its rows of side tables, each with the run's key values.

        Returns:
            The run's key.

        Raises:
            StoreError: the run is stored already, a row has a column the header lacks, a side-table row carries
                another key, or an unknown side table; the store is not open for writing.
        """
        if not self.is_open or self.read_only:
            raise StoreError(f"{self.out} is not open for writing")
        record = self.main.format([dict(row)])[0]
        side = {}
        for name, rows in (tables or {}).items():
            if name not in self.tables:
                raise StoreError(f"{self.out}: no side table {name!r} (the layout has {sorted(self.tables)})")
            rows = rows.to_dict("records") if isinstance(rows, pd.DataFrame) else [dict(r) for r in rows]
            side[name] = self.tables[name].format(rows) if rows else []
        self._append(record, side)
        return self.main.key(record)

    def _append(self, record: list[str], side: Mapping[str, list[list[str]]],
                headers: Mapping[str | None, list[str]] | None = None) -> None:
        """Append one run given as fields (in ``headers`` order per table, default each file's own)."""
        headers = headers or {}
        main_header = headers.get(None, self.main.header or list(self.main.columns))
        key = self.main.key(record, main_header)
        if key in self.done:
            names = [*self.layout.keys] + (["device kind"] if self.layout.kind_column else [])
            raise StoreError(f"{self.out}: the run {dict(zip(names, key))} is stored already")
        for name, records in side.items():
            table = self.tables[name]
            header = headers.get(name, table.header or list(table.columns))
            for r in records:
                if table.key(r, header) != key:
                    raise StoreError(f"{table.path}: a row carries the key {list(table.key(r, header))}, not its "
                                     f"run's {list(key)}")
            table.append(records, header if name in headers else None)
        self.main.append([record], main_header if None in headers else None)
        self.done.add(key)

    def write_record(self, record: Mapping) -> None:
        """Write the sidecar atomically (:func:`attnbook.provenance.atomic_write_text`)."""
        atomic_write_text(self.sidecar, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def read_record(path: str | Path) -> dict:
    """The provenance record at ``path`` (``{}`` if there is none).

    Raises:
        StoreError: the file is not JSON.
    """
    path = Path(path)
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise StoreError(f"{path} is not valid JSON ({err}); restore it (e.g. with git checkout)") from None


@dataclass
class StoredTables:
    """A results store as read back for a chapter (:func:`read_tables`): ``runs`` (the main table), ``tables`` (the
    side tables found, ``{name: frame}``; a missing file is left out) and ``provenance`` (the sidecar)."""

    runs: pd.DataFrame
    tables: dict[str, pd.DataFrame]
    provenance: dict

    def differences(self, config: Mapping, layout: Layout) -> list[str]:
        """The entries in which the recorded configuration differs from ``config``, leaving out
        ``layout.not_configuration`` (:func:`config_differences`); empty if these runs were made with ``config``."""
        return config_differences(self.provenance.get("config", {}), config, layout.not_configuration)


def read_tables(name: str, tables: Iterable[str] = (), start: str | Path | None = None,
                dtype: Mapping[str, Any] | None = None) -> StoredTables | None:
    """The stored runs ``results/<name>.csv``, the side tables ``results/<name>_<table>.csv`` of ``tables`` and the
    provenance ``results/<name>.json``, found as :func:`attnbook.provenance.read_stored` finds them (from ``start``
    upwards; on Colab from the book's repository), each table read with pandas (``dtype`` passed on, e.g.
    ``{"init": str}``). The chapters read their stored runs through it (chapters 3, 4, 8 and 9).

    Returns:
        None if the main table or the provenance is missing; else a :class:`StoredTables` whose ``tables`` hold the
        side tables that exist.
    """
    main, sidecar = read_stored(name + ".csv", start), read_stored(name + ".json", start)
    if main is None or sidecar is None:
        return None
    texts = {table: read_stored(f"{name}_{table}.csv", start) for table in tables}
    return StoredTables(pd.read_csv(io.StringIO(main), dtype=dtype),
                        {table: pd.read_csv(io.StringIO(text), dtype=dtype) for table, text in texts.items()
                         if text is not None},
                        json.loads(sidecar))


def collect_runs(task: Callable, arguments: Iterable[tuple], n_tasks: int, *, workers: int = 1,
                 store: "ResultsStore | None" = None, keys: Iterable[str] = (), show_progress: bool = True,
                 on_run: Callable[[pd.DataFrame], object] | None = None, tables: Iterable[str] = ()
                 ) -> pd.DataFrame | tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Run ``task(*args)`` for each of the ``n_tasks`` tuples of ``arguments`` (on ``workers`` processes, through
    :func:`attnbook.runtime.run_tasks`, in the order they finish) and gather their rows: each finished row (a dict)
    is appended to ``store`` at once (whole and fsynced, :meth:`ResultsStore.append`), then ``on_run`` is called with
    every run so far. The experiments' ``run_grid`` functions (chapters 5, 8 and 9) share this loop.

    ``tables`` names side tables of the store's layout that every run has rows in (chapter 9's sink experiment:
    ``("groups",)``). Then ``task`` returns ``(row, {table: rows})`` (rows a DataFrame or a list of dicts, each with
    the run's key), and the store gets the side-table rows with the row, before it (guarantee 1 of the module
    docstring).

    Returns:
        Every run: the stored ones (``store.frame()`` as it was before this call), then this call's, sorted by
        ``keys`` (stable) if given. With ``tables``, ``(runs, {table: frame})``: each side table of every run, read
        back from ``store`` after the last run (file order), or without a store this call's rows in the order the
        runs finished.
    """
    tables = tuple(tables)
    done = store.frame() if store is not None else pd.DataFrame()
    rows: list[Mapping] = []
    side: dict[str, list[pd.DataFrame]] = {name: [] for name in tables}

    def so_far() -> pd.DataFrame:  # every run: the stored ones, then this call's
        return pd.concat([done, pd.DataFrame(rows)], ignore_index=True) if len(done) else pd.DataFrame(rows)

    bar = progress(total=n_tasks, desc="runs", disable=not show_progress)
    for result in run_tasks(task, arguments, workers, ordered=False):
        row, parts = result if tables else (result, {})
        if store is not None:
            store.append(row, parts or None)
        rows.append(row)
        for name in tables:
            side[name].append(pd.DataFrame(parts.get(name, [])))
        bar.update(1)
        if on_run is not None:
            on_run(so_far())
    bar.close()
    frame = so_far()
    keys = list(keys)
    if len(frame) and keys:
        frame = frame.sort_values(keys, kind="stable").reset_index(drop=True)
    if not tables:
        return frame
    if store is not None:
        return frame, {name: store.frame(name) for name in tables}
    return frame, {name: pd.concat([f for f in parts if len(f)], ignore_index=True) if any(map(len, parts))
                   else pd.DataFrame() for name, parts in side.items()}


# ------------------------------------------------------------------------------------------------- sessions
class Session:
    """One invocation's entry in the sidecar's ``sessions``, written when it starts, after every run
    (:meth:`checkpoint`) and when it ends, each time atomically.

    Args:
        store: an open :class:`ResultsStore`.
        describe: called with the session's wall time (seconds) for the record's top-level entries, typically
            :func:`attnbook.provenance.provenance` plus the experiment's own; ``config``, ``store``, ``commit``
            (of the code when the session started), ``n_runs``, ``sessions`` and ``total_wall_time_s`` are set here.
        cli: a command line's session: SIGTERM interrupts it like Ctrl-C, and an interruption ends the process with
            ``SystemExit(130)`` (Ctrl-C) or ``SystemExit(143)`` (SIGTERM) once the record says ``"interrupted"``.
            Otherwise (from Python) the ``KeyboardInterrupt`` goes on.
        **extra: entries of this session's record (e.g. ``workers``).

    A session that ends with another exception is recorded as ``"failed"`` with the error, and the exception goes on.
    An earlier session still recorded as ``"running"`` when a new one starts was killed without recording its end
    (the store's lock rules out a live one); the new session rewrites its status as ``"killed"``.
    """

    def __init__(self, store: ResultsStore, describe: Callable[[float], Mapping], *, cli: bool = True, **extra):
        self.store, self.describe, self.cli, self.extra = store, describe, cli, extra
        self.signum: int | None = None
        self._handler = None

    def __enter__(self) -> "Session":
        self._start = time.perf_counter()
        self.started_utc = _now()
        self.commit = git_commit(Path(__file__).resolve().parent)   # the code that runs, even if HEAD moves
        self.runs_at_start = self.store.n_runs
        self._main_thread = threading.current_thread() is threading.main_thread()
        if self.cli and self._main_thread:
            self._handler = signal.signal(signal.SIGTERM, self._terminate)
        try:
            self.write("running")
        except KeyboardInterrupt:     # interrupted at once: recorded as such (and SystemExit for a command line)
            self.__exit__(KeyboardInterrupt, KeyboardInterrupt(), None)
            raise
        except BaseException:
            self._restore()
            raise
        return self

    def _terminate(self, signum, frame) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def _restore(self) -> None:
        if self.cli and self._main_thread:
            signal.signal(signal.SIGTERM, self._handler)

    def checkpoint(self) -> None:
        """Rewrite the record after a finished run (status ``"running"``)."""
        self.write("running")

    def write(self, status: str, error: str | None = None) -> None:
        wall = time.perf_counter() - self._start
        record = {k: v for k, v in self.store.previous.items() if k == "merges"}
        record.update(self.describe(wall))
        record.update(commit=self.commit, store=self.store.layout.to_json(), n_runs=self.store.n_runs)
        record["config"] = self.store.config if self.store.config is not None else self.store.previous.get("config")
        session = {"started_utc": self.started_utc, "date_utc": record.get("date_utc", _now()),
                   "wall_time_s": round(wall, 2), "commit": self.commit, "device": record.get("device"),
                   "status": status, "interrupted": status != "finished",
                   "runs_added": self.store.n_runs - self.runs_at_start, **self.extra}
        if error:
            session["error"] = error
        # The store's lock admits one process at a time, so an earlier session still marked "running" was killed
        # before it could record its end (SIGKILL, a lost machine): say so. Its finished runs are in the table.
        earlier = [dict(s, status="killed", interrupted=True) if s.get("status") == "running" else s
                   for s in self.store.previous.get("sessions", [])]
        record["sessions"] = earlier + [session]
        record["total_wall_time_s"] = round(sum(s.get("wall_time_s") or 0 for s in record["sessions"]), 2)
        self.store.write_record(record)

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.cli and self._main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)   # no second interruption while the record is written
        try:
            if exc_type is None:
                self.write("finished")
            elif issubclass(exc_type, KeyboardInterrupt):
                self.write("interrupted")
            else:
                self.write("failed", error=f"{exc_type.__name__}: {exc}"[:500])
        finally:
            self._restore()
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and self.cli:
            name = "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"
            print(f"interrupted ({name}): {self.store.n_runs} finished runs are in {self.store.out}; the same "
                  "command resumes", file=sys.stderr, flush=True)
            raise SystemExit(128 + int(self.signum or signal.SIGINT)) from None
        return False


# ------------------------------------------------------------------------------------------------- grid sessions
def run_grid_in_session(run_grid: Callable[..., pd.DataFrame], open_store: Callable[..., ResultsStore], cfg: Any,
                        data: Any, *, out: str | Path, device: Any, workers: int, only: list[str] | None,
                        show_progress: bool, on_run: Callable[[pd.DataFrame], object] | None) -> pd.DataFrame:
    """What an experiment's ``run_grid`` does when given a path as ``out`` (chapters 5, 8 and 9): open the store
    ``open_store(out, cfg, device)`` under its lock, record one session from Python (:class:`Session` with
    ``cli=False``: an interruption is recorded and the ``KeyboardInterrupt`` goes on), and call ``run_grid`` again
    with the open store.

    Returns:
        What ``run_grid`` returns.

    Raises:
        StoreError: ``out`` cannot be resumed (see :class:`ResultsStore`).
    """
    def describe(wall: float) -> dict:
        return provenance(wall_time_s=wall, device=device, workers=workers, only=only)

    with open_store(out, cfg, device) as store, Session(store, describe, cli=False, workers=workers, only=only):
        return run_grid(cfg, data, workers=workers, out=store, device=device, show_progress=show_progress,
                        only=only, on_run=on_run)


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workers``, ``--backend {local,dask}`` and ``--scheduler ADDRESS``: where an experiment's runs go
    (:func:`attnbook.runtime.run_tasks`). Every experiment command line with ``--workers`` takes them."""
    from .runtime import BACKENDS

    parser.add_argument("--workers", type=positive_int, default=1,
                        help="worker processes: joblib's on this machine, or a Dask LocalCluster's (default 1)")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="local: joblib processes on this machine (default); dask: a Dask cluster, a "
                             "LocalCluster of --workers processes unless --scheduler is given")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="an existing Dask scheduler, e.g. tcp://10.0.0.1:8786 (with --backend dask)")


def check_backend_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit status 2) for ``--scheduler`` without ``--backend dask``."""
    if args.scheduler is not None and args.backend != "dask":
        parser.error(f"argument --scheduler: needs --backend dask, got --backend {args.backend}")


def backend_record(args: argparse.Namespace) -> dict:
    """What a session records of its engine: ``backend`` and, for an existing cluster, its ``scheduler``."""
    record = {"backend": args.backend}
    if args.scheduler is not None:
        record["scheduler"] = args.scheduler
    return record


def grid_parser(prog: str, description: str, default_out: str, only_help: str, default_device: str | None = None
                ) -> argparse.ArgumentParser:
    """The arguments that the grid experiments' command lines share (chapters 5, 8 and 9): ``--mode``, ``--seeds``,
    ``--only``, ``--workers``, ``--threads``, ``--device`` (default ``default_device``, or without one cuda if
    available, else cpu), ``--out`` (default ``default_out``) and ``--no-progress``; an experiment adds its own."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--mode", choices=("quick", "full"), default=None, help="default: full on a GPU, else quick")
    parser.add_argument("--seeds", type=positive_int, default=None,
                        help="number of seeds (0..N-1); default: the mode's")
    parser.add_argument("--only", default=None, help=only_help)
    add_backend_arguments(parser)
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads per worker")
    parser.add_argument("--device", type=device_arg, default=default_device,
                        help=f"default: {default_device or 'cuda if available, else cpu'}")
    parser.add_argument("--out", type=csv_path, default=Path(default_out))
    parser.add_argument("--no-progress", action="store_true")
    return parser


def grid_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: Any, grid: Iterable[str],
                   **changes: Any) -> tuple[Any, list[str] | None, Any]:
    """The first half of a grid experiment's command line (chapters 8 and 9), once ``parser`` (:func:`grid_parser`)
    has parsed ``args``: the mode's configuration ``cfg`` with ``--threads``, ``--seeds`` (seeds 0 .. N-1) and
    ``changes`` applied, ``--only`` split at commas and checked against the condition names ``grid``, and the
    device (``--device``, default cuda if available, else cpu).

    Returns:
        ``(cfg, only, device)``: ``only`` is None without ``--only``; ``device`` a ``torch.device``.

    Raises:
        SystemExit: ``--only`` names a condition that is not in ``grid`` (a usage error, exit status 2, naming it).
    """
    import dataclasses

    import torch

    from .runtime import get_device

    changes = {k: v for k, v in {"threads": args.threads, **changes}.items() if v is not None}
    if args.seeds is not None:
        changes["seeds"] = tuple(range(args.seeds))
    cfg = dataclasses.replace(cfg, **changes)
    grid = list(grid)
    only = args.only.split(",") if args.only else None
    unknown = set(only or ()) - set(grid)
    if unknown:
        parser.error(f"--only names conditions that are not in the grid: {sorted(unknown)}; the grid is {grid}")
    return cfg, only, torch.device(args.device) if args.device else get_device()


def run_grid_cli(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: Any, *,
                 run_grid: Callable[..., pd.DataFrame], open_store: Callable[..., ResultsStore],
                 only: list[str] | None, device: Any,
                 extra: Callable[[pd.DataFrame], Mapping] | None = None) -> pd.DataFrame:
    """The second half of a grid experiment's command line (chapters 5, 8 and 9), once its arguments are checked:
    open the store ``args.out`` (one that cannot be resumed is a usage error, before any data are loaded), run
    ``run_grid`` in one command-line :class:`Session` (SIGTERM and Ctrl-C are recorded as an interruption and exit
    with 143 or 130), and print where the runs are.

    The session's record is rewritten after every finished run, so that a run killed without notice (SIGKILL, a
    machine that goes away) still leaves a record of its session: status ``"running"``, with the wall time up to its
    last finished run (the next session marks it ``"killed"``). The record's entries:
    :func:`attnbook.provenance.provenance` with the mode, workers, ``only``, CPU count and number of runs, and
    ``extra(frame)`` of every run so far.

    Returns:
        Every run in the store, as ``run_grid`` returns them.
    """
    from .runtime import parallel_backend

    check_backend_arguments(parser, args)
    try:
        store = open_store(args.out, cfg, device)
    except StoreError as err:
        parser.error(str(err))
    latest = {"frame": store.frame()}
    engine = backend_record(args)

    def describe(wall: float) -> dict:
        frame = latest["frame"]
        return provenance(wall_time_s=wall, device=device, mode=args.mode or get_mode(), workers=args.workers,
                          **engine, only=only, cpu_count=os.cpu_count(), n_runs=len(frame),
                          **(dict(extra(frame)) if extra is not None else {}))

    def checkpoint(frame: pd.DataFrame) -> None:
        latest["frame"] = frame
        session.checkpoint()

    with store, Session(store, describe, workers=args.workers, **engine, only=only) as session, \
            parallel_backend(args.backend, args.scheduler):
        latest["frame"] = run_grid(cfg, workers=args.workers, out=store, device=device,
                                   show_progress=not args.no_progress, only=only, on_run=checkpoint)
    print(f"{store.n_runs} runs in {args.out}; provenance in {store.sidecar}")
    return latest["frame"]


# ------------------------------------------------------------------------------------------------- merge
def _session_id(session: Mapping) -> str:
    return json.dumps({k: v for k, v in session.items() if k not in ("merged_from", "merged_utc")}, sort_keys=True,
                      default=str)


def _current_layout(experiment: str) -> Layout | None:
    """The :data:`LAYOUT` of ``attnbook.experiments.<experiment>``, if that module defines one for this experiment."""
    import importlib

    if not experiment.isidentifier():
        return None
    try:
        module = importlib.import_module(f"{__package__}.experiments.{experiment}")
    except ImportError:
        return None
    layout = getattr(module, "LAYOUT", None)
    return layout if isinstance(layout, Layout) and layout.experiment == experiment else None


def merge(src: str | Path, dst: str | Path) -> dict:
    """Merge the finished runs of the store ``src`` into the store ``dst`` (created if absent).

    Both are opened under their locks; ``dst`` is repaired as on a resume (damaged tail, header upgrade), ``src`` is
    only read. The two must hold the same experiment (the ``store`` entry of either sidecar gives the layout; the
    experiment module's own ``LAYOUT`` is used where it extends theirs) and the same configuration up to
    :attr:`Layout.not_configuration`. Runs already in ``dst`` (the same key, and for a
    layout with a :attr:`Layout.kind_column` the same kind of device) are skipped; each other run
    is appended as on a resume (side-table rows, then its row, each written whole and fsynced), in ``src``'s order.
    ``src``'s sessions are appended to ``dst``'s sidecar, each marked ``merged_from`` (the path of ``src``) and
    ``merged_utc``, unless an earlier merge brought them already, and the merge is listed under ``merges``. A merge
    cut short can simply be repeated.

    Returns:
        ``{"added": runs appended, "skipped": runs already in dst, "sessions": sessions appended}``.

    Raises:
        StoreError: a path that is not ``.csv``, the same store twice, ``src`` without runs file or sidecar, no
            layout in either sidecar, two different experiments, another configuration, or a store that is locked.
    """
    src, dst = check_out(src), check_out(dst)
    if src.resolve() == dst.resolve():
        raise StoreError(f"merge: {src} and {dst} are the same store")
    if not src.exists():
        raise StoreError(f"merge: {src} does not exist")
    src_meta, dst_meta = read_record(sidecar_path(src)), read_record(sidecar_path(dst))
    if not src_meta:
        raise StoreError(f"merge: {src} has no provenance record {sidecar_path(src).name}, so its configuration "
                         "cannot be checked")
    layouts = [Layout.from_json(m["store"]) for m in (src_meta, dst_meta) if m.get("store")]
    if not layouts:
        raise StoreError(f"merge: neither {sidecar_path(src).name} nor {sidecar_path(dst).name} records the store's "
                         "layout (its 'store' entry); open one of them once with its experiment's command line")
    if len(layouts) == 2 and (layouts[0].keys, set(layouts[0].columns)) != (layouts[1].keys, set(layouts[1].columns)):
        raise StoreError(f"merge: {src} and {dst} hold different experiments ({layouts[0].experiment} and "
                         f"{layouts[1].experiment})")
    # The experiment's layout as the code defines it now, where it extends the recorded ones (sidecars written
    # before a column or the kind column was added); else the destination's, or one that tells twins on other kinds
    # of device apart, so that a merge never drops a GPU run as a copy of its CPU twin.
    current = _current_layout(layouts[-1].experiment)
    if current is not None and all(lay.keys == current.keys and set(lay.columns) <= set(current.columns)
                                   for lay in layouts):
        layout = current
    else:
        layout = max(layouts[::-1], key=lambda lay: lay.kind_column is not None)
    if src_meta.get("config") is None:
        raise StoreError(f"merge: {sidecar_path(src).name} records no configuration")
    added = skipped = 0
    with ResultsStore(src, layout, src_meta["config"], read_only=True) as source, \
            ResultsStore(dst, layout, src_meta["config"]) as target:
        rows_of = {name: {} for name in source.tables}
        for name, table in source.tables.items():
            for record in table.records:
                rows_of[name].setdefault(table.key(record), []).append(record)
        headers = {None: source.main.header, **{name: t.header for name, t in source.tables.items() if t.header}}
        for record in source.main.records:
            key = source.main.key(record)
            if key in target.done:
                skipped += 1
                continue
            target._append(record, {name: rows.get(key, []) for name, rows in rows_of.items()}, headers)
            added += 1
        record = dict(target.previous) if target.previous else {k: v for k, v in src_meta.items() if k != "sessions"}
        known = {_session_id(s) for s in record.get("sessions", [])}
        mark = {"merged_from": str(src.resolve()), "merged_utc": _now()}
        new = [{**s, **mark} for s in src_meta.get("sessions", []) if _session_id(s) not in known]
        record["sessions"] = list(record.get("sessions", [])) + new
        record["total_wall_time_s"] = round(sum(s.get("wall_time_s") or 0 for s in record["sessions"]), 2)
        record.setdefault("config", src_meta["config"])
        record.update(store=layout.to_json(), n_runs=target.n_runs)
        record["merges"] = list(record.get("merges", [])) + [{
            "from": str(src.resolve()), "date_utc": mark["merged_utc"], "runs_added": added, "runs_skipped": skipped,
            "sessions_added": len(new)}]
        target.write_record(record)
    return {"added": added, "skipped": skipped, "sessions": len(new)}


# ------------------------------------------------------------------------------------------------- CLI arguments
def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (``--seeds``, ``--workers``, ``--threads``, ``--epochs``, ...)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(text).strip() != str(value):
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def device_arg(text: str) -> str:
    """An ``argparse`` type: a torch device that this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (cpu, cuda, cuda:0, mps, ...)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"{text!r}: this machine has {torch.cuda.device_count()} CUDA devices")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: MPS is not available on this machine")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu, cuda and mps are supported")
    return str(device)


def csv_path(text: str) -> Path:
    """An ``argparse`` type for ``--out``: a ``.csv`` path (:func:`check_out`)."""
    try:
        return check_out(text)
    except StoreError as err:
        raise argparse.ArgumentTypeError(str(err).replace("--out ", "")) from None


def main(argv: list[str] | None = None) -> dict:
    """``python -m attnbook.store merge SRC.csv DST.csv`` (see :func:`merge`)."""
    parser = argparse.ArgumentParser(prog="python -m attnbook.store", description="Maintain experiment result stores.")
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge the finished runs of SRC into DST (same configuration)")
    merging.add_argument("src", type=csv_path, help="the store to read, e.g. a GPU run's results/masking_gpu.csv")
    merging.add_argument("dst", type=csv_path, help="the store to extend, e.g. results/masking_full.csv")
    args = parser.parse_args(argv)
    try:
        report = merge(args.src, args.dst)
    except StoreError as err:
        parser.error(str(err))
    print(f"merged {report['added']} runs from {args.src} into {args.dst}; skipped {report['skipped']} already "
          f"there; {report['sessions']} sessions added to {sidecar_path(args.dst).name}")
    return report


if __name__ == "__main__":  # pragma: no cover
    # Through the package's module, not this __main__ copy: the experiments' layouts are instances of its Layout.
    from attnbook.store import main as _main

    _main()
