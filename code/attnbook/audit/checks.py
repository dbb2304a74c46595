"""The checks of the padding audit, one small function each, and what they share (chapter 10, "Padding bugs in the
wild").

:func:`attnbook.audit.audit` validates its arguments, then, for each grad mode, builds a :class:`Run` (the forward
under that mode, the audit's batches, the reference outputs and the tolerance) and calls the functions of
:data:`CHECK_FUNCTIONS` on it. Each returns a :class:`Result`. The differences they report have one meaning in every
check: the largest ``|output - reference|`` over the real outputs compared (``max_abs_diff``), and that divided by
the reference's scale, the largest ``|reference|`` over the real outputs of the padded batch (``max_rel_diff``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = ["CHECKS", "OPTIONAL_CHECKS", "ALIASES", "MODES", "PADDING_SIDES", "OUTPUTS", "CHECK_FUNCTIONS",
           "Result", "NAN_PLACES", "Run", "Batches", "ForwardRaised", "WrongLength", "default_tolerance", "polarity_hint"]

#: The checks every audit runs, in order.
CHECKS = ("batch_equivalence", "extra_padding", "pad_content", "empty_row")
#: The check that ``causal=True`` adds, after :data:`CHECKS`.
CAUSAL_CHECK = "causal_left_padding"
#: The checks run only when asked for (``optional=...``).
OPTIONAL_CHECKS = ("low_precision", "mask_read")
#: Old names of checks, still accepted in ``optional``: ``{old: new}``.
ALIASES = {"mask_polarity": "mask_read"}
#: The grad modes the audit can run the forward in, and the context manager of each.
MODES: dict[str, Callable[[], AbstractContextManager]] = {
    "grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
PADDING_SIDES = ("right", "left")
OUTPUTS = ("sequence", "token")
_LOW_PRECISION = (("fp16", torch.float16), ("bf16", torch.bfloat16))
#: The checks whose failure makes the audit try the inverted mask (:func:`polarity_hint`).
_POLARITY_CHECKS = ("batch_equivalence", "extra_padding", "pad_content", CAUSAL_CHECK)


def default_tolerance(dtype: torch.dtype) -> float:
    """The default relative tolerance for outputs of ``dtype``: ``max(1e-5, 8 * eps)``.

    That is 1e-5 for fp32 and fp64, 7.8e-3 for fp16 and 6.3e-2 for bf16. Half-precision kernels accumulate in fp32
    and round once per operation, so a padded row and the row alone differ by a few units in the last place of the
    output (one or two, for a small fp16 Transformer); fp32 kernels round at every step of their sums, and 1e-5 leaves
    a BERT-base-sized model a margin (chapter 10, section "The smallest audit").
    """
    if not dtype.is_floating_point:
        return 1e-5
    return max(1e-5, 8 * torch.finfo(dtype).eps)


@dataclass
class Result:
    """What one check found.

    Attributes:
        passed: the check's verdict.
        max_abs_diff: the largest ``|output - reference|`` over the real outputs compared, in the output's units
            (NaN when an output compared was not finite, or the forward raised; 0.0 when nothing was compared).
        detail: one sentence on what was seen.
        max_rel_diff: ``max_abs_diff`` divided by the reference's scale (filled in by the audit when left None).
        nan_in: where outputs were NaN or infinite: ``""`` nowhere (or the forward raised), ``"empty row"`` only in
            the row without a real token, ``"real tokens"`` in a real token's output. Chapter 10's rule reads it: a
            NaN that stays in the row without tokens is a contract choice, one that reaches a real token is not.
    """

    passed: bool
    max_abs_diff: float
    detail: str
    max_rel_diff: float | None = None
    nan_in: str = ""


#: The values of :attr:`Result.nan_in`, from nowhere to the worst.
NAN_PLACES = ("", "empty row", "real tokens")


def _worse(a: str, b: str) -> str:
    """The worse of two :attr:`Result.nan_in` values."""
    return max(a, b, key=NAN_PLACES.index)


class ForwardRaised(Exception):
    """The forward raised (inside a check, where that makes the check fail)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error

    def describe(self) -> str:
        message = " ".join(str(self.error).split())
        if len(message) > 160:
            message = message[:157] + "..."
        return f"forward raised {type(self.error).__name__}: {message}"


class WrongLength(Exception):
    """A token-level output whose second dimension is not the input's length (inside a check)."""


class Batches:
    """The audit's random sequences, and the padded batches made from them."""

    def __init__(self, lengths: list[int], length: int, vocab_size: int, pad_id: int, padding_side: str, seed: int,
                 device: torch.device) -> None:
        self.lengths, self.length, self.pad_id, self.side = lengths, length, pad_id, padding_side
        self.vocab_size, self.device = vocab_size, device
        self.generator = torch.Generator().manual_seed(seed)
        self.sequences = [self.draw((n,)) for n in lengths]

    def draw(self, shape: tuple[int, ...]) -> Tensor:
        """Random token ids other than ``pad_id``."""
        ids = torch.randint(0, self.vocab_size - 1, shape, generator=self.generator)
        return ids + (ids >= self.pad_id).long()

    def span(self, n: int, length: int, side: str | None = None) -> slice:
        """Where a sequence of ``n`` tokens sits in a row of ``length``."""
        return slice(0, n) if (side or self.side) == "right" else slice(length - n, length)

    def batch(self, length: int | None = None, *, extra_empty: bool = False, pad_ids: bool = True,
              side: str | None = None) -> tuple[Tensor, Tensor]:
        """``(input_ids, attention_mask)`` of all sequences padded to ``length`` (default: the audit's L) on
        ``side`` (default: the audit's padding side); with ``extra_empty``, one more row with no real token at the
        end; with ``pad_ids=False``, the pads hold random ids other than ``pad_id``."""
        length = self.length if length is None else length
        sequences = self.sequences + ([self.sequences[0][:0]] if extra_empty else [])
        rows = len(sequences)
        ids = torch.full((rows, length), self.pad_id, dtype=torch.long)
        if not pad_ids:
            ids = self.draw((rows, length))
        mask = torch.zeros(rows, length, dtype=torch.bool)
        for i, seq in enumerate(sequences):
            where = self.span(len(seq), length, side)
            ids[i, where] = seq
            mask[i, where] = True
        return ids.to(self.device), mask.to(self.device)


def _nonfinite(t: Tensor) -> int:
    return int((~torch.isfinite(t)).sum())


def _rows(indices: Sequence[int]) -> str:
    return ("row " if len(indices) == 1 else "rows ") + ", ".join(str(i) for i in indices)


@dataclass
class Diff:
    """How one row's real outputs differ from the reference: the largest ``|difference|`` (NaN when either side is
    not finite) and whether every element lies within ``atol + rtol * |reference|``."""

    value: float
    within: bool


@dataclass
class Run:
    """One grad mode of an audit: the forward under that mode, the batches, the reference and the tolerance.

    ``reference`` is the forward's output on the plain padded batch (float64); ``atol`` and ``rtol`` are the
    resolved tolerances and ``scale`` the largest ``|reference|`` over real outputs. A check calls :meth:`call` for
    the forward's output on other inputs and :meth:`compare` for its differences from the reference.
    """

    forward: Callable[[Tensor, Tensor], Tensor]
    data: Batches
    mode: str
    token: bool
    device: torch.device
    reference: Tensor | None = None
    atol: float = 0.0
    rtol: float = 0.0
    scale: float = 0.0
    low_precision_rtol: float = 0.05
    dtype: torch.dtype = torch.float32
    last_dtype: torch.dtype = torch.float32
    _alone: dict[int, Tensor] = field(default_factory=dict)

    @property
    def lengths(self) -> list[int]:
        return self.data.lengths

    @property
    def length(self) -> int:
        return self.data.length

    @property
    def non_empty(self) -> list[int]:
        return [i for i, n in enumerate(self.lengths) if n > 0]

    def call(self, ids: Tensor, mask: Tensor) -> Tensor:
        """The forward's output on ``(ids, mask)`` under this run's mode, detached, in float64. Raises
        :class:`ForwardRaised` if the forward raises, :class:`WrongLength` for a token output of the wrong length,
        ``TypeError``/``ValueError`` for an output that is not a float tensor of batch size ``B``."""
        with MODES[self.mode]():
            try:
                out = self.forward(ids.clone(), mask.clone())
            except Exception as error:  # noqa: BLE001 - the check reports it
                raise ForwardRaised(error) from error
            if not isinstance(out, Tensor):
                raise TypeError(f"forward must return a torch.Tensor, got {type(out).__name__}; return the output "
                                f"tensor (e.g. .last_hidden_state or .logits), not a model output object")
            if not (out.is_floating_point() or out.is_complex()):
                raise TypeError(f"forward must return a floating-point tensor, got dtype {out.dtype}")
            if out.dim() == 0 or out.shape[0] != ids.shape[0]:
                raise ValueError(f"forward returned shape {tuple(out.shape)} for a batch of {ids.shape[0]} rows: "
                                 f"the first dimension must be the batch size")
            if self.token and (out.dim() < 2 or out.shape[1] != ids.shape[1]):
                raise WrongLength(f"forward returned shape {tuple(out.shape)} for input of length {ids.shape[1]}; "
                                  f"output='token' needs (B, L, ...)")
            self.last_dtype = out.dtype
            return out.detach().to(torch.float64)

    def real(self, out: Tensor, i: int, total: int, side: str | None = None) -> Tensor:
        """Row ``i``'s outputs that belong to its real tokens (all of the row for sequence outputs), in a batch
        padded to ``total`` on ``side``."""
        return out[i, self.data.span(self.lengths[i], total, side)] if self.token else out[i]

    def alone(self, i: int) -> Tensor:
        """Sequence ``i`` run alone: a batch of one row, all True (computed once per run)."""
        if i not in self._alone:
            seq = self.data.sequences[i]
            out = self.call(seq[None].to(self.device), torch.ones(1, len(seq), dtype=torch.bool, device=self.device))
            self._alone[i] = out[0]
        return self._alone[i]

    def diff(self, out: Tensor, ref: Tensor) -> Diff:
        """``out`` against ``ref`` (one row's real outputs)."""
        if out.shape != ref.shape:
            raise ValueError(f"outputs of one sequence differ in shape between calls: {tuple(out.shape)} and "
                             f"{tuple(ref.shape)}; with output='sequence' the forward must return (B, ...) "
                             f"whatever L is (use output='token' for (B, L, ...))")
        if out.numel() == 0:
            return Diff(0.0, True)
        if not (torch.isfinite(out).all() and torch.isfinite(ref).all()):
            return Diff(math.nan, False)
        gap = (out - ref).abs()
        return Diff(float(gap.max()), bool((gap <= self.atol + self.rtol * ref.abs()).all()))

    def compare(self, out: Tensor, total: int, rows: Sequence[int] | None = None,
                side: str | None = None) -> dict[int, Diff]:
        """Each row's real outputs in ``out`` (padded to ``total`` on ``side``) against the reference."""
        rows = self.non_empty if rows is None else rows
        return {i: self.diff(self.real(out, i, total, side), self.real(self.reference, i, self.length))
                for i in rows}

    def verdict(self, diffs: dict[int, Diff], what: str, same: str) -> Result:
        """Pass when every row is within tolerance; the detail names the rows that are not."""
        values = [d.value for d in diffs.values()]
        worst = math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)
        nan_rows = [i for i, d in diffs.items() if math.isnan(d.value)]
        off = [i for i, d in diffs.items() if not math.isnan(d.value) and not d.within]
        if not nan_rows and not off:
            return Result(True, worst, same)
        parts = []
        if off:
            parts.append(f"{_rows(off)} {what} (largest at row {max(off, key=lambda i: diffs[i].value)})")
        if nan_rows:
            parts.append(f"{_rows(nan_rows)}: NaN or infinite outputs")
        return Result(False, worst, "; ".join(parts), nan_in="real tokens" if nan_rows else "")


# --- the checks ---------------------------------------------------------------------------------------------------

def batch_equivalence(run: Run) -> Result:
    """Each row of the padded batch equals its sequence run alone (a batch of one, all True)."""
    diffs = {i: run.diff(run.alone(i), run.real(run.reference, i, run.length)) for i in run.non_empty}
    return run.verdict(diffs, "differ from the sequence run alone",
                       f"all {len(run.non_empty)} rows equal their sequence run alone")


def extra_padding(run: Run) -> Result:
    """Padding the batch to twice its length changes no real output."""
    total = 2 * run.length
    out = run.call(*run.data.batch(total))
    return run.verdict(run.compare(out, total), f"change when padded to {total}",
                       f"padding to {total} changed no real output")


def pad_content(run: Run) -> Result:
    """Other token ids in the pads change no real output."""
    if all(n == run.length for n in run.lengths):
        return Result(True, 0.0, "no row has pads: nothing to check")
    out = run.call(*run.data.batch(pad_ids=False))
    return run.verdict(run.compare(out, run.length), "change with other ids in the pads",
                       "other ids in the pads changed no real output")


def empty_row(run: Run) -> Result:
    """A row with no real token gives finite outputs and leaves the other rows unchanged."""
    out = run.call(*run.data.batch(extra_empty=True))
    empty = out[len(run.lengths)]
    result = run.verdict(run.compare(out, run.length), "change beside an empty row", "the other rows are unchanged")
    bad = _nonfinite(empty)
    if bad:
        return Result(False, result.max_abs_diff,
                      f"the empty row gives {bad} NaN or infinite of {empty.numel()} outputs; {result.detail}",
                      nan_in=_worse(result.nan_in, "empty row"))
    return Result(result.passed, result.max_abs_diff, "the empty row is finite; " + result.detail,
                  nan_in=result.nan_in)


def causal_left_padding(run: Run) -> Result:
    """Left-padded rows of a causal model give finite real outputs equal to their sequences run alone.

    Under a causal mask combined with the padding mask, a left pad's query sees no key at all (every key before it
    is a pad): an empty attention row inside a row that has tokens. A path that gives NaN there can spread the NaN
    to the real tokens in the next layer (the pad's output becomes a masked key whose value is NaN, and 0 * NaN is
    NaN)."""
    rows = [i for i, n in enumerate(run.lengths) if 0 < n < run.length]
    if not rows:
        return Result(True, 0.0, "no row has both tokens and pads: nothing to check")
    out = run.call(*run.data.batch(side="left"))
    diffs = {i: run.diff(run.alone(i), run.real(out, i, run.length, "left")) for i in rows}
    result = run.verdict(diffs, "differ from the sequence run alone when left-padded",
                         f"all {len(rows)} left-padded rows equal their sequence run alone")
    nan_rows = [i for i in rows if math.isnan(diffs[i].value)]
    if nan_rows and all(torch.isfinite(run.alone(i)).all() for i in nan_rows):
        result.detail += ("; the left pads' queries see no key under the causal mask, and a path that gives NaN "
                          "for such a query spreads it to the real tokens in the next layer")
    return result


def low_precision(run: Run) -> Result:
    """Under ``torch.autocast`` in fp16 and bf16, the padded batch (with an empty row, if fp32 gives that row finite
    outputs) gives finite outputs, within ``low_precision_rtol`` of fp32's scale."""
    scale = max(run.scale, 1e-12)
    ids, mask = run.data.batch(extra_empty=True)
    try:
        with_empty = _nonfinite(run.call(ids, mask)[len(run.lengths)]) == 0
    except ForwardRaised:
        with_empty = False
    if not with_empty:  # a NaN or an error that fp32 has too is empty_row's failure, not this check's
        ids, mask = run.data.batch()
    passed, worst, notes, nan_in = True, 0.0, [], ""
    for name, dtype in _LOW_PRECISION:
        try:
            with torch.autocast(device_type=run.device.type, dtype=dtype):
                out = run.call(ids, mask)
        except ForwardRaised as raised:
            passed, worst = False, math.nan
            notes.append(f"{name}: {raised.describe()}")
            continue
        bad_real = sum(_nonfinite(run.real(out, i, run.length)) for i in run.non_empty)
        bad_empty = _nonfinite(out[len(run.lengths)]) if with_empty else 0
        bad = bad_real + bad_empty
        diffs = run.compare(out, run.length)
        diff = max((d.value for d in diffs.values()), default=0.0)
        if bad_real or math.isnan(diff):
            nan_in = "real tokens"
        elif bad_empty:
            nan_in = _worse(nan_in, "empty row")
        if bad or math.isnan(diff):
            passed, worst = False, math.nan
            notes.append(f"{name}: {bad} NaN or infinite outputs")
            continue
        worst = worst if math.isnan(worst) else max(worst, diff)
        passed = passed and diff / scale <= run.low_precision_rtol
        notes.append(f"{name}: largest difference {diff / scale:.1e} of the largest output")
    if not with_empty:
        notes.append("without the empty row (fp32 fails on it too)")
    return Result(passed, worst, "; ".join(notes), nan_in=nan_in)


def mask_read(run: Run) -> Result:
    """Inverting the mask of every row that has pads changes that row's output: the forward reads the mask.

    Its ``max_abs_diff`` is, as in every check, the largest difference from the reference; here a large one is the
    good outcome."""
    rows = [i for i, n in enumerate(run.lengths) if 0 < n < run.length]
    if not rows:
        return Result(True, 0.0, "no row has both tokens and pads: nothing to check")
    ids, mask = run.data.batch()
    flipped = mask.clone()
    flipped[rows] = ~flipped[rows]
    changes = run.compare(run.call(ids, flipped), run.length, rows)
    worst = max((d.value for d in changes.values() if not math.isnan(d.value)), default=math.nan)
    still = [i for i, d in changes.items() if d.within]
    if still:
        return Result(False, worst, f"{_rows(still)} unchanged with the mask inverted: the mask is not read")
    least = min((d.value for d in changes.values() if not math.isnan(d.value)), default=math.nan)
    return Result(True, worst, f"inverting the mask changed every row with pads (least change {least:.1e})")


#: Every check's name and its function, in the order the report lists them.
CHECK_FUNCTIONS: dict[str, Callable[[Run], Result]] = {
    "batch_equivalence": batch_equivalence, "extra_padding": extra_padding, "pad_content": pad_content,
    "empty_row": empty_row, CAUSAL_CHECK: causal_left_padding, "low_precision": low_precision,
    "mask_read": mask_read}


def polarity_hint(run: Run) -> str:
    """A note for the failed padding checks when the mask's polarity looks inverted: with the mask inverted, every
    row of the padded batch equals its sequence run alone with the inverted mask of a batch of one (all False), and
    at least one row has pads. ``""`` otherwise."""
    if not any(0 < n < run.length for n in run.lengths):
        return ""
    ids, mask = run.data.batch()
    try:
        out = run.call(ids, ~mask)
        diffs = []
        for i in run.non_empty:
            seq = run.data.sequences[i]
            alone = run.call(seq[None].to(run.device), torch.zeros(1, len(seq), dtype=torch.bool,
                                                                   device=run.device))[0]
            diffs.append(run.diff(alone, run.real(out, i, run.length)))
    except (ForwardRaised, WrongLength, ValueError, TypeError):
        return ""
    if diffs and all(d.within for d in diffs):
        return ("the mask's polarity looks inverted: with the mask inverted, every row equals its sequence run "
                "alone (the audit's mask is True for a real token; torch's key_padding_mask is True for a pad)")
    return ""
