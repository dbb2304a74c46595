"""A padding audit for any model: does every sequence get, in a padded batch, the output it gets alone?

Chapter 10, "Padding bugs in the wild" (``chapters/10_padding_bugs``), explains the checks and runs them on the
implementations people use; :mod:`attnbook.audit.subjects` holds those adapters, and ``python -m attnbook.audit``
runs them (and your own, with ``--subject``) with an exit code for CI.

The audit needs no data and no training: it draws random token ids, pads them, and compares outputs. It needs only
torch, numpy and pandas (``pip install attnbook``, no extras). It sees the model only through one function,
``forward(input_ids, attention_mask)``:

- ``input_ids``: int64 ``(B, L)``; pads hold ``pad_id`` (or, in one check, other ids). ``pad_id`` must be the
  model's own pad id (RoBERTa's is 1), and ``vocab_size`` at most its embedding's rows;
- ``attention_mask``: bool ``(B, L)``, True = a real token (the convention of the whole book, and of
  ``F.scaled_dot_product_attention``; ``nn.MultiheadAttention``'s ``key_padding_mask`` is its negation);
- it returns a float tensor: ``(B, ...)`` for ``output="sequence"`` (one output per sequence, e.g. logits), or
  ``(B, L, ...)`` for ``output="token"`` (one output per position; only real positions are compared).

How the model gets its positions and which attention path it takes is the forward's business: that is what the
audit tests. The audit runs every check in each grad mode of ``modes`` (autograd on, ``torch.no_grad()``,
``torch.inference_mode()``), because torch's fused fast paths run only without autograd and can answer
differently. Put the model in eval mode first: the audit runs the reference batch twice and stops with "the forward
is not deterministic" when dropout makes the two differ. Example::

    from attnbook.audit import assert_padding_safe

    def forward(input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask.long()).last_hidden_state

    model.eval()
    assert_padding_safe(forward, vocab_size=model.config.vocab_size, pad_id=model.config.pad_token_id,
                        output="token")

The checks (:data:`CHECKS`, always run; ``causal_left_padding`` with ``causal=True``; :data:`OPTIONAL_CHECKS`, on
request):

``batch_equivalence``
    Each row of the padded batch equals that sequence run alone, without padding (a batch of one, all True).
``extra_padding``
    Padding the batch to twice its length changes no real output.
``pad_content``
    Other token ids in the padded positions change no real output (a model must not read its pads).
``empty_row``
    A row with no real token gives finite outputs, and leaves the other rows' outputs unchanged.
``causal_left_padding`` (with ``causal=True``)
    For a causal model (one that combines its causal mask with the padding mask): the rows padded on the left give
    finite real outputs equal to the sequences run alone. A left pad's query sees no key under the causal mask; a
    path that gives NaN for it can spread the NaN to every real token in the next layer (``nn.TransformerEncoder``
    on its fast path does, torch 2.13).
``low_precision`` (optional)
    Under ``torch.autocast`` in fp16 and in bf16, the padded batch with an empty row gives finite outputs, and the
    real outputs stay within ``low_precision_rtol`` of fp32's (relative to their largest magnitude). The empty row
    is left out when fp32 fails on it too (``empty_row`` reports that), so that this check reports what lower
    precision adds.
``mask_read`` (optional; ``mask_polarity`` is its old name)
    Inverting the mask of every row that has pads changes that row's output: the forward reads the mask. (A model
    that ignores its mask passes the first four checks only if it has no padding to ignore.) Whatever the optional
    checks, when a padding check fails and the batch with the inverted mask equals the rows run alone, the failing
    checks' detail says that the mask's polarity looks inverted.

**Differences and tolerances.** Outputs are compared in float64. ``max_abs_diff`` has one meaning in every check:
the largest ``|output - reference|`` over the real outputs compared, where the reference is the output the check
compares with (the padded batch's, or for ``batch_equivalence`` and ``causal_left_padding``, each row's own output
in the padded batch and alone; for ``low_precision``, fp32's). ``max_rel_diff`` is ``max_abs_diff`` divided by the
scale, the largest ``|reference|`` over the real outputs of the padded batch. An element passes when
``|diff| <= atol + rtol * |reference|``; NaN or infinity in an output compared never passes. With ``atol=None`` and
``rtol=None`` both follow the output's dtype: ``rtol = max(1e-5, 8 * eps)`` (1e-5 for fp32, 7.8e-3 for fp16, 6.3e-2
for bf16) and ``atol = rtol * scale``. Pass only ``atol`` (or only ``rtol``) and the other is 0: ``atol=1e-5``
alone is the audit's old absolute criterion.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .checks import (ALIASES, CAUSAL_CHECK, CHECK_FUNCTIONS, CHECKS, MODES, OPTIONAL_CHECKS, OUTPUTS, PADDING_SIDES,
                     Batches, ForwardRaised, Result, Run, WrongLength, default_tolerance, polarity_hint)
from .checks import _POLARITY_CHECKS

__all__ = ["audit", "assert_padding_safe", "AuditReport", "CHECKS", "CAUSAL_CHECK", "OPTIONAL_CHECKS", "ALIASES",
           "MODES", "PADDING_SIDES", "OUTPUTS", "COLUMNS", "NOT_DETERMINISTIC", "default_tolerance"]

#: The columns of :attr:`AuditReport.checks`.
COLUMNS = ["check", "mode", "passed", "max_abs_diff", "max_rel_diff", "detail", "nan_in"]
#: The row that replaces a mode's checks when two calls on the same batch differ.
DETERMINISM = "deterministic"
#: Its detail starts with this sentence.
NOT_DETERMINISTIC = "the forward is not deterministic: dropout? call model.eval()"


@dataclass
class AuditReport:
    """The result of :func:`audit`.

    Attributes:
        checks: one row per check and grad mode, columns :data:`COLUMNS`: ``check`` (str), ``mode`` (str, one of
            :data:`MODES`), ``passed`` (bool), ``max_abs_diff`` (float: the largest ``|output - reference|`` over
            the real outputs compared; NaN when an output compared was not finite or the forward raised),
            ``max_rel_diff`` (float: ``max_abs_diff`` over the reference's scale), ``detail`` (str, one sentence
            on what was seen) and ``nan_in`` (str: where outputs were NaN or infinite, ``""``, ``"empty row"`` or
            ``"real tokens"``; see :attr:`attnbook.audit.checks.Result.nan_in`). When the forward is not
            deterministic in a mode, that mode has one row, check
            ``"deterministic"``, instead of its checks.
        settings: the audit's arguments and the resolved tolerances (lengths, padded length, padding side, output,
            seed, atol, rtol, scale, dtype, modes, ...).
        passed: True when every row passed.
    """

    checks: pd.DataFrame
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(len(self.checks)) and bool(self.checks["passed"].all())

    @property
    def failed(self) -> list[str]:
        """The names of the checks that failed in at least one mode, in order, each once."""
        names = self.checks.loc[~self.checks["passed"].astype(bool), "check"]
        return list(dict.fromkeys(str(c) for c in names))

    @property
    def failed_modes(self) -> dict[str, list[str]]:
        """``{check: [modes it failed in]}`` for the failed checks."""
        failed = self.checks[~self.checks["passed"].astype(bool)]
        return {check: [str(m) for m in failed.loc[failed["check"] == check, "mode"]] for check in self.failed}

    def __bool__(self) -> bool:
        return self.passed

    def headline(self) -> str:
        """One line: passed, or which checks failed (and in which modes, when not in all of them)."""
        if self.passed:
            return "Padding audit passed"
        modes = list(dict.fromkeys(str(m) for m in self.checks["mode"]))
        names = list(dict.fromkeys(str(c) for c in self.checks["check"]))
        parts = []
        for check, where in self.failed_modes.items():
            ran = [str(m) for m in self.checks.loc[self.checks["check"] == check, "mode"]]
            parts.append(check if len(where) == len(ran) == len(modes) else f"{check} ({', '.join(where)})")
        return f"Padding audit FAILED ({len(self.failed)} of {len(names)} checks: {', '.join(parts)})"

    def __str__(self) -> str:
        s = self.settings
        lines = [self.headline()]
        if s:
            lines.append(f"  lengths {list(s.get('lengths', []))} padded to {s.get('length')}, "
                         f"{s.get('padding_side')} padding, output {s.get('output')!r}, seed {s.get('seed')}, "
                         f"{s.get('dtype', '')} outputs of scale {s.get('scale', math.nan):.3g}, "
                         f"atol {s.get('atol', math.nan):.2g}, rtol {s.get('rtol', math.nan):.2g}")
        check_width = max([len(str(c)) for c in self.checks["check"]] + [5])
        mode_width = max([len(str(m)) for m in self.checks["mode"]] + [4])
        for row in self.checks.itertuples(index=False):
            mark = "pass" if row.passed else "FAIL"
            diff = "     -    " if not math.isfinite(row.max_abs_diff) else f"{row.max_abs_diff:10.2e}"
            rel = "    -   " if not math.isfinite(row.max_rel_diff) else f"{row.max_rel_diff:8.1e}"
            lines.append(f"  {row.check:<{check_width}}  {row.mode:<{mode_width}}  {mark}  max|diff| {diff} "
                         f"(relative {rel})  {row.detail}")
        return "\n".join(lines)

    def __repr__(self) -> str:  # a report in a notebook cell or a pytest message reads like str()
        return str(self)


# --- argument checks ----------------------------------------------------------------------------------------------

def _integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_lengths(lengths: object, length: object) -> tuple[list[int], int]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, (Iterable, np.ndarray, Tensor)):
        raise TypeError(f"lengths must be a sequence of ints, got {type(lengths).__name__}")
    values = list(lengths.tolist() if isinstance(lengths, (Tensor, np.ndarray)) else lengths)
    if not values:
        raise ValueError("lengths must hold at least one length, got an empty sequence")
    for value in values:
        if not _integer(value):
            raise TypeError(f"lengths must be ints, got {value!r} ({type(value).__name__}) in {values}")
    values = [int(v) for v in values]
    if length is None:
        padded = max(values)
    elif not _integer(length):
        raise TypeError(f"length must be an int or None, got {length!r}")
    else:
        padded = int(length)
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


def _check_tolerance(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{name} must be a finite number >= 0 or None, got {value!r}")
    return float(value)


def _check_optional(optional: object) -> list[str]:
    names = [optional] if isinstance(optional, str) else list(optional)
    unknown = [name for name in names if name not in OPTIONAL_CHECKS and name not in ALIASES]
    if unknown:
        raise ValueError(f"unknown optional check(s) {unknown}; the optional checks are {list(OPTIONAL_CHECKS)} "
                         f"(old names: {ALIASES})")
    names = [ALIASES.get(name, name) for name in names]
    return [name for name in OPTIONAL_CHECKS if name in names]


def _check_modes(modes: object) -> list[str]:
    names = [modes] if isinstance(modes, str) else list(modes)
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        raise ValueError(f"modes must be a non-empty selection of {list(MODES)}, got {modes!r}")
    return [m for m in MODES if m in names]


def _check_args(forward, vocab_size, pad_id, padding_side, output, seed, low_precision_rtol) -> tuple[int, int, int]:
    if not callable(forward):
        raise TypeError(f"forward must be callable as forward(input_ids, attention_mask), got "
                        f"{type(forward).__name__}")
    if not _integer(vocab_size) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 (a pad id and at least one other), got {vocab_size!r}")
    if not _integer(pad_id) or not 0 <= pad_id < vocab_size:
        raise ValueError(f"pad_id must be an int in [0, vocab_size) = [0, {vocab_size}), got {pad_id!r}")
    _check_choice(padding_side, "padding_side", PADDING_SIDES)
    _check_choice(output, "output", OUTPUTS)
    if not _integer(seed) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if _check_tolerance("low_precision_rtol", low_precision_rtol) is None:
        raise ValueError(f"low_precision_rtol must be a finite number >= 0, got {low_precision_rtol!r}")
    return int(vocab_size), int(pad_id), int(seed)


# --- the entry point ----------------------------------------------------------------------------------------------

def _embedding_rows(run: Run, vocab_size: int) -> int | None:
    """The number of token ids the forward accepts (by bisection on one-token inputs), when that is below
    ``vocab_size``; None when every id below ``vocab_size`` runs, or the probe cannot tell."""
    def runs(token: int) -> bool | None:
        ids = torch.tensor([[token]], device=run.device)
        try:
            run.call(ids, torch.ones_like(ids, dtype=torch.bool))
        except ForwardRaised as raised:
            return False if isinstance(raised.error, IndexError) else None
        except (TypeError, ValueError, WrongLength):
            return None
        return True

    if runs(vocab_size - 1) is not False or runs(0) is not True:
        return None
    low, high = 0, vocab_size - 1  # runs(low) and not runs(high)
    while high - low > 1:
        middle = (low + high) // 2
        ok = runs(middle)
        if ok is None:
            return None
        low, high = (middle, high) if ok else (low, middle)
    return low + 1


def _reference(run: Run, vocab_size: int) -> tuple[Tensor, Tensor]:
    """The padded batch's output, twice. Errors here are the caller's to fix, so they raise."""
    ids, mask = run.data.batch()
    where = f"lengths {run.lengths}, L = {run.length}, mode {run.mode!r}"
    try:
        first = run.call(ids, mask)
        run.dtype = run.last_dtype
        second = run.call(ids, mask)
    except ForwardRaised as raised:
        if isinstance(raised.error, IndexError):
            rows = _embedding_rows(run, vocab_size)
            if rows is not None:
                raise ValueError(f"lower vocab_size (the model's embedding has {rows} rows): the forward raised "
                                 f"IndexError on token ids below vocab_size = {vocab_size}") from raised.error
        hint = "" if run.mode == "grad" else f"; leave the mode out with modes=... if the model cannot run in it"
        raise RuntimeError(f"the forward failed on the padded batch ({where}): {raised.describe()}{hint}"
                           ) from raised.error
    except WrongLength as wrong:
        raise ValueError(str(wrong)) from None
    return first, second


def _scale(run: Run, reference: Tensor) -> float:
    values = [run.real(reference, i, run.length) for i in run.non_empty]
    finite = [v[torch.isfinite(v)].abs() for v in values]
    return max((float(v.max()) for v in finite if v.numel()), default=0.0)


def _relative(value: float, scale: float) -> float:
    if math.isnan(value):
        return math.nan
    return value / scale if scale > 0 else (0.0 if value == 0 else math.inf)


def _run_check(name: str, run: Run) -> Result:
    try:
        return CHECK_FUNCTIONS[name](run)
    except ForwardRaised as raised:
        return Result(False, math.nan, raised.describe())
    except WrongLength as wrong:
        return Result(False, math.nan, str(wrong))


def _determinism(run: Run, second: Tensor) -> Result | None:
    """None when two calls on the padded batch agree within tolerance (NaN where both are NaN counts as equal)."""
    worst = 0.0
    for i in run.non_empty:
        a, b = run.real(run.reference, i, run.length), run.real(second, i, run.length)
        finite = torch.isfinite(a)
        gap = (a - b).abs()[finite]
        worst = max(worst, float(gap.max()) if gap.numel() else 0.0)
        same_nonfinite = torch.equal(finite, torch.isfinite(b)) and torch.equal(a[~finite].nan_to_num(),
                                                                                b[~finite].nan_to_num())
        if not (same_nonfinite and bool((gap <= run.atol + run.rtol * a[finite].abs()).all())):
            return Result(False, worst, f"{NOT_DETERMINISTIC} (two calls on the same padded batch differ by "
                                        f"{worst:.1e}; the checks were not run)")
    return None


def audit(forward: Callable[[Tensor, Tensor], Tensor], lengths: Sequence[int] = (7, 3, 12, 1),
          vocab_size: int = 100, *, padding_side: str = "right", pad_id: int = 0, output: str = "sequence",
          seed: int = 0, atol: float | None = None, rtol: float | None = None, length: int | None = None,
          optional: Iterable[str] = (), low_precision_rtol: float = 0.05, device: str | torch.device = "cpu",
          modes: Iterable[str] = tuple(MODES), causal: bool = False) -> AuditReport:
    """Audit the padding behaviour of ``forward`` on random token ids (no data, no training).

    Args:
        forward: ``forward(input_ids, attention_mask) -> Tensor``; ``input_ids`` int64 ``(B, L)``,
            ``attention_mask`` bool ``(B, L)`` with True = a real token. It returns a float tensor ``(B, ...)``
            (``output="sequence"``) or ``(B, L, ...)`` (``output="token"``). It gets fresh copies of its inputs.
            Put the model in eval mode: dropout makes two calls differ, and the audit then reports only that.
        lengths: the real lengths of the rows of the audited batch, each in ``[0, L]`` (ints, numpy ints, or a 1-D
            array or tensor of them).
        vocab_size: token ids are drawn from ``[0, vocab_size)``, never ``pad_id`` in a real position; at most the
            model's embedding rows.
        padding_side: ``"right"`` (tokens, then pads) or ``"left"`` (pads, then tokens).
        pad_id: the id that fills the pads (except in the ``pad_content`` check): the model's own pad id.
        output: ``"sequence"`` or ``"token"`` (see the module's docstring).
        seed: seeds the token ids (the forward's own randomness, e.g. dropout, is its own).
        atol, rtol: an element passes when ``|diff| <= atol + rtol * |reference|``. Both None (the default): they
            follow the output's dtype, ``rtol = max(1e-5, 8 * eps)`` and ``atol = rtol * scale`` (scale: the
            largest real output of the padded batch). One of them None: it is 0.
        length: the padded length ``L``; default ``max(lengths)``.
        optional: names from :data:`OPTIONAL_CHECKS` (or :data:`ALIASES`) to run as well.
        low_precision_rtol: the ``low_precision`` check's tolerance, relative to the largest fp32 real output.
        device: where the inputs are made (and which autocast the ``low_precision`` check uses).
        modes: the grad modes to run every check in, from :data:`MODES`: ``"grad"`` (autograd on), ``"no_grad"``
            (``torch.no_grad()``), ``"inference_mode"`` (``torch.inference_mode()``). A forward that sets its own
            mode inside overrides this.
        causal: the model is causal (it combines its own causal mask with the padding mask); adds the
            ``causal_left_padding`` check.

    Returns:
        An :class:`AuditReport`: ``report.passed`` (bool), ``report.checks`` (a DataFrame, one row per check and
        mode), and ``str(report)`` for a person.

    Raises:
        TypeError: ``forward`` is not callable; ``lengths`` not a sequence of ints; the forward returns something
            other than a floating-point ``torch.Tensor``.
        ValueError: a length outside ``[0, L]``, or none positive; an unknown ``padding_side``, ``output``, mode or
            optional check; ``vocab_size``, ``pad_id``, ``seed`` or a tolerance out of range; ``vocab_size`` above
            the model's embedding ("lower vocab_size (the model's embedding has N rows)"); the forward returns the
            wrong batch size, or (on the plain padded batch) a token output whose length is not ``L``.
        RuntimeError: the forward raises on the plain padded batch (chained to its error): a forward that cannot
            run cannot be audited. Inside the checks, an error of the forward makes that check fail instead.

    Chapter 10, section "Padding bugs in the wild", explains each check and shows the failures it finds.
    """
    lengths, length = _check_lengths(lengths, length)
    vocab_size, pad_id, seed = _check_args(forward, vocab_size, pad_id, padding_side, output, seed,
                                           low_precision_rtol)
    atol, rtol = _check_tolerance("atol", atol), _check_tolerance("rtol", rtol)
    names = [*CHECKS, *([CAUSAL_CHECK] if causal else []), *_check_optional(optional)]
    modes = _check_modes(modes)
    device = torch.device(device)
    settings: dict[str, Any] = {}
    rows = []
    for mode in modes:
        data = Batches(lengths, length, vocab_size, pad_id, padding_side, seed, device)
        run = Run(forward, data, mode, output == "token", device, low_precision_rtol=float(low_precision_rtol))
        run.reference, second = _reference(run, vocab_size)
        if not settings:  # the tolerance follows the first mode's output
            scale = _scale(run, run.reference)
            if atol is None and rtol is None:
                rtol = default_tolerance(run.dtype)
                atol = rtol * scale
            atol, rtol = atol or 0.0, rtol or 0.0
            settings = {"lengths": lengths, "length": length, "vocab_size": vocab_size,
                        "padding_side": padding_side, "pad_id": pad_id, "output": output, "seed": seed,
                        "atol": atol, "rtol": rtol, "scale": scale, "dtype": str(run.dtype).replace("torch.", ""),
                        "modes": list(modes), "causal": bool(causal), "optional": names[len(CHECKS) + causal:],
                        "low_precision_rtol": float(low_precision_rtol)}
        run.atol, run.rtol, run.scale = atol, rtol, settings["scale"]
        unstable = _determinism(run, second)
        if unstable is not None:
            rows.append((DETERMINISM, mode, unstable))
            continue
        results = {name: _run_check(name, run) for name in names}
        if any(not results[n].passed for n in _POLARITY_CHECKS if n in results):
            hint = polarity_hint(run)
            for n in _POLARITY_CHECKS:
                if hint and n in results and not results[n].passed:
                    results[n].detail += "; " + hint
        rows += [(name, mode, result) for name, result in results.items()]
    order = {name: k for k, name in enumerate([DETERMINISM, *names])}
    rows.sort(key=lambda row: (order[row[0]], modes.index(row[1])))
    table = pd.DataFrame(
        [{"check": name, "mode": mode, "passed": bool(r.passed), "max_abs_diff": float(r.max_abs_diff),
          "max_rel_diff": float(r.max_rel_diff if r.max_rel_diff is not None
                                else _relative(r.max_abs_diff, settings["scale"])),
          "detail": r.detail, "nan_in": r.nan_in} for name, mode, r in rows], columns=COLUMNS)
    return AuditReport(table, settings)


def assert_padding_safe(forward: Callable[[Tensor, Tensor], Tensor] | AuditReport, *args: Any,
                        **kwargs: Any) -> AuditReport:
    """Audit ``forward`` (arguments as :func:`audit`) and fail with the readable report unless every check passes.

    Meant for a pytest test: ``assert_padding_safe(forward, vocab_size=..., output="token")``. An
    :class:`AuditReport` may be passed instead of a forward (then no other argument).

    Returns:
        The report, when it passed.

    Raises:
        AssertionError: a check failed; the message is ``str(report)`` (which checks, in which modes, by how much).
        The errors of :func:`audit` for bad arguments.
    """
    __tracebackhide__ = True  # pytest shows the report, not this frame
    if isinstance(forward, AuditReport):
        if args or kwargs:
            raise TypeError("assert_padding_safe(report) takes no other argument")
        report = forward
    else:
        report = audit(forward, *args, **kwargs)
    if not report.passed:
        raise AssertionError(str(report))
    return report
