"""A padding audit for any model: does every sequence get, in a padded batch, the output it gets alone?

Chapter 10, "Padding bugs in the wild" (``chapters/10_padding_bugs``), explains the checks and runs them on the
implementations people use; :mod:`attnbook.audit.subjects` holds those adapters, and ``python -m attnbook.audit``
runs them all.

The audit needs no data and no training: it draws random token ids, pads them, and compares outputs. It sees the
model only through one function, ``forward(input_ids, attention_mask)``:

- ``input_ids``: int64 ``(B, L)``; pads hold ``pad_id`` (or, in one check, other ids);
- ``attention_mask``: bool ``(B, L)``, True = a real token (the convention of the whole book, and of
  ``F.scaled_dot_product_attention``; ``nn.MultiheadAttention``'s ``key_padding_mask`` is its negation);
- it returns a float tensor: ``(B, ...)`` for ``output="sequence"`` (one output per sequence, e.g. logits), or
  ``(B, L, ...)`` for ``output="token"`` (one output per position; only real positions are compared).

How the model gets its positions, which attention path it takes and whether it runs under ``torch.no_grad`` is the
forward's business: that is what the audit tests. Example::

    from attnbook.audit import audit

    def forward(input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask.long()).last_hidden_state

    report = audit(forward, output="token")
    assert report.passed, report

The checks (:data:`CHECKS`, always run, and :data:`OPTIONAL_CHECKS`, on request):

``batch_equivalence``
    Each row of the padded batch equals that sequence run alone, without padding (a batch of one, all True).
``extra_padding``
    Padding the batch to twice its length changes no real output.
``pad_content``
    Other token ids in the padded positions change no real output (a model must not read its pads).
``empty_row``
    A row with no real token gives finite outputs, and leaves the other rows' outputs unchanged.
``low_precision`` (optional)
    Under ``torch.autocast`` in fp16 and in bf16, the padded batch with an empty row gives finite outputs, and the
    real outputs stay within ``low_precision_rtol`` of fp32's (relative to their largest magnitude). The empty row
    is left out when fp32 fails on it too (``empty_row`` reports that), so that this check reports what lower
    precision adds.
``mask_polarity`` (optional)
    Inverting the mask of every row that has pads changes that row's output: the forward reads the mask, with the
    book's polarity or the opposite one. (A model that ignores its mask passes the first four checks only if it has
    no padding to ignore; one whose adapter flips the polarity fails them.)

Differences are measured in float64 on the outputs; a check passes when the largest absolute difference is at most
``atol`` (NaN or infinity in an output compared never passes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import Tensor

__all__ = ["audit", "AuditReport", "CHECKS", "OPTIONAL_CHECKS", "PADDING_SIDES", "OUTPUTS", "COLUMNS"]

#: The checks every audit runs, in order.
CHECKS = ("batch_equivalence", "extra_padding", "pad_content", "empty_row")
#: The checks run only when asked for (``optional=...``).
OPTIONAL_CHECKS = ("low_precision", "mask_polarity")
PADDING_SIDES = ("right", "left")
OUTPUTS = ("sequence", "token")
#: The columns of :attr:`AuditReport.checks`.
COLUMNS = ["check", "passed", "max_abs_diff", "detail"]
_LOW_PRECISION = (("fp16", torch.float16), ("bf16", torch.bfloat16))


@dataclass
class AuditReport:
    """The result of :func:`audit`.

    Attributes:
        checks: one row per check, columns :data:`COLUMNS`: ``check`` (str), ``passed`` (bool), ``max_abs_diff``
            (float; NaN when an output compared was not finite or the forward raised) and ``detail`` (str, one
            sentence on what was seen).
        settings: the audit's arguments (lengths, padded length, padding side, output, seed, atol, ...).
        passed: True when every check passed.
    """

    checks: pd.DataFrame
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(len(self.checks)) and bool(self.checks["passed"].all())

    @property
    def failed(self) -> list[str]:
        """The names of the checks that failed, in order."""
        return [str(c) for c in self.checks.loc[~self.checks["passed"].astype(bool), "check"]]

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        n_failed = len(self.failed)
        verdict = ("passed" if self.passed else
                   f"FAILED ({n_failed} of {len(self.checks)} checks: {', '.join(self.failed)})")
        s = self.settings
        lines = [
            f"Padding audit {verdict}",
            f"  lengths {list(s.get('lengths', []))} padded to {s.get('length')}, {s.get('padding_side')} padding, "
            f"output {s.get('output')!r}, seed {s.get('seed')}, atol {s.get('atol'):g}" if s else "",
        ]
        width = max([len(str(c)) for c in self.checks["check"]] + [5])
        for row in self.checks.itertuples(index=False):
            mark = "pass" if row.passed else "FAIL"
            diff = "     -    " if not math.isfinite(row.max_abs_diff) else f"{row.max_abs_diff:10.2e}"
            lines.append(f"  {row.check:<{width}}  {mark}  max|diff| {diff}  {row.detail}")
        return "\n".join(line for line in lines if line)

    def __repr__(self) -> str:  # a report in a notebook cell or a pytest message reads like str()
        return str(self)


class _ForwardRaised(Exception):
    """The forward raised (inside a check, where that makes the check fail)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error

    def describe(self) -> str:
        message = " ".join(str(self.error).split())
        if len(message) > 160:
            message = message[:157] + "..."
        return f"forward raised {type(self.error).__name__}: {message}"


class _WrongLength(Exception):
    """A token-level output whose second dimension is not the input's length (inside a check)."""


def _check_lengths(lengths: object, length: object) -> tuple[list[int], int]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(f"lengths must be a sequence of ints, got {type(lengths).__name__}")
    values = list(lengths.tolist() if isinstance(lengths, Tensor) else lengths)
    if not values:
        raise ValueError("lengths must hold at least one length, got an empty sequence")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"lengths must be ints, got {value!r} ({type(value).__name__}) in {values}")
    if length is None:
        padded = max(values)
    elif isinstance(length, bool) or not isinstance(length, int):
        raise TypeError(f"length must be an int or None, got {length!r}")
    else:
        padded = length
    bad = [v for v in values if v < 0 or v > padded]
    if bad:
        raise ValueError(f"lengths must lie in [0, L] = [0, {padded}], got {bad} in {values}")
    if padded < 1 or max(values) < 1:
        raise ValueError(f"at least one length must be positive, got {values}")
    return values, padded


def _check_choice(value: object, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return str(value)


def _check_args(forward, vocab_size, pad_id, padding_side, output, seed, atol, optional, low_precision_rtol):
    if not callable(forward):
        raise TypeError(f"forward must be callable as forward(input_ids, attention_mask), got "
                        f"{type(forward).__name__}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 (a pad id and at least one other), got {vocab_size!r}")
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
        raise ValueError(f"pad_id must be an int in [0, vocab_size) = [0, {vocab_size}), got {pad_id!r}")
    _check_choice(padding_side, "padding_side", PADDING_SIDES)
    _check_choice(output, "output", OUTPUTS)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    for name, value in (("atol", atol), ("low_precision_rtol", low_precision_rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if isinstance(optional, str):
        optional = [optional]
    optional = list(optional)
    unknown = [name for name in optional if name not in OPTIONAL_CHECKS]
    if unknown:
        raise ValueError(f"unknown optional check(s) {unknown}; the optional checks are {list(OPTIONAL_CHECKS)}")
    return [name for name in OPTIONAL_CHECKS if name in optional]


class _Batches:
    """The audit's random sequences, and the padded batches made from them."""

    def __init__(self, lengths, length, vocab_size, pad_id, padding_side, seed, device):
        self.lengths, self.length, self.pad_id, self.side = lengths, length, pad_id, padding_side
        self.vocab_size, self.device = vocab_size, device
        self.generator = torch.Generator().manual_seed(seed)
        self.sequences = [self.draw((n,)) for n in lengths]

    def draw(self, shape: tuple[int, ...]) -> Tensor:
        """Random token ids other than ``pad_id``."""
        ids = torch.randint(0, self.vocab_size - 1, shape, generator=self.generator)
        return ids + (ids >= self.pad_id).long()

    def span(self, n: int, length: int) -> slice:
        """Where a sequence of ``n`` tokens sits in a row of ``length``."""
        return slice(0, n) if self.side == "right" else slice(length - n, length)

    def batch(self, length: int | None = None, *, extra_empty: bool = False, pad_ids: bool = True
              ) -> tuple[Tensor, Tensor]:
        """``(input_ids, attention_mask)`` of all sequences padded to ``length`` (default: the audit's L); with
        ``extra_empty``, one more row with no real token at the end; with ``pad_ids=False``, the pads hold random
        ids other than ``pad_id``."""
        length = self.length if length is None else length
        sequences = self.sequences + ([self.sequences[0][:0]] if extra_empty else [])
        rows = len(sequences)
        ids = torch.full((rows, length), self.pad_id, dtype=torch.long)
        if not pad_ids:
            ids = self.draw((rows, length))
        mask = torch.zeros(rows, length, dtype=torch.bool)
        for i, seq in enumerate(sequences):
            where = self.span(len(seq), length)
            ids[i, where] = seq
            mask[i, where] = True
        return ids.to(self.device), mask.to(self.device)


def _max_abs_diff(a: Tensor, b: Tensor) -> float:
    """The largest ``|a - b|`` (0 for empty tensors); NaN when either holds a NaN or an infinity."""
    if a.shape != b.shape:
        raise ValueError(f"outputs of one sequence differ in shape between calls: {tuple(a.shape)} and "
                         f"{tuple(b.shape)}; with output='sequence' the forward must return (B, ...) whatever L "
                         f"is (use output='token' for (B, L, ...))")
    if a.numel() == 0:
        return 0.0
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.nan
    return float((a - b).abs().max())


def _rows(indices: Sequence[int]) -> str:
    return ("row " if len(indices) == 1 else "rows ") + ", ".join(str(i) for i in indices)


def _nonfinite(t: Tensor) -> int:
    return int((~torch.isfinite(t)).sum())


def audit(forward: Callable[[Tensor, Tensor], Tensor], lengths: Sequence[int] = (7, 3, 12, 1),
          vocab_size: int = 100, *, padding_side: str = "right", pad_id: int = 0, output: str = "sequence",
          seed: int = 0, atol: float = 1e-5, length: int | None = None, optional: Iterable[str] = (),
          low_precision_rtol: float = 0.05, device: str | torch.device = "cpu") -> AuditReport:
    """Audit the padding behaviour of ``forward`` on random token ids (no data, no training).

    Args:
        forward: ``forward(input_ids, attention_mask) -> Tensor``; ``input_ids`` int64 ``(B, L)``,
            ``attention_mask`` bool ``(B, L)`` with True = a real token. It returns a float tensor ``(B, ...)``
            (``output="sequence"``) or ``(B, L, ...)`` (``output="token"``). It gets fresh copies of its inputs.
        lengths: the real lengths of the rows of the audited batch, each in ``[0, L]``.
        vocab_size: token ids are drawn from ``[0, vocab_size)``, never ``pad_id`` in a real position.
        padding_side: ``"right"`` (tokens, then pads) or ``"left"`` (pads, then tokens).
        pad_id: the id that fills the pads (except in the ``pad_content`` check).
        output: ``"sequence"`` or ``"token"`` (see above).
        seed: seeds the token ids (the forward's own randomness, e.g. dropout, is its own).
        atol: the largest absolute difference a check accepts.
        length: the padded length ``L``; default ``max(lengths)``.
        optional: names from :data:`OPTIONAL_CHECKS` to run as well.
        low_precision_rtol: the ``low_precision`` check's tolerance, relative to the largest fp32 real output.
        device: where the inputs are made (and which autocast the ``low_precision`` check uses).

    Returns:
        An :class:`AuditReport`: ``report.passed`` (bool), ``report.checks`` (a DataFrame, one row per check), and
        ``str(report)`` for a person.

    Raises:
        TypeError: ``forward`` is not callable; ``lengths`` not a sequence of ints; the forward returns something
            other than a floating-point ``torch.Tensor``.
        ValueError: a length outside ``[0, L]``, or none positive; an unknown ``padding_side``, ``output`` or
            optional check; ``vocab_size``, ``pad_id``, ``seed`` or a tolerance out of range; the forward returns
            the wrong batch size, or (on the plain padded batch) a token output whose length is not ``L``.
        RuntimeError: the forward raises on the plain padded batch (chained to its error): a forward that cannot
            run cannot be audited. Inside the other checks, an error of the forward makes that check fail instead.
    """
    lengths, length = _check_lengths(lengths, length)
    optional = _check_args(forward, vocab_size, pad_id, padding_side, output, seed, atol, optional,
                           low_precision_rtol)
    device = torch.device(device)
    data = _Batches(lengths, length, vocab_size, pad_id, padding_side, seed, device)
    token = output == "token"

    def call(ids: Tensor, mask: Tensor) -> Tensor:
        try:
            out = forward(ids.clone(), mask.clone())
        except Exception as error:  # noqa: BLE001 - the check reports it
            raise _ForwardRaised(error) from error
        if not isinstance(out, Tensor):
            raise TypeError(f"forward must return a torch.Tensor, got {type(out).__name__}; return the output "
                            f"tensor (e.g. .last_hidden_state or .logits), not a model output object")
        if not (out.is_floating_point() or out.is_complex()):
            raise TypeError(f"forward must return a floating-point tensor, got dtype {out.dtype}")
        if out.dim() == 0 or out.shape[0] != ids.shape[0]:
            shape = tuple(out.shape)
            raise ValueError(f"forward returned shape {shape} for a batch of {ids.shape[0]} rows: the first "
                             f"dimension must be the batch size")
        if token and (out.dim() < 2 or out.shape[1] != ids.shape[1]):
            raise _WrongLength(f"forward returned shape {tuple(out.shape)} for input of length {ids.shape[1]}; "
                               f"output='token' needs (B, L, ...)")
        return out.detach().to(torch.float64)

    def real(out: Tensor, i: int, n: int, total: int) -> Tensor:
        """Row ``i``'s outputs that belong to its ``n`` real tokens (all of the row for sequence outputs)."""
        return out[i, data.span(n, total)] if token else out[i]

    # The plain padded batch: the reference of every check. Errors here are the caller's to fix.
    ids, mask = data.batch()
    try:
        reference = call(ids, mask)
    except _ForwardRaised as raised:
        raise RuntimeError(f"the forward failed on the padded batch (lengths {lengths}, L = {length}): "
                           f"{raised.describe()}") from raised.error
    except _WrongLength as wrong:
        raise ValueError(str(wrong)) from None
    non_empty = [i for i, n in enumerate(lengths) if n > 0]

    def compare(out: Tensor, total: int, rows: Sequence[int] = non_empty) -> dict[int, float]:
        return {i: _max_abs_diff(real(out, i, lengths[i], total), real(reference, i, lengths[i], length))
                for i in rows}

    def verdict(diffs: dict[int, float], what: str, same: str) -> tuple[bool, float, str]:
        values = list(diffs.values())
        worst = math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)
        nan_rows = [i for i, v in diffs.items() if math.isnan(v)]
        off = [i for i, v in diffs.items() if not math.isnan(v) and v > atol]
        if not nan_rows and not off:
            return True, worst, same
        parts = []
        if off:
            parts.append(f"{_rows(off)} {what} (largest at row {max(off, key=lambda i: diffs[i])})")
        if nan_rows:
            parts.append(f"{_rows(nan_rows)}: NaN or infinite outputs")
        return False, worst, "; ".join(parts)

    def batch_equivalence():
        diffs = {}
        for i in non_empty:
            seq = data.sequences[i]
            alone = call(seq[None].to(device), torch.ones(1, len(seq), dtype=torch.bool, device=device))
            diffs[i] = _max_abs_diff(real(reference, i, len(seq), length), alone[0])
        return verdict(diffs, "differ from the sequence run alone",
                       f"all {len(non_empty)} rows equal their sequence run alone")

    def extra_padding():
        out = call(*data.batch(2 * length))
        return verdict(compare(out, 2 * length), f"change when padded to {2 * length}",
                       f"padding to {2 * length} changed no real output")

    def pad_content():
        if all(n == length for n in lengths):
            return True, 0.0, "no row has pads: nothing to check"
        out = call(*data.batch(pad_ids=False))
        return verdict(compare(out, length), "change with other ids in the pads",
                       "other ids in the pads changed no real output")

    def empty_row():
        out = call(*data.batch(extra_empty=True))
        empty = out[len(lengths)]
        ok, worst, detail = verdict(compare(out, length), "change beside an empty row",
                                    "the other rows are unchanged")
        bad = _nonfinite(empty)
        if bad:
            return False, math.nan, (f"the empty row gives {bad} NaN or infinite of {empty.numel()} outputs; "
                                     + detail)
        return ok, worst, "the empty row is finite; " + detail

    def low_precision():
        scale = max((float(real(reference, i, lengths[i], length).abs().max()) for i in non_empty), default=0.0)
        scale = max(scale, 1e-12)
        # The batch with an empty row, if fp32 gives that row finite outputs; otherwise the plain batch (a NaN or
        # an error that fp32 has too is empty_row's failure, not this check's).
        ids_e, mask_e = data.batch(extra_empty=True)
        try:
            with_empty = _nonfinite(call(ids_e, mask_e)[len(lengths)]) == 0
        except _ForwardRaised:
            with_empty = False
        if not with_empty:
            ids_e, mask_e = ids, mask
        ok, worst, notes = True, 0.0, []
        for name, dtype in _LOW_PRECISION:
            try:
                with torch.autocast(device_type=device.type, dtype=dtype):
                    out = call(ids_e, mask_e)
            except _ForwardRaised as raised:
                ok, worst = False, math.nan
                notes.append(f"{name}: {raised.describe()}")
                continue
            bad = sum(_nonfinite(real(out, i, lengths[i], length)) for i in non_empty)
            bad += _nonfinite(out[len(lengths)]) if with_empty else 0
            diffs = compare(out, length)
            diff = max(diffs.values(), default=0.0)
            if bad or math.isnan(diff):
                ok, worst = False, math.nan
                notes.append(f"{name}: {bad} NaN or infinite outputs")
                continue
            worst = worst if math.isnan(worst) else max(worst, diff)
            relative = diff / scale
            if relative > low_precision_rtol:
                ok = False
            notes.append(f"{name}: largest difference {relative:.1e} of the largest output")
        if not with_empty:
            notes.append("without the empty row (fp32 fails on it too)")
        return ok, worst, "; ".join(notes)

    def mask_polarity():
        rows = [i for i, n in enumerate(lengths) if 0 < n < length]
        if not rows:
            return True, math.nan, "no row has both tokens and pads: nothing to check"
        flipped = mask.clone()
        flipped[rows] = ~flipped[rows]
        out = call(ids, flipped)
        changes = compare(out, length, rows)
        still = [i for i, v in changes.items() if not math.isnan(v) and v <= atol]
        least = min((v for v in changes.values() if not math.isnan(v)), default=math.nan)
        if still:
            return False, least, f"{_rows(still)} unchanged with the mask inverted: the mask is not read"
        return True, least, f"inverting the mask changed every row with pads (least change {least:.1e})"

    functions = {"batch_equivalence": batch_equivalence, "extra_padding": extra_padding,
                 "pad_content": pad_content, "empty_row": empty_row, "low_precision": low_precision,
                 "mask_polarity": mask_polarity}
    rows = []
    for name in (*CHECKS, *optional):
        try:
            passed, worst, detail = functions[name]()
        except _ForwardRaised as raised:
            passed, worst, detail = False, math.nan, raised.describe()
        except _WrongLength as wrong:
            passed, worst, detail = False, math.nan, str(wrong)
        rows.append({"check": name, "passed": bool(passed), "max_abs_diff": float(worst), "detail": detail})
    settings = {"lengths": lengths, "length": length, "vocab_size": vocab_size, "padding_side": padding_side,
                "pad_id": pad_id, "output": output, "seed": seed, "atol": atol, "optional": list(optional),
                "low_precision_rtol": low_precision_rtol}
    return AuditReport(pd.DataFrame(rows, columns=COLUMNS), settings)
