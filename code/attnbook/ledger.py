"""The book's ledger of stored runs: which stored results back which chapter, and how they were made.

Read by the appendix page "How the numbers were made" (``how_numbers_were_made.ipynb``), which is generated from
``results/`` each time the book is built. A chapter page says what its stored runs show; this module says where they
came from: sizes, seeds, device, library versions, commit, dates, wall time, sessions, the engine that ran them, and
the command that reproduces them. It also lists the stores a chapter would use that are still pending (they need a
GPU or a network) so that no chapter page has to.

Every JSON record in ``results/`` is listed in :data:`STORES` (a test checks this), and nothing here is typed by
hand that the records hold: the numbers come from the records when the page is built.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["Store", "STORES", "STATUS_WORDS", "CHAPTERS", "results_dir", "read_record", "summarize", "chapter_table",
           "pending", "sessions_table", "short_commit"]

#: The chapters' titles as in the table of contents, by number.
CHAPTERS = {
    3: "Parametric attention",
    4: "Seq2seq with attention",
    5: "Seq2vec attention and the padding-mask experiments",
    6: "Decomposable attention for NLI",
    7: "Soft and hard attention",
    8: "Self-attention and the Transformer",
    9: "Attention without padding, and at scale",
    10: "Padding bugs in the wild",
}


@dataclass(frozen=True)
class Store:
    """One stored result in ``results/``.

    Attributes:
        name: the file stem (``results/<name>.json`` is its provenance record; ``<name>.csv`` its runs, if any).
        chapter: the chapter whose statements it backs (also the checklist, for chapter 5's store).
        backs: what it backs, in a few words a reader understands.
        command: the command, run from the repository root, that makes or resumes it.
        needs: what making it needs beyond this project's 2-core CPU (``""`` = nothing more); a store with ``needs``
            and without its file is *pending*.
        has_mode: whether the command has a quick and a full mode (the audit has one size: its mode shows as "–").
        engine: what ran the sessions that record no backend ("local (joblib)": worker processes on one machine;
            "one process": a single process).
    """

    name: str
    chapter: int
    backs: str
    command: str
    needs: str = ""
    has_mode: bool = True
    engine: str = "local (joblib)"


#: What a record's ``status`` of a session says, in a reader's words. A session that still reads "running" in a
#: finished record was stopped before it could write its end.
STATUS_WORDS = {"running": "stopped before recording its end", "killed": "killed", "interrupted": "interrupted",
                "finished": "finished"}


STORES: tuple[Store, ...] = (
    Store("init_scale_full", 3, "the initialization-scale experiment (10 paired seeds per arm)",
          "python -m attnbook.experiments.init_scale --mode full --workers 2 --out results/init_scale_full.csv"),
    Store("bench_attention", 3, "the speed of the attention functions against torch's SDPA",
          "python benchmarks/bench_attention.py", engine="one process"),
    Store("seq2seq_quick", 4, "the quick-mode translators, three seeds of every model",
          "python -m attnbook.experiments.seq2seq --mode quick --seeds 3 --workers 2 --out results/seq2seq_quick.csv"),
    Store("seq2seq_cpu", 4, "the translators on all sentence pairs, at sizes a CPU trains",
          "python -m attnbook.experiments.seq2seq --mode cpu --models none bahdanau luong-general --seeds 3 "
          "--workers 2 --out results/seq2seq_cpu.csv"),
    Store("seq2seq_full", 4, "the translators on all sentence pairs at the paper's sizes",
          "tools/gpu_job.sh seq2seq OUT_DIR, then python -m attnbook.store merge (README)", needs="a GPU"),
    Store("masking_full", 5, "the padding-mask experiment: the answer to the chapter's question",
          "python -m attnbook.experiments.masking --mode full --grid core --workers 2 --out results/masking_full.csv"),
    Store("nli_full", 6, "decomposable attention on SNLI and on the generated pairs at full size",
          "python -m attnbook.experiments.nli --mode full --out results/nli_full.csv",
          needs="a GPU, and a network to download SNLI"),
    Store("attention_explanation_full", 7, "whether attention weights explain the classifier, at full size",
          "python -m attnbook.experiments.attention_explanation --mode full "
          "--out results/attention_explanation_full.csv", needs="a GPU"),
    Store("hard_attention_full", 7, "the hard-attention estimators at full size",
          "python -m attnbook.experiments.hard_attention --mode full --out results/hard_attention_full.csv",
          needs="a GPU"),
    Store("transformer_padding_full", 8, "the Transformer classifier under left and right padding",
          "python -m attnbook.experiments.transformer_padding --mode full --workers 2 "
          "--out results/transformer_padding_full.csv"),
    Store("bench_transformer_padding", 8, "the time of one run of the padding grid, before it was run",
          "python benchmarks/bench_transformer_padding.py", engine="one process"),
    Store("transformer_translation_quick", 8, "the quick-mode Transformer translator, three seeds",
          "python -m attnbook.experiments.transformer_translation --mode quick --models transformer --seeds 3 "
          "--workers 2 --out results/transformer_translation_quick.csv"),
    Store("transformer_translation_cpu", 8, "the Transformer translator on all sentence pairs, at CPU sizes",
          "python -m attnbook.experiments.transformer_translation --mode cpu --models transformer --seeds 3 "
          "--workers 2 --out results/transformer_translation_cpu.csv"),
    Store("transformer_translation_full", 8, "the Transformer translator at the paper's sizes",
          "tools/gpu_job.sh transformer_translation OUT_DIR, then python -m attnbook.store merge (README)",
          needs="a GPU"),
    Store("sinks_full", 9, "attention sinks: where a query puts its weight when no key matches (a retrieval task)",
          "python -m attnbook.experiments.sinks --mode full --workers 2 --out results/sinks_full.csv"),
    Store("bench_long_attention", 9, "time and memory of attention over long sequences",
          "python benchmarks/bench_long_attention.py", engine="one process"),
    Store("bench_packing", 9, "packing against padding and bucketing: time per training step",
          "python benchmarks/bench_packing.py", engine="one process"),
    Store("packing_full", 9, "packing's training runs at full size",
          "python -m attnbook.experiments.packing --mode full --out results/packing_full.csv", needs="a GPU"),
    Store("audit", 10, "the padding audit of every subject, three seeds and two sets of lengths",
          "python -m attnbook.audit --out results/audit.csv", has_mode=False, engine="one process"),
    Store("audit_transformers", 10, "the sweep of transformers' causal-LM and masked-LM architectures, tiny and "
          "random", "python -m attnbook.audit --transformers", has_mode=False, engine="one process"),
)


def results_dir(start: str | Path | None = None) -> Path:
    """The ``results/`` folder of the book: in ``start`` (default: the working directory) or its nearest parent
    that has one. Raises ``FileNotFoundError`` if none has."""
    start = Path.cwd() if start is None else Path(start)
    for base in (start, *start.parents):
        if (base / "results").is_dir():
            return base / "results"
    raise FileNotFoundError(f"no results/ folder in {start} or its parents")


def read_record(name: str, folder: str | Path | None = None) -> dict[str, Any] | None:
    """The provenance record ``results/<name>.json`` as a dict, or ``None`` if the store has none."""
    path = (results_dir() if folder is None else Path(folder)) / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def short_commit(commit: str | None) -> str:
    """A commit as its first 7 hex digits; a ``+dirty`` mark (the working tree had changes not yet committed) reads
    ``"abc1234 with uncommitted changes"``; ``"?"`` when unknown."""
    if not commit:
        return "?"
    base, plus, rest = str(commit).partition("+")
    if not plus:
        return base[:7]
    return base[:7] + (" with uncommitted changes" if rest == "dirty" else f"+{rest}")


def _versions(record: Mapping[str, Any]) -> str:
    """The library versions a record names: torch, numpy and python, then every other library of its
    ``libraries`` field (e.g. transformers, keras, x-transformers for the audit)."""
    parts = [f"torch {record.get('torch', '?')}", f"numpy {record.get('numpy', '?')}",
             f"python {record.get('python', '?')}"]
    for name, version in sorted((record.get("libraries") or {}).items()):
        if name not in ("torch", "numpy", "python", "attnbook") and version and version != "recipe":
            parts.append(f"{name} {version}")
    return ", ".join(parts)


def _sessions(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The record's sessions; a benchmark (one measurement, no sessions) counts as one session."""
    sessions = list(record.get("sessions") or [])
    if sessions:
        return sessions
    return [{"commit": record.get("commit"), "date_utc": record.get("date_utc"), "device": record.get("device"),
             "wall_time_s": record.get("total_wall_time_s", record.get("wall_time_s")),
             "workers": record.get("workers")}]


def _device(text: Any) -> str:
    """A device as a reader says it: "CPU (1 thread, x86_64)" keeps its words; "1 threads" is made singular."""
    return str(text).replace("(1 threads", "(1 thread") if text else "?"


def _runs(name: str, folder: Path) -> pd.DataFrame | None:
    """The store's main table ``<name>.csv``, or ``None`` (a benchmark may have none)."""
    csv = folder / f"{name}.csv"
    return pd.read_csv(csv) if csv.is_file() else None


def _sizes(config: Any) -> str:
    """The scalar settings of a configuration, ``key=value`` joined by commas (lists shown by their length)."""
    if not isinstance(config, Mapping):
        return ""
    parts = []
    for key, value in sorted(config.items()):
        if isinstance(value, list):
            value = f"{len(value)} values"
        elif isinstance(value, Mapping):
            continue
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def summarize(store: Store, folder: str | Path | None = None) -> dict[str, Any] | None:
    """What the record of ``store`` says about how it was made, as one flat dict (``None`` if it is not stored):
    ``store, chapter, backs, runs, seeds, mode, devices, versions, commits, first, last, wall_h, sessions,
    backends, sizes, command``. Dates are UTC days; ``wall_h`` is the wall time of all its sessions in hours."""
    folder = results_dir() if folder is None else Path(folder)
    record = read_record(store.name, folder)
    if record is None:
        return None
    runs = _runs(store.name, folder)
    sessions = _sessions(record)
    dates = sorted(str(s.get("started_utc") or s.get("date_utc") or "")[:10] for s in sessions if
                   s.get("started_utc") or s.get("date_utc"))
    commits = list(dict.fromkeys(short_commit(s.get("commit")) for s in sessions))
    devices = list(dict.fromkeys(_device(s.get("device")) for s in sessions))
    backends = list(dict.fromkeys(str(s.get("backend") or store.engine) for s in sessions))
    wall = sum(float(s.get("wall_time_s") or 0.0) for s in sessions)
    versions = _versions(record)
    return {
        "store": store.name, "chapter": store.chapter, "backs": store.backs,
        "runs": int(record["n_runs"]) if record.get("n_runs") is not None else (None if runs is None else len(runs)),
        "seeds": int(runs["seed"].nunique()) if runs is not None and "seed" in runs.columns else None,
        "mode": record.get("mode", "?") if store.has_mode else "–", "devices": "; ".join(devices), "versions": versions,
        "commits": ", ".join(commits), "first": dates[0] if dates else "?", "last": dates[-1] if dates else "?",
        "wall_h": wall / 3600, "sessions": len(sessions), "backends": ", ".join(backends),
        "sizes": _sizes(record.get("config")), "command": store.command,
    }


def chapter_table(chapter: int, folder: str | Path | None = None) -> pd.DataFrame:
    """One row per stored result of ``chapter`` (see :func:`summarize`), in the order of :data:`STORES`; empty when
    the chapter has none stored."""
    rows = [summarize(s, folder) for s in STORES if s.chapter == chapter]
    return pd.DataFrame([r for r in rows if r is not None])


def pending(folder: str | Path | None = None) -> pd.DataFrame:
    """The stores not yet made, with what making them needs: columns ``chapter, store, backs, needs, command``."""
    folder = results_dir() if folder is None else Path(folder)
    rows = [{"chapter": s.chapter, "store": s.name, "backs": s.backs, "needs": s.needs, "command": s.command}
            for s in STORES if s.needs and read_record(s.name, folder) is None]
    return pd.DataFrame(rows, columns=["chapter", "store", "backs", "needs", "command"])


def sessions_table(store: Store, folder: str | Path | None = None) -> pd.DataFrame:
    """One row per session that added to ``store``: ``started, finished, device, workers, backend, runs added,
    wall time (min), status, commit``; empty if it is not stored."""
    folder = results_dir() if folder is None else Path(folder)
    record = read_record(store.name, folder)
    if record is None:
        return pd.DataFrame()
    rows = []
    for s in _sessions(record):
        rows.append({
            "started": str(s.get("started_utc") or "")[:16].replace("T", " "),
            "finished": str(s.get("date_utc") or "")[:16].replace("T", " "),
            "device": _device(s.get("device")), "workers": s.get("workers"),
            "backend": s.get("backend") or store.engine, "runs added": s.get("runs_added"),
            "wall time (min)": round(float(s.get("wall_time_s") or 0.0) / 60, 1),
            "status": (STATUS_WORDS.get(s.get("status"), s.get("status"))
                       or ("merged" if s.get("merged_from") else "not recorded")),
            "commit": short_commit(s.get("commit")),
        })
    return pd.DataFrame(rows)
