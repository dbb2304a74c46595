"""``python -m attnbook.audit``: run the padding audit over the registry of subjects and store the table.

Writes ``--out`` (a CSV, one row per subject, seed, set of lengths and check), a Markdown table beside it (``.md``:
the library versions, one row per subject, the failures with their causes and upstream threads) and the provenance
record (``.json``). Every subject is a randomly initialized model built from a config: no download, no data.
Chapter 10 ("Padding bugs in the wild") runs the same registry live, at one seed; this command adds seeds and a
second set of lengths.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import torch

from attnbook.provenance import atomic_write_text, provenance, write_provenance

from . import CHECKS, OPTIONAL_CHECKS
from . import subjects as registry

DEFAULT_LENGTHS = ((7, 3, 12, 1), (29, 2, 48, 1, 17))


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0 or max(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be >= 0 with at least one positive, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.audit",
        description="Audit the padding behaviour of the registry's subjects (torch, transformers, keras, "
                    "x-transformers, the d2l recipe, attnbook) on random token ids, and write the table with the "
                    "library versions (CSV, Markdown and a JSON provenance record).")
    parser.add_argument("--out", type=Path, default=Path("results/audit.csv"),
                        help="the CSV to write; the .md and .json go beside it (default: %(default)s)")
    parser.add_argument("--only", default="",
                        help="comma-separated subject keys or key prefixes, e.g. 'torch-,hf-gpt2' (default: all)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 for every subject (default: 3)")
    parser.add_argument("--lengths", type=_lengths, action="append",
                        help="a set of row lengths, e.g. 7,3,12,1; repeat for several (default: "
                             + " and ".join(",".join(map(str, ls)) for ls in DEFAULT_LENGTHS) + ")")
    parser.add_argument("--atol", type=float, default=1e-5, help="largest accepted difference (default: 1e-5)")
    parser.add_argument("--list", action="store_true", help="list the subjects and exit")
    args = parser.parse_args(argv)
    if args.out.suffix != ".csv":
        parser.error(f"--out must end in .csv, got {str(args.out)!r}")
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if not args.atol >= 0:
        parser.error(f"--atol must be >= 0, got {args.atol}")
    try:
        args.subjects = registry.select(args.only)
    except ValueError as error:
        parser.error(str(error))
    args.lengths = tuple(args.lengths or DEFAULT_LENGTHS)
    return args


def markdown(results, versions: dict[str, str], record: dict) -> str:
    """The Markdown page of a run: versions, the table, the failures with their causes."""
    table = registry.wide_table(results)
    causes = registry.explain(results)
    lines = [
        "# Padding audit of attention implementations",
        "",
        "Written by `python -m attnbook.audit` (chapter 10, \"Padding bugs in the wild\"). Every subject is a "
        "randomly initialized model built from a config (no download, no data), audited on random token ids with "
        f"seeds 0..{record['config']['seeds'] - 1} and row lengths "
        + "; ".join(" ".join(map(str, ls)) for ls in record["config"]["lengths"])
        + f", atol {record['config']['atol']:g}. A cell is `pass` when every run passed; otherwise it names how the "
        "first failing run failed: `differs` (real outputs changed), `NaN` (non-finite outputs), `error` (the "
        "forward raised), `ignored` (the mask was not read).",
        "",
        "Library versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        table.to_markdown(index=False),
        "",
        "## Failures and their causes",
        "",
    ]
    if causes.empty:
        lines.append("No subject failed a check.")
    for row in causes.itertuples(index=False):
        where = f" <{row.url}>" if row.url else (f" (chapter section `{row.ref}`)" if row.ref else "")
        lines.append(f"- **{row.name}**, `{row.check}`: {row.kind}; {row.why}.{where}")
    stale = registry.not_reproduced(results)
    if stale:
        lines += ["", "Listed causes that did not reproduce at these versions: "
                  + ", ".join(f"{s} / {c}" for s, c in stale) + "."]
    lines += ["", "## Adapters", ""]
    lines += [f"- `{s.key}`: {s.name}. {s.adapter}." for s in registry.SUBJECTS
              if s.key in set(results["subject"])]
    lines += ["", "## Provenance", ""]
    lines += [f"- {key}: {value}" for key, value in record.items() if key not in ("config", "libraries")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in registry.SUBJECTS:
            print(f"{s.key:30s} {s.library:15s} {s.name}")
        return 0
    torch.set_num_threads(1)
    start = time.perf_counter()
    results = registry.run_registry(args.subjects, seeds=range(args.seeds), lengths=args.lengths,
                                    optional=OPTIONAL_CHECKS, atol=args.atol)
    wall = time.perf_counter() - start
    libraries = sorted({s.library for s in args.subjects}, key=list(registry.LIBRARIES).index)
    versions = registry.library_versions(libraries)
    config = {"seeds": args.seeds, "lengths": [list(ls) for ls in args.lengths], "atol": args.atol,
              "low_precision_rtol": 0.05, "checks": [*CHECKS, *OPTIONAL_CHECKS], "vocab_size": registry.VOCAB,
              "d_model": registry.D_MODEL, "heads": registry.HEADS, "layers": registry.LAYERS,
              "subjects": [s.key for s in args.subjects]}
    failed = registry.failures(results)
    record = provenance(wall_time_s=wall, device="cpu", mode="full", threads=1, libraries=versions, config=config,
                        n_runs=len(args.subjects) * args.seeds * len(args.lengths),
                        n_subjects=len(args.subjects), n_failures=len(failed),
                        unexplained=int((~registry.explain(results)["known"]).sum()),
                        command="python -m attnbook.audit " + " ".join(sys.argv[1:] if argv is None else argv))
    buffer = io.StringIO()
    results.to_csv(buffer, index=False, float_format="%.4g")
    atomic_write_text(args.out, buffer.getvalue())
    atomic_write_text(args.out.with_suffix(".md"), markdown(results, versions, record))
    write_provenance(args.out.with_suffix(".json"), record)
    print(registry.wide_table(results).to_string(index=False))
    print(f"\n{len(args.subjects)} subjects, {record['n_runs']} runs, {len(failed)} failed (subject, check) pairs, "
          f"{record['unexplained']} unexplained; {wall:.1f} s. Wrote {args.out} and its .md and .json.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
