"""Length-bucketed and random batching for variable-length documents.

Explained in chapter 5, "Seq2vec attention and the padding-mask experiments" (``chapters/05_seq2vec_masking``),
section "Bucketing", which tests the claim that bucketing keeps padding small: :class:`BucketBatchSampler` (sort
within pools) against the baseline :class:`RandomBatchSampler`, measured by :func:`padding_fraction`.

Both samplers are ``torch.utils.data.Sampler[list[int]]``: pass one as ``batch_sampler=`` to a ``DataLoader``.
Each epoch's order comes from a ``torch.Generator`` seeded with ``seed + epoch``; call ``set_epoch`` as for
``DistributedSampler``. Mask convention, as everywhere in attnbook: bool, True = the position takes part.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

from .masking import as_integer_tensor

__all__ = ["BucketBatchSampler", "RandomBatchSampler", "padding_fraction", "pad_to_batch"]


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
