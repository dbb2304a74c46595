"""attnbook.nli against independent references: explicit loops for the soft alignments, comparison and
aggregation (Parikh et al. 2016, eqs. 1-5), hypothesis properties of padding invariance on either side, the
parameter count of Parikh et al.'s configuration by formula, and the experiment functions and CLI on a tiny run."""

import json
import math

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.data.nli import build_vocab, encode, generate_nli
from attnbook.experiments import nli as exp
from attnbook.nli import (DecomposableAttention, alignment_accuracy, chance_alignment_accuracy,
                          count_parameters)

VOCAB = 13


def _model(seed=0, hidden=6, classes=3, dtype=torch.float64):
    torch.manual_seed(seed)
    return DecomposableAttention(VOCAB, embed_dim=5, hidden_size=hidden, num_classes=classes, dropout=0.0).to(dtype).eval()


def _pad(ids, length, fill):
    """Right-pad a list of ids with ``fill`` (any id: masked positions must not matter)."""
    return ids + [fill] * (length - len(ids))


def _batch(seqs, length, fill=0):
    ids = torch.tensor([_pad(s, length, fill) for s in seqs])
    mask = torch.tensor([[i < len(s) for i in range(length)] for s in seqs])
    return ids, mask


# ---------------------------------------------------------------- the steps against loops
@torch.no_grad()
def test_soft_alignments_equal_a_direct_computation():
    model = _model()
    premise, hypothesis = [[3, 4, 5, 2], [7, 8]], [[9, 3], [4, 4, 11]]
    pa, ma = _batch(premise, 5)
    pb, mb = _batch(hypothesis, 4)
    a, b = model.embed(pa), model.embed(pb)
    align = model.attend(a, b, ma, mb)
    for n in range(2):
        la, lb = len(premise[n]), len(hypothesis[n])
        fa = [model.F(a[n, i]) for i in range(la)]
        fb = [model.F(b[n, j]) for j in range(lb)]
        e = [[float(sum(fa[i][k] * fb[j][k] for k in range(fa[i].shape[0]))) for j in range(lb)] for i in range(la)]
        for i in range(la):
            z = sum(math.exp(e[i][j]) for j in range(lb))
            w = [math.exp(e[i][j]) / z for j in range(lb)]
            beta = sum(w[j] * b[n, j] for j in range(lb))
            assert torch.allclose(align.beta[n, i], beta, atol=1e-12)
            assert torch.allclose(align.weights_a[n, i, :lb], torch.tensor(w, dtype=torch.float64), atol=1e-12)
            assert torch.all(align.weights_a[n, i, lb:] == 0)
        for j in range(lb):
            z = sum(math.exp(e[i][j]) for i in range(la))
            w = [math.exp(e[i][j]) / z for i in range(la)]
            alpha = sum(w[i] * a[n, i] for i in range(la))
            assert torch.allclose(align.alpha[n, j], alpha, atol=1e-12)
            assert torch.allclose(align.weights_b[n, j, :la], torch.tensor(w, dtype=torch.float64), atol=1e-12)
            assert torch.all(align.weights_b[n, j, la:] == 0)
        assert torch.all(align.weights_a[n, la:] == 0) and torch.all(align.weights_b[n, lb:] == 0)
        assert torch.allclose(align.scores[n, :la, :lb], torch.tensor(e, dtype=torch.float64), atol=1e-12)


@torch.no_grad()
def test_compare_and_aggregate_equal_a_direct_computation():
    model = _model(seed=1)
    premise, hypothesis = [[3, 4, 5], [7]], [[9, 3, 2, 2], [4, 12]]
    pa, ma = _batch(premise, 3)
    pb, mb = _batch(hypothesis, 4)
    logits = model(pa, pb, ma, mb)
    for n in range(2):
        a = model.embed(torch.tensor([premise[n]]))[0]
        b = model.embed(torch.tensor([hypothesis[n]]))[0]
        e = model.F(a) @ model.F(b).T                                  # no pads at all
        beta = torch.softmax(e, dim=1) @ b
        alpha = torch.softmax(e, dim=0).T @ a
        v1 = sum(model.G(torch.cat([a[i], beta[i]])) for i in range(len(premise[n])))
        v2 = sum(model.G(torch.cat([b[j], alpha[j]])) for j in range(len(hypothesis[n])))
        assert torch.allclose(logits[n], model.H(torch.cat([v1, v2])), atol=1e-12)


def test_attention_weights_are_kept_and_rows_sum_to_one():
    model = _model()
    pa, ma = _batch([[3, 4, 5], [6]], 4)
    pb, mb = _batch([[7, 8], [9, 10, 11]], 5)
    model(pa, pb, ma, mb)
    w_a, w_b = model.attention_weights
    assert w_a.shape == (2, 4, 5) and w_b.shape == (2, 5, 4) and not w_a.requires_grad
    assert torch.allclose(w_a.sum(-1), ma.double()) and torch.allclose(w_b.sum(-1), mb.double())


# ---------------------------------------------------------------- padding invariance (both sides)
sentence = st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=5)


@torch.no_grad()
@settings(max_examples=40, deadline=None)
@given(premises=st.lists(sentence, min_size=1, max_size=3), data=st.data())
def test_padding_either_sentence_does_not_change_the_logits(premises, data):
    hypotheses = [data.draw(sentence) for _ in premises]
    extra_a, extra_b = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))
    fill_a, fill_b = data.draw(st.integers(0, VOCAB - 1)), data.draw(st.integers(0, VOCAB - 1))
    model = _model(seed=data.draw(st.integers(0, 3)))
    la, lb = max(map(len, premises)), max(map(len, hypotheses))
    (pa0, ma0), (pb0, mb0) = _batch(premises, la), _batch(hypotheses, lb)
    ref = model(pa0, pb0, ma0, mb0)
    pa, ma = _batch(premises, la + extra_a, fill_a)      # pads with arbitrary ids: contents must not matter
    pb, mb = _batch(hypotheses, lb + extra_b, fill_b)
    assert torch.allclose(model(pa, pb, ma, mb), ref, atol=1e-12, rtol=0)


def test_without_masks_padding_changes_the_logits():
    model = _model()
    pa, ma = _batch([[3, 4, 5]], 3)
    pb, mb = _batch([[7, 8]], 2)
    pa2, _ = _batch([[3, 4, 5]], 8)
    pb2, _ = _batch([[7, 8]], 8)
    assert not torch.allclose(model(pa, pb), model(pa2, pb2))              # the unmasked (d2l-style) variant
    assert torch.allclose(model(pa, pb), model(pa, pb, ma, mb), atol=1e-12)  # no pads: masks change nothing


def test_an_all_false_premise_mask_gives_a_hypothesis_only_model():
    model = _model()
    pa, _ = _batch([[3, 4, 5], [6, 6]], 3)
    pb, mb = _batch([[7, 8], [9]], 2)
    logits = model(pa, pb, torch.zeros_like(pa, dtype=torch.bool), mb)
    assert torch.isfinite(logits).all()
    for n, hyp in enumerate([[7, 8], [9]]):
        b = model.embed(torch.tensor([hyp]))[0]
        v2 = model.G(torch.cat([b, torch.zeros_like(b)], dim=-1)).sum(0)
        assert torch.allclose(logits[n], model.H(torch.cat([torch.zeros_like(v2), v2])), atol=1e-12)
    other = torch.tensor([[11, 12, 1], [2, 3, 4]])                       # the premise no longer matters
    assert torch.allclose(model(other, pb, torch.zeros_like(mb[:, :1].expand(2, 3)), mb), logits, atol=1e-12)


def test_gradients_pass_and_pad_embedding_stays_zero():
    model = _model(dtype=torch.float32).train()
    pa, ma = _batch([[3, 4], [5]], 3)
    pb, mb = _batch([[7], [8, 9]], 2)
    torch.nn.functional.cross_entropy(model(pa, pb, ma, mb), torch.tensor([0, 2])).backward()
    assert model.embedding.weight.grad[0].abs().sum() == 0
    assert all(p.grad is not None for p in model.parameters())


# ---------------------------------------------------------------- construction
def test_parikh_sizes_give_about_380k_parameters():
    d, e = 200, 300
    by_formula = (e * d) + 2 * (d * d + d) + (2 * d * d + d) + (d * d + d) + (2 * d * d + d) + (d * d + d) + (d * 3 + 3)
    model = DecomposableAttention(1000, embed_dim=e, hidden_size=d)
    assert count_parameters(model) == by_formula == 381_803
    assert count_parameters(model, include_embeddings=True) == by_formula + 1000 * e


def test_embeddings_are_copied_and_can_be_frozen():
    table = torch.randn(VOCAB, 5)
    model = DecomposableAttention(VOCAB, embed_dim=5, hidden_size=4, embeddings=table, freeze_embeddings=True)
    assert torch.equal(model.embedding.weight[1:], table[1:]) and model.embedding.weight[0].abs().sum() == 0
    assert not model.embedding.weight.requires_grad
    assert count_parameters(model) == sum(p.numel() for n, p in model.named_parameters() if "embedding" not in n)


def test_constructor_errors():
    with pytest.raises(ValueError, match="hidden_size must be positive, got 0"):
        DecomposableAttention(10, hidden_size=0)
    with pytest.raises(ValueError, match="dropout must be in \\[0, 1\\), got 1.0"):
        DecomposableAttention(10, dropout=1.0)
    with pytest.raises(ValueError, match="embeddings must have shape \\(10, 50\\), got \\(10, 3\\)"):
        DecomposableAttention(10, embeddings=torch.zeros(10, 3))


def test_forward_errors():
    model = _model()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError, match="premise must hold integer token ids, got dtype torch.float32"):
        model(ids.float(), ids)
    with pytest.raises(ValueError, match="hypothesis must have shape \\(batch, length\\), got \\(3,\\)"):
        model(ids, ids[0])
    with pytest.raises(TypeError, match="premise must be a torch.Tensor, got list"):
        model([[1, 2]], ids)
    with pytest.raises(ValueError, match="batch sizes differ: 1 and 2"):
        model(ids, ids.expand(2, 3))
    with pytest.raises(TypeError, match="premise_mask must be a bool tensor \\(True = takes part\\), got dtype torch.int64"):
        model(ids, ids, torch.ones_like(ids), None)
    with pytest.raises(ValueError, match="hypothesis_mask must have shape \\(batch, length\\) = \\(1, 3\\), got \\(1, 2\\)"):
        model(ids, ids, None, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask_a must be a bool torch.Tensor, got list"):
        model.attend(model.embed(ids), model.embed(ids), [[True]])
    with pytest.raises(TypeError, match="mask_b must be a bool tensor"):
        model.aggregate(torch.zeros(1, 3, 6), torch.zeros(1, 3, 6), None, torch.ones(1, 3))


# ---------------------------------------------------------------- attention as alignment
def test_alignment_accuracy_against_a_loop():
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(4, 5, 6, generator=g)
    gold = torch.randint(-1, 6, (4, 5), generator=g)
    hits = counted = 0
    for n in range(4):
        for q in range(5):
            if gold[n, q] >= 0:
                counted += 1
                hits += int(max(range(6), key=lambda k: weights[n, q, k]) == gold[n, q])
    assert alignment_accuracy(weights, gold) == (hits, counted)
    key_mask = torch.tensor([[True] * 6, [True] * 2 + [False] * 4, [True] * 3 + [False] * 3, [True] + [False] * 5])
    expected = [1 / int(key_mask[n].sum()) for n in range(4) for q in range(5) if gold[n, q] >= 0]
    assert chance_alignment_accuracy(key_mask, gold) == pytest.approx(sum(expected) / len(expected))


def test_alignment_errors():
    with pytest.raises(ValueError, match="gold must have shape \\(2, 3\\), got \\(2, 4\\)"):
        alignment_accuracy(torch.rand(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="gold index 4 is out of range for 4 keys"):
        alignment_accuracy(torch.rand(1, 1, 4), torch.tensor([[4]]))
    with pytest.raises(ValueError, match="no query token has a gold alignment"):
        chance_alignment_accuracy(torch.ones(1, 3, dtype=torch.bool), torch.full((1, 2), -1))
    with pytest.raises(ValueError, match="batch sizes differ: 1 and 2"):
        chance_alignment_accuracy(torch.ones(1, 3, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.long))


# ---------------------------------------------------------------- experiments and CLI (tiny)
TINY = exp.NLIConfig(n_train=90, n_valid=30, n_test=30, hidden_size=8, epochs=1, batch_size=32,
                     pad_lengths=(7, 12))


def test_padding_sweep_masked_is_invariant_and_unmasked_is_not():
    splits = exp.load_data(TINY)
    vocab = build_vocab(splits["train"])
    model = exp.make_model(TINY, vocab)
    exp.train(model, encode(splits["train"], vocab), TINY, device="cpu")
    masked = exp.padding_sweep(model, splits["test"], vocab, [7, 12, 30], masked=True)
    assert masked["changed"].max() == 0 and masked["pad_mass"].max() == 0
    assert masked["max_logit_change"].max() < 1e-5
    unmasked = exp.padding_sweep(model, splits["test"], vocab, [7, 12, 30], masked=False)
    assert unmasked["max_logit_change"].max() > 1e-3 and unmasked["pad_mass"].iloc[-1] > 0
    table = exp.alignment_table(model, splits["test"], vocab)
    assert set(table["direction"]) == {"hypothesis->premise", "premise->hypothesis"}
    assert table[table.category == "all"]["tokens"].min() > 0


def test_evaluate_confusion_matrix():
    logits = torch.tensor([[3.0, 0, 0], [0, 3.0, 0], [0, 0, 3.0], [3.0, 0, 0]])
    result = exp.evaluate(logits, torch.tensor([0, 1, 1, 2]))
    assert result["confusion"].tolist() == [[1, 0, 0], [0, 1, 1], [1, 0, 0]]
    assert result["accuracy"] == 0.5 and result["acc_neutral"] == 0.5 and result["acc_contradiction"] == 0.0


def test_config_modes_and_errors():
    assert exp.NLIConfig.for_mode("quick") == exp.NLIConfig.quick()
    assert exp.NLIConfig.full().hidden_size == 200
    with pytest.raises(ValueError, match="mode must be 'quick' or 'full', got 'fast'"):
        exp.NLIConfig.for_mode("fast")
    with pytest.raises(ValueError, match="mode must be 'quick' or 'full', got 'cpu'"):   # no CPU preset here
        exp.NLIConfig.for_mode("cpu")
    with pytest.raises(ValueError, match="cfg.data must be 'generated' or 'snli', got 'mnli'"):
        exp.load_data(exp.NLIConfig(data="mnli"))
    with pytest.raises(ValueError, match="GloVe vectors here are 50-d"):
        exp.make_model(exp.NLIConfig(glove=True, embed_dim=300), build_vocab(generate_nli(3)))


def test_cli_writes_csv_and_provenance(tmp_path, monkeypatch):
    monkeypatch.setattr(exp.NLIConfig, "quick", classmethod(lambda cls: TINY))
    out = tmp_path / "nli_quick.csv"
    result = exp.main(["--mode", "quick", "--data", "generated", "--out", str(out), "--device", "cpu"])
    stored = pd.read_csv(out)
    assert list(stored["model"]) == ["masked", "unmasked", "hypothesis-only"]
    assert stored.loc[0, "max_changed"] == 0 and stored.loc[0, "max_pad_mass"] == 0
    assert len(result) == 3
    prov = json.loads(out.with_suffix(".json").read_text())
    assert prov["mode"] == "quick" and prov["device_type"] == "cpu" and prov["data"] == "generated"


def test_cli_snli_from_a_local_directory(tmp_path, monkeypatch):
    fixture = (__import__("pathlib").Path(__file__).parent / "fixtures" / "snli_tiny.jsonl").read_text()
    for name in ("train", "dev", "test"):
        (tmp_path / f"snli_1.0_{name}.jsonl").write_text(fixture)
    monkeypatch.setattr(exp.NLIConfig, "quick", classmethod(lambda cls: TINY))
    out = tmp_path / "snli.csv"
    result = exp.main(["--mode", "quick", "--data", "snli", "--snli-path", str(tmp_path), "--out", str(out),
                       "--device", "cpu"])
    assert set(result["data"]) == {"snli"} and "alignment_accuracy" not in result.columns


# ---------------------------------------------------------------- no silent coercion (issue 18)
def test_chance_alignment_accuracy_requires_a_bool_key_mask():
    """An int key_mask holding 2s counted them as two keys each: the chance level changed silently."""
    gold = torch.tensor([[0, 1], [0, -1]])
    key_mask = torch.tensor([[1, 1, 0], [1, 2, 2]])
    assert chance_alignment_accuracy(key_mask.bool(), gold) == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    with pytest.raises(TypeError, match=r"key_mask must be a bool tensor \(True = takes part\), got dtype torch.int64"):
        chance_alignment_accuracy(key_mask, gold)
    with pytest.raises(TypeError, match="key_mask must be a bool torch.Tensor, got list"):
        chance_alignment_accuracy(key_mask.bool().tolist(), gold)
    with pytest.raises(TypeError, match="gold must be an integer torch.Tensor, got list"):
        chance_alignment_accuracy(key_mask.bool(), gold.tolist())
    with pytest.raises(TypeError, match="gold must hold integer key indices, got dtype torch.float32"):
        chance_alignment_accuracy(key_mask.bool(), gold.float())
    with pytest.raises(ValueError, match=r"gold index 3 is out of range for 3 keys \(key_mask has shape \(2, 3\)\)"):
        chance_alignment_accuracy(key_mask.bool(), torch.tensor([[0, 3], [0, -1]]))
    with pytest.raises(ValueError, match=r"key_mask must be \(batch, n_keys\) and gold \(batch, n_queries\), got "
                                         r"\(6,\) and \(2, 2\)"):
        chance_alignment_accuracy(key_mask.bool().flatten(), gold)


def test_mask_shape_errors_give_both_shapes():
    model = _model()
    premise, hypothesis = torch.ones(2, 4, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"premise_mask must have shape \(batch, length\) = \(2, 4\), got \(1, 4\) "
                                         r"\(premise has shape \(2, 4\); masks are not broadcast\)"):
        model(premise, hypothesis, torch.ones(1, 4, dtype=torch.bool))


# --- chapter 6's verdict templates at edge values ------------------------------------------------------------------

def test_paired_accuracy_gap_edges():
    import numpy as np

    from attnbook.experiments.nli import paired_accuracy_gap

    same = np.array([True, False, True, True])
    out = paired_accuracy_gap(same, same, n_resamples=200)
    assert out["gap"] == 0 and out["ci_low"] == out["ci_high"] == 0
    assert out["only_model"] == out["only_baseline"] == 0 and out["p_mcnemar"] == 1.0
    better = np.array([True] * 30 + [False] * 10)
    worse = np.array([False] * 20 + [True] * 10 + [False] * 10)
    out = paired_accuracy_gap(better, worse, n_resamples=500)
    assert out["gap"] == pytest.approx(50.0) and out["ci_low"] > 0
    assert (out["only_model"], out["only_baseline"]) == (20, 0) and out["p_mcnemar"] < 0.001
    with pytest.raises(ValueError):
        paired_accuracy_gap(same, same[:3])
    with pytest.raises(ValueError):
        paired_accuracy_gap(same[:1], same[:1])


def test_gap_sentence_edges():
    from attnbook.experiments.nli import gap_sentence

    up = gap_sentence("the masked model", "the unmasked one", 3.5, 2.1, 4.9)
    assert up == ("The masked model labels more test pairs correctly than the unmasked one: +3.5 points "
                  "(95% interval +2.1 to +4.9).")
    assert "fewer" in gap_sentence("a", "b", -3.0, -4.0, -2.0)
    for low, high in ((0.0, 2.0), (-1.0, 0.0), (-1.0, 1.0), (0.0, 0.0)):
        text = gap_sentence("a", "b", (low + high) / 2, low, high)
        assert text.startswith("On these test pairs, a and b differ by no resolved amount")
    assert "both 95% bounds round to +2.0" in gap_sentence("a", "b", 2.0, 2.01, 2.04)
    for bad in ((float("nan"), 0.0, 1.0), (0.0, 1.0, 0.0)):
        with pytest.raises(ValueError):
            gap_sentence("a", "b", *bad)


def test_flip_direction_cases():
    from attnbook.experiments.nli import flip_direction

    assert flip_direction(0, 1, 0) == "from wrong to right"
    assert flip_direction(0, 0, 2) == "from right to wrong"
    assert flip_direction(0, 1, 2) == "from one wrong label to another"
    assert flip_direction(0, 1, 1) == "not at all"
