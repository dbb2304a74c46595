"""attnbook.audit's contract of issue 47: tolerances that follow the output dtype, grad modes, the determinism
check, the polarity diagnosis, causal models with left padding, clear errors, and assert_padding_safe. Facts about
torch are measured here directly, independently of the audit, and then the audit is checked to report them."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnbook.audit import (CHECKS, NOT_DETERMINISTIC, AuditReport, assert_padding_safe, audit,
                            default_tolerance)

V, D = 50, 16
ROOT = Path(__file__).resolve().parents[1]


class TinyBert(nn.Module):
    """Token and position embeddings, then two post-norm layers of masked self-attention (SDPA, bool mask) and a
    feed-forward block: a BERT-like encoder small enough for a CPU test."""

    def __init__(self, seed: int = 0, masked: bool = True):
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.pos = nn.Embedding(V, D), nn.Embedding(128, D)
        self.qkv = nn.ModuleList(nn.Linear(D, 3 * D) for _ in range(2))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(), nn.Linear(2 * D, D))
                                 for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(D) for _ in range(4))
        self.masked = masked

    def forward(self, ids, mask):
        x = self.embed(ids) + self.pos(torch.arange(ids.shape[1]))
        for k in range(2):
            q, key, v = (t.unflatten(-1, (2, -1)).transpose(1, 2) for t in self.qkv[k](x).chunk(3, -1))
            attn_mask = mask[:, None, None, :] if self.masked else None
            a = F.scaled_dot_product_attention(q, key, v, attn_mask=attn_mask).transpose(1, 2).flatten(2)
            x = self.norms[2 * k](x + a)
            x = self.norms[2 * k + 1](x + self.ffn[k](x))
        return x


def torch_encoder(layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    embed = nn.Embedding(V, D)
    layer = nn.TransformerEncoderLayer(D, 2, 2 * D, dropout=0.0, batch_first=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()
    return embed, encoder


def causal_forward(layers: int = 2):
    embed, encoder = torch_encoder(layers)

    def forward(ids, mask):
        causal = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return encoder(embed(ids), mask=causal, src_key_padding_mask=~mask)
    return forward


def rows(report: AuditReport, check: str) -> pd.DataFrame:
    return report.checks[report.checks["check"] == check].set_index("mode")


# --- tolerances ---------------------------------------------------------------------------------------------------

def test_default_tolerances_follow_the_dtype():
    assert default_tolerance(torch.float32) == 1e-5 and default_tolerance(torch.float64) == 1e-5
    assert default_tolerance(torch.float16) == 8 * 2.0 ** -10
    assert default_tolerance(torch.bfloat16) == 8 * 2.0 ** -7


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_model_passes_by_default_and_not_with_an_fp32_absolute_tolerance(dtype):
    model = TinyBert().eval().to(dtype)
    report = audit(model, vocab_size=V, output="token")
    assert report.passed, report
    assert report.settings["dtype"] == str(dtype).replace("torch.", "")
    assert report.settings["rtol"] == default_tolerance(dtype)
    assert report.settings["atol"] == pytest.approx(default_tolerance(dtype) * report.settings["scale"])
    # The padded rows differ from the rows alone by rounding steps of the half type: an absolute 1e-5 rejects them.
    strict = audit(model, vocab_size=V, output="token", atol=1e-5, modes=["grad"])
    assert not strict.passed and "batch_equivalence" in strict.failed
    worst = rows(strict, "batch_equivalence").loc["grad", "max_abs_diff"]
    assert 0 < worst <= 16 * torch.finfo(dtype).eps * strict.settings["scale"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_default_tolerance_still_catches_unmasked_pads(dtype):
    report = audit(TinyBert(masked=False).eval().to(dtype), vocab_size=V, output="token", modes=["grad"])
    assert {"batch_equivalence", "extra_padding", "pad_content"} <= set(report.failed), report


def test_a_check_passes_when_every_difference_is_within_atol_plus_rtol_times_the_reference():
    """The forward scales its output by (1 + delta) on a batch of one: batch_equivalence then sees
    |diff| = delta * |reference| exactly, elementwise."""
    delta = 1e-3
    torch.manual_seed(0)
    embed = nn.Embedding(V, 4)

    def forward(ids, mask):
        out = embed(ids).double()
        return out * (1 + delta) if ids.shape[0] == 1 else out

    loose = audit(forward, vocab_size=V, output="token", rtol=2 * delta, modes=["grad"])
    tight = audit(forward, vocab_size=V, output="token", rtol=delta / 2, modes=["grad"])
    assert rows(loose, "batch_equivalence").loc["grad", "passed"]
    row = rows(tight, "batch_equivalence").loc["grad"]
    assert not row["passed"] and tight.settings["atol"] == 0.0
    reference = embed.weight.detach().double()
    seqs = []  # the audit's token ids, drawn as documented: uniform in [0, V - 1), shifted past pad_id 0
    generator = torch.Generator().manual_seed(0)
    for n in (7, 3, 12, 1):
        ids = torch.randint(0, V - 1, (n,), generator=generator)
        seqs.append(ids + (ids >= 0).long())
    expected = max(float(reference[s].abs().max()) for s in seqs) * delta
    assert row["max_abs_diff"] == pytest.approx(expected, rel=1e-9)
    assert row["max_rel_diff"] == pytest.approx(row["max_abs_diff"] / tight.settings["scale"], rel=1e-12)
    # atol alone keeps the old absolute criterion: rtol is then 0
    absolute = audit(forward, vocab_size=V, output="token", atol=1e-5, modes=["grad"])
    assert absolute.settings["rtol"] == 0.0 and not rows(absolute, "batch_equivalence").loc["grad", "passed"]


def test_max_abs_diff_is_the_difference_from_the_reference_in_every_check():
    """An unmasked model: every check that compares reports the largest |output - reference| it measured, and
    max_rel_diff is that over the scale."""
    report = audit(TinyBert(masked=False).eval(), vocab_size=V, output="token", modes=["grad"],
                   optional=["mask_read"])
    table = report.checks.set_index("check")
    assert (table.loc[["batch_equivalence", "extra_padding", "pad_content"], "max_abs_diff"] > 0.1).all()
    # rows are independent here: an empty row beside them changes nothing, nor does the mask, which is ignored
    assert (table.loc[["empty_row", "mask_read"], "max_abs_diff"] == 0).all()
    assert np.allclose(table["max_rel_diff"], table["max_abs_diff"] / report.settings["scale"])


# --- grad modes ---------------------------------------------------------------------------------------------------

def test_modes_report_the_fast_paths_nan_under_no_grad_and_not_with_autograd_on():
    embed, encoder = torch_encoder()

    def forward(ids, mask):
        return encoder(embed(ids), src_key_padding_mask=~mask)

    # The fact, measured directly: a row with no real token is NaN on the fast path and finite with autograd on.
    ids, mask = torch.ones(2, 4, dtype=torch.long), torch.tensor([[True] * 4, [False] * 4])
    with torch.no_grad():
        assert torch.isnan(forward(ids, mask)[1]).all()
    assert torch.isfinite(forward(ids, mask)).all()
    report = audit(forward, vocab_size=V, output="token")
    assert report.failed_modes == {"empty_row": ["no_grad", "inference_mode"]}, report
    assert rows(report, "empty_row").loc["grad", "passed"]
    assert str(report).startswith("Padding audit FAILED (1 of 4 checks: empty_row (no_grad, inference_mode))")
    assert len(report.checks) == 3 * len(CHECKS) and list(report.checks["mode"][:3]) == ["grad", "no_grad",
                                                                                        "inference_mode"]


def test_modes_can_be_chosen_and_bad_modes_are_refused():
    report = audit(TinyBert().eval(), vocab_size=V, output="token", modes="no_grad")
    assert set(report.checks["mode"]) == {"no_grad"} and report.passed
    with pytest.raises(ValueError, match=r"modes must be a non-empty selection of \['grad', 'no_grad', "
                                         r"'inference_mode'\], got \['eval'\]"):
        audit(TinyBert(), vocab_size=V, modes=["eval"])
    with pytest.raises(ValueError, match="modes must be a non-empty selection"):
        audit(TinyBert(), vocab_size=V, modes=[])


def test_a_forward_that_cannot_run_in_a_mode_says_which():
    def needs_grad(ids, mask):
        if not torch.is_grad_enabled():
            raise RuntimeError("needs autograd")
        return TinyBert()(ids, mask)

    with pytest.raises(RuntimeError, match="mode 'no_grad'.*needs autograd.*modes="):
        audit(needs_grad, vocab_size=V, output="token")


# --- determinism --------------------------------------------------------------------------------------------------

def test_dropout_left_on_gets_its_message_instead_of_failing_every_check():
    torch.manual_seed(0)
    embed, drop = nn.Embedding(V, D), nn.Dropout(0.5)  # a module in training mode, as after construction

    def forward(ids, mask):
        return drop(embed(ids))

    report = audit(forward, vocab_size=V, output="token")
    assert report.failed == ["deterministic"] and len(report.checks) == 3, report
    assert all(detail.startswith(NOT_DETERMINISTIC) for detail in report.checks["detail"])
    assert NOT_DETERMINISTIC == "the forward is not deterministic: dropout? call model.eval()"
    drop.eval()
    assert audit(forward, vocab_size=V, output="token").passed


# --- polarity -----------------------------------------------------------------------------------------------------

def test_a_flipped_mask_is_diagnosed():
    """Passing the book's mask where torch expects key_padding_mask (True = a pad)."""
    embed, encoder = torch_encoder()

    def flipped(ids, mask):
        return encoder(embed(ids), src_key_padding_mask=mask)

    report = audit(flipped, vocab_size=V, output="token", modes=["grad"])
    detail = rows(report, "batch_equivalence").loc["grad", "detail"]
    assert "differ from the sequence run alone" in detail and "the mask's polarity looks inverted" in detail
    # a model that ignores its mask fails too, but not with that diagnosis
    unmasked = audit(TinyBert(masked=False).eval(), vocab_size=V, output="token", modes=["grad"])
    assert "polarity" not in " ".join(unmasked.checks["detail"])


@pytest.mark.parametrize("name", ["mask_read", "mask_polarity"])
def test_the_optional_mask_check_is_named_mask_read_with_its_old_name_an_alias(name):
    report = audit(TinyBert().eval(), vocab_size=V, output="token", optional=[name], modes=["grad"])
    assert list(report.checks["check"]) == [*CHECKS, "mask_read"] and report.passed


# --- causal models and left padding -------------------------------------------------------------------------------

def _left_batch(lengths, length):
    torch.manual_seed(1)
    ids = torch.randint(1, V, (len(lengths), length))
    mask = torch.zeros(len(lengths), length, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, length - n:] = True
    return ids.masked_fill(~mask, 0), mask


def test_torch_encoder_with_a_causal_mask_and_left_padding_is_nan_on_the_fast_path():
    """Verified before the chapter says it (issue 47): on the fast path (eval, without autograd) every real output of
    every left-padded row is NaN with two layers; with one layer only the pads' outputs are NaN (a pad's query sees
    no key), so the NaN spreads in layer 2; with autograd on, the rows are finite and equal the rows run alone;
    right padding is finite."""
    lengths, length = [7, 3, 12, 1], 12
    ids, mask = _left_batch(lengths, length)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            two, one = causal_forward(2)(ids, mask), causal_forward(1)(ids, mask)
            right = causal_forward(2)(ids, mask.flip(-1))
        for i, n in enumerate(lengths):
            real, pads = slice(length - n, length), slice(0, length - n)
            if n < length:
                assert torch.isnan(two[i, real]).all() and torch.isnan(one[i, pads]).all()
                assert torch.isfinite(one[i, real]).all()
            else:
                assert torch.isfinite(two[i]).all()
        assert torch.isfinite(right).all()
    grad = causal_forward(2)(ids, mask)
    for i, n in enumerate(lengths):
        alone = causal_forward(2)(ids[i:i + 1, length - n:], torch.ones(1, n, dtype=torch.bool))[0]
        torch.testing.assert_close(grad[i, length - n:], alone, atol=1e-5, rtol=1e-5)


def test_causal_left_padding_reports_it_in_the_modes_without_autograd():
    report = audit(causal_forward(2), vocab_size=V, output="token", causal=True)
    assert report.failed_modes["causal_left_padding"] == ["no_grad", "inference_mode"], report
    table = rows(report, "causal_left_padding")
    assert table.loc["grad", "passed"]
    detail = table.loc["no_grad", "detail"]
    assert "rows 0, 1, 3: NaN or infinite outputs" in detail and "see no key under the causal mask" in detail
    # right padding itself is fine for this causal model: batch_equivalence passes in every mode
    assert rows(report, "batch_equivalence")["passed"].all()
    assert "causal_left_padding" not in audit(causal_forward(2), vocab_size=V, output="token").checks["check"].values


def test_causal_left_padding_with_nothing_to_check():
    report = audit(causal_forward(1), [5, 5], V, output="token", causal=True, modes=["grad"])
    assert rows(report, "causal_left_padding").loc["grad", "detail"] == ("no row has both tokens and pads: "
                                                                         "nothing to check")


# --- clear errors -------------------------------------------------------------------------------------------------

def test_numpy_integers_are_accepted():
    model = TinyBert().eval()
    plain = audit(model, [7, 3, 12, 1], V, output="token", modes=["grad"], seed=2)
    for lengths in (np.array([7, 3, 12, 1]), [np.int64(7), np.int32(3), np.int64(12), np.int16(1)],
                    torch.tensor([7, 3, 12, 1])):
        got = audit(model, lengths, np.int64(V), output="token", modes=["grad"], seed=np.int64(2),
                    pad_id=np.int64(0), length=np.int64(12))
        pd.testing.assert_frame_equal(got.checks, plain.checks)
    with pytest.raises(TypeError, match=r"lengths must be ints, got .*True.* \(bool_?\)"):
        audit(model, [np.bool_(True), 3], V)


def test_a_vocab_size_above_the_embedding_gets_a_clear_message():
    model = TinyBert().eval()  # 50 rows
    with pytest.raises(ValueError, match=r"lower vocab_size \(the model's embedding has 50 rows\)") as info:
        audit(model, vocab_size=1000, output="token")
    assert isinstance(info.value.__cause__, IndexError)


def test_an_index_error_that_is_not_the_vocabulary_is_not_blamed_on_it():
    """Positions beyond the model's table raise IndexError too; every id runs alone, so the message stays the
    forward's own."""
    model = TinyBert().eval()
    with pytest.raises(RuntimeError, match="forward failed on the padded batch .*IndexError"):
        audit(model, [200, 3], V, output="token")


@pytest.mark.parametrize("kwargs, message", [
    (dict(atol=-1.0), "atol must be a finite number >= 0 or None"),
    (dict(rtol=math.inf), "rtol must be a finite number >= 0 or None"),
    (dict(optional=["mask"]), r"unknown optional check\(s\) \['mask'\]"),
])
def test_bad_tolerances_and_checks(kwargs, message):
    with pytest.raises(ValueError, match=message):
        audit(TinyBert(), vocab_size=V, **kwargs)


# --- assert_padding_safe ------------------------------------------------------------------------------------------

def test_assert_padding_safe_returns_the_report_or_fails_with_it():
    report = assert_padding_safe(TinyBert().eval(), vocab_size=V, output="token")
    assert isinstance(report, AuditReport) and report.passed
    bad = TinyBert(masked=False).eval()
    with pytest.raises(AssertionError) as info:
        assert_padding_safe(bad, vocab_size=V, output="token", modes=["grad"])
    expected = str(audit(bad, vocab_size=V, output="token", modes=["grad"]))
    assert str(info.value) == expected and expected.startswith("Padding audit FAILED")
    with pytest.raises(TypeError, match=r"assert_padding_safe\(report\) takes no other argument"):
        assert_padding_safe(report, vocab_size=V)


def test_the_example_test_file_passes_under_pytest():
    example = ROOT / "code" / "attnbook" / "audit" / "example_test.py"
    done = subprocess.run([sys.executable, "-m", "pytest", str(example), "-q", "-p", "no:cacheprovider",
                           "-p", "no:nbval", "-o", "addopts=", "--rootdir", str(example.parent)],
                          capture_output=True, text=True, cwd=example.parent)
    assert done.returncode == 0 and "3 passed" in done.stdout, done.stdout + done.stderr
