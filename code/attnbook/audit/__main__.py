"""``python -m attnbook.audit``: run the padding audit over the registry of subjects, or over your own forwards, and
exit 1 when a check fails (for CI).

Without ``--subject``, it audits the registry (:mod:`attnbook.audit.subjects`: every subject is a randomly
initialized model built from a config, no download, no data) and writes ``--out`` (a CSV, one row per subject,
seed, set of lengths, check and mode), a Markdown table beside it (``.md``: the library versions, one row per
subject, the failures grouped by root cause, with the upstream threads) and the provenance record (``.json``).
Chapter 10 ("Padding bugs in the wild") runs the same registry at one seed; this command adds seeds and a second set
of lengths.

With ``--subject MODULE:NAME`` (repeatable), it audits your own ``forward(input_ids, attention_mask)`` (or an
:class:`attnbook.audit.subjects.Subject`), in every grad mode of ``--modes``, and writes files only if ``--out`` is
given. ``--junit FILE`` writes a JUnit XML report (one test case per subject, check and mode) for CI systems.

Exit status: 0 when every audited subject passed every check (or ``--fail-on none``), 1 when one failed (with
``--fail-on unexplained``: only a failure that :data:`attnbook.audit.subjects.CAUSES` does not explain), 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import math
import sys
import time
from pathlib import Path

import pandas as pd

from . import CAUSAL_CHECK, CHECKS, MODES, OPTIONAL_CHECKS, OUTPUTS, PADDING_SIDES
from . import subjects as registry

DEFAULT_LENGTHS = ((7, 3, 12, 1), (29, 2, 48, 1, 17))
DEFAULT_OUT = Path("results/audit.csv")
FAIL_ON = ("any", "unexplained", "none")

EPILOG = """\
examples:
  python -m attnbook.audit --list
  python -m attnbook.audit --only torch-,hf-gpt2 --out /tmp/audit.csv --junit /tmp/audit.xml
  python -m attnbook.audit --subject mypackage.tests.padding:forward --vocab-size 30522 --output token

--subject MODULE:NAME imports MODULE (a dotted module name, or a path to a .py file) and audits its attribute
NAME: either forward(input_ids, attention_mask) -> Tensor (input_ids int64 (B, L), attention_mask bool (B, L),
True = a real token), audited with --vocab-size, --pad-id, --output, --padding-side, --modes, --causal and
--optional; or an attnbook.audit.subjects.Subject. Put the model in eval mode in that module.

exit status: 0 all checks passed, 1 a check failed (see --fail-on), 2 bad arguments.
"""


def _lengths(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"lengths must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0 or max(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be >= 0 with at least one positive, got {text!r}")
    return values


def _names(choices):
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {list(choices)}, got {text!r}")
        return names
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.audit", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Padding audit: does every sequence get, in a padded batch, the output it gets alone? Audits "
                    "the registry's subjects (torch, transformers, keras, x-transformers, the d2l recipe, attnbook) "
                    "or your own forward (--subject) on random token ids, and exits 1 when a check fails.")
    what = parser.add_argument_group("what to audit")
    what.add_argument("--only", default="",
                      help="comma-separated registry keys or key prefixes, e.g. 'torch-,hf-gpt2' (default: all, "
                           "unless --subject is given)")
    what.add_argument("--subject", action="append", default=[], metavar="MODULE:NAME",
                      help="audit your own forward or Subject (repeatable; see below)")
    what.add_argument("--list", action="store_true", help="list the registry's subjects and exit")
    what.add_argument("--transformers", action="store_true",
                      help="audit transformers' architectures built from tiny configs instead (needs the 'audit' "
                           "extra; the remaining options go to that sweep)")
    how = parser.add_argument_group("how")
    how.add_argument("--seeds", type=int, default=None,
                     help="seeds 0..N-1 for every subject (default: 3 for the registry, 1 for --subject)")
    how.add_argument("--lengths", type=_lengths, action="append",
                     help="a set of row lengths, e.g. 7,3,12,1; repeat for several (default: "
                          + " and ".join(",".join(map(str, ls)) for ls in DEFAULT_LENGTHS) + ")")
    how.add_argument("--atol", type=float, default=None,
                     help="absolute tolerance (default: rtol x the largest real output)")
    how.add_argument("--rtol", type=float, default=None,
                     help="relative tolerance (default: max(1e-5, 8 x the output dtype's eps))")
    yours = parser.add_argument_group("for --subject forwards")
    yours.add_argument("--vocab-size", type=int, default=100, help="token ids are drawn below this (default: 100)")
    yours.add_argument("--pad-id", type=int, default=0, help="the model's pad id (default: 0)")
    yours.add_argument("--output", choices=OUTPUTS, default="token",
                       help="'token' (B, L, ...) or 'sequence' (B, ...) outputs (default: token)")
    yours.add_argument("--padding-side", choices=PADDING_SIDES, default="right", help="(default: right)")
    yours.add_argument("--modes", type=_names(MODES), default=list(MODES),
                       help="comma-separated grad modes (default: " + ",".join(MODES) + ")")
    yours.add_argument("--causal", action="store_true", help="the model is causal: adds causal_left_padding")
    yours.add_argument("--optional", type=_names(OPTIONAL_CHECKS), default=list(OPTIONAL_CHECKS),
                       help="comma-separated optional checks (default: " + ",".join(OPTIONAL_CHECKS) + ")")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None,
                     help=f"the CSV to write; the .md and .json go beside it (default: {DEFAULT_OUT} for a registry "
                          "run, none with --subject)")
    out.add_argument("--junit", type=Path, default=None, help="write a JUnit XML report to this file")
    out.add_argument("--fail-on", choices=FAIL_ON, default="any",
                     help="exit 1 on any failed check (any, the default), only on a failure without a known cause "
                          "(unexplained), or never (none)")
    args = parser.parse_args(argv)
    if args.transformers:
        return args
    if args.out is None and not args.subject:
        args.out = DEFAULT_OUT
    if args.out is not None and args.out.suffix != ".csv":
        parser.error(f"--out must end in .csv, got {str(args.out)!r}")
    if args.seeds is None:
        args.seeds = 1 if args.subject else 3
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    for name in ("atol", "rtol"):
        value = getattr(args, name)
        if value is not None and not (value >= 0 and math.isfinite(value)):
            parser.error(f"--{name} must be a finite number >= 0, got {value}")
    try:
        args.subjects = registry.select(args.only) if (args.only or not args.subject) else []
        args.subjects += [load_subject(spec, args) for spec in args.subject]
    except (ValueError, ImportError, AttributeError, TypeError) as error:
        parser.error(str(error))
    args.lengths = tuple(args.lengths or DEFAULT_LENGTHS)
    return args


def load_subject(spec: str, args: argparse.Namespace) -> registry.Subject:
    """The :class:`~attnbook.audit.subjects.Subject` that ``MODULE:NAME`` names: the object itself if it is one,
    else a subject around the forward, with the command line's settings. Raises ValueError, ImportError,
    AttributeError or TypeError with a message that names ``spec``."""
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"--subject must be MODULE:NAME, e.g. mypackage.padding:forward, got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ImportError(f"--subject {spec}: no file {path}")
        loader = importlib.util.spec_from_file_location(f"_attnbook_subject_{path.stem}", path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[loader.name] = module
        loader.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ImportError(f"--subject {spec}: cannot import {module_name}: {error}") from error
    if not hasattr(module, name):
        raise AttributeError(f"--subject {spec}: module {module_name} has no attribute {name!r}")
    obj = getattr(module, name)
    if isinstance(obj, registry.Subject):
        return obj
    if not callable(obj):
        raise TypeError(f"--subject {spec}: {name} must be forward(input_ids, attention_mask) or a Subject, got "
                        f"{type(obj).__name__}")
    return registry.Subject(spec, spec, "user", lambda seed, forward=obj: forward, args.padding_side, args.output,
                            adapter="your forward", mode=",".join(args.modes), causal=args.causal)


def _audit_one(subject: registry.Subject, args: argparse.Namespace, seed: int, lengths) -> pd.DataFrame:
    """One subject, seed and set of lengths; an error that stops the audit (a forward that cannot run, a bad
    argument) becomes one failed row, check ``"audit"``."""
    user = subject.library == "user"
    try:
        return registry.run_subject(
            subject, seed=seed, lengths=lengths, optional=args.optional if user else OPTIONAL_CHECKS,
            atol=args.atol, rtol=args.rtol, modes=subject.mode.split(",") if user else None,
            vocab_size=args.vocab_size if user else registry.VOCAB, pad_id=args.pad_id if user else 0)
    except Exception as error:  # noqa: BLE001 - reported as a failed row, and in the exit status
        message = " ".join(f"{type(error).__name__}: {error}".split())
        return pd.DataFrame([{"subject": subject.key, "name": subject.name, "library": subject.library,
                              "seed": seed, "lengths": " ".join(map(str, lengths)), "check": "audit",
                              "mode": subject.mode, "passed": False, "max_abs_diff": math.nan,
                              "max_rel_diff": math.nan, "detail": message, "seconds": 0.0}])


def _markdown_table(table: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (without pandas' optional tabulate dependency)."""
    def cells(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"
    return "\n".join([cells(table.columns), cells(["---"] * len(table.columns)),
                      *(cells(row) for row in table.itertuples(index=False))])


def _tolerance_words(config: dict) -> str:
    if config["atol"] is None and config["rtol"] is None:
        return "the output dtype's tolerance (rtol = max(1e-5, 8 eps), atol = rtol x the largest real output)"
    return f"atol {config['atol'] or 0:g} and rtol {config['rtol'] or 0:g}"


def markdown(results: pd.DataFrame, versions: dict[str, str], record: dict) -> str:
    """The Markdown page of a run: versions, the table, the failures by root cause and each with its cause."""
    config = record["config"]
    causes = registry.explain(results)
    lines = [
        "# Padding audit of attention implementations",
        "",
        "Written by `python -m attnbook.audit` (chapter 10, \"Padding bugs in the wild\"). Every registry subject is "
        "a randomly initialized model built from a config (no download, no data), audited in the grad mode its "
        f"adapter sets, on random token ids with seeds 0..{config['seeds'] - 1} and row lengths "
        + "; ".join(" ".join(map(str, ls)) for ls in config["lengths"])
        + f", with {_tolerance_words(config)}. A cell is `pass` when every run passed; otherwise it names how the "
        "first failing run failed: `differs` (real outputs changed), `NaN` (non-finite outputs), `error` (the "
        "forward raised), `ignored` (the mask was not read); `-` where the check does not apply.",
        "",
        "Library versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        "",
        _markdown_table(registry.wide_table(results)),
        "",
        "## Failures by root cause",
        "",
    ]
    grouped = registry.by_root_cause(results)
    if grouped.empty:
        lines.append("No subject failed a check.")
    for row in grouped.itertuples(index=False):
        lines.append(f"- {registry.CATEGORIES.get(row.category, row.category)}: {row.summary} "
                     f"({row.subjects} subject{'s' if row.subjects != 1 else ''}).")
    lines += ["", "## Failures and their causes", ""]
    for row in causes.itertuples(index=False):
        where = f" <{row.url}>" if row.url else (f" (chapter section `{row.ref}`)" if row.ref else "")
        lines.append(f"- **{row.name}**, `{row.check}` ({row.mode}): {row.kind}; {row.why}.{where}")
    stale = registry.not_reproduced(results)
    if stale:
        lines += ["", "Listed causes that did not reproduce at these versions: "
                  + ", ".join(f"{s} / {c}" for s, c in stale) + "."]
    lines += ["", "## Adapters", ""]
    lines += [f"- `{s.key}`: {s.name}. {s.adapter}; {s.mode}." for s in registry.SUBJECTS
              if s.key in set(results["subject"])]
    lines += ["", "## Provenance", ""]
    lines += [f"- {key}: {value}" for key, value in record.items() if key not in ("config", "libraries")]
    return "\n".join(lines) + "\n"


def exit_status(results: pd.DataFrame, fail_on: str = "any") -> int:
    """1 when ``results`` holds a failed check that ``fail_on`` counts (``"any"``; ``"unexplained"``: one without
    a cause in :data:`~attnbook.audit.subjects.CAUSES`; ``"none"``: never), else 0."""
    if fail_on == "none":
        return 0
    failed = ~results["passed"].astype(bool)
    if fail_on == "unexplained":
        return int(not registry.explain(results)["known"].all())
    return int(bool(failed.any()))


def _write_files(args, results: pd.DataFrame, wall: float) -> dict:
    from attnbook.provenance import atomic_write_text, provenance, write_provenance

    libraries = [lib for lib in registry.LIBRARIES if lib in set(results["library"])]
    versions = registry.library_versions(libraries)
    config = {"seeds": args.seeds, "lengths": [list(ls) for ls in args.lengths], "atol": args.atol,
              "rtol": args.rtol, "low_precision_rtol": 0.05, "checks": [*CHECKS, CAUSAL_CHECK, *OPTIONAL_CHECKS],
              "vocab_size": registry.VOCAB, "d_model": registry.D_MODEL, "heads": registry.HEADS,
              "layers": registry.LAYERS, "subjects": [s.key for s in args.subjects]}
    record = provenance(wall_time_s=wall, device="cpu", mode="full", threads=1, libraries=versions, config=config,
                        n_runs=len(args.subjects) * args.seeds * len(args.lengths),
                        n_subjects=len(args.subjects), n_failures=len(registry.failures(results)),
                        unexplained=int((~registry.explain(results)["known"]).sum()),
                        command="python -m attnbook.audit " + " ".join(args.argv))
    buffer = io.StringIO()
    results.to_csv(buffer, index=False, float_format="%.4g")
    atomic_write_text(args.out, buffer.getvalue())
    atomic_write_text(args.out.with_suffix(".md"), markdown(results, versions, record))
    write_provenance(args.out.with_suffix(".json"), record)
    return record


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--transformers" in argv:
        # the sweep of transformers' architectures has options of its own (--reclassify, --timeout, ...)
        from .transformers_sweep import main as sweep

        return sweep([a for a in argv if a != "--transformers"])
    args = parse_args(argv)
    args.argv = argv
    if args.list:
        for s in registry.SUBJECTS:
            print(f"{s.key:30s} {s.library:15s} {s.mode:15s} {s.name}")
        return 0
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    tables = [_audit_one(s, args, seed, tuple(ls)) for s in args.subjects for seed in range(args.seeds)
              for ls in args.lengths]
    results = pd.concat(tables, ignore_index=True)
    wall = time.perf_counter() - start
    if args.out is not None:
        _write_files(args, results, wall)
    if args.junit is not None:
        from .junit import write_junit

        write_junit(results, args.junit)
    print(registry.wide_table(results).to_string(index=False))
    grouped = registry.by_root_cause(results)
    if not grouped.empty:
        print("\nFailures by root cause (each cause once):")
        for row in grouped.itertuples(index=False):
            print(f"  [{row.category}] {row.summary} ({row.subjects} subject{'s' if row.subjects != 1 else ''})")
    failed = registry.failures(results)
    unexplained = int((~registry.explain(results)["known"]).sum())
    wrote = [str(p) for p in (args.out, args.out.with_suffix(".md") if args.out else None,
                              args.out.with_suffix(".json") if args.out else None, args.junit) if p]
    print(f"\n{len(args.subjects)} subjects, {len(tables)} runs, {len(failed)} failed (subject, check) pairs, "
          f"{unexplained} unexplained; {wall:.1f} s." + (f" Wrote {', '.join(wrote)}." if wrote else ""))
    return exit_status(results, args.fail_on)


if __name__ == "__main__":
    raise SystemExit(main())
