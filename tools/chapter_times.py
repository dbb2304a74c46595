"""Execute every chapter notebook in the current mode and print a markdown table of wall times.

Usage: ``.venv/bin/python tools/chapter_times.py`` (quick mode on a machine without a GPU). The README's
per-chapter table is pasted from this script's output, with the machine it ran on.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    import torch

    from attnbook.runtime import describe_device, get_mode

    rows = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        NotebookClient(nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
        rows.append((path.name, time.perf_counter() - start))
        print(f"{path.name}: {rows[-1][1]:.1f} s", file=sys.stderr)
    print(f"Mode `{get_mode()}` on {describe_device()}, {torch.get_num_threads()} torch threads, "
          f"Python {platform.python_version()}, torch {torch.__version__}:\n")
    print("| notebook | wall time (s) |\n|---|---|")
    for name, seconds in rows:
        print(f"| `{name}` | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
