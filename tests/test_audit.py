"""attnbook.audit: it flags planted padding bugs, passes correct models (the book's included), and rejects bad
arguments with clear messages; the registry and the command line (chapter 10, "Padding bugs in the wild")."""

import importlib.util
import json
import math
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.audit import CAUSAL_CHECK, CHECKS, COLUMNS, OPTIONAL_CHECKS, AuditReport, audit
from attnbook.audit import subjects as registry
from attnbook.pooling import UNSAFE, AttentionPooling
from attnbook.transformer import TransformerClassifier, TransformerEncoderLayer

V, D = 50, 8


def verdicts(report: AuditReport) -> dict[str, bool]:
    """``{check: passed in every mode}``."""
    return {str(c): bool(g.all()) for c, g in report.checks.groupby("check", sort=False)["passed"]}


def row(report: AuditReport, check: str, mode: str = "grad") -> pd.Series:
    """The row of one check in one mode."""
    table = report.checks
    return table[(table["check"] == check) & (table["mode"] == mode)].iloc[0]


class Pooling(nn.Module):
    """Embedding -> (optional index positions) -> attention pooling, with the mask applied as ``fill`` says.

    fill: ``"none"`` (unmasked), ``"-inf"``, ``"finfo"`` (the dtype's most negative number: correct in any dtype),
    ``"-1e9"`` (``masked_fill``) or ``"additive-1e9"`` (``scores + (~mask) * -1e9``, cast to the scores' dtype).
    """

    def __init__(self, fill: str = "finfo", positions: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(V, D)
        self.pos = nn.Embedding(64, D) if positions else None
        self.score = nn.Linear(D, 1)
        self.fill = fill

    def forward(self, ids, mask):
        x = self.embed(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1]))  # index positions: the pads count
        s = self.score(x).squeeze(-1)
        if self.fill == "-inf":
            s = s.masked_fill(~mask, -math.inf)
        elif self.fill == "finfo":
            s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
        elif self.fill == "-1e9":
            s = s.masked_fill(~mask, -1e9)
        elif self.fill == "additive-1e9":
            s = s + ((~mask).to(s.dtype) * -1e9).to(s.dtype)
        w = s.softmax(-1)
        if self.fill == "finfo":  # a row without a token gets zero weights, not uniform ones over the pads
            w = w * mask.any(-1, keepdim=True)
        return (w[..., None] * x).sum(1)


class ReadsPads(nn.Module):
    """Correctly masked for attention, but adds the sum of all embeddings of its row (pads included), relying on
    the pad id's embedding being zero (``padding_idx``): another id in a pad changes the output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(V, D, padding_idx=0)
        self.pool = Pooling("finfo")

    def forward(self, ids, mask):
        return self.pool(ids, mask) + self.embed(ids).sum(1)


def correct_token_model(seed=0):
    torch.manual_seed(seed)
    embed, qkv = nn.Embedding(V, D), nn.Linear(D, 3 * D)

    def forward(ids, mask):
        q, k, v = qkv(embed(ids)).chunk(3, -1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, :])

    return forward


# --- planted bugs are flagged --------------------------------------------------------------------------------------

def test_unmasked_attention_pooling_fails_the_padding_checks():
    report = audit(Pooling("none"), vocab_size=V)
    assert verdicts(report) == {"batch_equivalence": False, "extra_padding": False, "pad_content": False,
                                "empty_row": True}
    assert not report.passed and report.failed == ["batch_equivalence", "extra_padding", "pad_content"]
    found = row(report, "batch_equivalence")
    assert found.max_abs_diff > 1e-3 and "rows 0, 1, 3" in found.detail  # row 2 is full: it has no pads to dilute


def test_left_padding_with_index_positions_fails_and_right_padding_passes():
    model = Pooling("finfo", positions=True)
    left = audit(model, vocab_size=V, padding_side="left")
    assert not verdicts(left)["batch_equivalence"] and not verdicts(left)["extra_padding"]
    assert verdicts(left)["pad_content"] and verdicts(left)["empty_row"]
    assert audit(model, vocab_size=V, padding_side="right").passed


def test_neg_inf_fill_gives_nan_on_the_empty_row_only():
    report = audit(Pooling("-inf"), vocab_size=V)
    assert report.failed == ["empty_row"]
    detail = row(report, "empty_row").detail
    assert "NaN or infinite" in detail and f"{D} NaN or infinite of {D} outputs" in detail
    assert "the other rows are unchanged" in detail
    assert row(report, "empty_row").nan_in == "empty row"  # the NaN stays in the row without tokens
    assert set(report.checks.loc[report.checks["check"] != "empty_row", "nan_in"]) == {""}


class SpreadsNaN(nn.Module):
    """The -inf pooling, then 0 times the batch's sum added to every row: exact while every output is finite, and
    an empty row's NaN reaches every row (0 * NaN = NaN), as a masked key's NaN value does in chapter 10."""

    def __init__(self):
        super().__init__()
        self.pool = Pooling("-inf")

    def forward(self, ids, mask):
        out = self.pool(ids, mask)
        return out + 0.0 * out.sum(0, keepdim=True)


def test_a_nan_that_reaches_real_tokens_is_told_from_one_that_stays_in_the_empty_row():
    report = audit(SpreadsNaN(), vocab_size=V)
    assert report.failed == ["empty_row"]
    found = row(report, "empty_row")
    assert found.nan_in == "real tokens" and "NaN or infinite outputs" in found.detail


@pytest.mark.parametrize("nan_in, side", [("", "library"), ("empty row", "contract"), ("real tokens", "library")])
def test_the_nan_rule_at_each_place(nan_in, side):
    assert registry.nan_rule(nan_in) == side
    assert registry.nan_rule(nan_in, half_precision_only=True) == "library"  # an overflow, not an answer


def test_the_book_unsafe_pooling_is_flagged_and_its_safe_ones_pass():
    torch.manual_seed(0)
    embed = nn.Embedding(V, D)
    for masking, expected in ((UNSAFE, ["empty_row"]), ("neg_inf", []), ("renormalize", []),
                              ("none", ["batch_equivalence", "extra_padding", "pad_content"])):
        pool = AttentionPooling(D, 4, masking=masking)
        report = audit(lambda ids, mask: pool(embed(ids), mask)[0], vocab_size=V)
        assert report.failed == expected, (masking, str(report))


@pytest.mark.parametrize("fill", ["-1e9", "additive-1e9"])
def test_minus_1e9_fill_passes_in_fp32_and_fails_in_fp16(fill):
    report = audit(Pooling(fill), vocab_size=V, optional=["low_precision"])
    assert report.failed == ["low_precision"], str(report)
    detail = row(report, "low_precision").detail
    if fill == "-1e9":  # masked_fill refuses a value that overflows fp16
        assert "fp16: forward raised RuntimeError" in detail and "overflow" in detail
        assert row(report, "low_precision").nan_in == ""  # an error, not a NaN
    else:  # the cast overflows to -inf, and the empty row becomes 0/0; the real rows stay finite
        assert "fp16: " in detail and "NaN or infinite outputs" in detail
        assert row(report, "low_precision").nan_in == "empty row"
    assert "bf16: largest difference" in detail  # bf16 has fp32's range: -1e9 fits


def test_a_model_that_reads_its_pads_fails_pad_content_only():
    report = audit(ReadsPads(), vocab_size=V)
    assert report.failed == ["pad_content"]


@pytest.mark.parametrize("name", ["mask_read", "mask_polarity"])  # mask_polarity: the old name, an alias
def test_mask_read_flags_a_model_that_ignores_its_mask_and_passes_one_that_reads_it(name):
    torch.manual_seed(0)
    embed = nn.Embedding(V, D)
    tokenwise = audit(lambda ids, mask: embed(ids), vocab_size=V, output="token", optional=[name])
    assert tokenwise.failed == ["mask_read"]  # no position mixes with another: nothing else can fail
    assert "unchanged with the mask inverted" in tokenwise.checks.iloc[-1]["detail"]
    assert audit(Pooling("finfo"), vocab_size=V, optional=[name]).passed


def test_a_flipped_mask_polarity_fails_batch_equivalence():
    """Passing the book's mask where torch expects key_padding_mask (True = ignore) attends to the pads only."""
    torch.manual_seed(0)
    embed, mha = nn.Embedding(V, D), nn.MultiheadAttention(D, 2, batch_first=True)

    def wrong(ids, mask):
        x = embed(ids)
        with torch.no_grad():
            return mha(x, x, x, key_padding_mask=mask, need_weights=False)[0]

    assert not verdicts(audit(wrong, vocab_size=V, output="token"))["batch_equivalence"]


# --- correct models pass -------------------------------------------------------------------------------------------

def test_correct_models_pass_every_check_including_the_optional_ones():
    for forward, output in ((Pooling("finfo"), "sequence"), (correct_token_model(), "token")):
        for side in ("right", "left"):
            report = audit(forward, vocab_size=V, padding_side=side, output=output, optional=OPTIONAL_CHECKS)
            assert report.passed, str(report)
            assert list(dict.fromkeys(report.checks["check"])) == [*CHECKS, *OPTIONAL_CHECKS]
            assert len(report.checks) == 3 * len([*CHECKS, *OPTIONAL_CHECKS])  # one row per check and mode


@pytest.mark.parametrize("side, positions", [("post", "index"), ("post", "first_token"), ("pre", "first_token")])
def test_the_book_transformer_classifier_passes_when_masked(side, positions):
    torch.manual_seed(0)
    model = TransformerClassifier(V, d_model=8, nhead=2, num_layers=2, dim_feedforward=16, dropout=0.0,
                                  padding_side=side, positions=positions, readout="mean").eval()
    report = audit(lambda ids, mask: model(ids, mask.sum(-1))[0], vocab_size=V,
                   padding_side="right" if side == "post" else "left", optional=OPTIONAL_CHECKS)
    assert report.passed, str(report)


def test_the_book_encoder_layer_passes():
    torch.manual_seed(0)
    embed, layer = nn.Embedding(V, D), TransformerEncoderLayer(D, 2, 16, dropout=0.0).eval()
    report = audit(lambda ids, mask: layer(embed(ids), padding_mask=mask), vocab_size=V, output="token",
                   optional=OPTIONAL_CHECKS)
    assert report.passed, str(report)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=5).filter(lambda ls: max(ls) > 0),
       side=st.sampled_from(["right", "left"]), seed=st.integers(0, 1000))
def test_property_masked_pooling_passes_and_unmasked_fails_when_a_row_has_pads(lengths, side, seed):
    assert audit(Pooling("finfo"), lengths, V, padding_side=side, seed=seed).passed
    unmasked = audit(Pooling("none"), lengths, V, padding_side=side, seed=seed)
    # Padding to twice the length always adds pads, so unmasked pooling always changes some row.
    assert not verdicts(unmasked)["extra_padding"]
    has_pads = any(0 < n < max(lengths) for n in lengths)
    assert verdicts(unmasked)["batch_equivalence"] == (not has_pads)


# --- the measurements against an independent computation -----------------------------------------------------------

def test_batch_equivalence_equals_a_direct_computation():
    """The reported difference is the largest |row in the padded batch - the sequence alone| over the rows."""
    model = Pooling("none")
    lengths, pad_id = [5, 2, 8], 3
    report = audit(model, lengths, V, pad_id=pad_id, seed=4)
    gen = torch.Generator().manual_seed(4)
    seqs = []
    for n in lengths:  # the audit's draw: ids in [0, V - 1), shifted past pad_id
        ids = torch.randint(0, V - 1, (n,), generator=gen)
        seqs.append(ids + (ids >= pad_id).long())
    batch = torch.full((3, 8), pad_id)
    mask = torch.zeros(3, 8, dtype=torch.bool)
    for i, s in enumerate(seqs):
        batch[i, : len(s)], mask[i, : len(s)] = s, True
    with torch.no_grad():
        padded = model(batch, mask).double()
        alone = [model(s[None], torch.ones(1, len(s), dtype=torch.bool)).double()[0] for s in seqs]
    expected = max(float((padded[i] - alone[i]).abs().max()) for i in range(3))
    got = row(report, "batch_equivalence").max_abs_diff
    assert got == pytest.approx(expected, rel=1e-12)


def test_real_ids_never_use_the_pad_id_and_pads_hold_it():
    seen = []

    def forward(ids, mask):
        seen.append((ids.clone(), mask.clone()))
        return torch.zeros(ids.shape[0], 1)

    audit(forward, [4, 2, 6], vocab_size=7, pad_id=5, padding_side="left")
    ids, mask = seen[0]
    assert ids.dtype == torch.int64 and mask.dtype == torch.bool and ids.shape == (3, 6)
    assert (ids[mask] != 5).all() and (ids[~mask] == 5).all() and ((ids >= 0) & (ids < 7)).all()
    assert mask.tolist()[1] == [False] * 4 + [True] * 2  # left padding
    assert any((i[~m] != 5).any() for i, m in seen)  # the pad_content check puts other ids in the pads


def test_same_seed_same_report_and_a_report_reads_well():
    a, b = audit(Pooling("none"), vocab_size=V, seed=3), audit(Pooling("none"), vocab_size=V, seed=3)
    pd.testing.assert_frame_equal(a.checks, b.checks)
    assert list(a.checks.columns) == COLUMNS and a.checks["passed"].dtype == bool
    assert isinstance(a.passed, bool) and a.passed is False and not a
    text = str(a)
    assert text.startswith("Padding audit FAILED (3 of 4 checks: batch_equivalence, extra_padding, pad_content)")
    assert "lengths [7, 3, 12, 1] padded to 12, right padding" in text and "FAIL" in text and "pass" in text
    assert repr(a) == text
    ok = audit(Pooling("finfo"), vocab_size=V)
    assert str(ok).startswith("Padding audit passed") and ok.passed is True


def test_token_outputs_compare_real_positions_only():
    """A model whose pad positions hold garbage (different every call) still passes: they are never compared."""
    torch.manual_seed(0)
    embed = nn.Embedding(V, D)

    def forward(ids, mask):
        out = embed(ids)
        return torch.where(mask[..., None], out, torch.randn_like(out) * 100)

    assert audit(forward, vocab_size=V, output="token").passed


# --- bad arguments give clear errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(lengths=[3, -1]), ValueError, r"lengths must lie in \[0, L\] = \[0, 3\], got \[-1\]"),
    (dict(lengths=[3, 9], length=6), ValueError, r"lengths must lie in \[0, L\] = \[0, 6\], got \[9\]"),
    (dict(lengths=[0, 0]), ValueError, "at least one length must be positive"),
    (dict(lengths=[]), ValueError, "at least one length"),
    (dict(lengths=[3, 2.5]), TypeError, "lengths must be ints, got 2.5"),
    (dict(lengths="7,3"), TypeError, "lengths must be a sequence of ints"),
    (dict(padding_side="middle"), ValueError, r"padding_side must be one of \['right', 'left'\], got 'middle'"),
    (dict(output="tokens"), ValueError, r"output must be one of \['sequence', 'token'\], got 'tokens'"),
    (dict(optional=["fp8"]), ValueError, r"unknown optional check\(s\) \['fp8'\]; the optional checks are"),
    (dict(vocab_size=1), ValueError, "vocab_size must be an int >= 2"),
    (dict(pad_id=100), ValueError, r"pad_id must be an int in \[0, vocab_size\) = \[0, 100\), got 100"),
    (dict(atol=-1.0), ValueError, "atol must be a finite number >= 0"),
    (dict(seed=-2), ValueError, "seed must be a non-negative int"),
])
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        audit(Pooling("finfo"), **kwargs)


def test_forward_not_callable():
    with pytest.raises(TypeError, match="forward must be callable as forward"):
        audit("model")


def test_forward_returning_a_non_tensor():
    with pytest.raises(TypeError, match="forward must return a torch.Tensor, got tuple"):
        audit(lambda ids, mask: (ids.float(),))


def test_forward_returning_integers():
    with pytest.raises(TypeError, match="floating-point tensor, got dtype torch.int64"):
        audit(lambda ids, mask: ids)


def test_forward_returning_the_wrong_batch_size():
    with pytest.raises(ValueError, match=r"forward returned shape \(3, 2\) for a batch of 4 rows"):
        audit(lambda ids, mask: torch.zeros(3, 2))


def test_token_output_of_the_wrong_length_on_the_padded_batch():
    with pytest.raises(ValueError, match=r"for input of length 12; output='token' needs \(B, L, \.\.\.\)"):
        audit(lambda ids, mask: torch.zeros(ids.shape[0], 5, 2), output="token")


def test_sequence_output_whose_shape_depends_on_the_length():
    with pytest.raises(ValueError, match="use output='token'"):
        audit(lambda ids, mask: ids.float())


def test_forward_that_fails_on_the_padded_batch():
    def broken(ids, mask):
        raise KeyError("no such layer")

    with pytest.raises(RuntimeError, match="the forward failed on the padded batch .*KeyError") as info:
        audit(broken)
    assert isinstance(info.value.__cause__, KeyError)


def test_an_error_inside_a_check_fails_that_check_only():
    def refuses_empty_rows(ids, mask):
        if not mask.any(-1).all():
            raise ValueError("empty row")
        return Pooling("finfo")(ids, mask)

    report = audit(refuses_empty_rows, vocab_size=V)
    assert report.failed == ["empty_row"]
    found = row(report, "empty_row")
    assert found.detail == "forward raised ValueError: empty row" and math.isnan(found.max_abs_diff)


def test_a_truncated_token_output_fails_the_check_that_caused_it():
    """Like nn.TransformerEncoder's nested tensors in pytorch/pytorch#97111: columns that are pads in every row are
    dropped from the output."""
    torch.manual_seed(0)
    embed = nn.Embedding(V, D)

    def truncating(ids, mask):
        keep = int(mask.any(0).nonzero().max()) + 1 if mask.any() else 0
        return embed(ids)[:, :keep]

    report = audit(truncating, vocab_size=V, output="token")
    assert report.failed == ["extra_padding"]
    assert "for input of length 24" in row(report, "extra_padding").detail


# --- the registry and the command line ----------------------------------------------------------------------------

def test_select_subjects_and_unknown_names():
    assert [s.key for s in registry.select("torch-sdpa")] == ["torch-sdpa"]
    assert {s.library for s in registry.select("hf-")} == {"transformers"}
    assert len(registry.select(None)) == len(registry.SUBJECTS) >= 8
    with pytest.raises(ValueError, match=r"unknown subject\(s\) \['nope'\]; the subjects are"):
        registry.select("torch-sdpa,nope")
    assert len({s.key for s in registry.SUBJECTS}) == len(registry.SUBJECTS)
    assert len({s.library for s in registry.SUBJECTS}) >= 4


def test_every_cause_names_a_subject_and_check_and_links_upstream_or_to_the_book():
    keys = set(registry.subject_names())
    for subject, causes in registry.CAUSES.items():
        assert subject in keys
        for check, cause in causes.items():
            assert check in (*CHECKS, CAUSAL_CHECK, *OPTIONAL_CHECKS) and cause.kind in ("bug", "by design", "recipe")
            assert cause.root_cause in registry.ROOT_CAUSES and cause.mechanism in registry.MECHANISMS
            library = next(s.library for s in registry.SUBJECTS if s.key == subject)
            if library == "attnbook":
                assert cause.ref.startswith("sec-") and not cause.url
                assert registry.ROOT_CAUSES[cause.root_cause][0] == "book"
            else:  # an upstream thread, or the documentation or source that states the requirement
                assert cause.url.startswith("https://"), (subject, check)
                assert registry.ROOT_CAUSES[cause.root_cause][0] in ("caller", "library", registry.NAN_RULE)
    assert {category for category, _ in registry.ROOT_CAUSES.values()} <= {*registry.CATEGORIES, registry.NAN_RULE}


def test_the_citations_corrected_in_issue_47():
    """#160064 is a per-head attn_mask case (the general empty row is #41508); the CPU-autocast error is #107663
    (#191916's bug is on XPU); BERT's advice to pad on the right is its documentation's; x-transformers#185 concerns
    the decoder; d2l-en#2423 concerns empty rows, not fp16; GPT-2's left padding is its documented requirement (its
    tips), whatever a maintainer once called the direct call (the evidence page keeps that history)."""
    urls = {(s, c): cause.url for s, causes in registry.CAUSES.items() for c, cause in causes.items()}
    assert not any("160064" in u or "191916" in u or "20068" in u or "2423" in u for u in urls.values())
    assert urls[("torch-mha-weights-train", "empty_row")].endswith("/issues/41508")
    assert urls[("torch-encoder-nested", "low_precision")].endswith("/issues/107663")
    assert "huggingface.co/docs" in urls[("hf-bert-left", "batch_equivalence")]
    assert "185" not in urls[("xt-encoder-left", "batch_equivalence")]
    assert urls[("xt-decoder-left", "batch_equivalence")].endswith("/issues/185")
    gpt2 = registry.CAUSES["hf-gpt2-left"]["batch_equivalence"]
    assert gpt2.kind == "by design" and "bug" not in gpt2.why
    assert registry.ROOT_CAUSES[gpt2.root_cause][0] == "caller"


def test_the_d2l_recipe_matches_its_description():
    scores = torch.tensor([[[1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0]], [[1.0, 2.0, 3.0]]])
    weights = registry.d2l_masked_softmax(scores, torch.tensor([2, 3, 0]))
    assert torch.allclose(weights[0, 0], torch.cat([torch.tensor([1.0, 2.0]).softmax(0), torch.zeros(1)]))
    assert torch.allclose(weights[1, 0], scores[1, 0].softmax(0))
    assert torch.allclose(weights[2, 0], torch.full((3,), 1 / 3))  # valid_len 0: uniform (d2l-ai/d2l-en#2423)


def test_torch_and_book_subjects_give_the_expected_table():
    results = registry.run_registry(registry.select("torch-,book-"))
    table = registry.wide_table(results).set_index("subject")
    name = {s.key: s.name for s in registry.SUBJECTS}
    assert table.loc[name["torch-sdpa"]].drop("library").isin(["pass", "-"]).all()
    assert table.loc[name["torch-mha-train"], "empty_row"] == "pass"
    assert table.loc[name["torch-mha-weights-train"], "empty_row"] == "NaN"
    assert table.loc[name["book-transformer-right"]].drop("library").isin(["pass", "-"]).all()
    assert table.loc[name["book-transformer-left-index"], "batch_equivalence"] == "differs"
    assert table.loc[name["book-bigru-masked"], "empty_row"] == "error"
    explained = registry.explain(results)
    assert explained["known"].all(), explained[~explained["known"]]
    assert set(results.columns) >= {"subject", "name", "library", "seed", "lengths", *COLUMNS}


def test_the_whole_registry_runs_and_every_failure_has_a_known_cause():
    missing = [m for m in ("transformers", "keras", "x_transformers") if importlib.util.find_spec(m) is None]
    if missing:  # not importorskip: importing keras here would pick its default backend, not torch
        pytest.skip(f"not installed: {missing}")
    results = registry.run_registry()
    table = registry.wide_table(results).set_index("subject")
    assert len(table) == len(registry.SUBJECTS)
    name = {s.key: s.name for s in registry.SUBJECTS}
    assert table.loc[name["hf-gpt2-left"], "batch_equivalence"] == "differs"
    assert table.loc[name["hf-gpt2-left-positions"]].drop("library").isin(["pass", "-"]).all()
    explained = registry.explain(results)
    assert explained["known"].all(), explained[~explained["known"]].to_string()


def test_keras_adapter_refuses_another_backend(monkeypatch):
    class FakeKeras:
        class backend:
            @staticmethod
            def backend():
                return "jax"

    monkeypatch.setitem(sys.modules, "keras", FakeKeras)
    with pytest.raises(RuntimeError, match="keras was imported earlier with the 'jax' backend; set KERAS_BACKEND"):
        registry._keras()


def test_command_line_help_and_a_small_run(tmp_path):
    run = [sys.executable, "-m", "attnbook.audit"]
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True).stdout
    assert all(option in helped for option in ("--only", "--subject", "--junit", "--fail-on", "exit status"))
    out = tmp_path / "audit.csv"
    done = subprocess.run([*run, "--only", "torch-sdpa,d2l", "--seeds", "2", "--lengths", "7,3,12,1",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr  # the d2l recipe fails low_precision
    assert "2 subjects, 4 runs" in done.stdout and "[library] the recipe's fill of -1e6 overflows fp16" in done.stdout
    table = pd.read_csv(out)
    assert set(table["subject"]) == {"torch-sdpa", "d2l-masked-softmax"} and set(table["seed"]) == {0, 1}
    assert {"mode", "max_rel_diff"} <= set(table.columns) and set(table["mode"]) == {"grad"}
    page = out.with_suffix(".md").read_text()
    assert "Library versions: torch " in page and "https://d2l.ai/" in page and "## Failures by root cause" in page
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["n_runs"] == 4 and record["libraries"]["torch"] == torch.__version__.split("+")[0]
    assert record["config"]["subjects"] == ["torch-sdpa", "d2l-masked-softmax"]


@pytest.mark.parametrize("argv, message", [
    (["--out", "audit.txt"], "--out must end in .csv"),
    (["--only", "nope"], r"unknown subject\(s\) \['nope'\]"),
    (["--seeds", "0"], "--seeds must be >= 1"),
    (["--lengths", "3,x"], "lengths must be comma-separated integers"),
])
def test_command_line_errors(argv, message, capsys):
    from attnbook.audit.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(argv)
    assert re.search(message, capsys.readouterr().err)


def test_the_nan_rule_sorts_the_fast_paths_two_symptoms_by_where_the_nan_was_measured():
    """The fused fast path's masked softmax gives NaN for a query with no key (pytorch/pytorch#190486). On an empty
    row the NaN stays there: a contract choice, like the weights path's (#41508). Under a causal mask with left
    padding it reaches the real tokens of the next layer: library behaviour. The side comes from the measured
    ``nan_in``, not from a label."""
    results = registry.run_registry(registry.select("torch-encoder-causal-fastpath"))
    explained = registry.explain(results).set_index("check")
    assert explained.loc["empty_row", ["nan_in", "category"]].tolist() == ["empty row", "contract"]
    assert explained.loc[CAUSAL_CHECK, ["nan_in", "category"]].tolist() == ["real tokens", "library"]
    for root in ("empty-row-nan", "fastpath-empty-row-nan", "fastpath-causal-nan", "fp16-fill-overflow"):
        assert registry.ROOT_CAUSES[root][0] == registry.NAN_RULE
    # the same failure, stored with the NaN elsewhere or without the column, changes side by the rule
    failed = results[(results.check == "empty_row")].assign(nan_in="real tokens")
    assert registry.explain(failed)["category"].tolist() == ["library"]
    assert registry.explain(failed.drop(columns="nan_in"))["category"].tolist() == ["library"]
    # d2l's fp16 NaN stays in the empty row, but fp32 gives that row uniform weights: an overflow, not an answer
    d2l = registry.explain(registry.run_registry(registry.select("d2l"))).set_index("check")
    assert d2l.loc["low_precision", ["nan_in", "category"]].tolist() == ["empty row", "library"]
