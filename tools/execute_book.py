"""Execute every notebook of the book, two at a time, into the cache that `jupyter-book build` then reads.

Usage (what `make book` does): ``python tools/execute_book.py [--jobs N]`` from the repository root, then
``jupyter-book build .`` with ``execute_notebooks: cache`` in ``_config.yml``.

Why: the book executes every notebook on each build, and one after another they take longer than the 8 minutes a
build may take on a 2-core machine. Most chapters run one process at a time, so two notebooks at once use both cores.
The cache is emptied first, so every build executes every notebook with the current code (a cache keyed on the
notebooks alone would keep outputs made with older library code); given notebooks (``only``), the tool executes
just those and leaves the other notebooks' cached outputs in place. Each notebook runs in its own folder, as myst-nb
runs it, with ``ATTNBOOK_NO_PROGRESS=1`` (no progress bars in the pages, :func:`attnbook.runtime.in_book_build`).

With two notebooks at once, each kernel gets one thread (``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``; torch reads
them at import): two kernels with two threads each on two cores made torch's threads wait on each other, and the same
build took 1,126 CPU-seconds instead of 1,004 (measured on this 2-core machine, 2026-11-23). The chapters that train
several models use their own worker processes, one thread each, either way. The notebooks are started longest first,
by the seconds in ``tools/execute_times.json`` (measured; a notebook not listed counts by the size of its file), so
that the two slots end together.
A notebook that fails stops the build: its traceback is printed and the exit status is 1.

The cache is jupyter-cache's (``_build/.jupyter_cache``, where Jupyter Book looks); myst-nb matches a notebook to
its cached copy by the hash of its code cells and kernel, so an edited notebook is executed again by the build.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / ".jupyter_cache"


def book_notebooks() -> list[Path]:
    """The notebooks of ``_toc.yml``, in the book's order."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files: list[str] = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))
            for part in entry.get("parts", []):
                walk(part.get("chapters"))

    walk(toc.get("chapters"))
    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


def execute(path: str, timeout: int) -> tuple[str, float, str | None, str | None]:
    """Execute one notebook in its folder; return (path, seconds, the executed notebook as JSON or None,
    traceback or None)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(path, as_version=4)
    result = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=timeout, allow_errors=False,
                                 meta_override=True)
    if result.err is not None:
        return path, result.time, None, result.exc_string
    return path, result.time, nbformat.writes(nb), None


TIMES = ROOT / "tools" / "execute_times.json"


def read_times() -> dict[str, float]:
    """The seconds each notebook took in a measured build (``tools/execute_times.json``; empty if there is none)."""
    return json.loads(TIMES.read_text()) if TIMES.exists() else {}


def expected_seconds(path: Path, times: dict[str, float]) -> float:
    """How long ``path`` is expected to take, for the order of execution: its entry in ``times`` (seconds measured
    in a build, :func:`read_times`), else its file size in bytes divided by 10,000 (a rough proxy)."""
    name = path.resolve().relative_to(ROOT).as_posix()
    return float(times.get(name, path.stat().st_size / 10_000))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="notebooks at a time")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds a cell may take")
    parser.add_argument("--record", action="store_true",
                        help="write the measured seconds to tools/execute_times.json (the order of later builds)")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the executed notebooks into this folder instead of the cache (an author's check: "
                             "python tools/page_rules.py OUT/NAME.ipynb)")
    parser.add_argument("only", nargs="*", type=Path, help="execute only these notebooks (default: the book's)")
    args = parser.parse_args(argv)
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    os.environ["ATTNBOOK_NO_PROGRESS"] = "1"
    if args.jobs > 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ.setdefault("MKL_NUM_THREADS", "1")
    if not args.only and args.out is None:  # a whole build starts from an empty cache; a subset replaces only its own notebooks
        shutil.rmtree(CACHE, ignore_errors=True)
    cache = get_cache(str(CACHE)) if args.out is None else None
    notebooks = [p.resolve() for p in args.only] or book_notebooks()
    times = read_times()
    notebooks.sort(key=lambda path: expected_seconds(path, times), reverse=True)
    start, failed, measured = time.perf_counter(), [], {}
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(execute, str(p), args.timeout) for p in notebooks]
        for future in as_completed(futures):
            path, seconds, executed, error = future.result()
            name = Path(path).relative_to(ROOT)
            if error is not None:
                failed.append(name)
                print(f"{name}: FAILED after {seconds:.1f} s\n{error}", file=sys.stderr, flush=True)
                continue
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / Path(path).name).write_text(executed)
                print(f"{name}: {seconds:.1f} s, written to {args.out / Path(path).name}", flush=True)
                continue
            nb = nbformat.reads(executed, as_version=4)
            cache.cache_notebook_bundle(CacheBundleIn(nb, path, data={"execution_seconds": seconds}),
                                        check_validity=False, overwrite=True)
            measured[name.as_posix()] = round(seconds, 1)
            print(f"{name}: {seconds:.1f} s", flush=True)
    print(f"executed {len(notebooks) - len(failed)} of {len(notebooks)} notebooks in "
          f"{time.perf_counter() - start:.1f} s with {args.jobs} at a time", flush=True)
    if args.record and not failed:
        times.update(measured)
        TIMES.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
