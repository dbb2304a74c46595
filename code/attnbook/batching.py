"""Length-bucketed and random batching for variable-length documents.

Explained in chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``),
section "Bucketing", which tests the claim that bucketing keeps padding small: :class:`BucketBatchSampler` (sort
within pools) against the baseline :class:`RandomBatchSampler`, measured by :func:`padding_fraction`.

Both samplers are ``torch.utils.data.Sampler[list[int]]``: pass one as ``batch_sampler=`` to a ``DataLoader``.
Each epoch's order comes from a ``torch.Generator`` seeded with ``seed + epoch``; call ``set_epoch`` as for
``DistributedSampler``. Mask convention, as everywhere in attnbook: bool, True = the position takes part.

Packing instead of padding (chapter 9, section "Packing instead of padding"): several documents share one row of at
most ``max_len`` tokens (:func:`pack_documents`, :func:`pack_collate`); a row's *document ids* (``doc_ids``, int64
``(B, L)``: ``0, 0, 0, 1, 1, 2, ..., -1, -1``) say which document each position belongs to, ``-1`` = a pad at the
end of the row. :func:`document_mask` turns them into the block-diagonal attention mask (no document attends to
another), :func:`document_positions` into positions that restart at 0 in every document, and
:func:`document_offsets` into the cumulative offsets (``cu_seqlens``) of variable-length kernels. The attention
backends that read them are in :mod:`attnbook.packing`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from .masking import as_integer_tensor, check_int

__all__ = ["BucketBatchSampler", "RandomBatchSampler", "padding_fraction", "pad_to_batch", "PACKING_METHODS",
           "pack_documents", "document_ids", "check_document_ids", "document_mask", "document_positions",
           "document_offsets", "PackedBatch", "pack_collate"]


def _as_lengths(lengths: object) -> Tensor:
    """Validate ``lengths`` (1-D, integer, non-empty, every entry >= 1) and return an int64 CPU copy."""
    t = torch.as_tensor(lengths)
    if t.numel() == 0:
        raise ValueError("lengths must not be empty")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"lengths must have an integer dtype, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"lengths must be one-dimensional (n,), got shape {tuple(t.shape)}")
    if int(t.min()) < 1:
        raise ValueError(f"every length must be >= 1, got min(lengths) = {int(t.min())} at index {int(t.argmin())}")
    return t.to("cpu", torch.long).clone()  # a copy: later changes to the caller's array do not leak in


def _as_indices(batch: object, name: str, n: int, what: str) -> Tensor:
    """``batch`` as a flat int64 tensor of indices in ``[0, n)``; a bool or float ``batch`` raises ``TypeError``
    (``[True, False]`` is not read as the indices ``[1, 0]``, nor ``[1.7]`` as ``[1]``)."""
    if isinstance(batch, Tensor):
        idx = batch
    else:
        if isinstance(batch, (str, bytes)):
            raise TypeError(f"{name} must be a sequence of int indices, got {type(batch).__name__}")
        batch = list(batch)
        if any(isinstance(i, bool) for i in batch):  # torch.as_tensor([True, 2]) would give int64 [1, 2]
            raise TypeError(f"{name} must hold int indices, got bools {batch[:10]}")
        idx = batch
    idx = as_integer_tensor(idx, name).reshape(-1).to(torch.long)
    bad = idx[(idx < 0) | (idx >= n)]
    if bad.numel():
        raise ValueError(f"index {int(bad[0])} is out of range for {n} {what}")
    return idx


def _chunks(order: Tensor, size: int) -> list[list[int]]:
    return [order[i : i + size].tolist() for i in range(0, len(order), size)]


class _EpochBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Shared parts: argument checks, ``set_epoch``, ``__len__`` and ``__iter__`` over ``_batches(generator)``."""

    def __init__(self, n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.n, self.batch_size, self.shuffle, self.drop_last = n, batch_size, shuffle, drop_last
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use epoch ``epoch``'s order (generator seed ``seed + epoch``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        # Only the last batch of the epoch (random) or of the last pool (bucketing) can be partial.
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        for batch in self._batches(generator):
            if len(batch) == self.batch_size or not self.drop_last:
                yield batch

    def _batches(self, generator: torch.Generator) -> list[list[int]]:
        raise NotImplementedError


class BucketBatchSampler(_EpochBatchSampler):
    """Batches of examples of similar length: shuffle, cut into pools, sort each pool by length, cut into batches.

    Args:
        lengths: 1-D integer sequence, array or tensor ``(n,)``: each example's length in tokens (>= 1).
        batch_size: examples per batch.
        pool_size: batches per pool; a pool holds ``batch_size * pool_size`` examples. Larger pools give less
            padding and less randomness (``pool_size >= n / batch_size`` sorts the whole epoch at once).
        shuffle: if True, each epoch (generator seeded ``seed + epoch``) permutes the indices, cuts them into
            pools, stable-sorts each pool by length, cuts each pool into batches, then shuffles the order of the
            batches with the same generator (the "sort within pools" of AllenNLP's and torchtext's
            ``BucketIterator``). If False: one stable sort of the whole dataset, batches from shortest to longest.
        drop_last: drop batches smaller than ``batch_size``. Pools are whole multiples of ``batch_size``, so at
            most one batch per epoch is partial: the longest examples of the last pool (with ``shuffle=False``,
            always the longest ``n % batch_size`` examples of the dataset).
        seed: base seed; see :meth:`set_epoch`.

    Yields:
        ``list[int]`` of example indices, ``len(self)`` batches per epoch; within a batch, ascending length.
        Without ``drop_last`` every index appears exactly once per epoch. Iterating twice without
        :meth:`set_epoch` gives the same batches.

    Raises:
        TypeError: ``lengths`` is not of an integer dtype.
        ValueError: ``batch_size < 1``, ``pool_size < 1``, ``lengths`` empty or not 1-D, or a length < 1 (the
            message gives the value).

    Pad each batch with :func:`pad_to_batch`; chapter 5, section "Bucketing".
    """

    def __init__(self, lengths: Sequence[int] | Tensor, batch_size: int, *, pool_size: int = 50,
                 shuffle: bool = True, drop_last: bool = False, seed: int = 0) -> None:
        self.lengths = _as_lengths(lengths)
        super().__init__(len(self.lengths), batch_size, shuffle, drop_last, seed)
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self.pool_size = pool_size

    def _batches(self, generator: torch.Generator) -> list[list[int]]:
        if not self.shuffle:
            return _chunks(torch.argsort(self.lengths, stable=True), self.batch_size)
        order = torch.randperm(self.n, generator=generator)
        pool, batches = self.batch_size * self.pool_size, []
        for start in range(0, self.n, pool):
            members = order[start : start + pool]
            batches += _chunks(members[torch.argsort(self.lengths[members], stable=True)], self.batch_size)
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


class RandomBatchSampler(_EpochBatchSampler):
    """The baseline: a random permutation per epoch, cut into batches of ``batch_size``.

    Args:
        lengths_or_n: the number of examples ``n`` (int >= 1), or their lengths (validated as in
            :class:`BucketBatchSampler`; only their count is used).
        batch_size: examples per batch.
        shuffle: if True, permute with a generator seeded ``seed + epoch``; if False, indices in order.
        drop_last: drop the last batch if it is smaller than ``batch_size``.
        seed: base seed; see :meth:`set_epoch`.

    Yields:
        ``list[int]`` of example indices, ``len(self)`` batches per epoch; without ``drop_last`` every index
        appears exactly once per epoch. Iterating twice without :meth:`set_epoch` gives the same batches.

    Raises:
        TypeError: lengths not of an integer dtype.
        ValueError: ``batch_size < 1``, ``n < 1``, lengths empty or not 1-D, or a length < 1.

    Chapter 5, section "Bucketing".
    """

    def __init__(self, lengths_or_n: int | Sequence[int] | Tensor, batch_size: int, *, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0) -> None:
        if isinstance(lengths_or_n, int):
            if lengths_or_n < 1:
                raise ValueError(f"n must be >= 1, got {lengths_or_n}")
            n = lengths_or_n
        else:
            n = len(_as_lengths(lengths_or_n))
        super().__init__(n, batch_size, shuffle, drop_last, seed)

    def _batches(self, generator: torch.Generator) -> list[list[int]]:
        order = torch.randperm(self.n, generator=generator) if self.shuffle else torch.arange(self.n)
        return _chunks(order, self.batch_size)


def padding_fraction(lengths: Sequence[int] | Tensor, batches: Iterable[Sequence[int]]) -> float:
    """Share of pad tokens when every batch is padded to its own longest example.

    Args:
        lengths: 1-D integer ``(n,)``, each example's length in tokens (>= 1).
        batches: lists of indices into ``lengths``, e.g. one epoch of a sampler; empty batches count for nothing.

    Returns:
        ``1 - sum(lengths[i] for all i) / sum(len(batch) * max(lengths[batch]))``, in ``[0, 1)``.

    Raises:
        TypeError: ``lengths`` is not of an integer dtype, or a batch holds bools or floats (they are not read as
            indices).
        ValueError: ``lengths`` invalid (as in :class:`BucketBatchSampler`), an index outside ``[0, n)``
            (the message gives it), or no batch holds an example.

    Chapter 5, section "Bucketing".
    """
    lengths = _as_lengths(lengths)
    tokens = slots = 0
    for batch in batches:
        idx = _as_indices(batch, "batches", len(lengths), "lengths")
        if idx.numel() == 0:
            continue
        tokens += int(lengths[idx].sum())
        slots += idx.numel() * int(lengths[idx].max())
    if slots == 0:
        raise ValueError("batches hold no examples")
    return 1.0 - tokens / slots


def pad_to_batch(ids: Tensor, lengths: Tensor, batch: Sequence[int] | Tensor, *, side: str = "post"
                 ) -> tuple[Tensor, Tensor]:
    """Cut one batch out of right-padded storage, padded only to the batch's own longest example.

    Args:
        ids: int64 ``(n, max_len)``, the whole dataset right-padded with pad id 0 (as from
            :func:`attnbook.text.pad_batch`).
        lengths: int64 ``(n,)``, the number of real tokens of each row (``<= max_len``).
        batch: ``B`` row indices in ``[0, n)``, e.g. one batch of :class:`BucketBatchSampler`.
        side: ``"post"`` = pads after the tokens (row ``i`` is ``tokens + [0] * (T_b - L_i)``); ``"pre"`` = pads
            before them (``[0] * (T_b - L_i) + tokens``).

    Returns:
        ``(batch_ids, batch_lengths)``: ``batch_ids`` ``(B, T_b)``, dtype and device of ``ids``, with
        ``T_b = max(batch_lengths)``; ``batch_lengths`` int64 ``(B,)``. Pad positions are 0 whatever the storage
        held there. Mask (bool, True = the position takes part, as in
        ``torch.nn.functional.scaled_dot_product_attention``): for ``"post"``,
        ``attnbook.masking.lengths_to_mask(batch_lengths, T_b)``; for ``"pre"`` the valid positions are the last
        ``L_i``, i.e. ``lengths_to_mask(batch_lengths, T_b).flip(-1)``.

    Raises:
        TypeError: ``ids`` or ``lengths`` is not a tensor, ``lengths`` is not of an integer dtype, or ``batch`` holds
            bools or floats (``[True, False]`` is not read as the indices ``[1, 0]``; to select rows with a bool
            mask, pass ``mask.nonzero().flatten()``).
        ValueError: ``side`` not ``"post"`` or ``"pre"``; ``ids`` not 2-D or ``lengths`` not ``(n,)`` (the message
            gives both shapes); a length outside ``[0, max_len]``; ``batch`` empty or with an index outside
            ``[0, n)``.

    Chapter 5, section "Bucketing".
    """
    if side not in ("post", "pre"):
        raise ValueError(f"side must be 'post' or 'pre', got {side!r}")
    for name, t in (("ids", ids), ("lengths", lengths)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    as_integer_tensor(lengths, "lengths")
    if ids.dim() != 2 or lengths.shape != (ids.shape[0],):
        raise ValueError(f"expected ids (n, max_len) and lengths (n,), got ids {tuple(ids.shape)} "
                         f"and lengths {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > ids.shape[1]):
        raise ValueError(f"lengths must lie in [0, max_len={ids.shape[1]}], got min {int(lengths.min())} "
                         f"and max {int(lengths.max())}")
    idx = _as_indices(batch, "batch", ids.shape[0], "rows").to(ids.device)
    if idx.numel() == 0:
        raise ValueError("batch must not be empty")
    batch_lengths = lengths.to(device=ids.device, dtype=torch.long)[idx]
    width = int(batch_lengths.max())
    rows = ids[idx, :width]
    positions = torch.arange(width, device=ids.device).unsqueeze(0)
    if side == "post":
        return torch.where(positions < batch_lengths.unsqueeze(1), rows, 0), batch_lengths
    shift = (width - batch_lengths).unsqueeze(1)  # pads in front of row i
    source = (positions - shift).clamp(min=0)
    return torch.where(positions >= shift, rows.gather(1, source), 0), batch_lengths


# ----------------------------------------------------------------------------------------------- packing
#: The packing methods of :func:`pack_documents`.
PACKING_METHODS = ("first_fit_decreasing", "greedy")


def _first_fit(lengths: list[int], order: list[int], max_len: int) -> list[list[int]]:
    """First fit in ``order``: each document goes into the first (oldest) row with room, else into a new row. The
    rows' free space sits in a max segment tree, so a placement costs O(log n) (about 0.1 s for 40,000 documents)."""
    size = 1
    while size < len(order):
        size *= 2
    free = [0] * (2 * size)           # leaves: free space of row i (0 for rows not opened yet); nodes: the max
    rows: list[list[int]] = []
    for i in order:
        need = lengths[i]
        if free[1] >= need:           # descend to the leftmost row with room
            node = 1
            while node < size:
                node = 2 * node if free[2 * node] >= need else 2 * node + 1
            row = node - size
        else:                         # open a new row
            row = len(rows)
            rows.append([])
            node = row + size
            free[node] = max_len
        rows[row].append(i)
        free[node] -= need
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return rows


def pack_documents(lengths: Sequence[int] | Tensor, max_len: int, *, method: str = "first_fit_decreasing",
                   seed: int = 0) -> list[list[int]]:
    """Pack documents into rows of at most ``max_len`` tokens; every document goes whole into exactly one row.

    Args:
        lengths: 1-D integer ``(n,)``, each document's length in tokens (>= 1), e.g. the lengths of one batch.
        max_len: the most tokens a row holds (>= 1).
        method: ``"first_fit_decreasing"`` (the default): the documents sorted by decreasing length (ties by
            index), each put into the first row that still has room, else into a new row. It is deterministic and
            tight: never more than ``11/9 OPT + 6/9`` rows, where ``OPT`` is the fewest possible (Dósa 2007), so it
            leaves the fewest pads; the rows come out roughly from the longest documents to the shortest, so
            shuffle the rows (or pack each random batch of documents, as :mod:`attnbook.experiments.packing` does)
            before training on them. ``"greedy"``: the documents in a random order (a ``torch.Generator`` seeded
            with ``seed``), each appended to the current row while it fits, else starting a new row ("next fit",
            T5's concatenation of examples without splitting them): a new random packing for every seed, with more
            pads.
        seed: the order of ``"greedy"`` (ignored by ``"first_fit_decreasing"``).

    Returns:
        ``list[list[int]]``: the rows, each a list of indices into ``lengths`` in the order of the documents in the
        row; every index in ``0 .. n - 1`` appears exactly once, and ``sum(lengths[row]) <= max_len`` for every
        row. Pass the rows to :func:`pack_collate` (after mapping them to dataset indices where ``lengths`` were a
        batch's).

    Raises:
        TypeError: ``lengths`` not of an integer dtype; ``max_len`` or ``seed`` not an int.
        ValueError: ``lengths`` empty, not 1-D or with a length < 1; ``max_len < 1``; an unknown ``method``; a
            document longer than ``max_len`` (the message gives its index and length). Long documents are
            rejected, not truncated: truncation would silently drop tokens; cut them when encoding instead
            (:func:`attnbook.text.encode` takes a ``max_len``).

    Krell et al. (2021), "Efficient sequence packing without cross-contamination", section 3 (packing as bin
    packing; first-fit decreasing among their baselines); Raffel et al. (2020, T5), section 3.1.2 (packing
    examples into rows). Chapter 9, section "Packing instead of padding".
    """
    t = _as_lengths(lengths)
    max_len = check_int(max_len, "max_len", minimum=1)
    seed = check_int(seed, "seed")
    if method not in PACKING_METHODS:
        raise ValueError(f"method must be one of {list(PACKING_METHODS)}, got {method!r}")
    too_long = torch.nonzero(t > max_len).flatten()
    if too_long.numel():
        i = int(too_long[0])
        raise ValueError(f"document {i} has length {int(t[i])} > max_len={max_len} ({too_long.numel()} documents "
                         "too long); pack_documents does not truncate: cut documents to max_len when encoding them")
    lengths_list = t.tolist()
    if method == "first_fit_decreasing":
        return _first_fit(lengths_list, torch.argsort(-t, stable=True).tolist(), max_len)
    rows: list[list[int]] = []
    used = max_len  # forces a new row for the first document
    for i in torch.randperm(len(t), generator=torch.Generator().manual_seed(seed)).tolist():
        if used + lengths_list[i] > max_len:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += lengths_list[i]
    return rows


def document_ids(row_lengths: Sequence[Sequence[int]], width: int | None = None) -> Tensor:
    """Document ids of packed rows, from the lengths of the documents in each row.

    Args:
        row_lengths: one sequence per row of the lengths (>= 1) of its documents, in order; e.g. ``[[3, 2], [4]]``.
        width: the row length ``L``; ``None`` = the longest row's total.

    Returns:
        int64 ``(B, L)``: in row ``b``, the first document's positions hold 0, the next document's 1, and so on;
        the pads after the last document hold -1. ``[[3, 2], [4]]`` gives ``[[0, 0, 0, 1, 1], [0, 0, 0, 0, -1]]``.

    Raises:
        TypeError: a length that is not an int. ValueError: no rows, a length < 1, or a row longer than
            ``width`` (the message gives the row and its total).

    Chapter 9, section "Packing instead of padding".
    """
    rows = [[check_int(n, f"row_lengths[{b}]", minimum=1) for n in row] for b, row in enumerate(row_lengths)]
    if not rows:
        raise ValueError("row_lengths must hold at least one row")
    totals = [sum(row) for row in rows]
    width = max(totals) if width is None else check_int(width, "width", minimum=0)
    for b, total in enumerate(totals):
        if total > width:
            raise ValueError(f"row {b} holds {total} tokens, more than width={width}")
    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        if row:
            out[b, : totals[b]] = torch.repeat_interleave(torch.arange(len(row)), torch.tensor(row))
    return out


def check_document_ids(doc_ids: object, name: str = "doc_ids") -> Tensor:
    """Raise unless ``doc_ids`` are the document ids of packed rows; return them.

    Valid: an integer tensor ``(B, L)`` in which each row is ``0, ..., 0, 1, ..., 1, ..., k-1, -1, ..., -1``:
    documents numbered from 0 in order, each one contiguous run, pads (-1) only at the end of the row (a row may be
    all pads). This is what :func:`document_ids` and :func:`pack_collate` make.

    Raises:
        TypeError: not an integer tensor (bools and floats are refused). ValueError: not 2-D, a value < -1, a pad
            before a real token, a row whose first document is not 0, or ids that skip or go back (the message
            gives the row).

    Chapter 9, section "Packing instead of padding".
    """
    if not isinstance(doc_ids, Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor (batch, length), got {type(doc_ids).__name__}")
    as_integer_tensor(doc_ids, name)
    if doc_ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got {tuple(doc_ids.shape)}")
    if doc_ids.numel() == 0:
        return doc_ids
    if int(doc_ids.min()) < -1:
        raise ValueError(f"{name} must be >= -1 (-1 = pad), got min {int(doc_ids.min())}")
    real = doc_ids >= 0
    problems = (
        (real[:, 1:] & ~real[:, :-1]).any(1), "has a pad (-1) before a real token: pads go at the end of a row",
        real[:, 0] & (doc_ids[:, 0] != 0), "does not start with document 0",
        (real[:, 1:] & ((doc_ids[:, 1:] - doc_ids[:, :-1] < 0) | (doc_ids[:, 1:] - doc_ids[:, :-1] > 1))).any(1),
        "skips or repeats a document id: ids must go 0, 0, ..., 1, 1, ..., each document one contiguous run",
    )
    for bad, what in zip(problems[::2], problems[1::2]):
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise ValueError(f"{name} row {b} {what}; got {doc_ids[b, :20].tolist()}")
    return doc_ids


def document_mask(doc_ids: Tensor) -> Tensor:
    """The block-diagonal (document) attention mask of packed rows.

    Args:
        doc_ids: int ``(B, L)`` document ids (see :func:`check_document_ids`; -1 = pad).

    Returns:
        bool ``(B, L, L)``, on ``doc_ids``' device: ``mask[b, i, j]`` is True (= takes part, as the boolean
        ``attn_mask`` of ``torch.nn.functional.scaled_dot_product_attention``) where query ``i`` and key ``j`` are
        real tokens of the same document: ``doc_ids[b, i] == doc_ids[b, j] >= 0``. Pads take part in nothing; their
        rows are all False (attnbook's attention gives such a query a zero output). torch's
        ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` take the opposite polarity: pass ``~mask``.

    Raises:
        TypeError, ValueError: ``doc_ids`` invalid, as in :func:`check_document_ids`.

    Krell et al. (2021), section 4 (the block-diagonal mask that prevents cross-contamination). Chapter 9, section
    "Packing instead of padding".
    """
    check_document_ids(doc_ids)
    return (doc_ids[:, :, None] == doc_ids[:, None, :]) & (doc_ids >= 0)[:, :, None]


def document_positions(doc_ids: Tensor) -> Tensor:
    """Positions that restart at 0 in every document of a packed row.

    Args:
        doc_ids: int ``(B, L)`` document ids (see :func:`check_document_ids`; -1 = pad).

    Returns:
        int64 ``(B, L)``: each document's tokens get ``0, 1, ..., n - 1``, as if it stood alone at the start of a
        row; pads get 0. ``[[0, 0, 0, 1, 1, -1]]`` gives ``[[0, 1, 2, 0, 1, 0]]``.

    Raises:
        TypeError, ValueError: ``doc_ids`` invalid, as in :func:`check_document_ids`.

    Krell et al. (2021), section 4 (position ids restarted per sequence). Chapter 9, section "Packing instead of
    padding".
    """
    check_document_ids(doc_ids)
    index = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start_index = torch.where(starts, index, 0).cummax(1).values  # index where the current document began
    return torch.where(doc_ids >= 0, index - start_index, 0)


def document_offsets(doc_ids: Tensor) -> tuple[Tensor, int]:
    """The cumulative offsets (``cu_seqlens``) of the documents of packed rows, for variable-length kernels.

    Args:
        doc_ids: int ``(B, L)`` document ids (see :func:`check_document_ids`; -1 = pad).

    Returns:
        ``(offsets, max_doc_len)``: ``offsets`` int64 ``(N + 1,)`` for the ``N`` documents of all rows, in row-major
        order, with ``offsets[0] = 0`` and ``offsets[d + 1] - offsets[d]`` = the length of document ``d``: the
        documents' tokens are ``doc_ids[doc_ids >= 0]``'s positions, flattened row by row (what ``x[doc_ids >=
        0]`` selects); ``max_doc_len`` the longest document (0 if there is none). FlashAttention-2's
        ``flash_attn_varlen_func`` and ``torch.nn.attention.varlen.varlen_attn`` take them as int32
        (``offsets.int()``); ``torch.nested.nested_tensor_from_jagged`` as int64.

    Raises:
        TypeError, ValueError: ``doc_ids`` invalid, as in :func:`check_document_ids`.

    Dao (2023), FlashAttention-2 (its variable-length interface). Chapter 9, section "Packing instead of padding".
    """
    check_document_ids(doc_ids)
    n_docs = (doc_ids.max(1).values + 1).clamp_min(0) if doc_ids.shape[1] else doc_ids.new_zeros(len(doc_ids))
    first = n_docs.cumsum(0) - n_docs                            # the flat number of each row's document 0
    real = doc_ids >= 0
    lengths = torch.bincount((first[:, None] + doc_ids)[real], minlength=int(n_docs.sum()))   # row-major order
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long, device=doc_ids.device)
    offsets[1:] = lengths.cumsum(0)
    return offsets, int(lengths.max()) if len(lengths) else 0


class PackedBatch(NamedTuple):
    """One batch of packed rows (:func:`pack_collate`): ``ids`` int64 ``(B, L)`` (pads 0), ``doc_ids`` int64
    ``(B, L)`` (-1 = pad), ``positions`` int64 ``(B, L)`` (restarting per document), ``order`` int64 ``(N,)`` (the
    dataset index of each document, row-major: ``labels[order]`` lines up with per-document outputs) and
    ``lengths`` int64 ``(N,)`` (each document's length, same order)."""

    ids: Tensor
    doc_ids: Tensor
    positions: Tensor
    order: Tensor
    lengths: Tensor


def pack_collate(ids: Tensor, lengths: Tensor, rows: Sequence[Sequence[int]], *, width: int | None = None
                 ) -> PackedBatch:
    """Cut packed rows out of right-padded storage: the documents of each row, one after another, then pads.

    Args:
        ids: int ``(n, max_len)``, the whole dataset right-padded with pad id 0 (as from
            :func:`attnbook.text.pad_batch`; the storage of :func:`pad_to_batch`).
        lengths: int ``(n,)``, the number of real tokens of each document (1 ..  ``max_len``).
        rows: the packing: one sequence of dataset indices per row, e.g. :func:`pack_documents` of a batch's
            lengths mapped back to dataset indices. An index may appear only once.
        width: the row length ``L``; ``None`` = the longest row's total.

    Returns:
        :class:`PackedBatch` ``(ids, doc_ids, positions, order, lengths)``: ``ids`` int64 ``(B, L)`` with row ``b``
        = the tokens of ``rows[b][0]``, then of ``rows[b][1]``, ..., then 0; ``doc_ids`` (:func:`document_ids`);
        ``positions`` (:func:`document_positions`); ``order`` the dataset indices of the documents in row-major
        order; ``lengths`` their lengths. Masks: :func:`document_mask` ``(doc_ids)`` (bool, True = takes part).

    Raises:
        TypeError: ``ids`` or ``lengths`` not a tensor, not of an integer dtype; ``rows`` holding bools or floats.
        ValueError: ``ids`` not 2-D or ``lengths`` not ``(n,)`` (the message gives both shapes); a length outside
            ``[1, max_len]`` among the packed documents; an index outside ``[0, n)`` or given twice; no rows; a row
            longer than ``width``.

    Chapter 9, section "Packing instead of padding".
    """
    for name, t in (("ids", ids), ("lengths", lengths)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        as_integer_tensor(t, name)
    if ids.dim() != 2 or lengths.shape != (ids.shape[0],):
        raise ValueError(f"expected ids (n, max_len) and lengths (n,), got ids {tuple(ids.shape)} "
                         f"and lengths {tuple(lengths.shape)}")
    if isinstance(rows, (str, bytes)) or not len(rows):
        raise ValueError("rows must hold at least one row")
    per_row = [row.tolist() if isinstance(row, Tensor) else list(row) for row in rows]
    order = _as_indices([i for row in per_row for i in row], "rows", ids.shape[0], "documents")  # checked at once
    if len(torch.unique(order)) != len(order):
        counts = torch.bincount(order)
        raise ValueError(f"document {int(counts.argmax())} appears {int(counts.max())} times in rows; "
                         "each document goes into one row once")
    doc_lengths = lengths.to(torch.long).cpu()[order]
    if len(order) and (int(doc_lengths.min()) < 1 or int(doc_lengths.max()) > ids.shape[1]):
        raise ValueError(f"the packed documents' lengths must lie in [1, max_len={ids.shape[1]}], got min "
                         f"{int(doc_lengths.min())} and max {int(doc_lengths.max())}")
    row_lengths = [part.tolist() for part in torch.split(doc_lengths, [len(row) for row in per_row])]
    doc_ids = document_ids(row_lengths, width).to(ids.device)
    source = ids.to(torch.long)[order.to(ids.device)]                   # (N, max_len)
    keep = torch.arange(ids.shape[1], device=ids.device) < doc_lengths.to(ids.device)[:, None]
    packed = torch.zeros(doc_ids.shape, dtype=torch.long, device=ids.device)
    packed[doc_ids >= 0] = source[keep]       # both in row-major order: documents one after another
    return PackedBatch(packed, doc_ids, document_positions(doc_ids), order, doc_lengths)
